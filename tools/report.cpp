#include "tools/report.h"

#include <cstdio>

#include "gpu/driver.h"

namespace pallas::cli {

examples::RunOptions run_options(const ExampleArgs& args) {
  return {.seed = args.seed,
          .size = args.size,
          .dtype = parse_dtype(args.dtype),
          .backend = args.backend,
          .devices = args.devices,
          .cores = args.cores,
          .dma_mode = args.dma_mode,
          .detect_races = args.detect_races,
          .profile_dir = args.profile_dir,
          .profile_space = args.profile_space,
          .approx_math = args.approx_math,
          .cluster = args.cluster,
          .cluster_rows = args.cluster_rows,
          .persistent = args.persistent,
          .tile_n = args.tile_n,
          .stages = args.stages};
}

examples::RunOptions options_to_run(const ExampleArgs& args) {
  if (args.backend == "gpu") gpu::Device::get();  // (throws what is missing)
  return run_options(args);
}

std::string headline(const examples::Problem& p) {
  return p.name + " " + p.signature + " backend=" + p.backend;
}

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2g", v);
  return buf;
}

}  // namespace pallas::cli
