// Tensor factories (empty, full, zeros, from_vector, from_blob, arange, ...) and random numbers
// (Generator, the default generators, rand, randn, uniform, randperm).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "tensor/base/philox.h"
#include "tensor/core/internal/tensor_impl.h"
#include "tensor/core/tensor.h"
#include "tensor/runtime/backend.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/stream.h"

namespace tandem {

// ---- Factories -------------------------------------------------------------------------

namespace {

Tensor Finish(Tensor t, const TensorOptions& options) {
  if (options.requires_grad_) t.set_requires_grad(true);
  return t;
}

}  // namespace

Tensor empty(const Shape& shape, const TensorOptions& options) {
  return Finish(
      NewTensor(shape, options.dtype_.value_or(kFloat32), options.device_, options.pinned_),
      options);
}

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  Tensor t = NewTensor(shape, options.dtype_.value_or(kFloat32), options.device_, options.pinned_);
  if (t.numel() > 0) GetBackend(t.device()).Fill(t.device().index(), ToKernel(t), value);
  return Finish(t, options);
}

Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }
Tensor zeros_like(const Tensor& like) {
  return zeros(like.shape(), TensorOptions().dtype(like.dtype()).device(like.device()));
}
Tensor ones_like(const Tensor& like) {
  return ones(like.shape(), TensorOptions().dtype(like.dtype()).device(like.device()));
}
Tensor scalar_tensor(double value, const TensorOptions& options) {
  return full({}, value, options);
}

namespace {

template <typename T>
Tensor FromHost(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == NumElements(shape),
               "from_vector: ", values.size(), " values cannot fill shape ", ShapeToString(shape),
               " (", NumElements(shape), " elements)");
  Tensor host = NewTensor(shape, DTypeOf<T>::value, Device::Cpu(0));
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  Tensor out = host.to(options.dtype_.value_or(DTypeOf<T>::value)).to(options.device_);
  if (options.pinned_) out = out.pin_memory();
  return Finish(out, options);
}

}  // namespace

Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<BFloat16>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<Half>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<uint8_t>& values, const Shape& shape,
                   const TensorOptions& options) {
  return FromHost(values, shape, options);
}
Tensor from_vector(const std::vector<bool>& values, const Shape& shape,
                   const TensorOptions& options) {
  // std::vector<bool> holds bits, not bools: unpack into a bool tensor element by element.
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == NumElements(shape),
               "from_vector: ", values.size(), " values cannot fill shape ", ShapeToString(shape),
               " (", NumElements(shape), " elements)");
  Tensor host = NewTensor(shape, kBool, Device::Cpu(0));
  bool* data = host.data<bool>();
  for (size_t i = 0; i < values.size(); ++i) data[i] = values[i];
  Tensor out = host.to(options.dtype_.value_or(kBool)).to(options.device_);
  if (options.pinned_) out = out.pin_memory();
  return Finish(out, options);
}

Tensor from_blob(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                 std::function<void(void*)> deleter, const TensorOptions& options) {
  TANDEM_CHECK(strides.size() == shape.size(), "from_blob: shape ", ShapeToString(shape), " has ",
               shape.size(), " dimensions but strides ", ShapeToString(strides), " has ",
               strides.size(), "; give one stride (in elements) per dimension");
  TANDEM_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "from_blob: tensors have at most ",
               kMaxDims, " dimensions but shape ", ShapeToString(shape), " has ", shape.size());
  int64_t extent = 1;  // elements from the first to one past the last reachable one
  for (size_t i = 0; i < shape.size(); ++i) {
    TANDEM_CHECK(shape[i] >= 0, "from_blob: sizes must be >= 0 but shape is ",
                 ShapeToString(shape));
    TANDEM_CHECK(strides[i] >= 0, "from_blob: strides must be >= 0 but are ",
                 ShapeToString(strides), "; negative strides are not supported");
    if (shape[i] > 0) extent += (shape[i] - 1) * strides[i];
  }
  const int64_t numel = NumElements(shape);
  if (numel == 0) extent = 0;
  TANDEM_CHECK(data != nullptr || numel == 0, "from_blob: data is null but shape ",
               ShapeToString(shape), " has ", numel, " elements; pass the address of the memory");
  TANDEM_CHECK(!options.pinned_, "from_blob: the memory is the caller's, so Tandem cannot pin ",
               "it; drop .pinned(true) (or copy with .pin_memory() afterwards)");
  CheckAvailable(options.device_);
  const DType dtype = options.dtype_.value_or(kFloat32);
  auto storage = std::make_shared<Storage>();
  storage->bytes = static_cast<size_t>(extent) * ElementSize(dtype);
  storage->device = options.device_;
  if (deleter) {
    // shared_ptr calls the deleter itself if making its control block fails.
    storage->data = std::shared_ptr<void>(data, std::move(deleter));
  } else {
    storage->data = std::shared_ptr<void>(data, [](void*) {});
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = dtype;
  return Finish(Tensor(std::move(impl)), options);
}

