// The CPU backend's reductions and softmax (tensor/cpu/internal/reduce_kernels.h). Rows are
// split over (row, block) pairs and columns over tiles of the inner axis, so that one long row
// or one wide product still uses every thread; each output is computed in one place, in a
// fixed order, whatever the split.
#include "tensor/cpu/internal/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/cpu/internal/elementwise_kernels.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/softmax_kernels.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/kernel_stub.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace cpu_internal {
namespace {

// Sums accumulate in double, in blocks of this many elements, then add the blocks' sums in
// order: the result does not depend on the split and long float32 rows lose no precision.
constexpr int64_t kSumBlock = 1 << 15;

// ---- Reductions -------------------------------------------------------------------------

// Wider accumulators for sums: double for every floating type (see kSumBlock; the 16-bit
// floats round once, from the double sum, as float32 does), int64 for the integers and bool
// (converted back to their own dtype: the ops layer widens first where PyTorch does).
template <typename T>
using SumAccumulator = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

// Sum of n contiguous elements, with eight independent accumulators so that the loop
// vectorises without reassociating a single chain (which the compiler may not do).
template <typename T>
SumAccumulator<T> SumContiguous(const T* x, int64_t n) {
  using Acc = SumAccumulator<T>;
  Acc partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += static_cast<Acc>(x[i + j]);
  }
  Acc tail = 0;
  for (; i < n; ++i) tail += static_cast<Acc>(x[i]);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

// SumContiguous for the 16-bit floats: the same sum, in the same order, of the values
// converted to float a chunk at a time (vectorised), so it equals the float32 kernel's sum of
// the same values.
template <typename T>
double SumContiguousReduced(const T* x, int64_t n) {
  static_assert(kFloatChunk % 8 == 0, "chunks must keep the eight accumulators' lanes");
  double partial[8] = {};
  double tail = 0;
  float buffer[kFloatChunk];
  for (int64_t c = 0; c < n; c += kFloatChunk) {
    const int64_t m = std::min(kFloatChunk, n - c);
    vec::Vectorized([&] { vec::ToFloatLoop(x + c, buffer, m); });
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
      for (int j = 0; j < 8; ++j) partial[j] += static_cast<double>(buffer[i + j]);
    }
    for (; i < m; ++i) tail += static_cast<double>(buffer[i]);
  }
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

template <typename T>
SumAccumulator<T> SumRow(const T* x, int64_t n) {
  if constexpr (kIsReducedFloat<T>) {
    return SumContiguousReduced(x, n);
  } else {
    return SumContiguous(x, n);
  }
}

// acc[j] += row[j] for j < width, widened to the accumulator.
template <typename Acc, typename T>
TANDEM_VECTORIZE inline void AccumulateColumns(Acc* __restrict acc, const T* __restrict row,
                                               int64_t width) {
  for (int64_t j = 0; j < width; ++j) acc[j] += Widen<Acc>(row[j]);
}

template <typename T>
void ReduceSum(int index, T* dst, const T* src, int64_t outer, int64_t reduce, int64_t inner) {
  using Acc = SumAccumulator<T>;
  if (inner == 1) {
    // Rows: split over (row, block) pairs so that one long row still uses every thread.
    const int64_t blocks = std::max<int64_t>(1, (reduce + kSumBlock - 1) / kSumBlock);
    if (blocks == 1) {
      ParallelFor(Cpu(index), outer, std::max<int64_t>(1, kElementwiseGrain / (reduce + 1)),
                  [&](int64_t begin, int64_t end) {
                    for (int64_t o = begin; o < end; ++o) {
                      dst[o] = static_cast<T>(SumRow(src + o * reduce, reduce));
                    }
                  });
      return;
    }
    std::vector<Acc> partial(outer * blocks);
    ParallelFor(Cpu(index), outer * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t o = item / blocks, block = item % blocks;
        const int64_t start = block * kSumBlock;
        const int64_t length = std::min(kSumBlock, reduce - start);
        partial[item] = SumRow(src + o * reduce + start, length);
      }
    });
    for (int64_t o = 0; o < outer; ++o) {
      Acc total = 0;
      for (int64_t block = 0; block < blocks; ++block) total += partial[o * blocks + block];
      dst[o] = static_cast<T>(total);
    }
    return;
  }
  // Columns: accumulate a tile of the inner axis across the reduced axis (contiguous, so
  // the loop over the tile vectorises). Each column sums its rows in order whatever the tile,
  // so tiles narrow until there are enough to share out (a bias gradient, [batch, features]
  // summed over the batch, is a single product of `outer`).
  constexpr int64_t kMaxTile = 256, kMinTile = 32, kTilesWanted = 8;
  const int64_t tiles_per_product =
      std::max<int64_t>(1, kTilesWanted / std::max<int64_t>(1, outer));
  const int64_t tile =
      std::clamp<int64_t>((inner / tiles_per_product + 15) / 16 * 16, kMinTile, kMaxTile);
  const int64_t tiles = (inner + tile - 1) / tile;
  const int64_t work_per_tile = reduce * std::min(inner, tile);
  ParallelFor(Cpu(index), outer * tiles,
              std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, work_per_tile)),
              [&](int64_t begin, int64_t end) {
                Acc acc[kMaxTile];
                for (int64_t item = begin; item < end; ++item) {
                  const int64_t o = item / tiles, j0 = (item % tiles) * tile;
                  const int64_t width = std::min(tile, inner - j0);
                  std::fill(acc, acc + width, Acc{0});
                  const T* base = src + o * reduce * inner + j0;
                  vec::Vectorized([&] {
                    for (int64_t r = 0; r < reduce; ++r) {
                      AccumulateColumns(acc, base + r * inner, width);
                    }
                  });
                  T* out = dst + o * inner + j0;
                  for (int64_t j = 0; j < width; ++j) out[j] = static_cast<T>(acc[j]);
                }
              });
}

