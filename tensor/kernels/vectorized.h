// tandem::vec: streaming CPU loops compiled for AVX2 where the CPU has it, for the x86-64
// baseline (SSE2) elsewhere: for the loops that sweep whole gradients every step (the CPU
// backend's elementwise kernels, reduce-adds, all-reduces, fused optimizer updates). The build
// targets the baseline and GCC's -O2 vectorises almost nothing, so such a loop ran scalar at about
// 1 ns an element; vectorised it is memory-bound.
//
//   vec::AddInto(out, in, n);  // out[i] += in[i]
//
//   // Any loop: write it as a TANDEM_VECTORIZE function (restrict pointers help), then
//   vec::Vectorized([&] { MyLoop(out, in, begin, end); });
//
// Vectorized compiles the callable twice, with everything it calls inlined, and picks one at
// run time by the CPU (no ifunc, which ThreadSanitizer's start-up does not survive). Neither
// version contracts a * b + c into a fused multiply-add (AVX2 without FMA), so each element's
// arithmetic, and so the result, is the same bit for bit on every CPU and wherever a vector
// loop's scalar tail begins. Square roots vectorise only where the target is built with
// -fno-math-errno (GCC keeps errno otherwise).
#ifndef TANDEM_TENSOR_KERNELS_VECTORIZED_H_
#define TANDEM_TENSOR_KERNELS_VECTORIZED_H_

#include <atomic>
#include <cstdint>

// GCC vectorises at -O2 only loops its "very cheap" cost model accepts (no alias checks, no
// unknown trip counts); this lets it vectorise a function's loops. Clang does so at -O2 itself.
#if defined(__GNUC__) && !defined(__clang__)
#define TANDEM_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define TANDEM_VECTORIZE
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define TANDEM_INTERNAL_TARGET_AVX2 __attribute__((target("avx2"), flatten))
#else
#define TANDEM_INTERNAL_TARGET_AVX2 __attribute__((flatten))
#endif

namespace tandem::vec {

// Set while a BaselineVectorsForTesting lives.
inline std::atomic<bool> g_force_baseline_vectors{false};

// For tests: while it lives, Vectorized runs the baseline build (`baseline` true) even on a
// CPU that has AVX2, so that a test can compare the bits of both; the previous choice comes
// back when it goes, also when an assertion leaves the test early.
class BaselineVectorsForTesting {
 public:
  explicit BaselineVectorsForTesting(bool baseline = true)
      : previous_(g_force_baseline_vectors.exchange(baseline)) {}
  ~BaselineVectorsForTesting() { g_force_baseline_vectors = previous_; }
  BaselineVectorsForTesting(const BaselineVectorsForTesting&) = delete;
  BaselineVectorsForTesting& operator=(const BaselineVectorsForTesting&) = delete;

 private:
  bool previous_;
};

inline bool CpuHasAvx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !g_force_baseline_vectors.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

template <typename F>
TANDEM_VECTORIZE TANDEM_INTERNAL_TARGET_AVX2 void CallForAvx2(const F& loop) {
  loop();
}

template <typename F>
TANDEM_VECTORIZE __attribute__((flatten)) void CallForBaseline(const F& loop) {
  loop();
}

// Runs `loop()` (and what it calls, inlined) compiled for the best vector unit this CPU has.
template <typename F>
void Vectorized(const F& loop) {
  if (CpuHasAvx2()) {
    CallForAvx2(loop);
  } else {
    CallForBaseline(loop);
  }
}

template <typename T>
TANDEM_VECTORIZE inline void AddIntoLoop(T* __restrict out, const T* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

// out[i] += in[i] for i < n; `out` and `in` must not overlap.
template <typename T>
void AddInto(T* out, const T* in, int64_t n) {
  Vectorized([&] { AddIntoLoop(out, in, n); });
}

}  // namespace tandem::vec

#endif  // TANDEM_TENSOR_KERNELS_VECTORIZED_H_
