// A small transformer for the tests of activation checkpointing across devices and ranks
// (testonly target //nn:checkpointed_stack_testing): two encoder layers with dropout, each run
// through nn::checkpoint or plainly, then a linear head. The checkpoint's closure holds the
// layer by shared_ptr: DataParallel's replicas are gone by the time backward recomputes.
//
//   auto model = std::make_shared<nn::testing::CheckpointedStack>(/*checkpointed=*/true, 0.1);
//   Tensor y = model->forward(x);   // x: [batch, seq, 16]
#ifndef TANDEM_NN_CHECKPOINTED_STACK_TESTING_H_
#define TANDEM_NN_CHECKPOINTED_STACK_TESTING_H_

#include <memory>
#include <vector>

#include "nn/activation_checkpoint.h"
#include "nn/nn.h"

namespace tandem::nn::testing {

class CheckpointedStack : public Cloneable<CheckpointedStack> {
 public:
  static constexpr int64_t kWidth = 16;

  CheckpointedStack(bool checkpointed, double dropout)
      : checkpointed_(checkpointed), dropout_(dropout) {
    reset();
  }
  void reset() override {
    const auto options =
        TransformerLayerOptions(kWidth, 2).dim_feedforward(32).dropout(dropout_).batch_first(true);
    layers_ = {register_module("layer0", TransformerEncoderLayer(options)),
               register_module("layer1", TransformerEncoderLayer(options))};
    head_ = register_module("head", Linear(kWidth, 4));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = x;
    for (const auto& layer : layers_) {
      h = checkpointed_ ? checkpoint([layer](const Tensor& in) { return layer->forward(in); }, h)
                        : layer->forward(h);
    }
    return head_->forward(h);
  }

 private:
  bool checkpointed_;
  double dropout_;
  std::vector<std::shared_ptr<TransformerEncoderLayer>> layers_;
  std::shared_ptr<Linear> head_;
};

}  // namespace tandem::nn::testing

#endif  // TANDEM_NN_CHECKPOINTED_STACK_TESTING_H_