// Max/min (kArg false: values of type T) or argmax/argmin (kArg true: int64 indices).
template <bool kMax, bool kArg, typename T>
void ReduceExtremum(int index, void* dst, const T* src, int64_t outer, int64_t reduce,
                    int64_t inner) {
  auto write = [&](int64_t at, T value, int64_t position) {
    if constexpr (kArg) {
      static_cast<int64_t*>(dst)[at] = position;
    } else {
      static_cast<T*>(dst)[at] = value;
    }
  };
  if (inner == 1) {
    ParallelFor(Cpu(index), outer, std::max<int64_t>(1, kElementwiseGrain / reduce),
                [&](int64_t begin, int64_t end) {
                  for (int64_t o = begin; o < end; ++o) {
                    const T* row = src + o * reduce;
                    T best = row[0];
                    int64_t position = 0;
                    for (int64_t r = 1; r < reduce; ++r) {
                      if (Replaces<kMax>(row[r], best)) {
                        best = row[r];
                        position = r;
                      }
                    }
                    write(o, best, position);
                  }
                });
    return;
  }
  constexpr int64_t kTile = 256;
  const int64_t tiles = (inner + kTile - 1) / kTile;
  const int64_t work_per_tile = reduce * std::min(inner, kTile);
  ParallelFor(Cpu(index), outer * tiles, std::max<int64_t>(1, kElementwiseGrain / work_per_tile),
              [&](int64_t begin, int64_t end) {
                T best[kTile];
                int64_t position[kTile];
                for (int64_t item = begin; item < end; ++item) {
                  const int64_t o = item / tiles, j0 = (item % tiles) * kTile;
                  const int64_t width = std::min(kTile, inner - j0);
                  const T* base = src + o * reduce * inner + j0;
                  for (int64_t j = 0; j < width; ++j) {
                    best[j] = base[j];
                    position[j] = 0;
                  }
                  for (int64_t r = 1; r < reduce; ++r) {
                    const T* row = base + r * inner;
                    for (int64_t j = 0; j < width; ++j) {
                      if (Replaces<kMax>(row[j], best[j])) {
                        best[j] = row[j];
                        position[j] = r;
                      }
                    }
                  }
                  for (int64_t j = 0; j < width; ++j)
                    write(o * inner + j0 + j, best[j], position[j]);
                }
              });
}

// Sums, or max/min (kOpArg: their indices) for the kOpMax and kOpMin rows.
template <ReduceKind kOp, typename T>
void ReduceOne(int index, void* dst, const T* src, int64_t outer, int64_t reduce, int64_t inner) {
  constexpr unsigned kFlags = OpFlags(kOp);
  if constexpr ((kFlags & (kOpMax | kOpMin)) == 0) {
    ReduceSum(index, static_cast<T*>(dst), src, outer, reduce, inner);
  } else {
    ReduceExtremum<(kFlags & kOpMax) != 0, (kFlags & kOpArg) != 0>(index, dst, src, outer, reduce,
                                                                   inner);
  }
}

