// cudasim's stand-in for <mma.h>: CUDA's warp matrix functions (nvcuda::wmma) for .cu files
// compiled as host C++ under --config=cudasim; nvcc uses the toolkit's header. Shapes m16n16k16,
// m32n8k16 and m8n32k16; matrix_a/matrix_b of __half or __nv_bfloat16 (row_major or col_major),
// accumulators of float or __half.
//
//   using namespace nvcuda;
//   wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
//   wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
//   wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
//   wmma::fill_fragment(c, 0.0f);
//   wmma::load_matrix_sync(a, a_tile, 16);  // every lane of the warp, same arguments
//   wmma::load_matrix_sync(b, b_tile, 16);
//   wmma::mma_sync(c, a, b, c);
//   wmma::store_matrix_sync(c_tile, c, 16, wmma::mem_row_major);
//
// As on a GPU, load_matrix_sync, store_matrix_sync and mma_sync are warp-collective: they suspend
// the lane until all 32 lanes of its warp have reached the same one (the machinery of the warp
// shuffles, so a lane that skips it, or a warp of fewer than 32 threads, fails the kernel), and
// the lanes must pass the same pointer, leading dimension and layout (a lane that differs fails
// it). The pointer must be 32-byte aligned and the leading dimension a multiple of 16 bytes (a
// GPU's misaligned-address fault). Loads read after every lane arrived and before any leaves;
// stores are shared out between the lanes, each writing its own elements after the others have
// arrived, so a lane that reads the stored tile without a __syncwarp (or __syncthreads) may see
// what was there before, as on a GPU. fill_fragment does not wait (CUDA documents no wait).
//
// Each lane holds the whole tile (num_elements is the tile's size, not a GPU's per-lane share):
// the element-to-lane mapping is unspecified on a GPU, so a portable kernel applies only uniform
// operations to x[], and mma_sync checks that every lane's fragments are equal (a lane-dependent
// edit of x[] fails the kernel). Arithmetic: each product of two 16-bit values is exact in float;
// d(i,j) = c(i,j) + a(i,0) b(0,j) + ... + a(i,k-1) b(k-1,j), added in that order in float (a __half
// accumulator rounded once at the end). Tensor cores also multiply exactly and add in float, in
// their own order and alignment: results agree with a GPU within float rounding, not bitwise.
#ifndef TANDEM_TOOLS_CUDASIM_INCLUDE_MMA_H_
#define TANDEM_TOOLS_CUDASIM_INCLUDE_MMA_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace cudasim {
namespace internal {
const uint64_t* WarpExchange(unsigned mask, uint64_t value, const char* what);
int LaneId();
}  // namespace internal
}  // namespace cudasim

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace cudasim_detail {

constexpr bool IsShape(int m, int n, int k) {
  return k == 16 && ((m == 16 && n == 16) || (m == 32 && n == 8) || (m == 8 && n == 32));
}
// The tile a fragment holds: matrix_a is m x k, matrix_b k x n, the accumulator m x n.
template <typename Use, int M, int N, int K>
struct Tile;
template <int M, int N, int K>
struct Tile<matrix_a, M, N, K> {
  static constexpr int kRows = M, kCols = K;
};
template <int M, int N, int K>
struct Tile<matrix_b, M, N, K> {
  static constexpr int kRows = K, kCols = N;
};
template <int M, int N, int K>
struct Tile<accumulator, M, N, K> {
  static constexpr int kRows = M, kCols = N;
};
template <typename T>
constexpr bool kIsMultiplicand = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

[[noreturn]] inline void Fail(const char* what, const std::string& message) {
  throw std::runtime_error(std::string(what) + ": " + message);
}

// Waits for the 32 lanes of the warp at `what`; fails unless each deposited `value`. The slots
// stay valid until this lane's next exchange.
inline void Converge(const char* what, uint64_t value, const char* argument) {
  const uint64_t* slots = ::cudasim::internal::WarpExchange(0xffffffffu, value, what);
  for (int lane = 0; lane < 32; ++lane) {
    if (slots[lane] != value) {
      Fail(what, "lane " + std::to_string(::cudasim::internal::LaneId()) + " and lane " +
                     std::to_string(lane) + " passed different " + argument +
                     " (every lane of the warp must pass the same)");
    }
  }
}

// A misaligned pointer or leading dimension is a fault on a GPU.
template <typename T>
void CheckAddress(const char* what, const T* pointer, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(pointer) % 32 != 0) {
    Fail(what, "the pointer must be 32-byte (256-bit) aligned");
  }
  if ((ldm * sizeof(T)) % 16 != 0) {
    Fail(what, "ldm " + std::to_string(ldm) + " must be a multiple of " +
                   std::to_string(16 / sizeof(T)) + " elements (16 bytes)");
  }
}

inline uint64_t Mix(uint64_t hash, uint64_t value) {
  return (hash ^ value) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
}

template <typename T>
uint64_t Hash(const T* x, int n) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; ++i) {
    uint16_t bits16 = 0;
    uint32_t bits32 = 0;
    if constexpr (sizeof(T) == 2) {
      std::memcpy(&bits16, &x[i], 2);
      hash = Mix(hash, bits16);
    } else {
      std::memcpy(&bits32, &x[i], 4);
      hash = Mix(hash, bits32);
    }
  }
  return hash;
}

