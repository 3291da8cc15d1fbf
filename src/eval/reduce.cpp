// Reductions (sum/prod/max/min/and/or over a set of axes, argmax/argmin along one axis) and
// scans (cumsum/cumprod/cummax/cummin).
//
// Summation order of floats (the IR leaves it unspecified): along the innermost reduced run of
// contiguous elements, pairwise summation over blocks of 8 interleaved partial sums (error grows
// like log n instead of n, and the 8 independent lanes keep the loop fast without reassociating
// anything the compiler would refuse to); across the other (outer) reduced axes, the run results
// are added sequentially. f16/bf16 accumulate in f32 and round once at the end; scans of f16/bf16
// keep an f32 running value and round each output.
#include <algorithm>
#include <memory>
#include <vector>

#include "eval/accumulate.h"
#include "eval/eval.h"

namespace pallas::eval {

namespace {

using acc::Acc;
using acc::Kind;

// Accumulator rows. Not std::vector: vector<bool> packs bits and has no data().
template <class A> struct Buffer {
  std::unique_ptr<A[]> p;
  explicit Buffer(int64_t n) : p(std::make_unique<A[]>(static_cast<size_t>(n))) {}
};

template <class T> const T* in_ptr(const Array& x) { return static_cast<const T*>(x.raw_data()); }
template <class T> T* out_ptr(Array& x) { return static_cast<T*>(x.raw_data()); }

template <class T> Acc<T> pairwise_sum(const T* p, int64_t n) {
  using A = Acc<T>;
  constexpr int64_t kBase = 256;
  if (n > kBase) {
    int64_t h = n / 2;
    h -= h % 8;  // split on a lane boundary so both halves vectorize the same way
    return pairwise_sum(p, h) + pairwise_sum(p + h, n - h);
  }
  A lane[8];
  for (A& l : lane) l = acc::identity<Kind::Sum, A>();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += acc::load(p[i + k]);
  A s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) s += acc::load(p[i]);
  return s;
}

// Reduction of one contiguous run of n elements.
template <Kind K, class T> Acc<T> reduce_run(const T* p, int64_t n) {
  using A = Acc<T>;
  if constexpr (K == Kind::Sum && std::is_floating_point_v<A>) {
    return pairwise_sum(p, n);
  } else {
    A a = acc::identity<K, A>();
    for (int64_t i = 0; i < n; ++i) a = acc::combine<K, A>(a, acc::load(p[i]));
    return a;
  }
}

// The operand's dims, with size-1 dims dropped and neighbours of the same kind (kept / reduced)
// merged: e.g. [K, R] (rows), [R, K] (columns), [K, R, K]. The input is then walked once in
// memory order; each step is either a run reduced into one accumulator (innermost group
// reduced) or a run combined elementwise into a row of accumulators (innermost group kept).
struct Groups {
  std::vector<int64_t> size;
  std::vector<bool> reduced;
  std::vector<int64_t> in_stride, out_stride;
};

Groups make_groups(const Shape& shape, const std::vector<bool>& is_reduced) {
  Groups g;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!g.size.empty() && g.reduced.back() == is_reduced[d]) {
      g.size.back() *= shape[d];
    } else {
      g.size.push_back(shape[d]);
      g.reduced.push_back(is_reduced[d]);
    }
  }
  if (g.size.empty()) {  // one element: a kept group of one
    g.size.push_back(1);
    g.reduced.push_back(false);
  }
  const size_t n = g.size.size();
  g.in_stride.assign(n, 1);
  g.out_stride.assign(n, 0);
  int64_t in = 1, out = 1;
  for (size_t k = n; k-- > 0;) {
    g.in_stride[k] = in;
    in *= g.size[k];
    if (!g.reduced[k]) {
      g.out_stride[k] = out;
      out *= g.size[k];
    }
  }
  return g;
}

template <Kind K, class T> struct ReduceWalk {
  using A = Acc<T>;
  const Groups& g;
  const T* in;
  A* acc;

  void run(size_t level, int64_t in_off, int64_t out_off) const {
    const int64_t n = g.size[level];
    if (level + 1 == g.size.size()) {
      if (g.reduced[level]) {
        acc[out_off] = acc::combine<K, A>(acc[out_off], reduce_run<K, T>(in + in_off, n));
      } else {
        A* a = acc + out_off;
        const T* p = in + in_off;
        for (int64_t j = 0; j < n; ++j) a[j] = acc::combine<K, A>(a[j], acc::load(p[j]));
      }
      return;
    }
    const int64_t os = g.reduced[level] ? 0 : g.out_stride[level];
    for (int64_t j = 0; j < n; ++j) run(level + 1, in_off + j * g.in_stride[level], out_off + j * os);
  }
};

