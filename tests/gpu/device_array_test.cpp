// Device arrays (pallas/device_array.h): calls chained on device-resident operands, in-place
// aliasing, private copies of written inputs, DLPack both ways, and the errors. Values are
// checked against plain C++. Each case runs emulated (gpu_emulate: the device's memory is host
// memory) and, where there is a GPU, on it.
#include <gtest/gtest.h>

#include <dlpack/dlpack.h>

#include "gpu/cuda_libs.h"
#include "pallas/device_array.h"
#include "pallas/pallas.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace pl = pallas;
namespace plgpu = pallas::gpu;
using test_util::error_of;

namespace {

class DeviceArrays : public test_util::OnGpuBackends {
 protected:
  bool gpu() const { return GetParam() == "mosaic_gpu"; }
  plgpu::DeviceArray put(const pl::Array& a) const {
    return gpu() ? plgpu::DeviceArray::to_gpu(a) : plgpu::DeviceArray::emulated(a);
  }
};
INSTANTIATE_TEST_SUITE_P(Backends, DeviceArrays, testing::Values("gpu_emulate", "mosaic_gpu"),
                         test_util::backend_name);

// o = x * a + 1, in blocks of 128.
pl::PallasCall affine(const std::string& backend, float a, std::map<int, int> aliases = {}) {
  pl::CallOptions o;
  o.grid = {4};
  o.in_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.out_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.backend = backend;
  o.input_output_aliases = std::move(aliases);
  return pl::pallas_call([a](pl::Ref x, pl::Ref out) { out[pl::all] = x[pl::all] * a + 1.0f; },
                         pl::ShapeDtype({512}, pl::f32), o);
}

// o = x * 2 + program_id(0) over a dynamic number of blocks of 128 (its leading argument), in
// place: the blocks past it keep x's values.
pl::PallasCall scaled_prefix(const std::string& backend) {
  pl::CallOptions o;
  o.grid = pl::Grid{pl::dynamic};
  o.in_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.out_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.backend = backend;
  o.input_output_aliases = {{0, 0}};
  return pl::pallas_call(
      [](pl::Ref x, pl::Ref out) { out[pl::all] = x[pl::all] * 2.0f + pl::program_id(0).astype(pl::f32); },
      pl::ShapeDtype({512}, pl::f32), o);
}

pl::Array ramp(int64_t n) {
  pl::Array a = pl::Array::zeros({n}, pl::f32);
  for (int64_t i = 0; i < n; ++i) a.data<float>()[i] = static_cast<float>(i % 37) - 11.0f;
  return a;
}

TEST_P(DeviceArrays, CallsChainOnDeviceResidentOperands) {
  pl::Array x = ramp(512);
  plgpu::DeviceArray dx = put(x);
  EXPECT_EQ(dx.shape(), (pl::Shape{512}));
  EXPECT_EQ(dx.on_gpu(), gpu());
  pl::PallasCall twice = affine(GetParam(), 2.0f), thrice = affine(GetParam(), 3.0f);
  plgpu::DeviceArray y = plgpu::call_on_device(twice, {dx}).at(0);
  plgpu::DeviceArray z = plgpu::call_on_device(thrice, {y}).at(0);
  EXPECT_FALSE(z.shares_buffer_with(y));
  pl::Array out = z.to_host();
  for (int64_t i = 0; i < 512; ++i) {
    const float v = x.data<float>()[i];
    ASSERT_EQ(out.data<float>()[i], (v * 2.0f + 1.0f) * 3.0f + 1.0f) << i;
  }
  // The operands are unchanged, and the host array was copied, not shared.
  pl::Array back = dx.to_host();
  for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(back.data<float>()[i], x.data<float>()[i]) << i;
}

TEST_P(DeviceArrays, AnAliasedOutputIsItsInputUpdatedInPlace) {
  pl::Array x = ramp(512);
  plgpu::DeviceArray dx = put(x);
  plgpu::DeviceArray out = plgpu::call_on_device(affine(GetParam(), 5.0f, {{0, 0}}), {dx}).at(0);
  EXPECT_TRUE(out.shares_buffer_with(dx));
  EXPECT_EQ(out.data_ptr(), dx.data_ptr());
  pl::Array got = dx.to_host();
  for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(got.data<float>()[i], x.data<float>()[i] * 5.0f + 1.0f) << i;
}

// A kernel that writes its input without aliasing it works on a private copy, as with host arrays.
TEST_P(DeviceArrays, AWrittenInputThatIsNotAliasedStaysUnchanged) {
  pl::CallOptions o;
  o.backend = GetParam();
  pl::PallasCall call = pl::pallas_call(
      [](pl::Ref x, pl::Ref out) {
        x[pl::all] = x[pl::all] + 100.0f;
        out[pl::all] = x[pl::all] * 2.0f;
      },
      pl::ShapeDtype({64}, pl::f32), o);
  pl::Array x = ramp(64);
  plgpu::DeviceArray dx = put(x);
  pl::Array out = plgpu::call_on_device(call, {dx}).at(0).to_host();
  pl::Array after = dx.to_host();
  for (int64_t i = 0; i < 64; ++i) {
    ASSERT_EQ(out.data<float>()[i], (x.data<float>()[i] + 100.0f) * 2.0f) << i;
    ASSERT_EQ(after.data<float>()[i], x.data<float>()[i]) << i;
  }
}

// o = x + 1 in blocks of 128 of a 512-element x over a grid of `blocks`, x's block index lagging
// `lag` behind: a block out of bounds, which the kernel records (the interpreters' error).
pl::PallasCall misindexed(const std::string& backend, int64_t blocks, int64_t lag, const std::string& name) {
  pl::CallOptions o;
  o.grid = {blocks};
  o.in_specs = {pl::BlockSpec({128}, [lag](pl::Value i) { return pl::Indices{i - lag}; })};
  o.out_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.backend = backend;
  o.name = name;
  return pl::pallas_call([](pl::Ref x, pl::Ref out) { out[pl::all] = x[pl::all] + 1.0f; },
                         pl::ShapeDtype({512}, pl::f32), o);
}
// The fifth of 5 blocks is out of bounds.
pl::PallasCall overrun(const std::string& backend) { return misindexed(backend, 5, 0, "overrun"); }

// call_on_device_async: calls chain without waiting; what a kernel records is raised at the
// stream's next synchronizing point (synchronize, to_host, a waiting call), once.
TEST_P(DeviceArrays, AsyncCallsRaiseWhatTheyRecordedAtTheNextSynchronizingPoint) {
  const pl::Array x = ramp(512);
  pl::PallasCall twice = affine(GetParam(), 2.0f), thrice = affine(GetParam(), 3.0f);
  auto expect_chain = [&](const plgpu::DeviceArray& z) {
    const pl::Array got = z.to_host();
    for (int64_t i = 0; i < 512; ++i)
      ASSERT_EQ(got.data<float>()[i], (x.data<float>()[i] * 2.0f + 1.0f) * 3.0f + 1.0f) << i;
  };
  plgpu::DeviceArray dx = put(x);
  expect_chain(plgpu::call_on_device_async(thrice, {plgpu::call_on_device_async(twice, {dx}).at(0)}).at(0));
  EXPECT_NO_THROW(plgpu::synchronize());  // (nothing recorded)

  // A failing call, and calls after it: synchronize raises its error, and only once.
  const std::string expected = "Out-of-bounds block index (4,) for input \"args[0]\" in iteration (4,)";
  EXPECT_NO_THROW(plgpu::call_on_device_async(overrun(GetParam()), {dx}));
  plgpu::DeviceArray y;
  EXPECT_NO_THROW(y = plgpu::call_on_device_async(twice, {dx}).at(0));
  EXPECT_NO_THROW(plgpu::call_on_device_async(overrun(GetParam()), {dx}));
  EXPECT_CONTAINS(error_of([&] { plgpu::synchronize(); }), expected);
  EXPECT_NO_THROW(plgpu::synchronize());
  expect_chain(plgpu::call_on_device(thrice, {y}).at(0));  // (y was computed all the same)

  // to_host, a waiting call and an export (DLPack) are synchronizing points too.
  EXPECT_NO_THROW(plgpu::call_on_device_async(overrun(GetParam()), {dx}));
  EXPECT_CONTAINS(error_of([&] { dx.to_host(); }), expected);
  EXPECT_NO_THROW(dx.to_host());
  EXPECT_NO_THROW(plgpu::call_on_device_async(overrun(GetParam()), {dx}));
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(twice, {dx}); }), expected);
  EXPECT_NO_THROW(plgpu::synchronize());
  EXPECT_NO_THROW(plgpu::call_on_device_async(overrun(GetParam()), {dx}));
  EXPECT_CONTAINS(error_of([&] { dx.to_dlpack(); }), expected);  // (raised before exporting)
  DLManagedTensor* exported = nullptr;
  EXPECT_NO_THROW(exported = dx.to_dlpack());
  if (exported) exported->deleter(exported);

  // Errors in the call itself are raised at once.
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device_async(twice, {plgpu::DeviceArray()}); }),
                  "call_on_device_async(kernel at device_array_test.cpp:");
  EXPECT_NO_THROW(plgpu::synchronize());
}

