#include "nn/module.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include "nn/layers.h"
#include "nn/sequential.h"
#include "nn/test_util.h"
#include "tensor/core/autograd.h"
#include "tensor/runtime/devices.h"

namespace tandem::nn {
namespace {

using ::testing::ElementsAre;
using testing::ErrorOf;
using ::testing::HasSubstr;

std::vector<std::string> Names(const std::vector<NamedTensor>& tensors) {
  std::vector<std::string> names;
  for (const NamedTensor& t : tensors) names.push_back(t.name);
  return names;
}

// A user-defined module with two inputs, a parameter of its own, a buffer and submodules.
class TwoTower : public Cloneable<TwoTower> {
 public:
  TwoTower(int64_t x_features, int64_t y_features)
      : x_features_(x_features), y_features_(y_features) {
    reset();
  }
  void reset() override {
    left_ = register_module("left", Linear(x_features_, 3));
    right_ = register_module("right", Linear(y_features_, 3, /*bias=*/false));
    scale_ = register_parameter("scale", full({3}, 2.0));
    calls_ = register_buffer("offset", ones({3}, kInt64));
  }
  Tensor forward(const Tensor& x, const Tensor& y) {
    return (left_->forward(x) + right_->forward(y)) * *scale_ + *calls_;
  }

  std::shared_ptr<Linear> left() const { return left_; }
  const Parameter& scale() const { return scale_; }

 private:
  int64_t x_features_, y_features_;
  std::shared_ptr<Linear> left_, right_;
  Parameter scale_;
  Buffer calls_;
};

class ModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetCpuDeviceCount(4);
    manual_seed(0);
  }
};

TEST_F(ModuleTest, RegistersInOrderAndNamesRecursively) {
  TwoTower model(4, 2);
  EXPECT_THAT(Names(model.named_parameters()),
              ElementsAre("scale", "left.weight", "left.bias", "right.weight"));
  EXPECT_THAT(Names(model.named_parameters(/*recurse=*/false)), ElementsAre("scale"));
  EXPECT_THAT(Names(model.named_buffers()), ElementsAre("offset"));
  ASSERT_EQ(model.named_children().size(), 2u);
  EXPECT_EQ(model.named_children()[0].name, "left");
  EXPECT_EQ(model.children()[1]->name(), "Linear");
  EXPECT_EQ(model.modules().size(), 3u);
  EXPECT_EQ(model.parameters().size(), 4u);
  EXPECT_EQ(model.parameter("left.weight").shape(), (Shape{3, 4}));
  EXPECT_TRUE(model.parameter("left.weight").requires_grad());
  EXPECT_FALSE(model.buffer("offset").requires_grad());
  EXPECT_EQ(model.name(), "TwoTower");
  // The handle and the registry hold the same tensor.
  EXPECT_EQ(model.scale()->impl(), model.parameter("scale").impl());
}

TEST_F(ModuleTest, StateDictRoundTripsIntoAnotherModule) {
  TwoTower source(4, 2), target(4, 2);
  const std::vector<NamedTensor> state = source.state_dict();
  EXPECT_THAT(Names(state),
              ElementsAre("scale", "left.weight", "left.bias", "right.weight", "offset"));
  EXPECT_FALSE(state[1].value.requires_grad());
  EXPECT_TRUE(state[1].value.shares_storage_with(source.parameter("left.weight")));
  ASSERT_NE(target.parameter("left.weight").to_vector<float>(),
            source.parameter("left.weight").to_vector<float>());
  const Tensor target_weight = target.parameter("left.weight");
  const LoadStateDictResult result = target.load_state_dict(state);
  EXPECT_TRUE(result.missing_keys.empty());
  EXPECT_TRUE(result.unexpected_keys.empty());
  for (const NamedTensor& t : state) {
    const Tensor mine = t.name == "offset" ? target.buffer(t.name) : target.parameter(t.name);
    EXPECT_EQ(mine.to(kFloat32).to_vector<float>(), t.value.to(kFloat32).to_vector<float>())
        << t.name;
  }
  // Loaded in place: handles (and optimizers holding them) see the values; still a leaf.
  EXPECT_EQ(target.parameter("left.weight").impl(), target_weight.impl());
  EXPECT_TRUE(target.parameter("left.weight").requires_grad());
  // From another device: values are copied onto the module's device.
  std::vector<NamedTensor> moved = source.state_dict();
  for (NamedTensor& t : moved) t.value = t.value.to(Device::Cpu(1));
  target.load_state_dict(moved);
  EXPECT_EQ(target.parameter("scale").device(), Device::Cpu(0));
}

