// Every KernelStub (tensor/runtime/kernel_stub.h) against the CPU oracle: one row per stub in the
// table below runs that kernel on cuda:0 and on the CPU over small random inputs, in each dtype
// the kernel claims, and compares the two. The registry test fails when AllKernelStubs() holds a
// stub without a row, or one whose CPU or CUDA kernel is not registered, so that a new kernel
// cannot go untested: add its row here (the family's cuda_<family>_test.cc holds the thorough
// checks; a row is the smallest run that shows the kernel exists and agrees in every dtype).
// Skips the runs where there is no usable GPU (runs under --config=cudasim).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/base/half.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/attention_kernels.h"
#include "tensor/kernels/cast_kernels.h"
#include "tensor/kernels/conv_kernels.h"
#include "tensor/kernels/index_kernels.h"
#include "tensor/kernels/norm_kernels.h"
#include "tensor/kernels/optimizer_kernels.h"
#include "tensor/kernels/pooling_kernels.h"
#include "tensor/kernels/softmax_kernels.h"
#include "tensor/kernels/triangle_kernels.h"
#include "tensor/ops/fused_optimizers_testing.h"
#include "tensor/runtime/kernel_stub.h"
#include "tensor/tensor.h"

namespace tandem {
namespace cuda_test {
namespace {

constexpr Device kCpu = Device::Cpu(0);
constexpr Device kCuda = Device::Cuda(0);

// How far the GPU may be from the CPU in a row's comparison: the kernels compute the same
// expressions, but sums may add in another order and CUDA's expf/logf may differ from glibc's in
// the last bits; the 16-bit floats round each of those differences to at most an ulp or two.
template <typename T>
double Rtol() {
  if constexpr (std::is_same_v<T, double>) {
    return 1e-12;
  } else if constexpr (std::is_same_v<T, float>) {
    return 2e-5;
  } else {
    return 2 * Ulp<T>();
  }
}
template <typename T>
double Atol() {
  return std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, float> ? 1e-6 : Ulp<T>();
}

// Calls f with a tag whose ::type is each floating type in turn (what most kernels claim).
template <typename F>
void ForEachFloatingType(F&& f) {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    DispatchAllFloatingTypes(dtype, "kernel_coverage_test", f);
  }
}

class KernelCoverageTest : public CudaBackendReducedTest {
 protected:
  // Values in [low, high) of any floating T (rounded once for the 16-bit floats).
  template <typename T>
  std::vector<T> Values(size_t n, double low = -2.0, double high = 2.0) {
    return Rounded<T>(Random<float>(n, low, high));
  }
  // Small integers as T: sums and products of a few of them are exact in every dtype.
  template <typename T>
  std::vector<T> Integers(size_t n, int low = -2, int high = 2) {
    return Rounded<T>(RandomIntegers<float>(n, low, high));
  }
  template <typename T>
  void ExpectClose(const Buffer<T>& b, const std::string& what) {
    ExpectNear(b.Cpu(), b.Gpu(), Rtol<T>(), Atol<T>(), Note(DTypePrefix<T>() + what));
  }

