// Gather/scatter and random-number CUDA kernels against the CPU backend.
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
#include "tensor/kernels/index_kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda_test {

// ---- Gather / scatter
// -----------------------------------------------------------------------------

template <typename T>
void CudaBackendTest::ExpectGatherAndScatterAddColumnsMatch(
    const std::vector<int64_t>& row_counts) {
  const DType dtype = DTypeOf<T>::value;
  for (int64_t rows : row_counts) {
    const int64_t cols = 17;
    Buffer<T> src(Random<T>(rows * cols));
    Buffer<int64_t> idx(RandomInts(rows, 0, cols - 1));
    Buffer<T> gathered(rows);
    GatherColumnsKernel(Device::Cpu(0), dtype, gathered.cpu(), src.cpu(), idx.cpu(), rows, cols,
                        "test");
    GatherColumnsKernel(Device::Cuda(0), dtype, gathered.gpu(), src.gpu(), idx.gpu(), rows, cols,
                        "test");
    ExpectBitwiseEqual(gathered.Cpu(), gathered.Gpu(),
                       Note(DTypePrefix<T>() + "gather " + std::to_string(rows)));
    Buffer<T> grad(Random<T>(rows));
    ScatterAddColumnsKernel(Device::Cpu(0), dtype, src.cpu(), grad.cpu(), idx.cpu(), rows, cols);
    ScatterAddColumnsKernel(Device::Cuda(0), dtype, src.gpu(), grad.gpu(), idx.gpu(), rows, cols);
    ExpectBitwiseEqual(src.Cpu(), src.Gpu(),
                       Note(DTypePrefix<T>() + "scatter-add " + std::to_string(rows)));
  }
}

TEST_F(CudaBackendTest, GatherAndScatterAddColumns) {
  ExpectGatherAndScatterAddColumnsMatch<float>({0, 1, 1000, 70001});
  ExpectGatherAndScatterAddColumnsMatch<double>({0, 1, 1001});
}

// ---- Random numbers
// -------------------------------------------------------------------------------

TEST_F(CudaBackendTest, RandomUniformIsBitwiseTheCpus) {
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 1000003}) {
    for (uint64_t offset : {0, 1, 2, 3, 7, 1 << 20}) {
      for (auto [low, high] : {std::pair<float, float>{0.0f, 1.0f}, {-3.0f, 5.0f}}) {
        Buffer<float> dst(n);
        cpu_.RandomUniform(0, kFloat32, dst.cpu(), n, seed, offset, low, high);
        gpu_.RandomUniform(0, kFloat32, dst.gpu(), n, seed, offset, low, high);
        ExpectBitwiseEqual(
            dst.Cpu(), dst.Gpu(),
            Note("uniform n=" + std::to_string(n) + " offset=" + std::to_string(offset)));
      }
    }
  }
}

TEST_F(CudaBackendTest, RandomNormalMatchesTheCpuToAFewUlps) {
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 1000003}) {
    for (uint64_t offset : {0, 1, 3}) {
      Buffer<float> dst(n);
      cpu_.RandomNormal(0, kFloat32, dst.cpu(), n, seed, offset, 0.5f, 2.0f);
      gpu_.RandomNormal(0, kFloat32, dst.gpu(), n, seed, offset, 0.5f, 2.0f);
      ExpectNear(dst.Cpu(), dst.Gpu(), 2e-6, 2e-6,
                 Note("normal n=" + std::to_string(n) + " offset=" + std::to_string(offset)));
    }
  }
}

// ---- float64 only ---------------------------------------------------------------------------
// The checks float64 has and float32 does not (the shared ones run both dtypes above).
// Kernels whose arithmetic is the same expression on both devices must agree bitwise.

