// Errors. Every error a user can cause is a pallas::Error (or a subclass) whose message says
// what is wrong, where (the user's source line when known) and, where possible, how to fix it.
// A broken internal invariant is a pallas::InternalError: a bug in Pallas, not in the user's code.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pallas {

// A source position in the user's code. `line == 0` means unknown.
struct SourceLoc {
  std::string file;
  int line = 0;
  int column = 0;
  SourceLoc() = default;
  SourceLoc(std::string f, int l, int c = 0) : file(std::move(f)), line(l), column(c) {}
  static SourceLoc from(const std::source_location& l) {
    return SourceLoc(l.file_name(), static_cast<int>(l.line()), static_cast<int>(l.column()));
  }
  bool known() const { return line > 0; }
  // "file.cc:12" (the file's base name only), or "<unknown>".
  std::string to_string() const;
  bool operator==(const SourceLoc&) const = default;
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  // Appends " (at file.cc:12)" when the location is known, and remembers it.
  Error(const std::string& what, const SourceLoc& loc);
  const SourceLoc& location() const { return loc_; }

 private:
  SourceLoc loc_;
};

// A feature that is planned but not there yet. Always names the feature.
class NotSupportedError : public Error {
 public:
  explicit NotSupportedError(const std::string& feature, const SourceLoc& loc = {})
      : Error("not supported yet: " + feature, loc) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what)
      : std::logic_error("internal error (a bug in pallas, please report it): " + what) {}
};

namespace detail {
template <class... Args> std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace pallas

// Throws pallas::InternalError when an internal invariant is broken.
#define PALLAS_INTERNAL_CHECK(cond, ...)                                                     \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::pallas::InternalError(::pallas::detail::concat(__FILE__, ":", __LINE__, ": ", \
                                                             #cond, " ", ##__VA_ARGS__));    \
  } while (0)