 public:
  // The rows (see Rows() below).
  void Triangle();
  void Softmax();
  void CrossEntropy();
  void GatherAndScatterAddColumns();
  void GatherAndScatterAdd();
  void Im2ColAndCol2Im();
  void DirectConvolution();
  void MaxPool();
  void AvgPool();
  void AdaptiveAvgPool();
  void RowNorms();
  void Attention();
  void FusedOptimizer(testing::OptimizerCase::Kind kind);
  void FusedSgd() { FusedOptimizer(testing::OptimizerCase::Kind::kSgd); }
  void FusedAdam() { FusedOptimizer(testing::OptimizerCase::Kind::kAdam); }
  void FusedRmsprop() { FusedOptimizer(testing::OptimizerCase::Kind::kRmsprop); }
  void ForeachCast();
};

// One row: the stubs it runs (several when a forward and its backward share inputs), and
// whether CUDA may lack a kernel (an optional one, whose op falls back: then the row checks the
// kernels that exist against the fallback's result).
struct Row {
  std::vector<const char*> stubs;
  bool cuda_optional;
  void (KernelCoverageTest::*run)();
};

const std::vector<Row>& Rows() {
  using T = KernelCoverageTest;
  static const std::vector<Row> rows = {
      {{"TriangleKernel"}, false, &T::Triangle},
      {{"SoftmaxKernel"}, false, &T::Softmax},
      {{"CrossEntropyForwardKernel", "CrossEntropyBackwardKernel"}, false, &T::CrossEntropy},
      {{"GatherColumnsKernel", "ScatterAddColumnsKernel"}, false, &T::GatherAndScatterAddColumns},
      {{"GatherKernel", "ScatterAddKernel"}, false, &T::GatherAndScatterAdd},
      {{"Im2ColKernel", "Col2ImKernel"}, false, &T::Im2ColAndCol2Im},
      {{"Conv2dForwardKernel", "Conv2dBackwardDataKernel", "Conv2dBackwardWeightsKernel"},
       true,
       &T::DirectConvolution},
      {{"MaxPool2dKernel", "MaxPool2dBackwardKernel"}, false, &T::MaxPool},
      {{"AvgPool2dKernel", "AvgPool2dBackwardKernel"}, false, &T::AvgPool},
      {{"AdaptiveAvgPool2dKernel", "AdaptiveAvgPool2dBackwardKernel"}, false, &T::AdaptiveAvgPool},
      {{"RowNormKernel", "RowNormBackwardKernel"}, false, &T::RowNorms},
      {{"AttentionForwardKernel", "AttentionBackwardKernel"}, false, &T::Attention},
      {{"FusedSgdKernel"}, false, &T::FusedSgd},
      {{"FusedAdamKernel"}, false, &T::FusedAdam},
      {{"FusedRmspropKernel"}, false, &T::FusedRmsprop},
      {{"ForeachCastKernel"}, false, &T::ForeachCast},
  };
  return rows;
}

const Row* FindRow(const std::string& stub) {
  for (const Row& row : Rows()) {
    for (const char* name : row.stubs) {
      if (stub == name) return &row;
    }
  }
  return nullptr;
}

// Needs no GPU: registration happens at static initialisation whether or not one is usable.
TEST(KernelCoverageRegistryTest, EveryStubHasARowAndItsKernels) {
  const std::vector<const KernelStubBase*>& stubs = AllKernelStubs();
  ASSERT_FALSE(stubs.empty()) << "no KernelStub is linked in: is :cuda_backend missing?";
  for (const KernelStubBase* stub : stubs) {
    const Row* row = FindRow(stub->name());
    EXPECT_NE(row, nullptr) << stub->name()
                            << " has no row in kernel_coverage_test.cc's table: add one that runs "
                               "it on cuda:0 and on the CPU in every dtype it claims";
    EXPECT_TRUE(stub->has(DeviceType::kCPU))
        << stub->name() << " has no CPU kernel (registered: " << stub->registered_types()
        << "); the CPU is every kernel's oracle: register one beside the CPU code";
    if (row == nullptr || !row->cuda_optional) {
      EXPECT_TRUE(stub->has(DeviceType::kCUDA))
          << stub->name() << " has no CUDA kernel (registered: " << stub->registered_types()
          << "); register one in tensor/cuda/ beside its launcher, or mark the row optional if "
             "the op falls back without it";
    }
  }
  // And no row outlives its stub.
  for (const Row& row : Rows()) {
    for (const char* name : row.stubs) {
      const bool defined = std::any_of(stubs.begin(), stubs.end(), [&](const KernelStubBase* s) {
        return std::string(s->name()) == name;
      });
      EXPECT_TRUE(defined) << "the table has a row for " << name << ", which is not a stub";
    }
  }
}

TEST_F(KernelCoverageTest, EveryKernelMatchesTheCpu) {
  for (const Row& row : Rows()) {
    SCOPED_TRACE(row.stubs.front());
    (this->*row.run)();
  }
}

// ---- The rows -------------------------------------------------------------------------------

void KernelCoverageTest::Triangle() {
  // Any dtype: the kernel moves bits.
  const auto run = [&](auto tag, DType dtype) {
    using T = typename decltype(tag)::type;
    const int64_t batch = 2, rows = 5, cols = 7, n = batch * rows * cols;
    Buffer<T> src(Rounded<T>(RandomIntegers<float>(n, 0, 1)), dtype), dst(n, dtype);
    for (bool lower : {false, true}) {
      TriangleKernel(kCpu, dtype, lower, -1, batch, rows, cols, src.cpu(), dst.cpu());
      TriangleKernel(kCuda, dtype, lower, -1, batch, rows, cols, src.gpu(), dst.gpu());
      ExpectBitwiseEqual(dst.Cpu(), dst.Gpu(), Note(std::string(DTypeName(dtype)) + " triangle"));
    }
  };
  struct Tag8 {
    using type = uint8_t;
  };
  struct Tag32 {
    using type = int32_t;
  };
  struct Tag64 {
    using type = int64_t;
  };
  ForEachFloatingType([&](auto tag) { run(tag, DTypeOf<typename decltype(tag)::type>::value); });
  run(Tag8{}, kBool);
  run(Tag8{}, kUInt8);
  run(Tag32{}, kInt32);
  run(Tag64{}, kInt64);
}

void KernelCoverageTest::Softmax() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    const int64_t outer = 3, dim = 17, inner = 2, n = outer * dim * inner;
    Buffer<T> x(Values<T>(n)), y(n);
    for (bool log : {false, true}) {
      SoftmaxKernel(kCpu, dtype, log, y.cpu(), x.cpu(), outer, dim, inner);
      SoftmaxKernel(kCuda, dtype, log, y.gpu(), x.gpu(), outer, dim, inner);
      ExpectClose(y, log ? "log_softmax" : "softmax");
    }
  });
}

