#include "tools/cudasim/executor.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "cudasim/device.h"
#include "tools/cudasim/fiber.h"

namespace cudasim {
namespace internal {

thread_local ThreadContext tls_context __attribute__((tls_model("initial-exec")));

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStackBytes = 512 << 10;
#else
constexpr size_t kStackBytes = 128 << 10;
#endif
constexpr unsigned kFullMask = 0xffffffffu;

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

enum class State { kNew, kReady, kRunning, kBarrier, kWarp, kDone };

struct SimThread {
  uint3 idx;
  int lane;
  int warp;
  State state;
  Fiber* fiber;
};

struct SimWarp {
  unsigned exists;    // lanes the block has
  unsigned exited;    // lanes that returned
  unsigned arrived;   // lanes waiting at the current exchange
  unsigned expected;  // its mask
  const char* op;
  unsigned generation;
  uint64_t slots[2][32];
};

class Executor;
thread_local Executor* tls_executor = nullptr;

class Executor {
 public:
  Executor() { tls_executor = this; }
  ~Executor() { tls_executor = nullptr; }

  void RunGrid(dim3 grid, dim3 block, size_t dynamic_shared, uint64_t seed,
               const std::function<void()>& body) {
    body_ = &body;
    // Aligned as a GPU's (128 bytes here; WMMA's loads and stores need 32).
    constexpr size_t kSharedAlignment = 128;
    shared_.assign(dynamic_shared + kSharedAlignment, static_cast<unsigned char>(0xcd));
    tls_context.grid_dim = grid;
    tls_context.block_dim = block;
    const uintptr_t base = reinterpret_cast<uintptr_t>(shared_.data());
    tls_context.dynamic_shared =
        dynamic_shared == 0
            ? nullptr
            : reinterpret_cast<void*>((base + kSharedAlignment - 1) & ~(kSharedAlignment - 1));
    const int threads = static_cast<int>(block.x * block.y * block.z);
    const int warps = (threads + 31) / 32;
    threads_.resize(threads);
    warps_.resize(warps);
    for (unsigned bz = 0; bz < grid.z; ++bz) {
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          uint64_t state =
              seed ^ (((uint64_t{bz} * grid.y + by) * grid.x + bx) * 0x632be59bd9b4e019ull);
          rng_ = SplitMix(state);
          tls_context.block_idx = uint3{bx, by, bz};
          RunBlock(block, threads, warps);
        }
      }
    }
  }

  // ---- Called from the fibers ----

  void SyncThreads() {
    SimThread& t = *current_;
    t.state = State::kBarrier;
    ++at_barrier_;
    if (at_barrier_ == live_) ReleaseBarrier();
    Suspend();
  }

  int SyncThreadsReduce(int predicate, int op) {
    const int generation = barrier_generation_;
    if (op == 0) {
      reduce_count_[generation & 1] += predicate != 0;
    } else if (op == 1) {
      reduce_and_[generation & 1] &= predicate != 0;
    } else {
      reduce_or_[generation & 1] |= predicate != 0;
    }
    SyncThreads();
    const int slot = generation & 1;
    return op == 0 ? reduce_count_[slot] : (op == 1 ? reduce_and_[slot] : reduce_or_[slot]);
  }

  const uint64_t* WarpExchange(unsigned mask, uint64_t value, const char* what) {
    SimThread& t = *current_;
    SimWarp& w = warps_[t.warp];
    const unsigned bit = 1u << t.lane;
    if ((mask & bit) == 0) {
      Throw(std::string(what) + ": lane " + std::to_string(t.lane) + " of warp " +
            std::to_string(t.warp) + " called it with mask " + Hex(mask) +
            ", which does not name the lane itself (undefined on a GPU)");
    }
    if ((mask & ~w.exists) != 0) {
      Throw(std::string(what) + ": mask " + Hex(mask) + " names lanes that warp " +
            std::to_string(t.warp) + " does not have (lanes " + Hex(w.exists) + " of a block of " +
            std::to_string(threads_.size()) +
            " threads): a shuffle over a partial warp must name only its lanes");
    }
    if ((mask & w.exited) != 0) {
      Throw(std::string(what) + ": mask " + Hex(mask) + " names lanes " + Hex(mask & w.exited) +
            " of warp " + std::to_string(t.warp) +
            " that have already returned from the kernel (undefined on a GPU)");
    }
    if (w.arrived == 0) {
      w.expected = mask;
      w.op = what;
    } else if (w.expected != mask || std::strcmp(w.op, what) != 0) {
      Throw(std::string("warp ") + std::to_string(t.warp) + ": lane " + std::to_string(t.lane) +
            " reached " + what + " with mask " + Hex(mask) + " while lanes " + Hex(w.arrived) +
            " wait in " + w.op + " with mask " + Hex(w.expected) +
            ": every lane of a mask must reach the same intrinsic with the same mask");
    }
    const unsigned generation = w.generation;
    w.slots[generation & 1][t.lane] = value;
    w.arrived |= bit;
    t.state = State::kWarp;
    if (w.arrived == w.expected) {
      w.arrived = 0;
      ++w.generation;
      std::vector<int> released;
      for (int lane = 0; lane < 32; ++lane) {
        if (mask >> lane & 1u) released.push_back(t.warp * 32 + lane);
      }
      MakeReady(released);
    }
    Suspend();
    return w.slots[generation & 1];
  }

