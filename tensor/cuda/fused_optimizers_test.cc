// The fused optimizer steps on cuda:0 against the CPU's, bit for bit: both run the element
// functions of tensor/kernels/internal/optimizer_math.h in the same order, and
// optimizer_kernels.cu is compiled without FMA contraction. Every case of
// tensor/ops/fused_optimizers_testing.h, in every floating dtype. Skips where there is no usable
// GPU (runs under --config=cudasim).
#include "tensor/ops/fused_optimizers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/cuda/cuda.h"
#include "tensor/ops/fused_optimizers_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using testing::AllOptimizerCases;
using testing::CaseTensors;
using ::testing::HasSubstr;
using testing::MakeCaseTensors;
using testing::OptimizerCase;
using testing::RunCase;

constexpr Device kCpu = Device::Cpu(0);
constexpr Device kCuda = Device::Cuda(0);

class FusedOptimizersCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount(DeviceType::kCUDA) == 0) {
      GTEST_SKIP() << "no usable CUDA device: " << cuda::UnavailableReason();
    }
  }
};

// The bytes of `t` (on any device), to compare bit for bit.
std::vector<char> Bytes(const Tensor& t) {
  const Tensor host = t.to(kCpu).contiguous();
  const char* data = static_cast<const char*>(host.data_ptr());
  return std::vector<char>(data, data + host.numel() * ElementSize(host.dtype()));
}

void ExpectBitwiseTheCpus(const OptimizerCase& c, const std::vector<int64_t>& sizes, DType dtype,
                          const std::string& what) {
  CaseTensors on_cpu = MakeCaseTensors(c, sizes, dtype, kCpu);
  CaseTensors on_gpu = MakeCaseTensors(c, sizes, dtype, kCuda);
  RunCase(c, on_cpu);
  RunCase(c, on_gpu);
  const std::vector<Tensor> cpu = on_cpu.Written(), gpu = on_gpu.Written();
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t k = 0; k < cpu.size(); ++k) {
    EXPECT_EQ(Bytes(cpu[k]), Bytes(gpu[k]))
        << what << ", " << c.name << ": written tensor " << k << " of " << cpu[k].numel()
        << " elements differs from the CPU's";
  }
}

// Each case on tensors of several sizes in one call (one past 65536, several not multiples of
// the block, an empty one), in float32 and float64.
TEST_F(FusedOptimizersCudaTest, EveryCaseIsBitwiseTheCpus) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const OptimizerCase& c : AllOptimizerCases()) {
      ExpectBitwiseTheCpus(c, {1, 255, 0, 1000, 70001}, dtype, DTypeName(dtype));
    }
  }
}

// bfloat16 and float16 load as float, compute in float and round each stored value: the CPU
// does the same (tensor/ops/fused_optimizers_test.cc checks it against float32).
TEST_F(FusedOptimizersCudaTest, SixteenBitCasesAreBitwiseTheCpus) {
  for (DType dtype : {kBFloat16, kFloat16}) {
    for (const OptimizerCase& c : AllOptimizerCases()) {
      ExpectBitwiseTheCpus(c, {1, 255, 1000}, dtype, DTypeName(dtype));
    }
  }
}

TEST_F(FusedOptimizersCudaTest, EdgeCases) {
  EXPECT_TRUE(FusedSgdKernel.has(DeviceType::kCUDA));
  EXPECT_TRUE(FusedAdamKernel.has(DeviceType::kCUDA));
  EXPECT_TRUE(FusedRmspropKernel.has(DeviceType::kCUDA));
  FusedAdamOptions adam;
  RunFusedAdam(kCuda, kFloat32, adam, {});                   // nothing to do
  RunFusedAdam(kCuda, kFloat64, adam, {FusedAdamTensor{}});  // numel 0, no tensors: also nothing
  EXPECT_THAT(testing::ErrorOf([&] { RunFusedAdam(kCuda, kInt64, adam, {}); }),
              HasSubstr("FusedAdamKernel: expected a floating dtype"));
  // A missing state is an error on the host, not a fault on the GPU.
  Tensor p = ones({8}, TensorOptions().device(kCuda)), g = ones({8}, TensorOptions().device(kCuda));
  FusedAdamTensor t;
  t.numel = 8;
  t.param = p.data_ptr();
  t.grad = g.data_ptr();
  t.exp_avg = g.data_ptr();
  EXPECT_THAT(testing::ErrorOf([&] { RunFusedAdam(kCuda, kFloat32, adam, {t}); }),
              HasSubstr("needs exp_avg_sq"));
  EXPECT_EQ(p.to(kCpu).to_vector<float>(), std::vector<float>(8, 1.0f));  // nothing ran
  // Parameters on two devices in one call: each device's kernel steps its own.
  Tensor on_cpu = ones({4}), on_gpu = ones({4}, TensorOptions().device(kCuda));
  FusedSgdOptions sgd;
  sgd.lr = 0.5;
  fused_sgd_({on_cpu, on_gpu}, {ones({4}), ones({4}, TensorOptions().device(kCuda))}, {}, sgd);
  EXPECT_EQ(on_cpu.to_vector<float>(), std::vector<float>(4, 0.5f));
  EXPECT_EQ(on_gpu.to(kCpu).to_vector<float>(), std::vector<float>(4, 0.5f));
}

}  // namespace
}  // namespace tandem
