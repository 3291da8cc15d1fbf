// Tracing: IR structure, dtype promotion, broadcasting, control flow regions.
#include <gtest/gtest.h>

#include "pallas/pallas.h"

namespace pl = pallas;
using pl::ir::OpCode;
using pl::ir::Type;

namespace {

// Collects the op codes of a region (not nested).
std::vector<OpCode> codes(const pl::ir::Region& r) {
  std::vector<OpCode> out;
  for (const auto& op : r.ops) out.push_back(op.code);
  return out;
}

Type ref(pl::Shape s, pl::DType t) { return Type::ref(std::move(s), t, pl::MemorySpace::Vmem); }

}  // namespace

TEST(Trace, AddOneRecordsLoadAddStore) {
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) { o[pl::all] = x[pl::all] + 1.0f; },
      {ref({8, 128}, pl::f32), ref({8, 128}, pl::f32)}, "add_one");
  EXPECT_EQ(k.name, "add_one");
  ASSERT_EQ(k.body.args.size(), 2u);
  EXPECT_EQ(codes(k.body),
            (std::vector<OpCode>{OpCode::Load, OpCode::Constant, OpCode::Add, OpCode::Store}));
  const auto& add = k.body.ops[2];
  EXPECT_EQ(k.type(add.results[0]), Type::tensor({8, 128}, pl::f32));
  // The literal is splatted to the full shape with x's dtype (weak typing).
  const auto& c = k.body.ops[1];
  EXPECT_EQ(c.attrs.get_scalar(pl::ir::AttrKey::Value).dtype, pl::f32);
  EXPECT_EQ(c.attrs.get_scalar(pl::ir::AttrKey::Value).f, 1.0);
}

TEST(Trace, EveryOpRecordsTheUsersSourceLine) {
  int line = 0;
  auto k = pl::trace_kernel(
      [&](pl::Ref x, pl::Ref o) {
        line = __LINE__ + 1;
        pl::Value y = pl::exp(x[pl::all]) * x[pl::all];
        o[pl::all] = y;
      },
      {ref({4}, pl::f32), ref({4}, pl::f32)});
  bool found_mul = false;
  for (const auto& op : k.body.ops) {
    EXPECT_NE(op.loc.file.find("trace_test.cpp"), std::string::npos) << op.info().name;
    if (op.code == OpCode::Mul) {
      found_mul = true;
      EXPECT_EQ(op.loc.line, line);
    }
  }
  EXPECT_TRUE(found_mul);
}

struct PromotionCase {
  pl::DType a, b, expected;
};

class TracePromotion : public ::testing::TestWithParam<PromotionCase> {};

TEST_P(TracePromotion, BinaryOpPromotesLikeJax) {
  PromotionCase c = GetParam();
  pl::DType got = pl::DType::Bool;
  pl::trace_kernel(
      [&](pl::Ref x, pl::Ref y) { got = (x[pl::all] + y[pl::all]).dtype(); },
      {ref({4}, c.a), ref({4}, c.b)});
  EXPECT_EQ(got, c.expected) << pl::dtype_name(c.a) << " + " << pl::dtype_name(c.b);
}

INSTANTIATE_TEST_SUITE_P(
    Table, TracePromotion,
    ::testing::Values(PromotionCase{pl::i8, pl::u8, pl::i16}, PromotionCase{pl::u32, pl::i32, pl::i64},
                      PromotionCase{pl::u8, pl::i32, pl::i32}, PromotionCase{pl::u16, pl::u32, pl::u32},
                      PromotionCase{pl::i32, pl::f16, pl::f16}, PromotionCase{pl::f16, pl::bf16, pl::f32},
                      PromotionCase{pl::bf16, pl::f32, pl::f32}, PromotionCase{pl::f32, pl::f64, pl::f64},
                      PromotionCase{pl::bool_, pl::i8, pl::i8}, PromotionCase{pl::i64, pl::f32, pl::f32}));

TEST(Trace, WeakLiteralsKeepTheValuesDtype) {
  std::vector<pl::DType> got;
  pl::trace_kernel(
      [&](pl::Ref b16, pl::Ref i, pl::Ref flag) {
        got.push_back((b16[pl::all] * 2.0f).dtype());   // bf16 stays bf16
        got.push_back((b16[pl::all] + 3).dtype());      // int literal: bf16
        got.push_back((i[pl::all] + 1).dtype());        // i16 stays i16
        got.push_back((i[pl::all] * 0.5).dtype());      // int with float literal: f32
        got.push_back((flag[pl::all] + 1).dtype());     // bool with int literal: i32
        got.push_back((i[pl::all] < 3).dtype());        // comparison: bool
      },
      {ref({4}, pl::bf16), ref({4}, pl::i16), ref({4}, pl::bool_)});
  EXPECT_EQ(got, (std::vector<pl::DType>{pl::bf16, pl::bf16, pl::i16, pl::f32, pl::i32, pl::bool_}));
}