  void CheckSourceLane(unsigned mask, int lane, const char* what) {
    if (lane < 0 || lane >= 32 || (mask >> lane & 1u) == 0) {
      Throw(std::string(what) + ": lane " + std::to_string(current_->lane) + " reads lane " +
            std::to_string(lane) + ", which mask " + Hex(mask) +
            " does not name (undefined on a GPU)");
    }
  }

  int LaneId() const { return current_->lane; }
  unsigned ActiveMask() const {
    const SimWarp& w = warps_[current_->warp];
    return w.exists & ~w.exited;
  }

  void PoisonShared(void* address, size_t bytes) {
    for (const void* done : poisoned_) {
      if (done == address) return;
    }
    std::memset(address, 0xff, bytes);
    poisoned_.push_back(address);
  }

 private:
  static std::string Hex(unsigned value) {
    char text[16];
    std::snprintf(text, sizeof(text), "0x%08x", value);
    return text;
  }

  std::string Where() const {
    const uint3 b = tls_context.block_idx;
    std::string where = "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                        std::to_string(b.z) + ")";
    if (current_ != nullptr) {
      where += " thread (" + std::to_string(current_->idx.x) + "," +
               std::to_string(current_->idx.y) + "," + std::to_string(current_->idx.z) + ")";
    }
    return where;
  }

  [[noreturn]] void Throw(const std::string& message) {
    throw KernelError(Where() + ": " + message);
  }

  void MakeReady(std::vector<int>& released) {
    for (size_t i = released.size(); i > 1; --i) {
      std::swap(released[i - 1], released[SplitMix(rng_) % i]);
    }
    for (int t : released) {
      threads_[t].state = State::kReady;
      ready_.push_back(t);
    }
  }

  void ReleaseBarrier() {
    std::vector<int> released;
    for (int t = 0; t < static_cast<int>(threads_.size()); ++t) {
      if (threads_[t].state == State::kBarrier) released.push_back(t);
    }
    at_barrier_ = 0;
    ++barrier_generation_;
    const int next = barrier_generation_ & 1;
    reduce_count_[next] = 0;
    reduce_and_[next] = 1;
    reduce_or_[next] = 0;
    MakeReady(released);
  }

  void Suspend() {
    Fiber* fiber = current_->fiber;
    fiber->SwitchBack(scheduler_sp_, scheduler_stack_bottom_, scheduler_stack_size_);
  }

  static void FiberMain(void* argument) {
    Executor* self = static_cast<Executor*>(argument);
    Fiber::Started(&self->scheduler_stack_bottom_, &self->scheduler_stack_size_);
    for (;;) {
      SimThread* t = self->current_;
      try {
        (*self->body_)();
      } catch (const KernelError& error) {
        if (self->error_.empty()) self->error_ = error.what();
      } catch (const std::exception& error) {
        if (self->error_.empty()) {
          self->error_ = self->Where() + ": an exception left the kernel: " + error.what();
        }
      } catch (...) {
        if (self->error_.empty()) self->error_ = self->Where() + ": an exception left the kernel";
      }
      t->state = State::kDone;
      self->OnExit(*t);
      t->fiber->SwitchBack(self->scheduler_sp_, self->scheduler_stack_bottom_,
                           self->scheduler_stack_size_);
    }
  }

  void OnExit(SimThread& t) {
    --live_;
    SimWarp& w = warps_[t.warp];
    w.exited |= 1u << t.lane;
    if (error_.empty() && (w.arrived != 0) && (w.expected >> t.lane & 1u)) {
      error_ = Where() + ": returned from the kernel while lanes " + Hex(w.arrived) +
               " of its warp " + "wait for it in " + w.op +
               " (undefined on a GPU: every lane of the mask must "
               "reach the intrinsic)";
    }
    if (at_barrier_ > 0 && at_barrier_ == live_) ReleaseBarrier();
  }

  Fiber* AcquireFiber() {
    if (!free_fibers_.empty()) {
      Fiber* fiber = free_fibers_.back();
      free_fibers_.pop_back();
      return fiber;
    }
    fibers_.push_back(std::make_unique<Fiber>(kStackBytes, &FiberMain, this));
    return fibers_.back().get();
  }

  void RunBlock(dim3 block, int threads, int warps) {
    for (int w = 0; w < warps; ++w) {
      SimWarp& warp = warps_[w];
      const int lanes = std::min(32, threads - 32 * w);
      warp.exists = lanes == 32 ? kFullMask : (1u << lanes) - 1;
      warp.exited = 0;
      warp.arrived = 0;
      warp.expected = 0;
      warp.op = "";
      warp.generation = 0;
    }
    std::vector<int> order(threads);
    for (int t = 0; t < threads; ++t) {
      SimThread& thread = threads_[t];
      thread.idx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      thread.lane = t % 32;
      thread.warp = t / 32;
      thread.state = State::kNew;
      thread.fiber = nullptr;
      order[t] = t;
    }
    live_ = threads;
    at_barrier_ = 0;
    barrier_generation_ = 0;
    reduce_count_[0] = 0;
    reduce_and_[0] = 1;
    reduce_or_[0] = 0;
    error_.clear();
    ready_.clear();
    poisoned_.clear();
    MakeReady(order);
    while (!ready_.empty() && error_.empty()) {
      const int index = ready_.front();
      ready_.pop_front();
      SimThread& t = threads_[index];
      if (t.fiber == nullptr) t.fiber = AcquireFiber();
      t.state = State::kRunning;
      current_ = &t;
      tls_context.thread_idx = t.idx;
      t.fiber->SwitchTo(&scheduler_sp_, nullptr, 0);
      if (t.state == State::kDone) {
        free_fibers_.push_back(t.fiber);
        t.fiber = nullptr;
      }
    }
    current_ = nullptr;
    std::string message = error_;
    if (message.empty() && live_ > 0) {
      message = Where() + ": deadlock: " + std::to_string(live_) + " of " +
                std::to_string(threads) + " threads never finish:";
      int shown = 0;
      for (const SimThread& t : threads_) {
        if (t.state != State::kBarrier && t.state != State::kWarp) continue;
        if (shown++ == 8) {
          message += " ...";
          break;
        }
        message += " (" + std::to_string(t.idx.x) + "," + std::to_string(t.idx.y) + "," +
                   std::to_string(t.idx.z) + ") waits in " +
                   (t.state == State::kBarrier ? std::string("__syncthreads")
                                               : std::string(warps_[t.warp].op));
        message += ";";
      }
      message += " (a __syncthreads or warp intrinsic that not every thread reaches)";
    }
    if (!message.empty()) {
      // Threads left suspended: their fibers start afresh when used again.
      for (SimThread& t : threads_) {
        if (t.fiber != nullptr) {
          t.fiber->Reset();
          free_fibers_.push_back(t.fiber);
          t.fiber = nullptr;
        }
      }
      throw KernelError(message);
    }
  }

  const std::function<void()>* body_ = nullptr;
  std::vector<unsigned char> shared_;
  std::vector<SimThread> threads_;
  std::vector<SimWarp> warps_;
  std::deque<int> ready_;
  std::vector<const void*> poisoned_;  // static shared variables this block has poisoned
  SimThread* current_ = nullptr;
  int live_ = 0;
  int at_barrier_ = 0;
  int barrier_generation_ = 0;
  int reduce_count_[2] = {0, 0};
  int reduce_and_[2] = {1, 1};
  int reduce_or_[2] = {0, 0};
  uint64_t rng_ = 0;
  std::string error_;
  void* scheduler_sp_ = nullptr;
  const void* scheduler_stack_bottom_ = nullptr;
  size_t scheduler_stack_size_ = 0;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::vector<Fiber*> free_fibers_;
};

