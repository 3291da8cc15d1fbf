// Kernel helpers: named grid axes, cdiv, pl.loop, host constants — and the thread-local trace
// environment they consult.
#include "core/trace_env.h"
#include "pallas/pallas_call.h"
#include "trace/context.h"

namespace pallas {

namespace core {
namespace {
thread_local const TraceEnv* g_env = nullptr;
}
const TraceEnv* current_trace_env() { return g_env; }
const TraceEnv* gpu_kernel_body_env() {
  return g_env && g_env->kind == TraceEnv::Kind::Kernel && g_env->gpu_kernel ? g_env : nullptr;
}
ScopedTraceEnv::ScopedTraceEnv(const TraceEnv* env) : saved_(g_env) { g_env = env; }
ScopedTraceEnv::~ScopedTraceEnv() { g_env = saved_; }
}  // namespace core

Value cdiv(const Operand& a, const Operand& b) { return (a + b - 1) / b; }

namespace {
int named_axis(const std::string& name, const char* what, Loc loc) {
  const core::TraceEnv* env = core::current_trace_env();
  if (!env || env->grid_names.empty())
    throw Error(std::string(what) + "(\"" + name +
                    "\"): the grid has no axis names (give the grid as {{\"name\", size}, ...})",
                SourceLoc::from(loc));
  for (size_t i = 0; i < env->grid_names.size(); ++i)
    if (env->grid_names[i] == name) return static_cast<int>(i);
  std::string known;
  for (const auto& n : env->grid_names) known += (known.empty() ? "" : ", ") + n;
  throw Error(std::string(what) + "(\"" + name + "\"): no grid axis of that name (axes: " + known + ")",
              SourceLoc::from(loc));
}
}  // namespace

Value program_id(const std::string& axis_name, Loc loc) {
  return program_id(named_axis(axis_name, "program_id", loc), loc);
}
Value num_programs(const std::string& axis_name, Loc loc) {
  return num_programs(named_axis(axis_name, "num_programs", loc), loc);
}

void loop(const Operand& lo, const Operand& hi, const std::function<void(Value)>& body, int64_t step,
          Loc loc) {
  if (step < 1) throw Error("loop: step must be >= 1, got " + std::to_string(step), SourceLoc::from(loc));
  if (step == 1) {
    fori_loop(lo, hi, [&](Value i) { body(i); }, loc);
    return;
  }
  Value l = detail::as_index_scalar(lo, "loop lower bound");
  Value h = detail::as_index_scalar(hi, "loop upper bound");
  Value trips = maximum(Operand(cdiv(Operand(h - l, loc), Operand(step, loc)), loc), Operand(0, loc));
  fori_loop(Operand(0, loc), Operand(trips, loc), [&](Value t) { body(Operand(l, loc) + Operand(t, loc) * step); },
            loc);
}

Value constant(const Array& a, Loc loc) {
  if (a.rank() == 0) return full({}, a.scalar_at_flat(0), loc);
  const core::TraceEnv* env = core::current_trace_env();
  std::string type = a.shape_dtype().to_string();
  if (env && env->kind == core::TraceEnv::Kind::IndexMap)
    throw Error("Index map function " + env->func_src_info + " for " + env->origin +
                    " must not capture constants: [" + type + "]",
                SourceLoc::from(loc));
  std::string where = env ? " " + env->func_src_info : "";
  throw Error("The kernel function in the pallas_call" + where + " captures constants [" + type +
                  "]. You should pass them as inputs.",
              SourceLoc::from(loc));
}

}  // namespace pallas
