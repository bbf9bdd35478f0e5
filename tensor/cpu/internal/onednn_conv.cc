#include "tensor/cpu/internal/onednn_conv.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/cpu/internal/onednn_common.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// A call's images are cut into blocks of at least this many images, at most kMaxBlocks of
// them: enough blocks for a device's pool, each large enough that oneDNN's per-call costs
// (reorders of the block to oneDNN's blocked layouts, argument checks) stay small.
constexpr int64_t kMinImagesPerBlock = 8;
constexpr int64_t kMaxBlocks = 16;

bool SupportedDType(DType dtype) { return dtype == DType::kFloat32 || dtype == DType::kBFloat16; }

memory::data_type DnnlType(DType dtype) {
  return dtype == DType::kBFloat16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// Everything a primitive depends on: pass, dtype, has_bias, then the geometry (block images).
using Key = std::array<int64_t, 17>;

Key MakeKey(OneDnnConvPass pass, DType dtype, const Conv2dGeometry& g, int64_t images,
            int64_t out_channels, bool has_bias) {
  return Key{static_cast<int64_t>(pass),
             static_cast<int64_t>(dtype),
             has_bias,
             images,
             g.channels,
             g.height,
             g.width,
             out_channels,
             g.kernel_h,
             g.kernel_w,
             g.stride_h,
             g.stride_w,
             g.pad_h,
             g.pad_w,
             g.dilation_h,
             g.dilation_w,
             g.ceil_mode};
}

// A reorder between the caller's plain layout and the one the primitive chose, when they
// differ.
struct Reorder {
  bool needed = false;
  dnnl::reorder primitive;
  memory::desc from, to;
};

Reorder MakeReorder(const memory::desc& from, const memory::desc& to) {
  Reorder r;
  r.from = from;
  r.to = to;
  if (from == to) return r;
  r.needed = true;
  r.primitive =
      dnnl::reorder(dnnl::reorder::primitive_desc(OneDnnEngine(), from, OneDnnEngine(), to));
  return r;
}

// One pass for one block size, immutable once made (threads share it without locks).
// "image" is x (forward, weight gradient) or its gradient (data gradient), "out" is y or its
// gradient, "weights" w or its gradient (float32 partial sums for the weight gradient).
struct ConvPrimitive {
  bool supported = false;
  std::string implementation;
  dnnl::primitive conv;
  memory::desc image_user, out_user, weights_user, bias;
  memory::desc image, out, weights, scratchpad;
  // Into the primitive's layouts (inputs) or out of them (outputs), by pass:
  //   forward: image in, weights in, out out; data: out in, weights in, image out;
  //   weights: image in, out in, weights out (to plain float32).
  Reorder image_reorder, out_reorder, weights_reorder;
};

memory::dims Dims(std::initializer_list<int64_t> values) { return memory::dims(values); }

std::shared_ptr<const ConvPrimitive> Create(const Key& key) {
  auto result = std::make_shared<ConvPrimitive>();
  const auto pass = static_cast<OneDnnConvPass>(key[0]);
  const DType dtype = static_cast<DType>(key[1]);
  const bool has_bias = key[2] != 0;
  const int64_t n = key[3], c = key[4], h = key[5], w = key[6], o = key[7];
  Conv2dGeometry g =
      Conv2dGeometry::Make(n, c, h, w, key[8], key[9], key[10], key[11], key[12], key[13]);
  g.dilation_h = key[14];
  g.dilation_w = key[15];
  const int64_t oh = g.out_h(), ow = g.out_w();
  // oneDNN's right padding is what makes its floor division give PyTorch's output size.
  const int64_t pad_bottom = (oh - 1) * g.stride_h + g.span_h() - h - g.pad_h;
  const int64_t pad_right = (ow - 1) * g.stride_w + g.span_w() - w - g.pad_w;
  if (pad_bottom < 0 || pad_right < 0) return result;
  const memory::data_type type = DnnlType(dtype);
  const memory::data_type f32 = memory::data_type::f32;
  result->image_user = memory::desc(Dims({n, c, h, w}), type, Tag::nchw);
  result->out_user = memory::desc(Dims({n, o, oh, ow}), type, Tag::nchw);
  const memory::desc image_any(Dims({n, c, h, w}), type, Tag::any);
  const memory::desc out_any(Dims({n, o, oh, ow}), type, Tag::any);
  const memory::dims strides = Dims({g.stride_h, g.stride_w});
  const memory::dims dilates = Dims({g.dilation_h - 1, g.dilation_w - 1});
  const memory::dims pad_l = Dims({g.pad_h, g.pad_w});
  const memory::dims pad_r = Dims({pad_bottom, pad_right});
  dnnl::primitive_attr attr;
  // Our scratchpad (thread-local), so that concurrent calls of one primitive never share one.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    OneThreadOpenMp one_thread;
    const dnnl::engine& engine = OneDnnEngine();
    const memory::desc weights_any(Dims({o, c, g.kernel_h, g.kernel_w}), type, Tag::any);
    const memory::desc bias_desc =
        has_bias
            ? memory::desc(Dims({o}), pass == OneDnnConvPass::kBackwardWeights ? f32 : type, Tag::x)
            : memory::desc();
    dnnl::convolution_forward::primitive_desc forward(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, image_any, weights_any,
                                        bias_desc, out_any, strides, dilates, pad_l, pad_r),
        attr, engine);
    result->bias = bias_desc;
    switch (pass) {
      case OneDnnConvPass::kForward: {
        result->implementation = forward.impl_info_str();
        result->image = forward.src_desc();
        result->weights = forward.weights_desc();
        result->out = forward.dst_desc();
        result->scratchpad = forward.scratchpad_desc();
        result->conv = dnnl::convolution_forward(forward);
        result->weights_user = memory::desc(Dims({o, c, g.kernel_h, g.kernel_w}), type, Tag::oihw);
        result->image_reorder = MakeReorder(result->image_user, result->image);
        result->weights_reorder = MakeReorder(result->weights_user, result->weights);
        result->out_reorder = MakeReorder(result->out, result->out_user);
        break;
      }
      case OneDnnConvPass::kBackwardData: {
        dnnl::convolution_backward_data::primitive_desc data(
            dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, image_any,
                                                  weights_any, out_any, strides, dilates, pad_l,
                                                  pad_r),
            attr, engine, forward);
        result->implementation = data.impl_info_str();
        result->image = data.diff_src_desc();
        result->weights = data.weights_desc();
        result->out = data.diff_dst_desc();
        result->scratchpad = data.scratchpad_desc();
        result->conv = dnnl::convolution_backward_data(data);
        result->weights_user = memory::desc(Dims({o, c, g.kernel_h, g.kernel_w}), type, Tag::oihw);
        result->out_reorder = MakeReorder(result->out_user, result->out);
        result->weights_reorder = MakeReorder(result->weights_user, result->weights);
        result->image_reorder = MakeReorder(result->image, result->image_user);
        break;
      }
      case OneDnnConvPass::kBackwardWeights: {
        // Float32 weight (and bias) gradients: each block's partial sum stays in float until
        // the blocks are added, so the result is rounded to bfloat16 once.
        const memory::desc diff_weights_any(Dims({o, c, g.kernel_h, g.kernel_w}), f32, Tag::any);
        dnnl::convolution_backward_weights::primitive_desc weights(
            dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, image_any,
                                                     diff_weights_any, bias_desc, out_any, strides,
                                                     dilates, pad_l, pad_r),
            attr, engine, forward);
        result->implementation = weights.impl_info_str();
        result->image = weights.src_desc();
        result->weights = weights.diff_weights_desc();
        result->out = weights.diff_dst_desc();
        result->scratchpad = weights.scratchpad_desc();
        result->conv = dnnl::convolution_backward_weights(weights);
        result->weights_user = memory::desc(Dims({o, c, g.kernel_h, g.kernel_w}), f32, Tag::oihw);
        result->image_reorder = MakeReorder(result->image_user, result->image);
        result->out_reorder = MakeReorder(result->out_user, result->out);
        result->weights_reorder = MakeReorder(result->weights, result->weights_user);
        break;
      }
    }
    // The reference kernels are scalar loops, far slower than im2col + GEMM.
    if (result->implementation.rfind("ref", 0) == 0) return result;
    result->supported = true;
  } catch (const dnnl::error&) {
    result->supported = false;  // no implementation for this dtype, CPU or geometry
  }
  return result;
}