Executor& ThisThreadExecutor() {
  thread_local Executor executor;
  return executor;
}

Executor& Running(const char* what) {
  if (tls_executor == nullptr) {
    std::fprintf(stderr, "cudasim: %s called outside a kernel\n", what);
    std::abort();
  }
  return *tls_executor;
}

}  // namespace

void RunGrid(dim3 grid, dim3 block, size_t dynamic_shared, uint64_t seed,
             const std::function<void()>& thread_body) {
  ThisThreadExecutor().RunGrid(grid, block, dynamic_shared, seed, thread_body);
}

void SyncThreads() { Running("__syncthreads").SyncThreads(); }
int SyncThreadsReduce(int predicate, int op) {
  return Running("__syncthreads_count/and/or").SyncThreadsReduce(predicate, op);
}
const uint64_t* WarpExchange(unsigned mask, uint64_t value, const char* what) {
  return Running(what).WarpExchange(mask, value, what);
}
void CheckSourceLane(unsigned mask, int lane, const char* what) {
  Running(what).CheckSourceLane(mask, lane, what);
}
int LaneId() { return Running("a warp intrinsic").LaneId(); }
unsigned ActiveMask() { return Running("__activemask").ActiveMask(); }
void PoisonShared(void* address, size_t bytes) {
  Running("__shared__").PoisonShared(address, bytes);
}

uint64_t GlobalTimerNanoseconds() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void NanoSleep(unsigned nanoseconds) {
  timespec duration{0, static_cast<long>(nanoseconds)};
  nanosleep(&duration, nullptr);
}

}  // namespace internal
}  // namespace cudasim
