// cudasim internals shared by the runtime (runtime.cc) and cuBLAS (cublas.cc): devices, streams
// as FIFO worker threads, device memory bookkeeping. Not for use outside tools/cudasim.
#ifndef TANDEM_TOOLS_CUDASIM_RUNTIME_INTERNAL_H_
#define TANDEM_TOOLS_CUDASIM_RUNTIME_INTERNAL_H_

#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace cudasim {
namespace internal {

// A stream: one worker thread running its tasks in order. While it takes part in a stream
// capture (cudaStreamBeginCapture, or a cudaStreamWaitEvent on an event recorded in one), what it
// is given becomes a node of the capture's graph instead (runtime.cc, "Graphs").
class Stream {
 public:
  Stream(int device, bool is_default);
  ~Stream();  // drains the queue and joins the worker
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int device() const { return device_; }
  // `retired`, when given, runs after the task, under the stream's lock and once the task no
  // longer counts as pending: an event's completion is set there, so that whoever sees the
  // event done also sees the stream idle (when nothing came after it), and whoever sees the
  // stream idle sees every event recorded on it done, as on a GPU.
  // Returns cudaErrorStreamCaptureInvalidated, without queueing, when the stream's capture
  // was invalidated.
  cudaError_t Enqueue(std::function<void()> task, std::function<void()> retired = nullptr);
  // A kernel (or a library's kernel): counted as launched now, or, captured, each time its
  // graph is launched.
  cudaError_t EnqueueLaunch(const std::string& name, long long blocks, long long threads_per_block,
                            std::function<void()> task);
  bool capturing() const { return capturing_.load(std::memory_order_acquire); }
  void set_capturing(bool capturing) { capturing_.store(capturing, std::memory_order_release); }
  void Synchronize();
  bool Idle();
  // A per-stream count of kernel launches, for the seed of each launch's thread order.
  uint64_t NextLaunch() { return launches_++; }

 private:
  void Run();

  const int device_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable idle_;
  struct Task {
    std::function<void()> run;
    std::function<void()> retired;
  };
  std::deque<Task> tasks_;
  int64_t pending_ = 0;
  bool stop_ = false;
  uint64_t launches_ = 0;
  std::atomic<bool> capturing_{false};
  std::thread worker_;
};

// The stream a handle names (nullptr: the current device's default stream). Null when the
// handle is not a live stream.
Stream* ResolveStream(cudaStream_t stream);
// Sets the thread's last error and returns `error`; prints `detail` to stderr when it is not
// empty (cudasim explains errors that a GPU would only name).
cudaError_t Fail(cudaError_t error, const std::string& detail = "");
// The device's sticky error (a failed kernel), or cudaSuccess.
cudaError_t StickyError(int device);
void SetStickyError(int device, cudaError_t error, const std::string& message);
int CurrentDevice();
uint64_t Seed();

// For the simulated NCCL (nccl.cc): whether [ptr, ptr + bytes) lies inside one cudaMalloc block,
// and on which device.
bool FindDeviceMemory(const void* ptr, size_t bytes, int* device);

}  // namespace internal
}  // namespace cudasim

#endif  // TANDEM_TOOLS_CUDASIM_RUNTIME_INTERNAL_H_