#define TANDEM_REDUCE_CASE(name, text, flags) \
  case ReduceKind::k##name:                   \
    return ReduceOne<ReduceKind::k##name>(index, dst, src, outer, reduce, inner);
template <typename T>
void ReduceTyped(int index, ReduceKind op, void* dst, const T* src, int64_t outer, int64_t reduce,
                 int64_t inner) {
  switch (op) { TANDEM_FORALL_REDUCE_KINDS(TANDEM_REDUCE_CASE) }
  TANDEM_FAIL("unknown ReduceKind ", static_cast<int>(op));
}
#undef TANDEM_REDUCE_CASE

// ---- Softmax ----------------------------------------------------------------------------

// The largest of a row of `dim` elements, `stride` apart, in M = OpMath<T> (NaN wins).
template <typename T>
OpMath<T> RowMax(const T* src, int64_t dim, int64_t stride) {
  using M = OpMath<T>;
  M max_value = -std::numeric_limits<M>::infinity();
  for (int64_t i = 0; i < dim; ++i) {
    const M x = static_cast<M>(src[i * stride]);
    if (Replaces<true>(x, max_value)) max_value = x;
  }
  return max_value;
}

// Softmax of one row of `dim` elements, `stride` apart, computed in M = OpMath<T> (the 16-bit
// floats load as float and round once, when the result is stored).
template <typename T>
void SoftmaxRow(bool log, T* dst, const T* src, int64_t dim, int64_t stride) {
  using M = OpMath<T>;
  const auto at = [&](int64_t i) { return static_cast<M>(src[i * stride]); };
  const M max_value = RowMax(src, dim, stride);
  double sum = 0.0;
  if (log) {
    for (int64_t i = 0; i < dim; ++i) sum += std::exp(at(i) - max_value);
    const M log_sum = static_cast<M>(std::log(sum));
    for (int64_t i = 0; i < dim; ++i)
      dst[i * stride] = static_cast<T>((at(i) - max_value) - log_sum);
  } else if constexpr (kIsReducedFloat<T>) {
    // The exponentials are computed twice rather than stored (rounded) and scaled.
    for (int64_t i = 0; i < dim; ++i) sum += std::exp(at(i) - max_value);
    const M scale = static_cast<M>(1.0 / sum);
    for (int64_t i = 0; i < dim; ++i) dst[i * stride] = T(std::exp(at(i) - max_value) * scale);
  } else {
    for (int64_t i = 0; i < dim; ++i) {
      const T e = std::exp(src[i * stride] - max_value);
      dst[i * stride] = e;
      sum += e;
    }
    const T scale = static_cast<T>(1.0 / sum);
    for (int64_t i = 0; i < dim; ++i) dst[i * stride] *= scale;
  }
}

}  // namespace

void Reduce(int index, ReduceKind op, const KernelTensor& dst, const KernelTensor& src,
            int64_t outer, int64_t reduce, int64_t inner) {
  TANDEM_CHECK(outer >= 0 && reduce >= 0 && inner >= 0,
               "CPU Reduce expects non-negative "
               "[outer, reduce, inner] but got [",
               outer, ", ", reduce, ", ", inner, "]");
  TANDEM_CHECK(src.numel() == outer * reduce * inner, "CPU Reduce: the input has ", src.numel(),
               " elements but [outer, reduce, inner] = [", outer, ", ", reduce, ", ", inner,
               "] describes ", outer * reduce * inner);
  TANDEM_CHECK(dst.numel() == outer * inner, "CPU Reduce: the output has ", dst.numel(),
               " elements but [outer, inner] = [", outer, ", ", inner, "] needs ", outer * inner);
  TANDEM_CHECK(src.is_contiguous() && dst.is_contiguous(),
               "CPU Reduce expects contiguous tensors; call contiguous() first");
  const bool arg = IsArgReduction(op);
  TANDEM_CHECK(dst.dtype == (arg ? kInt64 : src.dtype), "CPU Reduce ", OpName(op), " writes ",
               (arg ? kInt64 : src.dtype), " but the output is ", dst.dtype);
  if (outer * inner == 0) return;
  TANDEM_CHECK(reduce > 0 || op == ReduceKind::kSum, "CPU Reduce: ", OpName(op),
               " of an empty dimension is undefined (the dimension being reduced has size 0); "
               "reduce a non-empty dimension");
  if (reduce == 0) {               // empty sum
    return Fill(index, dst, 0.0);  // elementwise_kernels.h
  }
  DispatchDType(src.dtype, "CPU Reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ReduceTyped(index, op, dst.data, src.ptr<const T>(), outer, reduce, inner);
  });
}

