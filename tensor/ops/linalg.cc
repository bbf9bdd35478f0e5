// Matrix products: matmul, linear (its bias, and linear_gelu's GELU, fused into the GEMM where the
// backend can: Note [cuBLASLt epilogues]) and autocast's float32-weight linear (Note [Autocast
// linear]).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/core/autograd.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/ops/autocast.h"
#include "tensor/ops/internal/op_helpers.h"
#include "tensor/ops/ops.h"
#include "tensor/runtime/backend.h"

namespace tandem {

namespace {

// How Gemm reads a 2-D [rows, cols] (or 3-D [batch, rows, cols]) float32 tensor without
// copying: row-major (trans = false) or column-major (trans = true, e.g. a transposed view).
struct GemmOperand {
  Tensor holder;  // keeps a contiguous copy alive when the layout needed one
  ElementPtr data;
  bool trans = false;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

bool TryGemmLayout(const Tensor& t, GemmOperand* operand) {
  const int64_t n = t.dim();
  const int64_t rows = t.shape()[n - 2], cols = t.shape()[n - 1];
  const int64_t row_stride = t.strides()[n - 2], col_stride = t.strides()[n - 1];
  const bool row_major =
      (cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= std::max<int64_t>(cols, 1));
  const bool col_major =
      (rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= std::max<int64_t>(rows, 1));
  if (row_major) {
    operand->trans = false;
    operand->ld = rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride;
  } else if (col_major) {
    operand->trans = true;
    operand->ld = cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride;
  } else {
    return false;
  }
  operand->batch_stride = (n == 3 && t.shape()[0] > 1) ? t.strides()[0] : 0;
  operand->data = DataPtr(t);
  return true;
}

GemmOperand MakeGemmOperand(const Tensor& t) {
  GemmOperand operand;
  if (TryGemmLayout(t, &operand)) return operand;
  operand.holder = BroadcastCopyRaw(t, t.shape(), t.dtype());
  TryGemmLayout(operand.holder, &operand);
  return operand;
}

// out (contiguous [m, n] or [batch, m, n]) = a · b + beta · out, where a is [m, k] or
// [batch, m, k] and b is [k, n] or [batch, k, n]; a 2-D operand is reused for every batch.
void GemmIntoRaw(const Tensor& out, const Tensor& a, const Tensor& b, double beta) {
  const int64_t batch = out.dim() == 3 ? out.shape()[0] : 1;
  const int64_t m = a.shape()[a.dim() - 2], k = a.shape()[a.dim() - 1];
  const int64_t n = b.shape()[b.dim() - 1];
  if (out.numel() == 0) return;
  if (k == 0) {
    if (beta == 0.0) BackendOf(out).Fill(IndexOf(out), ToKernel(out), 0.0);
    return;
  }
  const GemmOperand lhs = MakeGemmOperand(a);
  const GemmOperand rhs = MakeGemmOperand(b);
  BackendOf(out).Gemm(IndexOf(out), out.dtype(), lhs.trans, rhs.trans, m, n, k, 1.0f, lhs.data,
                      lhs.ld, lhs.batch_stride, rhs.data, rhs.ld, rhs.batch_stride, beta,
                      DataPtr(out), n, m * n, batch);
}

// out (contiguous [m, n], `out_dtype`) = a · b (2-D, a's dtype) with the backend's fused
// epilogue (Backend::GemmWithEpilogue); false, with nothing written, where it has none.
bool GemmWithEpilogueRaw(const Tensor& out, const Tensor& a, const Tensor& b,
                         const Backend::GemmEpilogueArgs& epilogue) {
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  if (out.numel() == 0 || k == 0) return false;
  const GemmOperand lhs = MakeGemmOperand(a);
  const GemmOperand rhs = MakeGemmOperand(b);
  return BackendOf(out).GemmWithEpilogue(IndexOf(out), a.dtype(), out.dtype(), lhs.trans, rhs.trans,
                                         m, n, k, lhs.data, lhs.ld, rhs.data, rhs.ld, DataPtr(out),
                                         n, epilogue);
}

Tensor MatmulRaw(const Tensor& a, const Tensor& b) {
  const int64_t m = a.shape()[a.dim() - 2], n = b.shape()[b.dim() - 1];
  Shape shape = {m, n};
  if (a.dim() == 3) {
    shape.insert(shape.begin(), a.shape()[0]);
  } else if (b.dim() == 3) {
    shape.insert(shape.begin(), b.shape()[0]);
  }
  Tensor out = NewTensor(shape, a.dtype(), a.device());
  GemmIntoRaw(out, a, b, 0.0f);
  return out;
}

// 2-D x 2-D, 3-D x 3-D (equal batches), 3-D x 2-D or 2-D x 3-D, with autograd.
Tensor MatmulCore(const Tensor& a, const Tensor& b) {
  Tensor out = MatmulRaw(a, b);
  if (NeedsGrad({a, b})) {
    const bool grad_a = NeedsGrad({a}), grad_b = NeedsGrad({b});
    // Saved with their graphs (the node keeps them alive through its edges anyway): under
    // create_graph the gradients are computed with matmul itself, and differentiate again.
    Record(
        "MatmulBackward", {a, b}, out,
        [sa = a, sb = b, grad_a, grad_b](const Tensor& grad) {
          Tensor da, db;
          if (CreatingGraph()) {
            if (grad_a) {
              da = matmul(grad, sb.transpose(-2, -1));
              if (sa.dim() == 2 && da.dim() == 3) da = sum(da, {0});
            }
            if (grad_b) {
              db = matmul(sa.transpose(-2, -1), grad);
              if (sb.dim() == 2 && db.dim() == 3) db = sum(db, {0});
            }
            return std::vector<Tensor>{da, db};
          }
          if (grad_a) {
            // dA = G · B^T, summed over the batch when A was shared by every batch.
            da = MatmulRaw(grad, TransposedRaw(sb));
            if (sa.dim() == 2 && da.dim() == 3)
              da = ViewRaw(ReduceRaw(da, {0}, ReduceKind::kSum, "matmul"), sa.shape());
          }
          if (grad_b) {
            if (sb.dim() == 2 && sa.dim() == 3) {
              // dB = sum_b A_b^T · G_b = A'^T · G' with the batch folded into the rows.
              const int64_t rows = sa.shape()[0] * sa.shape()[1];
              Tensor folded_a = ViewRaw(ContiguousRaw(sa), {rows, sa.shape()[2]});
              Tensor folded_g = ViewRaw(ContiguousRaw(grad), {rows, grad.shape()[2]});
              db = MatmulRaw(TransposedRaw(folded_a), folded_g);
            } else {
              db = MatmulRaw(TransposedRaw(sa), grad);
            }
          }
          return std::vector<Tensor>{da, db};
        },
        DoubleBackward::kSupported);
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  TANDEM_AUTOCAST(kLowerPrecision, matmul, a, b);
  CheckDefined(a, "matmul", "a");
  CheckDefined(b, "matmul", "b");
  CheckSameDevice(a, "a", b, "b", "matmul");
  CheckSameFloat(a, "a", b, "b", "matmul");
  TANDEM_CHECK(a.dim() >= 1 && b.dim() >= 1,
               "matmul: both operands must have at least one dimension but a is ",
               ShapeToString(a.shape()), " and b is ", ShapeToString(b.shape()),
               "; use mul for a zero-dimensional (scalar) operand");
  if (a.dim() == 1 || b.dim() == 1) {
    // Vectors become a 1-row / 1-column matrix and that dimension is dropped afterwards.
    Tensor result = matmul(a.dim() == 1 ? a.unsqueeze(0) : a, b.dim() == 1 ? b.unsqueeze(1) : b);
    if (b.dim() == 1) result = result.squeeze(-1);
    if (a.dim() == 1) result = result.squeeze(b.dim() == 1 ? -1 : -2);
    return result;
  }
  TANDEM_CHECK(a.size(-1) == b.size(-2), "matmul: a is ", ShapeToString(a.shape()), " and b is ",
               ShapeToString(b.shape()), "; a.size(-1) (", a.size(-1), ") must equal b.size(-2) (",
               b.size(-2), ")");
  if (a.dim() > 3 || b.dim() > 3) {
    // Any number of batch dimensions, broadcast as in PyTorch; folded into one.
    const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
    if (b.dim() == 2) {
      // [..., m, k] x [k, n]: one big 2-D product over the folded rows.
      Shape out_shape(a.shape().begin(), a.shape().end() - 1);
      out_shape.push_back(n);
      return MatmulCore(a.reshape({-1, k}), b).reshape(out_shape);
    }
    const Shape batch_a(a.shape().begin(), a.shape().end() - 2);
    const Shape batch_b(b.shape().begin(), b.shape().end() - 2);
    Shape batch;
    try {
      batch = BroadcastShapes(batch_a, batch_b, "matmul");
    } catch (const Error&) {
      TANDEM_FAIL("matmul: a is ", ShapeToString(a.shape()), " and b is ", ShapeToString(b.shape()),
                  "; their batch dimensions ", ShapeToString(batch_a), " and ",
                  ShapeToString(batch_b), " cannot be broadcast together");
    }
    const int64_t count = NumElements(batch);
    const auto fold = [&](const Tensor& t, int64_t rows, int64_t cols) {
      Shape full = batch;
      full.push_back(rows);
      full.push_back(cols);
      return t.expand(full).reshape({count, rows, cols});
    };
    Shape out_shape = batch;
    out_shape.push_back(m);
    out_shape.push_back(n);
    const Tensor a3 = a.dim() == 2 ? a : fold(a, m, k);
    return MatmulCore(a3, fold(b, k, n)).reshape(out_shape);
  }
  if (a.dim() == 3 && b.dim() == 3 && a.size(0) != b.size(0)) {
    TANDEM_CHECK(a.size(0) == 1 || b.size(0) == 1, "matmul: a is ", ShapeToString(a.shape()),
                 " and b is ", ShapeToString(b.shape()), "; the batch sizes (", a.size(0), " and ",
                 b.size(0), ") must be equal or one of them 1");
    // A batch of one is shared by every batch of the other operand.
    return a.size(0) == 1 ? MatmulCore(a.squeeze(0), b) : MatmulCore(a, b.squeeze(0));
  }
  return MatmulCore(a, b);
}

namespace {

// a · b (2-D) computed in a's 16-bit dtype as a new float32 [m, n] tensor: the backend's GEMM
// into float where it has one, else the product in a's dtype, converted. b is in a's dtype or
// float32, rounded to a's dtype as CastRaw rounds: by the backend block by block where it can
// (no whole 16-bit copy of b), else by CastRaw here.
Tensor MatmulIntoFloatRaw(const Tensor& a, const Tensor& b) {
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor out = NewTensor({m, n}, kFloat32, a.device());
  if (out.numel() == 0) return out;
  const auto into_out = [&](const Tensor& rounded_or_not) {
    const GemmOperand lhs = MakeGemmOperand(a);
    const GemmOperand rhs = MakeGemmOperand(rounded_or_not);
    return BackendOf(out).GemmFloatOutput(IndexOf(out), a.dtype(), lhs.trans, rhs.trans, m, n, k,
                                          lhs.data, lhs.ld, rounded_or_not.dtype(), rhs.data,
                                          rhs.ld,
                                          static_cast<float*>(static_cast<void*>(DataPtr(out))), n);
  };
  if (k > 0 && b.dtype() != a.dtype() && into_out(b)) return out;
  const Tensor b_low = b.dtype() == a.dtype() ? b : CastRaw(b, a.dtype());
  if (k > 0 && into_out(b_low)) return out;
  return CastRaw(MatmulRaw(a, b_low), kFloat32);
}

// dW = G^T X ([out, in], `dtype`: G's, or float32 for a 16-bit G as MatmulIntoFloatRaw) and, when
// `grad_bias` is not null, the bias gradient (the column sums of G, [out], `dtype`) fused into the
// GEMM where the backend can; else dW alone and *grad_bias left undefined for the caller to reduce.
Tensor WeightGradRaw(const Tensor& grad, const Tensor& x, DType dtype, Tensor* grad_bias) {
  const int64_t out_features = grad.shape()[1], in = x.shape()[1];
  if (grad_bias != nullptr && x.dtype() == grad.dtype()) {
    Tensor dw = NewTensor({out_features, in}, dtype, grad.device());
    Tensor db = NewTensor({out_features}, dtype, grad.device());
    Backend::GemmEpilogueArgs epilogue;
    epilogue.kind = Backend::GemmEpilogue::kBiasGradA;
    epilogue.bias_grad = DataPtr(db);
    if (GemmWithEpilogueRaw(dw, TransposedRaw(grad), x, epilogue)) {
      *grad_bias = db;
      return dw;
    }
  }
  return dtype == grad.dtype() ? MatmulRaw(TransposedRaw(grad), x)
                               : MatmulIntoFloatRaw(TransposedRaw(grad), x);
}

// Note [Autocast linear]: under autocast, linear with a float32 weight is one node whose edges go
// to the uncast x, weight and bias, where PyTorch records a cast node per operand and a 16-bit
// linear:
//   - The weight (and bias) are cast outside the graph (CastWeightOutsideGraph), so the weight's
//     gradient comes out of the GEMM in float32 (Backend::GemmFloatOutput: 16-bit products
//     summed in float, never rounded to 16 bits) rather than as a 16-bit gradient converted
//     in another pass over a 16-bit copy of every weight's gradient (GPT-2: 248 MB).
//   - A float32 input that needs no gradient (the batch) is kept as the caller passed it: the
//     caller holds it through backward anyway, so keeping its 16-bit copy held a second copy
//     of the batch through the step. On the CPU it is never cast whole: forward rounds
//     kRoundedRowsAtOnce rows at a time, each block multiplied into its rows of y, and
//     backward's weight gradient has the backend round each block's own columns of it
//     (GemmFloatOutput with a float32 B): a whole 16-bit copy beside the first weight's cast
//     was what made a small model's 16-bit step hold more than its float32 step. An input that
//     needs a gradient (an activation) keeps its 16-bit copy, half its size. The first layer's
//     weight cast, which its gradient does not need, is then freed after the product, not
//     cached.
//   - The input's gradient is computed in 16 bits and converted to the input's dtype in the
//     node, as the cast node's backward would.

// Rows of a float32 batch rounded to 16 bits at once in AutocastLinear's forward: enough for a
// GEMM that still splits over a device's threads by columns, few enough that the block is
// small next to the weight's cast.
constexpr int64_t kRoundedRowsAtOnce = 64;

Tensor AutocastLinear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType low = AutocastMode::GetDType(weight.device().type());
  const bool grad_x = NeedsGrad({x}), grad_w = NeedsGrad({weight});
  const bool has_bias = bias.defined(), grad_b = has_bias && NeedsGrad({bias});
  // Cached where the node keeps the cast for x's gradient anyway, and without grad (evaluation,
  // sampling), where nothing is kept and a guard may span many forwards.
  const Tensor w_low =
      autocast::CastWeightOutsideGraph(weight, /*keep=*/grad_x || !GradMode::IsEnabled());
  const Tensor b_low = has_bias ? autocast::CastWeightOutsideGraph(bias, /*keep=*/true) : bias;
  Tensor x_low, y;
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const int64_t rows = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  if (!grad_x && x.dtype() != low && rows > kRoundedRowsAtOnce &&
      x.device().type() == DeviceType::kCPU) {
    // A batch is rounded kRoundedRowsAtOnce rows at a time, each block multiplied into its
    // rows of y as soon as it is rounded. Not on a GPU: there one GEMM over the whole batch
    // beats many narrow ones, and the copy is small next to the device's memory.
    NoGradGuard no_grad;
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    out_shape.push_back(out_features);
    const Tensor x2 = x.reshape({rows, in}), w_t = TransposedRaw(w_low);
    Tensor y2 = has_bias ? BroadcastCopyRaw(b_low, {rows, out_features}, low)
                         : NewTensor({rows, out_features}, low, x.device());
    for (int64_t r = 0; r < rows; r += kRoundedRowsAtOnce) {
      const int64_t count = std::min(kRoundedRowsAtOnce, rows - r);
      GemmIntoRaw(y2.narrow(0, r, count), CastRaw(x2.narrow(0, r, count), low), w_t,
                  has_bias ? 1.0 : 0.0);
    }
    y = y2.reshape(out_shape);
  } else {
    NoGradGuard no_grad;  // the node is recorded below
    x_low = x.to(low);
    y = linear(x_low, w_low, b_low);
  }
  const std::vector<Tensor> inputs =
      has_bias ? std::vector<Tensor>{x, weight, bias} : std::vector<Tensor>{x, weight};
  if (!NeedsGrad(inputs)) return y;
  const bool recast = grad_w && !grad_x && x.dtype() != low;
  Record("AutocastLinearBackward", inputs, y,
         [grad_x, grad_w, has_bias, grad_b, low, in, out_features, rows, x_dtype = x.dtype(),
          x_shape = x.shape(),
          sx = !grad_w  ? Tensor()
               : recast ? x.detach()
                        : x_low.reshape({rows, in}).detach(),
          sw = grad_x ? w_low : Tensor()](const Tensor& grad_y) {
           const Tensor grad = grad_y.reshape({rows, out_features});
           std::vector<Tensor> grads(2);
           if (grad_x) grads[0] = CastRaw(MatmulRaw(grad, sw), x_dtype).reshape(x_shape);
           Tensor grad_bias;
           if (grad_w) {
             grads[1] = WeightGradRaw(grad, sx.reshape({rows, in}), kFloat32,
                                      grad_b ? &grad_bias : nullptr);
           }
           if (has_bias) {
             if (grad_b && !grad_bias.defined()) {
               grad_bias = CastRaw(
                   ViewRaw(ReduceRaw(grad, {0}, ReduceKind::kSum, "linear"), {out_features}),
                   kFloat32);
             }
             grads.push_back(grad_bias);
           }
           return grads;
         });
  return y;
}

// y = x2 · weight^T (+ bias) ([rows, out], x2's dtype): the bias in the GEMM's epilogue where the
// backend fuses it (Note [cuBLASLt epilogues]), else broadcast into y first for Gemm to add onto.
Tensor LinearGemmRaw(const Tensor& x2, const Tensor& weight, const Tensor& bias) {
  const int64_t rows = x2.shape()[0], out_features = weight.size(0);
  Tensor y = NewTensor({rows, out_features}, x2.dtype(), x2.device());
  Backend::GemmEpilogueArgs epilogue;
  const Tensor contiguous_bias = bias.defined() ? ContiguousRaw(bias) : Tensor();
  if (bias.defined()) epilogue.bias = DataPtr(contiguous_bias);
  if (!bias.defined() || !GemmWithEpilogueRaw(y, x2, TransposedRaw(weight), epilogue)) {
    if (bias.defined()) y = BroadcastCopyRaw(bias, {rows, out_features}, x2.dtype());
    GemmIntoRaw(y, x2, TransposedRaw(weight), bias.defined() ? 1.0f : 0.0f);
  }
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (AutocastMode::IsAnyEnabled() && autocast::IsEligible(x) && autocast::IsEligible(weight) &&
      weight.dtype() == kFloat32 && (!bias.defined() || bias.dtype() == kFloat32) && x.dim() >= 1 &&
      weight.dim() == 2 && x.size(-1) == weight.size(1) &&
      (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0))) &&
      x.device() == weight.device() && (!bias.defined() || bias.device() == weight.device())) {
    return AutocastLinear(x, weight, bias);  // shapes checked: the node reshapes with them
  }
  TANDEM_AUTOCAST(kLowerPrecision, linear, x, weight, bias);
  CheckDefined(x, "linear", "x");
  CheckDefined(weight, "linear", "weight");
  CheckSameDevice(x, "x", weight, "weight", "linear");
  CheckSameFloat(x, "x", weight, "weight", "linear");
  TANDEM_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out_features, in_features] but is ",
               ShapeToString(weight.shape()));
  TANDEM_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: x is ",
               ShapeToString(x.shape()), " and weight is ", ShapeToString(weight.shape()),
               "; x.size(-1) must equal weight.size(1) (in_features = ", weight.size(1), ")");
  const int64_t in = weight.size(1), out_features = weight.size(0);
  if (bias.defined()) {
    CheckSameDevice(x, "x", bias, "bias", "linear");
    CheckSameFloat(x, "x", bias, "bias", "linear");
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: bias must be [",
                 out_features, "] (out_features) but is ", ShapeToString(bias.shape()));
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = NumElements(out_shape);
  out_shape.push_back(out_features);
  const Tensor x2 = x.dim() == 2 ? x : x.reshape({rows, in});
  Tensor y = LinearGemmRaw(x2, weight, bias);
  std::vector<Tensor> inputs = {x2, weight};
  if (bias.defined()) inputs.push_back(bias);
  if (NeedsGrad(inputs)) {
    const bool grad_x = NeedsGrad({x2}), grad_w = NeedsGrad({weight});
    const bool has_bias = bias.defined(), grad_b = has_bias && NeedsGrad({bias});
    Record(
        "LinearBackward", inputs, y,
        // Only what the gradients need stays alive until backward: a first layer's input
        // needs no gradient, so its (autocast) weight is not kept.
        // Saved with their graphs (kept alive through the node's edges anyway): under
        // create_graph the gradients are computed with matmul, and differentiate again.
        [grad_x, grad_w, has_bias, grad_b, sx = grad_w ? x2 : Tensor(),
         sw = grad_x ? weight : Tensor()](const Tensor& grad) {
          if (CreatingGraph()) {
            std::vector<Tensor> grads = {grad_x ? matmul(grad, sw) : Tensor(),
                                         grad_w ? matmul(grad.transpose(0, 1), sx) : Tensor()};
            if (has_bias) grads.push_back(grad_b ? sum(grad, {0}) : Tensor());
            return grads;
          }
          Tensor grad_bias;
          std::vector<Tensor> grads = {
              grad_x ? MatmulRaw(grad, sw) : Tensor(),
              grad_w ? WeightGradRaw(grad, sx, grad.dtype(), grad_b ? &grad_bias : nullptr)
                     : Tensor()};
          if (has_bias) {
            if (grad_b && !grad_bias.defined()) {
              grad_bias =
                  ViewRaw(ReduceRaw(grad, {0}, ReduceKind::kSum, "linear"), {grad.shape()[1]});
            }
            grads.push_back(grad_bias);
          }
          return grads;
        },
        DoubleBackward::kSupported);
  }
  return x.dim() == 2 ? y : y.reshape(out_shape);
}

