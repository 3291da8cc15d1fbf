// DLPack export / zero-copy import.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include "pallas/array.h"

namespace pallas {
namespace {

template <class F> void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected a pallas::Error containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

// A tensor produced by a foreign framework: 6 floats owned by the test, with a deleter that
// counts its calls.
struct Foreign {
  alignas(64) float data[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {3, 1};
  int deleted = 0;
  DLManagedTensor tensor{};
  Foreign() {
    DLTensor& t = tensor.dl_tensor;
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
    t.strides = nullptr;
    t.byte_offset = 0;
    tensor.manager_ctx = this;
    tensor.deleter = [](DLManagedTensor* self) { ++static_cast<Foreign*>(self->manager_ctx)->deleted; };
  }
};

TEST(DLPack, ExportFields) {
  const Array a = Array::iota({2, 3, 4}, f32);
  DLManagedTensor* t = a.to_dlpack();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dl_tensor.data, a.raw_data());
  EXPECT_EQ(t->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(t->dl_tensor.device.device_id, 0);
  EXPECT_EQ(t->dl_tensor.ndim, 3);
  EXPECT_EQ(std::vector<int64_t>(t->dl_tensor.shape, t->dl_tensor.shape + 3), (std::vector<int64_t>{2, 3, 4}));
  ASSERT_NE(t->dl_tensor.strides, nullptr);
  EXPECT_EQ(std::vector<int64_t>(t->dl_tensor.strides, t->dl_tensor.strides + 3),
            (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(t->dl_tensor.byte_offset, 0u);
  EXPECT_EQ(t->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(t->dl_tensor.dtype.bits, 32);
  EXPECT_EQ(t->dl_tensor.dtype.lanes, 1);
  ASSERT_NE(t->deleter, nullptr);
  t->deleter(t);
}

TEST(DLPack, ExportDtypes) {
  struct Case {
    DType dtype;
    uint8_t code, bits;
  };
  for (Case c : {Case{bool_, kDLUInt, 8}, Case{i8, kDLInt, 8}, Case{i64, kDLInt, 64},
                 Case{u16, kDLUInt, 16}, Case{u64, kDLUInt, 64}, Case{f16, kDLFloat, 16},
                 Case{bf16, kDLBfloat, 16}, Case{f64, kDLFloat, 64}}) {
    DLManagedTensor* t = Array::zeros({3}, c.dtype).to_dlpack();
    EXPECT_EQ(t->dl_tensor.dtype.code, c.code) << dtype_name(c.dtype);
    EXPECT_EQ(t->dl_tensor.dtype.bits, c.bits) << dtype_name(c.dtype);
    EXPECT_EQ(t->dl_tensor.dtype.lanes, 1);
    t->deleter(t);
  }
  expect_error([] { Array::zeros({2}, DType::Semaphore).to_dlpack(); }, "semaphore");
}

TEST(DLPack, ExportKeepsBufferAlive) {
  Array a = Array::iota({1000}, f64);
  DLManagedTensor* t = a.to_dlpack();
  a = Array();  // drop the only user handle; the tensor still holds one
  const double* p = static_cast<const double*>(t->dl_tensor.data);
  EXPECT_EQ(p[999], 999.0);
  t->deleter(t);  // ASan would report a leak if this did not free the context and buffer
}

TEST(DLPack, RoundTripSharesBuffer) {
  Array a = Array::iota({2, 3}, i32);
  Array b = Array::from_dlpack(a.to_dlpack());
  EXPECT_EQ(b.shape(), a.shape());
  EXPECT_EQ(b.dtype(), i32);
  EXPECT_EQ(b.raw_data(), a.raw_data());
  EXPECT_TRUE(b.shares_buffer_with(a));
  b.set({1, 2}, -7);
  EXPECT_EQ(a.get({1, 2}), -7.0);
  a.set({0, 0}, 99);
  EXPECT_EQ(b.get({0, 0}), 99.0);
  a = Array();  // b alone keeps the buffer alive now
  EXPECT_EQ(b.get({1, 1}), 4.0);

  for (DType t : {bf16, f16, u8, i64, f64}) {
    const Array x = Array::iota({5}, t);
    const Array y = Array::from_dlpack(x.to_dlpack());
    EXPECT_EQ(y.dtype(), t);
    EXPECT_EQ(y.to_doubles(), x.to_doubles());
  }
  // No bool code in DLPack 0.6: bool comes back as u8 with the same bytes.
  const Array flags = Array::from_values({2}, bool_, {1, 0});
  const Array back = Array::from_dlpack(flags.to_dlpack());
  EXPECT_EQ(back.dtype(), u8);
  EXPECT_EQ(back.to_doubles(), (std::vector<double>{1, 0}));

  const Array scalar = Array::full({}, f32, 2.5);
  const Array scalar_back = Array::from_dlpack(scalar.to_dlpack());
  EXPECT_EQ(scalar_back.rank(), 0);
  EXPECT_EQ(scalar_back.get({}), 2.5);
}

TEST(DLPack, ImportCallsDeleterOnceWhenLastHandleDies) {
  Foreign f;
  {
    Array a = Array::from_dlpack(&f.tensor);
    EXPECT_EQ(a.raw_data(), f.data);
    EXPECT_EQ(a.shape(), (Shape{2, 3}));
    EXPECT_EQ(a.get({1, 2}), 5.0);
    Array b = a;
    Array c = a.reshaped({6});
    a = Array();
    b = Array();
    EXPECT_EQ(f.deleted, 0);
    c.set({0}, 42);
    EXPECT_EQ(f.data[0], 42.0f);  // zero copy
  }
  EXPECT_EQ(f.deleted, 1);
}

TEST(DLPack, ImportStridesAndOffset) {
  {
    Foreign f;
    f.tensor.dl_tensor.strides = f.strides;  // explicit row-major strides
    EXPECT_EQ(Array::from_dlpack(&f.tensor).get({1, 0}), 3.0);
    EXPECT_EQ(f.deleted, 1);
  }
  {
    Foreign f;
    f.shape[0] = 1;
    f.strides[0] = 12345;  // a size-1 dimension is never stepped: any stride is contiguous
    EXPECT_EQ(Array::from_dlpack(&f.tensor).get({0, 2}), 2.0);
  }
  {
    Foreign f;
    f.tensor.dl_tensor.byte_offset = 2 * sizeof(float);
    EXPECT_EQ(Array::from_dlpack(&f.tensor).get({0, 0}), 2.0);
  }
  {
    Foreign f;
    f.tensor.dl_tensor.dtype = {6, 8, 1};  // kDLBool in DLPack >= 0.8
    f.shape[1] = 2;
    const Array a = Array::from_dlpack(&f.tensor);
    EXPECT_EQ(a.dtype(), bool_);
  }
}

TEST(DLPack, ImportRejections) {
  Foreign f;
  f.tensor.dl_tensor.device = {kDLCUDA, 0};
  expect_error([&] { Array::from_dlpack(&f.tensor); },
               "from_dlpack: tensor is on device type 2 (CUDA); host Arrays need kDLCPU");
  f.tensor.dl_tensor.device = {kDLCPU, 0};

  f.tensor.dl_tensor.strides = f.strides;
  f.strides[0] = 1;
  f.strides[1] = 2;  // column-major
  expect_error([&] { Array::from_dlpack(&f.tensor); }, "not row-major contiguous");
  f.tensor.dl_tensor.strides = nullptr;

  f.tensor.dl_tensor.dtype = {kDLFloat, 32, 4};
  expect_error([&] { Array::from_dlpack(&f.tensor); }, "lanes = 4");
  f.tensor.dl_tensor.dtype = {kDLComplex, 64, 1};
  expect_error([&] { Array::from_dlpack(&f.tensor); }, "code 5, bits 64");
  f.tensor.dl_tensor.dtype = {kDLFloat, 8, 1};
  expect_error([&] { Array::from_dlpack(&f.tensor); }, "code 2, bits 8");
  f.tensor.dl_tensor.dtype = {kDLFloat, 32, 1};

  f.tensor.dl_tensor.byte_offset = 1;  // misaligned floats
  expect_error([&] { Array::from_dlpack(&f.tensor); }, "aligned");
  f.tensor.dl_tensor.byte_offset = 0;

  f.shape[0] = -2;
  expect_error([&] { Array::from_dlpack(&f.tensor); }, "negative dimension");
  expect_error([&] { Array::from_dlpack(nullptr); }, "null tensor");
  EXPECT_EQ(f.deleted, 0);  // a rejected tensor still belongs to the caller
}

}  // namespace
}  // namespace pallas
