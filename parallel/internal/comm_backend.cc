#include "parallel/internal/comm_backend.h"

#include <atomic>

namespace tandem::parallel::internal {
namespace {
std::atomic<CommBackend*> registered{nullptr};
}  // namespace

CommBackend* GetCommBackend() { return registered.load(std::memory_order_acquire); }
void RegisterCommBackend(CommBackend* backend) {
  registered.store(backend, std::memory_order_release);
}

}  // namespace tandem::parallel::internal
