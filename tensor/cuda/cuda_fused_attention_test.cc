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
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_backend_testing.h"
#include "tensor/kernels/attention_kernels.h"
#include "tensor/kernels/internal/elementwise_math.h"
#include "tensor/runtime/backend.h"
#include "tools/cuda/device_counters.h"

namespace tandem {
namespace cuda_test {

// ---- Fused attention (Note [Fused attention])
// ---------------------------------------------------------------------------------------------

// Tolerances per dtype (relative, absolute), against the CPU oracle, which computes in float
// (double for float64) and rounds once on store:
// - float32, float64: the same arithmetic in another order (the scalar kernels): 1e-5, 1e-12.
// - bfloat16, float16 on tensor cores: the products are exact and accumulate in float, but the
//   probabilities P (and, in the backward, P Z and dS) are rounded to the 16-bit type before
//   their products, as FlashAttention does: a relative error of 2^-9 (bfloat16) or 2^-12
//   (float16) on each weight, on top of the rounding of the result. 1.6e-2 / 2e-2 for bfloat16
//   and 4e-3 / 4e-3 for float16. bfloat16's
//   absolute part is 2e-2: dk = dS^T q sums up to 100 queries of dS rounded to bfloat16, an
//   error of about 2^-9 sum |dS q| that stays when the sum itself cancels to near zero.
constexpr double kBFloat16Tolerance[2] = {1.6e-2, 2e-2};
constexpr double kHalfTolerance[2] = {4e-3, 4e-3};

struct AttentionCase {
  int64_t batch, l, s, e, ev;
  bool causal;
  bool mask;               // an additive [batch / mask_heads, l, s] mask with -inf entries
  int64_t mask_heads = 1;  // consecutive heads that share one mask
  double dropout_p = 0.0;  // with Philox seed 1234 and offset 40 (not a block's first counter)
  // Every operand (q, k, v, out, dout and the gradients) laid out as a head split: [batch / 2,
  // length, 2 heads, features + 3] (AttentionRows), read and written in place.
  bool strided = false;
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
  // An operand of `length` rows of `width`: its layout and how many elements its buffer holds.
  const int64_t heads = c.strided ? 2 : 1;
  const auto layout = [&](AttentionRows* rows, int64_t length, int64_t width) {
    if (!c.strided) return c.batch * length * width;
    const int64_t padded = width + 3;
    rows->batch_stride = length * heads * padded;
    rows->head_stride = padded;
    rows->row_stride = heads * padded;
    return c.batch * length * padded;
  };
  g.heads = heads;
  const int64_t q_size = layout(&g.q_rows, c.l, c.e), k_size = layout(&g.k_rows, c.s, c.e),
                v_size = layout(&g.v_rows, c.s, c.ev), out_size = layout(&g.out_rows, c.l, c.ev);
  layout(&g.dout_rows, c.l, c.ev);
  layout(&g.dq_rows, c.l, c.e);
  layout(&g.dk_rows, c.s, c.e);
  layout(&g.dv_rows, c.s, c.ev);
  const std::string what =
      note + " " + DTypePrefix<T>() + "attention batch=" + std::to_string(c.batch) +
      " L=" + std::to_string(c.l) + " S=" + std::to_string(c.s) + " E=" + std::to_string(c.e) +
      " Ev=" + std::to_string(c.ev) + (c.causal ? " causal" : "") + (c.mask ? " mask" : "") +
      (c.dropout_p > 0 ? " dropout=" + std::to_string(c.dropout_p) : "") +
      (c.strided ? " strided" : "");
  // Strided outputs' gaps keep the buffers' poison on both devices: a kernel that writes them
  // differs.
  Buffer<T> q(random(q_size), dtype, device), k(random(k_size), dtype, device),
      v(random(v_size), dtype, device), dout(random(out_size), dtype, device);
  const int64_t mask_size = c.batch / c.mask_heads * c.l * c.s;
  std::vector<T> mask_values = random(mask_size);
  for (int64_t i = 0; i < mask_size; ++i) {
    // Every row keeps key 0; a third of the others are excluded.
    if (i % c.s != 0 && i % 3 == 1) mask_values[i] = static_cast<T>(-INFINITY);
  }
  Buffer<T> mask(mask_values, dtype, device);
  Buffer<T> out(out_size, dtype, device);
  Buffer<M> lse(c.batch * c.l, DTypeOf<M>::value, device);
  Buffer<T> dq(q_size, dtype, device), dk(k_size, dtype, device), dv(v_size, dtype, device);
  RunAttentionForward(Device::Cpu(0), dtype, g, q.cpu(), k.cpu(), v.cpu(),
                      c.mask ? mask.cpu() : nullptr, out.cpu(), lse.cpu());
  RunAttentionForward(Device::Cuda(device), dtype, g, q.gpu(), k.gpu(), v.gpu(),
                      c.mask ? mask.gpu() : nullptr, out.gpu(), lse.gpu());
  ExpectNear(out.Cpu(), out.Gpu(), rtol, atol, what + " out");
  ExpectNear(lse.Cpu(), lse.Gpu(), rtol, atol, what + " logsumexp");
  // The backward of both devices from the CPU's forward: D = dout . out then agrees exactly. From
  // each device's own, a gradient that cancels to zero (dq of the first query under the causal
  // mask, whose only weight is 1) would be the difference of two roundings of out: a bfloat16
  // ulp of dout . out apart once the tensor cores round P, far above the gradient itself.
  out.Set(std::vector<T>(out.Cpu()));
  lse.Set(std::vector<M>(lse.Cpu()));
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
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, kBFloat16Tolerance[0],
                                     kBFloat16Tolerance[1], Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, kHalfTolerance[0], kHalfTolerance[1],
                                 Note(""));
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
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, kBFloat16Tolerance[0],
                                     kBFloat16Tolerance[1], Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, kHalfTolerance[0], kHalfTolerance[1],
                                 Note(""));
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
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, kBFloat16Tolerance[0],
                                     kBFloat16Tolerance[1], Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, kHalfTolerance[0], kHalfTolerance[1],
                                 Note(""));
  }
}

