#include "parallel/internal/collectives.h"

#include <atomic>

namespace tandem::parallel::internal {
namespace {
std::atomic<Collectives*> registered{nullptr};
}  // namespace

Collectives* GetCollectives() { return registered.load(std::memory_order_acquire); }
void RegisterCollectives(Collectives* engine) {
  registered.store(engine, std::memory_order_release);
}

}  // namespace tandem::parallel::internal
