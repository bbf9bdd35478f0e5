// Tests of parallel/scatter_gather.h: the differentiable Scatter and Gather (values, devices
// and gradients) and scatter_inputs over several inputs.
#include "parallel/scatter_gather.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/base/grad_mode.h"
#include "tensor/gradcheck.h"
#include "tensor/testing.h"

namespace tandem::parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor Iota(const Shape& shape, float offset = 0.0f, Device device = Device::Cpu(0)) {
  std::vector<float> values(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = offset + static_cast<float>(i);
  return from_vector(values, shape, TensorOptions().device(device));
}

std::vector<int64_t> Rows(const std::vector<Tensor>& pieces, int64_t dim = 0) {
  std::vector<int64_t> sizes;
  for (const Tensor& p : pieces) sizes.push_back(p.size(dim));
  return sizes;
}

class ScatterGatherTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(8); }
};

// ---- Scatter and Gather: values ----------------------------------------------------------

TEST_F(ScatterGatherTest, ScatterGivesChunksOnTheirDevicesAndRecordsOneNode) {
  const Tensor x = Iota({10, 2}).set_requires_grad(true);
  std::vector<Tensor> chunks = Scatter(x, CpuDevices(8));
  EXPECT_THAT(Rows(chunks), ElementsAre(2, 2, 2, 2, 2));
  ASSERT_NE(chunks[0].grad_fn(), nullptr);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].device(), Device::Cpu(static_cast<int>(i)));
    EXPECT_TRUE(chunks[i].requires_grad());
    EXPECT_EQ(chunks[i].grad_fn(), chunks[0].grad_fn()) << "chunk " << i;
    EXPECT_EQ(chunks[i].to_vector<float>(), x.narrow(0, 2 * i, 2).to_vector<float>());
  }
}

TEST_F(ScatterGatherTest, ScatterAndGatherRecordNothingWithoutGrad) {
  const Tensor x = Iota({4, 2});
  std::vector<Tensor> chunks = Scatter(x, CpuDevices(2));
  EXPECT_FALSE(chunks[1].requires_grad());
  EXPECT_EQ(chunks[1].grad_fn(), nullptr);
  const Tensor y = Iota({4, 2}).set_requires_grad(true);
  NoGradGuard no_grad;
  std::vector<Tensor> pieces = Scatter(y, CpuDevices(2));
  EXPECT_EQ(pieces[0].grad_fn(), nullptr);
  EXPECT_FALSE(Gather(pieces, Device::Cpu(0)).requires_grad());
}

TEST_F(ScatterGatherTest, ScatterWithChunkSizesAndDimOne) {
  const Tensor x = Iota({3, 6}).set_requires_grad(true);
  std::vector<Tensor> chunks = Scatter(x, CpuDevices(3), {1, 2, 3}, /*dim=*/1);
  EXPECT_THAT(Rows(chunks, 1), ElementsAre(1, 2, 3));
  EXPECT_THAT(chunks[1].to_vector<float>(), ElementsAre(1, 2, 7, 8, 13, 14));
  const Tensor back = Gather(chunks, Device::Cpu(0), /*dim=*/1);
  EXPECT_EQ(back.to_vector<float>(), x.to_vector<float>());
}

// ---- Gradients -----------------------------------------------------------------------------

TEST_F(ScatterGatherTest, GradientsThroughScatterThenGatherMatchFiniteDifferences) {
  // Each chunk is scaled by a factor of its own, so a gradient routed to the wrong rows or
  // device shows.
  for (int n : {2, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << n << " devices");
    const Tensor x = randn({7, 3}).set_requires_grad(true);
    const std::vector<Device> devices = CpuDevices(n);
    EXPECT_GRADIENTS_MATCH(
        [&devices](const std::vector<Tensor>& in) {
          std::vector<Tensor> chunks = Scatter(in[0], devices);
          for (size_t i = 0; i < chunks.size(); ++i) {
            chunks[i] = chunks[i] * static_cast<double>(i + 1) + chunks[i] * chunks[i];
          }
          return Gather(chunks, Device::Cpu(0));
        },
        {x});
  }
}

TEST_F(ScatterGatherTest, GradientsAlongDimOneToAnotherOutputDevice) {
  const Tensor x = randn({2, 5}).set_requires_grad(true);
  const std::vector<Device> devices = CpuDevices(3);
  EXPECT_GRADIENTS_MATCH(
      [&devices](const std::vector<Tensor>& in) {
        std::vector<Tensor> chunks = Scatter(in[0], devices, {}, /*dim=*/1);
        for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = chunks[i] * (2.0 + i);
        return Gather(chunks, Device::Cpu(5), /*dim=*/1).to(Device::Cpu(0));
      },
      {x});
}

