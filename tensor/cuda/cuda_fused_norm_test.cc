// Fused row norm and triangle CUDA kernels against the CPU backend.
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
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/norm_kernels.h"
#include "tensor/kernels/triangle_kernels.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/stream.h"
#include "tensor/tensor.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda_test {

// ---- Fused row norms and triangles (Note [Fused row norms])
// ---------------------------------------------------------------------------------------

class CudaFusedNormTest : public CudaBackendReducedTest {
 protected:
  // RowNorm and RowNormBackward of every flavour (layer/RMS norm; no affine, weight only,
  // weight and bias; with and without a fused residual, Note [Fused residual norm]) on the CPU
  // and the GPU, the same T on both: outputs, saved statistics and
  // gradients within `rtol`/`atol` (both sum in OpMath, in different orders). With L other than
  // T the residual, y, dy and the residual's gradient are L (Note [Autocast residual norm]).
  template <typename T, typename L = T>
  void ExpectRowNormsMatch(double rtol, double atol) {
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value, io_dtype = DTypeOf<L>::value;
    const bool mixed = dtype != io_dtype;
    // With grad_x, one launch takes all three gradients, its blocks' column sums added by the
    // blocks that finish last (Note [One-launch column sums]; {1000, 40} and {4096, 16} have
    // more blocks than groups); rows whose two sums pass 46 KiB ({130, 6000}) go the two-kernel
    // way, as do the weight and bias gradients alone (checked below): {1000, 40} and {517, 130}
    // split their rows across blocks (chunks that do not divide the rows), then add the chunks
    // in a second pass. 16-bit and float32 rows of a multiple of 8 ({70, 768}, {33, 40},
    // {1000, 40}, {4096, 16}) load 8 elements at a time (Packs), the others one at a time.
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {1, 1},     {3, 7},     {70, 768},  {5, 1500},   {33, 40},
        {1000, 40}, {4096, 16}, {517, 130}, {130, 6000}, {0, 4}};
    for (const auto& [rows, cols] : shapes) {
      for (bool rms : {false, true}) {
        for (int affine = 0; affine < 6; ++affine) {
          const bool fused = affine >= 3;        // the same three flavours with a residual
          if (rms && affine % 3 == 2) continue;  // RMSNorm has no bias
          const std::string what =
              Note(DTypePrefix<T>() + (mixed ? DTypePrefix<L>() + "i/o " : "") +
                   (rms ? "rms" : "layer") + " norm [" + std::to_string(rows) + ", " +
                   std::to_string(cols) + "] affine " + std::to_string(affine % 3) +
                   (fused ? " with a residual" : ""));
          const size_t n = static_cast<size_t>(rows * cols), c = static_cast<size_t>(cols);
          // Off-centre rows: the variance must be taken about the mean.
          Buffer<T> x(RandomReduced<T>(n, 1.0, 5.0)), weight(RandomReduced<T>(c)),
              bias(RandomReduced<T>(c)), dsum(RandomReduced<T>(n));
          Buffer<L> dy(RandomReduced<L>(n)), residual(RandomReduced<L>(n)), y(n), dres(n);
          Buffer<T> sum(n), dx(n), dw(c), db(c), dw_alone(c), db_alone(c);
          Buffer<M> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
          const bool has_w = affine % 3 >= 1, has_b = affine % 3 == 2;
          for (bool gpu : {false, true}) {
            const Device device = gpu ? Device::Cuda() : Device::Cpu();
            auto at = [&](auto& buffer, bool present) -> decltype(buffer.cpu()) {
              return present ? (gpu ? buffer.gpu() : buffer.cpu()) : nullptr;
            };
            RunRowNorm(device, dtype, io_dtype, rms, rows, cols, 1e-5, at(x, true),
                       at(residual, fused), at(weight, has_w), at(bias, has_b), at(y, true),
                       at(sum, fused), at(mean, !rms), at(rstd, true));
            // The backward normalises what the forward did: the sum when fused.
            RunRowNormBackward(device, dtype, io_dtype, rms, rows, cols, at(dy, true),
                               at(dsum, fused), fused ? at(sum, true) : at(x, true), at(mean, !rms),
                               at(rstd, true), at(weight, has_w), at(dx, true), at(dres, mixed),
                               at(dw, has_w), at(db, has_b));
            // The weight's and bias's gradients without grad_x (an input that needs none).
            RunRowNormBackward(device, dtype, io_dtype, rms, rows, cols, at(dy, true), nullptr,
                               fused ? at(sum, true) : at(x, true), at(mean, !rms), at(rstd, true),
                               at(weight, has_w), nullptr, nullptr, at(dw_alone, has_w),
                               at(db_alone, has_b));
          }
          // y rounded to L: an ulp of L apart where the two sums' orders tip a rounding.
          ExpectNear(y.Cpu(), y.Gpu(), std::max(rtol, 2 * Ulp<L>()), atol, what + ": y");
          // The sum is rounded once on both: the same bits.
          if (fused) ExpectNear(sum.Cpu(), sum.Gpu(), 0.0, 0.0, what + ": sum");
          ExpectNear(rstd.Cpu(), rstd.Gpu(), rtol, atol, what + ": rstd");
          if (!rms) ExpectNear(mean.Cpu(), mean.Gpu(), rtol, atol, what + ": mean");
          ExpectNear(dx.Cpu(), dx.Gpu(), rtol, atol, what + ": grad_x");
          if constexpr (!std::is_same_v<T, L>) {
            // grad_x rounded once to L on each device, beside grad_x.
            ExpectBitwiseEqual(Rounded<L>(dx.Cpu()), dres.Cpu(), what + ": grad_residual (cpu)");
            ExpectBitwiseEqual(Rounded<L>(dx.Gpu()), dres.Gpu(), what + ": grad_residual (cuda)");
            ExpectNear(dres.Cpu(), dres.Gpu(), std::max(rtol, 2 * Ulp<L>()), atol,
                       what + ": grad_residual");
          }
          // Sums over the rows: their rounding grows with the row count.
          const double sum_atol = atol * std::sqrt(static_cast<double>(rows) + 1.0);
          if (has_w) ExpectNear(dw.Cpu(), dw.Gpu(), rtol, sum_atol, what + ": grad_weight");
          if (has_b) ExpectNear(db.Cpu(), db.Gpu(), rtol, sum_atol, what + ": grad_bias");
          if (has_w) {
            ExpectNear(dw.Cpu(), dw_alone.Gpu(), rtol, sum_atol, what + ": grad_weight alone");
          }
          if (has_b) {
            ExpectNear(db.Cpu(), db_alone.Gpu(), rtol, sum_atol, what + ": grad_bias alone");
          }
        }
      }
    }
  }

  // Note [One-launch column sums]: the fused backward's last blocks add the column sums on
  // counters that each launch must leave at zero for the next, in a fixed order. The same call
  // again on the compute stream, then on side streams `a` and `b` at once (each its own
  // counters), gives the first call's bits. On the simulator's 4 SMs {1000, 40} is 125 float
  // blocks in 12 groups of 11 (the last of 4) and 250 16-bit ones in 16 of 16 (the last of
  // 10); {4096, 16} is 256 blocks in 16 groups of 16.
  template <typename T>
  void ExpectFusedBackwardRepeats(Stream a, Stream b) {
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value;
    const Device gpu = Device::Cuda(0);
    for (const auto& [rows, cols] :
         std::vector<std::pair<int64_t, int64_t>>{{1000, 40}, {4096, 16}, {70, 768}}) {
      const std::string what = DTypePrefix<T>() + "layer norm backward [" + std::to_string(rows) +
                               ", " + std::to_string(cols) + "]";
      const size_t n = static_cast<size_t>(rows * cols), c = static_cast<size_t>(cols);
      Buffer<T> x(RandomReduced<T>(n, 1.0, 5.0)), weight(RandomReduced<T>(c)),
          bias(RandomReduced<T>(c)), dy(RandomReduced<T>(n)), y(n);
      Buffer<M> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
      RunRowNorm(gpu, dtype, dtype, false, rows, cols, 1e-5, x.gpu(), nullptr, weight.gpu(),
                 bias.gpu(), y.gpu(), nullptr, mean.gpu(), rstd.gpu());
      constexpr int kCalls = 4;  // compute stream twice, then a and b
      std::vector<Buffer<T>> dx, dw, db;
      for (int i = 0; i < kCalls; ++i) {
        dx.emplace_back(n);
        dw.emplace_back(c);
        db.emplace_back(c);
      }
      const auto backward = [&](int i) {
        RunRowNormBackward(gpu, dtype, dtype, false, rows, cols, dy.gpu(), nullptr, x.gpu(),
                           mean.gpu(), rstd.gpu(), weight.gpu(), dx[i].gpu(), nullptr, dw[i].gpu(),
                           db[i].gpu());
      };
      backward(0);
      backward(1);
      const Stream compute = CurrentStream(gpu);
      a.Wait(compute);
      b.Wait(compute);
      {
        StreamGuard guard(a);
        backward(2);
      }
      {
        StreamGuard guard(b);
        backward(3);
      }
      compute.Wait(a);
      compute.Wait(b);
      for (int i = 1; i < kCalls; ++i) {
        const std::string call = what + ", call " + std::to_string(i);
        ExpectBitwiseEqual(dx[0].Gpu(), dx[i].Gpu(), Note(call + ": grad_x"));
        ExpectBitwiseEqual(dw[0].Gpu(), dw[i].Gpu(), Note(call + ": grad_weight"));
        ExpectBitwiseEqual(db[0].Gpu(), db[i].Gpu(), Note(call + ": grad_bias"));
      }
    }
  }

  // Triangle moves bits: exactly the CPU's, in place too, for each element size.
  template <typename T>
  void ExpectTrianglesMatch(DType dtype) {
    const int64_t batch = 3, rows = 5, cols = 7;
    const size_t n = static_cast<size_t>(batch * rows * cols);
    for (bool lower : {true, false}) {
      for (int64_t diagonal : {-7, -2, 0, 1, 3, 8}) {
        const std::string what = Note(std::string(DTypeName(dtype)) +
                                      (lower ? " tril " : " triu ") + std::to_string(diagonal));
        std::vector<T> values(n);
        for (size_t i = 0; i < n; ++i) values[i] = static_cast<T>(static_cast<float>(1 + i % 100));
        Buffer<T> src(values, dtype), dst(n, dtype);
        RunTriangle(Device::Cpu(0), dtype, lower, diagonal, batch, rows, cols, src.cpu(),
                    dst.cpu());
        RunTriangle(Device::Cuda(0), dtype, lower, diagonal, batch, rows, cols, src.gpu(),
                    dst.gpu());
        ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), what);
        RunTriangle(Device::Cuda(0), dtype, lower, diagonal, batch, rows, cols, src.gpu(),
                    src.gpu());
        ExpectBitwiseEqual(dst.Cpu(), src.Gpu(), what + " in place");
      }
    }
  }
};

