// What the CPU backend's oneDNN callers (onednn_matmul.cc, onednn_conv.cc) share: the one CPU
// engine and the guard that makes a oneDNN call run on the calling thread alone. Include it
// only from .cc files inside tensor/cpu: it brings in <dnnl.hpp>.
//
//   OneThreadOpenMp one_thread;   // see Note [oneDNN threads] in onednn_matmul.cc
//   primitive.execute(stream, args);
#ifndef TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_COMMON_H_
#define TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_COMMON_H_

#include <dnnl.hpp>
#include <mutex>

// libgomp's, declared here rather than through <omp.h>: that header belongs to the compiler
// (clang without libomp-dev has none), and these two calls are all we need.
extern "C" {
int omp_get_max_threads(void);
void omp_set_num_threads(int);
}

namespace tandem {

// The CPU engine every primitive is made for (made once, never destroyed).
inline const dnnl::engine& OneDnnEngine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Held while a primitive is created (matmul's and convolution's alike). Creation is rare (once
// per shape) and slow anyway, and oneDNN's own caches, which creation fills and reads, are
// synchronised in library code that ThreadSanitizer does not see: two devices' workers creating
// primitives at once were reported as a race inside oneDNN. Executing primitives needs no lock.
inline std::mutex& OneDnnCreationMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}

// Sets OpenMP's thread count to one on the calling thread while it lives (Note [oneDNN
// threads] in onednn_matmul.cc): oneDNN then runs on this thread only, and picks its blocking
// for one thread when a primitive is created.
class OneThreadOpenMp {
 public:
  OneThreadOpenMp() : previous_(omp_get_max_threads()) {
    if (previous_ != 1) omp_set_num_threads(1);
  }
  ~OneThreadOpenMp() {
    if (previous_ != 1) omp_set_num_threads(previous_);
  }
  OneThreadOpenMp(const OneThreadOpenMp&) = delete;
  OneThreadOpenMp& operator=(const OneThreadOpenMp&) = delete;

 private:
  int previous_;
};

}  // namespace tandem

#endif  // TANDEM_TENSOR_CPU_INTERNAL_ONEDNN_COMMON_H_