// Primitives by key, made on first use (creating one JIT-compiles its kernel). Dropped when
// large, as the GEMM's cache is.
std::shared_ptr<const ConvPrimitive> Lookup(const Key& key) {
  static std::mutex mutex;
  static auto* cache = new std::map<Key, std::shared_ptr<const ConvPrimitive>>();
  constexpr size_t kMaxEntries = 1024;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  std::shared_ptr<const ConvPrimitive> made;
  {
    // Not under the map's lock (creation is slow), but one creation at a time.
    std::lock_guard<std::mutex> creating(OneDnnCreationMutex());
    made = Create(key);
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (cache->size() >= kMaxEntries) cache->clear();
  return cache->emplace(key, std::move(made)).first->second;
}

// 64-byte aligned bytes that grow as needed; one set per thread for the blocks' reorders.
class Buffer {
 public:
  void* Get(size_t bytes) {
    constexpr size_t kAlign = 64;
    if (bytes_.size() < bytes + kAlign) bytes_.resize(bytes + kAlign);
    return bytes_.data() + (kAlign - reinterpret_cast<uintptr_t>(bytes_.data()) % kAlign) % kAlign;
  }

 private:
  std::vector<uint8_t> bytes_;
};

struct ThreadBuffers {
  Buffer image, out, weights, scratch;
};

ThreadBuffers& Buffers() {
  thread_local ThreadBuffers buffers;
  return buffers;
}

dnnl::stream& Stream() {
  thread_local std::unique_ptr<dnnl::stream> stream;
  if (!stream) stream = std::make_unique<dnnl::stream>(OneDnnEngine());
  return *stream;
}

// Runs `reorder` from `from` into `to` on the calling thread.
void RunReorder(const Reorder& reorder, const void* from, void* to) {
  const dnnl::engine& engine = OneDnnEngine();
  memory from_memory(reorder.from, engine, const_cast<void*>(from));
  memory to_memory(reorder.to, engine, to);
  reorder.primitive.execute(Stream(), from_memory, to_memory);
}

// `user` as the primitive reads it: the user's data itself, or its reorder into `buffer`.
const void* Input(const Reorder& reorder, const void* user, Buffer& buffer) {
  if (!reorder.needed) return user;
  void* converted = buffer.Get(reorder.to.get_size());
  RunReorder(reorder, user, converted);
  return converted;
}

// Where the primitive writes an output the user wants at `user`.
void* Output(const Reorder& reorder, void* user, Buffer& buffer) {
  return reorder.needed ? buffer.Get(reorder.from.get_size()) : user;
}

void Finish(const Reorder& reorder, const void* written, void* user) {
  if (reorder.needed) RunReorder(reorder, written, user);
}

// The blocks of a call: [Start(b), Start(b + 1)) images, block sizes `small` or `small + 1`.
struct Blocks {
  int64_t count = 1, small = 0, batch = 0;
  int64_t Start(int64_t b) const { return batch * b / count; }
};

Blocks SplitBatch(int64_t batch) {
  Blocks blocks;
  blocks.batch = batch;
  while (batch / (blocks.count * 2) >= kMinImagesPerBlock && blocks.count * 2 <= kMaxBlocks) {
    blocks.count *= 2;
  }
  blocks.small = batch / blocks.count;
  return blocks;
}

// The primitives for both block sizes of a call, or false where oneDNN has none for either.
bool Prepare(OneDnnConvPass pass, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
             bool has_bias, const Blocks& blocks, std::shared_ptr<const ConvPrimitive> (&out)[2]) {
  if (!SupportedDType(dtype) || g.ceil_mode || g.batch <= 0 || out_channels <= 0 ||
      g.channels <= 0 || g.out_h() <= 0 || g.out_w() <= 0) {
    return false;
  }
  for (int64_t i = 0; i < (g.batch % blocks.count == 0 ? 1 : 2); ++i) {
    out[i] = Lookup(MakeKey(pass, dtype, g, blocks.small + i, out_channels, has_bias));
    if (!out[i]->supported) return false;
  }
  return true;
}

void Execute(const ConvPrimitive& p, std::unordered_map<int, memory>&& args) {
  try {
    OneThreadOpenMp one_thread;
    ThreadBuffers& buffers = Buffers();
    args.insert({DNNL_ARG_SCRATCHPAD, memory(p.scratchpad, OneDnnEngine(),
                                             buffers.scratch.Get(p.scratchpad.get_size()))});
    p.conv.execute(Stream(), args);
    Stream().wait();
  } catch (const dnnl::error& e) {
    TANDEM_FAIL("CPU conv2d: oneDNN's ", p.implementation, " convolution failed to run: ", e.what(),
                "; this is a bug in Tandem or oneDNN: please report it with the shape");
  }
}

// The weights in each block size's layout, reordered once per call on the calling thread.
struct PreparedWeights {
  const void* data[2] = {nullptr, nullptr};
  std::vector<uint8_t> storage[2];
};

void PrepareWeights(const std::shared_ptr<const ConvPrimitive> (&p)[2], const void* weight,
                    PreparedWeights* prepared) {
  for (int i = 0; i < 2; ++i) {
    if (!p[i]) continue;
    if (!p[i]->weights_reorder.needed) {
      prepared->data[i] = weight;
      continue;
    }
    // Reorders write whole cache lines; vectors of bytes are 16-byte aligned, so over-allocate.
    std::vector<uint8_t>& bytes = prepared->storage[i];
    bytes.resize(p[i]->weights.get_size() + 64);
    void* aligned = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    OneThreadOpenMp one_thread;
    RunReorder(p[i]->weights_reorder, weight, aligned);
    prepared->data[i] = aligned;
  }
}

std::atomic<OneDnnConvFloat32Policy> float32_policy{OneDnnConvFloat32Policy::kMeasured};

}  // namespace

