// Fused attention CUDA kernels against the CPU backend.
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
#include "tensor/kernels/attention_kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace cuda_test {

// ---- Fused attention (Note [Fused attention])
// ---------------------------------------------------------------------------------------------

struct AttentionCase {
  int64_t batch, l, s, e, ev;
  bool causal;
  bool mask;               // an additive [batch / mask_heads, l, s] mask with -inf entries
  int64_t mask_heads = 1;  // consecutive heads that share one mask
  double dropout_p = 0.0;  // with Philox seed 1234 and offset 40 (not a block's first counter)
};

// Forward (out, logsumexp) and backward (dq, dk, dv) of the CUDA kernels on cuda:`device`
// against the CPU's, in T; `rtol`/`atol` cover float accumulation in another order (and, for
// the 16-bit types, a last-place difference of the rounded results).
template <typename T>
void ExpectAttentionMatches(Backend& cpu, Backend& gpu, std::mt19937_64& rng,
                            const AttentionCase& c, double rtol, double atol,
                            const std::string& note, int device = 0) {
  using M = OpMath<T>;
  const DType dtype = DTypeOf<T>::value;
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto random = [&](int64_t n) {
    std::vector<T> values(static_cast<size_t>(n));
    for (T& v : values) v = static_cast<T>(dist(rng));
    return values;
  };
  AttentionGeometry g;
  g.batch = c.batch;
  g.query_len = c.l;
  g.key_len = c.s;
  g.head_dim = c.e;
  g.value_dim = c.ev;
  g.scale = 1.0 / std::sqrt(static_cast<double>(c.e));
  g.causal = c.causal;
  g.mask_heads = c.mask_heads;
  g.mask_batch_stride = c.l * c.s;
  g.mask_head_stride = 0;
  g.mask_row_stride = c.s;
  g.dropout_p = c.dropout_p;
  g.dropout_seed = 1234;
  g.dropout_offset = 40 + 1;
  const std::string what =
      note + " " + DTypePrefix<T>() + "attention batch=" + std::to_string(c.batch) +
      " L=" + std::to_string(c.l) + " S=" + std::to_string(c.s) + " E=" + std::to_string(c.e) +
      " Ev=" + std::to_string(c.ev) + (c.causal ? " causal" : "") + (c.mask ? " mask" : "") +
      (c.dropout_p > 0 ? " dropout=" + std::to_string(c.dropout_p) : "");
  Buffer<T> q(random(c.batch * c.l * c.e), dtype, device),
      k(random(c.batch * c.s * c.e), dtype, device), v(random(c.batch * c.s * c.ev), dtype, device),
      dout(random(c.batch * c.l * c.ev), dtype, device);
  const int64_t mask_size = c.batch / c.mask_heads * c.l * c.s;
  std::vector<T> mask_values = random(mask_size);
  for (int64_t i = 0; i < mask_size; ++i) {
    // Every row keeps key 0; a third of the others are excluded.
    if (i % c.s != 0 && i % 3 == 1) mask_values[i] = static_cast<T>(-INFINITY);
  }
  Buffer<T> mask(mask_values, dtype, device);
  Buffer<T> out(c.batch * c.l * c.ev, dtype, device);
  Buffer<M> lse(c.batch * c.l, DTypeOf<M>::value, device);
  Buffer<T> dq(c.batch * c.l * c.e, dtype, device), dk(c.batch * c.s * c.e, dtype, device),
      dv(c.batch * c.s * c.ev, dtype, device);
  RunAttentionForward(Device::Cpu(0), dtype, g, q.cpu(), k.cpu(), v.cpu(),
                      c.mask ? mask.cpu() : nullptr, out.cpu(), lse.cpu());
  RunAttentionForward(Device::Cuda(device), dtype, g, q.gpu(), k.gpu(), v.gpu(),
                      c.mask ? mask.gpu() : nullptr, out.gpu(), lse.gpu());
  ExpectNear(out.Cpu(), out.Gpu(), rtol, atol, what + " out");
  ExpectNear(lse.Cpu(), lse.Gpu(), rtol, atol, what + " logsumexp");
  // The backward of each device from its own forward: both read out and logsumexp.
  RunAttentionBackward(Device::Cpu(0), dtype, g, q.cpu(), k.cpu(), v.cpu(),
                       c.mask ? mask.cpu() : nullptr, out.cpu(), dout.cpu(), lse.cpu(), dq.cpu(),
                       dk.cpu(), dv.cpu());
  RunAttentionBackward(Device::Cuda(device), dtype, g, q.gpu(), k.gpu(), v.gpu(),
                       c.mask ? mask.gpu() : nullptr, out.gpu(), dout.gpu(), lse.gpu(), dq.gpu(),
                       dk.gpu(), dv.gpu());
  ExpectNear(dq.Cpu(), dq.Gpu(), rtol, atol, what + " dq");
  ExpectNear(dk.Cpu(), dk.Gpu(), rtol, atol, what + " dk");
  ExpectNear(dv.Cpu(), dv.Gpu(), rtol, atol, what + " dv");
}