TEST_F(ModuleTest, LoadStateDictStrictAndNonStrict) {
  TwoTower model(4, 2);
  const std::vector<float> before = model.parameter("scale").to_vector<float>();
  std::vector<NamedTensor> state = {{"scale", full({3}, 5.0)}, {"extra", zeros({1})}};
  const std::string error = ErrorOf([&] { model.load_state_dict(state); });
  EXPECT_THAT(error, HasSubstr("Error(s) in loading state_dict for TwoTower (nothing was loaded)"));
  EXPECT_THAT(error, HasSubstr("missing key: 'left.weight'"));
  EXPECT_THAT(error, HasSubstr("unexpected key: 'extra'"));
  EXPECT_THAT(error, HasSubstr("strict = false"));
  EXPECT_EQ(model.parameter("scale").to_vector<float>(), before);  // nothing loaded

  const LoadStateDictResult result = model.load_state_dict(state, /*strict=*/false);
  EXPECT_THAT(result.missing_keys,
              ElementsAre("left.weight", "left.bias", "right.weight", "offset"));
  EXPECT_THAT(result.unexpected_keys, ElementsAre("extra"));
  EXPECT_THAT(model.parameter("scale").to_vector<float>(), ElementsAre(5, 5, 5));

  // Shape mismatches throw even when not strict; so do repeated names.
  EXPECT_THAT(ErrorOf([&] {
                model.load_state_dict({{"scale", zeros({4})}}, false);
              }),
              HasSubstr("size mismatch: 'scale' is [4] float32 in the state dictionary but [3] "
                        "float32 in the module"));
  EXPECT_THAT(ErrorOf([&] {
                model.load_state_dict({{"scale", zeros({3})}, {"scale", zeros({3})}}, false);
              }),
              HasSubstr("'scale' appears twice"));
}

TEST_F(ModuleTest, LookupErrorsSayWhatExists) {
  TwoTower model(4, 2);
  EXPECT_THAT(ErrorOf([&] { model.parameter("left.weights"); }),
              HasSubstr("TwoTower has no parameter 'left.weights' (Linear's parameters: weight, "
                        "bias)"));
  EXPECT_THAT(ErrorOf([&] { model.parameter("middle.weight"); }),
              HasSubstr("has no submodule 'middle' (its submodules: left, right)"));
  EXPECT_THAT(ErrorOf([&] { model.buffer("scale"); }), HasSubstr("has no buffer 'scale'"));
}

TEST_F(ModuleTest, RegistrationRejectsBadNamesAndTensors) {
  Module m("Plain");
  m.register_parameter("w", zeros({2}));
  EXPECT_THAT(ErrorOf([&] { m.register_buffer("w", zeros({2})); }),
              HasSubstr("Plain: cannot register buffer 'w': a parameter of that name is already"));
  EXPECT_THAT(ErrorOf([&] { m.register_parameter("a.b", zeros({2})); }),
              HasSubstr("must not contain '.'"));
  EXPECT_THAT(ErrorOf([&] { m.register_parameter("", zeros({2})); }), HasSubstr("empty name"));
  EXPECT_THAT(ErrorOf([&] { m.register_parameter("i", zeros({2}, kInt64)); }),
              HasSubstr("parameter 'i' must be floating-point (float32 or float64"));
  Tensor leaf = ones({2}, TensorOptions().requires_grad(true));
  EXPECT_THAT(ErrorOf([&] { m.register_parameter("sum", leaf * 2.0); }),
              HasSubstr("must be a leaf tensor"));
  EXPECT_THAT(ErrorOf([&] { m.register_parameter("u", Tensor()); }), HasSubstr("undefined"));
  auto outer = std::make_shared<Module>("Outer");
  auto inner = outer->register_module("inner", std::make_shared<Module>("Inner"));
  EXPECT_THAT(ErrorOf([&] { inner->register_module("outer", outer); }),
              HasSubstr("would make the module tree a cycle"));
  EXPECT_THAT(ErrorOf([&] { *TensorHandle(); }), HasSubstr("refers to nothing"));
}