// Loads (or stores, when `kStore`) the rows x cols tile at `pointer`: element (r, c) at
// r * ldm + c when `row_major`, else at c * ldm + r. A store writes only this lane's share.
template <bool kStore, typename Memory, typename Register>
void Transfer(Memory* pointer, Register* x, int rows, int cols, unsigned ldm, bool row_major) {
  const int lane = ::cudasim::internal::LaneId();
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int index = r * cols + c;
      const size_t at =
          row_major ? static_cast<size_t>(r) * ldm + c : static_cast<size_t>(c) * ldm + r;
      if constexpr (kStore) {
        if (index % 32 == lane) pointer[at] = x[index];
      } else {
        x[index] = pointer[at];
      }
    }
  }
}

}  // namespace cudasim_detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
  static_assert(cudasim_detail::IsShape(M, N, K),
                "cudasim's wmma has the shapes m16n16k16, m32n8k16 and m8n32k16");
  static_assert(std::is_same_v<Use, accumulator>
                    ? (std::is_same_v<T, float> ||
                       std::is_same_v<T, __half>)&&std::is_void_v<Layout>
                    : cudasim_detail::kIsMultiplicand<T> &&
                          (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>),
                "matrix_a and matrix_b take __half or __nv_bfloat16 and row_major or col_major; "
                "an accumulator takes float or __half and no layout");

 public:
  using element_type = T;
  using storage_element_type = T;
  enum {
    num_elements =
        cudasim_detail::Tile<Use, M, N, K>::kRows * cudasim_detail::Tile<Use, M, N, K>::kCols
  };
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& value) {
  const T v = static_cast<T>(value);
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = v;
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* pointer, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator's load takes a layout_t");
  constexpr const char* kWhat = "wmma::load_matrix_sync";
  using Tile = cudasim_detail::Tile<Use, M, N, K>;
  cudasim_detail::CheckAddress(kWhat, pointer, ldm);
  cudasim_detail::Converge(kWhat, reinterpret_cast<uintptr_t>(pointer), "pointers");
  cudasim_detail::Transfer<false>(pointer, f.x, Tile::kRows, Tile::kCols, ldm,
                                  std::is_same_v<Layout, row_major>);
  // No lane leaves (and writes the tile again) before every lane has read it.
  cudasim_detail::Converge(kWhat, ldm, "leading dimensions");
}

template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* pointer, unsigned ldm,
                      layout_t layout) {
  constexpr const char* kWhat = "wmma::load_matrix_sync";
  cudasim_detail::CheckAddress(kWhat, pointer, ldm);
  cudasim_detail::Converge(kWhat, reinterpret_cast<uintptr_t>(pointer), "pointers");
  cudasim_detail::Transfer<false>(pointer, f.x, M, N, ldm, layout == mem_row_major);
  cudasim_detail::Converge(kWhat, ldm * 2ull + layout, "leading dimensions or layouts");
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* pointer, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                       layout_t layout) {
  constexpr const char* kWhat = "wmma::store_matrix_sync";
  cudasim_detail::CheckAddress(kWhat, pointer, ldm);
  cudasim_detail::Converge(kWhat, reinterpret_cast<uintptr_t>(pointer), "pointers");
  cudasim_detail::Converge(kWhat, ldm * 2ull + layout, "leading dimensions or layouts");
  cudasim_detail::Transfer<true>(pointer, const_cast<T*>(f.x), M, N, ldm, layout == mem_row_major);
}

template <int M, int N, int K, typename Ta, typename La, typename Tb, typename Lb, typename Tc,
          typename Td>
void mma_sync(fragment<accumulator, M, N, K, Td>& d, const fragment<matrix_a, M, N, K, Ta, La>& a,
              const fragment<matrix_b, M, N, K, Tb, Lb>& b,
              const fragment<accumulator, M, N, K, Tc>& c) {
  static_assert(std::is_same_v<Ta, Tb>, "matrix_a and matrix_b must have one element type");
  static_assert(std::is_same_v<Tc, Td>, "c and d must have one element type");
  constexpr const char* kWhat = "wmma::mma_sync";
  using cudasim_detail::Hash;
  const uint64_t fingerprint = cudasim_detail::Mix(
      cudasim_detail::Mix(Hash(a.x, M * K), Hash(b.x, K * N)), Hash(c.x, M * N));
  cudasim_detail::Converge(kWhat, fingerprint,
                           "fragments (a lane-dependent edit of x[] relies on the element "
                           "mapping, which is unspecified)");
  float result[M * N];
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      float sum = static_cast<float>(c.x[i * N + j]);
      for (int p = 0; p < K; ++p) {
        sum += static_cast<float>(a.x[i * K + p]) * static_cast<float>(b.x[p * N + j]);
      }
      result[i * N + j] = sum;
    }
  }
  for (int i = 0; i < M * N; ++i) d.x[i] = static_cast<Td>(result[i]);
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // TANDEM_TOOLS_CUDASIM_INCLUDE_MMA_H_