namespace {

// y = gelu_tanh(x · weight^T + bias) ([rows, out], x's dtype) in one GEMM (GELU_AUX_BIAS),
// with the pre-activation that the backward needs written beside it when `keep`. False, having
// computed nothing, where the backend does not fuse.
bool GeluLinearGemm(const Tensor& x, const Tensor& weight, const Tensor& bias, bool keep, Tensor* y,
                    Tensor* pre) {
  const int64_t rows = x.shape()[0], out_features = weight.size(0);
  *y = NewTensor({rows, out_features}, x.dtype(), x.device());
  *pre = keep ? NewTensor({rows, out_features}, x.dtype(), x.device()) : Tensor();
  const Tensor contiguous_bias = ContiguousRaw(bias);
  Backend::GemmEpilogueArgs epilogue;
  epilogue.kind = Backend::GemmEpilogue::kGeluTanhBias;
  epilogue.bias = DataPtr(contiguous_bias);
  if (keep) {
    epilogue.aux = DataPtr(*pre);
    epilogue.ld_aux = out_features;
  }
  return GemmWithEpilogueRaw(*y, x, TransposedRaw(weight), epilogue);
}

// The gradients of x · weight^T + bias from g ([rows, out]), the gradient of that product: x's in
// `x_dtype`, the weight's and bias's in `param_dtype` (float32 under autocast: the 16-bit GEMM's
// sums never rounded to 16 bits). `grad_bias` where the caller's GEMM already summed it
// (DGELU_BGRAD), else fused into the weight gradient's GEMM where the backend can. Undefined where
// not wanted.
std::vector<Tensor> PreActivationGradients(const Tensor& g, Tensor grad_bias, const Tensor& x,
                                           const Tensor& weight, bool grad_x, bool grad_w,
                                           bool grad_b, DType x_dtype, DType param_dtype) {
  const bool sum_bias = grad_b && !grad_bias.defined();
  std::vector<Tensor> grads = {
      grad_x ? CastRaw(MatmulRaw(g, weight), x_dtype) : Tensor(),
      grad_w ? WeightGradRaw(g, x, param_dtype, sum_bias ? &grad_bias : nullptr) : Tensor()};
  if (grad_b && !grad_bias.defined()) {
    grad_bias = CastRaw(ViewRaw(ReduceRaw(g, {0}, ReduceKind::kSum, "linear_gelu"), {g.shape()[1]}),
                        param_dtype);
  }
  grads.push_back(grad_b ? grad_bias : Tensor());
  return grads;
}

// The gradients of GeluLinearGemm's y from `grad` ([rows, out]) and the saved pre-activation, as
// PreActivationGradients's.
std::vector<Tensor> GeluLinearGradients(const Tensor& grad, const Tensor& pre, const Tensor& x,
                                        const Tensor& weight, bool grad_x, bool grad_w, bool grad_b,
                                        DType x_dtype, DType param_dtype) {
  return PreActivationGradients(
      BinaryRaw(BinaryOp::kGeluTanhBackward, grad, pre, "linear_gelu backward"), Tensor(), x,
      weight, grad_x, grad_w, grad_b, x_dtype, param_dtype);
}

// g = (grad · weight) * gelu_tanh'(pre) ([rows, hidden], grad's dtype; grad [rows, out], weight
// [out, hidden], pre GeluLinearGemm's) and the bias gradient of the GELU's linear, the column sums
// of g ([hidden], `bias_dtype`), in one GEMM (DGELU_BGRAD). Where the backend does not fuse, the
// GEMM and then the GELU's gradient, and *grad_bias undefined for the caller to sum.
Tensor GeluGradientThroughLinear(const Tensor& grad, const Tensor& weight, const Tensor& pre,
                                 DType bias_dtype, Tensor* grad_bias) {
  const int64_t rows = grad.shape()[0], hidden = weight.size(1);
  Tensor g = NewTensor({rows, hidden}, grad.dtype(), grad.device());
  Tensor db = NewTensor({hidden}, bias_dtype, grad.device());
  Backend::GemmEpilogueArgs epilogue;
  epilogue.kind = Backend::GemmEpilogue::kDGeluTanhBiasGrad;
  epilogue.aux = DataPtr(pre);
  epilogue.ld_aux = hidden;
  epilogue.bias_grad = DataPtr(db);
  epilogue.float_bias_grad = bias_dtype != grad.dtype();
  if (GemmWithEpilogueRaw(g, grad, weight, epilogue)) {
    *grad_bias = db;
    return g;
  }
  *grad_bias = Tensor();
  return BinaryRaw(BinaryOp::kGeluTanhBackward, MatmulRaw(grad, weight), pre,
                   "linear_gelu_linear backward");
}

// linear_gelu under autocast with float32 parameters, as AutocastLinear (Note [Autocast
// linear]): the weight and bias cast outside the graph, one node whose edges go to the uncast
// x, weight and bias, the weight's and bias's gradients into float32 (the bias gradient fused
// into the weight gradient's GEMM). Undefined, having recorded nothing, where the backend does
// not fuse: the caller composes.
Tensor AutocastLinearGelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const DType low = AutocastMode::GetDType(weight.device().type());
  const bool grad_x = NeedsGrad({x}), grad_w = NeedsGrad({weight}), grad_b = NeedsGrad({bias});
  const bool keep = grad_x || grad_w || grad_b;
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const int64_t rows = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  const Tensor w_low =
      autocast::CastWeightOutsideGraph(weight, /*keep=*/grad_x || !GradMode::IsEnabled());
  const Tensor b_low = autocast::CastWeightOutsideGraph(bias, /*keep=*/true);
  Tensor x_low;
  {
    NoGradGuard no_grad;  // the node is recorded below
    x_low = x.to(low).reshape({rows, in});
  }
  Tensor y, pre;
  if (!GeluLinearGemm(x_low, w_low, b_low, keep, &y, &pre)) return Tensor();
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_features);
  if (keep) {
    Record("AutocastLinearGeluBackward", {x, weight, bias}, y,
           [grad_x, grad_w, grad_b, pre, rows, out_features, x_dtype = x.dtype(),
            x_shape = x.shape(), sx = grad_w ? x_low.detach() : Tensor(),
            sw = grad_x ? w_low : Tensor()](const Tensor& grad_y) {
             std::vector<Tensor> grads =
                 GeluLinearGradients(grad_y.reshape({rows, out_features}), pre, sx, sw, grad_x,
                                     grad_w, grad_b, x_dtype, kFloat32);
             if (grads[0].defined()) grads[0] = grads[0].reshape(x_shape);
             return grads;
           });
  }
  return y.reshape(out_shape);
}