TEST_F(CudaBackendTest, FusedAttentionEveryHeadSizeMaskAndDropoutMatchesCpu) {
  // The head sizes of the tensor-core kernels (multiples of 16 up to 256, and 80, as in
  // Phi/StableLM), with and without the causal mask and dropout; 67 queries and 45 keys end on
  // ragged tiles of every kernel (64 and 32 rows, 16-row warps). Every dtype: bfloat16 and
  // float16 take the tensor cores, float32 and float64 the scalar kernels (their large heads
  // without dropout are FusedAttentionLargeHeadsMatchesCpu's, and the simulator is slow).
  for (const int64_t e : {16, 32, 64, 80, 128, 256}) {
    for (const bool causal : {false, true}) {
      for (const double p : {0.0, 0.25}) {
        const AttentionCase c{1, 67, 45, e, e, causal, false, 1, p};
        ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, kBFloat16Tolerance[0],
                                         kBFloat16Tolerance[1], Note(""));
        ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, kHalfTolerance[0], kHalfTolerance[1],
                                     Note(""));
        if (e <= 32 || p > 0)
          ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
        if (e <= 32) ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
      }
    }
  }
}

TEST_F(CudaBackendTest, FusedAttentionTensorCoresWithAMaskAndOddShapesMatchCpu) {
  // An additive mask with excluded keys (shared by pairs of heads), L < S and L > S under the
  // causal mask, value sizes that differ from the head size, and sizes below one WMMA tile.
  const std::vector<AttentionCase> cases = {
      {4, 33, 70, 48, 24, false, true, 2, 0.0},
      {2, 100, 17, 24, 40, true, false, 1, 0.1},
      {2, 17, 100, 64, 64, true, false, 1, 0.0},
      {3, 1, 5, 8, 8, false, true, 1, 0.3},
  };
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, kBFloat16Tolerance[0],
                                     kBFloat16Tolerance[1], Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, kHalfTolerance[0], kHalfTolerance[1],
                                 Note(""));
  }
}

TEST_F(CudaBackendTest, FusedAttentionReadsAndWritesHeadSplitsInPlace) {
  // q, k, v, dout read and out, dq, dk, dv written through their rows' strides (a head split
  // that the op passes without a copy), against the CPU reading the same layout; on the tensor
  // cores (bfloat16, float16) and the scalar kernels (float32, float64), with ragged tiles.
  const std::vector<AttentionCase> cases = {
      {4, 67, 45, 64, 64, true, false, 1, 0.0, true},
      {2, 33, 70, 80, 48, false, true, 2, 0.2, true},
  };
  for (const AttentionCase& c : cases) {
    ExpectAttentionMatches<BFloat16>(cpu_, gpu_, rng_, c, kBFloat16Tolerance[0],
                                     kBFloat16Tolerance[1], Note(""));
    ExpectAttentionMatches<Half>(cpu_, gpu_, rng_, c, kHalfTolerance[0], kHalfTolerance[1],
                                 Note(""));
    ExpectAttentionMatches<float>(cpu_, gpu_, rng_, c, 1e-5, 1e-5, Note(""));
    ExpectAttentionMatches<double>(cpu_, gpu_, rng_, c, 1e-12, 1e-12, Note(""));
  }
}

