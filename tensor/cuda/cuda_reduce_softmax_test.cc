// Reduction and softmax CUDA kernels against the CPU backend.
//
// Shared fixture and helpers: cuda_backend_testing.h. Skips (with the reason) where there is
// no usable GPU; set TANDEM_TEST_SEED to replay a run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/softmax_kernels.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda_test {

// ---- Reductions
// ----------------------------------------------------------------------------------

// Every reduction over each [outer, reduce, inner] of `shapes`: sums of continuous values,
// max/min/argmax/argmin of small integers (ties everywhere).
template <typename T>
void CudaBackendTest::ExpectReductionsMatch(const std::vector<ReduceShape>& shapes) {
  for (ReduceKind op : AllReduceKinds()) {
    const bool arg = IsArgReduction(op);
    for (const ReduceShape& s : shapes) {
      const std::string what =
          Note(DTypePrefix<T>() + "reduce op " + std::to_string(static_cast<int>(op)) + " over [" +
               std::to_string(s.outer) + ", " + std::to_string(s.reduce) + ", " +
               std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner, outputs = s.outer * s.inner;
      Buffer<T> src(op == ReduceKind::kSum ? Random<T>(n) : RandomIntegers<T>(n, -20, 20));
      const std::vector<int64_t> in_shape = {s.outer, s.reduce, s.inner};
      const std::vector<int64_t> out_shape = {s.outer, s.inner};
      if (arg) {
        Buffer<int64_t> dst(outputs);
        cpu_.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        ExpectEqual(dst.Cpu(), dst.Gpu(), what);
      } else {
        Buffer<T> dst(outputs);
        cpu_.Reduce(0, op, dst.CpuView(out_shape), src.CpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<T>::kReduceRtol, Tolerance<T>::kReduceAtol,
                   what);
      }
    }
  }
}

TEST_F(CudaBackendTest, ReduceFloat) {
  ExpectReductionsMatch<float>({
      {1, 1, 1},
      {1, 7, 1},
      {64, 10, 1},
      {7, 1000, 1},
      {5, 7, 33},
      {2, 3000, 300},
      {1, 3000001, 1},  // one row, split over many blocks
      {3, 50000, 5},    // few columns, split
      {1, 2049, 768},   // a bias gradient: rows split across blocks, then a second pass
      {2, 1001, 37},    // odd rows and columns, split into chunks that do not divide them
      {1, 1, 100003},   // nothing to reduce
      {0, 5, 3},        // no output
  });
  ExpectReductionsMatch<double>({{1, 1, 1},
                                 {64, 10, 1},
                                 {7, 1000, 1},
                                 {5, 7, 33},
                                 {2, 300, 30},
                                 {1, 300001, 1},  // one row, split
                                 {3, 5000, 5},
                                 {2, 1001, 37},  // column chunks that do not divide the rows
                                 {0, 5, 3}});
}

// NaN wins max and argmax (the first NaN), as on the CPU.
template <typename T>
void CudaBackendTest::ExpectNanWinsMaxAndArgmax() {
  const int64_t rows = 4, cols = 3001;
  std::vector<T> values = Random<T>(rows * cols);
  values[1 * cols + 2000] = NAN;
  values[1 * cols + 2500] = NAN;
  values[3 * cols + 7] = NAN;
  Buffer<T> src(values);
  Buffer<int64_t> argmax(rows);
  Buffer<T> max(rows);
  cpu_.Reduce(0, ReduceKind::kMax, max.CpuView({rows}), src.CpuView({rows, cols}), rows, cols, 1);
  gpu_.Reduce(0, ReduceKind::kMax, max.GpuView({rows}), src.GpuView({rows, cols}), rows, cols, 1);
  ExpectBitwiseEqual(max.Cpu(), max.Gpu(), Note(DTypePrefix<T>() + "max with NaN"));
  cpu_.Reduce(0, ReduceKind::kArgMax, argmax.CpuView({rows}), src.CpuView({rows, cols}), rows, cols,
              1);
  gpu_.Reduce(0, ReduceKind::kArgMax, argmax.GpuView({rows}), src.GpuView({rows, cols}), rows, cols,
              1);
  ExpectEqual(argmax.Cpu(), argmax.Gpu(), Note(DTypePrefix<T>() + "argmax with NaN"));
  EXPECT_EQ(argmax.Gpu()[1], 2000);
}

TEST_F(CudaBackendTest, ReduceNanAndInt64AndEmptySum) {
  ExpectNanWinsMaxAndArgmax<float>();
  ExpectNanWinsMaxAndArgmax<double>();

  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kArgMin}) {
    const int64_t outer = 3, reduce = 20001, inner = 2;
    Buffer<int64_t> ints(RandomInts(outer * reduce * inner, -1000, 1000));
    Buffer<int64_t> dst(outer * inner);
    cpu_.Reduce(0, op, dst.CpuView({outer, inner}), ints.CpuView({outer, reduce, inner}), outer,
                reduce, inner);
    gpu_.Reduce(0, op, dst.GpuView({outer, inner}), ints.GpuView({outer, reduce, inner}), outer,
                reduce, inner);
    ExpectEqual(dst.Cpu(), dst.Gpu(),
                Note("int64 reduce op " + std::to_string(static_cast<int>(op))));
  }

  Buffer<float> empty_sum(6);
  Buffer<float> nothing(1);
  gpu_.Reduce(0, ReduceKind::kSum, empty_sum.GpuView({2, 3}), nothing.GpuView({2, 0, 3}), 2, 0, 3);
  EXPECT_EQ(empty_sum.Gpu(), std::vector<float>(6, 0.0f));
  EXPECT_THROW(gpu_.Reduce(0, ReduceKind::kMax, empty_sum.GpuView({2, 3}),
                           nothing.GpuView({2, 0, 3}), 2, 0, 3),
               Error);
}