// What linear_gelu_linear's node saves and which gradients it computes: the same in float32,
// 16 bits and under autocast, where the parameters' gradients come out in float32.
struct MlpSaved {
  bool grad_x, grad_fc_w, grad_fc_b, grad_proj_w, grad_proj_b, has_proj_bias;
  Tensor x, fc_weight, pre, h, proj_weight;  // x [rows, in], pre and h [rows, hidden]
  DType x_dtype, param_dtype;
};

// The gradients of linear_gelu_linear's y ([rows, out]) for x, fc's weight and bias, proj's weight
// (and bias): proj's weight gradient with its bias gradient in one GEMM (BGRADB), the gradient
// through proj and the GELU with fc's bias gradient in one (DGELU_BGRAD), then fc's weight and
// x's: four GEMMs and no pass of their own over the hidden activations.
std::vector<Tensor> MlpGradients(const MlpSaved& s, const Tensor& grad) {
  Tensor grad_proj_b;
  const Tensor grad_proj_w = s.grad_proj_w ? WeightGradRaw(grad, s.h, s.param_dtype,
                                                           s.grad_proj_b ? &grad_proj_b : nullptr)
                                           : Tensor();
  if (s.grad_proj_b && !grad_proj_b.defined()) {
    grad_proj_b = CastRaw(
        ViewRaw(ReduceRaw(grad, {0}, ReduceKind::kSum, "linear_gelu_linear"), {grad.shape()[1]}),
        s.param_dtype);
  }
  std::vector<Tensor> grads(3);
  if (s.grad_x || s.grad_fc_w || s.grad_fc_b) {
    Tensor grad_fc_b;
    const Tensor g =
        GeluGradientThroughLinear(grad, s.proj_weight, s.pre, s.param_dtype, &grad_fc_b);
    grads = PreActivationGradients(g, grad_fc_b, s.x, s.fc_weight, s.grad_x, s.grad_fc_w,
                                   s.grad_fc_b, s.x_dtype, s.param_dtype);
  }
  grads.push_back(grad_proj_w);
  if (s.has_proj_bias) grads.push_back(grad_proj_b);
  return grads;
}

