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
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensor/cuda/cuda.h"
#include "tensor/cuda/optimizer_kernels.h"
#include "tensor/ops/fused_optimizers_testing.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"
#include "tools/cuda/device_counters.h"

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

// Each case on tensors of several sizes in one call (one of several chunks, several not multiples
// of the block, an empty one), in float32 and float64.
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

// Tensor k of every list of `t`, alone: the per-tensor path.
CaseTensors Only(const CaseTensors& t, size_t k) {
  CaseTensors one;
  one.params = {t.params[k]};
  one.grads = {t.grads[k]};
  for (const auto& list : t.states) {
    one.states.push_back(list.empty() ? std::vector<Tensor>{} : std::vector<Tensor>{list[k]});
  }
  one.steps = {t.steps[k]};
  return one;
}

// Odd sizes (1, 7, one past a 16384-element chunk, an empty one) and 100 small tensors: more
// than one launch's list for every optimizer, so tensors land in different launches, slots and
// blocks. One multi-tensor call equals the CPU and one call per tensor, bit for bit.
TEST_F(FusedOptimizersCudaTest, ManyTensorsInFewLaunchesAreBitwiseOneByOneAndTheCpus) {
  std::vector<int64_t> sizes = {1, 7, 16385, 0, 255};
  for (int k = 0; k < 100; ++k) sizes.push_back((k * 37) % 97 + 1);
  std::vector<FusedSgdTensor> sgd(sizes.size());
  std::vector<FusedRmspropTensor> rmsprop(sizes.size());
  std::vector<FusedAdamTensor> adam(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k)
    sgd[k].numel = rmsprop[k].numel = adam[k].numel = sizes[k];
  // 104 non-empty tensors: two lists each (93 a launch for SGD, 67 for RMSprop, 59 for Adam in
  // float32 and 16-bit, 53 in float64).
  EXPECT_EQ(cuda::CountFusedSgdLaunches(sgd), 2);
  EXPECT_EQ(cuda::CountFusedRmspropLaunches(rmsprop), 2);
  EXPECT_EQ(cuda::CountFusedAdamLaunches(kFloat32, {}, adam), 2);
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (const OptimizerCase& c : AllOptimizerCases()) {
      CaseTensors on_cpu = MakeCaseTensors(c, sizes, dtype, kCpu);
      CaseTensors together = MakeCaseTensors(c, sizes, dtype, kCuda);
      CaseTensors one_by_one = MakeCaseTensors(c, sizes, dtype, kCuda);
      RunCase(c, on_cpu);
      RunCase(c, together);
      for (size_t k = 0; k < sizes.size(); ++k) {
        CaseTensors one = Only(one_by_one, k);
        RunCase(c, one);
      }
      const std::vector<Tensor> cpu = on_cpu.Written(), gpu = together.Written(),
                                single = one_by_one.Written();
      ASSERT_EQ(cpu.size(), gpu.size());
      ASSERT_EQ(cpu.size(), single.size());
      for (size_t k = 0; k < cpu.size(); ++k) {
        const std::vector<char> expected = Bytes(cpu[k]);
        EXPECT_EQ(expected, Bytes(gpu[k]))
            << DTypeName(dtype) << ", " << c.name << ": written tensor " << k << " of "
            << cpu[k].numel() << " elements, stepped in one call, differs from the CPU's";
        EXPECT_EQ(expected, Bytes(single[k]))
            << DTypeName(dtype) << ", " << c.name << ": written tensor " << k << " of "
            << cpu[k].numel() << " elements, stepped alone, differs from the CPU's";
      }
    }
  }
}

