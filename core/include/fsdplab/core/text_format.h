// How numbers and text read in messages and tables, defined once for every command and backend.
//
//   HumanBytes(3 << 20);   // "3.00 MiB"
//   Seconds(2.5e6);        // "2.5 s"
//   Ms(1234.5);            // "1.234 ms"; MsValue(1234.5): "1.234" (a column headed "ms")
//   GiB(3ull << 29);       // "1.500 GiB"; GiBValue: "1.500"
//   XmlEscape("a<b");      // "a&lt;b" (SVG text and attributes)
#pragma once

#include <string>
#include <string_view>

#include "fsdplab/core/units.h"

namespace fsdplab {

// Two decimals in the largest binary unit that is at least 1: "1.50 GiB", "12.00 KiB", "7 B".
std::string HumanBytes(Bytes bytes);
// A duration in seconds, as few digits as it needs: "30 s", "0.5 s".
std::string Seconds(TimeUs us);
// Milliseconds and GiB with three decimals, with their unit or without (for a column that names
// it).
std::string MsValue(TimeUs us);
std::string Ms(TimeUs us);
std::string GiBValue(Bytes bytes);
std::string GiB(Bytes bytes);
// `text` with &, <, > and " escaped, for SVG (XML) text and attribute values.
std::string XmlEscape(std::string_view text);

}  // namespace fsdplab