Tensor from_blob(void* data, const Shape& shape, const std::vector<int64_t>& strides,
                 const TensorOptions& options) {
  return from_blob(data, shape, strides, nullptr, options);
}

Tensor alias_on_cpu_device(const Tensor& tensor, Device device) {
  TANDEM_CHECK(tensor.defined(), "alias_on_cpu_device: expected a defined tensor");
  TANDEM_CHECK(tensor.device().is_cpu() && device.is_cpu(),
               "alias_on_cpu_device: only logical CPU devices share memory, but the tensor is on ",
               tensor.device(), " and the target is ", device, "; use to(device) to copy");
  const TensorImpl& source = *tensor.impl();
  auto storage = std::make_shared<Storage>(*source.storage);
  storage->device = device;
  storage->copy_on_write = true;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = source.offset;
  impl->shape = source.shape;
  impl->strides = source.strides;
  impl->dtype = source.dtype;
  return Tensor(std::move(impl));
}

void commit_alias_writes(const Tensor& original, const Tensor& alias) {
  TANDEM_CHECK(original.defined() && alias.defined(),
               "commit_alias_writes: expected two defined tensors");
  Storage& mine = *alias.impl()->storage;
  Storage& theirs = *original.impl()->storage;
  if (mine.copy_on_write || mine.data == theirs.data) return;  // never written
  TANDEM_CHECK(mine.bytes == theirs.bytes && original.storage_offset() == alias.storage_offset() &&
                   original.shape() == alias.shape() && original.dtype() == alias.dtype(),
               "commit_alias_writes: the alias was not made by alias_on_cpu_device(original, ...)");
  theirs.data = mine.data;
}

Tensor from_blob(void* data, const Shape& shape, std::function<void(void*)> deleter,
                 const TensorOptions& options) {
  return from_blob(data, shape, ContiguousStrides(shape), std::move(deleter), options);
}

Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options) {
  return from_blob(data, shape, ContiguousStrides(shape), nullptr, options);
}

Tensor arange(int64_t n, const TensorOptions& options) {
  TANDEM_CHECK(n >= 0, "arange: n must be >= 0 but is ", n);
  std::vector<int64_t> values(n);
  std::iota(values.begin(), values.end(), int64_t{0});
  if (options.device_.is_cpu() || options.pinned_ || n == 0) {
    return from_vector(values, {n}, options);
  }
  // For another device, staged in pinned memory: the copy is queued without the host waiting
  // for it, where a pageable one waits (GPT's forward makes its positions in every step).
  const Tensor staged = from_vector(values, {n}).pin_memory();
  return Finish(staged.to(options.device_).to(options.dtype_.value_or(kInt64)), options);
}

// ---- Random numbers --------------------------------------------------------------------

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = base_offset_;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

GeneratorState Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return GeneratorState{seed_, offset_};
}

void Generator::set_state(const GeneratorState& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = state.seed;
  offset_ = state.offset;
}

uint64_t Generator::Reserve(uint64_t n) { return Claim(n).offset; }

GeneratorState Generator::Claim(uint64_t n) {
  const char* forbidden = internal::RandomDrawsForbidden();
  TANDEM_CHECK(forbidden == nullptr, "a random draw of ", n, " numbers (dropout, rand, ...) ",
               forbidden);
  GeneratorState claimed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    claimed = GeneratorState{seed_, offset_};
    // Whole Philox blocks per request, so that requests never share a block.
    offset_ += (n + 3) / 4 * 4;
  }
  GeneratorRecorder::Note(this, claimed);
  return claimed;
}

namespace {
thread_local GeneratorRecorder* t_generator_recorder = nullptr;
}  // namespace

GeneratorRecorder::GeneratorRecorder() : previous_(t_generator_recorder) {
  t_generator_recorder = this;
}

GeneratorRecorder::~GeneratorRecorder() { t_generator_recorder = previous_; }

void GeneratorRecorder::Note(Generator* generator, const GeneratorState& before) {
  for (GeneratorRecorder* r = t_generator_recorder; r != nullptr; r = r->previous_) {
    const bool seen = std::any_of(r->uses_.begin(), r->uses_.end(),
                                  [&](const auto& use) { return use.first == generator; });
    if (!seen) r->uses_.emplace_back(generator, before);
  }
}

uint64_t DeviceOffsetBase(int device_index) {
  TANDEM_CHECK(device_index >= 0 &&
                   static_cast<uint64_t>(device_index) < (uint64_t{1} << (64 - kDeviceOffsetShift)),
               "random numbers: expected a device index in [0, 2^", 64 - kDeviceOffsetShift,
               ") but got ", device_index, "; use a device such as cpu:0 or cuda:1");
  return static_cast<uint64_t>(device_index) << kDeviceOffsetShift;
}

// Generators are owned by `owned` (under `mutex`); the first kFastSlots indices of each
// device type are also cached in `fast`, read without a lock. A generator, once made, lives
// as long as the set, so cached pointers never dangle.
struct DeviceGenerators::Impl {
  static constexpr int kFastSlots = 64;