TEST_F(ModuleTest, PrintsLikePyTorch) {
  EXPECT_EQ(Linear(10, 5).ToString(), "Linear(in_features=10, out_features=5, bias=True)");
  EXPECT_EQ(ReLU().ToString(), "ReLU()");
  TwoTower model(4, 2);
  // What PyTorch prints for the same structure (an extra_repr-less module with children).
  EXPECT_EQ(model.ToString(),
            "TwoTower(\n"
            "  (left): Linear(in_features=4, out_features=3, bias=True)\n"
            "  (right): Linear(in_features=2, out_features=3, bias=False)\n"
            ")");
  Sequential outer(Sequential(Linear(784, 256), ReLU()), Dropout(0.25));
  std::ostringstream printed;
  printed << outer;
  EXPECT_EQ(printed.str(),
            "Sequential(\n"
            "  (0): Sequential(\n"
            "    (0): Linear(in_features=784, out_features=256, bias=True)\n"
            "    (1): ReLU()\n"
            "  )\n"
            "  (1): Dropout(p=0.25, inplace=False)\n"
            ")");
}

// A module whose extra_repr spans lines and which also has children: PyTorch puts the
// extra lines first, each indented.
class Annotated : public Module {
 public:
  Annotated() : Module("Annotated") { register_module("body", ReLU()); }
  void pretty_print(std::ostream& out) const override { out << "first\nsecond"; }
};

TEST_F(ModuleTest, PrintsMultiLineExtraBeforeChildren) {
  EXPECT_EQ(Annotated().ToString(),
            "Annotated(\n"
            "  first\n"
            "  second\n"
            "  (body): ReLU()\n"
            ")");
}

TEST_F(ModuleTest, ForwardTensorsCallsTheTypedForward) {
  TwoTower model(4, 2);
  Tensor x = randn({5, 4}), y = randn({5, 2});
  Tensor direct = model.forward(x, y);
  Module& generic = model;
  std::vector<Tensor> outputs = generic.forward_tensors({x, y});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_TRUE(allclose(outputs[0], direct));
  // What the typed forward computes, from the parameters.
  Tensor expected = (linear(x, model.parameter("left.weight"), model.parameter("left.bias")) +
                     matmul(y, model.parameter("right.weight").t())) *
                        2.0 +
                    1.0;
  EXPECT_TRUE(allclose(direct, expected, 1e-5, 1e-5));
  EXPECT_THAT(ErrorOf([&] { generic.forward_tensors({x}); }),
              HasSubstr("TwoTower.forward() takes 2 tensors but was given 1"));
  Module plain("Plain");
  EXPECT_THAT(ErrorOf([&] { plain.forward_tensors({x}); }),
              HasSubstr("Plain does not implement forward_tensors()"));
}

TEST_F(ModuleTest, ToMovesParametersKeepingGradientsAndHandles) {
  TwoTower model(4, 2);
  Tensor x = randn({5, 4}), y = randn({5, 2});
  model.forward(x, y).sum().backward();
  const std::vector<float> scale_values = model.scale()->to_vector<float>();
  const std::vector<float> scale_grad = model.scale()->grad().to_vector<float>();

  model.to(Device::Cpu(1));
  for (const NamedTensor& p : model.named_parameters()) {
    EXPECT_EQ(p.value.device(), Device::Cpu(1)) << p.name;
    EXPECT_TRUE(p.value.requires_grad()) << p.name;
    EXPECT_TRUE(p.value.is_leaf()) << p.name;
    ASSERT_TRUE(p.value.grad().defined()) << p.name;
    EXPECT_EQ(p.value.grad().device(), Device::Cpu(1)) << p.name;
  }
  EXPECT_EQ(model.buffer("offset").device(), Device::Cpu(1));
  EXPECT_EQ(model.scale()->device(), Device::Cpu(1));  // the handle followed
  EXPECT_EQ(model.scale()->to_vector<float>(), scale_values);
  EXPECT_EQ(model.scale()->grad().to_vector<float>(), scale_grad);
  // forward() now runs on cpu:1, and an input left on cpu:0 is refused by name.
  EXPECT_EQ(model.forward(x.to(Device::Cpu(1)), y.to(Device::Cpu(1))).device(), Device::Cpu(1));
  EXPECT_THAT(ErrorOf([&] { model.forward(x, y); }),
              HasSubstr("the input is on cpu:0 but the parameters are on cpu:1"));
  EXPECT_THAT(ErrorOf([&] { model.to(Device::Cpu(99)); }), HasSubstr("cpu:99"));
}