// Block -1 at iteration 0 is out of bounds (another error than overrun's).
pl::PallasCall underrun(const std::string& backend) { return misindexed(backend, 4, 1, "underrun"); }

// More asynchronous calls than may be pending on a stream at once (32): past the bound a call
// waits for the oldest, and what finished is let go. The calls still run in order, and the first
// error recorded — not a later one — is what synchronize raises.
TEST_P(DeviceArrays, ManyAsyncCallsRunInOrderAndRaiseTheFirstErrorRecorded) {
  const pl::Array x = ramp(512);
  pl::PallasCall increment = affine(GetParam(), 1.0f, {{0, 0}});  // x + 1, in place
  pl::PallasCall fails_first = overrun(GetParam()), fails_later = underrun(GetParam());
  plgpu::DeviceArray dx = put(x);
  const int calls = 100;
  for (int c = 0; c < calls; ++c) {
    ASSERT_NO_THROW(plgpu::call_on_device_async(increment, {dx})) << c;
    if (c == 30) {
      ASSERT_NO_THROW(plgpu::call_on_device_async(fails_first, {dx}));
    } else if (c == 70) {
      ASSERT_NO_THROW(plgpu::call_on_device_async(fails_later, {dx}));
    }
  }
  const std::string raised = error_of([&] { plgpu::synchronize(); });
  EXPECT_CONTAINS(raised, "Out-of-bounds block index (4,) for input \"args[0]\" in iteration (4,)");
  EXPECT_EQ(raised.find("(-1,)"), std::string::npos) << raised;
  EXPECT_NO_THROW(plgpu::synchronize());
  const pl::Array got = dx.to_host();
  for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(got.data<float>()[i], x.data<float>()[i] + calls) << i;
  // The later error alone, when it is the only one.
  EXPECT_NO_THROW(plgpu::call_on_device_async(fails_later, {dx}));
  EXPECT_CONTAINS(error_of([&] { plgpu::synchronize(); }),
                  "Out-of-bounds block index (-1,) for input \"args[0]\" in iteration (0,)");
}