// linear_gelu_linear under autocast with float32 parameters, as AutocastLinearGelu: the four
// parameters cast outside the graph, one node whose edges go to the uncast ones. Undefined,
// having recorded nothing, where the backend does not fuse: the caller composes.
Tensor AutocastLinearGeluLinear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                                const Tensor& proj_weight, const Tensor& proj_bias) {
  const DType low = AutocastMode::GetDType(fc_weight.device().type());
  const bool has_proj_bias = proj_bias.defined();
  std::vector<Tensor> inputs = {x, fc_weight, fc_bias, proj_weight};
  if (has_proj_bias) inputs.push_back(proj_bias);
  const bool keep = NeedsGrad(inputs);
  const int64_t in = fc_weight.size(1), out_features = proj_weight.size(0);
  const int64_t rows = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  const bool grad_x = NeedsGrad({x});
  const Tensor fc_w_low =
      autocast::CastWeightOutsideGraph(fc_weight, /*keep=*/grad_x || !GradMode::IsEnabled());
  const Tensor fc_b_low = autocast::CastWeightOutsideGraph(fc_bias, /*keep=*/true);
  const Tensor proj_w_low = autocast::CastWeightOutsideGraph(proj_weight, /*keep=*/true);
  const Tensor proj_b_low =
      has_proj_bias ? autocast::CastWeightOutsideGraph(proj_bias, /*keep=*/true) : Tensor();
  Tensor x_low;
  {
    NoGradGuard no_grad;  // the node is recorded below
    x_low = x.to(low).reshape({rows, in});
  }
  Tensor h, pre;
  if (!GeluLinearGemm(x_low, fc_w_low, fc_b_low, keep, &h, &pre)) return Tensor();
  Tensor y = LinearGemmRaw(h, proj_w_low, proj_b_low);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_features);
  if (keep) {
    MlpSaved saved{grad_x,
                   NeedsGrad({fc_weight}),
                   NeedsGrad({fc_bias}),
                   NeedsGrad({proj_weight}),
                   has_proj_bias && NeedsGrad({proj_bias}),
                   has_proj_bias,
                   Tensor(),
                   Tensor(),
                   pre,
                   Tensor(),
                   proj_w_low,
                   x.dtype(),
                   kFloat32};
    if (saved.grad_fc_w) saved.x = x_low.detach();
    if (saved.grad_x) saved.fc_weight = fc_w_low;
    if (saved.grad_proj_w) saved.h = h;
    Record(
        "AutocastLinearGeluLinearBackward", inputs, y,
        [saved = std::move(saved), rows, out_features, x_shape = x.shape()](const Tensor& grad_y) {
          std::vector<Tensor> grads = MlpGradients(saved, grad_y.reshape({rows, out_features}));
          if (grads[0].defined()) grads[0] = grads[0].reshape(x_shape);
          return grads;
        });
  }
  return y.reshape(out_shape);
}

}  // namespace