// ---- Softmax
// ---------------------------------------------------------------------------------------

template <typename T>
void CudaBackendTest::ExpectSoftmaxMatches(const std::vector<ReduceShape>& shapes) {
  for (bool log : {false, true}) {
    for (const ReduceShape& s : shapes) {
      const std::string what =
          Note(DTypePrefix<T>() + (log ? "log_softmax" : "softmax") + " over [" +
               std::to_string(s.outer) + ", " + std::to_string(s.reduce) + ", " +
               std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner;
      Buffer<T> src(Random<T>(n, -10.0, 10.0));
      Buffer<T> dst(n);
      const DType dtype = DTypeOf<T>::value;
      RunSoftmax(Device::Cpu(0), dtype, log, dst.cpu(), src.cpu(), s.outer, s.reduce, s.inner);
      RunSoftmax(Device::Cuda(0), dtype, log, dst.gpu(), src.gpu(), s.outer, s.reduce, s.inner);
      ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<T>::kSoftmaxRtol, Tolerance<T>::kSoftmaxAtol,
                 what);
    }
  }
}

TEST_F(CudaBackendTest, SoftmaxAndLogSoftmax) {
  ExpectSoftmaxMatches<float>({{1, 1, 1},
                               {257, 10, 1},
                               {3, 5000, 1},
                               {2, 1025, 1},
                               {4, 7, 9},
                               {2, 300, 65},
                               {0, 3, 1},
                               {3, 0, 2}});
  ExpectSoftmaxMatches<double>(
      {{1, 1, 1}, {257, 10, 1}, {3, 2000, 1}, {4, 7, 9}, {2, 100, 65}, {0, 3, 1}});
  // A row with -inf (a masked logit) and a row with NaN.
  Buffer<float> special(std::vector<float>{-INFINITY, 1.0f, 2.0f, NAN, 0.0f, 1.0f});
  Buffer<float> out(6);
  RunSoftmax(Device::Cpu(0), kFloat32, false, out.cpu(), special.cpu(), 2, 3, 1);
  RunSoftmax(Device::Cuda(0), kFloat32, false, out.gpu(), special.gpu(), 2, 3, 1);
  ExpectNear(out.Cpu(), out.Gpu(), 1e-6, 0.0, Note("softmax of -inf and NaN"));
  // Ascending rows and columns (the online softmax's running maximum grows at every element, so
  // its sum is rescaled each time) and descending ones (never), over a row and a column layout.
  for (double step : {0.01, -0.01}) {
    const int64_t dim = 3001;
    std::vector<float> ramp(static_cast<size_t>(2 * dim));
    for (int64_t j = 0; j < dim; ++j) {
      ramp[j] = static_cast<float>(step * static_cast<double>(j));         // row 0 / column 0
      ramp[dim + j] = static_cast<float>(-step * static_cast<double>(j));  // row 1
    }
    Buffer<float> src(ramp), dst(ramp.size());
    for (bool log : {false, true}) {
      for (int64_t inner : {1, 2}) {  // [2, dim] rows, or [1, dim, 2] columns
        const int64_t outer = inner == 1 ? 2 : 1;
        RunSoftmax(Device::Cpu(0), kFloat32, log, dst.cpu(), src.cpu(), outer, dim, inner);
        RunSoftmax(Device::Cuda(0), kFloat32, log, dst.gpu(), src.gpu(), outer, dim, inner);
        ExpectNear(dst.Cpu(), dst.Gpu(), Tolerance<float>::kSoftmaxRtol,
                   Tolerance<float>::kSoftmaxAtol,
                   Note(std::string(log ? "log_softmax" : "softmax") + " of a ramp, step " +
                        std::to_string(step) + ", inner " + std::to_string(inner)));
      }
    }
  }
  Buffer<int64_t> ints(4);
  EXPECT_THROW(RunSoftmax(Device::Cuda(0), kInt64, false, ints.gpu(), ints.gpu(), 1, 4, 1), Error);
}