// The dynamic grid sizes lead the operands, as device scalars: read back to the host.
TEST_P(DeviceArrays, DynamicGridSizesAreDeviceScalars) {
  const pl::Array x = ramp(512);
  pl::PallasCall call = scaled_prefix(GetParam());
  for (int32_t blocks : {3, 0, 4}) {
    SCOPED_TRACE(std::to_string(blocks) + " blocks");
    plgpu::DeviceArray dx = put(x);
    const plgpu::DeviceArray out = plgpu::call_on_device(call, {put(pl::Array::full({}, pl::i32, blocks)), dx}).at(0);
    EXPECT_TRUE(out.shares_buffer_with(dx));
    const pl::Array got = out.to_host();
    for (int64_t i = 0; i < 512; ++i) {
      const float v = x.data<float>()[i];
      ASSERT_EQ(got.data<float>()[i], i / 128 < blocks ? v * 2.0f + static_cast<float>(i / 128) : v) << i;
    }
  }
}

// A vmapped call runs as its one batched kernel on the arrays as they lie: batched along any
// axis, or not batched (every batch element reads the same array).
TEST_P(DeviceArrays, AVmappedCallRunsAsOneBatchedKernel) {
  pl::CallOptions o;
  o.grid = {4};
  o.in_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; }),
                pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.out_specs = {pl::BlockSpec({128}, [](pl::Value i) { return pl::Indices{i}; })};
  o.backend = GetParam();
  pl::PallasCall axpy = pl::pallas_call(
      [](pl::Ref x, pl::Ref y, pl::Ref out) { out[pl::all] = x[pl::all] * 3.0f + y[pl::all]; },
      pl::ShapeDtype({512}, pl::f32), o);
  const int64_t B = 3;
  pl::Array xs = pl::Array::random_normal({B, 512}, pl::f32, 7), y = ramp(512);
  pl::Array xs_t = pl::Array::zeros({512, B}, pl::f32);  // xs, batched along its last axis
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < 512; ++i) xs_t.data<float>()[i * B + b] = xs.data<float>()[b * 512 + i];
  struct Case { std::vector<std::optional<int>> in_axes; int out_axis; const pl::Array* x; };
  for (const Case& c : {Case{{0, std::nullopt}, 0, &xs}, Case{{1, std::nullopt}, 1, &xs_t}}) {
    SCOPED_TRACE("x batched along axis " + std::to_string(*c.in_axes[0]));
    const pl::Array got =
        plgpu::call_on_device(pl::vmap(axpy, c.in_axes, {c.out_axis}), {put(*c.x), put(y)}).at(0).to_host();
    ASSERT_EQ(got.shape(), c.out_axis == 0 ? (pl::Shape{B, 512}) : (pl::Shape{512, B}));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < 512; ++i) {
        const int64_t at = c.out_axis == 0 ? b * 512 + i : i * B + b;
        ASSERT_EQ(got.data<float>()[at], xs.data<float>()[b * 512 + i] * 3.0f + y.data<float>()[i]) << b << " " << i;
      }
  }
  // In place: an input aliased to the output and batched along the output's axis.
  plgpu::DeviceArray dxs = put(xs);
  const plgpu::DeviceArray out = plgpu::call_on_device(pl::vmap(affine(GetParam(), 2.0f, {{0, 0}}), {0}), {dxs}).at(0);
  EXPECT_TRUE(out.shares_buffer_with(dxs));
  const pl::Array got = dxs.to_host();
  for (int64_t i = 0; i < B * 512; ++i) ASSERT_EQ(got.data<float>()[i], xs.data<float>()[i] * 2.0f + 1.0f) << i;
}

