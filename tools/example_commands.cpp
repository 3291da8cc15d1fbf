// `pallas list`, `pallas run`, `pallas ir`: the bundled examples from the command line.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "core/call.h"
#include "examples/examples.h"
#include "gpu/codegen.h"
#include "gpu/cuda_libs.h"
#include "tools/commands.h"
#include "tools/report.h"

namespace pallas::cli {

namespace ex = ::pallas::examples;

namespace {

// The printers differ on whether their text ends with a newline; print exactly one.
std::string with_newline(std::string text) {
  if (text.empty() || text.back() != '\n') text += '\n';
  return text;
}

// The profile traces in `dir` ("": none).
std::set<std::string> profile_traces(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().string().ends_with("-trace.json")) out.insert(e.path().string());
  return out;
}

}  // namespace

int list() {
  size_t width = 0;
  for (const ex::Example& e : ex::all()) width = std::max(width, e.name.size());
  for (const ex::Example& e : ex::all())
    std::cout << e.name << std::string(width + 2 - e.name.size(), ' ') << e.description << "\n";
  return 0;
}

int run(const ExampleArgs& args) {
  const ex::Problem p = ex::find(args.name).build(options_to_run(args));
  const std::set<std::string> traces_before = profile_traces(args.profile_dir);
  ex::Outcome o;
  try {
    o = ex::run(p);
  } catch (const tpu::DeadlockError& e) {
    std::cout << headline(p) << ": DEADLOCK\n" << with_newline(e.what());
    return kExitDeadlock;
  }
  for (const std::string& t : profile_traces(args.profile_dir))
    if (!traces_before.count(t)) std::cout << "profile trace: " << t << "\n";
  // Races first: with a race, the values (right or wrong) prove nothing.
  if (!o.races.empty()) {
    std::cout << headline(p) << ": " << o.races.size() << " race(s) detected\n";
    for (const tpu::RaceReport& r : o.races) std::cout << with_newline(r.to_string());
    return kExitRaces;
  }
  if (!o.checked) {
    std::cout << headline(p) << ": ran, result not checked (" << o.message << ")\n";
    return 0;
  }
  std::cout << headline(p) << ": max abs err " << short_number(o.max_abs_error)
            << ", max rel err " << short_number(o.max_rel_error) << "  "
            << (o.ok ? "ok" : "FAILED") << "\n";
  if (!o.ok) std::cout << o.message << "\n";
  return o.ok ? 0 : 1;
}

int ir(const ExampleArgs& args) {
  const ex::Problem p = ex::find(args.name).build(run_options(args));
  // Tracing needs only the argument shapes: nothing runs, so any backend's IR can be shown.
  const std::shared_ptr<const TracedCall> traced = p.call.trace(p.arg_shapes());
  std::cout << with_newline(ir::print(traced->kernel))
            << with_newline(traced->grid_mapping.to_string());
  return 0;
}

int cuda(const ExampleArgs& args) {
  ExampleArgs a = args;
  a.backend = "gpu";
  const ex::Problem p = ex::find(a.name).build(run_options(a));
  const std::shared_ptr<const TracedCall> traced = p.call.trace(p.arg_shapes());
  const gpu::GeneratedKernel k =
      gpu::generate_cuda(*traced, traced->grid_mapping.grid, gpu::codegen_options(p.call.impl()->compiler_params));
  std::cout << k.source;
  if (args.compile) {
    auto t0 = std::chrono::steady_clock::now();
    gpu::CompiledKernel c = gpu::Nvrtc::get().compile(k.source, a.name + ".cu", args.arch);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "compiled with NVRTC for " << args.arch << ": " << c.image.size() << " bytes of "
              << (c.is_cubin ? "cubin" : "PTX") << " in " << ms << " ms\n";
    if (!args.image_path.empty()) {
      std::ofstream f(args.image_path, std::ios::binary);
      f.write(c.image.data(), static_cast<std::streamsize>(c.image.size()));
      if (!f) throw Error("cannot write the compiled image to '" + args.image_path + "'");
    }
  }
  return 0;
}

}  // namespace pallas::cli
