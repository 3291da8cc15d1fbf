// pallas::Error and SourceLoc formatting.
#include "pallas/error.h"

namespace pallas {

std::string SourceLoc::to_string() const {
  if (!known()) return "<unknown>";
  // Only the base name: full build paths are noise in user-facing messages and differ
  // between machines (which would make golden error messages unstable).
  std::string_view f = file;
  if (auto slash = f.find_last_of("/\\"); slash != std::string_view::npos) f = f.substr(slash + 1);
  return std::string(f) + ":" + std::to_string(line);
}

static std::string with_location(const std::string& what, const SourceLoc& loc) {
  return loc.known() ? what + " (at " + loc.to_string() + ")" : what;
}

Error::Error(const std::string& what, const SourceLoc& loc)
    : std::runtime_error(with_location(what, loc)), loc_(loc) {}

}  // namespace pallas
