// What the engine and the recording side of autograd share for double backward (create_graph):
// the node being applied on this thread (SavedOutput reads it), the recorded sum of two
// gradients and the node that refuses a second backward. Private to tensor/core.
#ifndef TANDEM_TENSOR_CORE_INTERNAL_AUTOGRAD_INTERNAL_H_
#define TANDEM_TENSOR_CORE_INTERNAL_AUTOGRAD_INTERNAL_H_

#include <memory>
#include <vector>

#include "tensor/core/autograd.h"

namespace tandem::internal {

// Makes `node` the node whose Apply runs on this thread for the scope's lifetime (nested
// passes, run from inside a node, restore the outer one).
class ApplyingNodeScope {
 public:
  explicit ApplyingNodeScope(const std::shared_ptr<Node>& node);
  ~ApplyingNodeScope();
  ApplyingNodeScope(const ApplyingNodeScope&) = delete;
  ApplyingNodeScope& operator=(const ApplyingNodeScope&) = delete;

 private:
  const std::shared_ptr<Node>* previous_;
};

// a + b (one shape) for two gradients that meet under create_graph: computed with the
// backend's kernel and recorded as a node that hands its gradient to both, so the sum stays
// differentiable without the engine reaching up into the ops layer.
Tensor AddGradientsWithGraph(const Tensor& a, const Tensor& b);

// Under create_graph, for a node that does not support double backward: gives each defined
// gradient in `input_grads` a node named after `node` that throws on a second backward. Its
// edges lead where `node`'s do and to the `grad_outputs` that have graphs, so the error is
// reached exactly when a second derivative through `node` is asked for.
void RefuseDoubleBackward(const Node& node, const std::vector<Tensor>& grad_outputs,
                          std::vector<Tensor>& input_grads);

}  // namespace tandem::internal

#endif  // TANDEM_TENSOR_CORE_INTERNAL_AUTOGRAD_INTERNAL_H_