// ---- bfloat16 and float16 ----------------------------------------------------------------

template <typename T>
void CudaBackendReducedTest::ExpectReductionsAndSoftmaxMatch() {
  const std::string dtype = DTypePrefix<T>();
  const ReduceShape shapes[] = {{1, 1, 1},     {64, 10, 1},   {7, 1000, 1},
                                {5, 7, 33},    {1, 30001, 1}, {3, 5000, 5},
                                {2, 1001, 37}, {1, 1, 1003},  {0, 5, 3}};
  for (ReduceKind op : AllReduceKinds()) {
    const bool arg = IsArgReduction(op);
    for (const ReduceShape& s : shapes) {
      const std::string what =
          Note(dtype + "reduce op " + std::to_string(static_cast<int>(op)) + " over [" +
               std::to_string(s.outer) + ", " + std::to_string(s.reduce) + ", " +
               std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner, outputs = s.outer * s.inner;
      Buffer<T> src(op == ReduceKind::kSum
                        ? RandomReduced<T>(n)
                        : Rounded<T>(Widened(RandomIntegers<float>(n, -20, 20))));
      Buffer<float> wide = Wide(src);
      const std::vector<int64_t> in_shape = {s.outer, s.reduce, s.inner};
      const std::vector<int64_t> out_shape = {s.outer, s.inner};
      if (arg) {
        Buffer<int64_t> dst(outputs);
        cpu_.Reduce(0, op, dst.CpuView(out_shape), wide.CpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce,
                    s.inner);
        ExpectEqual(dst.Cpu(), dst.Gpu(), what);
        continue;
      }
      Buffer<float> expected(outputs);
      Buffer<T> dst(outputs);
      cpu_.Reduce(0, op, expected.CpuView(out_shape), wide.CpuView(in_shape), s.outer, s.reduce,
                  s.inner);
      gpu_.Reduce(0, op, dst.GpuView(out_shape), src.GpuView(in_shape), s.outer, s.reduce, s.inner);
      if (op == ReduceKind::kSum) {
        // Float accumulation in another order than the CPU's double one: float rounding
        // (relative 6e-8 per addition) of terms up to 2, then one rounding to T either way.
        ExpectNear(Rounded<T>(expected.Cpu()), dst.Gpu(), Ulp<T>(),
                   2e-7 * static_cast<double>(s.reduce), what);
      } else {
        ExpectBitwiseEqual(Rounded<T>(expected.Cpu()), dst.Gpu(), what);
      }
    }
  }
  // Softmax and log_softmax over rows and columns, summing in double on both devices.
  for (bool log : {false, true}) {
    for (const ReduceShape& s : {ReduceShape{257, 10, 1}, ReduceShape{3, 2000, 1},
                                 ReduceShape{4, 7, 9}, ReduceShape{2, 100, 65}}) {
      const std::string what =
          Note(dtype + (log ? "log_softmax" : "softmax") + " over [" + std::to_string(s.outer) +
               ", " + std::to_string(s.reduce) + ", " + std::to_string(s.inner) + "]");
      const int64_t n = s.outer * s.reduce * s.inner;
      Buffer<T> src(RandomReduced<T>(n, -10.0, 10.0));
      Buffer<float> wide = Wide(src), expected(n);
      Buffer<T> dst(n);
      RunSoftmax(Device::Cpu(0), kFloat32, log, expected.cpu(), wide.cpu(), s.outer, s.reduce,
                 s.inner);
      RunSoftmax(Device::Cuda(0), DTypeOf<T>::value, log, dst.gpu(), src.gpu(), s.outer, s.reduce,
                 s.inner);
      ExpectNear(Rounded<T>(expected.Cpu()), dst.Gpu(), Ulp<T>(), 1e-5, what);
    }
  }
}

// GemmEx against the CPU's SGEMM of the widened operands, rounded: both multiply exactly and
// add in float, in different orders (Note [cudasim GemmEx] in tools/cudasim/cublas.cc), so
// they agree to one unit of T plus float rounding growing like sqrt(k).

// The fused cross-entropy (Note [Fused cross-entropy]) against the CPU's kernels, every dtype:
// odd shapes (rows and columns not multiples of a block), a GPT-2 vocabulary, a row with a
// -inf logit, each row's loss and log-sum-exp and the gradient. On the CPU the loss equals
// nll_loss(log_softmax) to the bit (tensor/ops/loss_test.cc); here both devices compute the
// same expressions, the sums in other orders (the online softmax's rescaled terms).
TEST_F(CudaBackendReducedTest, FusedCrossEntropyIsTheCpus) {
  auto check = [&](auto tag, int64_t rows, int64_t cols) {
    using T = decltype(tag);
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value;
    const std::string what = Note(DTypePrefix<T>() + "cross-entropy [" + std::to_string(rows) +
                                  ", " + std::to_string(cols) + "]");
    std::vector<float> values = Random<float>(static_cast<size_t>(rows * cols), -8.0, 8.0);
    if (rows * cols > 1) values[1] = -INFINITY;  // a masked logit in row 0
    Buffer<T> logits(Rounded<T>(values)), grad_logits(rows * cols);
    Buffer<M> loss(rows), lse(rows), grad(std::vector<M>{M(0.75)});
    std::vector<int64_t> labels = RandomInts(static_cast<size_t>(rows), 0, cols - 1);
    if (rows > 0 && cols > 1) labels[0] = 0;  // not the -inf logit: that loss is +inf
    Buffer<int64_t> targets(labels);
    for (const bool gpu : {false, true}) {
      const Device device = gpu ? Device::Cuda(0) : Device::Cpu(0);
      CrossEntropyForwardKernel(device, dtype, gpu ? loss.gpu() : loss.cpu(),
                                gpu ? lse.gpu() : lse.cpu(), gpu ? logits.gpu() : logits.cpu(),
                                gpu ? targets.gpu() : targets.cpu(), rows, cols, "test");
      CrossEntropyBackwardKernel(device, dtype, gpu ? grad_logits.gpu() : grad_logits.cpu(),
                                 gpu ? logits.gpu() : logits.cpu(), gpu ? lse.gpu() : lse.cpu(),
                                 gpu ? targets.gpu() : targets.cpu(), gpu ? grad.gpu() : grad.cpu(),
                                 1.0 / static_cast<double>(rows), rows, cols);
    }
    if constexpr (kIsReducedFloat<T>) {
      // Float sums in other orders; the gradient rounded once to T: within a unit of T.
      ExpectNear(loss.Cpu(), loss.Gpu(), 1e-5, 1e-5, what + ": loss");
      ExpectNear(lse.Cpu(), lse.Gpu(), 1e-6, 1e-6, what + ": lse");
      ExpectNear(grad_logits.Cpu(), grad_logits.Gpu(), Ulp<T>(), 1e-6, what + ": grad");
    } else {
      constexpr double kRtol = Tolerance<T>::kSoftmaxRtol, kAtol = Tolerance<T>::kSoftmaxAtol;
      ExpectNear(loss.Cpu(), loss.Gpu(), kRtol, kAtol, what + ": loss");
      ExpectNear(lse.Cpu(), lse.Gpu(), kRtol, kAtol, what + ": lse");
      ExpectNear(grad_logits.Cpu(), grad_logits.Gpu(), kRtol, kAtol, what + ": grad");
    }
  };
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 10}, {33, 1000}, {3, 50257}, {0, 5}}) {
    check(float{}, rows, cols);
    check(double{}, rows, cols);
    check(BFloat16{}, rows, cols);
    check(Half{}, rows, cols);
  }
}

TEST_F(CudaBackendReducedTest, ReductionsAndSoftmaxBFloat16) {
  ExpectReductionsAndSoftmaxMatch<BFloat16>();
}
TEST_F(CudaBackendReducedTest, ReductionsAndSoftmaxFloat16) {
  ExpectReductionsAndSoftmaxMatch<Half>();
}

}  // namespace cuda_test
}  // namespace tandem
