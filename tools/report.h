// Formatting shared by the example subcommands.
#pragma once

#include <string>

#include "examples/examples.h"
#include "tools/commands.h"

namespace pallas::cli {

// The example options from the command-line ones (parses the dtype name).
examples::RunOptions run_options(const ExampleArgs& args);
// The options of a command that runs the example (`run`, `bench`): as run_options, and with
// --backend gpu the GPU is looked for first, so that a machine without one is told so at once
// rather than after the inputs are drawn (two 8192 x 8192 arrays take 15 s of one core).
examples::RunOptions options_to_run(const ExampleArgs& args);
// "matmul f32[512,512]x[512,512] backend=reference": the start of each result line.
std::string headline(const examples::Problem& p);
// Two significant digits ("1.2e-05", "0.031", "0"): errors and timings at a glance.
std::string short_number(double v);

}  // namespace pallas::cli