// DLPack: export shares the memory and keeps it alive; import takes ownership and runs the
// producer's deleter once, when the last handle is gone.
TEST_P(DeviceArrays, DlpackRoundTripSharesMemory) {
  pl::Array x = ramp(512);
  DLManagedTensor* t = nullptr;
  uint64_t address = 0;
  {
    plgpu::DeviceArray dx = put(x);
    address = dx.data_ptr();
    t = dx.to_dlpack();
  }  // the export keeps the memory alive
  EXPECT_EQ(t->dl_tensor.device.device_type, gpu() ? kDLCUDA : kDLCPU);
  EXPECT_EQ(t->dl_tensor.device.device_id, 0);
  EXPECT_EQ(reinterpret_cast<uint64_t>(t->dl_tensor.data), address);
  EXPECT_EQ(t->dl_tensor.ndim, 1);
  EXPECT_EQ(t->dl_tensor.shape[0], 512);
  EXPECT_EQ(t->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(t->dl_tensor.dtype.bits, 32);
  plgpu::DeviceArray imported = plgpu::DeviceArray::from_dlpack(t);
  EXPECT_EQ(imported.data_ptr(), address);
  EXPECT_EQ(imported.on_gpu(), gpu());
  pl::Array out = plgpu::call_on_device(affine(GetParam(), 2.0f), {imported}).at(0).to_host();
  for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(out.data<float>()[i], x.data<float>()[i] * 2.0f + 1.0f) << i;
}

// A foreign producer's tensor: its deleter runs exactly once, after the last handle.
TEST(DeviceArraysEmulated, ImportedTensorsDeleterRunsOnceAtTheEnd) {
  static int deleted = 0;
  deleted = 0;
  std::vector<float> data(512);
  for (int i = 0; i < 512; ++i) data[static_cast<size_t>(i)] = static_cast<float>(i);
  int64_t shape[1] = {512};
  DLManagedTensor t{};
  t.dl_tensor.data = data.data();
  t.dl_tensor.device = {kDLCPU, 0};
  t.dl_tensor.ndim = 1;
  t.dl_tensor.dtype = {kDLFloat, 32, 1};
  t.dl_tensor.shape = shape;
  t.deleter = [](DLManagedTensor*) { ++deleted; };
  {
    plgpu::DeviceArray d = plgpu::DeviceArray::from_dlpack(&t);
    plgpu::DeviceArray y = plgpu::call_on_device(affine("gpu_emulate", 1.0f, {{0, 0}}), {d}).at(0);
    d = plgpu::DeviceArray();
    EXPECT_EQ(deleted, 0);  // y still holds the memory
    EXPECT_EQ(y.to_host().data<float>()[7], 8.0f);
  }
  EXPECT_EQ(deleted, 1);
  EXPECT_EQ(data[7], 8.0f);  // updated in the producer's memory: no copy was made
}

TEST(DeviceArraysEmulated, MisuseIsReportedClearly) {
  pl::Array x = ramp(512);
  plgpu::DeviceArray dx = plgpu::DeviceArray::emulated(x);
  // The call runs elsewhere than its operands.
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(affine("reference", 2.0f), {dx}); }),
                  "device arrays run on the GPU backend (backend \"mosaic_gpu\") or its emulation");
  if (!pl::gpu::driver_unavailable_reason().empty()) {
    EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(affine("mosaic_gpu", 2.0f), {dx}); }),
                    "argument 0 is in the emulated device's (host) memory but the call runs on the GPU");
    EXPECT_CONTAINS(error_of([&] { plgpu::DeviceArray::to_gpu(x); }), "the GPU backend needs an NVIDIA GPU");
  }
  // Shapes are checked as for host arrays.
  plgpu::DeviceArray small = plgpu::DeviceArray::emulated(ramp(100));
  EXPECT_FALSE(error_of([&] { plgpu::call_on_device(affine("gpu_emulate", 2.0f), {small}); }).empty());
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(affine("gpu_emulate", 2.0f), {plgpu::DeviceArray()}); }),
                  "argument 0 is an empty (default-constructed) device array");
  // Imports: device type, device id and layout.
  float data[6] = {};
  int64_t shape[2] = {2, 3}, strides[2] = {1, 2};
  DLManagedTensor t{};
  t.dl_tensor.data = data;
  t.dl_tensor.device = {kDLROCM, 0};
  t.dl_tensor.ndim = 2;
  t.dl_tensor.dtype = {kDLFloat, 32, 1};
  t.dl_tensor.shape = shape;
  EXPECT_CONTAINS(error_of([&] { plgpu::DeviceArray::from_dlpack(&t); }), "device type 10 (ROCM)");
  t.dl_tensor.device = {kDLCUDA, 1};
  EXPECT_CONTAINS(error_of([&] { plgpu::DeviceArray::from_dlpack(&t); }),
                  "tensor is on CUDA device 1; the GPU backend runs on device 0");
  t.dl_tensor.device = {kDLCUDA, 0};
  t.dl_tensor.strides = strides;
  EXPECT_CONTAINS(error_of([&] { plgpu::DeviceArray::from_dlpack(&t); }), "are not row-major contiguous");
  // A dynamic grid size is an integer scalar, on the device as the operands are.
  pl::PallasCall dynamic = scaled_prefix("gpu_emulate");
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(dynamic, {dx, dx}); }),
                  "argument 0 must be an integer scalar (the size of dynamic grid dimension 0), got f32[512]");
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(dynamic, {}); }),
                  "the grid has 1 dynamic dimensions, so the call needs that many leading i32 scalar sizes; got 0");
  const plgpu::DeviceArray minus_one = plgpu::DeviceArray::emulated(pl::Array::full({}, pl::i32, -1));
  EXPECT_CONTAINS(error_of([&] { plgpu::call_on_device(dynamic, {minus_one, dx}); }),
                  "dynamic grid dimension 0 has negative size -1");
  EXPECT_EQ(dx.to_host().data<float>()[5], x.data<float>()[5]);  // (nothing ran)
}