// ---- Declared work (DeclareKernelWork), counted under cudasim ----------------------------------

// "AttentionForwardKernel<float> (tensor/cuda/attention_kernels.cu:1020)" -> its kernel's name.
std::string KernelBaseName(const std::string& counted) {
  return counted.substr(0, counted.find_first_of("< "));
}

// Runs the forward, then the backward, of attention in T on cuda:0 and checks what each launch
// declared: FLOPs between the products of the pairs attended (under the causal mask the pairs on
// or below the diagonal, the roofline's ideal) and those of every pair (the kernels compute the
// tiles that reach the diagonal whole, and skip the others); each operand's bytes at least once.
// `aligned`: sizes that are whole tiles of every kernel (64 queries or keys, 16 features), where
// a non-causal launch computes exactly every pair and the upper bound holds; otherwise the
// tensor cores also multiply their padding, so only the lower bound is checked.
template <typename T>
void ExpectAttentionDeclaresWork(std::mt19937_64& rng, int64_t batch, int64_t l, int64_t s,
                                 int64_t e, int64_t ev, bool causal, bool aligned) {
  using M = OpMath<T>;
  const DType dtype = DTypeOf<T>::value;
  constexpr bool kTensorCores = !std::is_same_v<T, float> && !std::is_same_v<T, double>;
  const std::string what = std::string(DTypePrefix<T>()) + "attention L=" + std::to_string(l) +
                           " S=" + std::to_string(s) + " E=" + std::to_string(e) +
                           (causal ? " causal" : "");
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto random = [&](int64_t n) {
    std::vector<T> values(static_cast<size_t>(n));
    for (T& v : values) v = static_cast<T>(dist(rng));
    return values;
  };
  AttentionGeometry g;
  g.batch = batch;
  g.query_len = l;
  g.key_len = s;
  g.head_dim = e;
  g.value_dim = ev;
  g.scale = 1.0 / std::sqrt(static_cast<double>(e));
  g.causal = causal;
  Buffer<T> q(random(batch * l * e), dtype), k(random(batch * s * e), dtype),
      v(random(batch * s * ev), dtype), dout(random(batch * l * ev), dtype);
  Buffer<T> out(batch * l * ev, dtype), dq(batch * l * e, dtype), dk(batch * s * e, dtype),
      dv(batch * s * ev, dtype);
  Buffer<M> lse(batch * l, DTypeOf<M>::value);

  // Pairs (query, key) attended, and all of them.
  double ideal_pairs = 0;
  for (int64_t i = 0; i < l; ++i) ideal_pairs += causal ? std::min(i + 1, s) : s;
  ideal_pairs *= batch;
  const double all_pairs = static_cast<double>(batch) * l * s;
  // Per kernel: the FLOPs of its products per pair, and of its work per query.
  struct Products {
    double per_pair, per_query;
  };
  const std::map<std::string, Products> products = {
      {"AttentionForwardTensorCoreKernel", {2.0 * (e + ev), 0}},  // S = Q K^T, O = P V
      {"AttentionForwardKernel", {2.0 * (e + ev), 0}},
      // S and dP, then dv, dk and dq.
      {"AttentionBackwardTensorCoreKernel", {2.0 * (3 * e + 2 * ev), 0}},
      // S, dP and dq; D = dout . out a query.
      {"AttentionBackwardQueryKernel", {2.0 * (2 * e + ev), 2.0 * ev}},
      // S and dP again, dv and dk.
      {"AttentionBackwardKeyKernel", {2.0 * (2 * e + 2 * ev), 0}},
  };
  const std::string math = !kTensorCores ? "fp32" : std::is_same_v<T, BFloat16> ? "bf16" : "fp16";
  const auto check = [&](const char* pass, const std::vector<std::string>& expected,
                         double min_bytes) {
    const DeviceCounters counted = ReadDeviceCounters();
    std::vector<std::string> launched;
    double bytes = 0;
    for (const KernelLaunches& kernel : counted.kernels) {
      const std::string name = KernelBaseName(kernel.name);
      const std::string at = what + " " + pass + ": " + kernel.name;
      launched.push_back(name);
      EXPECT_EQ(kernel.launches, 1) << at;
      EXPECT_TRUE(kernel.work_counted) << at;
      bytes += kernel.bytes;
      if (name == "RoundAccumulatedKernel") {
        // dq's float32 sums rounded to T: a conversion an element.
        EXPECT_EQ(kernel.math, "fp32") << at;
        EXPECT_DOUBLE_EQ(kernel.flops, static_cast<double>(batch) * l * e) << at;
        EXPECT_DOUBLE_EQ(kernel.bytes, static_cast<double>(batch) * l * e * (4 + sizeof(T))) << at;
        continue;
      }
      const auto it = products.find(name);
      ASSERT_NE(it, products.end()) << at;
      EXPECT_EQ(kernel.math, math) << at;
      const double extra = it->second.per_query * batch * l;
      EXPECT_GE(kernel.flops, it->second.per_pair * ideal_pairs + extra) << at;
      if (!aligned) continue;
      if (causal) {
        EXPECT_LT(kernel.flops, it->second.per_pair * all_pairs + extra) << at;
      } else {
        EXPECT_DOUBLE_EQ(kernel.flops, it->second.per_pair * all_pairs + extra) << at;
      }
    }
    std::sort(launched.begin(), launched.end());
    EXPECT_EQ(launched, expected) << what << " " << pass;
    EXPECT_GE(bytes, min_bytes) << what << " " << pass;
  };

  cuda::Synchronize(0);
  ResetDeviceCounters();
  RunAttentionForward(Device::Cuda(0), dtype, g, q.gpu(), k.gpu(), v.gpu(), nullptr, out.gpu(),
                      lse.gpu());
  // q, k and v read, out and the log-sum-exp written: no less.
  check("forward", {kTensorCores ? "AttentionForwardTensorCoreKernel" : "AttentionForwardKernel"},
        batch * ((l + s) * (e + ev) * sizeof(T) + l * sizeof(M)));
  cuda::Synchronize(0);
  ResetDeviceCounters();
  RunAttentionBackward(Device::Cuda(0), dtype, g, q.gpu(), k.gpu(), v.gpu(), nullptr, out.gpu(),
                       dout.gpu(), lse.gpu(), dq.gpu(), dk.gpu(), dv.gpu());
  // q, k, v, out, dout and the log-sum-exp read, dq, dk and dv written; on the tensor cores also
  // dq's float32 sums, zeroed, added to, rounded.
  const double operands = batch * (((l + s) * (e + ev) + l * ev) * sizeof(T) + l * sizeof(M) +
                                   (l + s) * e * sizeof(T) + s * ev * sizeof(T));
  if constexpr (kTensorCores) {
    check("backward", {"AttentionBackwardTensorCoreKernel", "RoundAccumulatedKernel"},
          operands + 4.0 * batch * l * e * sizeof(float));
  } else {
    check("backward", {"AttentionBackwardKeyKernel", "AttentionBackwardQueryKernel"}, operands);
  }
  cuda::Synchronize(0);
}

TEST_F(CudaBackendTest, FusedAttentionDeclaresItsWork) {
  if (!ReadDeviceCounters().counted) GTEST_SKIP() << "work is counted under cudasim only";
  for (const bool causal : {false, true}) {
    // Whole tiles of every kernel: the FLOPs between the ideal and every pair's.
    ExpectAttentionDeclaresWork<BFloat16>(rng_, 2, 128, 128, 32, 32, causal, true);
    ExpectAttentionDeclaresWork<float>(rng_, 2, 128, 128, 32, 32, causal, true);
    ExpectAttentionDeclaresWork<Half>(rng_, 1, 64, 64, 16, 16, causal, true);
    // Ragged tiles, padded heads, L > S: at least the ideal.
    ExpectAttentionDeclaresWork<BFloat16>(rng_, 1, 70, 45, 24, 40, causal, false);
    ExpectAttentionDeclaresWork<float>(rng_, 1, 70, 45, 24, 40, causal, false);
  }
}

}  // namespace cuda_test
}  // namespace tandem