TEST_F(CudaFusedNormTest, RowNormsFloat32) { ExpectRowNormsMatch<float>(1e-4, 1e-5); }
TEST_F(CudaFusedNormTest, RowNormsFloat64) { ExpectRowNormsMatch<double>(1e-10, 1e-12); }
// The 16-bit outputs may round to neighbouring values: two units in the last place.
TEST_F(CudaFusedNormTest, RowNormsBFloat16) {
  ExpectRowNormsMatch<BFloat16>(2 * Ulp<BFloat16>(), 1e-3);
}
TEST_F(CudaFusedNormTest, RowNormsFloat16) { ExpectRowNormsMatch<Half>(2 * Ulp<Half>(), 1e-4); }
// Note [Autocast residual norm]: float32 with 16-bit i/o.
TEST_F(CudaFusedNormTest, RowNormsFloat32WithBFloat16Io) {
  ExpectRowNormsMatch<float, BFloat16>(1e-4, 1e-5);
}
TEST_F(CudaFusedNormTest, RowNormsFloat32WithFloat16Io) {
  ExpectRowNormsMatch<float, Half>(1e-4, 1e-5);
}

// Note [Autocast residual norm] through add_layer_norm on cuda:0: under bf16 autocast a float32
// stream and a bfloat16 branch give the bits of the branch cast up, a float32 add_layer_norm and
// y cast down, forward and backward, in 2 launches where those take 4 (the two casts forward, and
// in backward y's cast's and the residual's); and within bfloat16 rounding of the CPU's.
TEST_F(CudaFusedNormTest, AutocastAddLayerNormIsItsCastsBitForBitWithoutTheirLaunches) {
  manual_seed(7);
  const Tensor x0 = randn({4, 6, 64}) + 1.5, r0 = randn({4, 6, 64}).to(kBFloat16);
  const Tensor w0 = randn({64}), b0 = randn({64});
  const Tensor g_sum = randn({4, 6, 64}), g_y = randn({4, 6, 64}).to(kBFloat16);
  // {sum, y, grad x, grad residual, grad weight, grad bias} as float32 vectors on the host, and
  // the launches forward and backward (on cuda:0 under cudasim), of the fused path (`fused`) or
  // of its casts.
  const auto run = [&](const Device& where, bool fused, long long* launches) {
    std::vector<Tensor> in = {x0.to(where), r0.to(where), w0.to(where), b0.to(where)};
    for (Tensor& t : in) {
      t = t.detach();
      t.set_requires_grad(true);
    }
    const bool count = where.is_cuda() && ReadDeviceCounters().counted;
    if (count) {
      cuda::Synchronize(0);
      ResetDeviceCounters();
    }
    Tensor sum, y;
    if (fused) {
      AutocastGuard autocast(where.type(), kBFloat16);
      std::tie(sum, y) = add_layer_norm(in[0], in[1], {64}, in[2], in[3], 1e-5);
    } else {
      Tensor y32;
      std::tie(sum, y32) = add_layer_norm(in[0], in[1].to(kFloat32), {64}, in[2], in[3], 1e-5);
      y = y32.to(kBFloat16);
    }
    const Tensor gs = g_sum.to(where), gy = g_y.to(where);
    if (count) {
      launches[0] = ReadDeviceCounters().launches;
      cuda::Synchronize(0);
      ResetDeviceCounters();
    }
    const std::vector<Tensor> grads = autograd::grad({sum, y}, in, {gs, gy});
    if (count) {
      cuda::Synchronize(0);
      launches[1] = ReadDeviceCounters().launches;
    }
    std::vector<std::vector<float>> out;
    for (const Tensor& t : {sum, y, grads[0], grads[1], grads[2], grads[3]}) {
      EXPECT_TRUE(t.defined());
      out.push_back(t.to(Device::Cpu(0)).to(kFloat32).contiguous().to_vector<float>());
    }
    EXPECT_EQ(y.dtype(), kBFloat16);
    EXPECT_EQ(grads[1].dtype(), kBFloat16);
    return out;
  };
  long long fused_launches[2] = {-1, -1}, cast_launches[2] = {-1, -1};
  const auto fused = run(Device::Cuda(0), true, fused_launches);
  const auto cast = run(Device::Cuda(0), false, cast_launches);
  const auto cpu = run(Device::Cpu(0), true, nullptr);
  const char* names[] = {"sum", "y", "grad x", "grad residual", "grad weight", "grad bias"};
  for (size_t i = 0; i < fused.size(); ++i) {
    ExpectBitwiseEqual(cast[i], fused[i], Note(std::string("autocast add_layer_norm ") + names[i]));
    // Sums over 24 rows and 64 columns in other orders; y and the residual's gradient rounded.
    ExpectNear(cpu[i], fused[i], 2 * Ulp<BFloat16>(), 1e-3,
               Note(std::string("autocast add_layer_norm against the cpu: ") + names[i]));
  }
  if (fused_launches[0] >= 0) {
    EXPECT_EQ(fused_launches[0], 1) << "forward: the norm alone";
    EXPECT_EQ(cast_launches[0], fused_launches[0] + 2) << "forward: the two casts gone";
    EXPECT_EQ(cast_launches[1], fused_launches[1] + 2) << "backward: the two casts gone";
  }
}

