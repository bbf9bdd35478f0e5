#include "tensor/ops/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/ops/ops.h"

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

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  CheckAttentionOperand(query, "query");
  CheckAttentionOperand(key, "key");
  CheckAttentionOperand(value, "value");
  const int64_t e = query.size(-1);
  const int64_t l = query.size(-2);
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
  const double factor = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(e));
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
      TANDEM_CHECK(IsFloatingPoint(attn_mask.dtype()), "scaled_dot_product_attention: ",
                   "attn_mask must be bool (true = attend) or floating (added to the scores) ",
                   "but is ", attn_mask.dtype());
      scores = add(scores, attn_mask);
    }
  }
  Tensor weights = softmax(scores, -1);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, /*training=*/true, gen);
  return matmul(weights.to(value.dtype()), value);
}

}  // namespace tandem
