// TextCorpus: English text as byte tokens (vocabulary 256: no tokenizer, no download), split
// into training and validation text; TokenWindows: the Dataset a language model trains on,
// windows of `context` tokens and the same window shifted by one as next-token targets.
//
// The default corpus is Debian's `fortunes` package (tools/setup.sh installs it): about 2.4 MB
// of quotations, jokes, poems and definitions in ~40 files under /usr/share/games/fortunes,
// each entry ended by a line holding a single `%`. It is real, varied English that a small
// model learns visibly in minutes (bible-kjv-text ships only a compressed database that
// needs its own reader). Every tenth entry goes to validation, so both splits span every file
// and topic.
//
//   TextCorpus corpus = TextCorpus::Fortunes();
//   TokenWindows train(corpus.train(), /*context=*/128);
//   Batch batch = train.get_batch({0, 1});                 // int64 [2, 128] twice: x and y
//   std::string text = TextCorpus::Decode(batch.fields[0].to_vector<int64_t>());
#ifndef TANDEM_DATA_TEXT_CORPUS_H_
#define TANDEM_DATA_TEXT_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tandem {
namespace data {

// Byte tokens of a text, shared between the corpus and the datasets that read it.
using Tokens = std::shared_ptr<const std::vector<uint8_t>>;

class TextCorpus {
 public:
  static constexpr const char* kFortunesRoot = "/usr/share/games/fortunes";
  static constexpr int64_t kVocabularySize = 256;

  // Every fortune file directly in `root` (regular files without an extension; the `.dat`
  // indices and `.u8` variants are skipped), in name order, split into entries at the `%`
  // lines; entry i goes to validation when i % validation_every == validation_every - 1.
  // Throws a tandem::Error naming the fix when the folder is missing or holds no entries.
  static TextCorpus Fortunes(const std::string& root = kFortunesRoot,
                             int64_t validation_every = 10);
  // A corpus from entries already in memory (tests, other sources), split the same way.
  static TextCorpus FromEntries(const std::vector<std::string>& entries,
                                int64_t validation_every = 10);

  const Tokens& train() const { return train_; }
  const Tokens& validation() const { return validation_; }
  int64_t num_entries() const { return num_entries_; }

  static std::vector<int64_t> Encode(const std::string& text);
  // Token ids must be in [0, 256).
  static std::string Decode(const std::vector<int64_t>& tokens);

 private:
  TextCorpus() = default;
  Tokens train_, validation_;
  int64_t num_entries_ = 0;
};

// Example i: {x int64 [context], y int64 [context]}, x = tokens[i*stride, i*stride+context),
// y the same shifted by one. stride defaults to context (windows tile the text); smaller
// strides overlap them. Thread-safe, as Dataset requires.
class TokenWindows : public Dataset {
 public:
  TokenWindows(Tokens tokens, int64_t context, int64_t stride = 0);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices, bool pinned = false) const override;
  int64_t context() const { return context_; }

 private:
  Tokens tokens_;
  int64_t context_, stride_, size_;
};

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_TEXT_CORPUS_H_
