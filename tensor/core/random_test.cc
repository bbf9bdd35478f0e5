#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <thread>
#include <vector>

#include "tensor/base/philox.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace {

using testing::ErrorOf;
using ::testing::HasSubstr;

class RandomTest : public ::testing::Test {
 protected:
  void SetUp() override { SetCpuDeviceCount(3); }
};

TEST_F(RandomTest, SameSeedSameNumbersOnEveryLogicalDevice) {
  Generator a(7), b(7);
  const std::vector<float> x = rand({1000}, Device::Cpu(0), &a).to_vector<float>();
  const std::vector<float> y = rand({1000}, Device::Cpu(1), &b).to_vector<float>();
  EXPECT_EQ(x, y);
  // The next request continues the stream rather than repeating it.
  EXPECT_NE(rand({1000}, Device::Cpu(0), &a).to_vector<float>(), x);
  a.manual_seed(7);
  EXPECT_EQ(rand({1000}, Device::Cpu(0), &a).to_vector<float>(), x);
}

TEST_F(RandomTest, ValuesAreThePhiloxStream) {
  Generator g(123);
  const std::vector<float> x = rand({10}, {}, &g).to_vector<float>();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(x[i], philox::Uniform(123, i));
}

TEST_F(RandomTest, UniformAndNormalHaveTheRightMoments) {
  Generator g(1);
  const int n = 200000;
  const std::vector<float> u = rand({n}, {}, &g).to_vector<float>();
  const std::vector<float> z = randn({n}, {}, &g).to_vector<float>();
  double mu = 0, mz = 0, vz = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_GE(u[i], 0.0f);
    ASSERT_LT(u[i], 1.0f);
    ASSERT_TRUE(std::isfinite(z[i]));
    mu += u[i];
    mz += z[i];
  }
  mu /= n;
  mz /= n;
  for (float v : z) vz += (v - mz) * (v - mz);
  vz /= n;
  EXPECT_NEAR(mu, 0.5, 0.005);
  EXPECT_NEAR(mz, 0.0, 0.01);
  EXPECT_NEAR(vz, 1.0, 0.02);
  const std::vector<float> r = uniform({1000}, -2.0, 3.0, {}, &g).to_vector<float>();
  EXPECT_GE(*std::min_element(r.begin(), r.end()), -2.0f);
  EXPECT_LT(*std::max_element(r.begin(), r.end()), 3.0f);
}

TEST_F(RandomTest, RandpermIsASeededPermutation) {
  Generator g(5), h(5);
  std::vector<int64_t> p = randperm(1000, &g).to_vector<int64_t>();
  EXPECT_EQ(p, randperm(1000, &h).to_vector<int64_t>());
  EXPECT_NE(p, randperm(1000, &g).to_vector<int64_t>());
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  int fixed_points = 0;
  for (int64_t i = 0; i < 1000; ++i) fixed_points += p[i] == i;
  EXPECT_LT(fixed_points, 10);
  EXPECT_EQ(randperm(0).numel(), 0);
}

// ---- Per-device default generators --------------------------------------------------------

// The first n values of device index `index`'s default stream after manual_seed(seed).
std::vector<float> DefaultStream(uint64_t seed, int index, int n) {
  std::vector<float> values(n);
  for (int i = 0; i < n; ++i) values[i] = philox::Uniform(seed, DeviceOffsetBase(index) + i);
  return values;
}

TEST_F(RandomTest, EachDeviceHasItsOwnDefaultGenerator) {
  EXPECT_EQ(&default_generator(), &default_generator(Device::Cpu(0)));
  EXPECT_NE(&default_generator(Device::Cpu(0)), &default_generator(Device::Cpu(1)));
  EXPECT_NE(&default_generator(Device::Cpu(0)), &default_generator(Device::Cuda(0)));
  EXPECT_EQ(&default_generator(Device::Cpu(2)), &default_generator(Device::Cpu(2)));
  // Same index, same stream: cpu:i and cuda:i draw the same numbers for the same requests.
  EXPECT_EQ(default_generator(Device::Cpu(1)).base_offset(), uint64_t{1} << 40);
  EXPECT_EQ(default_generator(Device::Cuda(1)).base_offset(), uint64_t{1} << 40);
  EXPECT_EQ(default_generator(Device::Cuda(0)).base_offset(), 0u);
  EXPECT_EQ(DeviceOffsetBase(3), uint64_t{3} << kDeviceOffsetShift);
  EXPECT_THAT(ErrorOf([] { default_generator(Device::Cpu(-1)); }),
              HasSubstr("expected a device index in [0, 2^24) but got -1"));
}