TEST_F(CudaBackendFloat64Test, GatherAndScatterAdd) {
  // torch.gather over the middle axis with repeated indices (they accumulate on scatter).
  const int64_t outer = 3, src_dim = 5, idx_dim = 7, inner = 11;
  Buffer<double> src(Random<double>(outer * src_dim * inner));
  Buffer<int64_t> idx(RandomInts(outer * idx_dim * inner, 0, src_dim - 1));
  Buffer<double> gathered(outer * idx_dim * inner);
  GatherKernel(Device::Cpu(0), kFloat64, gathered.cpu(), src.cpu(), idx.cpu(), outer, src_dim,
               idx_dim, inner, "test");
  GatherKernel(Device::Cuda(0), kFloat64, gathered.gpu(), src.gpu(), idx.gpu(), outer, src_dim,
               idx_dim, inner, "test");
  ExpectBitwiseEqual(gathered.Cpu(), gathered.Gpu(), Note("float64 gather"));
  Buffer<double> grad(Random<double>(outer * idx_dim * inner));
  ScatterAddKernel(Device::Cpu(0), kFloat64, src.cpu(), grad.cpu(), idx.cpu(), outer, src_dim,
                   idx_dim, inner);
  ScatterAddKernel(Device::Cuda(0), kFloat64, src.gpu(), grad.gpu(), idx.gpu(), outer, src_dim,
                   idx_dim, inner);
  ExpectBitwiseEqual(src.Cpu(), src.Gpu(), Note("float64 scatter-add"));
}

// Note [Random float64]: the float32 numbers, widened.
TEST_F(CudaBackendFloat64Test, RandomNumbersAreTheFloat32OnesWidened) {
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 10007}) {
    for (uint64_t offset : {0, 1, 3}) {
      const std::string what = " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      Buffer<float> narrow(n);
      Buffer<double> wide(n);
      gpu_.RandomUniform(0, kFloat32, narrow.gpu(), n, seed, offset, -3.0, 5.0);
      gpu_.RandomUniform(0, kFloat64, wide.gpu(), n, seed, offset, -3.0, 5.0);
      cpu_.RandomUniform(0, kFloat64, wide.cpu(), n, seed, offset, -3.0, 5.0);
      const std::vector<float> narrow_values = narrow.Gpu();
      const std::vector<double> widened(narrow_values.begin(), narrow_values.end());
      ExpectBitwiseEqual(widened, wide.Gpu(), Note("float64 uniform vs float32" + what));
      ExpectBitwiseEqual(wide.Cpu(), wide.Gpu(), Note("float64 uniform vs the cpu" + what));

      gpu_.RandomNormal(0, kFloat32, narrow.gpu(), n, seed, offset, 0.5, 2.0);
      gpu_.RandomNormal(0, kFloat64, wide.gpu(), n, seed, offset, 0.5, 2.0);
      cpu_.RandomNormal(0, kFloat64, wide.cpu(), n, seed, offset, 0.5, 2.0);
      const std::vector<float> normal_values = narrow.Gpu();
      const std::vector<double> widened_normal(normal_values.begin(), normal_values.end());
      ExpectBitwiseEqual(widened_normal, wide.Gpu(), Note("float64 normal vs float32" + what));
      // logf/cosf of CUDA and glibc differ in the last bits of the float32 result.
      ExpectNear(wide.Cpu(), wide.Gpu(), 2e-6, 2e-6, Note("float64 normal vs the cpu" + what));
    }
  }
}

// ---- bfloat16 and float16 ----------------------------------------------------------------

