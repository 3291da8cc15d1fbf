// The race detector of the TPU interpret mode: exact happens-before with vector clocks.
//
// Actors are the cores (one per global core) and the DMAs (each DMA is its own actor, so no
// race hides behind a shared clock slot). An actor's own clock entry always exceeds what any
// other actor knows of it (it starts at 1 and is incremented after every release), so two
// accesses are ordered exactly when the earlier one's clock is <= the later one's. Each
// buffer keeps the accesses that may still race (per-element regions, strided slices included)
// and checks every new access against them.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "eval/interpreter.h"
#include "pallas/pallas_call.h"

namespace pallas::tpu_interpret {

using VectorClock = std::vector<uint32_t>;
void merge_into(VectorClock& into, const VectorClock& from);
// Bumps `actor`'s own entry (growing the clock if needed).
void tick(VectorClock& c, int actor);
bool happens_before(const VectorClock& a, const VectorClock& b);

// The elements an access touches: per buffer dimension, `count` indices from `start` every
// `step`.
struct DimRange {
  int64_t start = 0, count = 1, step = 1;
  bool operator==(const DimRange&) const = default;
};
using Region = std::vector<DimRange>;
// The region of `view` inside a row-major buffer starting at `base` with this shape. Views made
// by indexers and transposes map each of their dimensions to one buffer dimension, which this
// recovers; a reshape's dims may split one buffer dim (two view dims along it, which combine
// into one progression) or merge several (one view dim running on through the dims before).
// What no progression per buffer dim describes is the whole buffer (conservative).
// `view_dims`, when given, receives the buffer dimension of each view dimension (-1 for a
// size-1 view dimension, which needs none; kSharedDim where it is not one of its own).
inline constexpr int kSharedDim = -2;
// `buffer_itemsize` (0: the view's) is the buffer's element size, which a bitcast view's differs
// from: the view is recounted in the buffer's elements.
Region region_of(const eval::RefValue& view, const std::byte* base, const Shape& shape,
                 std::vector<int>* view_dims = nullptr, int64_t buffer_itemsize = 0);
// Whether two regions share an element; if so, the bounding box of the shared elements.
bool regions_overlap(const Region& a, const Region& b,
                     std::vector<std::pair<int64_t, int64_t>>* box);

struct AccessInfo {
  int actor = 0;
  std::string actor_name;
  std::string what;
  SourceLoc loc;
};

class RaceDetector {
 public:
  // Checks an access against the buffer's earlier accesses, records it, and returns the number
  // of new races found.
  // `atomic_add` (a write): adds of DMAs with add = true, which never race with each other
  // (the DMA engine's read-modify-write is atomic), only with plain reads and writes.
  int access(const void* buffer, const std::string& buffer_name, const Shape& buffer_shape,
             const Region& region, bool is_write, const VectorClock& clock, const AccessInfo& who,
             bool atomic_add = false);
  std::vector<tpu::RaceReport> reports() const;
  // Drops the buffer's records: it has died (a run_scoped buffer at its scope's end, after which
  // new memory may reuse the address).
  void forget(const void* buffer);

 private:
  struct Record {
    Region region;
    bool is_write;
    bool atomic_add;
    VectorClock clock;
    AccessInfo who;
  };
  // A buffer's records: those of accesses to one index of the major dimension by that index,
  // the others in `wide`.
  struct BufferRecords {
    std::unordered_map<int64_t, std::vector<Record>> by_row;
    std::vector<Record> wide;
  };
  mutable std::mutex mu_;
  std::unordered_map<const void*, BufferRecords> records_;
  std::vector<tpu::RaceReport> reports_;
  std::vector<std::string> seen_;  // dedup keys: one report per pair of source lines and buffer
};

}  // namespace pallas::tpu_interpret
