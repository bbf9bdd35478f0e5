// The CPU's gather and scatter-add kernels (tensor/kernels/index_kernels.h), registered at
// static initialisation: part of :cpu_backend, which is linked whole.
#include "tensor/kernels/index_kernels.h"

#include <algorithm>
#include <cstdint>

#include "tensor/base/dtype.h"
#include "tensor/cpu/internal/cpu_loops.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {
namespace cpu_internal {
namespace {

void CpuGatherColumns(int index, DType dtype, void* dst_data, const void* src_data,
                      const int64_t* idx, int64_t rows, int64_t cols, const char* /*op*/) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU GatherColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (rows <= 0) return;
    ParallelFor(Cpu(index), rows, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dst[r] = src[r * cols + idx[r]];
    });
  });
}

void CpuScatterAddColumns(int index, DType dtype, void* dst_data, const void* src_data,
                          const int64_t* idx, int64_t rows, int64_t cols) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU ScatterAddColumns", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (rows <= 0) return;
    // Row r touches only row r of dst: no two tasks write the same element.
    ParallelFor(Cpu(index), rows, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dst[r * cols + idx[r]] += src[r];
    });
  });
}

void CpuGather(int index, DType dtype, void* dst_data, const void* src_data, const int64_t* idx,
               int64_t outer, int64_t src_dim, int64_t idx_dim, int64_t inner, const char* /*op*/) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU Gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    const int64_t n = outer * idx_dim * inner;
    if (n <= 0) return;
    ParallelFor(Cpu(index), n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        const int64_t o = e / (idx_dim * inner), i = e % inner;
        dst[e] = src[(o * src_dim + idx[e]) * inner + i];
      }
    });
  });
}

void CpuScatterAdd(int index, DType dtype, void* dst_data, const void* src_data, const int64_t* idx,
                   int64_t outer, int64_t dst_dim, int64_t idx_dim, int64_t inner) {
  CheckCpuIndex(index);
  DispatchAllFloatingTypes(dtype, "CPU ScatterAdd", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dst = static_cast<T*>(dst_data);
    const T* src = static_cast<const T*>(src_data);
    if (outer * idx_dim * inner <= 0) return;
    // Each task owns whole columns (o, i) of dst, so no two tasks write the same element, and
    // the additions into one element happen in j order: deterministic.
    ParallelFor(Cpu(index), outer * inner, std::max<int64_t>(1, kElementwiseGrain / idx_dim),
                [&](int64_t begin, int64_t end) {
                  for (int64_t column = begin; column < end; ++column) {
                    const int64_t o = column / inner, i = column % inner;
                    for (int64_t j = 0; j < idx_dim; ++j) {
                      const int64_t at = (o * idx_dim + j) * inner + i;
                      dst[(o * dst_dim + idx[at]) * inner + i] += src[at];
                    }
                  }
                });
  });
}

}  // namespace

TANDEM_REGISTER_KERNEL(GatherColumnsKernel, DeviceType::kCPU, CpuGatherColumns);
TANDEM_REGISTER_KERNEL(ScatterAddColumnsKernel, DeviceType::kCPU, CpuScatterAddColumns);
TANDEM_REGISTER_KERNEL(GatherKernel, DeviceType::kCPU, CpuGather);
TANDEM_REGISTER_KERNEL(ScatterAddKernel, DeviceType::kCPU, CpuScatterAdd);

}  // namespace cpu_internal
}  // namespace tandem