TEST_F(ScatterGatherTest, ScatterBackwardByHand) {
  const Tensor x = Iota({6, 2}).set_requires_grad(true);
  std::vector<Tensor> chunks = Scatter(x, CpuDevices(3));  // rows 0-1, 2-3, 4-5
  const Device cpu0 = Device::Cpu(0);
  (chunks[0].sum() + (chunks[1] * 2.0).sum().to(cpu0) + (chunks[2] * 3.0).sum().to(cpu0))
      .backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), Device::Cpu(0));
  EXPECT_THAT(x.grad().to_vector<float>(), ElementsAre(1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
}

TEST_F(ScatterGatherTest, ChunksThatGetNoGradientGetZeros) {
  const Tensor x = Iota({6, 2}).set_requires_grad(true);
  std::vector<Tensor> chunks = Scatter(x, CpuDevices(3));
  // Chunk 1 is not used at all.
  (chunks[0].sum() * 2.0 + chunks[2].sum().to(Device::Cpu(0))).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_THAT(x.grad().to_vector<float>(), ElementsAre(2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1));
}

TEST_F(ScatterGatherTest, GatherBackwardScattersTheGradientToWhereEachPieceCameFrom) {
  const Tensor a = Iota({2, 2}, 0.0f, Device::Cpu(1)).set_requires_grad(true);
  const Tensor b = Iota({1, 2}, 0.0f, Device::Cpu(3)).set_requires_grad(true);
  const Tensor out = Gather({a, b}, Device::Cpu(0));
  EXPECT_EQ(out.device(), Device::Cpu(0));
  const Tensor weights = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2}, TensorOptions());
  (out * weights).sum().backward();
  ASSERT_TRUE(a.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(a.grad().device(), Device::Cpu(1));
  EXPECT_EQ(b.grad().device(), Device::Cpu(3));
  EXPECT_THAT(a.grad().to_vector<float>(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(b.grad().to_vector<float>(), ElementsAre(5, 6));
}

TEST_F(ScatterGatherTest, GatherOfScalarsStacksThemAndSendsScalarGradientsBack) {
  const Tensor s0 = scalar_tensor(1.5).set_requires_grad(true);
  const Tensor s1 =
      scalar_tensor(-1, TensorOptions().device(Device::Cpu(2))).set_requires_grad(true);
  const Tensor out = Gather({s0, s1}, Device::Cpu(0));
  EXPECT_EQ(out.shape(), (Shape{2}));
  EXPECT_THAT(out.to_vector<float>(), ElementsAre(1.5f, -1));
  (out * from_vector(std::vector<float>{2, 3}, {2})).sum().backward();
  ASSERT_TRUE(s1.grad().defined());
  EXPECT_EQ(s0.grad().dim(), 0);
  EXPECT_EQ(s1.grad().dim(), 0);
  EXPECT_EQ(s1.grad().device(), Device::Cpu(2));
  EXPECT_EQ(s0.grad().item(), 2.0);
  EXPECT_EQ(s1.grad().item(), 3.0);
}

TEST_F(ScatterGatherTest, OnlyPiecesThatRequireGradGetGradients) {
  const Tensor a = Iota({1, 2}).set_requires_grad(true);
  const Tensor b = Iota({1, 2}, 0.0f, Device::Cpu(1));  // a constant
  Gather({a, b}, Device::Cpu(0)).sum().backward();
  EXPECT_THAT(a.grad().to_vector<float>(), ElementsAre(1, 1));
  EXPECT_FALSE(b.grad().defined());
}

// ---- scatter_inputs ------------------------------------------------------------------------

TEST_F(ScatterGatherTest, ScatterInputsChunksEveryInputTheSameWay) {
  const Tensor x = Iota({10, 3});
  const Tensor y = Iota({10}, 100.0f);
  std::vector<std::vector<Tensor>> per_replica = scatter_inputs({x, y}, CpuDevices(3));
  ASSERT_EQ(per_replica.size(), 3u);
  const std::vector<int64_t> expected = {4, 4, 2};
  int64_t start = 0;
  for (size_t i = 0; i < per_replica.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "replica " << i);
    ASSERT_EQ(per_replica[i].size(), 2u);
    EXPECT_EQ(per_replica[i][0].size(0), expected[i]);
    EXPECT_EQ(per_replica[i][1].size(0), expected[i]);
    EXPECT_EQ(per_replica[i][0].device(), Device::Cpu(static_cast<int>(i)));
    EXPECT_EQ(per_replica[i][1].device(), Device::Cpu(static_cast<int>(i)));
    EXPECT_EQ(per_replica[i][0].to_vector<float>(),
              x.narrow(0, start, expected[i]).to_vector<float>());
    EXPECT_EQ(per_replica[i][1].to_vector<float>(),
              y.narrow(0, start, expected[i]).to_vector<float>());
    start += expected[i];
  }
}

TEST_F(ScatterGatherTest, ScatterInputsGivesFewerReplicasForASmallBatch) {
  std::vector<std::vector<Tensor>> per_replica =
      scatter_inputs({Iota({2, 4}), Iota({2, 1})}, CpuDevices(3));
  ASSERT_EQ(per_replica.size(), 2u);
  EXPECT_EQ(per_replica[1][1].shape(), (Shape{1, 1}));
  per_replica = scatter_inputs({Iota({10, 4})}, CpuDevices(8));
  EXPECT_EQ(per_replica.size(), 5u);
}

TEST_F(ScatterGatherTest, ScatterInputsWithChunkSizesAndDimOne) {
  std::vector<std::vector<Tensor>> per_replica =
      scatter_inputs({Iota({2, 5}), Iota({3, 5})}, CpuDevices(2), /*dim=*/1, {4, 1});
  ASSERT_EQ(per_replica.size(), 2u);
  EXPECT_EQ(per_replica[0][0].shape(), (Shape{2, 4}));
  EXPECT_EQ(per_replica[0][1].shape(), (Shape{3, 4}));
  EXPECT_EQ(per_replica[1][1].shape(), (Shape{3, 1}));
}

TEST_F(ScatterGatherTest, ScatterInputsOfNothingGivesOneReplicaWithNoInputs) {
  std::vector<std::vector<Tensor>> per_replica = scatter_inputs({}, CpuDevices(3));
  ASSERT_EQ(per_replica.size(), 1u);
  EXPECT_TRUE(per_replica[0].empty());
}

TEST_F(ScatterGatherTest, ScatterInputsGradientsReachEveryInput) {
  const Tensor x = Iota({5, 2}).set_requires_grad(true);
  const Tensor y = Iota({5, 2}, 1.0f).set_requires_grad(true);
  std::vector<std::vector<Tensor>> per_replica = scatter_inputs({x, y}, CpuDevices(2));
  std::vector<Tensor> outputs;
  for (const auto& inputs : per_replica) outputs.push_back(inputs[0] * inputs[1]);
  Gather(outputs, Device::Cpu(0)).sum().backward();
  EXPECT_EQ(x.grad().to_vector<float>(), y.to_vector<float>());
  EXPECT_EQ(y.grad().to_vector<float>(), x.to_vector<float>());
}

TEST_F(ScatterGatherTest, ScatterInputsErrors) {
  EXPECT_THAT(testing::ErrorOf([] {
                scatter_inputs({Iota({4, 2}), Iota({3, 2})}, CpuDevices(2));
              }),
              HasSubstr("every input must have 4 entries along dimension 0 (as input 0, [4, 2]) "
                        "but input 1 has shape [3, 2]"));
  EXPECT_THAT(testing::ErrorOf([] {
                scatter_inputs({Iota({4, 2})}, {});
              }),
              HasSubstr("expected at least one device but got none"));
  EXPECT_THAT(testing::ErrorOf([] {
                scatter_inputs({Iota({4}), scalar_tensor(1)}, CpuDevices(2));
              }),
              HasSubstr("input 1 is 0-dimensional and cannot be split along dimension 0"));
  EXPECT_THAT(testing::ErrorOf([] { scatter_inputs({Tensor()}, CpuDevices(2)); }),
              HasSubstr("input 0 is undefined"));
  EXPECT_THAT(testing::ErrorOf([] { scatter_inputs({Iota({4})}, CpuDevices(2), 0, {4}); }),
              HasSubstr("expected one chunk size per device (2) but got 1"));
  EXPECT_THAT(testing::ErrorOf([] {
                scatter_inputs({Iota({4})}, CpuDevices(2), 0, {1, 2});
              }),
              HasSubstr("the chunk sizes add up to 3 but the tensor has 4"));
}

}  // namespace
}  // namespace tandem::parallel
