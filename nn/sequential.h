// Sequential: a chain of modules, each fed the outputs of the one before, named "0", "1",
// ... as in PyTorch. ModuleList (below): a list of modules without a forward.
//
//   nn::Sequential mlp(nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 10));
//   Tensor logits = mlp.forward(images.flatten(1));
//   std::cout << mlp;
//   // Sequential(
//   //   (0): Linear(in_features=784, out_features=256, bias=True)
//   //   (1): ReLU()
//   //   (2): Linear(in_features=256, out_features=10, bias=True)
//   // )
//
// Modules may also be given as shared pointers (shared, not copied):
//   nn::Sequential seq({std::make_shared<nn::Linear>(784, 256), std::make_shared<nn::ReLU>()});
#ifndef TANDEM_NN_SEQUENTIAL_H_
#define TANDEM_NN_SEQUENTIAL_H_

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace tandem::nn {

namespace internal {

template <typename T>
struct IsModulePointer : std::false_type {};
template <typename T>
struct IsModulePointer<std::shared_ptr<T>> : std::is_base_of<Module, T> {};

// A module by value, or a shared pointer to one.
template <typename T>
constexpr bool kIsModuleArg =
    std::is_base_of_v<Module, std::decay_t<T>> || IsModulePointer<std::decay_t<T>>::value;

}  // namespace internal

class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  // Sequential({std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>()}).
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules)
      : Sequential(std::vector<std::shared_ptr<Module>>(modules)) {}
  // Sequential(nn::Linear(4, 8), nn::ReLU(), std::make_shared<nn::Linear>(8, 2)).
  template <typename First, typename... Rest,
            typename = std::enable_if_t<
                internal::kIsModuleArg<First> && (internal::kIsModuleArg<Rest> && ...) &&
                !(sizeof...(Rest) == 0 && std::is_same_v<std::decay_t<First>, Sequential>)>>
  explicit Sequential(First&& first, Rest&&... rest) {
    push_back(std::forward<First>(first));
    (push_back(std::forward<Rest>(rest)), ...);
  }

  // Appends a module, named by its position.
  void push_back(std::shared_ptr<Module> module);
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>>>
  void push_back(M&& module) {
    push_back(std::shared_ptr<Module>(std::make_shared<std::decay_t<M>>(std::forward<M>(module))));
  }

  size_t size() const { return named_children().size(); }
  bool empty() const { return size() == 0; }
  std::shared_ptr<Module> operator[](size_t index) const;
  // The module at `index` as an M; throws if it is something else.
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    std::shared_ptr<M> typed = std::dynamic_pointer_cast<M>((*this)[index]);
    CheckType(index, typed != nullptr);
    return typed;
  }

  // Runs the chain on one tensor; the last module must return one tensor.
  Tensor forward(const Tensor& input);
  // Runs the chain on any number of tensors: module i gets module i-1's outputs. An empty
  // Sequential returns its inputs.
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs) override;
  // Clones each module in turn (each must support clone()).
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const override;

 private:
  void CheckType(size_t index, bool ok) const;
};

// ModuleList: holds modules in a list, registered as children named "0", "1", ..., as
// torch.nn.ModuleList, so that parameters(), state_dict(), to(), clone() and printing see
// them. It has no forward: the owner decides how to call them.
//
//   class Tower : public nn::Cloneable<Tower> {
//    public:
//     void reset() override {
//       blocks_ = register_module("blocks", nn::ModuleList());
//       for (int i = 0; i < 3; ++i) blocks_->push_back(nn::Linear(8, 8));
//     }
//     Tensor forward(Tensor x) {
//       for (const auto& block : *blocks_) x = x + block->forward_tensors({x})[0];
//       return x;
//     }
//    private:
//     std::shared_ptr<nn::ModuleList> blocks_;
//   };
//   // state_dict names: blocks.0.weight, blocks.0.bias, blocks.1.weight, ...
class ModuleList : public Module {
 public:
  using const_iterator = std::vector<std::shared_ptr<Module>>::const_iterator;

  ModuleList() = default;
  explicit ModuleList(std::vector<std::shared_ptr<Module>> modules);
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules)
      : ModuleList(std::vector<std::shared_ptr<Module>>(modules)) {}
  // ModuleList(nn::Linear(4, 8), nn::ReLU(), std::make_shared<nn::Linear>(8, 2)).
  template <typename First, typename... Rest,
            typename = std::enable_if_t<
                internal::kIsModuleArg<First> && (internal::kIsModuleArg<Rest> && ...) &&
                !(sizeof...(Rest) == 0 && std::is_same_v<std::decay_t<First>, ModuleList>)>>
  explicit ModuleList(First&& first, Rest&&... rest) {
    push_back(std::forward<First>(first));
    (push_back(std::forward<Rest>(rest)), ...);
  }

  // Appends a module, named by its position.
  void push_back(std::shared_ptr<Module> module);
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>>>>
  void push_back(M&& module) {
    push_back(std::shared_ptr<Module>(std::make_shared<std::decay_t<M>>(std::forward<M>(module))));
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  // Throws naming the size when index is out of range.
  std::shared_ptr<Module> operator[](size_t index) const;
  // The module at `index` as an M; throws if it is something else.
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    std::shared_ptr<M> typed = std::dynamic_pointer_cast<M>((*this)[index]);
    CheckType(index, typed != nullptr);
    return typed;
  }
  const_iterator begin() const { return modules_.begin(); }
  const_iterator end() const { return modules_.end(); }

  // Clones each module in turn (each must support clone()).
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const override;

 private:
  void CheckType(size_t index, bool ok) const;

  std::vector<std::shared_ptr<Module>> modules_;  // the children, in order
};

}  // namespace tandem::nn

#endif  // TANDEM_NN_SEQUENTIAL_H_