TEST(Trace, UnsignedWithSigned64IsAnErrorNamingBothTypes) {
  try {
    pl::trace_kernel([](pl::Ref a, pl::Ref b) { (void)(a[pl::all] + b[pl::all]); },
                     {ref({4}, pl::u64), ref({4}, pl::i64)});
    FAIL() << "expected an error";
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("u64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("trace_test.cpp"), std::string::npos) << e.what();
  }
}

TEST(Trace, BroadcastingRecordsBroadcastInDim) {
  pl::Shape shape;
  auto k = pl::trace_kernel(
      [&](pl::Ref col, pl::Ref row, pl::Ref o) {
        pl::Value v = col[pl::all] + row[pl::all];  // [8,1] + [128] -> [8,128]
        shape = v.shape();
        o[pl::all] = v;
      },
      {ref({8, 1}, pl::f32), ref({128}, pl::f32), ref({8, 128}, pl::f32)});
  EXPECT_EQ(shape, (pl::Shape{8, 128}));
  int broadcasts = 0;
  for (const auto& op : k.body.ops)
    if (op.code == OpCode::BroadcastInDim) {
      ++broadcasts;
      EXPECT_EQ(k.type(op.results[0]).shape, (pl::Shape{8, 128}));
    }
  EXPECT_EQ(broadcasts, 2);
}

TEST(Trace, ForLoopWithCarryBuildsARegion) {
  auto k = pl::trace_kernel(
      [](pl::Ref o) {
        pl::Value total = pl::fori_loop(0, 10, 0, [](pl::Value i, pl::Value acc) { return acc + i; });
        o[pl::all] = total;
      },
      {ref({}, pl::i32)});
  const pl::ir::Op* loop = nullptr;
  for (const auto& op : k.body.ops)
    if (op.code == OpCode::For) loop = &op;
  ASSERT_NE(loop, nullptr);
  ASSERT_EQ(loop->regions.size(), 1u);
  const auto& body = loop->regions[0];
  EXPECT_EQ(body.args.size(), 2u);
  EXPECT_EQ(body.ops.back().code, OpCode::Yield);
  EXPECT_EQ(k.type(loop->results[0]), Type::scalar(pl::i32));
}

TEST(Trace, RefViewsCompose) {
  auto k = pl::trace_kernel(
      [](pl::Ref x) {
        pl::Ref row = x.at(pl::ds(2, 4)).at(1);  // row 3 of x
        EXPECT_EQ(row.shape(), (pl::Shape{16}));
        EXPECT_EQ(row.memory_space(), pl::MemorySpace::Vmem);
        row[pl::all] = 0.0f;
      },
      {ref({8, 16}, pl::f32)});
  EXPECT_EQ(codes(k.body), (std::vector<OpCode>{OpCode::RefView, OpCode::RefView,
                                                OpCode::Constant, OpCode::Store}));
}

TEST(Trace, ControlFlowHelpersTraceBranches) {
  auto k = pl::trace_kernel(
      [](pl::Ref x, pl::Ref o) {
        pl::Value v = x[pl::all];
        pl::Value s = pl::sum(v);
        pl::when(s > 0.0f, [&] { o[pl::all] = v; });
        pl::Value r = pl::cond(s > 1.0f, [&] { return v * 2.0f; }, [&] { return v; });
        auto outs = pl::switch_case(
            pl::program_id(0),
            {[&] { return std::vector<pl::Value>{r}; }, [&] { return std::vector<pl::Value>{r + 1.0f}; }});
        auto w = pl::while_loop(
            std::vector<pl::Value>{pl::scalar(0, pl::i32)},
            [](const std::vector<pl::Value>& c) { return c[0] < 5; },
            [](const std::vector<pl::Value>& c) { return std::vector<pl::Value>{c[0] + 1}; });
        (void)w;
        pl::run_scoped({{{8}, pl::f32, pl::MemorySpace::Vmem}}, [&](std::vector<pl::Ref> scratch) {
          scratch[0][pl::all] = outs[0];
          o[pl::all] = scratch[0][pl::all];
          return std::vector<pl::Value>{};
        });
      },
      {ref({8}, pl::f32), ref({8}, pl::f32)});
  std::vector<OpCode> cs = codes(k.body);
  for (OpCode c : {OpCode::Cond, OpCode::Switch, OpCode::While, OpCode::RunScoped})
    EXPECT_NE(std::find(cs.begin(), cs.end(), c), cs.end()) << pl::ir::op_info(c).name;
  pl::ir::verify(k);
}

TEST(Trace, KeepdimsReductionsBroadcastBack) {
  std::vector<pl::Shape> shapes;
  pl::trace_kernel(
      [&](pl::Ref x) {
        pl::Value v = x[pl::all];
        shapes.push_back(pl::max(v, {1}, true).shape());
        shapes.push_back(pl::sum(v, {0, 2}, true).shape());
        shapes.push_back((v - pl::max(v, {-1}, true)).shape());
      },
      {ref({2, 3, 4}, pl::f32)});
  EXPECT_EQ(shapes, (std::vector<pl::Shape>{{2, 1, 4}, {1, 3, 1}, {2, 3, 4}}));
}
