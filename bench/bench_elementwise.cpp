// Elementwise evaluation rules (src/eval/elementwise.cpp) against plain C++ loops over the same
// data, measured side by side in one run:
//  1. fixed cost per call: eval::binary(Add) on an 8x128 f32 tile, result allocation included;
//  2. throughput: eval::binary(Add) and eval::unary(Exp) on 16M-element f32 tiles, in GB/s
//     (bytes read + bytes written), against a plain loop writing into
//     (a) a freshly allocated buffer each time (what eval does: every result is a new Array), and
//     (b) one preallocated, already-touched buffer (pure loop speed, no allocation or page faults).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "eval/eval.h"
#include "pallas/pallas.h"

namespace pl = pallas;
using pl::ir::OpCode;

namespace {

// noinline: the baselines must not be specialized for the call site (known n, known buffers)
// any more than the evaluator's loops are.
[[gnu::noinline]] void plain_add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
// The same loop written the way the evaluator's loops are (restrict, constant 16-element blocks),
// which GCC vectorizes at -O2: separates the loop's cost from allocation and dispatch.
[[gnu::noinline]] void blocked_add(const float* __restrict a, const float* __restrict b,
                                   float* __restrict out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int64_t j = 0; j < 16; ++j) out[i + j] = a[i + j] + b[i + j];
  for (; i < n; ++i) out[i] = a[i] + b[i];
}
[[gnu::noinline]] void plain_exp(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

// A fresh 64-byte-aligned buffer, like Array's (so the baseline pays the same allocation).
struct AlignedDelete {
  void operator()(float* p) const { ::operator delete(p, std::align_val_t{64}); }
};
using Buffer = std::unique_ptr<float, AlignedDelete>;
Buffer fresh(int64_t n) {
  return Buffer(static_cast<float*>(::operator new(static_cast<size_t>(n) * sizeof(float), std::align_val_t{64})));
}

// Thread CPU time: this 2-core VM is shared with other jobs, and wall time would count the
// periods when another process has the core. (Page-fault work done by the kernel on behalf of
// this thread is still counted, as it should be.)
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Median and minimum CPU seconds of `samples` runs of fn (after one warm-up run), each divided
// by `per`.
template <class F> std::pair<double, double> cpu_stats(int samples, int per, F&& fn) {
  fn();
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
    const double start = cpu_seconds();
    fn();
    t.push_back((cpu_seconds() - start) / per);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

volatile float g_sink;  // keeps results observable so no loop is optimized away

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

void bench_elementwise(std::ostream& report) {
  // ---- 1. Per-call cost on a small tile -------------------------------------------------------
  {
    constexpr int kCalls = 2000;  // per timed sample, so timer resolution does not matter
    pl::Array a = pl::Array::random_normal({8, 128}, pl::f32, 1);
    pl::Array b = pl::Array::random_normal({8, 128}, pl::f32, 2);
    const int64_t n = a.size();
    // Median and minimum over samples: the minimum estimates the undisturbed cost, the median
    // what a typical call sees.
    auto stats = [&](auto&& body) {
      return cpu_stats(31, kCalls, [&] {
        for (int i = 0; i < kCalls; ++i) body();
      });
    };
    auto t_eval = stats([&] { g_sink = pl::eval::binary(OpCode::Add, a, b).data<float>()[0]; });
    auto t_alloc = stats([&] {
      pl::Array out = pl::Array::uninitialized({8, 128}, pl::f32);
      g_sink = static_cast<const float*>(out.raw_data())[0];
    });
    auto t_fresh = stats([&] {
      Buffer out = fresh(n);
      plain_add(a.data<float>(), b.data<float>(), out.get(), n);
      g_sink = out.get()[0];
    });
    Buffer warm = fresh(n);
    auto t_warm = stats([&] {
      plain_add(a.data<float>(), b.data<float>(), warm.get(), n);
      g_sink = warm.get()[0];
    });
    auto t_blocked = stats([&] {
      blocked_add(a.data<float>(), b.data<float>(), warm.get(), n);
      g_sink = warm.get()[0];
    });
    report << "### Per call, 8x128 f32 add (thread CPU time; 31 samples of " << kCalls << " calls)\n\n";
    report << "| implementation | median ns per call | min ns per call | target |\n|---|---|---|---|\n";
    auto line = [&](const char* what, std::pair<double, double> t, const char* target) {
      report << "| " << what << " | " << fmt("%.0f", t.first * 1e9) << " | " << fmt("%.0f", t.second * 1e9)
             << " | " << target << " |\n";
    };
    line("eval::binary(Add), result allocation included", t_eval, "<= 300 ns");
    line("Array::uninitialized(8x128 f32) alone", t_alloc, "-");
    line("plain loop + fresh aligned buffer", t_fresh, "-");
    line("plain loop into a preallocated buffer", t_warm, "-");
    line("vectorized (blocked, restrict) loop into a preallocated buffer", t_blocked, "-");
    report << "\n";
  }

  // ---- 2. Throughput on large tiles -------------------------------------------------------------
  constexpr int64_t kN = int64_t{1} << 24;  // 16M elements: 64 MiB per f32 array, far beyond cache
  constexpr int kRepeats = 9;
  pl::Array a = pl::Array::random_normal({kN}, pl::f32, 3);
  pl::Array b = pl::Array::random_normal({kN}, pl::f32, 4);
  Buffer warm = fresh(kN);
  plain_add(a.data<float>(), b.data<float>(), warm.get(), kN);  // touch every page once

  report << "### Throughput, 16M-element f32 tiles (thread CPU time, median of " << kRepeats
         << "; GB/s = (bytes read + written) / time)\n\n";
  report << "| op | eval | plain loop, fresh buffer | plain loop, preallocated | eval / fresh | eval / preallocated |\n";
  report << "|---|---|---|---|---|---|\n";
  auto row = [&](const char* name, double bytes, std::pair<double, double> eval_t,
                 std::pair<double, double> fresh_t, std::pair<double, double> warm_t) {
    const double t_eval = eval_t.first, t_fresh = fresh_t.first, t_warm = warm_t.first;
    report << "| " << name << " | " << fmt("%.2f", bytes / t_eval / 1e9) << " GB/s ("
           << fmt("%.1f", t_eval * 1e3) << " ms) | " << fmt("%.2f", bytes / t_fresh / 1e9) << " GB/s ("
           << fmt("%.1f", t_fresh * 1e3) << " ms) | " << fmt("%.2f", bytes / t_warm / 1e9) << " GB/s ("
           << fmt("%.1f", t_warm * 1e3) << " ms) | " << fmt("%.0f%%", 100 * t_fresh / t_eval) << " | "
           << fmt("%.0f%%", 100 * t_warm / t_eval) << " |\n";
  };
  {
    auto t_eval = cpu_stats(kRepeats, 1, [&] {
      g_sink = pl::eval::binary(OpCode::Add, a, b).data<float>()[kN - 1];
    });
    auto t_fresh = cpu_stats(kRepeats, 1, [&] {
      Buffer out = fresh(kN);
      plain_add(a.data<float>(), b.data<float>(), out.get(), kN);
      g_sink = out.get()[kN - 1];
    });
    auto t_warm = cpu_stats(kRepeats, 1, [&] {
      plain_add(a.data<float>(), b.data<float>(), warm.get(), kN);
      g_sink = warm.get()[kN - 1];
    });
    row("add", 12.0 * kN, t_eval, t_fresh, t_warm);
  }
  {
    auto t_eval = cpu_stats(kRepeats, 1, [&] {
      g_sink = pl::eval::unary(OpCode::Exp, a, {}).data<float>()[kN - 1];
    });
    auto t_fresh = cpu_stats(kRepeats, 1, [&] {
      Buffer out = fresh(kN);
      plain_exp(a.data<float>(), out.get(), kN);
      g_sink = out.get()[kN - 1];
    });
    auto t_warm = cpu_stats(kRepeats, 1, [&] {
      plain_exp(a.data<float>(), warm.get(), kN);
      g_sink = warm.get()[kN - 1];
    });
    row("exp", 8.0 * kN, t_eval, t_fresh, t_warm);
  }
  report << "\nTarget: eval >= 80% of the plain loop. Shared 2-core VM: expect run-to-run noise of "
            "10-20% on the large tiles.\n";
}
