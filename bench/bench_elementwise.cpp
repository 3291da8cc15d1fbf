// Elementwise evaluation rules (src/eval/elementwise.cpp) against plain C++ loops over the same
// data, measured side by side in one run:
//  1. fixed cost per call: eval::binary(Add) on an 8x128 f32 tile, result allocation included;
//  2. throughput: eval::binary(Add) and eval::unary(Exp) on 16M-element f32 tiles, in GB/s
//     (bytes read + bytes written), against a plain loop writing into
//     (a) a freshly allocated buffer each time (what eval does: every result is a new Array), and
//     (b) one preallocated, already-touched buffer (pure loop speed, no allocation or page faults).
#include <cmath>
#include <cstdio>
#include <memory>
#include <new>
#include <string>

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
    double t_eval = bench::median_seconds(31, [&] {
      for (int i = 0; i < kCalls; ++i) g_sink = pl::eval::binary(OpCode::Add, a, b).data<float>()[0];
    }) / kCalls;
    double t_fresh = bench::median_seconds(31, [&] {
      for (int i = 0; i < kCalls; ++i) {
        Buffer out = fresh(n);
        plain_add(a.data<float>(), b.data<float>(), out.get(), n);
        g_sink = out.get()[0];
      }
    }) / kCalls;
    Buffer warm = fresh(n);
    double t_warm = bench::median_seconds(31, [&] {
      for (int i = 0; i < kCalls; ++i) {
        plain_add(a.data<float>(), b.data<float>(), warm.get(), n);
        g_sink = warm.get()[0];
      }
    }) / kCalls;
    report << "### Per call, 8x128 f32 add (median of 31 samples of " << kCalls << " calls)\n\n";
    report << "| implementation | ns per call | target |\n|---|---|---|\n";
    report << "| eval::binary(Add), result allocation included | " << fmt("%.0f", t_eval * 1e9)
           << " | <= 300 ns |\n";
    report << "| plain loop + fresh aligned buffer | " << fmt("%.0f", t_fresh * 1e9) << " | - |\n";
    report << "| plain loop into a preallocated buffer | " << fmt("%.0f", t_warm * 1e9) << " | - |\n\n";
  }

  // ---- 2. Throughput on large tiles -------------------------------------------------------------
  constexpr int64_t kN = int64_t{1} << 24;  // 16M elements: 64 MiB per f32 array, far beyond cache
  constexpr int kRepeats = 9;
  pl::Array a = pl::Array::random_normal({kN}, pl::f32, 3);
  pl::Array b = pl::Array::random_normal({kN}, pl::f32, 4);
  Buffer warm = fresh(kN);
  plain_add(a.data<float>(), b.data<float>(), warm.get(), kN);  // touch every page once

  report << "### Throughput, 16M-element f32 tiles (median of " << kRepeats
         << "; GB/s = (bytes read + written) / time)\n\n";
  report << "| op | eval | plain loop, fresh buffer | plain loop, preallocated | eval / fresh | eval / preallocated |\n";
  report << "|---|---|---|---|---|---|\n";
  auto row = [&](const char* name, double bytes, double t_eval, double t_fresh, double t_warm) {
    report << "| " << name << " | " << fmt("%.2f", bytes / t_eval / 1e9) << " GB/s ("
           << fmt("%.1f", t_eval * 1e3) << " ms) | " << fmt("%.2f", bytes / t_fresh / 1e9) << " GB/s ("
           << fmt("%.1f", t_fresh * 1e3) << " ms) | " << fmt("%.2f", bytes / t_warm / 1e9) << " GB/s ("
           << fmt("%.1f", t_warm * 1e3) << " ms) | " << fmt("%.0f%%", 100 * t_fresh / t_eval) << " | "
           << fmt("%.0f%%", 100 * t_warm / t_eval) << " |\n";
  };
  {
    double t_eval = bench::median_seconds(kRepeats, [&] {
      g_sink = pl::eval::binary(OpCode::Add, a, b).data<float>()[kN - 1];
    });
    double t_fresh = bench::median_seconds(kRepeats, [&] {
      Buffer out = fresh(kN);
      plain_add(a.data<float>(), b.data<float>(), out.get(), kN);
      g_sink = out.get()[kN - 1];
    });
    double t_warm = bench::median_seconds(kRepeats, [&] {
      plain_add(a.data<float>(), b.data<float>(), warm.get(), kN);
      g_sink = warm.get()[kN - 1];
    });
    row("add", 12.0 * kN, t_eval, t_fresh, t_warm);
  }
  {
    double t_eval = bench::median_seconds(kRepeats, [&] {
      g_sink = pl::eval::unary(OpCode::Exp, a, {}).data<float>()[kN - 1];
    });
    double t_fresh = bench::median_seconds(kRepeats, [&] {
      Buffer out = fresh(kN);
      plain_exp(a.data<float>(), out.get(), kN);
      g_sink = out.get()[kN - 1];
    });
    double t_warm = bench::median_seconds(kRepeats, [&] {
      plain_exp(a.data<float>(), warm.get(), kN);
      g_sink = warm.get()[kN - 1];
    });
    row("exp", 8.0 * kN, t_eval, t_fresh, t_warm);
  }
  report << "\nTarget: eval >= 80% of the plain loop. Shared 2-core VM: expect run-to-run noise of "
            "10-20% on the large tiles.\n";
}