// pl::vmap of calls on device arrays: what needs a loop over the batch or a moved batch axis.
TEST(DeviceArraysEmulated, VmapsThatAreNotOneBatchedKernelOnTheArraysAsTheyLie) {
  auto dev = [](const pl::Array& a) { return plgpu::DeviceArray::emulated(a); };
  // An input aliased to the output, batched along another axis than the output's.
  plgpu::DeviceArray x_t = dev(pl::Array::zeros({512, 2}, pl::f32));
  pl::PallasCall in_place = pl::vmap(affine("gpu_emulate", 2.0f, {{0, 0}}), {1});
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] { plgpu::call_on_device(in_place, {x_t}); }),
                  "a vmapped call on device arrays whose input 0 is batched along axis 1 but aliased to an "
                  "output batched along axis 0");
  // A dynamic grid runs one call per batch element.
  const plgpu::DeviceArray n = dev(pl::Array::full({}, pl::i32, 2));
  pl::PallasCall dynamic = pl::vmap(scaled_prefix("gpu_emulate"), {std::nullopt, 0});
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>(
                      [&] { plgpu::call_on_device(dynamic, {n, dev(pl::Array::zeros({2, 512}, pl::f32))}); }),
                  "a vmapped call with a dynamic grid on device arrays");
  // So does a batched scalar-prefetch operand.
  pl::CallOptions o;
  o.grid_spec = pl::PrefetchScalarGridSpec(1, {4}, {pl::BlockSpec({1, 8}, [](pl::Value i, pl::Ref t) { return pl::Indices{t[i], 0}; })},
                                           {pl::BlockSpec({1, 8}, [](pl::Value i, pl::Ref) { return pl::Indices{i, 0}; })});
  o.backend = "gpu_emulate";
  pl::PallasCall gather = pl::vmap(
      pl::pallas_call([](pl::Ref, pl::Ref x, pl::Ref out) { out[pl::all] = x[pl::all]; }, pl::ShapeDtype({4, 8}, pl::f32), o),
      {0, 0});
  EXPECT_CONTAINS(error_of<pl::NotSupportedError>([&] {
                    plgpu::call_on_device(gather, {dev(pl::Array::zeros({2, 4}, pl::i32)), dev(pl::Array::zeros({2, 4, 8}, pl::f32))});
                  }),
                  "a vmapped call with a batched scalar-prefetch operand on device arrays");
}

}  // namespace