TEST_F(CudaBackendTest, FusedAttentionMatchesCpu) {
  // Sizes past a block of rows (64), ragged key tiles (16), L > S and L < S under the causal
  // mask, value and head sizes that differ, and a mask with excluded keys.
  const std::vector<AttentionCase> cases = {
      {2, 5, 7, 4, 3, false, false},    {3, 70, 40, 8, 8, true, false},
      {2, 9, 20, 5, 6, false, true},    {2, 20, 9, 4, 4, true, false},
      {1, 66, 66, 16, 16, true, true},  {2, 1, 33, 3, 5, false, false},
      {6, 9, 20, 5, 6, false, true, 3},
  };
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, 1.6e-2, 1e-2, Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, 2e-3, 2e-3, Note(""));
  }
  Buffer<int64_t> ints(4);
  AttentionGeometry g;
  g.batch = g.query_len = g.key_len = g.head_dim = g.value_dim = 1;
  EXPECT_THROW(RunAttentionForward(Device::Cuda(0), kInt64, g, ints.gpu(), ints.gpu(), ints.gpu(),
                                   nullptr, ints.gpu(), ints.gpu()),
               Error);
}

TEST_F(CudaBackendTest, FusedAttentionLargeHeadsMatchesCpu) {
  // Head sizes of real models (64; 128, Llama's; 256) and an odd pair (80 with values of 96):
  // a block of their rows needs more than the 48 KiB of shared memory every kernel gets, so
  // each kernel must opt in to more (the simulator, like an sm_90 GPU, refuses a launch that
  // did not). 70 queries and 66 keys span two blocks or more in every pass and end on ragged
  // tiles.
  std::vector<AttentionCase> cases;
  for (const auto& [e, ev] :
       std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {128, 128}, {256, 256}, {80, 96}}) {
    for (const bool causal : {false, true}) cases.push_back({1, 70, 66, e, ev, causal, false});
  }
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, 1.6e-2, 1e-2, Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, 2e-3, 2e-3, Note(""));
  }
}

TEST_F(CudaBackendTest, FusedAttentionWithoutSharedMemoryOptInTilesOrSaysWhy) {
  // A device that gives a block no shared memory past the default 48 KiB: BUILD's
  // TANDEM_CUDASIM_SHARED_OPTIN_BYTES makes the simulated cuda:1 one (GPUs since Volta allow
  // more; smaller ones run out the same way at larger heads).
  int optin = 0;
  if (DeviceCount(DeviceType::kCUDA) < 2 ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 1) != cudaSuccess ||
      optin != 48 * 1024) {
    GTEST_SKIP() << "needs a cuda:1 without shared memory past 48 KiB (cudasim's "
                    "TANDEM_CUDASIM_SHARED_OPTIN_BYTES); its opt-in limit is "
                 << optin;
  }
  // Fewer rows per block: float32 head size 128 fits 8 rows in the dk/dv pass, float64 128 two.
  const AttentionCase head128{1, 20, 18, 128, 128, true, false};
  ExpectAttentionMatches<float>(cpu_, gpu_, rng_, head128, 1e-5, 1e-5, Note("cuda:1"), 1);
  ExpectAttentionMatches<double>(cpu_, gpu_, rng_, head128, 1e-12, 1e-12, Note("cuda:1"), 1);
  ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, head128, 2e-3, 2e-3, Note("cuda:1"), 1);
  // float64 head size 256: one row and a tile of 16 keys take 69,632 bytes.
  AttentionGeometry g;
  g.batch = g.query_len = g.key_len = 1;
  g.head_dim = g.value_dim = 256;
  g.scale = 1.0 / 16;
  Buffer<double> x(256, kFloat64, 1), lse(1, kFloat64, 1);
  try {
    RunAttentionForward(Device::Cuda(1), kFloat64, g, x.gpu(), x.gpu(), x.gpu(), nullptr, x.gpu(),
                        lse.gpu());
    ADD_FAILURE() << "float64 head size 256 ran in 48 KiB of shared memory";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const char* part : {"head size 256", "float64", "69632 bytes", "at most 49152"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
  }
}

TEST_F(CudaBackendTest, FusedAttentionWithDropoutMatchesCpu) {
  // The same Philox mask on both devices: a dropped weight that one kept would move out and
  // the gradients by far more than the tolerances.
  const std::vector<AttentionCase> cases = {
      {2, 5, 7, 4, 3, false, false, 1, 0.3},
      {3, 70, 40, 8, 8, true, false, 1, 0.5},
      {2, 9, 20, 5, 6, false, true, 1, 0.1},
      {1, 66, 66, 16, 16, true, true, 1, 0.2},
  };
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, 1.6e-2, 1e-2, Note(""));
  }
}

}  // namespace cuda_test
}  // namespace tandem
