// cudasim: the device side of CUDA for .cu files compiled as host C++ (included by
// cuda_runtime.h when TANDEM_CUDASIM_DEVICE_CODE is defined, which cuda_library does under
// --config=cudasim). Each simulated CUDA thread is a fiber: __syncthreads and the warp
// shuffles and votes suspend it until the block (or the warp's named lanes) have arrived, and
// the threads that a barrier releases resume in a seeded shuffled order.
//
//   __global__ void BlockSum(const float* x, float* out) {
//     __shared__ float partial[256];            // one array per block
//     partial[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
//     __syncthreads();                           // really waits for the block
//     float v = partial[threadIdx.x ^ 1];
//     v += __shfl_down_sync(0xffffffffu, v, 16); // really exchanges between lanes
//   }
//
// `__shared__` is `static thread_local`: the fibers of a block run on one OS thread and a
// thread runs one block at a time, so each block has its own copy, as on a GPU. The rewrite
// step fills it with 0xff bytes (NaN) when a block first reaches its declaration, so reading
// it before any thread wrote it gives garbage, as uninitialised shared memory does.
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_DEVICE_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_DEVICE_H_

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __shared__ static thread_local

namespace cudasim {
namespace internal {

// What the running simulated thread sees; written by the scheduler at every switch.
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  void* dynamic_shared;
};
extern thread_local ThreadContext tls_context __attribute__((tls_model("initial-exec")));

void SyncThreads();
// Counts (op 0), ANDs (1) or ORs (2) `predicate` over the block at a barrier.
int SyncThreadsReduce(int predicate, int op);
// Deposits `value` for this lane and waits until every lane in `mask` has; returns the 32
// values deposited at this exchange (valid until this lane's next exchange). `what` names
// the intrinsic in error messages.
const uint64_t* WarpExchange(unsigned mask, uint64_t value, const char* what);
// Fails the kernel unless `lane` is in `mask` (reading a lane outside it is undefined).
void CheckSourceLane(unsigned mask, int lane, const char* what);
int LaneId();
// The lanes of the running warp that exist and have not returned.
unsigned ActiveMask();
// Fills a static __shared__ variable with 0xff bytes the first time the running block reaches
// its declaration (the rewrite step puts the call after each one).
void PoisonShared(void* address, size_t bytes);
uint64_t GlobalTimerNanoseconds();
void NanoSleep(unsigned nanoseconds);

template <typename T>
uint64_t ToBits(T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "warp shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

template <typename T>
T Shuffle(unsigned mask, T value, int source, const char* what) {
  const uint64_t* slots = WarpExchange(mask, ToBits(value), what);
  CheckSourceLane(mask, source, what);
  return FromBits<T>(slots[source]);
}

template <typename T, typename Op>
T AtomicUpdate(T* address, Op op) {
  if constexpr (std::is_integral_v<T>) {
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(address, &old, op(old), true, __ATOMIC_SEQ_CST,
                                        __ATOMIC_RELAXED)) {
    }
    return old;
  } else {
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    static_assert(sizeof(T) == sizeof(Bits), "atomics on 4- or 8-byte values");
    Bits* bits = reinterpret_cast<Bits*>(address);
    Bits old_bits = __atomic_load_n(bits, __ATOMIC_RELAXED);
    for (;;) {
      T old;
      std::memcpy(&old, &old_bits, sizeof(T));
      const T updated = op(old);
      Bits new_bits;
      std::memcpy(&new_bits, &updated, sizeof(T));
      if (__atomic_compare_exchange_n(bits, &old_bits, new_bits, true, __ATOMIC_SEQ_CST,
                                      __ATOMIC_RELAXED)) {
        return old;
      }
    }
  }
}

}  // namespace internal
}  // namespace cudasim

// ---- Built-in variables -----------------------------------------------------------------

#define threadIdx (static_cast<const uint3&>(::cudasim::internal::tls_context.thread_idx))
#define blockIdx (static_cast<const uint3&>(::cudasim::internal::tls_context.block_idx))
#define blockDim (static_cast<const dim3&>(::cudasim::internal::tls_context.block_dim))
#define gridDim (static_cast<const dim3&>(::cudasim::internal::tls_context.grid_dim))
constexpr int warpSize = 32;

