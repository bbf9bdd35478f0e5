#include "data/fashion_mnist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/dataloader.h"
#include "data/idx.h"
#include "data/test_util.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem {
namespace data {
namespace {

using ::tandem::testing::ErrorOf;

using testing::IdxBytes;
using testing::InflateGzipFile;
using testing::MakeTempDir;
using testing::WriteGzipFile;

constexpr int kPixels = 28 * 28;

// A small Fashion-MNIST-shaped split in a temporary folder: image i has pixel p equal to
// (i * 31 + p) % 256 and label labels[i].
struct FakeSplit {
  std::string root;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
};

FakeSplit WriteFakeSplit(const std::string& prefix, const std::vector<uint8_t>& labels) {
  FakeSplit split;
  split.root = MakeTempDir("fashion");
  split.labels = labels;
  const auto n = static_cast<uint32_t>(labels.size());
  for (uint32_t i = 0; i < n; ++i) {
    for (int p = 0; p < kPixels; ++p)
      split.pixels.push_back(static_cast<uint8_t>((i * 31 + p) % 256));
  }
  WriteGzipFile(split.root + "/" + prefix + "-images-idx3-ubyte.gz",
                IdxBytes(2051, {n, 28, 28}, split.pixels));
  WriteGzipFile(split.root + "/" + prefix + "-labels-idx1-ubyte.gz", IdxBytes(2049, {n}, labels));
  return split;
}

TEST(FashionMnistFilesTest, ReadsASmallSplit) {
  const FakeSplit fake = WriteFakeSplit("t10k", {3, 0, 9});
  const FashionMnist dataset(fake.root, FashionMnist::Split::kTest);
  ASSERT_EQ(dataset.size(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    const Example example = dataset.get(i);
    ASSERT_EQ(example.size(), 2u);
    EXPECT_EQ(example[0].shape(), (Shape{1, 28, 28}));
    EXPECT_EQ(example[0].dtype(), kFloat32);
    EXPECT_EQ(example[1].shape(), (Shape{}));
    EXPECT_EQ(example[1].dtype(), kInt64);
    EXPECT_EQ(example[1].item<int64_t>(), fake.labels[i]);
    EXPECT_EQ(dataset.label(i), fake.labels[i]);
    const std::vector<float> image = example[0].to_vector<float>();
    for (int p = 0; p < kPixels; ++p) {
      ASSERT_EQ(image[p], fake.pixels[i * kPixels + p] / 255.0f) << "image " << i << " pixel " << p;
      ASSERT_EQ(dataset.pixels(i)[p], fake.pixels[i * kPixels + p]);
    }
  }
}

// Options().dtype(kUInt8): the raw bytes through get, get_batch, images() and a DataLoader
// (collation keeps uint8), and PixelsToFloat gives the float dataset's images afterwards.
TEST(FashionMnistFilesTest, Uint8ImagesStayBytesUntilConvertedToFloat) {
  const FakeSplit fake = WriteFakeSplit("train", {1, 2, 3, 4, 5});
  for (const bool normalize : {false, true}) {
    SCOPED_TRACE(normalize ? "normalised" : "scaled to [0, 1]");
    FashionMnist::Options float_options, byte_options;
    if (normalize) {
      float_options.normalize();
      byte_options.normalize();
    }
    byte_options.dtype(kUInt8);
    const auto floats =
        std::make_shared<FashionMnist>(fake.root, FashionMnist::Split::kTrain, float_options);
    const auto bytes =
        std::make_shared<FashionMnist>(fake.root, FashionMnist::Split::kTrain, byte_options);
    const Example example = bytes->get(3);
    EXPECT_EQ(example[0].dtype(), kUInt8);
    EXPECT_EQ(example[0].shape(), (Shape{1, 28, 28}));
    const std::vector<uint8_t> got = example[0].to_vector<uint8_t>();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), fake.pixels.begin() + 3 * kPixels));
    EXPECT_EQ(bytes->images().dtype(), kUInt8);
    EXPECT_EQ(bytes->images().to_vector<uint8_t>(), fake.pixels);
    // A DataLoader's collation (and its workers) keep the bytes.
    DataLoader loader(bytes, DataLoaderOptions().batch_size(2).num_workers(1));
    std::vector<uint8_t> collated;
    for (Batch& batch : loader) {
      ASSERT_EQ(batch.data().dtype(), kUInt8);
      const std::vector<uint8_t> part = batch.data().to_vector<uint8_t>();
      collated.insert(collated.end(), part.begin(), part.end());
      // Converted when the model asks, they are the float dataset's images.
      const Tensor x = PixelsToFloat(batch.data(), bytes->options());
      EXPECT_EQ(x.dtype(), kFloat32);
      EXPECT_TRUE(allclose(x, floats->get_batch(batch.indices).data(), 0, 0));
      EXPECT_EQ(PixelsToFloat(batch.data(), bytes->options(), kBFloat16).dtype(), kBFloat16);
    }
    EXPECT_EQ(collated, fake.pixels);
  }
  // A floating dtype other than float32: the float32 images rounded once.
  const FashionMnist halves(fake.root, FashionMnist::Split::kTrain,
                            FashionMnist::Options().dtype(kBFloat16));
  const FashionMnist singles(fake.root);
  EXPECT_EQ(halves.get_batch({2, 0}).data().dtype(), kBFloat16);
  EXPECT_TRUE(allclose(halves.get_batch({2, 0}).data().to(kFloat32),
                       singles.get_batch({2, 0}).data().to(kBFloat16).to(kFloat32), 0, 0));
  EXPECT_THAT(ErrorOf([&] {
                FashionMnist(fake.root, FashionMnist::Split::kTrain,
                             FashionMnist::Options().dtype(kInt32));
              }),
              ::testing::HasSubstr("images are uint8 (the raw bytes) or floating-point"));
  EXPECT_THAT(ErrorOf([&] { PixelsToFloat(singles.get(0)[0]); }),
              ::testing::HasSubstr("PixelsToFloat: expected uint8 pixels"));
}