bool OneDnnConv2dForward(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                         const void* input, const void* weight, const void* bias, void* output) {
  const Blocks blocks = SplitBatch(g.batch);
  std::shared_ptr<const ConvPrimitive> p[2];
  if (!Prepare(OneDnnConvPass::kForward, dtype, g, out_channels, bias != nullptr, blocks, p)) {
    return false;
  }
  PreparedWeights weights;
  PrepareWeights(p, weight, &weights);
  const size_t element = ElementSize(dtype);
  const int64_t image_size = g.channels * g.height * g.width;
  const int64_t out_size = out_channels * g.out_h() * g.out_w();
  ParallelFor(Device::Cpu(index), blocks.count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t lo = blocks.Start(b), hi = blocks.Start(b + 1);
      const int variant = static_cast<int>(hi - lo - blocks.small);
      const ConvPrimitive& prim = *p[variant];
      ThreadBuffers& buffers = Buffers();
      const dnnl::engine& engine = OneDnnEngine();
      OneThreadOpenMp one_thread;
      const void* x =
          Input(prim.image_reorder, static_cast<const char*>(input) + lo * image_size * element,
                buffers.image);
      void* user_y = static_cast<char*>(output) + lo * out_size * element;
      void* y = Output(prim.out_reorder, user_y, buffers.out);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, memory(prim.image, engine, const_cast<void*>(x))},
          {DNNL_ARG_WEIGHTS,
           memory(prim.weights, engine, const_cast<void*>(weights.data[variant]))},
          {DNNL_ARG_DST, memory(prim.out, engine, y)}};
      if (bias != nullptr) {
        args.insert({DNNL_ARG_BIAS, memory(prim.bias, engine, const_cast<void*>(bias))});
      }
      Execute(prim, std::move(args));
      Finish(prim.out_reorder, y, user_y);
    }
  });
  return true;
}