void KernelCoverageTest::CrossEntropy() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value;
    const int64_t rows = 5, cols = 37;
    Buffer<T> logits(Values<T>(rows * cols, -4.0, 4.0)), grad_logits(rows * cols);
    Buffer<M> loss(rows), lse(rows), grad(Values<M>(1, 0.5, 1.5));
    Buffer<int64_t> targets(RandomInts(rows, 0, cols - 1));
    for (const Device device : {kCpu, kCuda}) {
      const bool gpu = device.is_cuda();
      CrossEntropyForwardKernel(device, dtype, gpu ? loss.gpu() : loss.cpu(),
                                gpu ? lse.gpu() : lse.cpu(), gpu ? logits.gpu() : logits.cpu(),
                                gpu ? targets.gpu() : targets.cpu(), rows, cols, "test");
      CrossEntropyBackwardKernel(device, dtype, gpu ? grad_logits.gpu() : grad_logits.cpu(),
                                 gpu ? logits.gpu() : logits.cpu(), gpu ? lse.gpu() : lse.cpu(),
                                 gpu ? targets.gpu() : targets.cpu(), gpu ? grad.gpu() : grad.cpu(),
                                 1.0 / rows, rows, cols);
    }
    ExpectClose(loss, "cross-entropy loss");
    ExpectNear(lse.Cpu(), lse.Gpu(), Rtol<M>(), Atol<M>(), Note(DTypePrefix<T>() + "lse"));
    ExpectClose(grad_logits, "cross-entropy grad_logits");
  });
}

void KernelCoverageTest::GatherAndScatterAddColumns() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    const int64_t rows = 9, cols = 5;
    Buffer<T> table(Integers<T>(rows * cols)), picked(rows);
    Buffer<int64_t> idx(RandomInts(rows, 0, cols - 1));
    GatherColumnsKernel(kCpu, dtype, picked.cpu(), table.cpu(), idx.cpu(), rows, cols, "test");
    GatherColumnsKernel(kCuda, dtype, picked.gpu(), table.gpu(), idx.gpu(), rows, cols, "test");
    ExpectBitwiseEqual(picked.Cpu(), picked.Gpu(), Note(DTypePrefix<T>() + "gather columns"));
    ScatterAddColumnsKernel(kCpu, dtype, table.cpu(), picked.cpu(), idx.cpu(), rows, cols);
    ScatterAddColumnsKernel(kCuda, dtype, table.gpu(), picked.gpu(), idx.gpu(), rows, cols);
    ExpectBitwiseEqual(table.Cpu(), table.Gpu(), Note(DTypePrefix<T>() + "scatter-add columns"));
  });
}