  mutable std::mutex mutex;
  uint64_t seed;
  std::map<Device, std::unique_ptr<Generator>> owned;
  std::atomic<Generator*> fast[kNumDeviceTypes][kFastSlots] = {};

  std::atomic<Generator*>* FastSlot(Device device) {
    const int type = static_cast<int>(device.type());
    if (type < 0 || type >= kNumDeviceTypes || device.index() < 0 || device.index() >= kFastSlots) {
      return nullptr;
    }
    return &fast[type][device.index()];
  }
};

DeviceGenerators::DeviceGenerators(uint64_t seed) : impl_(std::make_unique<Impl>()) {
  impl_->seed = seed;
}

DeviceGenerators::~DeviceGenerators() = default;

Generator& DeviceGenerators::get(Device device) {
  std::atomic<Generator*>* slot = impl_->FastSlot(device);
  if (slot != nullptr) {
    if (Generator* cached = slot->load(std::memory_order_acquire)) return *cached;
  }
  const uint64_t base = DeviceOffsetBase(device.index());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::unique_ptr<Generator>& generator = impl_->owned[device];
  if (generator == nullptr) generator = std::make_unique<Generator>(impl_->seed, base);
  if (slot != nullptr) slot->store(generator.get(), std::memory_order_release);
  return *generator;
}

void DeviceGenerators::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->seed = seed;
  for (auto& [device, generator] : impl_->owned) generator->manual_seed(seed);
}

uint64_t DeviceGenerators::seed() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->seed;
}

namespace {

DeviceGenerators& DefaultGenerators() {
  static DeviceGenerators* generators = new DeviceGenerators(0);  // never destroyed
  return *generators;
}

}  // namespace

Generator& default_generator(Device device) { return DefaultGenerators().get(device); }

Generator& default_generator() { return default_generator(Device::Cpu(0)); }

void manual_seed(uint64_t seed) { DefaultGenerators().manual_seed(seed); }

namespace {

Tensor RandomTensor(const Shape& shape, const TensorOptions& options, Generator* gen, bool normal,
                    double a, double b) {
  const DType dtype = options.dtype_.value_or(kFloat32);
  TANDEM_CHECK(IsFloatingPoint(dtype),
               "random tensors are floating-point (float32, float64, bfloat16 or float16); ",
               "got dtype ", dtype, ": draw floats and convert with .to(", dtype, ")");
  Tensor t = NewTensor(shape, dtype, options.device_, options.pinned_);
  Generator& g = gen != nullptr ? *gen : default_generator(t.device());
  const GeneratorState claimed = g.Claim(static_cast<uint64_t>(t.numel()));
  if (t.numel() > 0) {
    Backend& backend = GetBackend(t.device());
    const int index = t.device().index();
    if (normal) {
      backend.RandomNormal(index, dtype, t.raw_data(), t.numel(), claimed.seed, claimed.offset, a,
                           b);
    } else {
      backend.RandomUniform(index, dtype, t.raw_data(), t.numel(), claimed.seed, claimed.offset, a,
                            b);
    }
  }
  return Finish(t, options);
}

}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& options, Generator* gen) {
  return RandomTensor(shape, options, gen, /*normal=*/false, 0.0, 1.0);
}

Tensor randn(const Shape& shape, const TensorOptions& options, Generator* gen) {
  return RandomTensor(shape, options, gen, /*normal=*/true, 0.0, 1.0);
}

Tensor uniform(const Shape& shape, double low, double high, const TensorOptions& options,
               Generator* gen) {
  TANDEM_CHECK(low <= high, "uniform: low (", low, ") must not exceed high (", high, ")");
  return RandomTensor(shape, options, gen, /*normal=*/false, low, high);
}

Tensor randperm(int64_t n, Generator* gen) {
  TANDEM_CHECK(n >= 0, "randperm: n must be >= 0 but is ", n);
  Generator& g = gen != nullptr ? *gen : default_generator(Device::Cpu(0));
  const GeneratorState claimed = g.Claim(static_cast<uint64_t>(n));
  const uint64_t offset = claimed.offset;
  const uint64_t key = claimed.seed ^ 0x5851F42D4C957F2Dull;  // a stream of its own
  std::vector<int64_t> values(n);
  std::iota(values.begin(), values.end(), int64_t{0});
  // Fisher-Yates with 64 random bits per swap: the modulo bias is below 2^-40 for any n
  // that fits in memory.
  for (int64_t i = n - 1; i > 0; --i) {
    const philox::Block block = philox::Generate(key, offset + static_cast<uint64_t>(i));
    const uint64_t bits = (static_cast<uint64_t>(block.x[0]) << 32) | block.x[1];
    std::swap(values[i], values[bits % static_cast<uint64_t>(i + 1)]);
  }
  return from_vector(values, {n}, TensorOptions().dtype(kInt64));
}

}  // namespace tandem
