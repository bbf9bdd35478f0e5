// The trainer's tasks: the evaluation's sums on handmade logits (loss per prediction,
// perplexity, accuracy counts), the defaults each model gets, flag errors, and the text task on
// a small fortune file (windows spread over the text, a repeatable sample of the prompt).
#include "examples/task.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/dataloader.h"
#include "data/tensor_dataset.h"
#include "data/text_corpus.h"
#include "examples/cli.h"
#include "tensor/tensor.h"

namespace tandem::examples {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ScoreBatchTest, ClassLogitsGiveSummedCrossEntropyAndCorrectCount) {
  // Row 0 predicts class 0 (its target), row 1 class 1 (target 2).
  const Tensor logits = from_vector(std::vector<float>{2, 0, 0, 0, 1, 0}, {2, 3});
  const Tensor targets = from_vector(std::vector<int64_t>{0, 2}, {2});
  const EvalTotals t = ScoreBatch(logits, targets);
  const double e = std::exp(1.0);
  const double expected = (std::log(e * e + 2) - 2) + std::log(2 + e);
  EXPECT_NEAR(t.loss_sum, expected, 1e-5);
  EXPECT_EQ(t.correct, 1);
  EXPECT_EQ(t.count, 2);
  EXPECT_NEAR(t.loss(), expected / 2, 1e-5);
  EXPECT_DOUBLE_EQ(t.accuracy(), 0.5);
}

TEST(ScoreBatchTest, UniformTokenLogitsHavePerplexityOfTheVocabulary) {
  // [B=2, T=3, V=5], all equal except position (1, 2), sure of its target 4.
  std::vector<float> values(2 * 3 * 5, 0.0f);
  values[(1 * 3 + 2) * 5 + 4] = 100.0f;
  const Tensor logits = from_vector(values, {2, 3, 5});
  const Tensor targets = from_vector(std::vector<int64_t>{1, 2, 3, 0, 0, 4}, {2, 3});
  const EvalTotals t = ScoreBatch(logits, targets);
  EXPECT_EQ(t.count, 6);  // every position is a prediction
  // argmax of an all-equal row is 0: targets 0 at (1, 0) and (1, 1) count, and (1, 2).
  EXPECT_EQ(t.correct, 3);
  EXPECT_NEAR(t.loss_sum, 5 * std::log(5.0), 1e-4);
  EXPECT_NEAR(t.perplexity(), std::exp(5 * std::log(5.0) / 6), 1e-3);

  EvalTotals uniform = ScoreBatch(zeros({1, 4, 7}), zeros({1, 4}, kInt64));
  EXPECT_NEAR(uniform.perplexity(), 7.0, 1e-4);
}

TEST(ScoreBatchTest, TotalsAddUpAcrossBatchesOfDifferentSizes) {
  EvalTotals a{3.0, 1, 2}, b{6.0, 3, 4};
  a.Add(b);
  EXPECT_DOUBLE_EQ(a.loss(), 9.0 / 6);  // per prediction, not the mean of the batch means
  EXPECT_DOUBLE_EQ(a.accuracy(), 4.0 / 6);
  EXPECT_DOUBLE_EQ(EvalTotals().loss(), 0.0);
  EXPECT_DOUBLE_EQ(EvalTotals().accuracy(), 0.0);
}

TEST(ScoreBatchTest, MismatchedShapesAreRefused) {
  try {
    ScoreBatch(zeros({2, 3, 5}), zeros({2}, kInt64));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("expected logits [N, C] with targets [N]"));
  }
}

TEST(EvaluateTest, SumsEveryBatchOfTheLoader) {
  // 5 examples in batches of 2: 2 + 2 + 1. The "model" puts all its weight on class 1.
  const Tensor inputs = zeros({5, 1});
  const Tensor targets = from_vector(std::vector<int64_t>{1, 0, 1, 1, 2}, {5});
  data::DataLoader loader(
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{inputs, targets}),
      data::DataLoaderOptions().batch_size(2));
  // The text task's input is the batch's first field as it is (an image task's would be made
  // floats as Fashion-MNIST's uint8 pixels); nothing is loaded.
  TaskOptions options;
  options.model = "gpt";
  ResolveTaskDefaults(&options);
  std::unique_ptr<Task> text = MakeTask(options);
  int calls = 0;
  const EvalTotals t = Evaluate(*text, loader, [&](const Tensor& x) {
    ++calls;
    Tensor logits = zeros({x.size(0), 3});
    logits.select(1, 1).fill_(10.0);
    return logits;
  });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(t.count, 5);
  EXPECT_EQ(t.correct, 3);
}

