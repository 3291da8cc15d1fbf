// One factory per bundled example (each defined in examples/<name>.cpp, the collectives in
// examples/collectives.cpp), for registry.cpp.
#pragma once

#include "examples/examples.h"

namespace pallas::examples {
namespace add { Example example(); }
namespace matmul { Example example(); }
namespace softmax { Example example(); }
namespace layer_norm { Example example(); }
namespace gather { Example example(); }
namespace inplace { Example example(); }
// TPU interpret mode only.
namespace dma_matmul { Example example(); }
namespace right_permute { Example example(); }
namespace all_gather { Example example(); }
namespace all_reduce { Example example(); }
namespace reduce_scatter { Example example(); }
namespace core_map_pipeline { Example example(); }
namespace racy { Example example(); }
namespace deadlock { Example example(); }
// SparseCore (TPU interpret mode only).
namespace embedding_bag { Example example(); }
namespace segment_sum { Example example(); }
namespace lane_sort { Example example(); }
namespace ws_matmul { Example example(); }
namespace grid_sum { Example example(); }
namespace pipeline_matmul { Example example(); }
namespace flash_attention { Example example(); }
namespace attention { Example example(); }
}  // namespace pallas::examples
