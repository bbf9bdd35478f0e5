#include "parallel/scatter_gather.h"

#include <memory>
#include <string>

#include "parallel/comm.h"
#include "tensor/core/autograd.h"

namespace tandem::parallel {
namespace {

std::vector<Device> DevicesOf(const std::vector<Tensor>& tensors) {
  std::vector<Device> devices;
  for (const Tensor& t : tensors) devices.push_back(t.device());
  return devices;
}

// Backward of Scatter: the chunks' gradients, concatenated on the source device.
class ScatterBackward final : public Node {
 public:
  ScatterBackward(Device source, std::vector<Device> devices, std::vector<Shape> chunk_shapes,
                  int64_t dim)
      : Node(source, std::move(devices)), chunk_shapes_(std::move(chunk_shapes)), dim_(dim) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) {
        grads[i] = zeros(chunk_shapes_[i], TensorOptions().device(output_device(i)));
      }
    }
    // Under create_graph (double backward) the recorded Gather, Scatter's adjoint.
    if (GradMode::IsEnabled()) return {Gather(grads, device(), dim_)};
    return {gather(grads, device(), dim_)};
  }
  std::string name() const override { return "ScatterBackward"; }
  bool SupportsDoubleBackward() const override { return true; }

 private:
  std::vector<Shape> chunk_shapes_;
  int64_t dim_;
};

// Backward of Gather: the gradient, split back into the pieces' sizes and devices.
class GatherBackward final : public Node {
 public:
  GatherBackward(Device destination, std::vector<Device> sources, std::vector<int64_t> sizes,
                 int64_t dim, bool scalars)
      : Node(destination),
        sources_(std::move(sources)),
        sizes_(std::move(sizes)),
        dim_(dim),
        scalars_(scalars) {}

  std::vector<Tensor> Apply(std::vector<Tensor> grads) override {
    // Under create_graph (double backward) the recorded Scatter, Gather's adjoint.
    std::vector<Tensor> pieces = GradMode::IsEnabled() ? Scatter(grads[0], sources_, sizes_, dim_)
                                                       : scatter(grads[0], sources_, sizes_, dim_);
    if (scalars_) {
      for (Tensor& piece : pieces) piece = piece.view({});
    }
    return pieces;
  }
  std::string name() const override { return "GatherBackward"; }
  bool SupportsDoubleBackward() const override { return true; }

 private:
  std::vector<Device> sources_;
  std::vector<int64_t> sizes_;
  int64_t dim_;
  bool scalars_;
};

}  // namespace

std::vector<Tensor> Scatter(const Tensor& input, const std::vector<Device>& devices,
                            const std::vector<int64_t>& chunk_sizes, int64_t dim) {
  std::vector<Tensor> chunks = scatter(input, devices, chunk_sizes, dim);
  if (NeedsGrad({input})) {
    std::vector<Shape> shapes;
    for (const Tensor& c : chunks) shapes.push_back(c.shape());
    const int64_t axis = WrapDim(dim, input.dim(), "scatter");
    RecordMultiOutputOp(
        std::make_shared<ScatterBackward>(input.device(), DevicesOf(chunks), shapes, axis), {input},
        chunks);
  }
  return chunks;
}

Tensor Gather(const std::vector<Tensor>& pieces, Device destination, int64_t dim) {
  Tensor out = gather(pieces, destination, dim);
  if (NeedsGrad(pieces)) {
    const bool scalars = pieces[0].dim() == 0;
    const int64_t axis = scalars ? 0 : WrapDim(dim, pieces[0].dim(), "gather");
    std::vector<int64_t> sizes;
    for (const Tensor& p : pieces) sizes.push_back(scalars ? 1 : p.size(axis));
    RecordOp(std::make_shared<GatherBackward>(destination, DevicesOf(pieces), sizes, axis, scalars),
             pieces, out);
  }
  return out;
}

std::vector<std::vector<Tensor>> scatter_inputs(const std::vector<Tensor>& inputs,
                                                const std::vector<Device>& devices, int64_t dim,
                                                const std::vector<int64_t>& chunk_sizes) {
  TANDEM_CHECK(!devices.empty(), "scatter_inputs: expected at least one device but got none");
  if (inputs.empty()) return {std::vector<Tensor>{}};
  for (size_t k = 0; k < inputs.size(); ++k) {
    TANDEM_CHECK(inputs[k].defined(), "scatter_inputs: input ", k, " is undefined");
    TANDEM_CHECK(inputs[k].dim() > 0, "scatter_inputs: input ", k,
                 " is 0-dimensional and cannot be split along dimension ", dim,
                 "; give it a batch dimension");
  }
  const int64_t axis = WrapDim(dim, inputs[0].dim(), "scatter_inputs");
  const int64_t batch = inputs[0].size(axis);
  for (size_t k = 1; k < inputs.size(); ++k) {
    const int64_t other_axis = WrapDim(dim, inputs[k].dim(), "scatter_inputs");
    TANDEM_CHECK(inputs[k].size(other_axis) == batch, "scatter_inputs: every input must have ",
                 batch, " entries along dimension ", dim, " (as input 0, ",
                 ShapeToString(inputs[0].shape()), ") but input ", k, " has shape ",
                 ShapeToString(inputs[k].shape()));
  }
  TANDEM_CHECK(chunk_sizes.empty() || chunk_sizes.size() == devices.size(),
               "scatter_inputs: expected one chunk size per device (", devices.size(), ") but got ",
               chunk_sizes.size());
  // One rule for every input, so that chunk i of each goes to the same replica.
  const std::vector<int64_t> sizes =
      chunk_sizes.empty() ? ChunkSizes(batch, static_cast<int64_t>(devices.size())) : chunk_sizes;
  std::vector<Device> targets(devices.begin(), devices.begin() + sizes.size());
  std::vector<std::vector<Tensor>> per_replica(sizes.size());
  for (const Tensor& input : inputs) {
    std::vector<Tensor> chunks = Scatter(input, targets, sizes, dim);
    for (size_t i = 0; i < chunks.size(); ++i) per_replica[i].push_back(std::move(chunks[i]));
  }
  return per_replica;
}

}  // namespace tandem::parallel
