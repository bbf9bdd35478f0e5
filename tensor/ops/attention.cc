#include "tensor/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/kernels/attention_kernels.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {
namespace {

void CheckAttentionOperand(const Tensor& t, const char* name) {
  TANDEM_CHECK(t.defined(), "scaled_dot_product_attention: ", name, " is undefined; pass a ",
               "tensor of shape [..., length, features]");
  TANDEM_CHECK(t.dim() >= 2, "scaled_dot_product_attention: ", name,
               " must have at least 2 dimensions [..., length, features] but has shape ",
               ShapeToString(t.shape()));
  TANDEM_CHECK(IsFloatingPoint(t.dtype()), "scaled_dot_product_attention: ", name,
               " must be floating point but is ", t.dtype(), "; convert it with to()");
}

// The L x S lower triangle (true on and below the diagonal) on `device`.
Tensor CausalMask(int64_t l, int64_t s, Device device) {
  std::vector<bool> keep(static_cast<size_t>(l * s));
  for (int64_t i = 0; i < l; ++i) {
    for (int64_t j = 0; j < s; ++j) keep[static_cast<size_t>(i * s + j)] = j <= i;
  }
  return from_vector(keep, {l, s}).to(device);
}

// The checks both paths share.
void CheckAttentionArguments(const Tensor& query, const Tensor& key, const Tensor& value,
                             const Tensor& attn_mask, double dropout_p, bool is_causal) {
  CheckAttentionOperand(query, "query");
  CheckAttentionOperand(key, "key");
  CheckAttentionOperand(value, "value");
  const int64_t e = query.size(-1);
  const int64_t s = key.size(-2);
  TANDEM_CHECK(key.size(-1) == e, "scaled_dot_product_attention: query and key must have the ",
               "same number of features (last dimension) but query is ",
               ShapeToString(query.shape()), " and key ", ShapeToString(key.shape()));
  TANDEM_CHECK(value.size(-2) == s, "scaled_dot_product_attention: key and value must have the ",
               "same length (dimension -2) but key is ", ShapeToString(key.shape()), " and value ",
               ShapeToString(value.shape()));
  TANDEM_CHECK(!(is_causal && attn_mask.defined()),
               "scaled_dot_product_attention: pass either attn_mask or is_causal, not both; ",
               "fold the causal mask into attn_mask if you need both");
  TANDEM_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "scaled_dot_product_attention: dropout_p ",
               "must be in [0, 1) but is ", dropout_p);
  if (attn_mask.defined() && attn_mask.dtype() != kBool) {
    TANDEM_CHECK(IsFloatingPoint(attn_mask.dtype()), "scaled_dot_product_attention: ",
                 "attn_mask must be bool (true = attend) or floating (added to the scores) ",
                 "but is ", attn_mask.dtype());
  }
}

double ScaleFactor(const Tensor& query, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
}

}  // namespace

namespace internal {

Tensor ComposedScaledDotProductAttention(const Tensor& query, const Tensor& key,
                                         const Tensor& value, const Tensor& attn_mask,
                                         double dropout_p, bool is_causal,
                                         std::optional<double> scale, Generator* gen) {
  CheckAttentionArguments(query, key, value, attn_mask, dropout_p, is_causal);
  const int64_t l = query.size(-2);
  const int64_t s = key.size(-2);
  const double factor = ScaleFactor(query, scale);
  Tensor scores = mul(matmul(query, key.transpose(-2, -1)), factor);
  if (is_causal) {
    scores = masked_fill(scores, logical_not(CausalMask(l, s, query.device())),
                         -std::numeric_limits<double>::infinity());
  } else if (attn_mask.defined()) {
    if (attn_mask.dtype() == kBool) {
      const Tensor excluded = logical_not(attn_mask);
      // A mask with more leading dimensions than the scores broadcasts them up.
      scores = where(excluded,
                     full({}, -std::numeric_limits<double>::infinity(),
                          TensorOptions().dtype(scores.dtype()).device(scores.device())),
                     scores);
    } else {
      scores = add(scores, attn_mask);
    }
  }
  Tensor weights = softmax(scores, -1);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, /*training=*/true, gen);
  return matmul(weights.to(value.dtype()), value);
}

}  // namespace internal

