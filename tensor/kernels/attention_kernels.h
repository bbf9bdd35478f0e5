// The fused attention kernels of scaled_dot_product_attention (KernelStub,
// tensor/runtime/kernel_stub.h) and their geometry. Each backend registers its kernels beside its
// code (tensor/cpu/attention_kernels.cc, tensor/cuda/attention_kernels.cc); tensor/ops/attention.cc
// calls RunAttentionForward and RunAttentionBackward, which check the sizes once and dispatch on
// the device's type.
//
//   AttentionGeometry g;
//   g.batch = batch * heads, g.query_len = l, g.key_len = s, g.head_dim = e, g.value_dim = ev;
//   g.scale = 1.0 / std::sqrt(e);
//   RunAttentionForward(q.device(), q.dtype(), g, q_ptr, k_ptr, v_ptr, /*mask=*/nullptr, out_ptr,
//                       logsumexp_ptr);
#ifndef TANDEM_TENSOR_KERNELS_ATTENTION_KERNELS_H_
#define TANDEM_TENSOR_KERNELS_ATTENTION_KERNELS_H_

#include <cstdint>

#include "tensor/base/device.h"
#include "tensor/base/dtype.h"
#include "tensor/runtime/kernel_stub.h"

namespace tandem {

// Note [Fused attention]: softmax(q k^T * scale + mask) v for `batch` independent heads,
// computed a tile of keys at a time with an online softmax (running max and sum), so that
// the query_len x key_len matrix never exists in memory; the backward recomputes the
// probabilities from the saved log-sum-exp (FlashAttention-2). Operands are q [batch,
// query_len, head_dim], k [batch, key_len, head_dim], v [batch, key_len, value_dim], out [batch,
// query_len, value_dim] (dout, dq, dk, dv as out, q, k, v), all of one floating dtype, each
// contiguous unless its AttentionRows says where its rows are (a head split [B, L, H, E] read
// in place as [B * H, L, E]); logsumexp [batch, query_len] is contiguous, float64 for float64
// operands and float32 otherwise (the kernels' accumulation type: 16-bit operands load as
// float, accumulate in float and round once when stored).
//
// Where an operand's rows are: row i of batch entry b starts at element (b / heads) *
// batch_stride + (b % heads) * head_stride + i * row_stride, its features contiguous (stride 1).
// The default, batch_stride < 0, is the contiguous [batch, length, features] layout.
struct AttentionRows {
  int64_t batch_stride = -1, head_stride = 0, row_stride = 0;
};

struct AttentionGeometry {
  int64_t batch = 0, query_len = 0, key_len = 0, head_dim = 0, value_dim = 0;
  double scale = 1.0;
  // Query i attends keys 0..i only (top-left aligned, as PyTorch's is_causal).
  bool causal = false;
  // An optional additive mask of the operands' dtype (-inf excludes a key): element (b, i, j)
  // at mask[(b / mask_heads) * mask_batch_stride + (b % mask_heads) * mask_head_stride +
  // i * mask_row_stride + j]; a stride of 0 broadcasts. Two strides for the heads, so that a
  // [batch, heads] mask (a key-padding mask broadcast over the heads) needs no copy.
  int64_t mask_heads = 1;
  int64_t mask_batch_stride = 0, mask_head_stride = 0, mask_row_stride = 0;
  constexpr int64_t mask_offset(int64_t b, int64_t i) const {
    return (b / mask_heads) * mask_batch_stride + (b % mask_heads) * mask_head_stride +
           i * mask_row_stride;
  }
  // Dropout on the normalised weights (FlashAttention's): weight (b, i, j) is kept, scaled by
  // 1 / (1 - dropout_p), where philox::Uniform(dropout_seed, dropout_counter(b, i, j)) >=
  // dropout_p, and zeroed elsewhere; the log-sum-exp is that of the undropped weights. The
  // mask is a pure function of these three fields, so the backward regenerates it and every
  // backend draws the same one: the counters are those `dropout` of the [batch, query_len,
  // key_len] weights would use (the caller reserves batch * query_len * key_len of them).
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  constexpr uint64_t dropout_counter(int64_t b, int64_t i, int64_t j) const {
    return dropout_offset + static_cast<uint64_t>((b * query_len + i) * key_len + j);
  }
  // The operands' rows (AttentionRows above); `heads` is the batch's inner factor that their
  // head strides step over.
  int64_t heads = 1;
  AttentionRows q_rows, k_rows, v_rows, out_rows, dout_rows, dq_rows, dk_rows, dv_rows;
  // The offset of row i of entry b in an operand of `length` rows of `width` features.
  constexpr int64_t row_offset(const AttentionRows& r, int64_t b, int64_t i, int64_t length,
                               int64_t width) const {
    return r.batch_stride < 0
               ? (b * length + i) * width
               : (b / heads) * r.batch_stride + (b % heads) * r.head_stride + i * r.row_stride;
  }
  // The distance between consecutive rows.
  static constexpr int64_t row_step(const AttentionRows& r, int64_t width) {
    return r.batch_stride < 0 ? width : r.row_stride;
  }
  constexpr int64_t q_row(int64_t b, int64_t i) const {
    return row_offset(q_rows, b, i, query_len, head_dim);
  }
  constexpr int64_t k_row(int64_t b, int64_t j) const {
    return row_offset(k_rows, b, j, key_len, head_dim);
  }
  constexpr int64_t v_row(int64_t b, int64_t j) const {
    return row_offset(v_rows, b, j, key_len, value_dim);
  }
  constexpr int64_t out_row(int64_t b, int64_t i) const {
    return row_offset(out_rows, b, i, query_len, value_dim);
  }
  constexpr int64_t dout_row(int64_t b, int64_t i) const {
    return row_offset(dout_rows, b, i, query_len, value_dim);
  }
  constexpr int64_t dq_row(int64_t b, int64_t i) const {
    return row_offset(dq_rows, b, i, query_len, head_dim);
  }
  constexpr int64_t dk_row(int64_t b, int64_t j) const {
    return row_offset(dk_rows, b, j, key_len, head_dim);
  }
  constexpr int64_t dv_row(int64_t b, int64_t j) const {
    return row_offset(dv_rows, b, j, key_len, value_dim);
  }
};

// out and logsumexp from q, k, v and the optional `mask` (nullptr for none). A query that
// may attend no key gets NaN outputs (as PyTorch) and a logsumexp of -inf.
TANDEM_DECLARE_KERNEL(AttentionForwardKernel,
                      void(int index, DType dtype, const AttentionGeometry& g, const void* q,
                           const void* k, const void* v, const void* mask, void* out,
                           void* logsumexp));
// dq, dk, dv (overwritten) from dout and the forward's out and logsumexp.
TANDEM_DECLARE_KERNEL(AttentionBackwardKernel,
                      void(int index, DType dtype, const AttentionGeometry& g, const void* q,
                           const void* k, const void* v, const void* mask, const void* out,
                           const void* dout, const void* logsumexp, void* dq, void* dk, void* dv));

// Check that the sizes are non-negative (tandem::Error naming the kernel and the device
// otherwise), then call the kernel of `device`'s type.
void RunAttentionForward(Device device, DType dtype, const AttentionGeometry& g, const void* q,
                         const void* k, const void* v, const void* mask, void* out,
                         void* logsumexp);
void RunAttentionBackward(Device device, DType dtype, const AttentionGeometry& g, const void* q,
                          const void* k, const void* v, const void* mask, const void* out,
                          const void* dout, const void* logsumexp, void* dq, void* dk, void* dv);

}  // namespace tandem

#endif  // TANDEM_TENSOR_KERNELS_ATTENTION_KERNELS_H_