bool OneDnnConv2dBackwardData(int index, DType dtype, const Conv2dGeometry& g, int64_t out_channels,
                              const void* grad_output, const void* weight, void* grad_input) {
  const Blocks blocks = SplitBatch(g.batch);
  std::shared_ptr<const ConvPrimitive> p[2];
  if (!Prepare(OneDnnConvPass::kBackwardData, dtype, g, out_channels, false, blocks, p)) {
    return false;
  }
  PreparedWeights weights;
  PrepareWeights(p, weight, &weights);
  const size_t element = ElementSize(dtype);
  const int64_t image_size = g.channels * g.height * g.width;
  const int64_t out_size = out_channels * g.out_h() * g.out_w();
  ParallelFor(Device::Cpu(index), blocks.count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t lo = blocks.Start(b), hi = blocks.Start(b + 1);
      const int variant = static_cast<int>(hi - lo - blocks.small);
      const ConvPrimitive& prim = *p[variant];
      ThreadBuffers& buffers = Buffers();
      const dnnl::engine& engine = OneDnnEngine();
      OneThreadOpenMp one_thread;
      const void* dy =
          Input(prim.out_reorder, static_cast<const char*>(grad_output) + lo * out_size * element,
                buffers.out);
      void* user_dx = static_cast<char*>(grad_input) + lo * image_size * element;
      void* dx = Output(prim.image_reorder, user_dx, buffers.image);
      Execute(prim, {{DNNL_ARG_DIFF_DST, memory(prim.out, engine, const_cast<void*>(dy))},
                     {DNNL_ARG_WEIGHTS,
                      memory(prim.weights, engine, const_cast<void*>(weights.data[variant]))},
                     {DNNL_ARG_DIFF_SRC, memory(prim.image, engine, dx)}});
      Finish(prim.image_reorder, dx, user_dx);
    }
  });
  return true;
}

