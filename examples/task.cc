#include "examples/task.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "data/fashion_mnist.h"
#include "data/subset.h"
#include "data/text_corpus.h"
#include "examples/cli.h"
#include "examples/models.h"

namespace tandem::examples {

void ResolveTaskDefaults(TaskOptions* o) {
  const bool text = o->model == "gpt";
  if (o->optimizer.empty()) o->optimizer = text ? "adamw" : "sgd";
  if (o->lr == 0) o->lr = text ? 1e-3 : 0.05;
  if (o->batch_size == 0) o->batch_size = text ? 8 : 128;
  if (o->data_dir.empty()) {
    o->data_dir = text ? data::TextCorpus::kFortunesRoot : data::FashionMnist::kDefaultRoot;
  }
  // Text: small batches, for many steps (a small GPT leaves the plateau of byte frequencies only
  // after a hundred or so), and 1024 windows an epoch (128 steps) spread over the whole text,
  // so that a few minutes' epochs each see every file.
  if (o->train_limit < 0) o->train_limit = text ? 1024 : 0;
  if (o->test_limit < 0) o->test_limit = text ? 256 : 0;
}

void EvalTotals::Add(const EvalTotals& other) {
  loss_sum += other.loss_sum;
  correct += other.correct;
  count += other.count;
}

double EvalTotals::loss() const { return count == 0 ? 0.0 : loss_sum / count; }
double EvalTotals::accuracy() const {
  return count == 0 ? 0.0 : static_cast<double>(correct) / count;
}
double EvalTotals::perplexity() const { return std::exp(loss()); }

EvalTotals ScoreBatch(const Tensor& logits, const Tensor& targets) {
  TANDEM_CHECK(logits.dim() == targets.dim() + 1 && (logits.dim() == 2 || logits.dim() == 3),
               "ScoreBatch: expected logits [N, C] with targets [N], or logits [B, T, V] with "
               "targets [B, T], but got logits ",
               ShapeToString(logits.shape()), " and targets ", ShapeToString(targets.shape()));
  const int64_t classes = logits.size(-1);
  const Tensor flat_logits = logits.reshape({-1, classes});
  const Tensor flat_targets = targets.to(logits.device()).reshape({-1});
  EvalTotals totals;
  totals.count = flat_targets.size(0);
  if (totals.count == 0) return totals;
  totals.loss_sum = cross_entropy(flat_logits, flat_targets).item() * totals.count;
  totals.correct = static_cast<int64_t>(sum(eq(argmax(flat_logits, 1), flat_targets)).item());
  return totals;
}

EvalTotals Evaluate(const Task& task, data::DataLoader& loader,
                    const std::function<Tensor(const Tensor&)>& forward) {
  NoGradGuard no_grad;
  EvalTotals totals;
  for (data::Batch& batch : loader)
    totals.Add(ScoreBatch(forward(task.Input(batch)), batch.target()));
  return totals;
}

namespace {

// A JSON string's contents: quotes, backslashes, control characters and bytes above 0x7f
// (a byte-level model may sample a lone half of a UTF-8 character) escaped as \u00XX.
std::string JsonEscape(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// Fashion-MNIST's 28x28 grey images in 10 classes, for --model=mlp, cnn or resnet.
class ImageTask : public Task {
 public:
  explicit ImageTask(TaskOptions options) : options_(std::move(options)) {}

  std::string DataName() const override { return "Fashion-MNIST"; }
  std::shared_ptr<nn::Module> MakeModel() override { return examples::MakeModel(options_.model); }

  void LoadData(bool with_test) override {
    train_set_ =
        data::FirstExamples(std::make_shared<data::FashionMnist>(
                                options_.data_dir, data::FashionMnist::Split::kTrain, pixels_),
                            options_.train_limit);
    if (!with_test) return;
    test_set_ =
        data::FirstExamples(std::make_shared<data::FashionMnist>(
                                options_.data_dir, data::FashionMnist::Split::kTest, pixels_),
                            options_.test_limit);
    majority_share_ = MajorityShare(*test_set_);
  }

  std::string DataLine() const override {
    return absl::StrFormat("Fashion-MNIST: %d training and %d test images from %s",
                           train_set_->size(), test_set_ ? test_set_->size() : 0,
                           options_.data_dir);
  }

  // uint8 images travel through the loader (a quarter of float32's bytes) and become the float
  // dataset's values on the device (data::PixelsToFloat: the same bits).
  Tensor Input(const data::Batch& batch) const override {
    return data::PixelsToFloat(batch.data(), pixels_);
  }
  nn::Module& criterion() override { return criterion_; }
  int64_t eval_batch_size() const override { return 1000; }

  std::string EpochMetrics(const EpochStats& e) const override {
    return absl::StrFormat("test loss %.4f  test acc %.2f%%", e.test_loss, 100.0 * e.test_accuracy);
  }
  std::string SummaryHeader() const override {
    return "  epoch   train loss   test loss   test acc   seconds   samples/s";
  }
  std::string SummaryRow(const EpochStats& e) const override {
    return absl::StrFormat("  %5d   %10.4f   %9.4f   %7.2f%%   %7.1f   %9.0f", e.epoch,
                           e.train_loss, e.test_loss, 100.0 * e.test_accuracy, e.seconds,
                           e.samples_per_s);
  }

  // A warning, not an error (exit status 0): the run did what it was asked; the flags did not
  // let it learn.
  std::string Report(const std::vector<EpochStats>& history, const std::string& optimizer,
                     double lr) override {
    const double accuracy = history.empty() ? 0.0 : history.back().test_accuracy;
    const int64_t test_images = history.empty() || !test_set_ ? 0 : test_set_->size();
    const std::string warning = ChanceLevelWarning(accuracy, data::FashionMnist::kNumClasses,
                                                   majority_share_, test_images, optimizer, lr);
    at_chance_ = !warning.empty();
    return warning;
  }
  std::string JsonMetrics(const std::vector<EpochStats>& history) const override {
    return absl::StrFormat("\"test_accuracy\":%.4f,",
                           history.empty() ? 0.0 : history.back().test_accuracy);
  }
  std::string JsonTail() const override {
    return absl::StrFormat("\"at_chance_level\":%s", at_chance_ ? "true" : "false");
  }

 private:
  TaskOptions options_;
  const data::FashionMnistOptions pixels_ = data::FashionMnistOptions().normalize().dtype(kUInt8);
  nn::CrossEntropyLoss criterion_;
  double majority_share_ = 0;
  bool at_chance_ = false;
};

// Windows of `limit` (0: all) spread evenly over `tokens`: a stride of at least the context,
// so that a short epoch still sees every part of the text.
std::shared_ptr<const data::Dataset> SpreadWindows(const data::Tokens& tokens, int64_t context,
                                                   int64_t limit) {
  const auto n = static_cast<int64_t>(tokens->size());
  int64_t stride = context;
  if (limit > 0 && n > context + 1) stride = std::max(context, (n - context - 1) / limit);
  return data::FirstExamples(std::make_shared<data::TokenWindows>(tokens, context, stride), limit);
}

// Next-byte prediction on the fortunes corpus with a GPT, for --model=gpt.
class TextTask : public Task {
 public:
  explicit TextTask(TaskOptions options) : options_(std::move(options)) {}

  std::string DataName() const override { return "fortunes"; }
  int64_t rows_per_sample() const override { return options_.gpt.block_size(); }
  std::shared_ptr<nn::Module> MakeModel() override {
    gpt_ = std::make_shared<Gpt>(options_.gpt);
    return gpt_;
  }

  void LoadData(bool with_test) override {
    const data::TextCorpus corpus = data::TextCorpus::Fortunes(options_.data_dir);
    const int64_t context = options_.gpt.block_size();
    train_bytes_ = static_cast<int64_t>(corpus.train()->size());
    validation_bytes_ = static_cast<int64_t>(corpus.validation()->size());
    train_set_ = SpreadWindows(corpus.train(), context, options_.train_limit);
    if (with_test) test_set_ = SpreadWindows(corpus.validation(), context, options_.test_limit);
  }

  std::string DataLine() const override {
    return absl::StrFormat(
        "fortunes: %d training and %d validation windows of %d bytes, spread over %d and %d bytes "
        "of text (every tenth fortune held out) from %s",
        train_set_->size(), test_set_ ? test_set_->size() : 0, options_.gpt.block_size(),
        train_bytes_, validation_bytes_, options_.data_dir);
  }
  std::string ModelLines() const override {
    const GptConfig& c = options_.gpt;
    return absl::StrFormat(
        "GPT: %d layers, %d heads, %d channels, context %d, dropout %g, vocabulary %d (bytes): "
        "%d parameters\n",
        c.n_layer(), c.n_head(), c.n_embd(), c.block_size(), c.dropout(), c.vocab_size(),
        gpt_ ? gpt_->num_parameters() : 0);
  }

  Tensor Input(const data::Batch& batch) const override { return batch.data(); }
  nn::Module& criterion() override { return criterion_; }
  int64_t eval_batch_size() const override { return 32; }

  std::string EpochMetrics(const EpochStats& e) const override {
    return absl::StrFormat("val loss %.4f  val ppl %.3f  next-byte acc %.2f%%", e.test_loss,
                           std::exp(e.test_loss), 100.0 * e.test_accuracy);
  }
  std::string SummaryHeader() const override {
    return "  epoch   train loss   val loss   val ppl   byte acc   seconds   windows/s";
  }
  std::string SummaryRow(const EpochStats& e) const override {
    return absl::StrFormat("  %5d   %10.4f   %8.4f   %7.3f   %7.2f%%   %7.1f   %9.1f", e.epoch,
                           e.train_loss, e.test_loss, std::exp(e.test_loss),
                           100.0 * e.test_accuracy, e.seconds, e.samples_per_s);
  }

  // The prompt continued by the trained model, sampled with a generator seeded from --seed:
  // the same flags print the same text.
  std::string Report(const std::vector<EpochStats>&, const std::string&, double) override {
    TANDEM_CHECK(gpt_ != nullptr, "TextTask::Report: MakeModel was not called");
    const std::vector<int64_t> ids = data::TextCorpus::Encode(options_.prompt);
    const Tensor prompt = from_vector(ids, {static_cast<int64_t>(ids.size())}).to(gpt_->device());
    Generator gen(options_.seed);
    const Tensor out = gpt_->Generate(prompt, options_.max_new_tokens, options_.temperature,
                                      options_.top_k, &gen, report_forward_);
    sample_ = data::TextCorpus::Decode(out.to(Device::Cpu(0)).to_vector<int64_t>());
    return absl::StrFormat(
        "Sample (--prompt, %d new bytes, temperature %g, top-k %d, seed %d):\n%s\n",
        options_.max_new_tokens, options_.temperature, options_.top_k, options_.seed, sample_);
  }
  std::string JsonMetrics(const std::vector<EpochStats>& history) const override {
    const double loss = history.empty() ? 0.0 : history.back().test_loss;
    return absl::StrFormat("\"test_accuracy\":%.4f,\"val_loss\":%.4f,\"val_perplexity\":%.3f,",
                           history.empty() ? 0.0 : history.back().test_accuracy, loss,
                           std::exp(loss));
  }
  std::string JsonTail() const override {
    return absl::StrFormat("\"sample\":\"%s\"", JsonEscape(sample_));
  }

 private:
  TaskOptions options_;
  std::shared_ptr<Gpt> gpt_;
  GptLoss criterion_;
  int64_t train_bytes_ = 0, validation_bytes_ = 0;
  std::string sample_;
};

}  // namespace

std::unique_ptr<Task> MakeTask(const TaskOptions& options) {
  if (options.model == "gpt") {
    const GptConfig& c = options.gpt;
    Require(c.block_size() >= 1 && c.n_layer() >= 1 && c.n_head() >= 1 && c.n_embd() >= 1,
            "--context, --n_layer, --n_head and --n_embd must be at least 1 but are ",
            c.block_size(), ", ", c.n_layer(), ", ", c.n_head(), " and ", c.n_embd());
    Require(c.n_embd() % c.n_head() == 0, "--n_embd (", c.n_embd(),
            ") must be a multiple of --n_head (", c.n_head(), "): each head gets n_embd / n_head ",
            "channels; try --n_embd=", (c.n_embd() / c.n_head() + 1) * c.n_head());
    Require(c.dropout() >= 0 && c.dropout() < 1, "--dropout must be in [0, 1) but is ",
            c.dropout());
    Require(!options.prompt.empty(), "--prompt must not be empty: the sample continues it");
    Require(options.max_new_tokens >= 0, "--max_new_tokens must be at least 0 but is ",
            options.max_new_tokens);
    Require(std::isfinite(options.temperature) && options.temperature > 0,
            "--temperature must be a finite number above 0 but is ", options.temperature,
            "; try --temperature=0.8");
    Require(options.top_k >= 1, "--top_k must be at least 1 but is ", options.top_k,
            "; --top_k=256 samples from every byte");
    return std::make_unique<TextTask>(options);
  }
  Require(options.model == "mlp" || options.model == "cnn" || options.model == "resnet",
          "--model must be 'mlp', 'cnn', 'resnet' or 'gpt' but is '", options.model, "'");
  return std::make_unique<ImageTask>(options);
}

}  // namespace tandem::examples
