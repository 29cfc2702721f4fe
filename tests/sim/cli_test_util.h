// Running the fsdplab binary from the sim room's command-line tests (FSDPLAB_BIN).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fsdplab::cli_test {

// The binary's exit code; its output is discarded.
inline int RunCli(const std::string& args) {
  std::string cmd = std::string(FSDPLAB_BIN) + " " + args + " > /dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// A file in the test's temporary folder.
inline std::string Tmp(const std::string& name) {
  return (::testing::TempDir().empty() ? std::string("/tmp/") : ::testing::TempDir()) + name;
}

}  // namespace fsdplab::cli_test