TEST_F(RandomTest, FactoriesDrawFromTheGeneratorOfTheirDevice) {
  manual_seed(42);
  for (int index = 0; index < 3; ++index) {
    SCOPED_TRACE(index);
    EXPECT_EQ(rand({10}, Device::Cpu(index)).to_vector<float>(), DefaultStream(42, index, 10));
  }
  // Each draw moved only its own device's stream.
  for (int index = 0; index < 3; ++index) {
    EXPECT_EQ(default_generator(Device::Cpu(index)).state(),
              (GeneratorState{42, DeviceOffsetBase(index) + 12}));
  }
  // Devices draw different numbers for the same request.
  manual_seed(42);
  const std::vector<float> x0 = randn({100}, Device::Cpu(0)).to_vector<float>();
  const std::vector<float> x1 = randn({100}, Device::Cpu(1)).to_vector<float>();
  EXPECT_NE(x0, x1);
  // randperm (made on the CPU) uses cpu:0's generator.
  manual_seed(42);
  const GeneratorState before = default_generator().state();
  randperm(10);
  EXPECT_EQ(default_generator().state().offset, before.offset + 12);
}

TEST_F(RandomTest, ManualSeedResetsEveryDevice) {
  manual_seed(5);
  std::vector<std::vector<float>> first;
  for (int index = 0; index < 3; ++index) {
    first.push_back(uniform({50}, -1.0, 1.0, Device::Cpu(index)).to_vector<float>());
  }
  // Move every stream on by different amounts, then reseed.
  for (int index = 0; index < 3; ++index) {
    for (int k = 0; k <= index; ++k) randn({7}, Device::Cpu(index));
  }
  manual_seed(5);
  for (int index = 0; index < 3; ++index) {
    SCOPED_TRACE(index);
    EXPECT_EQ(uniform({50}, -1.0, 1.0, Device::Cpu(index)).to_vector<float>(), first[index]);
    EXPECT_EQ(default_generator(Device::Cpu(index)).seed(), 5u);
  }
  // A device first used after manual_seed starts from that seed too.
  manual_seed(6);
  EXPECT_EQ(default_generator(Device::Cuda(5)).state(), (GeneratorState{6, DeviceOffsetBase(5)}));
}

TEST_F(RandomTest, StateRoundTrips) {
  Generator g(9, /*base_offset=*/100);
  EXPECT_EQ(g.state(), (GeneratorState{9, 100}));
  rand({5}, {}, &g);
  const GeneratorState saved = g.state();
  EXPECT_EQ(saved, (GeneratorState{9, 108}));  // whole blocks of 4 per request
  const std::vector<float> next = randn({33}, {}, &g).to_vector<float>();
  g.set_state(saved);
  EXPECT_EQ(randn({33}, {}, &g).to_vector<float>(), next);
  g.set_state(g.state());
  EXPECT_NE(randn({33}, {}, &g).to_vector<float>(), next);
  // manual_seed restarts at the base offset, not at a restored state.
  g.manual_seed(9);
  EXPECT_EQ(g.state(), (GeneratorState{9, 100}));
  // A state carries its seed: restoring it into a generator seeded otherwise repeats it.
  Generator other(1234);
  other.set_state(saved);
  EXPECT_EQ(randn({33}, {}, &other).to_vector<float>(), next);

  // The default generators save and resume the same way (a trainer's checkpoint).
  manual_seed(3);
  Generator& cpu1 = default_generator(Device::Cpu(1));
  rand({4}, Device::Cpu(1));
  const GeneratorState checkpoint = cpu1.state();
  const std::vector<float> after = rand({8}, Device::Cpu(1)).to_vector<float>();
  manual_seed(99);
  cpu1.set_state(checkpoint);
  EXPECT_EQ(rand({8}, Device::Cpu(1)).to_vector<float>(), after);
}

TEST_F(RandomTest, DeviceGeneratorsAreIndependentSets) {
  DeviceGenerators mine(11);
  EXPECT_EQ(mine.seed(), 11u);
  EXPECT_EQ(&mine.get(Device::Cpu(1)), &mine.get(Device::Cpu(1)));
  EXPECT_NE(&mine.get(Device::Cpu(1)), &default_generator(Device::Cpu(1)));
  EXPECT_EQ(mine.get(Device::Cpu(2)).state(), (GeneratorState{11, DeviceOffsetBase(2)}));
  // Indices beyond the lock-free cache work the same.
  EXPECT_EQ(&mine.get(Device::Cpu(500)), &mine.get(Device::Cpu(500)));
  EXPECT_EQ(mine.get(Device::Cpu(500)).base_offset(), DeviceOffsetBase(500));
  rand({10}, Device::Cpu(2), &mine.get(Device::Cpu(2)));
  mine.manual_seed(12);
  EXPECT_EQ(mine.get(Device::Cpu(2)).state(), (GeneratorState{12, DeviceOffsetBase(2)}));
  EXPECT_EQ(mine.get(Device::Cpu(500)).seed(), 12u);
  // manual_seed of the process leaves a set of its own alone.
  manual_seed(1);
  EXPECT_EQ(mine.seed(), 12u);
}

