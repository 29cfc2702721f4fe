#include "fsdplab/core/file_util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace fsdplab {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Writes all of `data` to `fd`, retrying short writes and EINTR.
bool WriteAll(int fd, std::string_view data, int* err) {
  const char* p = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

StatusOr<std::string> ReadFile(const std::string& path, std::size_t spare_capacity) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return NotFound(fmt::format("{}: no such file", path));
    return InvalidInput(fmt::format("{}: cannot open: {}", path, ErrnoText(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return InvalidInput(fmt::format("{}: cannot stat: {}", path, ErrnoText(err)));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidInput(fmt::format("{}: is a directory, not a file", path));
  }
  // Read straight into the string: its size grows as the file does (pipes and growing files
  // have no usable st_size), and the spare capacity is reserved with the first allocation.
  std::size_t want = S_ISREG(st.st_mode) && st.st_size > 0 ? static_cast<std::size_t>(st.st_size)
                                                           : std::size_t{1} << 16;
  std::string out;
  out.reserve(want + 1 + spare_capacity);
  out.resize(want + 1);  // one more than expected, so that the end of file is seen in the loop
  std::size_t len = 0;
  while (true) {
    if (len == out.size()) {
      out.reserve(2 * out.size() + spare_capacity);
      out.resize(2 * out.size());
    }
    ssize_t n = ::read(fd, out.data() + len, out.size() - len);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return InvalidInput(fmt::format("{}: read failed: {}", path, ErrnoText(err)));
    }
    if (n == 0) break;
    len += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(len);
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  if (path == "-") {
    if (std::fwrite(contents.data(), 1, contents.size(), stdout) != contents.size() ||
        std::fflush(stdout) != 0) {
      return InternalError("writing to stdout failed");
    }
    return Status::Ok();
  }
  if (path.empty()) return InvalidInput("output path is empty");
  std::filesystem::path target(path);
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    std::filesystem::path dir = target.parent_path();
    if (err == ENOENT) {
      return NotFound(fmt::format("{}: cannot write: directory '{}' does not exist", path,
                                  dir.empty() ? std::string(".") : dir.string()));
    }
    return InvalidInput(fmt::format("{}: cannot write: {}", path, ErrnoText(err)));
  }
  int err = 0;
  bool ok = WriteAll(fd, contents, &err);
  if (ok && ::fsync(fd) != 0) {
    err = errno;
    ok = false;
  }
  if (::close(fd) != 0 && ok) {
    err = errno;
    ok = false;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ok = false;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return InvalidInput(fmt::format("{}: write failed: {}", path, ErrnoText(err)));
  }
  return Status::Ok();
}

}  // namespace fsdplab
