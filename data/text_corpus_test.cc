// TextCorpus's parsing and split on written fortune files, TokenWindows' windows and targets,
// the errors, and (when Debian's `fortunes` package is installed) the real corpus.
#include "data/text_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "tensor/testing.h"

namespace tandem {
namespace data {
namespace {

using ::tandem::testing::ErrorOf;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const std::string dir =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(TextCorpusTest, SplitsEntriesAtPercentLinesAndHoldsOutEveryNth) {
  const std::string dir = TempDir("fortunes_split");
  // Files are read in name order; the .dat index is skipped.
  Write(dir + "/b", "three\n%\nfour\n%\n");
  Write(dir + "/a", "one\nline two\n%\n%\ntwo\n%\n");
  Write(dir + "/a.dat", "binary index, not text");
  const TextCorpus corpus = TextCorpus::Fortunes(dir, 2);
  EXPECT_EQ(corpus.num_entries(), 4);
  const std::string train(corpus.train()->begin(), corpus.train()->end());
  const std::string validation(corpus.validation()->begin(), corpus.validation()->end());
  EXPECT_EQ(train, "one\nline two\n%\nthree\n%\n");
  EXPECT_EQ(validation, "two\n%\nfour\n%\n");
}

TEST(TextCorpusTest, EncodeDecodeRoundTripsEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const std::vector<int64_t> tokens = TextCorpus::Encode(all);
  ASSERT_EQ(tokens.size(), 256u);
  EXPECT_EQ(tokens[200], 200);
  EXPECT_EQ(TextCorpus::Decode(tokens), all);
  EXPECT_THAT(ErrorOf([] { TextCorpus::Decode({65, 256}); }), HasSubstr("not a byte"));
}

TEST(TokenWindowsTest, TargetsAreInputsShiftedByOne) {
  const TextCorpus corpus = TextCorpus::FromEntries({"abcdefghij", "k", "lmnop"}, 3);
  const std::string text(corpus.train()->begin(), corpus.train()->end());
  ASSERT_EQ(text, "abcdefghij%\nk%\n");  // 15 bytes
  const TokenWindows windows(corpus.train(), 4);
  EXPECT_EQ(windows.size(), 3);  // starts 0, 4, 8; 12 has no room for a shifted target
  const Batch batch = windows.get_batch({2, 0});
  EXPECT_EQ(batch.fields[0].shape(), (Shape{2, 4}));
  EXPECT_EQ(batch.fields[0].dtype(), kInt64);
  EXPECT_EQ(TextCorpus::Decode(batch.fields[0].to_vector<int64_t>()), "ij%\nabcd");
  EXPECT_EQ(TextCorpus::Decode(batch.fields[1].to_vector<int64_t>()), "j%\nkbcde");
  const Example one = windows.get(1);
  EXPECT_EQ(TextCorpus::Decode(one[0].to_vector<int64_t>()), "efgh");
  const TokenWindows overlapping(corpus.train(), 4, 1);
  EXPECT_EQ(overlapping.size(), 11);
  EXPECT_EQ(TextCorpus::Decode(overlapping.get(10)[1].to_vector<int64_t>()), "\nk%\n");
}

TEST(TokenWindowsTest, WorksThroughTheDataLoader) {
  const TextCorpus corpus = TextCorpus::FromEntries(std::vector<std::string>(20, "hello\n"), 10);
  auto windows = std::make_shared<TokenWindows>(corpus.train(), 5);
  DataLoader loader(windows, DataLoaderOptions().batch_size(4).shuffle(true).seed(3));
  int64_t examples = 0;
  for (const Batch& batch : loader) {
    examples += batch.size();
    const std::vector<int64_t> x = batch.fields[0].to_vector<int64_t>();
    const std::vector<int64_t> y = batch.fields[1].to_vector<int64_t>();
    for (int64_t b = 0; b < batch.size(); ++b) {
      for (int64_t t = 0; t + 1 < 5; ++t) EXPECT_EQ(y[b * 5 + t], x[b * 5 + t + 1]);
    }
  }
  EXPECT_EQ(examples, windows->size());
}

TEST(TextCorpusTest, BadInputSaysWhatWasExpected) {
  EXPECT_THAT(ErrorOf([] { TextCorpus::Fortunes("/no/such/folder"); }),
              HasSubstr("install Debian's `fortunes`"));
  const std::string empty = TempDir("fortunes_empty");
  Write(empty + "/x", "%\n%\n");
  EXPECT_THAT(ErrorOf([&] { TextCorpus::Fortunes(empty); }), HasSubstr("no entries"));
  EXPECT_THAT(ErrorOf([] {
                TextCorpus::FromEntries({"a", "b"}, 10);
              }),
              HasSubstr("at least 10 entries"));
  EXPECT_THAT(ErrorOf([] { TextCorpus::FromEntries(std::vector<std::string>(4, "a"), 1); }),
              HasSubstr("at least 2"));
  const TextCorpus corpus = TextCorpus::FromEntries(std::vector<std::string>(10, "ab"), 10);
  EXPECT_THAT(ErrorOf([&] { TokenWindows(corpus.train(), 100); }), HasSubstr("shorter context"));
  EXPECT_THAT(ErrorOf([&] { TokenWindows(corpus.train(), 0); }), HasSubstr("at least 1"));
  const TokenWindows windows(corpus.train(), 2);
  EXPECT_THAT(ErrorOf([&] { windows.get(windows.size()); }), HasSubstr("out of range"));
}

TEST(TextCorpusTest, RealFortunesCorpus) {
  if (!std::filesystem::exists(TextCorpus::kFortunesRoot)) {
    GTEST_SKIP() << TextCorpus::kFortunesRoot << " is missing: install the `fortunes` package";
  }
  const TextCorpus corpus = TextCorpus::Fortunes();
  EXPECT_GT(corpus.num_entries(), 10000);
  const double held_out = double(corpus.validation()->size()) /
                          double(corpus.train()->size() + corpus.validation()->size());
  EXPECT_GT(held_out, 0.07);
  EXPECT_LT(held_out, 0.13);
  EXPECT_GT(corpus.train()->size(), 1000000u);
}

}  // namespace
}  // namespace data
}  // namespace tandem
