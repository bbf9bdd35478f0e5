// The CPU backend's fused row norms (tensor/kernels/norm_kernels.h), registered at static
// initialisation (part of :cpu_backend, which is linked whole). Each row's
// statistics are computed in OpMath<T> (the 16-bit floats widened a row at a time); the
// backward's weight and bias sums add fixed blocks of rows in order, so results do not depend
// on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/row_norm_types.h"
#include "tensor/kernels/norm_kernels.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/kernel_stub.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace cpu_internal {
namespace {

// Rows per block of RowNormBackward's weight and bias sums: each block's partial sums are
// added in block order, so the result does not depend on how the blocks fall over threads.
constexpr int64_t kNormRowBlock = 32;

// Sum of n values with eight independent accumulators, so that the loop vectorises without
// reassociating one chain (which the compiler may not do).
template <typename M>
TANDEM_VECTORIZE inline M SumLanes(const M* __restrict x, int64_t n) {
  M partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += x[i + j];
  }
  M tail = 0;
  for (; i < n; ++i) tail += x[i];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

// sum((x - shift)^2) with the same lanes.
template <typename M>
TANDEM_VECTORIZE inline M SumSquaredLanes(const M* __restrict x, M shift, int64_t n) {
  M partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const M d = x[i + j] - shift;
      partial[j] += d * d;
    }
  }
  M tail = 0;
  for (; i < n; ++i) tail += (x[i] - shift) * (x[i] - shift);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

// A row of T as OpMath<T> values: the row itself for float and double, else converted into
// `buffer` (which must hold n values).
template <typename T>
inline const OpMath<T>* RowAsMath(const T* row, int64_t n, OpMath<T>* buffer) {
  if constexpr (kIsReducedFloat<T>) {
    vec::ToFloatLoop(row, buffer, n);  // the caller runs inside vec::Vectorized
    return buffer;
  } else {
    return row;
  }
}

// `weight` or `bias` as OpMath values (empty when null).
template <typename T>
std::vector<OpMath<T>> VectorAsMath(const void* data, int64_t n) {
  std::vector<OpMath<T>> out;
  if (data == nullptr) return out;
  out.resize(static_cast<size_t>(n));
  const T* in = static_cast<const T*>(data);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<OpMath<T>>(in[i]);
  return out;
}

// Writes n OpMath values to a row of T (rounding once for the 16-bit floats).
template <typename T>
inline void StoreRow(const OpMath<T>* in, int64_t n, T* out) {
  if constexpr (kIsReducedFloat<T>) {
    vec::FromFloatLoop(in, out, n);  // the caller runs inside vec::Vectorized
  } else {
    std::copy(in, in + n, out);
  }
}

// y = (x - mean) * rstd [* w] [+ b] over one row.
template <typename M>
TANDEM_VECTORIZE inline void NormalizeRow(const M* __restrict x, M mean, M rstd,
                                          const M* __restrict w, const M* __restrict b, int64_t n,
                                          M* __restrict out) {
  if (w != nullptr && b != nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd * w[j] + b[j];
  } else if (w != nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd * w[j];
  } else if (b != nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd + b[j];
  } else {
    for (int64_t j = 0; j < n; ++j) out[j] = (x[j] - mean) * rstd;
  }
}

// One row of RowNormBackward: xhat; the weight and bias partial sums (dw, db: null when not
// wanted); and, into `g` when dx is wanted, grad_x = rstd * (g - mean(g) - xhat * mean(g xhat))
// with g = gy * w (rms: without the mean(g) term).
template <typename M>
TANDEM_VECTORIZE inline void NormBackwardRow(bool rms, const M* __restrict x,
                                             const M* __restrict gy, const M* __restrict w, M mean,
                                             M rstd, int64_t n, bool want_dx, M* __restrict xhat,
                                             M* __restrict g, M* __restrict dw, M* __restrict db) {
  for (int64_t j = 0; j < n; ++j) xhat[j] = (x[j] - mean) * rstd;
  if (dw != nullptr) {
    for (int64_t j = 0; j < n; ++j) dw[j] += gy[j] * xhat[j];
  }
  if (db != nullptr) {
    for (int64_t j = 0; j < n; ++j) db[j] += gy[j];
  }
  if (!want_dx) return;
  if (w != nullptr) {
    for (int64_t j = 0; j < n; ++j) g[j] = gy[j] * w[j];
  } else {
    for (int64_t j = 0; j < n; ++j) g[j] = gy[j];
  }
  const M inv_n = M(1) / static_cast<M>(n);
  const M mean_g = rms ? M(0) : SumLanes(g, n) * inv_n;
  M dot[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int k = 0; k < 8; ++k) dot[k] += g[j + k] * xhat[j + k];
  }
  M tail = 0;
  for (; j < n; ++j) tail += g[j] * xhat[j];
  const M mean_gx =
      (((dot[0] + dot[1]) + (dot[2] + dot[3])) + ((dot[4] + dot[5]) + (dot[6] + dot[7])) + tail) *
      inv_n;
  for (int64_t k = 0; k < n; ++k) g[k] = rstd * (g[k] - mean_g - xhat[k] * mean_gx);
}