// ---- Synchronisation --------------------------------------------------------------------

inline void __syncthreads() { ::cudasim::internal::SyncThreads(); }
inline int __syncthreads_count(int p) { return ::cudasim::internal::SyncThreadsReduce(p, 0); }
inline int __syncthreads_and(int p) { return ::cudasim::internal::SyncThreadsReduce(p, 1); }
inline int __syncthreads_or(int p) { return ::cudasim::internal::SyncThreadsReduce(p, 2); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::cudasim::internal::WarpExchange(mask, 0, "__syncwarp");
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned ns) { ::cudasim::internal::NanoSleep(ns); }

// ---- Warp shuffles and votes ------------------------------------------------------------

template <typename T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = 32) {
  const int lane = ::cudasim::internal::LaneId();
  const int source = (lane & ~(width - 1)) + (source_lane & (width - 1));
  return ::cudasim::internal::Shuffle(mask, value, source, "__shfl_sync");
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const int lane = ::cudasim::internal::LaneId();
  const int segment = lane & ~(width - 1);
  const int source = lane - static_cast<int>(delta) < segment ? lane : lane - delta;
  return ::cudasim::internal::Shuffle(mask, value, source, "__shfl_up_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const int lane = ::cudasim::internal::LaneId();
  const int segment = lane & ~(width - 1);
  const int source =
      lane + static_cast<int>(delta) >= segment + width ? lane : lane + static_cast<int>(delta);
  return ::cudasim::internal::Shuffle(mask, value, source, "__shfl_down_sync");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  const int lane = ::cudasim::internal::LaneId();
  const int segment = lane & ~(width - 1);
  int source = lane ^ lane_mask;
  if (source < segment || source >= segment + width) source = lane;
  return ::cudasim::internal::Shuffle(mask, value, source, "__shfl_xor_sync");
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t* slots =
      ::cudasim::internal::WarpExchange(mask, predicate != 0 ? 1 : 0, "__ballot_sync");
  unsigned result = 0;
  for (int lane = 0; lane < 32; ++lane) {
    if ((mask >> lane & 1u) && slots[lane] != 0) result |= 1u << lane;
  }
  return result;
}
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == mask;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }

// ---- Atomics (real atomics: blocks of different streams run on different OS threads) ------

template <typename T>
T atomicAdd(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address, [value](T old) { return old + value; });
}
template <typename T>
T atomicSub(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address, [value](T old) { return old - value; });
}
template <typename T>
T atomicMax(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address,
                                           [value](T old) { return old < value ? value : old; });
}
template <typename T>
T atomicMin(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address,
                                           [value](T old) { return value < old ? value : old; });
}
template <typename T>
T atomicExch(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address, [value](T) { return value; });
}
template <typename T>
T atomicAnd(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address, [value](T old) { return old & value; });
}
template <typename T>
T atomicOr(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address, [value](T old) { return old | value; });
}
template <typename T>
T atomicXor(T* address, T value) {
  return ::cudasim::internal::AtomicUpdate(address, [value](T old) { return old ^ value; });
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}

// ---- Loads, math, bits --------------------------------------------------------------------

template <typename T>
T __ldg(const T* p) {
  return *p;
}

// CUDA's min/max overloads; the floating-point ones are fminf/fmaxf (a NaN loses).
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>) {
    return std::fmin(static_cast<C>(a), static_cast<C>(b));
  } else {
    return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
  }
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<C>) {
    return std::fmax(static_cast<C>(a), static_cast<C>(b));
  } else {
    return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
  }
}

// CUDA's isnan/isinf/isfinite are global functions.
using std::isfinite;
using std::isinf;
using std::isnan;

// Correctly rounded single operations (the build passes -ffp-contract=off, so nothing fuses).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __int_as_float(int x) { return ::cudasim::internal::FromBits<float>(x); }
inline int __float_as_int(float x) { return static_cast<int>(::cudasim::internal::ToBits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __activemask() { return ::cudasim::internal::ActiveMask(); }

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_CUDASIM_DEVICE_H_