bool OneDnnConv2dBackwardWeights(int index, DType dtype, const Conv2dGeometry& g,
                                 int64_t out_channels, const void* input, const void* grad_output,
                                 void* grad_weight, void* grad_bias) {
  const Blocks blocks = SplitBatch(g.batch);
  std::shared_ptr<const ConvPrimitive> p[2];
  const bool has_bias = grad_bias != nullptr;
  if (!Prepare(OneDnnConvPass::kBackwardWeights, dtype, g, out_channels, has_bias, blocks, p)) {
    return false;
  }
  const size_t element = ElementSize(dtype);
  const int64_t image_size = g.channels * g.height * g.width;
  const int64_t out_size = out_channels * g.out_h() * g.out_w();
  const int64_t weight_count = out_channels * g.channels * g.kernel_h * g.kernel_w;
  // Each block's float partial sums (plain [O, C, kh, kw], then [O] for the bias), added in
  // block order below whatever thread computed them.
  const int64_t slot = weight_count + (has_bias ? out_channels : 0);
  std::vector<float> partials(static_cast<size_t>(slot * blocks.count));
  ParallelFor(Device::Cpu(index), blocks.count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t lo = blocks.Start(b), hi = blocks.Start(b + 1);
      const int variant = static_cast<int>(hi - lo - blocks.small);
      const ConvPrimitive& prim = *p[variant];
      ThreadBuffers& buffers = Buffers();
      const dnnl::engine& engine = OneDnnEngine();
      OneThreadOpenMp one_thread;
      const void* x =
          Input(prim.image_reorder, static_cast<const char*>(input) + lo * image_size * element,
                buffers.image);
      const void* dy =
          Input(prim.out_reorder, static_cast<const char*>(grad_output) + lo * out_size * element,
                buffers.out);
      float* user_dw = partials.data() + b * slot;
      void* dw = Output(prim.weights_reorder, user_dw, buffers.weights);
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, memory(prim.image, engine, const_cast<void*>(x))},
          {DNNL_ARG_DIFF_DST, memory(prim.out, engine, const_cast<void*>(dy))},
          {DNNL_ARG_DIFF_WEIGHTS, memory(prim.weights, engine, dw)}};
      if (has_bias) {
        args.insert({DNNL_ARG_DIFF_BIAS, memory(prim.bias, engine, user_dw + weight_count)});
      }
      Execute(prim, std::move(args));
      Finish(prim.weights_reorder, dw, user_dw);
    }
  });
  float* sum = partials.data();
  for (int64_t b = 1; b < blocks.count; ++b) {
    const float* partial = partials.data() + b * slot;
    for (int64_t i = 0; i < slot; ++i) sum[i] += partial[i];
  }
  if (dtype == DType::kBFloat16) {
    auto* dw = static_cast<BFloat16*>(grad_weight);
    for (int64_t i = 0; i < weight_count; ++i) dw[i] = BFloat16(sum[i]);
    if (has_bias) {
      auto* db = static_cast<BFloat16*>(grad_bias);
      for (int64_t i = 0; i < out_channels; ++i) db[i] = BFloat16(sum[weight_count + i]);
    }
  } else {
    std::memcpy(grad_weight, sum, weight_count * sizeof(float));
    if (has_bias) std::memcpy(grad_bias, sum + weight_count, out_channels * sizeof(float));
  }
  return true;
}

std::string OneDnnConv2dImplementation(OneDnnConvPass pass, DType dtype, const Conv2dGeometry& g,
                                       int64_t out_channels, bool has_bias) {
  const Blocks blocks = SplitBatch(g.batch);
  std::shared_ptr<const ConvPrimitive> p[2];
  if (!Prepare(pass, dtype, g, out_channels, has_bias, blocks, p)) return "";
  return p[0]->implementation;
}

void SetOneDnnConvFloat32Policy(OneDnnConvFloat32Policy policy) { float32_policy.store(policy); }

bool OneDnnConvPreferredForFloat32(const Conv2dGeometry& /*g*/, int64_t /*out_channels*/) {
  // float32 keeps im2col + GEMM: its wide products already go to oneDNN's matmul, and oneDNN's
  // own convolution did not make the CNN's float32 training step (train_step --model=cnn)
  // faster. kAlways (SetOneDnnConvFloat32Policy) turns it on to re-measure.
  switch (float32_policy.load(std::memory_order_relaxed)) {
    case OneDnnConvFloat32Policy::kAlways:
      return true;
    case OneDnnConvFloat32Policy::kNever:
    case OneDnnConvFloat32Policy::kMeasured:
      break;
  }
  return false;
}

}  // namespace tandem