TEST(TaskDefaultsTest, EachModelGetsItsOwnAndSetValuesStay) {
  TaskOptions image;
  ResolveTaskDefaults(&image);
  EXPECT_EQ(image.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(image.lr, 0.05);
  EXPECT_EQ(image.batch_size, 128);
  EXPECT_EQ(image.train_limit, 0);
  EXPECT_EQ(image.data_dir, "/usr/share/datasets/fashion-mnist");

  TaskOptions text;
  text.model = "gpt";
  ResolveTaskDefaults(&text);
  EXPECT_EQ(text.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(text.lr, 1e-3);
  EXPECT_EQ(text.batch_size, 8);
  EXPECT_EQ(text.train_limit, 1024);
  EXPECT_EQ(text.test_limit, 256);
  EXPECT_EQ(text.data_dir, "/usr/share/games/fortunes");

  TaskOptions set;
  set.model = "gpt";
  set.optimizer = "sgd";
  set.lr = 0.3;
  set.batch_size = 4;
  set.train_limit = 0;
  ResolveTaskDefaults(&set);
  EXPECT_EQ(set.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(set.lr, 0.3);
  EXPECT_EQ(set.batch_size, 4);
  EXPECT_EQ(set.train_limit, 0);
}

TEST(MakeTaskTest, BadModelOrSizesAreUsageErrors) {
  TaskOptions o;
  o.model = "vgg";
  EXPECT_THROW(
      {
        try {
          MakeTask(o);
        } catch (const UsageError& e) {
          EXPECT_THAT(e.what(), HasSubstr("--model must be 'mlp', 'cnn', 'resnet' or 'gpt'"));
          throw;
        }
      },
      UsageError);
  o.model = "gpt";
  o.gpt = GptConfig::Small().n_head(3);
  try {
    MakeTask(o);
    FAIL() << "expected an error";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--n_embd (128) must be a multiple of --n_head (3)"));
  }
  o.gpt = GptConfig::Small();
  o.temperature = 0;
  EXPECT_THROW(MakeTask(o), UsageError);
}

// A fortune file of 40 entries in a fresh folder.
std::string WriteFortunes() {
  const std::string dir =
      (std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") /
       "task_test_fortunes")
          .string();
  std::filesystem::create_directories(dir);
  std::ofstream out(dir + "/sayings");
  for (int i = 0; i < 40; ++i) {
    out << "Saying number " << i << ": a stitch in time saves nine, they say.\n%\n";
  }
  return dir;
}

TEST(TextTaskTest, SpreadsWindowsOverTheTextAndSamplesThePromptRepeatably) {
  TaskOptions o;
  o.model = "gpt";
  o.data_dir = WriteFortunes();
  o.train_limit = 10;
  o.test_limit = 0;  // every validation window
  o.gpt = GptConfig::Small().block_size(16).n_layer(1).n_head(2).n_embd(16);
  o.prompt = "Saying";
  o.max_new_tokens = 12;
  ResolveTaskDefaults(&o);
  std::unique_ptr<Task> task = MakeTask(o);
  manual_seed(3);
  std::shared_ptr<nn::Module> model = task->MakeModel();
  task->LoadData(/*with_test=*/true);
  EXPECT_EQ(task->train_set()->size(), 10);
  // 4 of the 40 entries (about 240 bytes) held out: windows of 16 tile them.
  EXPECT_GT(task->test_set()->size(), 10);
  // Window i starts at i * stride, the stride spreading the 10 windows over the whole text.
  const data::Tokens text = data::TextCorpus::Fortunes(o.data_dir).train();
  const auto n = static_cast<int64_t>(text->size());
  const int64_t stride = (n - 16 - 1) / 10;
  ASSERT_GT(stride, 16);
  const std::vector<int64_t> last = task->train_set()->get_batch({9}).data().to_vector<int64_t>();
  EXPECT_EQ(last,
            std::vector<int64_t>(text->begin() + 9 * stride, text->begin() + 9 * stride + 16));
  EXPECT_GT(9 * stride + 16, n * 8 / 10);  // near the end
  EXPECT_THAT(task->DataLine(), StartsWith("fortunes: 10 training and "));
  EXPECT_THAT(task->ModelLines(), HasSubstr("1 layers, 2 heads, 16 channels, context 16"));

  const std::string a = task->Report({}, "adamw", 1e-3);
  const std::string b = task->Report({}, "adamw", 1e-3);
  EXPECT_EQ(a, b);  // seeded from --seed
  EXPECT_THAT(a, HasSubstr("\nSaying"));
  EXPECT_THAT(task->JsonTail(), StartsWith("\"sample\":\"Saying"));
  EXPECT_EQ(task->JsonTail().find('\n'), std::string::npos);  // escaped: one JSON line
}

TEST(GptLossTest, IsTheMeanOverEveryPosition) {
  manual_seed(5);
  const Tensor logits = randn({2, 3, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{0, 1, 2, 3, 0, 1}, {2, 3});
  GptLoss criterion;
  const double loss = criterion.forward(logits, targets).item();
  EXPECT_NEAR(loss, ScoreBatch(logits, targets).loss(), 1e-6);
}

}  // namespace
}  // namespace tandem::examples
