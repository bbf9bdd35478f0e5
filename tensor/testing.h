// Helpers for tests of Tandem's libraries (testonly target //tensor:testing): the message
// of an expected error, whether a GPU is present, how far apart two tensors are, and a
// file-size limit that makes writes fail part-way (as a full disk does).
//
//   EXPECT_THAT(tandem::testing::ErrorOf([&] { x.narrow(0, 5, 1); }),
//               ::testing::HasSubstr("out of range"));
//   if (!tandem::testing::HasCuda()) GTEST_SKIP() << tandem::testing::NoCudaReason();
//   { tandem::testing::FileSizeLimit limit(100); /* a write past 100 bytes fails: EFBIG */ }
#ifndef TANDEM_TENSOR_TESTING_H_
#define TANDEM_TENSOR_TESTING_H_

#include <sys/resource.h>

#include <cstdint>
#include <functional>
#include <string>

#include "tensor/tensor.h"

namespace tandem {
namespace testing {

// The message of the tandem::Error that `fn` throws, or "<no error>".
std::string ErrorOf(const std::function<void()>& fn);

// Whether this process can use cuda:0, and if not, why (for GTEST_SKIP).
bool HasCuda();
std::string NoCudaReason();

// The largest |a - b| over two tensors of the same shape, on any devices, computed in float64.
double MaxAbsDiff(const Tensor& a, const Tensor& b);

// While alive, no file of this process may grow past `bytes` (RLIMIT_FSIZE) and SIGXFSZ is
// ignored, so a write past it fails with EFBIG instead of killing the process: a portable
// stand-in for a full disk. Restores both on destruction; throws if the limit cannot be set.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes);
  ~FileSizeLimit();
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_;
  void (*saved_handler_)(int);
};

}  // namespace testing
}  // namespace tandem

#endif  // TANDEM_TENSOR_TESTING_H_