// T: x, the sum, the parameters; L: the residual and y (Note [Autocast residual norm]).
template <typename T, typename L>
void RowNormTyped(int index, bool rms, int64_t rows, int64_t cols, double eps, const void* x_data,
                  const void* residual_data, const void* weight_data, const void* bias_data,
                  void* y_data, void* sum_data, void* mean_data, void* rstd_data) {
  using M = OpMath<T>;
  static_assert(std::is_same_v<M, OpMath<L>>, "T and L must compute in the same OpMath");
  const T* x = static_cast<const T*>(x_data);
  const L* residual = static_cast<const L*>(residual_data);
  L* y = static_cast<L*>(y_data);
  T* sum = static_cast<T*>(sum_data);
  M* mean_out = static_cast<M*>(mean_data);
  M* rstd_out = static_cast<M*>(rstd_data);
  const std::vector<M> weight = VectorAsMath<T>(weight_data, cols);
  const std::vector<M> bias = VectorAsMath<T>(bias_data, cols);
  const M* w = weight.empty() ? nullptr : weight.data();
  const M* b = bias.empty() ? nullptr : bias.data();
  const M inv_cols = M(1) / static_cast<M>(cols);
  ParallelFor(Cpu(index), rows, std::max<int64_t>(1, kElementwiseGrain / (4 * cols)),
              [&](int64_t begin, int64_t end) {
                std::vector<M> in_buffer(kIsReducedFloat<T> ? cols : 0);
                std::vector<M> out(cols);
                vec::Vectorized([&] {
                  for (int64_t r = begin; r < end; ++r) {
                    if (residual != nullptr) {
                      // Note [Fused residual norm]: the sum rounded to T, then normalised.
                      for (int64_t j = 0; j < cols; ++j) {
                        sum[r * cols + j] = static_cast<T>(static_cast<M>(x[r * cols + j]) +
                                                           static_cast<M>(residual[r * cols + j]));
                      }
                    }
                    const T* row = (residual != nullptr ? sum : x) + r * cols;
                    const M* xs = RowAsMath(row, cols, in_buffer.data());
                    const M mean = rms ? M(0) : SumLanes(xs, cols) * inv_cols;
                    const M var = SumSquaredLanes(xs, mean, cols) * inv_cols;
                    const M rstd = M(1) / std::sqrt(var + static_cast<M>(eps));
                    if (mean_out != nullptr) mean_out[r] = mean;
                    rstd_out[r] = rstd;
                    NormalizeRow(xs, mean, rstd, w, b, cols, out.data());
                    StoreRow<L>(out.data(), cols, y + r * cols);
                  }
                });
              });
}