template <typename T>
void CudaBackendReducedTest::ExpectGathersScattersAndRandomMatch() {
  const DType dtype = DTypeOf<T>::value;
  const std::string prefix = DTypePrefix<T>();
  // One column per row (cross-entropy's gather and its gradient).
  const int64_t rows = 1000, cols = 10;
  Buffer<T> matrix(RandomReduced<T>(rows * cols));
  Buffer<float> wide_matrix = Wide(matrix);
  Buffer<int64_t> columns(RandomInts(rows, 0, cols - 1));
  Buffer<T> picked(rows);
  Buffer<float> expected_picked(rows);
  GatherColumnsKernel(Device::Cpu(0), kFloat32, expected_picked.cpu(), wide_matrix.cpu(),
                      columns.cpu(), rows, cols, "test");
  GatherColumnsKernel(Device::Cuda(0), dtype, picked.gpu(), matrix.gpu(), columns.gpu(), rows, cols,
                      "test");
  ExpectBitwiseEqual(Rounded<T>(expected_picked.Cpu()), picked.Gpu(),
                     Note(prefix + "gather columns"));
  Buffer<T> values(RandomReduced<T>(rows));
  Buffer<float> wide_values = Wide(values);
  ScatterAddColumnsKernel(Device::Cpu(0), kFloat32, wide_matrix.cpu(), wide_values.cpu(),
                          columns.cpu(), rows, cols);
  ScatterAddColumnsKernel(Device::Cuda(0), dtype, matrix.gpu(), values.gpu(), columns.gpu(), rows,
                          cols);
  ExpectBitwiseEqual(Rounded<T>(wide_matrix.Cpu()), matrix.Gpu(),
                     Note(prefix + "scatter-add columns"));
  // torch.gather over the middle axis, and scatter-add with repeated indices: they add in
  // float, in index order, and round once.
  const int64_t outer = 3, src_dim = 5, idx_dim = 17, inner = 11;
  Buffer<T> src(RandomReduced<T>(outer * src_dim * inner));
  Buffer<float> wide_src = Wide(src);
  Buffer<int64_t> idx(RandomInts(outer * idx_dim * inner, 0, src_dim - 1));
  Buffer<T> gathered(outer * idx_dim * inner);
  Buffer<float> expected_gathered(outer * idx_dim * inner);
  GatherKernel(Device::Cpu(0), kFloat32, expected_gathered.cpu(), wide_src.cpu(), idx.cpu(), outer,
               src_dim, idx_dim, inner, "test");
  GatherKernel(Device::Cuda(0), dtype, gathered.gpu(), src.gpu(), idx.gpu(), outer, src_dim,
               idx_dim, inner, "test");
  ExpectBitwiseEqual(Rounded<T>(expected_gathered.Cpu()), gathered.Gpu(), Note(prefix + "gather"));
  Buffer<T> grad(RandomReduced<T>(outer * idx_dim * inner));
  Buffer<float> wide_grad = Wide(grad);
  ScatterAddKernel(Device::Cpu(0), kFloat32, wide_src.cpu(), wide_grad.cpu(), idx.cpu(), outer,
                   src_dim, idx_dim, inner);
  ScatterAddKernel(Device::Cuda(0), dtype, src.gpu(), grad.gpu(), idx.gpu(), outer, src_dim,
                   idx_dim, inner);
  ExpectBitwiseEqual(Rounded<T>(wide_src.Cpu()), src.Gpu(), Note(prefix + "scatter-add"));
  // Random numbers: the float32 draws, rounded (on one device: bitwise; the CPU's normal
  // draws differ from CUDA's in the last float bits, so within one unit of T).
  const uint64_t seed = rng_();
  for (int64_t n : {0, 1, 5, 10007}) {
    for (uint64_t offset : {0, 3}) {
      const std::string what =
          prefix + "random n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      Buffer<float> narrow(n);
      Buffer<T> reduced(n);
      gpu_.RandomUniform(0, kFloat32, narrow.gpu(), n, seed, offset, -3.0, 5.0);
      gpu_.RandomUniform(0, dtype, reduced.gpu(), n, seed, offset, -3.0, 5.0);
      cpu_.RandomUniform(0, kFloat32, narrow.cpu(), n, seed, offset, -3.0, 5.0);
      ExpectBitwiseEqual(Rounded<T>(narrow.Gpu()), reduced.Gpu(), Note(what + " uniform"));
      ExpectBitwiseEqual(Rounded<T>(narrow.Cpu()), reduced.Gpu(), Note(what + " uniform cpu"));
      gpu_.RandomNormal(0, kFloat32, narrow.gpu(), n, seed, offset, 0.5, 2.0);
      gpu_.RandomNormal(0, dtype, reduced.gpu(), n, seed, offset, 0.5, 2.0);
      cpu_.RandomNormal(0, kFloat32, narrow.cpu(), n, seed, offset, 0.5, 2.0);
      ExpectBitwiseEqual(Rounded<T>(narrow.Gpu()), reduced.Gpu(), Note(what + " normal"));
      ExpectNear(Rounded<T>(narrow.Cpu()), reduced.Gpu(), Ulp<T>(), 1e-5,
                 Note(what + " normal cpu"));
    }
  }
}

