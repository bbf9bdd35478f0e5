// FashionMnist: Zalando's Fashion-MNIST (70,000 28x28 grey images of clothes in 10 classes)
// read from the gzipped IDX files that Debian's `dataset-fashion-mnist` package installs in
// /usr/share/datasets/fashion-mnist. Both files of a split are read and checked once, at
// construction (magic numbers, dimensions, lengths, labels in 0..9, gzip integrity), and
// kept in memory as bytes (47 MB for the training split); examples are converted on the fly.
//
// Example i is {image float32 [1, 28, 28] in [0, 1] (or normalised), label int64 []}. With
// Options().dtype(kUInt8) the images stay the raw bytes 0..255 through get(), collation and
// the DataLoader (a quarter of the memory and copying, and of a host-to-device transfer),
// and become floats when the model asks: PixelsToFloat, on whatever device they are then.
//
//   FashionMnist bytes(FashionMnist::kDefaultRoot, FashionMnist::Split::kTrain,
//                      FashionMnist::Options().normalize().dtype(kUInt8));
//   Batch batch = bytes.get_batch({0, 1});                     // uint8 [2, 1, 28, 28]
//   Tensor x = PixelsToFloat(batch.fields[0].to(device), bytes.options());   // normalised
//
//   using tandem::data::FashionMnist;
//   FashionMnist train(FashionMnist::kDefaultRoot, FashionMnist::Split::kTrain,
//                      FashionMnist::Options().normalize());   // mean 0.2860, std 0.3530
//   tandem::data::Example e = train.get(0);
//   std::cout << FashionMnist::ClassName(train.label(0));      // "Ankle boot"
#ifndef TANDEM_DATA_FASHION_MNIST_H_
#define TANDEM_DATA_FASHION_MNIST_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tandem {
namespace data {

// Mean and standard deviation of the training images' pixels scaled to [0, 1]
// (measured by fashion_mnist_test: 0.28604 and 0.35302).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Hand-written, not TANDEM_ARG (tensor/base/arg.h): normalize() sets three fields at once, and
// called without arguments it turns normalisation on, where TANDEM_ARG's normalize() would be
// a getter and Options().normalize() would silently stop normalising.
struct FashionMnistOptions {
  bool normalize_ = false;
  float mean_ = kFashionMnistMean;
  float std_ = kFashionMnistStd;
  // The images' dtype: kFloat32 (the default), another floating dtype (the float32 values
  // rounded once), or kUInt8 for the raw bytes, which normalize() does not change: it then
  // says what PixelsToFloat(pixels, options) does.
  DType dtype_ = kFloat32;
  FashionMnistOptions& dtype(DType dtype) {
    dtype_ = dtype;
    return *this;
  }
  // Images become (pixel / 255 - mean) / std instead of pixel / 255.
  FashionMnistOptions& normalize(float mean = kFashionMnistMean, float std = kFashionMnistStd) {
    normalize_ = true;
    mean_ = mean;
    std_ = std;
    return *this;
  }
};

class FashionMnist : public Dataset {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";
  static constexpr int64_t kRows = 28;
  static constexpr int64_t kCols = 28;
  static constexpr int64_t kNumClasses = 10;
  static constexpr float kMean = kFashionMnistMean;
  static constexpr float kStd = kFashionMnistStd;

  enum class Split { kTrain, kTest };  // train-* (60,000 images) or t10k-* (10,000)

  using Options = FashionMnistOptions;

  // Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `root` (or the same names
  // without .gz). Throws tandem::Error naming the file for a missing file (and the Debian
  // package that provides it), a bad or truncated gzip stream, a wrong magic number or
  // image size (found from the header, before the data is read), an empty file, fewer or
  // more items than the header says, image and label counts that differ, or a label
  // outside 0..9.
  explicit FashionMnist(const std::string& root = kDefaultRoot, Split split = Split::kTrain,
                        Options options = Options());

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  // {image [1, 28, 28] in options' dtype (float32 by default), label int64 []}.
  Example get(int64_t index) const override;
  // {images [B, 1, 28, 28] in options' dtype, labels int64 [B]}, converted (or, for uint8,
  // copied) straight into the batch.
  Batch get_batch(const std::vector<int64_t>& indices, bool pinned = false) const override;

  // The whole split at once: [N, 1, 28, 28] in options' dtype (float32: 4 bytes per pixel,
  // 188 MB for the training split; uint8: 47 MB) and int64 [N].
  Tensor images() const;
  Tensor labels() const;

  // Cheap accessors to the stored data.
  int64_t label(int64_t index) const;
  // The 784 raw pixel bytes (0..255) of image `index`, row by row.
  const uint8_t* pixels(int64_t index) const;

  Split split() const { return split_; }
  const Options& options() const { return options_; }
  // "T-shirt/top", "Trouser", ..., "Ankle boot" for labels 0..9.
  static const char* ClassName(int64_t label);
  // "train" or "t10k", the files' prefix.
  static const char* SplitPrefix(Split split);

 private:
  void ConvertImage(int64_t index, float* out) const;
  // Images `indices`, one after another in a new tensor of `shape` in options' dtype.
  Tensor ImagesInDType(const std::vector<int64_t>& indices, const Shape& shape, bool pinned) const;

  Split split_;
  Options options_;
  std::vector<uint8_t> pixels_;  // size() * 784 bytes
  std::vector<uint8_t> labels_;
  std::array<float, 256> pixel_to_float_{};  // byte value -> scaled/normalised float
};

// uint8 pixels (any shape, on any device) as the floats a float dataset gives: pixel / 255,
// then (x - mean) / std when options.normalize_ is set; computed on the pixels' device and
// returned in `dtype` (any floating dtype). In float32, exactly the float32 dataset's images.
//   Tensor x = PixelsToFloat(batch.fields[0].to(Device::Cuda(0)), train.options());
Tensor PixelsToFloat(const Tensor& pixels, const FashionMnistOptions& options = {},
                     DType dtype = kFloat32);

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_FASHION_MNIST_H_