// T: x, grad_sum, grad_x, the parameters; L: grad_y and grad_residual (Note [Autocast residual
// norm]).
template <typename T, typename L>
void RowNormBackwardTyped(int index, bool rms, int64_t rows, int64_t cols, const void* grad_data,
                          const void* grad_sum_data, const void* x_data, const void* mean_data,
                          const void* rstd_data, const void* weight_data, void* grad_x_data,
                          void* grad_residual_data, void* grad_weight_data, void* grad_bias_data) {
  using M = OpMath<T>;
  static_assert(std::is_same_v<M, OpMath<L>>, "T and L must compute in the same OpMath");
  const L* dy = static_cast<const L*>(grad_data);
  L* dresidual = static_cast<L*>(grad_residual_data);
  const T* x = static_cast<const T*>(x_data);
  const M* mean_in = static_cast<const M*>(mean_data);
  const M* rstd_in = static_cast<const M*>(rstd_data);
  T* dx = static_cast<T*>(grad_x_data);
  const T* dsum = static_cast<const T*>(grad_sum_data);
  const std::vector<M> weight = VectorAsMath<T>(weight_data, cols);
  const M* w = weight.empty() ? nullptr : weight.data();
  const bool want_dw = grad_weight_data != nullptr, want_db = grad_bias_data != nullptr;
  const int64_t blocks = (rows + kNormRowBlock - 1) / kNormRowBlock;
  // Per block of rows: its partial sums of grad_y * xhat (dw) and grad_y (db).
  std::vector<M> partial_dw(want_dw ? blocks * cols : 0), partial_db(want_db ? blocks * cols : 0);
  ParallelFor(Cpu(index), blocks,
              std::max<int64_t>(1, kElementwiseGrain / (8 * kNormRowBlock * cols)),
              [&](int64_t block_begin, int64_t block_end) {
                std::vector<M> x_buffer(kIsReducedFloat<T> ? cols : 0);
                std::vector<M> dy_buffer(kIsReducedFloat<L> ? cols : 0);
                std::vector<M> xhat(cols), g(cols);
                for (int64_t block = block_begin; block < block_end; ++block) {
                  M* dw = want_dw ? partial_dw.data() + block * cols : nullptr;
                  M* db = want_db ? partial_db.data() + block * cols : nullptr;
                  if (dw != nullptr) std::fill(dw, dw + cols, M(0));
                  if (db != nullptr) std::fill(db, db + cols, M(0));
                  const int64_t row_end = std::min(rows, (block + 1) * kNormRowBlock);
                  vec::Vectorized([&] {
                    for (int64_t r = block * kNormRowBlock; r < row_end; ++r) {
                      const M* xs = RowAsMath(x + r * cols, cols, x_buffer.data());
                      const M* gy = RowAsMath(dy + r * cols, cols, dy_buffer.data());
                      NormBackwardRow(rms, xs, gy, w, rms ? M(0) : mean_in[r], rstd_in[r], cols,
                                      dx != nullptr, xhat.data(), g.data(), dw, db);
                      if (dsum != nullptr) {  // Note [Fused residual norm]
                        const T* through = dsum + r * cols;
                        for (int64_t j = 0; j < cols; ++j) g[j] += static_cast<M>(through[j]);
                      }
                      if (dx != nullptr) StoreRow<T>(g.data(), cols, dx + r * cols);
                      if (dresidual != nullptr) {
                        StoreRow<L>(g.data(), cols, dresidual + r * cols);
                      }
                    }
                  });
                }
              });
  // The blocks' partial sums, added in block order, a tile of columns per task.
  auto finish = [&](const std::vector<M>& partial, void* out_data) {
    T* out = static_cast<T*>(out_data);
    constexpr int64_t kTile = 256;
    const int64_t tiles = (cols + kTile - 1) / kTile;
    ParallelFor(Cpu(index), tiles,
                std::max<int64_t>(1, kElementwiseGrain / (kTile * std::max<int64_t>(1, blocks))),
                [&](int64_t begin, int64_t end) {
                  M acc[kTile];
                  for (int64_t tile = begin; tile < end; ++tile) {
                    const int64_t j0 = tile * kTile, width = std::min(kTile, cols - j0);
                    std::fill(acc, acc + width, M(0));
                    for (int64_t block = 0; block < blocks; ++block) {
                      const M* p = partial.data() + block * cols + j0;
                      for (int64_t j = 0; j < width; ++j) acc[j] += p[j];
                    }
                    for (int64_t j = 0; j < width; ++j) out[j0 + j] = static_cast<T>(acc[j]);
                  }
                });
  };
  if (want_dw) finish(partial_dw, grad_weight_data);
  if (want_db) finish(partial_db, grad_bias_data);
}

// The arguments were checked by RunRowNorm / RunRowNormBackward (tensor/kernels/norm_kernels.h).
void CpuRowNorm(int index, DType dtype, DType io_dtype, bool rms, int64_t rows, int64_t cols,
                double eps, const void* x, const void* residual, const void* weight,
                const void* bias, void* y, void* sum, void* mean, void* rstd) {
  CheckCpuIndex(index);
  if (rows == 0) return;
  DispatchRowNormTypes(dtype, io_dtype, "CPU RowNorm", [&](auto t, auto l) {
    RowNormTyped<typename decltype(t)::type, typename decltype(l)::type>(
        index, rms, rows, cols, eps, x, residual, weight, bias, y, sum, mean, rstd);
  });
}

void CpuRowNormBackward(int index, DType dtype, DType io_dtype, bool rms, int64_t rows,
                        int64_t cols, const void* grad_y, const void* grad_sum, const void* x,
                        const void* mean, const void* rstd, const void* weight, void* grad_x,
                        void* grad_residual, void* grad_weight, void* grad_bias) {
  CheckCpuIndex(index);
  DispatchRowNormTypes(dtype, io_dtype, "CPU RowNormBackward", [&](auto t, auto l) {
    RowNormBackwardTyped<typename decltype(t)::type, typename decltype(l)::type>(
        index, rms, rows, cols, grad_y, grad_sum, x, mean, rstd, weight, grad_x, grad_residual,
        grad_weight, grad_bias);
  });
}

}  // namespace

TANDEM_REGISTER_KERNEL(RowNormKernel, DeviceType::kCPU, CpuRowNorm);
TANDEM_REGISTER_KERNEL(RowNormBackwardKernel, DeviceType::kCPU, CpuRowNormBackward);

}  // namespace cpu_internal
}  // namespace tandem
