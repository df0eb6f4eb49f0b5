// Golden-file comparison for tests. Set TORCHCAP_UPDATE_GOLDEN=1 to rewrite the
// files from the current output (then review the diff before committing).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace torchcap::testing {

inline std::string golden_path(const std::string& name) {
  return std::string(TORCHCAP_TEST_DIR) + "/golden/" + name;
}

inline void expect_golden(const std::string& name, const std::string& actual) {
  const std::string path = golden_path(name);
  if (std::getenv("TORCHCAP_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing golden file " << name
                         << " (run with TORCHCAP_UPDATE_GOLDEN=1 to create it)";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(expected.str(), actual) << "output differs from golden file " << name;
}

}  // namespace torchcap::testing
