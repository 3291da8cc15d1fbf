// User errors at trace time: each must be a pallas::Error (never an internal error) whose
// message says what is wrong and names the user's source line.
#include <gtest/gtest.h>

#include "pallas/pallas.h"

namespace pl = pallas;
using pl::ir::Type;

namespace {

Type ref(pl::Shape s, pl::DType t) { return Type::ref(std::move(s), t, pl::MemorySpace::Vmem); }

// Runs fn, expects a pallas::Error whose message contains every fragment and points at `line`
// of this file. Returns the message.
template <class F>
std::string expect_user_error(F&& fn, const int& line, std::vector<std::string> fragments) {
  try {
    fn();
  } catch (const pl::InternalError& e) {
    ADD_FAILURE() << "internal error instead of a user error: " << e.what();
    return "";
  } catch (const pl::Error& e) {
    std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
    EXPECT_NE(msg.find("trace_errors_test.cpp:" + std::to_string(line)), std::string::npos)
        << "no user line " << line << " in: " << msg;
    EXPECT_EQ(e.location().line, line) << msg;
    return msg;
  }
  ADD_FAILURE() << "no error raised";
  return "";
}

}  // namespace

TEST(TraceErrors, ShapeMismatchNamesOpBothShapesAndLine) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a, pl::Ref b) {
              line = __LINE__ + 1;
              pl::Value c = a[pl::all] + b[pl::all];
              (void)c;
            },
            {ref({8, 128}, pl::f32), ref({4, 128}, pl::f32)});
      },
      line, {"add", "[8, 128]", "[4, 128]", "broadcast"});
}

TEST(TraceErrors, WrongNumberOfIndices) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a) {
              line = __LINE__ + 1;
              pl::Value v = a(0, 1, 2);
              (void)v;
            },
            {ref({8, 128}, pl::f32)});
      },
      line, {"too many indices", "f32[8,128]"});
}

TEST(TraceErrors, StaticIndexOutOfBounds) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a) {
              line = __LINE__ + 1;
              a[pl::ds(4, 8)] = 1.0f;
            },
            {ref({8}, pl::f32)});
      },
      line, {"store", "out of bounds", "size 8"});
}

TEST(TraceErrors, OutOfRangeAxis) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a) {
              line = __LINE__ + 1;
              (void)pl::sum(a[pl::all], {2});
            },
            {ref({8, 128}, pl::f32)});
      },
      line, {"axis 2", "rank 2"});
}

TEST(TraceErrors, NonScalarPredicate) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a) {
              pl::Value v = a[pl::all];
              line = __LINE__ + 1;
              pl::when(v > 0.0f, [&] { a[pl::all] = 0.0f; });
            },
            {ref({8}, pl::f32)});
      },
      line, {"when predicate", "bool scalar", "bool[8]"});
}

TEST(TraceErrors, MismatchedLoopCarryTypes) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a) {
              line = __LINE__ + 1;
              pl::Value r = pl::fori_loop(0, 4, 0, [](pl::Value, pl::Value c) { return c.astype(pl::f32); });
              (void)a;
              (void)r;
            },
            {ref({8}, pl::f32)});
      },
      line, {"for", "loop body yields (f32[])", "expected (i32[])"});
}

TEST(TraceErrors, ValueUsedOutsideItsRegion) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a) {
              pl::Value leaked;
              pl::fori_loop(0, 4, [&](pl::Value i) { leaked = i * 2; });
              line = __LINE__ + 1;
              pl::Value bad = leaked + 1;
              (void)bad;
              (void)a;
            },
            {ref({8}, pl::f32)});
      },
      line, {"region", "outside"});
}

TEST(TraceErrors, StoreWithWrongDtypeSuggestsAstype) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a, pl::Ref b) {
              line = __LINE__ + 1;
              b[pl::all] = a[pl::all];
            },
            {ref({8}, pl::f32), ref({8}, pl::bf16)});
      },
      line, {"store", "f32", "bf16", "astype"});
}

TEST(TraceErrors, DotContractingMismatch) {
  int line = 0;
  expect_user_error(
      [&] {
        pl::trace_kernel(
            [&](pl::Ref a, pl::Ref b) {
              line = __LINE__ + 1;
              (void)pl::dot(a[pl::all], b[pl::all]);
            },
            {ref({8, 16}, pl::f32), ref({32, 8}, pl::f32)});
      },
      line, {"dot_general", "contracting"});
}

TEST(TraceErrors, FailedTraceLeavesNoState) {
  EXPECT_THROW(pl::trace_kernel([](pl::Ref a) { (void)(a[pl::all] + pl::zeros({3}, pl::f32)); },
                                {ref({8}, pl::f32)}),
               pl::Error);
  // The next trace on this thread works, and nothing is left open.
  auto k = pl::trace_kernel([](pl::Ref a) { a[pl::all] = a[pl::all] * 2.0f; }, {ref({8}, pl::f32)});
  EXPECT_EQ(k.body.ops.size(), 4u);
  // A failure inside a nested region also unwinds cleanly.
  EXPECT_THROW(pl::trace_kernel(
                   [](pl::Ref a) {
                     pl::fori_loop(0, 2, [&](pl::Value) {
                       pl::fori_loop(0, 2, [&](pl::Value) { (void)(a[pl::all] + pl::zeros({3}, pl::f32)); });
                     });
                   },
                   {ref({8}, pl::f32)}),
               pl::Error);
  auto k2 = pl::trace_kernel([](pl::Ref a) { a[pl::all] = 1.0f; }, {ref({8}, pl::f32)});
  EXPECT_EQ(k2.body.ops.size(), 2u);
}

TEST(TraceErrors, ValuesDoNotOutliveTheirTrace) {
  pl::Value kept;
  pl::trace_kernel([&](pl::Ref a) { kept = a[pl::all]; }, {ref({8}, pl::f32)});
  EXPECT_THROW((void)kept.shape(), pl::Error);
  // ... nor leak into another trace.
  EXPECT_THROW(pl::trace_kernel([&](pl::Ref a) { a[pl::all] = kept; }, {ref({8}, pl::f32)}),
               pl::Error);
}

TEST(TraceErrors, OpsOutsideATraceAreAnError) {
  try {
    (void)pl::program_id(0);
    FAIL();
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel is being traced"), std::string::npos);
  }
}

TEST(TraceErrors, KernelArityMismatch) {
  try {
    pl::trace_kernel([](pl::Ref a, pl::Ref b) { (void)a; (void)b; }, {ref({8}, pl::f32)});
    FAIL();
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be called with 1 Refs"), std::string::npos) << e.what();
  }
}

TEST(VerifierErrors, CorruptedKernelIsRejectedWithOpAndTypes) {
  auto k = pl::trace_kernel([](pl::Ref a) { a[pl::all] = a[pl::all] + 1.0f; }, {ref({8}, pl::f32)});
  // Corrupt the add's recorded result type.
  for (auto& op : k.body.ops)
    if (op.code == pl::ir::OpCode::Add) k.values[op.results[0]] = Type::tensor({8}, pl::i32);
  try {
    pl::ir::verify(k);
    FAIL();
  } catch (const pl::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("i32[8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("trace_errors_test.cpp"), std::string::npos) << msg;
  }
}

TEST(VerifierErrors, UseBeforeDefinition) {
  auto k = pl::trace_kernel([](pl::Ref a) { a[pl::all] = a[pl::all] + 1.0f; }, {ref({8}, pl::f32)});
  std::swap(k.body.ops[0], k.body.ops[2]);  // the add now comes before the load
  EXPECT_THROW(pl::ir::verify(k), pl::Error);
}
