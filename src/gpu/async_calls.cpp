#include "gpu/async_calls.h"

#include <map>
#include <mutex>

namespace pallas::gpu::async_calls {
namespace {
std::mutex mu;
std::map<void*, std::exception_ptr>& pending() {
  static std::map<void*, std::exception_ptr> errors;
  return errors;
}
}  // namespace

void note_error(void* stream, std::exception_ptr error) {
  if (!error) return;
  std::lock_guard<std::mutex> lock(mu);
  pending().try_emplace(stream, std::move(error));
}

std::exception_ptr take_error(void* stream) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = pending().find(stream);
  if (it == pending().end()) return nullptr;
  std::exception_ptr e = std::move(it->second);
  pending().erase(it);
  return e;
}

void raise_pending(void* stream) {
  if (std::exception_ptr e = take_error(stream)) std::rethrow_exception(e);
}

}  // namespace pallas::gpu::async_calls
