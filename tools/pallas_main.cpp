// The `pallas` command-line tool: parses the command line and dispatches to tools/*_command.cpp.
// Exit codes: 0 ok; 1 a check failed or the run raised an error; 2 a usage error (unknown
// subcommand, example or option, or a bad option value); 3 the TPU interpret mode detected a
// race (--detect-races); 4 it detected a deadlock.
#include <CLI/CLI.hpp>

#include <iostream>

#include "examples/examples.h"
#include "pallas/pallas.h"
#include "tools/commands.h"

namespace {

namespace cli = ::pallas::cli;

// NAME and the options the example subcommands share; each declares only those it uses.
CLI::App* add_example_command(CLI::App& app, const std::string& name, const std::string& help,
                              cli::ExampleArgs& args) {
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->add_option("name", args.name, "the example (see `pallas list`)")->required();
  cmd->add_option("--size", args.size, "problem size (0: the example's default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", args.dtype, "input dtype")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--cluster", args.cluster,
                  "CTAs per cluster, for the gpu::kernel examples with clusters (ws_matmul; sm_90 and later)")
      ->check(CLI::Range(1, 16));
  cmd->add_option("--cluster-rows", args.cluster_rows,
                  "CTAs per cluster along a second axis (ws_matmul: along the rows, sharing y's blocks)")
      ->check(CLI::Range(1, 16));
  cmd->add_option("--persistent", args.persistent,
                  "CTAs of a persistent grid looping over the work, for the gpu::kernel examples with one (ws_matmul)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--tile-n", args.tile_n,
                  "columns of a CTA's output tile, for the gpu::kernel examples with the choice (ws_matmul: 64, 128, 256)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--stages", args.stages,
                  "K-steps a CTA's pipeline keeps in flight (its ring's SMEM slots), for the gpu::kernel examples with one")
      ->check(CLI::Range(1, 64));
  return cmd;
}

void add_backend_option(CLI::App* cmd, cli::ExampleArgs& args) {
  cmd->add_option("--backend", args.backend, "where the kernel runs")
      ->check(CLI::IsMember({"reference", "tpu-interpret", "gpu", "gpu-emulate"}));
}

void add_approx_math_option(CLI::App* cmd, cli::ExampleArgs& args) {
  cmd->add_flag("--approx-math", args.approx_math,
                "gpu, gpu-emulate: exp, log, tanh, sin, cos, rsqrt on the GPU's approximate instructions");
}

// The simulated TPU's knobs (valid with --backend tpu-interpret only; the examples check that).
void add_tpu_interpret_options(CLI::App* cmd, cli::ExampleArgs& args, bool races) {
  cmd->add_option("--devices", args.devices, "simulated devices (multi-device examples)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--cores", args.cores, "cores per simulated device")->check(CLI::Range(1, 16));
  cmd->add_option("--dma-mode", args.dma_mode, "when simulated DMAs run: at start, or on wait")
      ->check(CLI::IsMember({"eager", "on_wait"}));
  if (races) cmd->add_flag("--detect-races", args.detect_races, "report races (exit 3 if any)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pallas: write accelerator kernels in the Pallas model, run them anywhere"};
  app.require_subcommand(1);

  uint64_t demo_seed = 0;
  CLI::App* demo = app.add_subcommand("demo", "trace a kernel, print its IR, evaluate it and check it");
  demo->add_option("--seed", demo_seed, "random seed for the inputs");
  CLI::App* version = app.add_subcommand("version", "print the version");
  CLI::App* list = app.add_subcommand("list", "list the bundled examples");

  cli::ExampleArgs args;
  CLI::App* run = add_example_command(app, "run", "run an example on random inputs and check it against its reference", args);
  run->add_option("--seed", args.seed,
                  "random seed for the inputs (tpu-interpret: also orders parallel grid steps)");
  add_backend_option(run, args);
  add_tpu_interpret_options(run, args, /*races=*/true);
  CLI::Option* profile = run->add_option(
      "--profile", args.profile_dir,
      "gpu, gpu-emulate: write a Chrome/Perfetto trace of the kernel's named regions into this directory");
  run->add_option("--profile-space", args.profile_space, "region events each Pallas thread may record per CTA")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(profile);
  add_approx_math_option(run, args);
  CLI::App* ir = add_example_command(app, "ir", "print an example's traced kernel IR and grid mapping", args);
  // The TPU-only examples trace only for that backend, and the collectives' IR depends on
  // the number of devices.
  add_backend_option(ir, args);
  ir->add_option("--devices", args.devices, "simulated devices (multi-device examples)")
      ->check(CLI::Range(1, 64));
  CLI::App* bench = add_example_command(app, "bench", "time an example (median of --iters runs after a warm-up)", args);
  bench->add_option("--iters", args.iters, "timed runs")->check(CLI::PositiveNumber);
  bench->add_option("--seed", args.seed, "random seed for the inputs");
  add_backend_option(bench, args);
  // No --detect-races: the detector's bookkeeping would be what gets timed.
  add_tpu_interpret_options(bench, args, /*races=*/false);
  add_approx_math_option(bench, args);

  CLI::App* cuda = add_example_command(app, "cuda", "print the CUDA C++ the GPU backend generates for an example", args);
  cuda->add_option("--arch", args.arch, "the target of --compile (sm_90a, sm_80, compute_90a, ...)");
  cuda->add_flag("--compile", args.compile, "also compile it with NVRTC (reports size and time on stderr)");
  cuda->add_option("--image", args.image_path,
                   "with --compile: write the cubin (or PTX) there, e.g. for `cuobjdump -sass`");
  add_approx_math_option(cuda, args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*version) {
      std::cout << "pallas 0.1.0\n";
      return 0;
    }
    if (*demo) return cli::demo(demo_seed);
    if (*list) return cli::list();
    if (*run) return cli::run(args);
    if (*ir) return cli::ir(args);
    if (*bench) return cli::bench(args);
    if (*cuda) return cli::cuda(args);
  } catch (const pallas::examples::UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const pallas::tpu::DeadlockError& e) {  // `run` reports its own; this is for bench
    std::cerr << "error: " << e.what() << "\n";
    return cli::kExitDeadlock;
  } catch (const std::exception& e) {  // pallas::Error, and InternalError (a bug, still reported)
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
