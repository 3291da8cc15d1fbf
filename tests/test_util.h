// Helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "pallas/error.h"

namespace test_util {

// The message of the pallas::Error (of type E) that fn throws; a test failure when it throws
// nothing, an InternalError (a bug, not a user error) or another type.
template <class E = pallas::Error, class F> std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const pallas::InternalError& e) {
    ADD_FAILURE() << "internal error instead of a user error: " << e.what();
    return "";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "an exception of the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error raised";
  return "";
}

// A fresh directory under the system temp dir ("<prefix>XXXXXX"), removed with its contents
// afterwards.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "pallas_test_") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace test_util

// EXPECT that `text` contains `fragment`, showing both when it does not.
#define EXPECT_CONTAINS(text, fragment)                                \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos)       \
      << "missing '" << (fragment) << "' in:\n"                         \
      << (text)