// GPT-2 124M's 148 parameters (token and position embeddings, 12 blocks of two LayerNorms,
// attention and MLP weights and biases, the final LayerNorm), as nn::AdamW hands them to one
// fused_adam_ call: three launches a step (59 tensors a list), where there was one per tensor.
TEST_F(FusedOptimizersCudaTest, GptTwoAdamWStepIsThreeLaunches) {
  constexpr int64_t kEmbd = 768;
  std::vector<int64_t> sizes = {50257 * kEmbd, 1024 * kEmbd};
  for (int layer = 0; layer < 12; ++layer) {
    for (int64_t n : {kEmbd, kEmbd, kEmbd * 3 * kEmbd, 3 * kEmbd, kEmbd * kEmbd, kEmbd, kEmbd,
                      kEmbd, kEmbd * 4 * kEmbd, 4 * kEmbd, 4 * kEmbd * kEmbd, kEmbd}) {
      sizes.push_back(n);
    }
  }
  sizes.push_back(kEmbd);
  sizes.push_back(kEmbd);
  ASSERT_EQ(sizes.size(), 148u);
  std::vector<FusedAdamTensor> tensors(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) tensors[k].numel = sizes[k];
  FusedAdamOptions adamw;
  adamw.decoupled_weight_decay = true;
  for (DType dtype : {kFloat32, kBFloat16}) {
    EXPECT_EQ(cuda::CountFusedAdamLaunches(dtype, adamw, tensors), 3) << DTypeName(dtype);
  }
  EXPECT_EQ(cuda::CountFusedAdamLaunches(kFloat64, adamw, tensors), 3);  // 53 a list
}

// Each update declares its work for train_step's roofline (tools/cuda/device_counters.h): the
// elements' state read and written once, in the dtype's bytes. Counted under cudasim only.
TEST_F(FusedOptimizersCudaTest, UpdatesDeclareTheStateTheyMove) {
  const Device gpu = Device::Cuda(0);
  // The work of the one kernel `step` launches on cuda:0, or nullopt where nothing is counted.
  const auto work_of = [&](const std::function<void()>& step) -> std::optional<KernelLaunches> {
    cuda::Synchronize(0);
    ResetDeviceCounters();
    step();
    cuda::Synchronize(0);
    const DeviceCounters c = ReadDeviceCounters();
    if (!c.counted) return std::nullopt;
    EXPECT_EQ(c.kernels.size(), 1u);
    return c.kernels.empty() ? std::nullopt : std::optional<KernelLaunches>(c.kernels[0]);
  };
  const std::vector<int64_t> sizes = {1000, 37, 4096};
  const double elements = 1000 + 37 + 4096;
  for (DType dtype : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const auto make = [&] {
      std::vector<Tensor> list;
      for (int64_t n : sizes) list.push_back(zeros({n}, TensorOptions(dtype).device(gpu)));
      return list;
    };
    const std::vector<Tensor> p = make(), g = make(), m = make(), v = make(), vmax = make();
    const double bytes = static_cast<double>(ElementSize(dtype));
    for (bool amsgrad : {false, true}) {
      FusedAdamOptions adam;
      adam.amsgrad = amsgrad;
      const auto k = work_of([&] { fused_adam_(p, g, m, v, vmax, {1, 1, 1}, adam); });
      if (!k) GTEST_SKIP() << "launches are counted under the CUDA simulator only";
      EXPECT_TRUE(k->work_counted) << k->name;
      EXPECT_EQ(k->math, "fp32");
      // p, g, m, v (and the max) read; all but g written.
      EXPECT_EQ(k->bytes, elements * bytes * (amsgrad ? 9 : 7)) << k->name;
    }
    FusedSgdOptions sgd;
    sgd.momentum = 0.9;
    for (bool first : {true, false}) {
      sgd.first_step = first;
      const auto k = work_of([&] { fused_sgd_(p, g, m, sgd); });
      // p and g read, p and the buffer written; the buffer read but on its first step.
      EXPECT_EQ(k->bytes, elements * bytes * (first ? 4 : 5));
    }
    FusedRmspropOptions rmsprop;
    rmsprop.centered = true;
    const auto k = work_of([&] { fused_rmsprop_(p, g, m, {}, v, rmsprop); });
    EXPECT_EQ(k->bytes, elements * bytes * 7);  // p, g, square and gradient averages; g not written
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
