// The host side of the on-device profiler (gpu::named_region with gpu::CompilerParams
// profile_space / profile_dir). The kernel gets a buffer with one slot per Pallas thread (group)
// and parallel point; thread 0 of each group records, for every region entry and exit, the
// region's number and the time (device runtime: pl_prof_record). After the call the host pairs
// entries with exits and writes a Chrome trace-event JSON file (chrome://tracing, Perfetto): one
// process per parallel point (a CTA's iteration), one thread per Pallas thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/codegen.h"

namespace pallas::gpu {

// The 8-byte words of the kernel's profile buffer (zero-filled before the launch); 0 when the
// kernel does not profile.
size_t profile_buffer_words(const GeneratedKernel& k, const std::vector<int64_t>& grid);

// Before a profiled launch: creates k.profile_dir if needed and checks it is writable, so a
// trace that cannot be written is reported before the kernel runs (pallas::Error at `loc`).
void prepare_profile_dir(const GeneratedKernel& k, const SourceLoc& loc);

// The trace of one call as Chrome trace-event JSON. Events that did not fit in profile_space are
// left out (with the regions they leave open) and counted in "otherData"."dropped_events".
struct ProfileTrace {
  std::string json;
  int64_t events = 0;          // complete regions in the trace
  int64_t dropped_events = 0;  // region entries and exits that did not fit
  int64_t max_events = 0;      // the most any Pallas thread tried to record at one point
};
ProfileTrace profile_trace(const TracedCall& call, const GeneratedKernel& k, const std::vector<int64_t>& grid,
                           const uint64_t* buffer);

// Writes the trace of a finished call into k.profile_dir as NAME-<time ns>-trace.json (a new
// file: an existing one is never overwritten) and returns its path; when events were dropped it
// says so on stderr, with the profile_space that would have held them.
std::string write_profile_trace(const TracedCall& call, const GeneratedKernel& k, const std::vector<int64_t>& grid,
                                const uint64_t* buffer);

}  // namespace pallas::gpu
