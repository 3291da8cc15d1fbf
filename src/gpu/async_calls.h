// Calls queued without waiting (gpu::call_on_device_async): what their kernels recorded is raised
// at the stream's next synchronizing point, not at the call. Per stream (a CUstream, or the
// emulated device's stream of the same value), the first such error not yet raised; the GPU's
// launches not yet retired are in driver.cpp (they hold its launch buffers).
#pragma once

#include <exception>

namespace pallas::gpu::async_calls {

// Keeps `error` as the stream's pending error unless it already has one (the first one wins:
// the later calls ran on what the failed one left).
void note_error(void* stream, std::exception_ptr error);
// The stream's pending error (null when none), which is then no longer pending.
std::exception_ptr take_error(void* stream);
// Raises the stream's pending error, if any.
void raise_pending(void* stream);

}  // namespace pallas::gpu::async_calls
