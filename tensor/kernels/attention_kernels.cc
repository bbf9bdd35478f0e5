#include "tensor/kernels/attention_kernels.h"

#include "tensor/base/error.h"

namespace tandem {

TANDEM_DEFINE_KERNEL(AttentionForwardKernel);
TANDEM_DEFINE_KERNEL(AttentionBackwardKernel);

namespace {

void CheckSizes(const char* kernel, Device device, const AttentionGeometry& g) {
  TANDEM_CHECK(
      g.batch >= 0 && g.query_len >= 0 && g.key_len >= 0 && g.head_dim >= 0 && g.value_dim >= 0,
      kernel, " on ", device, " expects non-negative sizes but got batch=", g.batch,
      " query_len=", g.query_len, " key_len=", g.key_len, " head_dim=", g.head_dim,
      " value_dim=", g.value_dim);
}

}  // namespace

void RunAttentionForward(Device device, DType dtype, const AttentionGeometry& g, const void* q,
                         const void* k, const void* v, const void* mask, void* out,
                         void* logsumexp) {
  CheckSizes("AttentionForward", device, g);
  AttentionForwardKernel(device, dtype, g, q, k, v, mask, out, logsumexp);
}

void RunAttentionBackward(Device device, DType dtype, const AttentionGeometry& g, const void* q,
                          const void* k, const void* v, const void* mask, const void* out,
                          const void* dout, const void* logsumexp, void* dq, void* dk, void* dv) {
  CheckSizes("AttentionBackward", device, g);
  AttentionBackwardKernel(device, dtype, g, q, k, v, mask, out, dout, logsumexp, dq, dk, dv);
}

}  // namespace tandem
