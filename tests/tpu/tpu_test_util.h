// Helpers shared by the TPU interpret mode tests: inputs, error capture, race collection and a
// watchdog that turns a hang into a failure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pallas/pallas.h"
#include "pallas/tpu.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace pltpu = pallas::tpu;

namespace tpu_test {

// base, base+1, ... in row-major order.
inline pl::Array iota_f32(pl::Shape s, float base = 0) {
  pl::Array a = pl::Array::zeros(s, pl::f32);
  float* p = a.data<float>();
  for (int64_t i = 0; i < a.size(); ++i) p[i] = base + static_cast<float>(i);
  return a;
}
inline pl::Array iota_i32(pl::Shape s, int32_t base = 0) {
  pl::Array a = pl::Array::zeros(s, pl::i32);
  int32_t* p = a.data<int32_t>();
  for (int64_t i = 0; i < a.size(); ++i) p[i] = base + static_cast<int32_t>(i);
  return a;
}

using test_util::error_of;

#define EXPECT_NOT_CONTAINS(text, fragment)                                        \
  EXPECT_EQ(std::string(text).find(fragment), std::string::npos)                   \
      << "unexpected '" << (fragment) << "' in:\n"                                  \
      << (text)

// "tpu_races_test.cpp:42": how reports name a line of this file.
inline std::string line_ref(const char* file, int line) {
  return pl::SourceLoc(file, line).to_string();
}
#define THIS_LINE(offset) ::tpu_test::line_ref(__FILE__, __LINE__ + (offset))

// Fails the whole test binary (rather than hanging it) when the scope lasts longer than
// `seconds`: the interpret mode must never hang, even on a deadlocking kernel.
class HangGuard {
 public:
  explicit HangGuard(double seconds = 20.0) {
    watcher_ = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lk(mu_);
      if (!cv_.wait_for(lk, std::chrono::duration<double>(seconds), [this] { return done_; })) {
        std::fprintf(stderr, "HangGuard: %s.%s did not finish within %.0f s: the interpret mode hung\n",
                     ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name(),
                     ::testing::UnitTest::GetInstance()->current_test_info()->name(), seconds);
        std::fflush(stderr);
        std::_Exit(124);
      }
    });
  }
  ~HangGuard() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    watcher_.join();
  }
  HangGuard(const HangGuard&) = delete;
  HangGuard& operator=(const HangGuard&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread watcher_;
};

// Every test of a "Tpu..." suite runs under a HangGuard, so no hang goes unnoticed (tests with
// deliberate deadlocks also hold their own, tighter guard).
class TpuWatchdog : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& info) override {
    if (std::string(info.test_suite_name()).rfind("Tpu", 0) == 0) guard_ = std::make_unique<HangGuard>(60.0);
  }
  void OnTestEnd(const ::testing::TestInfo&) override { guard_.reset(); }

 private:
  std::unique_ptr<HangGuard> guard_;
};
inline const bool kTpuWatchdogInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new TpuWatchdog);
  return true;
}();

// InterpretParams that collect detected races into `races`.
inline pltpu::InterpretParams race_params(std::shared_ptr<std::vector<pltpu::RaceReport>>& races,
                                          const char* mode = "on_wait") {
  races = std::make_shared<std::vector<pltpu::RaceReport>>();
  pltpu::InterpretParams p;
  p.detect_races = true;
  p.races = races;
  p.dma_execution_mode = mode;
  return p;
}

inline std::string all_reports(const std::vector<pltpu::RaceReport>& races) {
  std::string s;
  for (const auto& r : races) s += r.to_string();
  return s;
}

inline const char* const kModes[] = {"eager", "on_wait"};

}  // namespace tpu_test
