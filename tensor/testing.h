// Helpers for tests of Tandem's libraries (testonly target //tensor:testing): the message
// of an expected error, whether a GPU is present, and how far apart two tensors are.
//
//   EXPECT_THAT(tandem::testing::ErrorOf([&] { x.narrow(0, 5, 1); }),
//               ::testing::HasSubstr("out of range"));
//   if (!tandem::testing::HasCuda()) GTEST_SKIP() << tandem::testing::NoCudaReason();
#ifndef TANDEM_TENSOR_TESTING_H_
#define TANDEM_TENSOR_TESTING_H_

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

// The largest |a - b| over two tensors of the same shape, on any devices (float32).
double MaxAbsDiff(const Tensor& a, const Tensor& b);

}  // namespace testing
}  // namespace tandem

#endif  // TANDEM_TENSOR_TESTING_H_