namespace {

// The mask as the kernel reads it (AttentionGeometry's mask_*): additive, in the operands'
// dtype, strides for the batch, the heads (the last leading dimension) and the queries (0
// where broadcast), contiguous keys.
struct KernelMask {
  Tensor values;
  int64_t heads = 1, batch_stride = 0, head_stride = 0, row_stride = 0;
};

// attn_mask broadcast to [lead..., L, S] and made additive; false when it has more leading
// dimensions than the query (the result would have more dimensions than the query's).
bool MakeKernelMask(const Tensor& attn_mask, const Shape& lead, int64_t l, int64_t s, DType dtype,
                    KernelMask* result) {
  if (attn_mask.dim() > static_cast<int64_t>(lead.size()) + 2) return false;
  Tensor mask = attn_mask.detach();
  if (mask.dtype() == kBool) {
    const TensorOptions options = TensorOptions().dtype(dtype).device(mask.device());
    mask = where(mask, full({}, 0.0, options),
                 full({}, -std::numeric_limits<double>::infinity(), options));
  } else if (mask.dtype() != dtype) {
    mask = mask.to(dtype);
  }
  Shape full_shape = lead;
  full_shape.push_back(l);
  full_shape.push_back(s);
  mask = mask.expand(full_shape);
  // The last leading dimension keeps a stride of its own (mask_head_stride); one stride must
  // step over the others: they must nest (each stride the next one's times its size).
  const size_t n = lead.size();
  const auto fold = [&](const std::vector<int64_t>& st, KernelMask* folded) {
    if (s > 1 && st[n + 1] != 1) return false;
    int64_t previous = -1;  // the last non-trivial dimension before the heads
    for (size_t d = 0; d + 1 < n; ++d) {
      if (lead[d] == 1) continue;
      if (previous >= 0 && st[previous] != st[d] * lead[d]) return false;
      previous = static_cast<int64_t>(d);
    }
    folded->heads = n > 0 ? lead[n - 1] : 1;
    folded->head_stride = n > 0 ? st[n - 1] : 0;
    folded->batch_stride = previous >= 0 ? st[previous] : 0;
    folded->row_stride = l <= 1 ? 0 : st[n];
    return true;
  };
  if (!fold(mask.strides(), result)) {
    mask = mask.contiguous();
    fold(mask.strides(), result);
  }
  result->values = mask;
  return true;
}

DType LogsumexpDType(DType dtype) { return dtype == kFloat64 ? kFloat64 : kFloat32; }

void* Data(const Tensor& t) { return t.defined() ? ToKernel(t).data : nullptr; }

// Where `t`'s rows are, for the kernels (AttentionRows): in place when its features are
// contiguous and its leading dimensions fold into (outer, heads) with one stride for the outer
// ones, as a head split's transpose of [B, L, H, E] does; otherwise (or when it is contiguous)
// the contiguous layout. Returns the tensor the kernel reads: `t` itself, or its contiguous copy.
Tensor KernelRows(const Tensor& t, AttentionRows* rows) {
  *rows = AttentionRows();
  const Tensor detached = t.detach();
  if (detached.is_contiguous()) return detached;
  const Shape& shape = detached.shape();
  const std::vector<int64_t> st = detached.strides();
  const size_t n = shape.size() - 2;  // leading dimensions
  if (shape.back() > 1 && st.back() != 1) return detached.contiguous();
  int64_t previous = -1;  // the last outer dimension of more than one element
  for (size_t d = 0; d + 1 < n; ++d) {
    if (shape[d] == 1) continue;
    if (previous >= 0 && st[previous] != st[d] * shape[d]) return detached.contiguous();
    previous = static_cast<int64_t>(d);
  }
  rows->batch_stride = previous >= 0 ? st[previous] : 0;
  rows->head_stride = n > 0 ? st[n - 1] : 0;
  rows->row_stride = st[n];
  return detached;
}

// A new [lead..., length, width] tensor for an output (out, or the gradient of `like`), laid out
// as `like` is: when `like` is a head split ([..., H, L, E] viewed from [..., L, H, E]: its heads
// are closer together than its rows), [..., L, H, width] in memory, so that the head merge after
// attention (transpose and reshape) is a view and not a copy, as PyTorch's fused attention does.
Tensor NewLike(const Tensor& like, int64_t width, AttentionRows* rows) {
  Shape shape = like.shape();
  shape.back() = width;
  *rows = AttentionRows();
  const size_t n = shape.size() - 2;
  const int64_t heads = n > 0 ? shape[n - 1] : 1, length = shape[n];
  if (n == 0 || heads == 1 || length == 1 || like.strides()[n - 1] >= like.strides()[n]) {
    return NewTensor(shape, like.dtype(), like.device());
  }
  Shape merged = shape;
  std::swap(merged[n - 1], merged[n]);  // [..., L, H, width]
  rows->batch_stride = length * heads * width;
  rows->head_stride = width;
  rows->row_stride = heads * width;
  return NewTensor(merged, like.dtype(), like.device())
      .transpose(static_cast<int64_t>(n) - 1, static_cast<int64_t>(n));
}

// Gradients for `parts` (the q, k and v the kernels read) that tile one dense block as the parts
// do: when they are views of one storage with equal shapes and strides, evenly spaced, and
// together cover a block of memory with no gap or overlap (a packed [B, L, 3, H, E] projection
// split into heads), one new block laid out the same and a view of it for each part, so that
// the packed gradient needs no copy (split_heads's backward takes the block as it is). Empty
// when they do not tile: each gradient is then allocated alone.
std::vector<Tensor> NewTiledLike(const std::vector<Tensor>& parts) {
  const Tensor& first = parts.front();
  std::vector<int64_t> offsets;
  for (const Tensor& p : parts) {
    if (!first.shares_storage_with(p) || p.dtype() != first.dtype() || p.shape() != first.shape() ||
        p.strides() != first.strides()) {
      return {};
    }
    offsets.push_back(p.storage_offset());
  }
  const int64_t lowest = *std::min_element(offsets.begin(), offsets.end());
  std::vector<int64_t> sorted = offsets;
  std::sort(sorted.begin(), sorted.end());
  const int64_t spacing = sorted.size() > 1 ? sorted[1] - sorted[0] : 0;
  // The parts as one tensor [parts, ...]: dense when its (size, stride) pairs of more than one
  // element, sorted by stride, each step exactly over the ones before.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  if (sorted.size() > 1) dims.emplace_back(spacing, static_cast<int64_t>(sorted.size()));
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i] - sorted[i - 1] != spacing) return {};
  }
  for (int64_t d = 0; d < first.dim(); ++d) {
    if (first.size(d) > 1) {
      dims.emplace_back(first.strides()[static_cast<size_t>(d)], first.size(d));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != extent) return {};
    extent *= size;
  }
  const Tensor block = NewTensor({extent}, first.dtype(), first.device());
  std::vector<Tensor> views;
  for (size_t i = 0; i < parts.size(); ++i) {
    views.push_back(MakeView(block, first.shape(), first.strides(), offsets[i] - lowest));
  }
  return views;
}