void KernelCoverageTest::GatherAndScatterAdd() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    const int64_t outer = 3, dim = 4, idx_dim = 6, inner = 5;
    const int64_t n_idx = outer * idx_dim * inner, n_src = outer * dim * inner;
    Buffer<T> src(Integers<T>(n_src)), gathered(n_idx);
    // Repeated indices: the scatter-add sums several values into one element (integers, so
    // the order of the additions does not matter).
    Buffer<int64_t> idx(RandomInts(n_idx, 0, dim - 1));
    GatherKernel(kCpu, dtype, gathered.cpu(), src.cpu(), idx.cpu(), outer, dim, idx_dim, inner,
                 "test");
    GatherKernel(kCuda, dtype, gathered.gpu(), src.gpu(), idx.gpu(), outer, dim, idx_dim, inner,
                 "test");
    ExpectBitwiseEqual(gathered.Cpu(), gathered.Gpu(), Note(DTypePrefix<T>() + "gather"));
    ScatterAddKernel(kCpu, dtype, src.cpu(), gathered.cpu(), idx.cpu(), outer, dim, idx_dim, inner);
    ScatterAddKernel(kCuda, dtype, src.gpu(), gathered.gpu(), idx.gpu(), outer, dim, idx_dim,
                     inner);
    ExpectBitwiseEqual(src.Cpu(), src.Gpu(), Note(DTypePrefix<T>() + "scatter-add"));
  });
}

// A small padded, strided, dilated geometry for the convolution and pooling rows.
Conv2dGeometry SmallGeometry() {
  Conv2dGeometry g = Conv2dGeometry::Make(2, 3, 7, 6, 3, 2, 2, 1, 1, 1);
  g.dilation_h = 1;
  return g;
}

void KernelCoverageTest::Im2ColAndCol2Im() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    for (bool batch_in_columns : {false, true}) {
      Conv2dGeometry g = SmallGeometry();
      g.dilation_w = 2;
      g.batch_in_columns = batch_in_columns;
      const size_t image = g.batch * g.channels * g.height * g.width;
      const size_t columns = g.batch * g.channels * g.kernel_h * g.kernel_w * g.out_h() * g.out_w();
      Buffer<T> x(Integers<T>(image)), cols(columns), back(image);
      Im2ColKernel(kCpu, dtype, g, x.cpu(), cols.cpu());
      Im2ColKernel(kCuda, dtype, g, x.gpu(), cols.gpu());
      ExpectBitwiseEqual(cols.Cpu(), cols.Gpu(), Note(DTypePrefix<T>() + "im2col"));
      Col2ImKernel(kCpu, dtype, g, cols.cpu(), back.cpu());
      Col2ImKernel(kCuda, dtype, g, cols.gpu(), back.gpu());
      ExpectBitwiseEqual(back.Cpu(), back.Gpu(), Note(DTypePrefix<T>() + "col2im"));
    }
  });
}

