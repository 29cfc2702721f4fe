// The one encoding of the messages between the processes of one live run (the rendezvous'
// frames, a rank's results sent to rank 0, an abort): every process runs this binary on the same
// kind of machine, so fixed-size values go as they lie in memory, and a string or a vector after
// its length (64 bits).
//
//   WireWriter w;
//   w.Pod(std::uint32_t{7});
//   w.Str("model.layers.0");
//   std::string bytes = w.Take();
//   WireReader r(bytes);
//   auto n = r.Pod<std::uint32_t>();
//   std::string name = r.Str();
//   if (!r.ok()) ...   // short, or bytes left over
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace fsdplab {

class WireWriter final {
 public:
  template <typename T>
  void Pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void Str(std::string_view s) {
    Pod(static_cast<std::uint64_t>(s.size()));
    out_ += s;
  }
  template <typename T>
  void PodVector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Pod(static_cast<std::uint64_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  // Bytes as they are, with no length: a tail the reader takes with Rest().
  void Raw(std::string_view bytes) { out_ += bytes; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what a WireWriter wrote, in the same order. A read past the end marks the reader bad and
// returns an empty value; it never reads out of bounds.
class WireReader final {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}
  template <typename T>
  T Pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    if (bad_ || in_.size() - pos_ < sizeof v) {
      bad_ = true;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string Str() {
    const auto n = Pod<std::uint64_t>();
    if (bad_ || n > in_.size() - pos_) {
      bad_ = true;
      return {};
    }
    std::string s(in_.substr(pos_, static_cast<std::size_t>(n)));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  template <typename T>
  std::vector<T> PodVector() {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto n = Pod<std::uint64_t>();
    if (bad_ || n > (in_.size() - pos_) / std::max<std::size_t>(sizeof(T), 1)) {
      bad_ = true;
      return {};
    }
    std::vector<T> v(static_cast<std::size_t>(n));
    std::memcpy(v.data(), in_.data() + pos_, v.size() * sizeof(T));
    pos_ += v.size() * sizeof(T);
    return v;
  }
  // The next `n` bytes as they are.
  std::string_view Raw(std::size_t n) {
    if (bad_ || n > in_.size() - pos_) {
      bad_ = true;
      return {};
    }
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // Everything not read yet.
  std::string_view Rest() {
    std::string_view s = bad_ ? std::string_view() : in_.substr(pos_);
    pos_ = in_.size();
    return s;
  }
  bool bad() const { return bad_; }
  // Nothing missing and nothing left over.
  bool ok() const { return !bad_ && pos_ == in_.size(); }

 private:
  std::string_view in_;
  std::size_t pos_ = 0;
  bool bad_ = false;
};

}  // namespace fsdplab
