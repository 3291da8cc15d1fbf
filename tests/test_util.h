// Helpers shared by the test suites.
#pragma once

#include <gtest/gtest.h>

#include <exception>
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

}  // namespace test_util

// EXPECT that `text` contains `fragment`, showing both when it does not.
#define EXPECT_CONTAINS(text, fragment)                                \
  EXPECT_NE(std::string(text).find(fragment), std::string::npos)       \
      << "missing '" << (fragment) << "' in:\n"                         \
      << (text)