// The optional direct convolutions, against what conv2d computes without them: im2col and a
// GEMM (and col2im), on the CPU. Small integer inputs make every sum exact, so a kernel that
// takes the call must match bit for bit; one that declines must have written nothing.
void KernelCoverageTest::DirectConvolution() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    const Conv2dGeometry g = SmallGeometry();
    const int64_t out_channels = 4, plane = g.out_h() * g.out_w();
    const int64_t patch = g.channels * g.kernel_h * g.kernel_w;
    const size_t image = g.batch * g.channels * g.height * g.width;
    const size_t out = g.batch * out_channels * plane, weights = out_channels * patch;
    Buffer<T> x(Integers<T>(image)), w(Integers<T>(weights)), bias(Integers<T>(out_channels)),
        dy(Integers<T>(out));
    // The fallback's results (CPU only: these buffers' GPU halves stay poisoned).
    Buffer<T> cols(g.batch * patch * plane), y(out), dx(image), dw(weights), dcols(cols.size());
    Im2ColKernel(kCpu, dtype, g, x.cpu(), cols.cpu());
    Backend& cpu = GetBackend(kCpu);
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t o = 0; o < out_channels; ++o) {
        std::fill(y.cpu() + (b * out_channels + o) * plane,
                  y.cpu() + (b * out_channels + o + 1) * plane, bias.Cpu()[o]);
      }
    }
    cpu.Gemm(0, dtype, false, false, out_channels, plane, patch, 1.0, w.cpu(), patch, 0, cols.cpu(),
             plane, patch * plane, 1.0, y.cpu(), plane, out_channels * plane, g.batch);
    cpu.Gemm(0, dtype, true, false, patch, plane, out_channels, 1.0, w.cpu(), patch, 0, dy.cpu(),
             plane, out_channels * plane, 0.0, dcols.cpu(), plane, patch * plane, g.batch);
    Col2ImKernel(kCpu, dtype, g, dcols.cpu(), dx.cpu());
    std::vector<T> dw_sum(weights, T(0));
    for (int64_t b = 0; b < g.batch; ++b) {
      std::vector<T> part(weights);
      cpu.Gemm(0, dtype, false, true, out_channels, patch, plane, 1.0,
               dy.cpu() + b * out_channels * plane, plane, 0, cols.cpu() + b * patch * plane, plane,
               0, 0.0, part.data(), patch, 0, 1);
      for (size_t i = 0; i < weights; ++i) dw_sum[i] = T(float(dw_sum[i]) + float(part[i]));
    }
    std::vector<T> db_sum(out_channels, T(0));
    for (int64_t b = 0; b < g.batch; ++b) {
      for (int64_t o = 0; o < out_channels; ++o) {
        for (int64_t p = 0; p < plane; ++p) {
          db_sum[o] = T(float(db_sum[o]) + float(dy.Cpu()[(b * out_channels + o) * plane + p]));
        }
      }
    }
    for (const Device device : {kCpu, kCuda}) {
      const bool gpu = device.is_cuda();
      const std::string what = DTypePrefix<T>() + device.ToString() + " ";
      auto at = [&](Buffer<T>& buffer) { return gpu ? buffer.gpu() : buffer.cpu(); };
      auto read = [&](const Buffer<T>& buffer) { return gpu ? buffer.Gpu() : buffer.Cpu(); };
      if (const auto forward = Conv2dForwardKernel.Find(device.type())) {
        Buffer<T> got(out);
        if (forward(0, dtype, g, out_channels, at(x), at(w), at(bias), at(got))) {
          ExpectBitwiseEqual(y.Cpu(), read(got), Note(what + "conv2d forward"));
        } else {
          ExpectBitwiseEqual(std::vector<T>(out, Poison<T>()), read(got),
                             Note(what + "declined conv2d forward wrote"));
        }
      }
      if (const auto data = Conv2dBackwardDataKernel.Find(device.type())) {
        Buffer<T> got(image);
        if (data(0, dtype, g, out_channels, at(dy), at(w), at(got))) {
          ExpectBitwiseEqual(dx.Cpu(), read(got), Note(what + "conv2d grad_input"));
        } else {
          ExpectBitwiseEqual(std::vector<T>(image, Poison<T>()), read(got),
                             Note(what + "declined conv2d grad_input wrote"));
        }
      }
      if (const auto weight = Conv2dBackwardWeightsKernel.Find(device.type())) {
        Buffer<T> got(weights), got_bias(out_channels);
        if (weight(0, dtype, g, out_channels, at(x), at(dy), at(got), at(got_bias))) {
          ExpectBitwiseEqual(dw_sum, read(got), Note(what + "conv2d grad_weight"));
          ExpectBitwiseEqual(db_sum, read(got_bias), Note(what + "conv2d grad_bias"));
        } else {
          ExpectBitwiseEqual(std::vector<T>(weights, Poison<T>()), read(got),
                             Note(what + "declined conv2d grad_weight wrote"));
        }
      }
    }
  });
}

