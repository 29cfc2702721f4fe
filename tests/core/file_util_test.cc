#include "fsdplab/core/file_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fsdplab {
namespace {

namespace fs = std::filesystem;

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fsdplab_file_util_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FileUtilTest, ReadMissingFileIsNotFoundNamingThePath) {
  std::string path = (dir_ / "absent.json").string();
  StatusOr<std::string> r = ReadFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path), std::string::npos);
}

TEST_F(FileUtilTest, ReadDirectoryIsInvalidInput) {
  StatusOr<std::string> r = ReadFile(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("directory"), std::string::npos);
}

TEST_F(FileUtilTest, WriteThenReadBack) {
  std::string path = (dir_ / "out.txt").string();
  std::string text(100000, 'x');
  text += "\nend";
  ASSERT_TRUE(WriteFileAtomic(path, text).ok());
  StatusOr<std::string> r = ReadFile(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, text);
  // Overwrite: the new contents replace the old ones whole.
  ASSERT_TRUE(WriteFileAtomic(path, "short").ok());
  EXPECT_EQ(*ReadFile(path), "short");
  // No temporary is left beside it.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST_F(FileUtilTest, FailedWriteLeavesNothing) {
  std::string path = (dir_ / "no_such_dir" / "out.txt").string();
  Status s = WriteFileAtomic(path, "data");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no_such_dir"), std::string::npos);
  EXPECT_FALSE(fs::exists(path));
  // Writing over a directory fails and keeps the directory.
  Status d = WriteFileAtomic(dir_.string(), "data");
  EXPECT_EQ(d.code(), StatusCode::kInvalidInput);
  EXPECT_TRUE(fs::is_directory(dir_));
}

TEST_F(FileUtilTest, RenameFailureRemovesTheTemporary) {
  // A directory cannot be replaced by a file: the temporary is written, the rename fails, and
  // the temporary must be gone afterwards.
  fs::path target = dir_ / "busy";
  fs::create_directories(target / "inner");
  Status s = WriteFileAtomic(target.string(), "data");
  EXPECT_FALSE(s.ok());
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1);  // only "busy": no temporary left
}

TEST(FileUtil, ReadFileReservesTheSpareCapacity) {
  // 200,000 bytes (more than one 64 KiB read) and an empty file; the spare capacity is there
  // after the contents, so a padded parser can read past the end.
  const std::string path =
      (std::filesystem::temp_directory_path() / "fsdplab_read_file_test.bin").string();
  std::string big(200000, 'x');
  big[123456] = 'y';
  ASSERT_TRUE(WriteFileAtomic(path, big).ok());
  StatusOr<std::string> r = ReadFile(path, 64);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, big);
  EXPECT_GE(r->capacity(), big.size() + 64);
  ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  StatusOr<std::string> empty = ReadFile(path, 64);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_GE(empty->capacity(), 64u);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fsdplab
