#include "data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "tensor/base/error.h"

namespace tandem {
namespace data {
namespace {

// Splits a fortune file's text into entries at lines that hold a single '%'; each entry keeps
// its trailing newline. Blank entries (two '%' lines in a row) are dropped.
void AppendEntries(const std::string& text, std::vector<std::string>* entries) {
  std::string entry;
  std::istringstream lines(text);
  std::string line;
  auto flush = [&] {
    if (entry.find_first_not_of(" \t\r\n") != std::string::npos) entries->push_back(entry);
    entry.clear();
  };
  while (std::getline(lines, line)) {
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      entry += line;
      entry += '\n';
    }
  }
  flush();
}

Tokens ToTokens(const std::string& text) {
  return std::make_shared<const std::vector<uint8_t>>(text.begin(), text.end());
}

}  // namespace

TextCorpus TextCorpus::Fortunes(const std::string& root, int64_t validation_every) {
  namespace fs = std::filesystem;
  std::error_code error;
  TANDEM_CHECK(fs::is_directory(root, error), "TextCorpus::Fortunes: expected the fortune files ",
               "in ", root, " but that folder does not exist; install Debian's `fortunes` ",
               "package (bash tools/setup.sh does) or pass the folder that holds them");
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    if (entry.is_regular_file() && !entry.path().has_extension()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> entries;
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    TANDEM_CHECK(in.good(), "TextCorpus::Fortunes: cannot read ", path.string(),
                 "; check its permissions");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    TANDEM_CHECK(!in.bad(), "TextCorpus::Fortunes: reading ", path.string(), " failed");
    AppendEntries(text, &entries);
  }
  TANDEM_CHECK(!entries.empty(), "TextCorpus::Fortunes: expected fortune files (entries ended by ",
               "a `%` line) in ", root, " but found ", files.size(),
               " files and no entries; reinstall the `fortunes` package");
  return FromEntries(entries, validation_every);
}

TextCorpus TextCorpus::FromEntries(const std::vector<std::string>& entries,
                                   int64_t validation_every) {
  TANDEM_CHECK(validation_every >= 2, "TextCorpus: validation_every must be at least 2 (every ",
               "n-th entry is held out) but is ", validation_every);
  TANDEM_CHECK(static_cast<int64_t>(entries.size()) >= validation_every,
               "TextCorpus: expected at least ", validation_every,
               " entries (so validation gets one) but got ", entries.size());
  std::string train, validation;
  for (size_t i = 0; i < entries.size(); ++i) {
    std::string& split =
        static_cast<int64_t>(i % validation_every) == validation_every - 1 ? validation : train;
    split += entries[i];
    split += "%\n";  // keep the corpus's own separator: a model learns where entries end
  }
  TextCorpus corpus;
  corpus.train_ = ToTokens(train);
  corpus.validation_ = ToTokens(validation);
  corpus.num_entries_ = static_cast<int64_t>(entries.size());
  return corpus;
}

std::vector<int64_t> TextCorpus::Encode(const std::string& text) {
  std::vector<int64_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string TextCorpus::Decode(const std::vector<int64_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    TANDEM_CHECK(tokens[i] >= 0 && tokens[i] < kVocabularySize, "TextCorpus::Decode: token ",
                 tokens[i], " at position ", i, " is not a byte (expected 0 to 255)");
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

TokenWindows::TokenWindows(Tokens tokens, int64_t context, int64_t stride)
    : tokens_(std::move(tokens)), context_(context), stride_(stride > 0 ? stride : context) {
  TANDEM_CHECK(tokens_ != nullptr, "TokenWindows: the token buffer is null");
  TANDEM_CHECK(context_ >= 1, "TokenWindows: context must be at least 1 but is ", context_);
  TANDEM_CHECK(stride >= 0, "TokenWindows: stride must be positive (0 for the context) but is ",
               stride);
  const auto n = static_cast<int64_t>(tokens_->size());
  TANDEM_CHECK(n >= context_ + 1, "TokenWindows: a window of ", context_,
               " tokens and its shifted target need ", context_ + 1, " tokens but the text has ", n,
               "; use a shorter context or a longer text");
  size_ = (n - context_ - 1) / stride_ + 1;
}

Example TokenWindows::get(int64_t index) const {
  Batch batch = get_batch({index});
  return {batch.fields[0].select(0, 0), batch.fields[1].select(0, 0)};
}

Batch TokenWindows::get_batch(const std::vector<int64_t>& indices, bool pinned) const {
  TANDEM_CHECK(!indices.empty(), "TokenWindows::get_batch needs at least one index but got none");
  for (const int64_t index : indices) CheckIndex(index, "TokenWindows::get_batch");
  const auto batch_size = static_cast<int64_t>(indices.size());
  const TensorOptions options = TensorOptions().dtype(kInt64).pinned(pinned);
  Tensor x = empty({batch_size, context_}, options);
  Tensor y = empty({batch_size, context_}, options);
  int64_t* xs = x.data_ptr<int64_t>();
  int64_t* ys = y.data_ptr<int64_t>();
  const uint8_t* text = tokens_->data();
  for (int64_t b = 0; b < batch_size; ++b) {
    const uint8_t* window = text + indices[b] * stride_;
    for (int64_t t = 0; t < context_; ++t) {
      xs[b * context_ + t] = window[t];
      ys[b * context_ + t] = window[t + 1];
    }
  }
  Batch batch;
  batch.indices = indices;
  batch.fields = {std::move(x), std::move(y)};
  return batch;
}

}  // namespace data
}  // namespace tandem