TEST_F(RandomTest, ConcurrentLookupsFindOneGenerator) {
  DeviceGenerators set(0);
  std::vector<std::thread> threads;
  std::vector<Generator*> found(8 * 4);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int d = 0; d < 4; ++d) found[t * 4 + d] = &set.get(Device::Cpu(d * 40));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) {
    for (int d = 0; d < 4; ++d) EXPECT_EQ(found[t * 4 + d], &set.get(Device::Cpu(d * 40)));
  }
}

TEST_F(RandomTest, DropoutDrawsFromTheInputsDevice) {
  const double p = 0.25;
  manual_seed(8);
  for (int index = 0; index < 3; ++index) {
    SCOPED_TRACE(index);
    const std::vector<float> y =
        dropout(ones({64}, Device::Cpu(index)), p, /*training=*/true).to_vector<float>();
    const std::vector<float> u = DefaultStream(8, index, 64);
    for (int i = 0; i < 64; ++i) {
      ASSERT_EQ(y[i], u[i] >= p ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f) << i;
    }
  }
}

// What each device's worker computes in one "step": several random draws, as a model with
// dropout layers makes them, from that device's default generator.
std::vector<float> Step(int index) {
  const Device device = Device::Cpu(index);
  Tensor x = ones({16, 32}, device);
  for (int layer = 0; layer < 4; ++layer) {
    x = dropout(x + rand({16, 32}, device), 0.5, /*training=*/true);
  }
  return x.to_vector<float>();
}

// Runs Step on cpu:0, cpu:1 and cpu:2 concurrently, each on its device's worker.
std::vector<std::vector<float>> ParallelStep() {
  std::vector<std::future<std::vector<float>>> futures;
  for (int index = 0; index < 3; ++index) {
    futures.push_back(
        DeviceWorker::For(Device::Cpu(index)).Submit([index] { return Step(index); }));
  }
  std::vector<std::vector<float>> results;
  for (auto& future : futures) results.push_back(future.get());
  return results;
}

TEST_F(RandomTest, ParallelDevicesDrawTheSameNumbersInEveryRun) {
  manual_seed(2024);
  const std::vector<std::vector<float>> first = ParallelStep();
  // Different devices, different masks.
  EXPECT_NE(first[0], first[1]);
  EXPECT_NE(first[1], first[2]);
  EXPECT_NE(first[0], first[2]);
  for (int run = 0; run < 20; ++run) {
    SCOPED_TRACE(run);
    manual_seed(2024);
    ASSERT_EQ(ParallelStep(), first);
  }
  // And the same as running the devices one after another on this thread.
  manual_seed(2024);
  for (int index = 2; index >= 0; --index) EXPECT_EQ(Step(index), first[index]);
}

TEST_F(RandomTest, GeneratorRecorderNotesEachGeneratorsStateBeforeItsFirstDraw) {
  manual_seed(5);
  Generator own(9);
  const GeneratorState cpu1_before = default_generator(Device::Cpu(1)).state();
  const GeneratorState own_before = own.state();
  Tensor first, again;
  {
    GeneratorRecorder outer;
    {
      GeneratorRecorder inner;
      first = rand({6}, TensorOptions().device(Device::Cpu(1)));
      rand({3}, {}, &own);
      rand({3}, TensorOptions().device(Device::Cpu(1)));  // a second draw: noted once
      ASSERT_EQ(inner.uses().size(), 2u);
      EXPECT_EQ(inner.uses()[0].first, &default_generator(Device::Cpu(1)));
      EXPECT_EQ(inner.uses()[0].second, cpu1_before);
      EXPECT_EQ(inner.uses()[1].first, &own);
      EXPECT_EQ(inner.uses()[1].second, own_before);
    }
    EXPECT_EQ(outer.uses().size(), 2u);  // nested recorders note every draw
    dropout(ones({4}), 0.5, true);       // cpu:0's generator, after the inner one closed
    ASSERT_EQ(outer.uses().size(), 3u);
    EXPECT_EQ(outer.uses()[2].first, &default_generator(Device::Cpu(0)));
  }
  // Restoring the noted state replays the draw.
  default_generator(Device::Cpu(1)).set_state(cpu1_before);
  again = rand({6}, TensorOptions().device(Device::Cpu(1)));
  EXPECT_EQ(testing::MaxAbsDiff(first, again), 0.0);
  GeneratorRecorder after;
  EXPECT_TRUE(after.uses().empty());
}

}  // namespace
}  // namespace tandem
