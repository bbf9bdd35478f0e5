// Links the static OpenBLAS (//third_party:openblas_static).
#include <cblas.h>
#include <gtest/gtest.h>

namespace {

TEST(OpenBlasStaticTest, Sdot) {
  const float x[3] = {1, 2, 3};
  const float y[3] = {4, 5, 6};
  EXPECT_FLOAT_EQ(cblas_sdot(3, x, 1, y, 1), 32.0f);
}

}  // namespace
