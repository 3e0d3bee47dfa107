// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file files.hpp
/// @brief Scratch directories and whole-file reads for the multi-process tests.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "catch.hpp"

namespace accel_test {

/// @brief The whole content of a file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// @brief A scratch directory under the test build directory, removed at the end of the test.
struct ScratchDir {
  std::string path;
  explicit ScratchDir(const std::string& prefix) {
    std::string tmpl = std::string(ACCEL_TEST_BINARY_DIR).append("/").append(prefix).append("_XXXXXX");  // not `+`: GCC 12 -Warray-bounds
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() { (void)!std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

}  // namespace accel_test