TEST(FashionMnistFilesTest, GetBatchImagesAndLabelsAgreeWithGet) {
  const FakeSplit fake = WriteFakeSplit("train", {1, 2, 3, 4, 5});
  const FashionMnist dataset(fake.root);
  const Batch batch = dataset.get_batch({4, 1, 1});
  EXPECT_EQ(batch.data().shape(), (Shape{3, 1, 28, 28}));
  EXPECT_EQ(batch.target().to_vector<int64_t>(), (std::vector<int64_t>{5, 2, 2}));
  const Batch by_example = dataset.Dataset::get_batch({4, 1, 1});
  EXPECT_EQ(batch.data().to_vector<float>(), by_example.data().to_vector<float>());
  EXPECT_EQ(batch.target().to_vector<int64_t>(), by_example.target().to_vector<int64_t>());

  const Tensor images = dataset.images();
  EXPECT_EQ(images.shape(), (Shape{5, 1, 28, 28}));
  EXPECT_EQ(images.narrow(0, 4, 1).to_vector<float>(), dataset.get(4)[0].to_vector<float>());
  EXPECT_EQ(dataset.labels().to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(FashionMnistFilesTest, Normalises) {
  const FakeSplit fake = WriteFakeSplit("train", {0, 1});
  const FashionMnist dataset(fake.root, FashionMnist::Split::kTrain,
                             FashionMnist::Options().normalize(0.5f, 0.25f));
  const std::vector<float> image = dataset.get(1)[0].to_vector<float>();
  for (int p = 0; p < kPixels; ++p) {
    EXPECT_FLOAT_EQ(image[p], (fake.pixels[kPixels + p] / 255.0f - 0.5f) / 0.25f);
  }
  EXPECT_THROW(FashionMnist(fake.root, FashionMnist::Split::kTrain,
                            FashionMnist::Options().normalize(0.5f, 0.0f)),
               Error);
}

TEST(FashionMnistFilesTest, MissingFileNamesThePathAndThePackage) {
  const std::string root = MakeTempDir("fashion_missing");
  const std::string message = ErrorOf([&] { FashionMnist dataset(root); });
  EXPECT_NE(message.find(root + "/train-images-idx3-ubyte.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("apt-get install dataset-fashion-mnist"), std::string::npos) << message;
}

TEST(FashionMnistFilesTest, ImageAndLabelCountsMustAgree) {
  const FakeSplit fake = WriteFakeSplit("train", {1, 2, 3});
  WriteGzipFile(fake.root + "/train-labels-idx1-ubyte.gz", IdxBytes(2049, {2}, {1, 2}));
  const std::string message = ErrorOf([&] { FashionMnist dataset(fake.root); });
  EXPECT_NE(message.find("3 images"), std::string::npos) << message;
  EXPECT_NE(message.find("2 labels"), std::string::npos) << message;
}

TEST(FashionMnistFilesTest, LabelsOutsideTheClassesAreRejected) {
  const FakeSplit fake = WriteFakeSplit("train", {1, 10, 3});
  const std::string message = ErrorOf([&] { FashionMnist dataset(fake.root); });
  EXPECT_NE(message.find("label 10 of item 1"), std::string::npos) << message;
}

TEST(FashionMnistFilesTest, WrongImageSizeOrMagicIsRejected) {
  const FakeSplit fake = WriteFakeSplit("train", {1});
  const std::string images = fake.root + "/train-images-idx3-ubyte.gz";
  WriteGzipFile(images, IdxBytes(2051, {1, 27, 29}, std::vector<uint8_t>(27 * 29)));
  EXPECT_NE(ErrorOf([&] { FashionMnist dataset(fake.root); }).find("27x29"), std::string::npos);
  // Labels written where the images belong.
  WriteGzipFile(images, IdxBytes(2049, {1}, {1}));
  EXPECT_NE(ErrorOf([&] { FashionMnist dataset(fake.root); }).find("magic number 2049"),
            std::string::npos);
}

// Issue 14: a 32x24 header was reported as "4097+ unexpected bytes" (the data was read
// before the dimensions were checked).
TEST(FashionMnistFilesTest, WrongImageDimensionsAreReportedAsSuch) {
  const FakeSplit fake = WriteFakeSplit("train", {1, 2, 3, 4, 5, 6, 7});
  const std::string images = fake.root + "/train-images-idx3-ubyte.gz";
  // The header says 32x24 but the data is as long as seven 28x28 images.
  WriteGzipFile(images, IdxBytes(2051, {7, 32, 24}, fake.pixels));
  const std::string message = ErrorOf([&] { FashionMnist dataset(fake.root); });
  EXPECT_NE(message.find(images + " holds 32x24 images but Fashion-MNIST's are 28x28"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("unexpected bytes"), std::string::npos) << message;
}

TEST(FashionMnistFilesTest, AnEmptySplitNamesTheFile) {
  const FakeSplit fake = WriteFakeSplit("t10k", {});
  const std::string message =
      ErrorOf([&] { FashionMnist dataset(fake.root, FashionMnist::Split::kTest); });
  EXPECT_NE(message.find(fake.root + "/t10k-images-idx3-ubyte.gz holds no images"),
            std::string::npos)
      << message;
  // Images present, labels empty.
  const FakeSplit labels_only = WriteFakeSplit("t10k", {1});
  WriteGzipFile(labels_only.root + "/t10k-labels-idx1-ubyte.gz", IdxBytes(2049, {0}, {}));
  const std::string labels_message =
      ErrorOf([&] { FashionMnist dataset(labels_only.root, FashionMnist::Split::kTest); });
  EXPECT_NE(labels_message.find(labels_only.root + "/t10k-labels-idx1-ubyte.gz holds no labels"),
            std::string::npos)
      << labels_message;
}

TEST(FashionMnistFilesTest, TruncatedImagesAreRejected) {
  const FakeSplit fake = WriteFakeSplit("train", {1, 2});
  WriteGzipFile(fake.root + "/train-images-idx3-ubyte.gz",
                IdxBytes(2051, {2, 28, 28}, std::vector<uint8_t>(kPixels + 100)));
  const std::string message = ErrorOf([&] { FashionMnist dataset(fake.root); });
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST(FashionMnistFilesTest, ClassNames) {
  EXPECT_STREQ(FashionMnist::ClassName(0), "T-shirt/top");
  EXPECT_STREQ(FashionMnist::ClassName(9), "Ankle boot");
  EXPECT_THROW(FashionMnist::ClassName(10), Error);
}

// ---- The real dataset, from Debian's dataset-fashion-mnist -------------------------------

class RealFashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(FashionMnist::kDefaultRoot) +
                                 "/train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << FashionMnist::kDefaultRoot
                   << " is missing; install it with: apt-get install dataset-fashion-mnist";
    }
  }
  static std::string Path(const std::string& name) {
    return std::string(FashionMnist::kDefaultRoot) + "/" + name;
  }
};

TEST_F(RealFashionMnistTest, SizesShapesAndLabels) {
  const FashionMnist train;
  const FashionMnist test(FashionMnist::kDefaultRoot, FashionMnist::Split::kTest);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  const Batch batch = train.get_batch({0, 59999});
  EXPECT_EQ(batch.data().shape(), (Shape{2, 1, 28, 28}));
  EXPECT_EQ(batch.target().shape(), (Shape{2}));

  // Balanced classes: 6,000 training and 1,000 test images each.
  std::vector<int> train_counts(10, 0), test_counts(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) {
    const int64_t label = train.label(i);
    ASSERT_TRUE(label >= 0 && label <= 9) << label;
    ++train_counts[label];
  }
  for (int64_t i = 0; i < test.size(); ++i) ++test_counts[test.label(i)];
  EXPECT_EQ(train_counts, std::vector<int>(10, 6000));
  EXPECT_EQ(test_counts, std::vector<int>(10, 1000));
}

// Compares with the raw files, decompressed here by zlib's inflate (not the library's
// gzread path) and parsed by hand.
TEST_F(RealFashionMnistTest, MatchesTheRawFiles) {
  for (const auto split : {FashionMnist::Split::kTrain, FashionMnist::Split::kTest}) {
    const std::string prefix = FashionMnist::SplitPrefix(split);
    const std::vector<uint8_t> raw_images = InflateGzipFile(Path(prefix + "-images-idx3-ubyte.gz"));
    const std::vector<uint8_t> raw_labels = InflateGzipFile(Path(prefix + "-labels-idx1-ubyte.gz"));
    const FashionMnist dataset(FashionMnist::kDefaultRoot, split);
    ASSERT_EQ(raw_images.size(), 16 + static_cast<size_t>(dataset.size()) * kPixels);
    ASSERT_EQ(raw_labels.size(), 8 + static_cast<size_t>(dataset.size()));
    for (int64_t i = 0; i < dataset.size(); ++i) {
      ASSERT_EQ(dataset.label(i), raw_labels[8 + i]) << prefix << " item " << i;
    }
    for (const int64_t i : {int64_t{0}, int64_t{1}, int64_t{1234}, dataset.size() - 1}) {
      const uint8_t* raw = raw_images.data() + 16 + i * kPixels;
      int64_t raw_sum = 0;
      for (int p = 0; p < kPixels; ++p) raw_sum += raw[p];
      const std::vector<float> image = dataset.get(i)[0].to_vector<float>();
      double sum = 0;
      for (int p = 0; p < kPixels; ++p) {
        ASSERT_EQ(image[p], raw[p] / 255.0f) << prefix << " item " << i << " pixel " << p;
        sum += image[p];
      }
      EXPECT_NEAR(sum * 255.0, static_cast<double>(raw_sum), 1e-2) << prefix << " item " << i;
      EXPECT_GT(raw_sum, 0) << "an all-black image would make this check weak";
    }
  }
}

// The mean and std documented in fashion_mnist.h, measured on the training images.
TEST_F(RealFashionMnistTest, MeanAndStdOfTrainingPixels) {
  const std::vector<uint8_t> raw = InflateGzipFile(Path("train-images-idx3-ubyte.gz"));
  double sum = 0, sum_sq = 0;
  for (size_t i = 16; i < raw.size(); ++i) {
    const double v = raw[i] / 255.0;
    sum += v;
    sum_sq += v * v;
  }
  const double n = static_cast<double>(raw.size() - 16);
  const double mean = sum / n;
  const double std = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_NEAR(mean, kFashionMnistMean, 5e-5) << "measured mean " << mean;
  EXPECT_NEAR(std, kFashionMnistStd, 5e-5) << "measured std " << std;

  // Normalised with them, the training images have mean ~0 and std ~1.
  const FashionMnist normalised(FashionMnist::kDefaultRoot, FashionMnist::Split::kTrain,
                                FashionMnist::Options().normalize());
  const Tensor images = normalised.images();
  const double normalised_mean = images.mean().item();
  const double normalised_sq = (images * images).mean().item();
  EXPECT_NEAR(normalised_mean, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(normalised_sq - normalised_mean * normalised_mean), 1.0, 1e-3);
}

}  // namespace
}  // namespace data
}  // namespace tandem