void KernelCoverageTest::MaxPool() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    Conv2dGeometry g = SmallGeometry();
    g.ceil_mode = true;
    const size_t image = g.batch * g.channels * g.height * g.width;
    const size_t out = g.batch * g.channels * g.out_h() * g.out_w();
    // Integers: ties, which both must break towards the earlier tap.
    Buffer<T> x(Integers<T>(image)), y(out), dy(Integers<T>(out)), dx(image);
    Buffer<int64_t> argmax(out);
    MaxPool2dKernel(kCpu, dtype, g, x.cpu(), y.cpu(), argmax.cpu());
    MaxPool2dKernel(kCuda, dtype, g, x.gpu(), y.gpu(), argmax.gpu());
    ExpectBitwiseEqual(y.Cpu(), y.Gpu(), Note(DTypePrefix<T>() + "max_pool2d"));
    ExpectEqual(argmax.Cpu(), argmax.Gpu(), Note(DTypePrefix<T>() + "max_pool2d argmax"));
    MaxPool2dBackwardKernel(kCpu, dtype, g, dy.cpu(), argmax.cpu(), dx.cpu());
    MaxPool2dBackwardKernel(kCuda, dtype, g, dy.gpu(), argmax.gpu(), dx.gpu());
    ExpectBitwiseEqual(dx.Cpu(), dx.Gpu(), Note(DTypePrefix<T>() + "max_pool2d backward"));
  });
}

void KernelCoverageTest::AvgPool() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    const Conv2dGeometry g = SmallGeometry();
    const size_t image = g.batch * g.channels * g.height * g.width;
    const size_t out = g.batch * g.channels * g.out_h() * g.out_w();
    Buffer<T> x(Values<T>(image)), y(out), dy(Values<T>(out)), dx(image);
    for (bool count_include_pad : {false, true}) {
      AvgPool2dKernel(kCpu, dtype, g, count_include_pad, x.cpu(), y.cpu());
      AvgPool2dKernel(kCuda, dtype, g, count_include_pad, x.gpu(), y.gpu());
      ExpectClose(y, "avg_pool2d");
      AvgPool2dBackwardKernel(kCpu, dtype, g, count_include_pad, dy.cpu(), dx.cpu());
      AvgPool2dBackwardKernel(kCuda, dtype, g, count_include_pad, dy.gpu(), dx.gpu());
      ExpectClose(dx, "avg_pool2d backward");
    }
  });
}

void KernelCoverageTest::AdaptiveAvgPool() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    const DType dtype = DTypeOf<T>::value;
    const int64_t planes = 3, height = 7, width = 5, out_h = 3, out_w = 4;
    Buffer<T> x(Values<T>(planes * height * width)), y(planes * out_h * out_w);
    Buffer<T> dy(Values<T>(y.size())), dx(x.size());
    AdaptiveAvgPool2dKernel(kCpu, dtype, planes, height, width, out_h, out_w, x.cpu(), y.cpu());
    AdaptiveAvgPool2dKernel(kCuda, dtype, planes, height, width, out_h, out_w, x.gpu(), y.gpu());
    ExpectClose(y, "adaptive_avg_pool2d");
    AdaptiveAvgPool2dBackwardKernel(kCpu, dtype, planes, height, width, out_h, out_w, dy.cpu(),
                                    dx.cpu());
    AdaptiveAvgPool2dBackwardKernel(kCuda, dtype, planes, height, width, out_h, out_w, dy.gpu(),
                                    dx.gpu());
    ExpectClose(dx, "adaptive_avg_pool2d backward");
  });
}

