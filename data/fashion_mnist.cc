#include "data/fashion_mnist.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "data/idx.h"

namespace tandem {
namespace data {

namespace {

constexpr int64_t kImageBytes = FashionMnist::kRows * FashionMnist::kCols;

// root/name.gz, or root/name when only the uncompressed file is there. Throws naming the
// .gz file and the Debian package that provides it when neither exists.
std::string FindFile(const std::string& root, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path gzipped = fs::path(root) / (name + ".gz");
  const fs::path plain = fs::path(root) / name;
  std::error_code error;
  if (fs::exists(gzipped, error)) return gzipped.string();
  if (fs::exists(plain, error)) return plain.string();
  TANDEM_FAIL("Fashion-MNIST file not found: ", gzipped.string(),
              ". Install it with: apt-get install dataset-fashion-mnist (Debian's package puts "
              "the files in ",
              FashionMnist::kDefaultRoot, "), or pass the folder that holds ", name,
              ".gz as the root");
}

// What byte `value` becomes in a float dataset: one definition for the dataset's table and for
// PixelsToFloat, so that uint8 images converted later are the float images bit for bit.
float PixelValue(int value, const FashionMnistOptions& options) {
  const float scaled = static_cast<float>(value) / 255.0f;
  return options.normalize_ ? (scaled - options.mean_) / options.std_ : scaled;
}

}  // namespace

const char* FashionMnist::ClassName(int64_t label) {
  static constexpr const char* kNames[kNumClasses] = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  TANDEM_CHECK(label >= 0 && label < kNumClasses, "FashionMnist::ClassName: label ", label,
               " is outside 0..", kNumClasses - 1);
  return kNames[label];
}

const char* FashionMnist::SplitPrefix(Split split) {
  return split == Split::kTrain ? "train" : "t10k";
}

FashionMnist::FashionMnist(const std::string& root, Split split, Options options)
    : split_(split), options_(options) {
  TANDEM_CHECK(!options.normalize_ || (std::isfinite(options.std_) && options.std_ > 0 &&
                                       std::isfinite(options.mean_)),
               "FashionMnist: normalize needs a finite mean and a positive finite std but got "
               "mean ",
               options.mean_, ", std ", options.std_);
  TANDEM_CHECK(options.dtype_ == kUInt8 || IsFloatingPoint(options.dtype_),
               "FashionMnist: images are uint8 (the raw bytes) or floating-point (float32, "
               "float64, bfloat16, float16) but dtype is ",
               options.dtype_, "; pick one of those");
  const std::string prefix = SplitPrefix(split);
  const std::string images_path = FindFile(root, prefix + "-images-idx3-ubyte");
  const std::string labels_path = FindFile(root, prefix + "-labels-idx1-ubyte");

  // Checked on the headers, before the data is read: a file of other images is reported as
  // such, not as the length mismatch it leads to.
  IdxArray images = ReadIdxFile(images_path, 3, [&](const std::vector<int64_t>& dims) {
    TANDEM_CHECK(dims[1] == kRows && dims[2] == kCols, images_path, " holds ", dims[1], "x",
                 dims[2], " images but Fashion-MNIST's are ", kRows, "x", kCols,
                 "; this is not a Fashion-MNIST file");
    TANDEM_CHECK(dims[0] > 0, images_path,
                 " holds no images (its header says 0) but a Fashion-MNIST split is never "
                 "empty; the file is truncated or not a Fashion-MNIST file: reinstall "
                 "dataset-fashion-mnist");
  });
  IdxArray labels = ReadIdxFile(labels_path, 1, [&](const std::vector<int64_t>& dims) {
    TANDEM_CHECK(dims[0] > 0, labels_path,
                 " holds no labels (its header says 0) but a Fashion-MNIST split is never "
                 "empty; the file is truncated or not a Fashion-MNIST file: reinstall "
                 "dataset-fashion-mnist");
  });
  TANDEM_CHECK(images.dims[0] == labels.dims[0], images_path, " holds ", images.dims[0],
               " images but ", labels_path, " holds ", labels.dims[0],
               " labels; the two files must come from the same split and release");
  for (size_t i = 0; i < labels.bytes.size(); ++i) {
    TANDEM_CHECK(labels.bytes[i] < kNumClasses, labels_path, ": label ", int{labels.bytes[i]},
                 " of item ", i, " is outside 0..", kNumClasses - 1, "; the file is corrupt");
  }
  pixels_ = std::move(images.bytes);
  labels_ = std::move(labels.bytes);

  for (int value = 0; value < 256; ++value) pixel_to_float_[value] = PixelValue(value, options);
}

int64_t FashionMnist::label(int64_t index) const {
  CheckIndex(index, "FashionMnist::label");
  return labels_[index];
}

const uint8_t* FashionMnist::pixels(int64_t index) const {
  CheckIndex(index, "FashionMnist::pixels");
  return pixels_.data() + index * kImageBytes;
}

void FashionMnist::ConvertImage(int64_t index, float* out) const {
  const uint8_t* in = pixels_.data() + index * kImageBytes;
  for (int64_t p = 0; p < kImageBytes; ++p) out[p] = pixel_to_float_[in[p]];
}

Tensor FashionMnist::ImagesInDType(const std::vector<int64_t>& indices, const Shape& shape,
                                   bool pinned) const {
  const bool bytes = options_.dtype_ == kUInt8;
  // float32 is converted into place; other floating dtypes round the float32 values once.
  const bool direct = bytes || options_.dtype_ == kFloat32;
  Tensor images = empty(shape, TensorOptions(bytes ? kUInt8 : kFloat32).pinned(pinned && direct));
  for (size_t b = 0; b < indices.size(); ++b) {
    if (bytes) {
      std::memcpy(images.data<uint8_t>() + b * kImageBytes,
                  pixels_.data() + indices[b] * kImageBytes, kImageBytes);
    } else {
      ConvertImage(indices[b], images.data<float>() + b * kImageBytes);
    }
  }
  if (direct) return images;
  Tensor converted = images.to(options_.dtype_);
  return pinned ? converted.pin_memory() : converted;
}

Example FashionMnist::get(int64_t index) const {
  CheckIndex(index, "FashionMnist::get");
  Tensor image = ImagesInDType({index}, {1, kRows, kCols}, false);
  Tensor label = scalar_tensor(static_cast<double>(labels_[index]), kInt64);
  return {image, label};
}

Batch FashionMnist::get_batch(const std::vector<int64_t>& indices, bool pinned) const {
  TANDEM_CHECK(!indices.empty(), "FashionMnist::get_batch needs at least one index but got none");
  for (const int64_t index : indices) CheckIndex(index, "FashionMnist::get_batch");
  const auto batch_size = static_cast<int64_t>(indices.size());
  Tensor images = ImagesInDType(indices, {batch_size, 1, kRows, kCols}, pinned);
  Tensor labels = empty({batch_size}, TensorOptions().dtype(kInt64).pinned(pinned));
  int64_t* label_data = labels.data<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) label_data[b] = labels_[indices[b]];
  Batch batch;
  batch.fields = {images, labels};
  batch.indices = indices;
  return batch;
}

Tensor FashionMnist::images() const {
  std::vector<int64_t> all(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) all[i] = i;
  return ImagesInDType(all, {size(), 1, kRows, kCols}, false);
}

Tensor FashionMnist::labels() const {
  return from_vector(std::vector<int64_t>(labels_.begin(), labels_.end()), {size()}, kInt64);
}

Tensor PixelsToFloat(const Tensor& pixels, const FashionMnistOptions& options, DType dtype) {
  TANDEM_CHECK(pixels.defined() && pixels.dtype() == kUInt8,
               "PixelsToFloat: expected uint8 pixels (a FashionMnist with dtype(kUInt8)) but got ",
               pixels.defined() ? DTypeName(pixels.dtype()) : "an undefined tensor",
               "; float images are already converted");
  TANDEM_CHECK(IsFloatingPoint(dtype), "PixelsToFloat: dtype must be floating-point (float32, ",
               "float64, bfloat16 or float16) but is ", dtype);
  // A lookup in the float dataset's 256 values, on the pixels' device: the same float32 bits
  // as the float dataset (a multiply-add in float32 differs from them by an ulp at times, and
  // a trainer must train alike on either), then rounded once to dtype.
  std::vector<float> table(256);
  for (int value = 0; value < 256; ++value) table[value] = PixelValue(value, options);
  const Tensor values = from_vector(table, {256}).to(pixels.device());
  const Tensor x = index_select(values, 0, pixels.reshape({pixels.numel()}).to(kInt64));
  return x.reshape(pixels.shape()).to(dtype);
}

}  // namespace data
}  // namespace tandem
