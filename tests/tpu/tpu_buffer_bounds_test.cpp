// buffer_bounds = "padded": buffers stored padded to the TPU tile; reads inside the padding see
// the fill value, writes into it are dropped, beyond it is out of bounds.
#include <cmath>

#include "tpu_interpret/machine.h"
#include "tpu_test_util.h"

using namespace tpu_test;
namespace ti = pallas::tpu_interpret;

namespace {

TEST(TpuBufferBounds, TileRule) {
  using pl::MemorySpace;
  // Hand-computed from the rule: last dim to 128; second-minor to f = packing doubled while
  // below min(second-minor, 8); rank 1 to 128 * packing.
  EXPECT_EQ(ti::tile_padded({10, 128}, pl::f32, MemorySpace::Vmem), (pl::Shape{16, 128}));
  EXPECT_EQ(ti::tile_padded({10, 150}, pl::f32, MemorySpace::Vmem), (pl::Shape{16, 256}));
  EXPECT_EQ(ti::tile_padded({3, 128}, pl::f32, MemorySpace::Vmem), (pl::Shape{4, 128}));
  EXPECT_EQ(ti::tile_padded({3, 100}, pl::bf16, MemorySpace::Vmem), (pl::Shape{4, 128}));
  EXPECT_EQ(ti::tile_padded({9, 100}, pl::bf16, MemorySpace::Vmem), (pl::Shape{16, 128}));
  EXPECT_EQ(ti::tile_padded({2, 100}, pl::i8, MemorySpace::Vmem), (pl::Shape{4, 128}));
  EXPECT_EQ(ti::tile_padded({5, 2, 100}, pl::f32, MemorySpace::Hbm), (pl::Shape{5, 2, 128}));
  EXPECT_EQ(ti::tile_padded({100}, pl::f32, MemorySpace::Vmem), (pl::Shape{128}));
  EXPECT_EQ(ti::tile_padded({100}, pl::bf16, MemorySpace::Vmem), (pl::Shape{256}));
  EXPECT_EQ(ti::tile_padded({10, 100}, pl::f32, MemorySpace::Smem), (pl::Shape{10, 100}));
  EXPECT_EQ(ti::tile_padded({}, pl::f32, MemorySpace::Vmem), (pl::Shape{}));
  EXPECT_CONTAINS(error_of([] { ti::tile_padded({8, 128}, pl::f64, MemorySpace::Vmem); }),
                  "f64 has no TPU tiling");
}

// Scratch of (10, 128) f32 (stored as (16, 128)): the kernel writes rows [8, 16) with a dynamic
// start (rows 10..15 are padding: dropped), then reads rows [0, 16) back into the output (a
// slice longer than the Ref's logical dim is a trace-time error, so two reads of 8).
pl::Array run_padding_kernel(const std::string& bounds) {
  auto kernel = [](pl::Ref x, pl::Ref o, pl::Ref s) {
    pl::Value zero = pl::program_id(0);
    s[pl::all] = x[pl::all];
    s.store({pl::ds(zero + 8, 8)}, pl::full({8, 128}, pl::f32, -1.0));
    o.store({pl::ds(0, 8)}, s.load({pl::ds(zero, 8)}));
    o.store({pl::ds(8, 8)}, s.load({pl::ds(zero + 8, 8)}));  // rows 10..15: the padding
  };
  pltpu::InterpretParams p;
  p.buffer_bounds = bounds;
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({16, 128}, pl::f32),
                              {.grid = {1},
                               .in_specs = {pl::BlockSpec({10, 128}, [](pl::Value) { return pl::Indices{0, 0}; })},
                               .out_specs = {pl::BlockSpec({16, 128}, [](pl::Value) { return pl::Indices{0, 0}; })},
                               .scratch_shapes = {pltpu::VMEM({10, 128}, pl::f32)},
                               .interpret = p});
  return call(iota_f32({10, 128}))[0];
}

TEST(TpuBufferBounds, PaddingReadsFillAndDropsWrites) {
  pl::Array o = run_padding_kernel("padded");
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 0; c < 128; c += 37) {
      float got = o.data<float>()[r * 128 + c];
      if (r < 8)
        EXPECT_EQ(got, static_cast<float>(r * 128 + c)) << r << "," << c;
      else if (r < 10)
        EXPECT_EQ(got, -1.0f) << r << "," << c;  // the logical part of the write landed
      else
        EXPECT_TRUE(std::isnan(got)) << r << "," << c << ": the padding kept the fill value";
    }
  // With logical bounds the same kernel is out of bounds.
  EXPECT_CONTAINS(error_of([] { run_padding_kernel("logical"); }),
                  "Out-of-bounds write of (device 0 core 0 vmem");
}

TEST(TpuBufferBounds, BeyondThePaddingIsOutOfBounds) {
  auto kernel = [](pl::Ref o, pl::Ref s) {
    o[pl::all] = s.load({pl::ds(pl::program_id(0) + 16, 8)});
  };
  pltpu::InterpretParams p;
  p.buffer_bounds = "padded";
  auto call = pl::pallas_call(kernel, pl::ShapeDtype({8, 128}, pl::f32),
                              {.grid = {1}, .scratch_shapes = {pltpu::VMEM({10, 128}, pl::f32)},
                               .interpret = p});
  EXPECT_CONTAINS(error_of([&] { call(); }), "but buffer has shape (16, 128)");
}

TEST(TpuBufferBounds, DmasAndResultsUseTheLogicalShape) {
  // An HBM input (10, 100) copied whole into VMEM scratch and out again: padding never travels
  // and the result is exact, in both DMA modes.
  for (const char* mode : {"eager", "on_wait"}) {
    auto kernel = [](pl::Ref x_hbm, pl::Ref o, pl::Ref buf, pl::Ref sem) {
      pltpu::sync_copy(x_hbm, buf);
      auto c = pltpu::make_async_copy(buf, o, sem);
      c.start();
      c.wait();
    };
    pltpu::InterpretParams p;
    p.buffer_bounds = "padded";
    p.dma_execution_mode = mode;
    p.detect_races = true;
    auto races = std::make_shared<std::vector<pltpu::RaceReport>>();
    p.races = races;
    auto call = pl::pallas_call(kernel, pl::ShapeDtype({10, 100}, pl::f32),
                                {.in_specs = {pl::BlockSpec(pltpu::ANY)},
                                 .out_specs = {pl::BlockSpec(pltpu::ANY)},
                                 .scratch_shapes = {pltpu::VMEM({10, 100}, pl::f32),
                                                    pltpu::semaphores(pltpu::SemaphoreType::DMA)},
                                 .interpret = p});
    pl::Array x = iota_f32({10, 100});
    pl::Array o = call(x)[0];
    ASSERT_EQ(o.shape(), (pl::Shape{10, 100}));
    for (int64_t i = 0; i < x.size(); ++i) ASSERT_EQ(o.data<float>()[i], x.data<float>()[i]) << mode;
    EXPECT_TRUE(races->empty()) << mode;
  }
}

}  // namespace
