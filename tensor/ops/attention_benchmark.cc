// The fused scaled_dot_product_attention against the composed path (matmul, softmax, matmul:
// internal::ComposedScaledDotProductAttention) at GPT-2's shapes (batch 4 x 12 heads, head
// size 64), forward alone and forward + backward, float32 on cpu:0 with its default threads.
// The two alternate within every round, so a busy machine slows them alike; each figure is
// the median over the rounds, and the ratio is composed / fused (above 1: fused is faster).
//
//   bazel run -c opt //tensor/ops:attention_benchmark [-- rounds]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tandem {
namespace {

struct Case {
  const char* name;
  int64_t heads, length, head_dim;
  bool causal;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds per call of `step`, over enough calls to take ~20 ms.
template <typename F>
double TimeMs(F&& step) {
  step();  // warm up (allocator, pools)
  int calls = 1;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) step();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (ms > 20.0 || calls >= 1 << 12) return ms / calls;
    calls *= 2;
  }
}

void Run(const Case& c, int rounds) {
  Generator gen(1);
  Tensor q = randn({c.heads, c.length, c.head_dim}, {}, &gen);
  Tensor k = randn({c.heads, c.length, c.head_dim}, {}, &gen);
  Tensor v = randn({c.heads, c.length, c.head_dim}, {}, &gen);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  const auto forward = [&](bool fused) {
    NoGradGuard no_grad;
    return fused ? scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal)
                 : internal::ComposedScaledDotProductAttention(q, k, v, Tensor(), 0.0, c.causal);
  };
  const auto training = [&](bool fused) {
    const Tensor y =
        fused ? scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal)
              : internal::ComposedScaledDotProductAttention(q, k, v, Tensor(), 0.0, c.causal);
    sum(y).backward();
    for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  };
  std::vector<double> fused_fwd, composed_fwd, fused_train, composed_train;
  for (int r = 0; r < rounds; ++r) {
    fused_fwd.push_back(TimeMs([&] { forward(true); }));
    composed_fwd.push_back(TimeMs([&] { forward(false); }));
    fused_train.push_back(TimeMs([&] { training(true); }));
    composed_train.push_back(TimeMs([&] { training(false); }));
  }
  const double ff = Median(fused_fwd), cf = Median(composed_fwd);
  const double ft = Median(fused_train), ct = Median(composed_train);
  std::printf(
      "%-28s forward %8.3f ms fused %8.3f ms composed  x%.2f | fwd+bwd %8.3f ms fused "
      "%8.3f ms composed  x%.2f\n",
      c.name, ff, cf, cf / ff, ft, ct, ct / ft);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const tandem::Case cases[] = {
      {"[48, 64, 64] causal", 48, 64, 64, true},
      {"[48, 256, 64]", 48, 256, 64, false},
      {"[48, 256, 64] causal", 48, 256, 64, true},
  };
  for (const tandem::Case& c : cases) tandem::Run(c, rounds);
  return 0;
}