void KernelCoverageTest::RowNorms() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value;
    const int64_t rows = 6, cols = 37;
    const size_t n = rows * cols;
    Buffer<T> x(Values<T>(n, 1.0, 3.0)), weight(Values<T>(cols)), bias(Values<T>(cols)),
        dy(Values<T>(n)), y(n), dx(n), dw(cols), db(cols);
    Buffer<M> mean(rows), rstd(rows);
    for (bool rms : {false, true}) {
      const std::string what = rms ? "rms_norm " : "layer_norm ";
      T* no_bias = nullptr;
      RowNormKernel(kCpu, dtype, dtype, rms, rows, cols, 1e-5, x.cpu(), nullptr, weight.cpu(),
                    rms ? no_bias : bias.cpu(), y.cpu(), nullptr, mean.cpu(), rstd.cpu());
      RowNormKernel(kCuda, dtype, dtype, rms, rows, cols, 1e-5, x.gpu(), nullptr, weight.gpu(),
                    rms ? no_bias : bias.gpu(), y.gpu(), nullptr, mean.gpu(), rstd.gpu());
      ExpectClose(y, what + "y");
      ExpectNear(rstd.Cpu(), rstd.Gpu(), Rtol<M>(), Atol<M>(), Note(what + "rstd"));
      RowNormBackwardKernel(kCpu, dtype, dtype, rms, rows, cols, dy.cpu(), nullptr, x.cpu(),
                            mean.cpu(), rstd.cpu(), weight.cpu(), dx.cpu(), nullptr, dw.cpu(),
                            db.cpu());
      RowNormBackwardKernel(kCuda, dtype, dtype, rms, rows, cols, dy.gpu(), nullptr, x.gpu(),
                            mean.gpu(), rstd.gpu(), weight.gpu(), dx.gpu(), nullptr, dw.gpu(),
                            db.gpu());
      // The 16-bit gradients round values that cancel: an ulp of their inputs' size.
      ExpectNear(dx.Cpu(), dx.Gpu(), Rtol<T>(), 4 * Atol<T>(), Note(what + "grad_x"));
      ExpectNear(dw.Cpu(), dw.Gpu(), Rtol<T>(), 4 * Atol<T>(), Note(what + "grad_weight"));
      ExpectNear(db.Cpu(), db.Gpu(), Rtol<T>(), 4 * Atol<T>(), Note(what + "grad_bias"));
    }
  });
}

void KernelCoverageTest::Attention() {
  ForEachFloatingType([&](auto tag) {
    using T = typename decltype(tag)::type;
    using M = OpMath<T>;
    const DType dtype = DTypeOf<T>::value;
    AttentionGeometry g;
    g.batch = 2, g.query_len = 5, g.key_len = 7, g.head_dim = 8, g.value_dim = 4;
    g.scale = 1.0 / std::sqrt(8.0);
    g.causal = true;
    const size_t nq = g.batch * g.query_len * g.head_dim, nk = g.batch * g.key_len * g.head_dim;
    const size_t nv = g.batch * g.key_len * g.value_dim, no = g.batch * g.query_len * g.value_dim;
    Buffer<T> q(Values<T>(nq)), k(Values<T>(nk)), v(Values<T>(nv)), out(no), dout(Values<T>(no));
    Buffer<T> dq(nq), dk(nk), dv(nv);
    Buffer<M> lse(g.batch * g.query_len);
    const T* no_mask = nullptr;
    AttentionForwardKernel(kCpu, dtype, g, q.cpu(), k.cpu(), v.cpu(), no_mask, out.cpu(),
                           lse.cpu());
    AttentionForwardKernel(kCuda, dtype, g, q.gpu(), k.gpu(), v.gpu(), no_mask, out.gpu(),
                           lse.gpu());
    // Tiles of the online softmax sum in another order on each device.
    ExpectNear(out.Cpu(), out.Gpu(), 2 * Rtol<T>(), 2 * Atol<T>(),
               Note(DTypePrefix<T>() + "attention out"));
    ExpectNear(lse.Cpu(), lse.Gpu(), Rtol<M>(), Atol<M>(), Note(DTypePrefix<T>() + "logsumexp"));
    // Both backwards from the CPU's forward, so that only the backward is compared.
    Buffer<T> saved_out(out.Cpu());
    Buffer<M> saved_lse(lse.Cpu());
    AttentionBackwardKernel(kCpu, dtype, g, q.cpu(), k.cpu(), v.cpu(), no_mask, saved_out.cpu(),
                            dout.cpu(), saved_lse.cpu(), dq.cpu(), dk.cpu(), dv.cpu());
    AttentionBackwardKernel(kCuda, dtype, g, q.gpu(), k.gpu(), v.gpu(), no_mask, saved_out.gpu(),
                            dout.gpu(), saved_lse.gpu(), dq.gpu(), dk.gpu(), dv.gpu());
    for (auto* grad : {&dq, &dk, &dv}) {
      ExpectNear(grad->Cpu(), grad->Gpu(), 4 * Rtol<T>(), 4 * Atol<T>(),
                 Note(DTypePrefix<T>() + "attention gradient"));
    }
  });
}