// Note [Fused linear_gelu]: an op of its own rather than an epilogue that linear would pick by
// looking ahead: the op that fuses must also own the backward, which needs the pre-activation
// (cuBLASLt's GELU_AUX_BIAS writes it beside the output), not the GELU's output that a separate
// gelu node would save. So one node holds the pre-activation and computes grad * gelu'(pre)
// then the two GEMMs, the bias gradient fused into the weight gradient's (BGRADB). Everything
// a fused kernel cannot take is gelu(linear(...)) itself, which also gives linear's messages
// for bad arguments.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const std::string& approximate) {
  TANDEM_CHECK(
      approximate == "none" || approximate == "tanh",
      "linear_gelu: approximate must be \"none\" (the exact erf form) or \"tanh\" but is \"",
      approximate, "\"");
  const auto composed = [&] { return gelu(linear(x, weight, bias), approximate); };
  // cuBLASLt's GELU is the tanh form, and its epilogue takes a bias.
  if (approximate != "tanh" || !x.defined() || !weight.defined() || !bias.defined()) {
    return composed();
  }
  if (AutocastMode::IsAnyEnabled()) {
    if (autocast::IsEligible(x) && autocast::IsEligible(weight) && weight.dtype() == kFloat32 &&
        bias.dtype() == kFloat32 && x.dim() >= 1 && weight.dim() == 2 &&
        x.size(-1) == weight.size(1) && bias.dim() == 1 && bias.size(0) == weight.size(0) &&
        x.device() == weight.device() && bias.device() == weight.device() &&
        !x.device().is_cpu()) {  // the CPU backend fuses no epilogue: spare it the casts
      if (Tensor y = AutocastLinearGelu(x, weight, bias); y.defined()) return y;
    }
    return composed();
  }
  const DType dtype = x.dtype();
  if ((dtype != kFloat32 && dtype != kBFloat16 && dtype != kFloat16) || weight.dtype() != dtype ||
      bias.dtype() != dtype || weight.device() != x.device() || bias.device() != x.device() ||
      weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1) || bias.dim() != 1 ||
      bias.size(0) != weight.size(0)) {
    return composed();
  }
  const int64_t in = weight.size(1), out_features = weight.size(0);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = NumElements(out_shape);
  out_shape.push_back(out_features);
  const Tensor x2 = x.dim() == 2 ? x : x.reshape({rows, in});
  const std::vector<Tensor> inputs = {x2, weight, bias};
  const bool keep = NeedsGrad(inputs);
  Tensor y, pre;
  if (!GeluLinearGemm(x2, weight, bias, keep, &y, &pre)) return composed();
  if (keep) {
    const bool grad_x = NeedsGrad({x2}), grad_w = NeedsGrad({weight}), grad_b = NeedsGrad({bias});
    Record(
        "LinearGeluBackward", inputs, y,
        [grad_x, grad_w, grad_b, pre, x2, weight, bias](const Tensor& grad) {
          if (CreatingGraph()) {
            return RecomputedGradients([&] { return gelu(linear(x2, weight, bias), "tanh"); },
                                       {x2, weight, bias}, grad);
          }
          return GeluLinearGradients(grad, pre, x2, weight, grad_x, grad_w, grad_b, grad.dtype(),
                                     grad.dtype());
        },
        DoubleBackward::kSupported);
  }
  return x.dim() == 2 ? y : y.reshape(out_shape);
}

