#include "tpu_interpret/races.h"

#include <algorithm>
#include <sstream>

namespace pallas::tpu_interpret {

void merge_into(VectorClock& into, const VectorClock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

void tick(VectorClock& c, int actor) {
  if (c.size() <= static_cast<size_t>(actor)) c.resize(static_cast<size_t>(actor) + 1, 0);
  ++c[static_cast<size_t>(actor)];
}

bool happens_before(const VectorClock& a, const VectorClock& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t bi = i < b.size() ? b[i] : 0;
    if (a[i] > bi) return false;
  }
  return true;
}

namespace {

// Every element of a buffer of `shape`: the region no progression per dim describes better.
Region whole_buffer(const Shape& shape) {
  Region all(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) all[d] = {0, shape[d], 1};
  return all;
}

// A bitcast view (counted in elements of its own dtype) as the buffer's elements it touches: a
// wider element is a run of `ratio` buffer elements (a new last dim); the dims stepping by part of
// a buffer element (bitcast's new last dim) touch the elements their bytes reach together — the
// element each starts in, or a run of them (a dim of its own, every element between: a bound
// that may be loose, never short).
eval::RefValue in_buffer_elements(eval::RefValue view, const std::byte* base, int64_t buffer_itemsize) {
  const int64_t view_itemsize = itemsize(view.dtype);
  if (view_itemsize > buffer_itemsize) {
    const int64_t ratio = view_itemsize / buffer_itemsize;
    for (int64_t& st : view.strides) st *= ratio;
    view.shape.push_back(ratio);
    view.strides.push_back(1);
  } else {
    const int64_t ratio = buffer_itemsize / view_itemsize;
    // The last view element the dropped dims reach, from the start of the buffer element.
    int64_t reach = (view.data - base) % buffer_itemsize / view_itemsize;
    Shape kept;
    std::vector<int64_t> kept_strides;
    for (size_t k = 0; k < view.shape.size(); ++k) {
      if (view.shape[k] == 1) continue;
      if (view.strides[k] % ratio == 0) {
        kept.push_back(view.shape[k]);
        kept_strides.push_back(view.strides[k] / ratio);
      } else {
        reach += view.strides[k] * (view.shape[k] - 1);
      }
    }
    if (reach >= ratio) {  // (bytes 0-5 of f32s as (2, 3): two f32s)
      kept.push_back(reach / ratio + 1);
      kept_strides.push_back(1);
    }
    view.shape = std::move(kept);
    view.strides = std::move(kept_strides);
  }
  view.data -= (view.data - base) % buffer_itemsize;  // (the buffer element it starts in)
  return view;
}

// region_of for a view counted in the buffer's elements (`elem` bytes each).
Region region_in_elements(const eval::RefValue& view, const std::byte* base, const Shape& shape, int64_t elem,
                          std::vector<int>* view_dims) {
  const int rank = static_cast<int>(shape.size());
  if (view_dims) view_dims->assign(view.shape.size(), -1);
  if (num_elements(shape) == 0 || num_elements(view.shape) == 0) {
    Region empty(static_cast<size_t>(rank), DimRange{0, 0, 1});
    return empty;  // touches nothing (and a zero stride would divide by zero below)
  }
  std::vector<int64_t> bstride = row_major_strides(shape);
  Region r(static_cast<size_t>(rank));
  int64_t offset = (view.data - base) / elem;
  for (int d = 0; d < rank; ++d) {
    r[d].start = bstride[d] > 0 ? offset / bstride[d] : 0;
    offset -= r[d].start * bstride[d];
  }
  auto everything = [&] {
    if (view_dims) view_dims->assign(view.shape.size(), kSharedDim);
    return whole_buffer(shape);
  };
  std::vector<int> pieces_of(static_cast<size_t>(rank), 0);  // view dims stepping along each
  for (size_t k = 0; k < view.shape.size(); ++k) {
    int64_t n = view.shape[k];
    const int64_t s = view.strides[k];
    if (n == 0) {
      for (DimRange& x : r) x.count = 0;
      return r;
    }
    if (n == 1) continue;
    int d = 0;
    while (d < rank && !(bstride[d] <= s && s % bstride[d] == 0)) ++d;
    if (d == rank) return everything();
    // The view dim steps `step` along buffer dim d. A reshape's merged dim runs on into the dims
    // before d: whole passes of `per_pass` steps along d, each pass the next index of d - 1.
    int64_t step = s / bstride[d];
    bool first_piece = true;
    while (n > 1) {
      int64_t count = n;
      if (r[d].start + (n - 1) * step >= shape[d]) {
        if (shape[d] % step != 0 || r[d].start >= step || d == 0) return everything();
        const int64_t per_pass = shape[d] / step;
        if (n % per_pass != 0) return everything();
        count = per_pass;
      }
      // Two view dims along one buffer dim (a reshape's split dim): one progression if one
      // steps over exactly the other's extent.
      DimRange& x = r[static_cast<size_t>(d)];
      if (x.count == 1) {
        x.count = count, x.step = step;
      } else if (x.step == count * step) {
        x.count *= count, x.step = step;
      } else if (step == x.count * x.step) {
        x.count *= count;
      } else {
        return everything();
      }
      if (x.start + (x.count - 1) * x.step >= shape[d]) return everything();
      ++pieces_of[static_cast<size_t>(d)];
      if (view_dims) (*view_dims)[k] = first_piece ? d : kSharedDim;
      first_piece = false;
      n /= count;
      --d, step = 1;
    }
  }
  // A buffer dim that several view dims step along has no one view dim of its own.
  if (view_dims)
    for (int& vd : *view_dims)
      if (vd >= 0 && pieces_of[static_cast<size_t>(vd)] > 1) vd = kSharedDim;
  return r;
}

}  // namespace

Region region_of(const eval::RefValue& view, const std::byte* base, const Shape& shape, std::vector<int>* view_dims,
                 int64_t buffer_itemsize) {
  if (buffer_itemsize <= 0 || buffer_itemsize == itemsize(view.dtype))
    return region_in_elements(view, base, shape, itemsize(view.dtype), view_dims);
  Region r = region_in_elements(in_buffer_elements(view, base, buffer_itemsize), base, shape, buffer_itemsize, nullptr);
  // (A recounted view's dims are not the caller's.)
  if (view_dims) view_dims->assign(view.shape.size(), kSharedDim);
  return r;
}

namespace {
// Bounding box of the intersection of two arithmetic progressions, if not empty.
bool progressions_meet(const DimRange& a, const DimRange& b, int64_t& lo, int64_t& hi) {
  if (a.count == 0 || b.count == 0) return false;
  const DimRange& small = a.count <= b.count ? a : b;
  const DimRange& big = a.count <= b.count ? b : a;
  int64_t big_last = big.start + (big.count - 1) * big.step;
  bool any = false;
  if (big.step == 1) {
    // Fast path: the big one is an interval.
    for (int64_t i = 0; i < small.count; ++i) {
      int64_t x = small.start + i * small.step;
      if (x < big.start) continue;
      if (x > big_last) break;
      if (!any) lo = x;
      hi = x + 1;
      any = true;
    }
    return any;
  }
  for (int64_t i = 0; i < small.count; ++i) {
    int64_t x = small.start + i * small.step;
    if (x < big.start || x > big_last || (x - big.start) % big.step != 0) continue;
    if (!any) lo = x;
    hi = x + 1;
    any = true;
  }
  return any;
}
}  // namespace

bool regions_overlap(const Region& a, const Region& b,
                     std::vector<std::pair<int64_t, int64_t>>* box) {
  if (box) box->clear();
  for (size_t d = 0; d < a.size() && d < b.size(); ++d) {
    // Quick reject on the bounding intervals.
    int64_t a_last = a[d].start + (a[d].count - 1) * a[d].step;
    int64_t b_last = b[d].start + (b[d].count - 1) * b[d].step;
    if (a[d].count == 0 || b[d].count == 0 || a_last < b[d].start || b_last < a[d].start)
      return false;
  }
  for (size_t d = 0; d < a.size() && d < b.size(); ++d) {
    int64_t lo = 0, hi = 0;
    if (!progressions_meet(a[d], b[d], lo, hi)) return false;
    if (box) box->emplace_back(lo, hi);
  }
  return true;
}

int RaceDetector::access(const void* buffer, const std::string& buffer_name,
                         const Shape& buffer_shape, const Region& region, bool is_write,
                         const VectorClock& clock, const AccessInfo& who, bool atomic_add) {
  for (const DimRange& d : region)
    if (d.count == 0) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  BufferRecords& all = records_[buffer];
  int found = 0;
  std::vector<std::pair<int64_t, int64_t>> box;
  // Checks the new access against `recs` and forgets what it supersedes there.
  auto visit = [&](std::vector<Record>& recs) {
    for (const Record& r : recs) {
      if (r.who.actor == who.actor) continue;  // program order
      if (!r.is_write && !is_write) continue;
      if (r.atomic_add && atomic_add) continue;
      if (happens_before(r.clock, clock)) continue;
      if (!regions_overlap(r.region, region, &box)) continue;
      std::string key = buffer_name + "|" + r.who.loc.to_string() + "|" + r.who.what + "|" +
                        who.loc.to_string() + "|" + who.what;
      if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) continue;
      seen_.push_back(key);
      tpu::RaceReport rep;
      rep.buffer = buffer_name;
      rep.buffer_shape = buffer_shape;
      rep.first = {r.is_write, r.who.actor_name, r.who.what, r.who.loc,
                   std::vector<int64_t>(r.clock.begin(), r.clock.end())};
      rep.second = {is_write, who.actor_name, who.what, who.loc,
                    std::vector<int64_t>(clock.begin(), clock.end())};
      rep.overlap = box;
      reports_.push_back(std::move(rep));
      ++found;
    }
    // Forget what this access supersedes: the same actor's accesses to the same region (a write
    // supersedes reads and writes, a read supersedes reads), and other actors' accesses to the
    // same region that happen before a write (a later access racing with them races with it).
    std::erase_if(recs, [&](const Record& r) {
      if (r.region != region) return false;
      if (r.who.actor == who.actor) return is_write || !r.is_write;
      return is_write && happens_before(r.clock, clock);
    });
  };
  // Accesses to one index of the major dimension (rows of a gather or scatter, most block
  // copies of a 1-row tile) are kept by that index, so they are checked only against the same
  // row and the wider accesses; the others against everything.
  const bool one_row = !region.empty() && region[0].count == 1;
  if (one_row) {
    auto it = all.by_row.find(region[0].start);
    if (it != all.by_row.end()) visit(it->second);
  } else {
    for (auto& [row, recs] : all.by_row) visit(recs);
  }
  visit(all.wide);
  Record rec{region, is_write, atomic_add, clock, who};
  if (one_row)
    all.by_row[region[0].start].push_back(std::move(rec));
  else
    all.wide.push_back(std::move(rec));
  return found;
}

void RaceDetector::forget(const void* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  records_.erase(buffer);
}

std::vector<tpu::RaceReport> RaceDetector::reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_;
}


}  // namespace pallas::tpu_interpret

namespace pallas::tpu {

std::string RaceReport::to_string() const {
  std::ostringstream os;
  os << "RACE DETECTED on " << buffer << " " << shape_to_string(buffer_shape) << ", elements [";
  for (size_t d = 0; d < overlap.size(); ++d)
    os << (d ? ", " : "") << overlap[d].first << ":" << overlap[d].second;
  os << "]\n";
  for (const RaceAccess* a : {&first, &second})
    os << "  " << (a->is_write ? "write" : "read") << " by " << a->actor << " (" << a->what
       << ") at " << a->loc.to_string() << "\n";
  return os.str();
}

}  // namespace pallas::tpu
