// Helpers shared by nn's tests.
#ifndef TANDEM_NN_TEST_UTIL_H_
#define TANDEM_NN_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tandem::nn::testing {

// The message of the tandem::Error that `fn` throws, or "<no error>".
inline std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

inline bool HasCuda() { return DeviceCount(DeviceType::kCUDA) > 0; }

// Largest |a - b| over two tensors of the same shape (on any devices).
inline double MaxAbsDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = a.to(Device::Cpu(0)).to_vector<float>();
  const std::vector<float> y = b.to(Device::Cpu(0)).to_vector<float>();
  double worst = 0.0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
  }
  return worst;
}

}  // namespace tandem::nn::testing

// Skips a test, saying why, on machines without a CUDA device.
#define TANDEM_SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                                    \
    if (!::tandem::nn::testing::HasCuda()) {                                              \
      GTEST_SKIP() << "no CUDA device in this process (DeviceCount(kCUDA) == 0: no GPU, " \
                      "no driver, or a build without CUDA)";                              \
    }                                                                                     \
  } while (false)

#endif  // TANDEM_NN_TEST_UTIL_H_