namespace {

// The sizes were checked by RunSoftmax (tensor/kernels/softmax_kernels.h).
void CpuSoftmax(int index, DType dtype, bool log, void* dst_data, const void* src_data,
                int64_t outer, int64_t dim, int64_t inner) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (outer * dim * inner == 0) return;
    // One row per (outer, inner) pair; rows along `dim` are `inner` apart.
    const int64_t rows = outer * inner;
    ParallelFor(Cpu(index), rows, std::max<int64_t>(1, kTranscendentalGrain / dim),
                [&](int64_t begin, int64_t end) {
                  for (int64_t row = begin; row < end; ++row) {
                    const int64_t o = row / inner, j = row % inner;
                    const int64_t start = o * dim * inner + j;
                    SoftmaxRow(log, dst + start, src + start, dim, inner);
                  }
                });
  });
}

// Note [Fused cross-entropy] (tensor/kernels/softmax_kernels.h). Each row's loss is
// log_softmax's value at the target, negated, computed as SoftmaxRow computes it: log_sum -
// (x[t] - max), so the loss is the bits of nll_loss(log_softmax(x)).
void CpuCrossEntropyForward(int index, DType dtype, void* row_loss, void* lse_data,
                            const void* logits, const int64_t* targets, int64_t rows, int64_t cols,
                            const char* op) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU CrossEntropyForward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    const T* x = static_cast<const T*>(logits);
    M* loss = static_cast<M*>(row_loss);
    M* lse = static_cast<M*>(lse_data);
    ParallelFor(
        Cpu(index), rows, std::max<int64_t>(1, kTranscendentalGrain / std::max<int64_t>(cols, 1)),
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const T* row = x + r * cols;
            const M max_value = RowMax(row, cols, 1);
            double sum = 0.0;
            for (int64_t c = 0; c < cols; ++c) {
              sum += std::exp(static_cast<M>(row[c]) - max_value);
            }
            const M log_sum = static_cast<M>(std::log(sum));
            lse[r] = max_value + log_sum;
            const int64_t t = targets[r];
            loss[r] = t >= 0 && t < cols ? log_sum - (static_cast<M>(row[t]) - max_value) : M(0);
          }
        });
  });
}

void CpuCrossEntropyBackward(int index, DType dtype, void* grad_logits, const void* logits,
                             const void* lse_data, const int64_t* targets, const void* grad,
                             double scale, int64_t rows, int64_t cols) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU CrossEntropyBackward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    const T* x = static_cast<const T*>(logits);
    T* dx = static_cast<T*>(grad_logits);
    const M* lse = static_cast<const M*>(lse_data);
    const M g = static_cast<M>(static_cast<double>(*static_cast<const M*>(grad)) * scale);
    ParallelFor(Cpu(index), rows,
                std::max<int64_t>(1, kTranscendentalGrain / std::max<int64_t>(cols, 1)),
                [&](int64_t begin, int64_t end) {
                  for (int64_t r = begin; r < end; ++r) {
                    const int64_t t = targets[r];
                    for (int64_t c = 0; c < cols; ++c) {
                      const M p = std::exp(static_cast<M>(x[r * cols + c]) - lse[r]);
                      dx[r * cols + c] = static_cast<T>((p - (c == t ? M(1) : M(0))) * g);
                    }
                  }
                });
  });
}

}  // namespace

TANDEM_REGISTER_KERNEL(SoftmaxKernel, DeviceType::kCPU, CpuSoftmax);
TANDEM_REGISTER_KERNEL(CrossEntropyForwardKernel, DeviceType::kCPU, CpuCrossEntropyForward);
TANDEM_REGISTER_KERNEL(CrossEntropyBackwardKernel, DeviceType::kCPU, CpuCrossEntropyBackward);

}  // namespace cpu_internal
}  // namespace tandem
