// The CPU's triangle kernel (tensor/kernels/triangle_kernels.h), registered at static
// initialisation: part of :cpu_backend, which is linked whole.
#include "tensor/kernels/triangle_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tensor/base/dtype.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cpu_internal {
namespace {

void CpuTriangle(int index, DType dtype, bool lower, int64_t diagonal, int64_t batch, int64_t rows,
                 int64_t cols, const void* src, void* dst) {
  CheckCpuIndex(index);
  const int64_t element = static_cast<int64_t>(ElementSize(dtype));
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(dst);
  // Every dtype's zero is all zero bits, so one byte-level loop serves them all: copy each
  // row's kept run, clear the rest.
  ParallelFor(Cpu(index), batch * rows, std::max<int64_t>(1, kElementwiseGrain / (cols + 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t item = begin; item < end; ++item) {
                  const int64_t i = item % rows;
                  const int64_t keep_begin =
                      lower ? 0 : std::min(cols, std::max<int64_t>(0, i + diagonal));
                  const int64_t keep_end =
                      lower ? std::min(cols, std::max<int64_t>(0, i + diagonal + 1)) : cols;
                  const int64_t row = item * cols * element;
                  std::memset(out + row, 0, keep_begin * element);
                  if (keep_end > keep_begin && in != out) {
                    std::memcpy(out + row + keep_begin * element, in + row + keep_begin * element,
                                (keep_end - keep_begin) * element);
                  }
                  if (keep_end < cols) {
                    std::memset(out + row + std::max(keep_begin, keep_end) * element, 0,
                                (cols - std::max(keep_begin, keep_end)) * element);
                  }
                }
              });
}

}  // namespace

TANDEM_REGISTER_KERNEL(TriangleKernel, DeviceType::kCPU, CpuTriangle);

}  // namespace cpu_internal
}  // namespace tandem
