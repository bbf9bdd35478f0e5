// Tests of the CPU backend's FusedOptimizerUpdate in the 16-bit floats: the float32 step,
// rounded once when stored.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/base/device.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/base/philox.h"
#include "tensor/cpu/cpu_backend_testing.h"
#include "tensor/kernels/float_conversions.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"

namespace tandem {
namespace {

using namespace ::tandem::cpu_backend_testing;  // NOLINT(build/namespaces)

TYPED_TEST_SUITE(ReducedFloatTest, ReducedFloatTypes);

TYPED_TEST(ReducedFloatTest, FusedOptimizerStepsComputeInFloatAndRoundOnStore) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t n = 40000;  // several pieces
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kRmsprop}) {
    SCOPED_TRACE("kind " + std::to_string(static_cast<int>(kind)));
    std::vector<T> p = Rounded<T>(RandomFloats(n, -1, 1, 101));
    std::vector<T> g = Rounded<T>(RandomFloats(n, -1, 1, 102));
    std::vector<T> s0 = Rounded<T>(RandomFloats(n, 0, 1, 103));
    std::vector<T> s1 = Rounded<T>(RandomFloats(n, 0, 1, 104));
    std::vector<T> s2 = Rounded<T>(RandomFloats(n, -0.1f, 0.1f, 105));
    std::vector<float> p32 = Widened(p), g32 = Widened(g), s0_32 = Widened(s0), s1_32 = Widened(s1),
                       s2_32 = Widened(s2);
    FusedUpdate u;
    u.kind = kind;
    u.numel = n;
    u.lr = 0.01;
    u.momentum = 0.9;
    u.dampening = 0.1;
    u.weight_decay = 0.01;
    u.nesterov = true;
    u.beta1 = 0.9;
    u.beta2 = 0.999;
    u.eps = 1e-8;
    u.alpha = 0.99;
    u.step_size = 0.01 / 0.1;
    u.inv_bc2_sqrt = 1 / std::sqrt(0.001);
    u.decay_factor = 0.999;
    FusedUpdate u32 = u;
    const bool two_states = kind != OptimizerKind::kSgd, three = kind == OptimizerKind::kRmsprop;
    u.param = p.data(), u.grad = g.data(), u.state0 = s0.data();
    u.state1 = two_states ? s1.data() : nullptr;
    u.state2 = three ? s2.data() : nullptr;
    u32.param = p32.data(), u32.grad = g32.data(), u32.state0 = s0_32.data();
    u32.state1 = two_states ? s1_32.data() : nullptr;
    u32.state2 = three ? s2_32.data() : nullptr;
    Cpu().FusedOptimizerUpdate(0, kFloat32, {u32});
    Cpu().FusedOptimizerUpdate(0, dtype, {u});
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(IsRounded(p32[i], p[i])) << i;
      ASSERT_TRUE(IsRounded(s0_32[i], s0[i])) << i;
      if (two_states) ASSERT_TRUE(IsRounded(s1_32[i], s1[i])) << i;
      if (three) ASSERT_TRUE(IsRounded(s2_32[i], s2[i])) << i;
    }
  }
}

}  // namespace
}  // namespace tandem