template <Kind K, class T> Array reduce_axes(const Array& x, const ir::Ints& axes_attr) {
  using A = Acc<T>;
  std::vector<bool> is_reduced(static_cast<size_t>(x.rank()), false);
  for (int64_t a : axes_attr) is_reduced[static_cast<size_t>(a)] = true;
  Shape out_shape;
  for (int d = 0; d < x.rank(); ++d)
    if (!is_reduced[static_cast<size_t>(d)]) out_shape.push_back(x.shape()[d]);
  // No axes: an identity copy (not identity-combined, which could change -0 to +0).
  if (axes_attr.empty()) return x.clone();
  Array out(out_shape, x.dtype());
  T* o = out_ptr<T>(out);
  const int64_t out_n = out.size();
  if (out_n == 0) return out;
  if (x.size() == 0) {
    std::fill(o, o + out_n, acc::store<T>(acc::empty_value<K, A>()));
    return out;
  }
  const Groups g = make_groups(x.shape(), is_reduced);
  Buffer<A> accum(out_n);
  std::fill(accum.p.get(), accum.p.get() + out_n, acc::identity<K, A>());
  ReduceWalk<K, T>{g, in_ptr<T>(x), accum.p.get()}.run(0, 0, 0);
  for (int64_t i = 0; i < out_n; ++i) o[i] = acc::store<T>(accum.p[static_cast<size_t>(i)]);
  return out;
}

// x viewed as [outer, n, inner] around `axis`.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
  AxisView(const Shape& s, int64_t axis) {
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
      const int64_t v = s[static_cast<size_t>(d)];
      if (d < axis) outer *= v;
      else if (d == axis) n = v;
      else inner *= v;
    }
  }
};

// Index of the first extreme element; a NaN is more extreme than any number and the first NaN
// wins (jnp.argmax). -0 and +0 compare equal, so the first of them wins.
template <bool IsMax, class T> std::vector<int64_t> arg_extreme(const Array& x, int64_t axis) {
  using A = Acc<T>;
  const AxisView v(x.shape(), axis);
  std::vector<int64_t> result(static_cast<size_t>(v.outer * v.inner), 0);
  if (result.empty() || v.n == 0) return result;
  const T* in = in_ptr<T>(x);
  Buffer<A> best(v.inner);
  for (int64_t o = 0; o < v.outer; ++o) {
    const T* base = in + o * v.n * v.inner;
    int64_t* idx = result.data() + o * v.inner;
    // Rows in memory order, a row of candidates at a time (contiguous when inner > 1).
    for (int64_t k = 0; k < v.inner; ++k) best.p[static_cast<size_t>(k)] = acc::load(base[k]);
    for (int64_t j = 1; j < v.n; ++j) {
      const T* row = base + j * v.inner;
      for (int64_t k = 0; k < v.inner; ++k) {
        const A c = acc::load(row[k]);
        A& b = best.p[static_cast<size_t>(k)];
        bool better;
        if constexpr (std::is_floating_point_v<A>) {
          if (b != b) better = false;        // a NaN is already the answer
          else if (c != c) better = true;    // first NaN
          else better = IsMax ? c > b : c < b;
        } else {
          better = IsMax ? b < c : c < b;
        }
        if (better) {
          b = c;
          idx[k] = j;
        }
      }
    }
  }
  return result;
}

template <class I> void write_indices(Array& out, const std::vector<int64_t>& idx) {
  I* o = out_ptr<I>(out);
  // Narrow index dtypes wrap, as convert does (C++20 integral conversion is modular).
  for (size_t i = 0; i < idx.size(); ++i) o[i] = static_cast<I>(idx[i]);
}