// The fused kernels: one autograd node whose backward is AttentionBackward.
Tensor FusedAttention(const Tensor& query, const Tensor& key, const Tensor& value,
                      const KernelMask& mask, bool is_causal, double factor, double dropout_p,
                      Generator* gen) {
  const Shape lead(query.shape().begin(), query.shape().end() - 2);
  AttentionGeometry g;
  g.query_len = query.size(-2);
  g.key_len = key.size(-2);
  g.head_dim = query.size(-1);
  g.value_dim = value.size(-1);
  g.batch = 1;
  for (int64_t d : lead) g.batch *= d;
  g.heads = lead.empty() ? 1 : lead.back();
  g.scale = factor;
  g.causal = is_causal;
  g.mask_heads = mask.heads;
  g.mask_batch_stride = mask.batch_stride;
  g.mask_head_stride = mask.head_stride;
  g.mask_row_stride = mask.row_stride;
  if (dropout_p > 0.0) {
    // The counters `dropout` of the [batch, L, S] weights would take, from the same generator
    // (the device's own unless one is given), so that the mask does not depend on the path.
    Generator& generator = gen != nullptr ? *gen : default_generator(query.device());
    const GeneratorState claimed =
        generator.Claim(static_cast<uint64_t>(g.batch * g.query_len * g.key_len));
    g.dropout_p = dropout_p;
    g.dropout_seed = claimed.seed;
    g.dropout_offset = claimed.offset;
  }
  // Read in place (a head split is not copied); the outputs laid out as the inputs.
  const Tensor q = KernelRows(query, &g.q_rows), k = KernelRows(key, &g.k_rows),
               v = KernelRows(value, &g.v_rows);
  const DType dtype = query.dtype();
  const Device device = query.device();
  Tensor out = NewLike(q, g.value_dim, &g.out_rows);
  const Tensor lse = NewTensor({g.batch, g.query_len}, LogsumexpDType(dtype), device);
  const Tensor mask_values = mask.values;
  RunAttentionForward(device, dtype, g, Data(q), Data(k), Data(v), Data(mask_values), Data(out),
                      Data(lse));
  if (NeedsGrad({query, key, value})) {
    // query, key and value themselves (the storage q, k and v read, unless they had to be
    // copied) for create_graph: the backward then recomputes through differentiable ops.
    RecordOp(
        "ScaledDotProductAttentionBackward", {query, key, value}, out,
        [g, q, k, v, query, key, value, mask_values, lse, dropout_p,
         saved_out = out.detach()](const Tensor& grad) {
          if (CreatingGraph()) {
            // The composed path, drawing the kernel's dropout mask again (its generator state
            // replayed: both paths take the same counters): a gradient that differentiates
            // again, as PyTorch's math backward gives.
            return RecomputedGradients(
                [&] {
                  Generator replay(g.dropout_seed, g.dropout_offset);
                  return internal::ComposedScaledDotProductAttention(
                      query, key, value, mask_values, dropout_p, g.causal, g.scale, &replay);
                },
                {query, key, value}, grad);
          }
          AttentionGeometry gb = g;
          const Tensor dout = KernelRows(grad, &gb.dout_rows);
          const Device dev = q.device();
          Tensor dq, dk, dv;
          if (std::vector<Tensor> tiled = NewTiledLike({q, k, v}); !tiled.empty()) {
            // Laid out as q, k and v are, so their rows are theirs.
            dq = tiled[0], dk = tiled[1], dv = tiled[2];
            gb.dq_rows = g.q_rows, gb.dk_rows = g.k_rows, gb.dv_rows = g.v_rows;
          } else {
            dq = NewLike(q, gb.head_dim, &gb.dq_rows);
            dk = NewLike(k, gb.head_dim, &gb.dk_rows);
            dv = NewLike(v, gb.value_dim, &gb.dv_rows);
          }
          RunAttentionBackward(dev, q.dtype(), gb, Data(q), Data(k), Data(v), Data(mask_values),
                               Data(saved_out), Data(dout), Data(lse), Data(dq), Data(dk),
                               Data(dv));
          return std::vector<Tensor>{dq, dk, dv};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  TANDEM_AUTOCAST(kLowerPrecision, scaled_dot_product_attention, query, key, value, attn_mask,
                  dropout_p, is_causal, scale, gen);
  CheckAttentionArguments(query, key, value, attn_mask, dropout_p, is_causal);
  // The fused kernels take heads that match one for one; the rest goes the composed way.
  const Shape lead(query.shape().begin(), query.shape().end() - 2);
  const bool fusable =
      key.dtype() == query.dtype() && value.dtype() == query.dtype() &&
      key.device() == query.device() && value.device() == query.device() &&
      key.dim() == query.dim() && value.dim() == query.dim() &&
      std::equal(lead.begin(), lead.end(), key.shape().begin()) &&
      std::equal(lead.begin(), lead.end(), value.shape().begin()) && query.size(-1) > 0 &&
      key.size(-2) > 0 && value.size(-1) > 0 && query.numel() > 0 &&
      !(attn_mask.defined() && (attn_mask.device() != query.device() || NeedsGrad({attn_mask})));
  KernelMask mask;
  if (fusable && (!attn_mask.defined() || MakeKernelMask(attn_mask, lead, query.size(-2),
                                                         key.size(-2), query.dtype(), &mask))) {
    return FusedAttention(query, key, value, mask, is_causal, ScaleFactor(query, scale), dropout_p,
                          gen);
  }
  return internal::ComposedScaledDotProductAttention(query, key, value, attn_mask, dropout_p,
                                                     is_causal, scale, gen);
}

}  // namespace tandem