// Every optimizer case on 16-bit tensors against the CPU's float32 update of the widened
// tensors, each param and state rounded: bitwise (optimizer_kernels.cu has no FMA contraction).

// An embedding's backward (Note [Sorted scatter-add], index_kernels.cu): token rows scattered
// into a table with an index that is the same along the inner axis, many tokens repeated, odd
// sizes. The segmented sum adds each destination element's terms in the CPU's order: float32
// and float64 equal the CPU to the bit; 16-bit dtypes add in float and round once, which is
// the CPU's float32 sum of the widened values, rounded. One row whose index varies along the
// inner axis takes the column-by-column path, with the same result.
TEST_F(CudaBackendReducedTest, EmbeddingBackwardScatterAddIsTheCpus) {
  auto check = [&](auto tag, int64_t outer, int64_t vocab, int64_t tokens, int64_t inner,
                   bool vary) {
    using T = decltype(tag);
    const DType dtype = DTypeOf<T>::value;
    const std::string what =
        Note(DTypePrefix<T>() + "embedding backward [" + std::to_string(outer) + ", " +
             std::to_string(vocab) + ", " + std::to_string(tokens) + ", " + std::to_string(inner) +
             "]" + (vary ? " varying along inner" : ""));
    const int64_t n = outer * tokens * inner, table = outer * vocab * inner;
    const std::vector<int64_t> ids = RandomInts(static_cast<size_t>(outer * tokens), 0, vocab - 1);
    std::vector<int64_t> expanded(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) expanded[e] = ids[e / inner];
    if (vary) expanded[static_cast<size_t>(n / 2)] = (expanded[n / 2] + 1) % vocab;
    Buffer<int64_t> idx(expanded);
    std::vector<float> start = Random<float>(static_cast<size_t>(table));
    std::vector<float> grad = Random<float>(static_cast<size_t>(n));
    if constexpr (kIsReducedFloat<T>) {
      Buffer<T> dst(Rounded<T>(start)), values(Rounded<T>(grad));
      Buffer<float> wide_dst = Wide(dst), wide_values = Wide(values);
      ScatterAddKernel(Device::Cpu(0), kFloat32, wide_dst.cpu(), wide_values.cpu(), idx.cpu(),
                       outer, vocab, tokens, inner);
      ScatterAddKernel(Device::Cuda(0), dtype, dst.gpu(), values.gpu(), idx.gpu(), outer, vocab,
                       tokens, inner);
      ExpectBitwiseEqual(Rounded<T>(wide_dst.Cpu()), dst.Gpu(), what);
    } else {
      Buffer<T> dst(std::vector<T>(start.begin(), start.end())),
          values(std::vector<T>(grad.begin(), grad.end()));
      ScatterAddKernel(Device::Cpu(0), dtype, dst.cpu(), values.cpu(), idx.cpu(), outer, vocab,
                       tokens, inner);
      ScatterAddKernel(Device::Cuda(0), dtype, dst.gpu(), values.gpu(), idx.gpu(), outer, vocab,
                       tokens, inner);
      ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
    }
  };
  auto every_dtype = [&](int64_t outer, int64_t vocab, int64_t tokens, int64_t inner, bool vary) {
    check(float{}, outer, vocab, tokens, inner, vary);
    check(double{}, outer, vocab, tokens, inner, vary);
    check(BFloat16{}, outer, vocab, tokens, inner, vary);
    check(Half{}, outer, vocab, tokens, inner, vary);
  };
  every_dtype(1, 50, 301, 37, false);  // ~6 tokens an id: runs of repeats
  every_dtype(1, 3, 257, 65, false);   // long runs
  every_dtype(2, 17, 129, 33, false);  // two slices, each sorted on its own
  every_dtype(1, 1, 40, 7, false);     // one id: a single run
  every_dtype(2, 11, 97, 9, true);     // an index varying along the inner axis
}

TEST_F(CudaBackendReducedTest, GathersScattersAndRandomBFloat16) {
  ExpectGathersScattersAndRandomMatch<BFloat16>();
}
TEST_F(CudaBackendReducedTest, GathersScattersAndRandomFloat16) {
  ExpectGathersScattersAndRandomMatch<Half>();
}

}  // namespace cuda_test
}  // namespace tandem