TEST_F(CudaFusedNormTest, FusedBackwardRepeatsBitForBitAcrossCallsAndStreams) {
  // Created once for every dtype: a device has at most 32 side streams.
  const Stream a = CreateStream(Device::Cuda(0)), b = CreateStream(Device::Cuda(0));
  ExpectFusedBackwardRepeats<float>(a, b);
  ExpectFusedBackwardRepeats<double>(a, b);
  ExpectFusedBackwardRepeats<BFloat16>(a, b);
  ExpectFusedBackwardRepeats<Half>(a, b);
}

TEST_F(CudaFusedNormTest, TrianglesOfEveryElementSize) {
  ExpectTrianglesMatch<uint8_t>(kBool);
  ExpectTrianglesMatch<uint8_t>(kUInt8);
  ExpectTrianglesMatch<Half>(kFloat16);
  ExpectTrianglesMatch<float>(kFloat32);
  ExpectTrianglesMatch<int64_t>(kInt64);
}

TEST_F(CudaFusedNormTest, BadShapesThrow) {
  Buffer<float> x(4), rstd(1);
  const Device gpu = Device::Cuda(0);
  EXPECT_THROW(RunRowNorm(gpu, kFloat32, kFloat32, false, 1, 0, 1e-5, x.gpu(), nullptr, nullptr,
                          nullptr, x.gpu(), nullptr, nullptr, rstd.gpu()),
               Error);
  Buffer<int64_t> ints(4);
  EXPECT_THROW(RunRowNorm(gpu, kInt64, kInt64, true, 1, 4, 1e-5, ints.gpu(), nullptr, nullptr,
                          nullptr, ints.gpu(), nullptr, nullptr, rstd.gpu()),
               Error);
  // A residual needs a sum to write (Note [Fused residual norm]), and grad_sum a grad_x.
  EXPECT_THROW(RunRowNorm(gpu, kFloat32, kFloat32, false, 1, 4, 1e-5, x.gpu(), x.gpu(), nullptr,
                          nullptr, x.gpu(), nullptr, nullptr, rstd.gpu()),
               Error);
  EXPECT_THROW(RunRowNormBackward(gpu, kFloat32, kFloat32, true, 1, 4, x.gpu(), x.gpu(), x.gpu(),
                                  nullptr, rstd.gpu(), nullptr, nullptr, nullptr, x.gpu(), nullptr),
               Error);
  // 16-bit i/o only beside float32 (Note [Autocast residual norm]), and grad_residual is
  // grad_x rounded: not without grad_x.
  try {
    RunRowNorm(gpu, kFloat64, kBFloat16, true, 1, 4, 1e-5, x.gpu(), nullptr, nullptr, nullptr,
               x.gpu(), nullptr, nullptr, rstd.gpu());
    ADD_FAILURE() << "float64 with bfloat16 i/o was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("io_dtype"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RunRowNormBackward(gpu, kFloat32, kBFloat16, true, 1, 4, x.gpu(), nullptr, x.gpu(),
                                  nullptr, rstd.gpu(), nullptr, nullptr, x.gpu(), nullptr, nullptr),
               Error);
}

}  // namespace cuda_test
}  // namespace tandem
