// libtorch_train_step: the train_step benchmark's MLP and GPT-2 steps in libtorch (PyTorch's
// C++ API), for a side-by-side comparison with Tandem (tools/bench/compare_libtorch.sh builds
// and runs both). Not part of the Bazel build: libtorch is a large optional Debian package.
//
//   g++ -O2 -std=c++17 libtorch_train_step.cc -I/usr/include/torch/csrc/api/include \
//       -ltorch -ltorch_cpu -lc10 -o libtorch_train_step
//   ./libtorch_train_step 256 2 50 5          (batch, threads, timed steps, warm-up steps)
//   ./libtorch_train_step 4 2 10 2 gpt2 64    (... model, tokens per sequence)
//   ./libtorch_train_step 4 2 10 2 gpt2 64 bf16   (... precision: f32 or bf16)
//
// A step is what train_step times: forward, cross-entropy, zero_grad, backward, the
// optimizer, and reading the loss back. mlp: 784-256-128-10 with ReLU, SGD (lr 0.01,
// momentum 0.9). gpt2: GPT-2 124M as examples/gpt.h builds it (learned positions, pre-norm
// blocks, fused qkv, causal attention, tanh GELU, head tied to wte, GPT-2's initialisation)
// on the same pseudo-random tokens as train_step, AdamW (lr 6e-4, weight decay 0.1). libtorch
// 1.13 has no scaled_dot_product_attention: attention is matmul, causal mask, softmax, matmul,
// as PyTorch's nanoGPT wrote it before 2.0. bf16 runs the forward and the loss under
// libtorch's CPU autocast to bfloat16, as torch.autocast("cpu", dtype=torch.bfloat16) does in
// Python, with backward and the optimizer outside, as PyTorch's AMP recipe: the counterpart
// of train_step --autocast=bf16. It prints the median, p10 and p90 of the step times and a
// JSON line.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

// GPT-2 124M: vocabulary 50257, context 1024, 12 layers, 12 heads, 768 channels, no dropout.
constexpr int64_t kVocab = 50257, kContext = 1024, kLayers = 12, kHeads = 12, kChannels = 768;

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln_1(register_module("ln_1",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        c_attn(register_module("c_attn", torch::nn::Linear(kChannels, 3 * kChannels))),
        attn_proj(register_module("attn_proj", torch::nn::Linear(kChannels, kChannels))),
        ln_2(register_module("ln_2",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        c_fc(register_module("c_fc", torch::nn::Linear(kChannels, 4 * kChannels))),
        mlp_proj(register_module("mlp_proj", torch::nn::Linear(4 * kChannels, kChannels))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal) {
    const int64_t b = x.size(0), t = x.size(1), d = kChannels / kHeads;
    const std::vector<torch::Tensor> qkv = c_attn->forward(ln_1->forward(x)).split(kChannels, 2);
    const auto heads = [&](const torch::Tensor& m) {
      return m.view({b, t, kHeads, d}).transpose(1, 2);
    };
    const torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
    att = torch::softmax(att.masked_fill(causal.narrow(0, 0, t).narrow(1, 0, t), -INFINITY), -1);
    const torch::Tensor y =
        torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, kChannels});
    const torch::Tensor h = x + attn_proj->forward(y);
    return h + mlp_proj->forward(torch::gelu(c_fc->forward(ln_2->forward(h)), "tanh"));
  }

  torch::nn::LayerNorm ln_1;
  torch::nn::Linear c_attn, attn_proj;
  torch::nn::LayerNorm ln_2;
  torch::nn::Linear c_fc, mlp_proj;
};
TORCH_MODULE(Block);

struct Gpt2Impl : torch::nn::Module {
  Gpt2Impl()
      : wte(register_module("wte", torch::nn::Embedding(kVocab, kChannels))),
        wpe(register_module("wpe", torch::nn::Embedding(kContext, kChannels))),
        ln_f(register_module("ln_f",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))) {
    for (int64_t i = 0; i < kLayers; ++i) {
      blocks.push_back(register_module("h" + std::to_string(i), Block()));
    }
    // true above the diagonal: the keys a query may not see.
    causal = register_buffer("causal", torch::ones({kContext, kContext}, torch::kBool).triu(1));
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * kLayers);
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      torch::Tensor& p = item.value();
      if (name.find("ln_") != std::string::npos) continue;  // ones and zeros
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
        p.zero_();
      } else if (name.find("_proj.weight") != std::string::npos) {
        p.normal_(0.0, residual_std);
      } else {
        p.normal_(0.0, 0.02);
      }
    }
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    torch::Tensor x = wte->forward(tokens) + wpe->forward(torch::arange(t, torch::kInt64));
    for (auto& block : blocks) x = block->forward(x, causal);
    return torch::linear(ln_f->forward(x), wte->weight);  // the head tied to wte
  }

  torch::nn::Embedding wte, wpe;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f;
  torch::Tensor causal;
};
TORCH_MODULE(Gpt2);