// The fused optimizers are bitwise the CPU's (tensor/cuda/fused_optimizers_test.cc has every
// case on more sizes): here each case of the kind on a few sizes, in every floating dtype.
void KernelCoverageTest::FusedOptimizer(testing::OptimizerCase::Kind kind) {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    for (const testing::OptimizerCase& c : testing::AllOptimizerCases()) {
      if (c.kind != kind) continue;
      testing::CaseTensors on_cpu = testing::MakeCaseTensors(c, {1, 300}, dtype, kCpu);
      testing::CaseTensors on_gpu = testing::MakeCaseTensors(c, {1, 300}, dtype, kCuda);
      testing::RunCase(c, on_cpu);
      testing::RunCase(c, on_gpu);
      const std::vector<Tensor> cpu = on_cpu.Written(), gpu = on_gpu.Written();
      ASSERT_EQ(cpu.size(), gpu.size());
      for (size_t i = 0; i < cpu.size(); ++i) {
        const Tensor a = cpu[i].contiguous(), b = gpu[i].to(kCpu).contiguous();
        const size_t bytes = a.numel() * ElementSize(dtype);
        EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), bytes), 0)
            << DTypeName(dtype) << " " << c.name << ": written tensor " << i
            << " differs from the CPU's";
      }
    }
  }
}

// The multi-tensor cast is bitwise the CPU's (both round to nearest even as Tensor::to does):
// a few tensors, one of them empty and one of more than a chunk, with ties, subnormals,
// overflow to infinity and NaN among random values, to bfloat16 and to float16.
void KernelCoverageTest::ForeachCast() {
  const std::vector<int64_t> sizes = {300, 0, 1, 70000};
  std::vector<std::vector<float>> values;
  for (int64_t n : sizes) {
    std::vector<float> v = Random<float>(static_cast<size_t>(n), -70000.0, 70000.0);
    const float specials[] = {1.00390625f,   65520.0f,
                              1e-40f,        -5.9604645e-8f,
                              3.3895314e38f, std::numeric_limits<float>::quiet_NaN(),
                              -0.0f};
    for (size_t i = 0; i < v.size() && i < 7; ++i) v[i * v.size() / 7] = specials[i];
    values.push_back(std::move(v));
  }
  for (DType dtype : {kBFloat16, kFloat16}) {
    std::vector<Tensor> cpu_src, gpu_src, cpu_dst, gpu_dst;
    std::vector<ForeachCastTensor> on_cpu, on_gpu;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      cpu_src.push_back(from_vector(values[k], {n}));
      gpu_src.push_back(cpu_src.back().to(kCuda));
      cpu_dst.push_back(empty({n}, TensorOptions(dtype)));
      gpu_dst.push_back(empty({n}, TensorOptions(dtype).device(kCuda)));
      on_cpu.push_back({n, cpu_src.back().data_ptr(), cpu_dst.back().data_ptr()});
      on_gpu.push_back({n, gpu_src.back().data_ptr(), gpu_dst.back().data_ptr()});
    }
    RunForeachCast(kCpu, kFloat32, dtype, on_cpu);
    RunForeachCast(kCuda, kFloat32, dtype, on_gpu);
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Tensor a = cpu_dst[k], b = gpu_dst[k].to(kCpu), to = cpu_src[k].to(dtype);
      const size_t bytes = a.numel() * ElementSize(dtype);
      EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), bytes), 0)
          << DTypeName(dtype) << " tensor " << k << ": the GPU's cast differs from the CPU's";
      EXPECT_EQ(std::memcmp(a.data_ptr(), to.data_ptr(), bytes), 0)
          << DTypeName(dtype) << " tensor " << k << ": the cast differs from Tensor::to's";
    }
  }
  std::string error;
  try {
    RunForeachCast(kCuda, kFloat64, kBFloat16, {});
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("float32 to bfloat16 or float16"), std::string::npos) << error;
}

}  // namespace
}  // namespace cuda_test
}  // namespace tandem
