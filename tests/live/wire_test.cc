// The one encoding of messages between the processes of a live run (live/wire.h).
#include "fsdplab/live/wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdplab {
namespace {

TEST(Wire, ValuesReadBackInTheOrderWritten) {
  WireWriter w;
  w.Pod(std::uint32_t{7});
  w.Str("model.l0");
  w.PodVector(std::vector<double>{1.5, -2.0});
  w.Raw("tail");
  const std::string bytes = w.Take();
  // 4 (u32) + 8 + 8 (the string's length and bytes) + 8 + 16 (the vector's) + 4 (the tail).
  EXPECT_EQ(bytes.size(), 48u);
  WireReader r(bytes);
  EXPECT_EQ(r.Pod<std::uint32_t>(), 7u);
  EXPECT_EQ(r.Str(), "model.l0");
  EXPECT_EQ(r.PodVector<double>(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(r.Rest(), "tail");
  EXPECT_TRUE(r.ok());
}

TEST(Wire, AShortMessageIsBadAndNeverReadPastItsEnd) {
  WireWriter w;
  w.Str("twelve bytes");
  const std::string bytes = w.Take();
  // Every cut of the message: its length alone, or the length and part of the bytes.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    WireReader r(std::string_view(bytes).substr(0, n));
    EXPECT_EQ(r.Str(), "") << n;
    EXPECT_TRUE(r.bad()) << n;
    EXPECT_FALSE(r.ok()) << n;
  }
  // A vector whose length says more elements than the bytes hold.
  WireWriter big;
  big.Pod(std::uint64_t{1} << 40);
  const std::string claim = big.Take();
  WireReader r(claim);
  EXPECT_TRUE(r.PodVector<double>().empty());
  EXPECT_TRUE(r.bad());
}

TEST(Wire, BytesLeftOverAreNotOk) {
  WireWriter w;
  w.Pod(std::uint32_t{1});
  w.Pod(std::uint32_t{2});
  const std::string bytes = w.Take();
  WireReader r(bytes);
  EXPECT_EQ(r.Pod<std::uint32_t>(), 1u);
  EXPECT_FALSE(r.bad());
  EXPECT_FALSE(r.ok());  // 4 bytes not read
}

}  // namespace
}  // namespace fsdplab
