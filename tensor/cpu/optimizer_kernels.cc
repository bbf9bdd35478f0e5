// The CPU's fused optimizer kernels (tensor/kernels/optimizer_kernels.h): one pass over each
// tensor, the element functions of optimizer_math.h in a loop compiled per combination of
// flags for this CPU's vector unit, the tensors' elements split in pieces over the logical CPU
// devices' workers (they share host memory) or, with one, over its threads.
#include "tensor/kernels/optimizer_kernels.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/base/dtype.h"
#include "tensor/base/error.h"
#include "tensor/base/half.h"
#include "tensor/kernels/internal/optimizer_math.h"
#include "tensor/kernels/vectorized.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/run_across_devices.h"
#include "tensor/runtime/threads.h"

namespace tandem {
namespace {

// About 64 KiB of floats: enough work per piece to be worth a thread's wake-up, small enough
// to balance a model's few large weights over the threads.
constexpr int64_t kUpdatePieceElements = int64_t{1} << 14;

// Calls update(item, begin, end) over [0, tensors[item].numel) for every item, in pieces of at
// most kUpdatePieceElements, spread over the workers of the logical CPU devices
// (CpuWorkDevices: every configured one unless narrowed) or, with one, over its threads. The
// pieces are disjoint, and each element's arithmetic does not depend on the split, so the
// result is the same bit for bit however the pieces fall.
template <typename Tensor, typename F>
void RunUpdatePieces(const std::vector<Tensor>& tensors, F&& update) {
  struct Piece {
    size_t item;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  for (size_t item = 0; item < tensors.size(); ++item) {
    const int64_t n = tensors[item].numel;
    for (int64_t begin = 0; begin < n; begin += kUpdatePieceElements) {
      pieces.push_back({item, begin, std::min(n, begin + kUpdatePieceElements)});
    }
  }
  const auto run = [&](int64_t k) {
    const Piece& piece = pieces[static_cast<size_t>(k)];
    update(piece.item, piece.begin, piece.end);
  };
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (n <= 1) {
    for (int64_t k = 0; k < n; ++k) run(k);
    return;
  }
  const std::vector<Device> devices = CpuWorkDevices();
  if (devices.size() > 1) {
    RunAcrossDevices(devices, static_cast<int>(n), [&](int k) { run(k); });
  } else {
    ParallelFor(devices[0], n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) run(k);
    });
  }
}

void CheckIndex(const char* kernel, int index) {
  TANDEM_CHECK(index >= 0, "CPU ", kernel, ": device index must be >= 0 but got ", index);
}

// The loops over [begin, end) of one tensor, compiled for each combination of flags (so that
// they vectorise) and for this CPU's vector unit (tensor/kernels/vectorized.h). The pointers
// are __restrict here, in the loop's own scope: GCC does not carry the element functions'
// qualifiers into the loop after inlining them, and would keep it scalar.

// ---- SGD -----------------------------------------------------------------------------------

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
TANDEM_VECTORIZE void SgdLoop(const SgdScalars<OpMath<T>>& u, const FusedSgdTensor& t,
                              int64_t begin, int64_t end) {
  T* __restrict p = static_cast<T*>(t.param);
  const T* __restrict g = static_cast<const T*>(t.grad);
  T* __restrict b = static_cast<T*>(t.momentum_buffer);
  for (int64_t j = begin; j < end; ++j) {
    SgdElement<kDecay, kMomentum, kNesterov, kFirst>(u, p, g, b, j);
  }
}

// SgdLoop for this CPU's vector unit. Vectorized is inside each entry of the table: it inlines
// what its callable calls, which a call through a pointer is not.
template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst, typename T>
void SgdRun(const SgdScalars<OpMath<T>>& u, const FusedSgdTensor& t, int64_t begin, int64_t end) {
  vec::Vectorized([&] { SgdLoop<kDecay, kMomentum, kNesterov, kFirst, T>(u, t, begin, end); });
}

template <typename T>
using SgdLoopFn = void (*)(const SgdScalars<OpMath<T>>&, const FusedSgdTensor&, int64_t, int64_t);

// Nesterov and the first step mean something only with momentum.
template <typename T>
SgdLoopFn<T> PickSgdLoop(const FusedSgdOptions& o) {
  static constexpr SgdLoopFn<T> kLoops[16] = {
      SgdRun<false, false, false, false, T>, SgdRun<false, false, false, true, T>,
      SgdRun<false, false, true, false, T>,  SgdRun<false, false, true, true, T>,
      SgdRun<false, true, false, false, T>,  SgdRun<false, true, false, true, T>,
      SgdRun<false, true, true, false, T>,   SgdRun<false, true, true, true, T>,
      SgdRun<true, false, false, false, T>,  SgdRun<true, false, false, true, T>,
      SgdRun<true, false, true, false, T>,   SgdRun<true, false, true, true, T>,
      SgdRun<true, true, false, false, T>,   SgdRun<true, true, false, true, T>,
      SgdRun<true, true, true, false, T>,    SgdRun<true, true, true, true, T>,
  };
  const bool momentum = o.momentum != 0.0;
  return kLoops[(o.weight_decay != 0.0) * 8 + momentum * 4 + (momentum && o.nesterov) * 2 +
                (momentum && o.first_step)];
}

void CpuFusedSgd(int index, DType dtype, const FusedSgdOptions& options,
                 const std::vector<FusedSgdTensor>& tensors) {
  CheckIndex("FusedSgdKernel", index);
  DispatchAllFloatingTypes(dtype, "CPU FusedSgdKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The 16-bit floats compute in float and round each stored value (optimizer_math.h).
    const SgdScalars<OpMath<T>> u(options);
    const SgdLoopFn<T> loop = PickSgdLoop<T>(options);
    RunUpdatePieces(tensors,
                    [&](size_t k, int64_t begin, int64_t end) { loop(u, tensors[k], begin, end); });
  });
}

