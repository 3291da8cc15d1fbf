#include "gpu/profiler.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "core/blocks.h"
#include "core/call.h"
#include "pallas/error.h"

namespace pallas::gpu {

namespace {

int64_t slot_words(const GeneratedKernel& k) { return 1 + 2 * static_cast<int64_t>(k.profile_space); }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Microseconds (the trace format's unit) with nanosecond digits.
std::string micros(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                static_cast<unsigned long long>(ns % 1000));
  return buf;
}

// "CTA b=1, c=0" (named axes) or "CTA 1, 0": the program ids of a parallel point (numbered
// row-major over the parallel axes, as the generated pl_cta decodes it).
std::string point_label(const TracedCall& call, const GeneratedKernel& k, const std::vector<int64_t>& grid,
                        int64_t point) {
  std::vector<int64_t> sizes, ids;
  for (int a : k.parallel_axes) sizes.push_back(grid[static_cast<size_t>(a)]);
  core::unravel_row_major(point, sizes, ids);
  const std::vector<std::string>& names = call.grid_mapping.grid_names;
  std::string s;
  for (size_t j = 0; j < ids.size(); ++j) {
    const size_t a = static_cast<size_t>(k.parallel_axes[j]);
    if (!s.empty()) s += ", ";
    s += (a < names.size() && !names[a].empty() ? names[a] + "=" : "") + std::to_string(ids[j]);
  }
  return s.empty() ? "the only CTA" : "CTA " + s;
}

}  // namespace

size_t profile_buffer_words(const GeneratedKernel& k, const std::vector<int64_t>& grid) {
  if (k.profile_space <= 0) return 0;
  return static_cast<size_t>(parallel_points(k, grid) * std::max(1, k.num_groups) * slot_words(k));
}

void prepare_profile_dir(const GeneratedKernel& k, const SourceLoc& loc) {
  if (k.profile_space <= 0) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(k.profile_dir, ec);
  if (ec || !fs::is_directory(k.profile_dir))
    throw Error("profile_dir \"" + k.profile_dir + "\": cannot create the directory for the profile trace" +
                    (ec ? " (" + ec.message() + ")" : std::string(" (a file of that name exists)")),
                loc);
  if (::access(k.profile_dir.c_str(), W_OK) != 0)
    throw Error("profile_dir \"" + k.profile_dir + "\" is not writable: the profile trace cannot be written there", loc);
}

ProfileTrace profile_trace(const TracedCall& call, const GeneratedKernel& k, const std::vector<int64_t>& grid,
                           const uint64_t* buffer) {
  ProfileTrace t;
  const int64_t points = parallel_points(k, grid), groups = std::max(1, k.num_groups), words = slot_words(k);
  const uint64_t space = static_cast<uint64_t>(k.profile_space);
  // The trace starts at the earliest event of the call.
  uint64_t t0 = UINT64_MAX;
  for (int64_t s = 0; s < points * groups; ++s) {
    const uint64_t* slot = buffer + s * words;
    for (uint64_t e = 0; e < std::min(slot[0], space); ++e) t0 = std::min(t0, slot[2 + 2 * e]);
  }
  std::ostringstream ev;
  bool first = true;
  auto event = [&](const std::string& e) {
    ev << (first ? "\n  " : ",\n  ") << e;
    first = false;
  };
  for (int64_t point = 0; point < points; ++point) {
    bool named = false;
    for (int64_t g = 0; g < groups; ++g) {
      const uint64_t* slot = buffer + (point * groups + g) * words;
      if (slot[0] == 0) continue;
      const std::string pid = std::to_string(point), tid = std::to_string(g);
      if (!named) {
        event("{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " + pid + ", \"args\": {\"name\": " +
              json_string(point_label(call, k, grid, point)) + "}}");
        event("{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": " + pid +
              ", \"args\": {\"sort_index\": " + pid + "}}");
        named = true;
      }
      event("{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " + pid + ", \"tid\": " + tid +
            ", \"args\": {\"name\": " +
            json_string(call.gpu_kernel ? "Pallas thread " + tid + " (warpgroup)" : std::string("CTA")) + "}}");
      t.max_events = std::max(t.max_events, static_cast<int64_t>(slot[0]));
      if (slot[0] > space) t.dropped_events += static_cast<int64_t>(slot[0] - space);
      // Entries wait on a stack for their exits (regions nest); entries whose exit did not fit
      // stay open and are left out.
      std::vector<std::pair<uint64_t, uint64_t>> open;  // (region, entry time)
      for (uint64_t e = 0; e < std::min(slot[0], space); ++e) {
        const uint64_t tag = slot[1 + 2 * e], time = slot[2 + 2 * e], region = tag >> 1;
        if (region >= k.region_names.size())
          throw InternalError("profile: region number " + std::to_string(region) + " out of range");
        if ((tag & 1) == 0) {
          open.emplace_back(region, time);
          continue;
        }
        if (open.empty() || open.back().first != region)
          throw InternalError("profile: the exit of region \"" + k.region_names[region] + "\" does not match an entry");
        const uint64_t begin = open.back().second;
        open.pop_back();
        event("{\"ph\": \"X\", \"name\": " + json_string(k.region_names[region]) + ", \"pid\": " + pid +
              ", \"tid\": " + tid + ", \"ts\": " + micros(begin - t0) +
              ", \"dur\": " + micros(time >= begin ? time - begin : 0) + "}");
        ++t.events;
      }
    }
  }
  std::ostringstream js;
  js << "{\"traceEvents\": [" << ev.str() << "\n],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": {\"kernel\": "
     << json_string(call.name) << ", \"grid\": " << json_string(core::tuple_string(grid))
     << ", \"profile_space\": " << k.profile_space << ", \"dropped_events\": " << t.dropped_events << "}}\n";
  t.json = js.str();
  return t;
}

std::string write_profile_trace(const TracedCall& call, const GeneratedKernel& k, const std::vector<int64_t>& grid,
                                const uint64_t* buffer) {
  const ProfileTrace t = profile_trace(call, k, grid, buffer);
  std::string stem;
  for (char c : call.name) stem += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '_';
  if (stem.empty()) stem = "kernel";
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  std::string path;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    path = (std::filesystem::path(k.profile_dir) /
            (stem + "-" + std::to_string(now) + (attempt ? "-" + std::to_string(attempt) : "") + "-trace.json"))
               .string();
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt > 1000))
      throw Error("profile_dir: cannot create the trace file " + path + ": " + std::strerror(errno), call.kernel.loc);
  }
  const char* data = t.json.data();
  size_t left = t.json.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw Error("profile_dir: cannot write the trace file " + path + ": " + why, call.kernel.loc);
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  ::close(fd);
  if (t.dropped_events > 0)
    std::cerr << "pallas: the profile of \"" << call.name << "\" left out " << t.dropped_events
              << " region events: a Pallas thread recorded up to " << t.max_events << " at one point, but profile_space is "
              << k.profile_space << " (raise it to " << t.max_events << "); trace: " << path << "\n";
  return path;
}

}  // namespace pallas::gpu