// torch.autocast("cpu", dtype=torch.bfloat16) in C++: libtorch 1.13 has no guard for it.
// Disabled, it leaves the step in float32. Leaving the outermost scope drops the casts it
// cached (each weight's bfloat16 copy), so the next step casts the updated weights again.
class CpuAutocastScope {
 public:
  explicit CpuAutocastScope(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    was_enabled_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuAutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(was_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
  CpuAutocastScope(const CpuAutocastScope&) = delete;
  CpuAutocastScope& operator=(const CpuAutocastScope&) = delete;

 private:
  bool enabled_;
  bool was_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

double Quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(q * (values.size() - 1) + 0.5);
  return values.at(std::min(rank, values.size() - 1));
}

// Times `step` and prints the figures (a line, then JSON).
int Report(const std::function<double()>& step, const char* model, const std::string& precision,
           int64_t batch, int threads, int steps, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
  double loss = 0;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    loss = step();
    ms.push_back(1e3 *
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double median = Quantile(ms, 0.5);
  std::printf(
      "libtorch %s: %s, %s, batch %lld, %d thread%s: median %.2f ms  p10 %.2f ms  "
      "p90 %.2f ms  (last loss %.4f)\n",
      TORCH_VERSION, model, precision.c_str(), static_cast<long long>(batch), threads,
      threads == 1 ? "" : "s", median, Quantile(ms, 0.1), Quantile(ms, 0.9), loss);
  std::printf(
      "{\"benchmark\":\"libtorch_train_step\",\"model\":\"%s\",\"precision\":\"%s\","
      "\"batch_size\":%lld,\"threads\":%d,\"steps\":%d,\"step_ms_median\":%.3f,"
      "\"step_ms_p90\":%.3f}\n",
      model, precision.c_str(), static_cast<long long>(batch), threads, steps, median,
      Quantile(ms, 0.9));
  return 0;
}

int RunGpt2(int64_t batch, int threads, int steps, int warmup, int64_t tokens,
            const std::string& precision) {
  Gpt2 model;
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(6e-4).weight_decay(0.1));
  // train_step's tokens: one pseudo-random stream, each row's targets its next tokens.
  std::vector<int64_t> ids(batch * (tokens + 1));
  uint64_t state = 12345;
  for (int64_t& id : ids) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(kVocab));
  }
  const torch::Tensor all = torch::tensor(ids, torch::kInt64).view({batch, tokens + 1});
  const torch::Tensor x = all.narrow(1, 0, tokens).contiguous();
  const torch::Tensor y = all.narrow(1, 1, tokens).contiguous();
  auto step = [&] {
    torch::Tensor loss;
    {
      CpuAutocastScope autocast(precision == "bf16");
      loss = torch::nn::functional::cross_entropy(model->forward(x).view({-1, kVocab}),
                                                  y.reshape({-1}));
    }
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  };
  return Report(step, "gpt2", precision, batch, threads, steps, warmup);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 256;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 50;
  const int warmup = argc > 4 ? std::atoi(argv[4]) : 5;
  const std::string model_name = argc > 5 ? argv[5] : "mlp";
  const int64_t tokens = argc > 6 ? std::atoll(argv[6]) : 64;
  const std::string precision = argc > 7 ? argv[7] : "f32";
  if (batch < 1 || threads < 1 || steps < 1 || warmup < 0 ||
      (model_name != "mlp" && model_name != "gpt2") || tokens < 1 || tokens > kContext ||
      (precision != "f32" && precision != "bf16")) {
    std::fprintf(stderr,
                 "usage: libtorch_train_step [batch >= 1] [threads >= 1] [steps >= 1] "
                 "[warmup >= 0] [mlp|gpt2] [tokens in 1..1024] [f32|bf16]\n");
    return 1;
  }
  torch::set_num_threads(threads);
  torch::manual_seed(1);
  if (model_name == "gpt2") return RunGpt2(batch, threads, steps, warmup, tokens, precision);
  torch::nn::Sequential model(torch::nn::Flatten(), torch::nn::Linear(784, 256), torch::nn::ReLU(),
                              torch::nn::Linear(256, 128), torch::nn::ReLU(),
                              torch::nn::Linear(128, 10));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const torch::Tensor x = torch::randn({batch, 1, 28, 28});
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 7) % 10;
  const torch::Tensor y = torch::tensor(labels, torch::kInt64);

  auto step = [&] {
    torch::Tensor loss;
    {
      CpuAutocastScope autocast(precision == "bf16");
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  };
  return Report(step, "mlp", precision, batch, threads, steps, warmup);
}