template <Kind K, class T> Array scan_axis(const Array& x, int64_t axis, bool reverse) {
  using A = Acc<T>;
  Array out(x.shape(), x.dtype());
  if (x.size() == 0) return out;
  const AxisView v(x.shape(), axis);
  const T* in = in_ptr<T>(x);
  T* o = out_ptr<T>(out);
  Buffer<A> run(v.inner);
  for (int64_t b = 0; b < v.outer; ++b) {
    std::fill(run.p.get(), run.p.get() + v.inner, acc::identity<K, A>());
    for (int64_t s = 0; s < v.n; ++s) {
      const int64_t j = reverse ? v.n - 1 - s : s;
      const int64_t off = (b * v.n + j) * v.inner;
      for (int64_t k = 0; k < v.inner; ++k) {
        A& r = run.p[static_cast<size_t>(k)];
        r = acc::combine<K, A>(r, acc::load(in[off + k]));
        o[off + k] = acc::store<T>(r);
      }
    }
  }
  return out;
}

Kind kind_of(ir::OpCode code) {
  switch (code) {
    case ir::OpCode::ReduceSum: case ir::OpCode::Cumsum: return Kind::Sum;
    case ir::OpCode::ReduceProd: case ir::OpCode::Cumprod: return Kind::Prod;
    case ir::OpCode::ReduceMax: case ir::OpCode::Cummax: return Kind::Max;
    case ir::OpCode::ReduceMin: case ir::OpCode::Cummin: return Kind::Min;
    case ir::OpCode::ReduceAnd: return Kind::And;
    case ir::OpCode::ReduceOr: return Kind::Or;
    default: throw InternalError("not a reduction: " + std::string(ir::op_info(code).name));
  }
}

// Calls f.template operator()<K>() for the runtime kind.
template <class F> decltype(auto) visit_kind(Kind k, F&& f) {
  switch (k) {
    case Kind::Sum: return f.template operator()<Kind::Sum>();
    case Kind::Prod: return f.template operator()<Kind::Prod>();
    case Kind::Max: return f.template operator()<Kind::Max>();
    case Kind::Min: return f.template operator()<Kind::Min>();
    case Kind::And: return f.template operator()<Kind::And>();
    case Kind::Or: return f.template operator()<Kind::Or>();
  }
  __builtin_unreachable();
}

void check_dtype(const Array& x, ir::OpCode code) {
  if (is_semaphore(x.dtype()))
    throw InternalError(std::string(ir::op_info(code).name) + " of semaphores");
}

}  // namespace

Array reduce(ir::OpCode code, const Array& x, const ir::Attrs& attrs) {
  check_dtype(x, code);
  if (code == ir::OpCode::Argmax || code == ir::OpCode::Argmin) {
    const int64_t axis = attrs.get_int(ir::AttrKey::Axis);
    const DType index = attrs.get_dtype(ir::AttrKey::DTypeAttr);
    const bool is_max = code == ir::OpCode::Argmax;
    std::vector<int64_t> idx = visit_dtype(x.dtype(), [&]<class T>() {
      return is_max ? arg_extreme<true, T>(x, axis) : arg_extreme<false, T>(x, axis);
    });
    Shape shape = x.shape();
    shape.erase(shape.begin() + axis);
    Array out(shape, index);
    visit_dtype(index, [&]<class I>() {
      if constexpr (acc::is_int_v<I>)
        write_indices<I>(out, idx);
      else
        throw InternalError("argmax/argmin: index dtype must be an integer");
    });
    return out;
  }
  // The type rule only checks that axes are distinct; the walk does not care about their order.
  const ir::Ints& axes = attrs.get_ints(ir::AttrKey::Axes);
  return visit_kind(kind_of(code), [&]<Kind K>() {
    return visit_dtype(x.dtype(), [&]<class T>() -> Array {
      if constexpr (acc::supported_v<K, T>)
        return reduce_axes<K, T>(x, axes);
      else
        throw InternalError(std::string(ir::op_info(code).name) + " does not accept " +
                            std::string(dtype_name(x.dtype())));
    });
  });
}

Array scan(ir::OpCode code, const Array& x, const ir::Attrs& attrs) {
  check_dtype(x, code);
  const int64_t axis = attrs.get_int(ir::AttrKey::Axis);
  const bool reverse = attrs.get_int_or(ir::AttrKey::Reverse, 0) != 0;
  return visit_kind(kind_of(code), [&]<Kind K>() {
    return visit_dtype(x.dtype(), [&]<class T>() -> Array {
      if constexpr (acc::supported_v<K, T>)
        return scan_axis<K, T>(x, axis, reverse);
      else
        throw InternalError(std::string(ir::op_info(code).name) + " does not accept " +
                            std::string(dtype_name(x.dtype())));
    });
  });
}

}  // namespace pallas::eval