TEST_F(ModuleTest, TrainEvalAndZeroGrad) {
  Sequential seq(Linear(3, 3), Dropout(0.5));
  EXPECT_TRUE(seq.is_training());
  seq.eval();
  EXPECT_FALSE(seq.is_training());
  EXPECT_FALSE(seq[1]->is_training());
  seq.train();
  EXPECT_TRUE(seq[1]->is_training());

  seq.forward(randn({2, 3})).sum().backward();
  for (const Tensor& p : seq.parameters()) ASSERT_TRUE(p.grad().defined());
  seq.zero_grad(/*set_to_none=*/false);
  for (const Tensor& p : seq.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(abs(p.grad()).sum().item(), 0.0);
  }
  seq.zero_grad();
  for (const Tensor& p : seq.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST_F(ModuleTest, ReplaceParameterRoutesForwardAndGradientThroughTheNewTensor) {
  Linear layer(3, 2);
  const Tensor original_weight = layer.weight();
  // A non-leaf standing for a broadcast copy: gradients must reach `source`.
  Tensor source = randn({2, 3}, TensorOptions().requires_grad(true));
  Tensor copy = source * 1.0;
  layer.replace_parameter("weight", copy);
  EXPECT_EQ(layer.weight().impl(), copy.impl());
  EXPECT_FALSE(layer.parameter("weight").is_leaf());

  Tensor x = randn({4, 3});
  layer.forward(x).sum().backward();
  ASSERT_TRUE(source.grad().defined());
  // d sum(x W^T + b) / dW = column sums of x, for each output row.
  Tensor expected = x.sum({0}).unsqueeze(0).expand({2, 3});
  EXPECT_TRUE(allclose(source.grad(), expected, 1e-5, 1e-5));
  EXPECT_FALSE(original_weight.grad().defined());

  EXPECT_THAT(ErrorOf([&] {
                layer.replace_parameter("weight", zeros({3, 2}));
              }),
              HasSubstr("cannot replace parameter 'weight' ([2, 3] float32) with a tensor of a "
                        "different shape or dtype ([3, 2] float32)"));
  EXPECT_THAT(ErrorOf([&] {
                layer.replace_parameter("weights", zeros({2, 3}));
              }),
              HasSubstr("Linear has no parameter 'weights'"));
}

// What FullyShardedDataParallel relies on: a hook that runs at every read in forward and binds
// what the read sees, on every name of a tied parameter.
TEST_F(ModuleTest, ReadHooksBindWhatForwardReads) {
  auto model = std::make_shared<Sequential>(Linear(3, 2), Linear(2, 2, /*bias=*/false));
  std::vector<std::pair<std::string, Parameter>> handles = model->named_parameter_handles();
  std::vector<std::string> names;
  for (const auto& [name, handle] : handles) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("0.weight", "0.bias", "1.weight"));

  int reads = 0;
  const Parameter& weight = handles[0].second;
  const Tensor bound = full({2, 3}, 0.5);
  weight.set_read_hook([&] {
    ++reads;
    weight.rebind(bound);
  });
  EXPECT_EQ(reads, 0);
  Tensor y = model->forward(ones({1, 3}));
  const int forward_reads = reads;
  EXPECT_GT(forward_reads, 0);
  EXPECT_EQ(weight.peek().impl(), bound.impl());
  EXPECT_EQ(model->parameter("0.weight").impl(), bound.impl());
  EXPECT_EQ(reads, forward_reads);  // lookups by name are not forward reads
  weight.set_read_hook(nullptr);
  (void)model->forward(ones({1, 3}));
  EXPECT_EQ(reads, forward_reads);
  // rebind takes another dtype (a bfloat16 copy for mixed precision); replace_parameter would not.
  handles[2].second.rebind(zeros({2, 2}, TensorOptions().dtype(kBFloat16)));
  EXPECT_EQ(model->parameter("1.weight").dtype(), kBFloat16);
}

TEST_F(ModuleTest, CloneToAnotherDeviceIsADeepCopy) {
  TwoTower model(4, 2);
  model.named_children()[1].module->eval();  // a submodule in its own mode
  std::shared_ptr<Module> copy = model.clone(Device::Cpu(1));
  auto typed = std::dynamic_pointer_cast<TwoTower>(copy);
  ASSERT_NE(typed, nullptr);
  EXPECT_EQ(copy->ToString(), model.ToString());
  EXPECT_TRUE(copy->is_training());
  EXPECT_FALSE(copy->named_children()[1].module->is_training());

  const std::vector<NamedTensor> originals = model.named_parameters();
  const std::vector<NamedTensor> copies = copy->named_parameters();
  ASSERT_EQ(Names(copies), Names(originals));
  for (size_t i = 0; i < originals.size(); ++i) {
    SCOPED_TRACE(originals[i].name);
    EXPECT_EQ(copies[i].value.device(), Device::Cpu(1));
    EXPECT_FALSE(copies[i].value.shares_storage_with(originals[i].value));
    EXPECT_TRUE(copies[i].value.is_leaf());
    EXPECT_TRUE(copies[i].value.requires_grad());
    EXPECT_EQ(copies[i].value.to_vector<float>(), originals[i].value.to_vector<float>());
  }
  EXPECT_EQ(copy->buffer("offset").device(), Device::Cpu(1));
  EXPECT_EQ(copy->buffer("offset").to_vector<int64_t>(),
            model.buffer("offset").to_vector<int64_t>());

  // The clone's own handles and submodule pointers point at the clone's tensors.
  EXPECT_EQ(typed->scale()->impl(), copy->parameter("scale").impl());
  EXPECT_EQ(typed->left()->weight().impl(), copy->parameter("left.weight").impl());
  EXPECT_NE(typed->left(), model.left());

  // Same function, on the other device; changing the clone leaves the original alone.
  Tensor x = randn({5, 4}), y = randn({5, 2});
  Tensor on_copy = typed->forward(x.to(Device::Cpu(1)), y.to(Device::Cpu(1)));
  EXPECT_TRUE(allclose(on_copy.to(Device::Cpu(0)), model.forward(x, y)));
  {
    NoGradGuard no_grad;
    Tensor scale = copy->parameter("scale");
    scale.fill_(0.0);
  }
  EXPECT_EQ(model.scale()->to_vector<float>(), std::vector<float>(3, 2.0f));
}

TEST_F(ModuleTest, CloneWithoutDeviceKeepsDevicesAndDoesNotDrawRandomNumbers) {
  Sequential seq(Linear(3, 4), ReLU(), Linear(4, 2));
  seq[2]->to(Device::Cpu(2));
  manual_seed(7);
  const std::vector<float> first = rand({4}).to_vector<float>();
  manual_seed(7);
  std::shared_ptr<Module> copy = seq.clone();
  // Cloning re-ran reset() without drawing from the process-wide generator.
  EXPECT_EQ(rand({4}).to_vector<float>(), first);
  EXPECT_EQ(copy->parameter("0.weight").device(), Device::Cpu(0));
  EXPECT_EQ(copy->parameter("2.weight").device(), Device::Cpu(2));
  EXPECT_FALSE(copy->parameter("2.weight").shares_storage_with(seq.parameter("2.weight")));
  EXPECT_EQ(copy->parameter("2.bias").to_vector<float>(),
            seq.parameter("2.bias").to_vector<float>());
}

// A module converted with to(dtype) clones in that dtype, on its device and onto another
// (reset() builds float32; PyTorch's replicate of a model.half() keeps half), and replicates.
TEST_F(ModuleTest, CloneAndReplicateKeepAConvertedFloatingDType) {
  for (DType dtype : {kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    Sequential seq(Linear(3, 4), BatchNorm1d(4), Linear(4, 2));
    seq.to(dtype);
    for (std::optional<Device> where : {std::optional<Device>(), std::optional(Device::Cpu(1))}) {
      std::shared_ptr<Module> copy = seq.clone(where);
      for (const auto& [name, p] : seq.named_parameters()) {
        const Tensor q = copy->parameter(name);
        EXPECT_EQ(q.dtype(), dtype) << name;
        EXPECT_EQ(q.to(Device::Cpu(0)).to(kFloat64).to_vector<double>(),
                  p.to(kFloat64).to_vector<double>())
            << name;
      }
      EXPECT_EQ(copy->buffer("1.running_mean").dtype(), dtype);
      EXPECT_EQ(copy->buffer("1.num_batches_tracked").dtype(), kInt64);
    }
    Module::TensorBindings bindings;
    for (const Tensor& t : seq.parameters()) bindings.emplace(t.impl(), t.detach());
    for (const Tensor& t : seq.buffers()) bindings.emplace(t.impl(), t);
    std::shared_ptr<Module> replica = seq.replicate_structure(bindings);
    EXPECT_EQ(replica->parameter("0.weight").dtype(), dtype);
  }
}

// Ties: one tensor registered in two places stays one tensor in the clone.
class Tied : public Cloneable<Tied> {
 public:
  Tied() { reset(); }
  void reset() override {
    encoder_ = register_module("encoder", Linear(3, 3, false));
    decoder_ = register_module("decoder", Linear(3, 3, false));
  }
  void Tie() { decoder_->replace_parameter("weight", encoder_->weight()); }

 private:
  std::shared_ptr<Linear> encoder_, decoder_;
};

TEST_F(ModuleTest, CloneAndToKeepTiedParametersTied) {
  Tied tied;
  tied.Tie();
  EXPECT_EQ(tied.parameters().size(), 1u);  // listed once
  std::shared_ptr<Module> copy = tied.clone(Device::Cpu(1));
  EXPECT_EQ(copy->parameter("encoder.weight").impl(), copy->parameter("decoder.weight").impl());
  tied.to(Device::Cpu(3));
  EXPECT_EQ(tied.parameter("encoder.weight").impl(), tied.parameter("decoder.weight").impl());
}

// Registers a parameter in its constructor instead of reset(): clone() cannot rebuild it.
class RegistersOutsideReset : public Cloneable<RegistersOutsideReset> {
 public:
  RegistersOutsideReset() {
    reset();
    extra_ = register_parameter("extra", zeros({2}));
  }
  void reset() override { weight_ = register_parameter("weight", zeros({2})); }

 private:
  Parameter weight_, extra_;
};

// Keeps a submodule made in its constructor and registers that same object in reset():
// a clone would share it.
class SharesChild : public Cloneable<SharesChild> {
 public:
  SharesChild() : inner_(std::make_shared<Linear>(2, 2)) { reset(); }
  void reset() override { register_module("inner", inner_); }

 private:
  std::shared_ptr<Linear> inner_;
};

// Builds a differently shaped parameter when reset() runs again.
class ChangesShape : public Cloneable<ChangesShape> {
 public:
  ChangesShape() { reset(); }
  void reset() override { register_parameter("w", zeros({++size_})); }

 private:
  int64_t size_ = 0;
};

TEST_F(ModuleTest, CloneReportsModulesThatDoNotRegisterEverythingInReset) {
  EXPECT_THAT(ErrorOf([] { RegistersOutsideReset().clone(); }),
              HasSubstr("cannot clone RegistersOutsideReset: the original has parameter 'extra' "
                        "but reset() did not register it"));
  EXPECT_THAT(ErrorOf([] { SharesChild().clone(); }),
              HasSubstr("cannot clone SharesChild: reset() registered submodule 'inner' that the "
                        "original holds too"));
  EXPECT_THAT(ErrorOf([] { ChangesShape().clone(); }),
              HasSubstr("parameter 'w' is [1] float32 in the original but reset() made it [2]"));
  Module plain("Plain");
  EXPECT_THAT(ErrorOf([&] { plain.clone(); }),
              HasSubstr("Plain cannot be cloned: derive it from nn::Cloneable<Plain>"));
  // A Sequential holding an uncloneable module names it too.
  Sequential seq({std::make_shared<Module>("Plain")});
  EXPECT_THAT(ErrorOf([&] { seq.clone(); }), HasSubstr("Plain cannot be cloned"));
}

TEST_F(ModuleTest, CopyingAModuleIsShallow) {
  Linear a(2, 2);
  Linear b = a;
  EXPECT_EQ(a.weight().impl(), b.weight().impl());
  b.to(Device::Cpu(1));  // moves the shared entries: both see it, as with shared tensors
  EXPECT_EQ(a.weight().device(), Device::Cpu(1));
}

TEST_F(ModuleTest, ReplicateStructureClonesAndBindsWithoutCopying) {
  Sequential seq(Linear(3, 4), ReLU(), Linear(4, 2));
  seq.eval();
  Module::TensorBindings bindings;
  std::vector<Tensor> copies;
  for (const Tensor& t : seq.parameters()) {
    copies.push_back(t.detach().clone());
    bindings.emplace(t.impl(), copies.back());
  }
  std::shared_ptr<Module> replica = seq.replicate_structure(bindings);
  const std::vector<Tensor> bound = replica->parameters();
  ASSERT_EQ(bound.size(), copies.size());
  for (size_t i = 0; i < bound.size(); ++i) EXPECT_EQ(bound[i].impl(), copies[i].impl());
  EXPECT_FALSE(replica->is_training());
  for (Module* m : replica->modules()) EXPECT_TRUE(m->is_replica());
  for (const Module* m : static_cast<const Module&>(seq).modules()) EXPECT_FALSE(m->is_replica());
  const Tensor x = randn({2, 3});
  EXPECT_EQ(testing::MaxAbsDiff(replica->forward_tensors({x})[0], seq.forward(x)), 0.0);

  bindings.erase(seq.parameter("2.bias").impl());
  EXPECT_THAT(ErrorOf([&] { seq.replicate_structure(bindings); }),
              HasSubstr("no copy was made of parameter '2.bias'"));
}

// clone() as a shallow copy: it shares the original's registrations.
class ShallowClone : public Module {
 public:
  ShallowClone() { register_parameter("w", ones({2})); }
  std::shared_ptr<Module> clone(std::optional<Device> device) const override {
    return std::make_shared<ShallowClone>(*this);
  }
};

TEST_F(ModuleTest, ReplicateStructureRefusesACloneThatSharesTheOriginalsEntries) {
  ShallowClone module;
  const Tensor w = module.parameter("w");
  Module::TensorBindings bindings = {{w.impl(), zeros({2})}};
  EXPECT_THAT(ErrorOf([&] { module.replicate_structure(bindings); }),
              HasSubstr("shares the entry of parameter 'w' with the module"));
  EXPECT_EQ(module.parameter("w").impl(), w.impl());  // untouched
}

// The only test of this binary that calls zero_grad() on a replica (it warns once per
// process).
TEST_F(ModuleTest, ZeroGradOnAReplicaDoesNothingAndWarnsOnce) {
  Linear layer(3, 2);
  Module::TensorBindings bindings;
  for (const Tensor& p : layer.parameters()) {
    Tensor copy = p.detach().clone();
    copy.set_requires_grad(true);
    bindings.emplace(p.impl(), copy);
  }
  std::shared_ptr<Module> replica = layer.replicate_structure(bindings);
  replica->forward_tensors({randn({2, 3})})[0].sum().backward();
  const Tensor grad = replica->parameters()[0].grad();
  ASSERT_TRUE(grad.defined());
  ::testing::internal::CaptureStderr();
  replica->zero_grad();
  replica->zero_grad(/*set_to_none=*/false);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed,
            "warning: Calling .zero_grad() from a module created with nn.DataParallel() has no "
            "effect.\n");
  EXPECT_EQ(replica->parameters()[0].grad().impl(), grad.impl());
  ::testing::internal::CaptureStderr();
  layer.zero_grad();  // not a replica: no warning
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace tandem::nn