// ---- Adam and AdamW ------------------------------------------------------------------------

template <bool kL2, bool kAmsgrad, typename T>
TANDEM_VECTORIZE void AdamLoop(const AdamScalars<OpMath<T>>& u, const FusedAdamTensor& t,
                               int64_t begin, int64_t end) {
  T* __restrict p = static_cast<T*>(t.param);
  const T* __restrict g = static_cast<const T*>(t.grad);
  T* __restrict m = static_cast<T*>(t.exp_avg);
  T* __restrict v = static_cast<T*>(t.exp_avg_sq);
  T* __restrict vmax = static_cast<T*>(t.max_exp_avg_sq);
  for (int64_t j = begin; j < end; ++j) AdamElement<kL2, kAmsgrad>(u, p, g, m, v, vmax, j);
}

void CpuFusedAdam(int index, DType dtype, const FusedAdamOptions& options,
                  const std::vector<FusedAdamTensor>& tensors) {
  CheckIndex("FusedAdamKernel", index);
  DispatchAllFloatingTypes(dtype, "CPU FusedAdamKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<AdamScalars<OpMath<T>>> scalars;
    scalars.reserve(tensors.size());
    for (const FusedAdamTensor& t : tensors) scalars.emplace_back(options, t.step);
    const bool l2 = !options.decoupled_weight_decay, amsgrad = options.amsgrad;
    RunUpdatePieces(tensors, [&](size_t k, int64_t begin, int64_t end) {
      const AdamScalars<OpMath<T>>& u = scalars[k];
      const FusedAdamTensor& t = tensors[k];
      vec::Vectorized([&] {
        if (l2) {
          amsgrad ? AdamLoop<true, true, T>(u, t, begin, end)
                  : AdamLoop<true, false, T>(u, t, begin, end);
        } else {
          amsgrad ? AdamLoop<false, true, T>(u, t, begin, end)
                  : AdamLoop<false, false, T>(u, t, begin, end);
        }
      });
    });
  });
}

// ---- RMSprop -------------------------------------------------------------------------------

template <bool kMomentum, bool kCentered, typename T>
TANDEM_VECTORIZE void RmspropLoop(const RmspropScalars<OpMath<T>>& u, const FusedRmspropTensor& t,
                                  int64_t begin, int64_t end) {
  T* __restrict p = static_cast<T*>(t.param);
  const T* __restrict g = static_cast<const T*>(t.grad);
  T* __restrict v = static_cast<T*>(t.square_avg);
  T* __restrict b = static_cast<T*>(t.momentum_buffer);
  T* __restrict a = static_cast<T*>(t.grad_avg);
  for (int64_t j = begin; j < end; ++j) {
    RmspropElement<kMomentum, kCentered>(u, p, g, v, b, a, j);
  }
}

void CpuFusedRmsprop(int index, DType dtype, const FusedRmspropOptions& options,
                     const std::vector<FusedRmspropTensor>& tensors) {
  CheckIndex("FusedRmspropKernel", index);
  DispatchAllFloatingTypes(dtype, "CPU FusedRmspropKernel", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const RmspropScalars<OpMath<T>> u(options);
    const bool momentum = options.momentum > 0.0, centered = options.centered;
    RunUpdatePieces(tensors, [&](size_t k, int64_t begin, int64_t end) {
      const FusedRmspropTensor& t = tensors[k];
      vec::Vectorized([&] {
        if (momentum && centered) {
          RmspropLoop<true, true, T>(u, t, begin, end);
        } else if (momentum) {
          RmspropLoop<true, false, T>(u, t, begin, end);
        } else if (centered) {
          RmspropLoop<false, true, T>(u, t, begin, end);
        } else {
          RmspropLoop<false, false, T>(u, t, begin, end);
        }
      });
    });
  });
}

}  // namespace

TANDEM_REGISTER_KERNEL(FusedSgdKernel, DeviceType::kCPU, CpuFusedSgd);
TANDEM_REGISTER_KERNEL(FusedAdamKernel, DeviceType::kCPU, CpuFusedAdam);
TANDEM_REGISTER_KERNEL(FusedRmspropKernel, DeviceType::kCPU, CpuFusedRmsprop);

}  // namespace tandem