// Note [Fused MLP]: linear_gelu_linear is a transformer's MLP, linear(linear_gelu(x, fc), proj),
// as one node, for its backward: the gradient reaching the GELU's output is proj's input gradient,
// a GEMM, and cuBLASLt's DGELU_BGRAD epilogue multiplies it by gelu'(pre) and sums fc's bias
// gradient in that same GEMM. Two nodes cannot do that: proj's node would have to know that its
// input came out of a GELU, and the GELU's node would receive a gradient already through it. One
// node saves x, the pre-activation and the GELU's output, and the backward is four GEMMs (proj's
// weight with its bias gradient, the gradient through proj and the GELU with fc's bias gradient,
// fc's weight, x's) where the two nodes took four GEMMs and a pass over the [rows, 4 n_embd]
// activations. Everything the fused GEMMs cannot take is the two ops composed.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                          const Tensor& proj_weight, const Tensor& proj_bias) {
  const auto composed = [&] {
    return linear(linear_gelu(x, fc_weight, fc_bias, "tanh"), proj_weight, proj_bias);
  };
  if (!x.defined() || !fc_weight.defined() || !fc_bias.defined() || !proj_weight.defined()) {
    return composed();
  }
  const bool has_proj_bias = proj_bias.defined();
  // The shapes and devices that the fused path takes; anything else gets linear's messages.
  const bool shapes =
      x.dim() >= 1 && fc_weight.dim() == 2 && x.size(-1) == fc_weight.size(1) &&
      fc_bias.dim() == 1 && fc_bias.size(0) == fc_weight.size(0) && proj_weight.dim() == 2 &&
      proj_weight.size(1) == fc_weight.size(0) &&
      (!has_proj_bias || (proj_bias.dim() == 1 && proj_bias.size(0) == proj_weight.size(0))) &&
      fc_weight.device() == x.device() && fc_bias.device() == x.device() &&
      proj_weight.device() == x.device() && (!has_proj_bias || proj_bias.device() == x.device()) &&
      !x.device().is_cpu();  // the CPU backend fuses no epilogue
  if (!shapes) return composed();
  const auto all_dtype = [&](DType dtype) {
    return fc_weight.dtype() == dtype && fc_bias.dtype() == dtype && proj_weight.dtype() == dtype &&
           (!has_proj_bias || proj_bias.dtype() == dtype);
  };
  if (AutocastMode::IsAnyEnabled()) {
    if (autocast::IsEligible(x) && autocast::IsEligible(fc_weight) && all_dtype(kFloat32)) {
      if (Tensor y = AutocastLinearGeluLinear(x, fc_weight, fc_bias, proj_weight, proj_bias);
          y.defined()) {
        return y;
      }
    }
    return composed();
  }
  const DType dtype = x.dtype();
  if ((dtype != kFloat32 && dtype != kBFloat16 && dtype != kFloat16) || !all_dtype(dtype)) {
    return composed();
  }
  const int64_t in = fc_weight.size(1), out_features = proj_weight.size(0);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = NumElements(out_shape);
  out_shape.push_back(out_features);
  const Tensor x2 = x.dim() == 2 ? x : x.reshape({rows, in});
  std::vector<Tensor> inputs = {x2, fc_weight, fc_bias, proj_weight};
  if (has_proj_bias) inputs.push_back(proj_bias);
  const bool keep = NeedsGrad(inputs);
  Tensor h, pre;
  if (!GeluLinearGemm(x2, fc_weight, fc_bias, keep, &h, &pre)) return composed();
  Tensor y = LinearGemmRaw(h, proj_weight, proj_bias);
  if (keep) {
    MlpSaved saved{NeedsGrad({x2}),
                   NeedsGrad({fc_weight}),
                   NeedsGrad({fc_bias}),
                   NeedsGrad({proj_weight}),
                   has_proj_bias && NeedsGrad({proj_bias}),
                   has_proj_bias,
                   x2,
                   fc_weight,
                   pre,
                   Tensor(),
                   proj_weight,
                   dtype,
                   dtype};
    if (saved.grad_proj_w) saved.h = h;
    Record(
        "LinearGeluLinearBackward", inputs, y,
        [saved = std::move(saved), inputs](const Tensor& grad) {
          if (CreatingGraph()) {
            return RecomputedGradients(
                [&] {
                  return linear(gelu(linear(inputs[0], inputs[1], inputs[2]), "tanh"), inputs[3],
                                inputs.size() > 4 ? inputs[4] : Tensor());
                },
                inputs, grad);
          }
          return MlpGradients(saved, grad);
        },
        DoubleBackward::kSupported);
  }
  return x.dim() == 2 ? y : y.reshape(out_shape);
}

}  // namespace tandem
