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
#include "tensor/testing.h"

namespace tandem::nn::testing {

using ::tandem::testing::ErrorOf;
using ::tandem::testing::HasCuda;
using ::tandem::testing::MaxAbsDiff;

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
