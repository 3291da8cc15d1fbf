// The list of bundled examples. Each example lives in its own file and exposes one factory; the
// registry wraps every factory with the option checks they all share.
#include "examples/registry.h"

namespace pallas::examples {

namespace {

// The checks every example needs before it builds, and the race sink after.
Example with_common_checks(Example e) {
  auto build = e.build;
  const std::string name = e.name;
  const bool multi_device = e.multi_device, grid_options = e.gpu_grid_options;
  e.build = [build, name, multi_device, grid_options](const RunOptions& given) {
    if ((given.cluster != 0 || given.cluster_rows != 0 || given.persistent != 0 || given.tile_n != 0 ||
         given.stages != 0) && !grid_options)
      throw UsageError(name + " takes no grid or tiling options: --cluster, --cluster-rows, --persistent, --tile-n "
                       "and --stages are for the gpu::kernel examples written for them (see `pallas list`)");
    if (given.backend == "tpu-interpret") {
      if (given.devices != 0 && !multi_device)
        throw UsageError(name + " runs on one device: --devices is for the multi-device examples "
                         "(see `pallas list`)");
      if (!given.dma_mode.empty() && given.dma_mode != "eager" && given.dma_mode != "on_wait")
        throw UsageError("the DMA mode must be eager or on_wait, got '" + given.dma_mode + "'");
    } else if (given.uses_tpu_interpret_options()) {
      // --devices, --cores, --dma-mode and --detect-races configure the simulated TPU; on any
      // other backend they would be silently ignored, which hides the user's mistake.
      throw UsageError("--devices, --cores, --dma-mode and --detect-races need --backend "
                       "tpu-interpret (got backend '" + given.backend + "')");
    }
    RunOptions opts = given;
    if (opts.detect_races && !opts.races)
      opts.races = std::make_shared<std::vector<tpu::RaceReport>>();
    Problem p = build(opts);
    p.races = opts.races;
    return p;
  };
  return e;
}

}  // namespace

const std::vector<Example>& all() {
  static const std::vector<Example> examples = [] {
    std::vector<Example> list = {
        add::example(),          matmul::example(),     softmax::example(),
        layer_norm::example(),   gather::example(),     inplace::example(),
        dma_matmul::example(),   right_permute::example(), all_gather::example(),
        all_reduce::example(),   reduce_scatter::example(), core_map_pipeline::example(),
        racy::example(),         deadlock::example(),      embedding_bag::example(),
        segment_sum::example(),  lane_sort::example(),     ws_matmul::example(),
        grid_sum::example(),     pipeline_matmul::example(), flash_attention::example(),
        attention::example(),
    };
    for (Example& e : list) e = with_common_checks(std::move(e));
    return list;
  }();
  return examples;
}

const Example& find(const std::string& name) {
  std::string known;
  for (const Example& e : all()) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + e.name;
  }
  throw UsageError("unknown example '" + name + "' (known: " + known + ")");
}

}  // namespace pallas::examples
