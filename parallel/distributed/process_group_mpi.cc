#include "parallel/distributed/process_group_mpi.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iomanip>
#include <sstream>
#include <thread>
#include <utility>

#include "tensor/error.h"

namespace tandem::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// Whether MPI calls must be serialised by us (the library gave MPI_THREAD_SERIALIZED).
bool g_lock_mpi_calls = false;
std::mutex g_mpi_call_mutex;

class MpiCallLock {
 public:
  MpiCallLock() {
    if (g_lock_mpi_calls) lock_ = std::unique_lock<std::mutex>(g_mpi_call_mutex);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

void FinalizeMpiAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Initialises MPI once per process (see the header); later calls only read the result.
void EnsureMpiInitialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    TANDEM_CHECK(!finalized,
                 "ProcessGroupMpi: MPI has already been finalised in this process; create every "
                 "process group before MPI_Finalize");
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      TANDEM_CHECK(rc == MPI_SUCCESS,
                   "ProcessGroupMpi: MPI_Init_thread failed: ", MpiErrorString(rc),
                   "; is the program started by mpirun, with Open MPI installed?");
      std::atexit(FinalizeMpiAtExit);
    }
    TANDEM_CHECK(provided >= MPI_THREAD_SERIALIZED,
                 "ProcessGroupMpi needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE but MPI "
                 "provides thread level ",
                 provided,
                 (initialized ? "; initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, "
                                "...) or let ProcessGroupMpi do it"
                              : "; use an MPI library built with thread support"));
    g_lock_mpi_calls = provided < MPI_THREAD_MULTIPLE;
  });
}

MPI_Datatype MpiType(DType dtype) { return dtype == kFloat32 ? MPI_FLOAT : MPI_INT64_T; }

std::string Elements(const Tensor& t) {
  return internal::Concat(t.numel(), " ", DTypeName(t.dtype()), " elements");
}

}  // namespace

struct ProcessGroupMpi::Impl {
  struct Op {
    std::shared_ptr<Work> work;
    std::function<void(Clock::time_point deadline)> body;
  };

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  ProcessGroupMpiOptions options;
  std::string prefix;  // "ProcessGroupMpi rank 0 of 2: "

  std::mutex mutex;  // guards queue, stop, failure
  std::condition_variable cv;
  std::deque<Op> queue;
  bool stop = false;
  std::string failure;  // the first error; the group is unusable once set
  std::thread thread;

  // Checks an MPI return code.
  void Check(int rc, const char* call, const std::string& what) const {
    if (rc != MPI_SUCCESS) {
      TANDEM_FAIL(prefix, what, " failed: ", call, ": ", MpiErrorString(rc));
    }
  }

  // Polls `request` until it completes or `deadline` passes: spins for 50 us (latency), then
  // yields between polls (so that a compute thread sharing the core keeps it: DDP overlaps
  // backward with all-reduce), and sleeps between polls once 200 ms have passed (a peer far
  // behind should not cost a core).
  void Await(MPI_Request* request, Clock::time_point deadline, const std::string& what) const {
    const Clock::time_point start = Clock::now();
    Clock::duration waited{};
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      {
        MpiCallLock lock;
        Check(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
      }
      if (done) return;
      if ((polls & 15) == 0) {
        const Clock::time_point now = Clock::now();
        waited = now - start;
        if (now > deadline) {
          std::ostringstream seconds;
          seconds << std::fixed << std::setprecision(1)
                  << std::chrono::duration<double>(options.timeout_).count();
          TANDEM_FAIL(prefix, what, " did not finish within ", seconds.str(),
                      " s: a peer rank has failed, exited or not issued the same collective "
                      "(every rank must issue the same collectives in the same order); raise "
                      "ProcessGroupMpiOptions::timeout if a rank is only slow");
        }
      }
      if (waited > std::chrono::milliseconds(200)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } else if (waited > std::chrono::microseconds(50)) {
        std::this_thread::yield();
      }
    }
  }

  void Run() {
    while (true) {
      Op op;
      std::string earlier_failure;
      {
        std::unique_lock<std::mutex> lock(mutex);
        // Collectives often come in quick succession (DDP's buckets, a loop of all-reduces):
        // look for the next one for a moment before sleeping.
        const Clock::time_point spin_until = Clock::now() + std::chrono::microseconds(50);
        while (!stop && queue.empty() && Clock::now() < spin_until) {
          lock.unlock();
          std::this_thread::yield();
          lock.lock();
        }
        cv.wait(lock, [this] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        op = std::move(queue.front());
        queue.pop_front();
        earlier_failure = failure;
      }
      if (!earlier_failure.empty()) {
        op.work->Finish(std::make_exception_ptr(
            Error(prefix + op.work->description() +
                  " was not run: the group failed earlier: " + earlier_failure)));
        continue;
      }
      try {
        op.work->Start();
        op.body(Clock::now() + options.timeout_);
        op.work->Finish();
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (failure.empty()) failure = e.what();
        }
        op.work->Finish(std::current_exception());
      }
    }
  }

  std::shared_ptr<Work> Enqueue(std::string description,
                                std::function<void(Clock::time_point)> body) {
    auto work = std::make_shared<Work>(std::move(description));
    {
      std::lock_guard<std::mutex> lock(mutex);
      TANDEM_CHECK(failure.empty(), prefix, "cannot run ", work->description(),
                   ": the group failed earlier: ", failure);
      queue.push_back(Op{work, std::move(body)});
    }
    cv.notify_one();
    return work;
  }

  void CheckTensor(const Tensor& t, const char* collective, const char* role) const {
    TANDEM_CHECK(t.defined(), prefix, collective, ": the ", role, " tensor is undefined");
    TANDEM_CHECK(t.device().type() == DeviceType::kCPU, prefix, collective,
                 " takes CPU tensors but the ", role, " tensor is on ", t.device(),
                 "; copy it to the CPU (or use a NCCL process group for CUDA tensors)");
    TANDEM_CHECK(t.numel() == 0 || t.is_contiguous(), prefix, collective, ": the ", role,
                 " tensor must be contiguous; call .contiguous() and copy the result back");
  }
};

ProcessGroupMpi::ProcessGroupMpi(ProcessGroupMpiOptions options)
    : ProcessGroupMpi(options, [&options] {
        TANDEM_CHECK(options.timeout_.count() > 0,
                     "ProcessGroupMpi: the timeout must be positive but is ",
                     options.timeout_.count(), " ms");
        TANDEM_CHECK(
            options.max_elements_per_call_ >= 1 && options.max_elements_per_call_ <= INT_MAX,
            "ProcessGroupMpi: max_elements_per_call must be in [1, ", INT_MAX, "] but is ",
            options.max_elements_per_call_);
        EnsureMpiInitialized();
        auto impl = std::make_unique<Impl>();
        impl->options = options;
        MpiCallLock lock;
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm);
        TANDEM_CHECK(rc == MPI_SUCCESS,
                     "ProcessGroupMpi: MPI_Comm_dup(MPI_COMM_WORLD) failed: ", MpiErrorString(rc));
        MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(impl->comm, &impl->rank);
        MPI_Comm_size(impl->comm, &impl->size);
        impl->prefix =
            internal::Concat("ProcessGroupMpi rank ", impl->rank, " of ", impl->size, ": ");
        return impl;
      }()) {}

ProcessGroupMpi::ProcessGroupMpi(ProcessGroupMpiOptions options, std::unique_ptr<Impl> impl)
    : ProcessGroup(impl->rank, impl->size), options_(options), impl_(std::move(impl)) {
  impl_->thread = std::thread([impl = impl_.get()] { impl->Run(); });
}

ProcessGroupMpi::~ProcessGroupMpi() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
  // After a failure a request may still be pending on the communicator: leave it be.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (impl_->failure.empty() && !finalized) {
    MpiCallLock lock;
    MPI_Comm_free(&impl_->comm);
  }
}

std::shared_ptr<Work> ProcessGroupMpi::allreduce(Tensor tensor, ReduceOp op) {
  Impl& impl = *impl_;
  impl.CheckTensor(tensor, "allreduce", "");
  TANDEM_CHECK(op != ReduceOp::kAverage || tensor.dtype() == kFloat32, impl.prefix,
               "allreduce: average is defined for float32 tensors but this one is ", tensor.dtype(),
               "; use ReduceOp::kSum and divide yourself");
  std::string what = internal::Concat("allreduce (", ReduceOpName(op), ") of ", Elements(tensor));
  return impl.Enqueue(what, [&impl, tensor, op, what](Clock::time_point deadline) {
    const int64_t n = tensor.numel();
    char* data = static_cast<char*>(tensor.raw_data());
    const size_t element = ElementSize(tensor.dtype());
    const int64_t step = impl.options.max_elements_per_call_;
    for (int64_t offset = 0; offset < n; offset += step) {
      const int count = static_cast<int>(std::min(step, n - offset));
      MPI_Request request;
      {
        MpiCallLock lock;
        impl.Check(MPI_Iallreduce(MPI_IN_PLACE, data + offset * element, count,
                                  MpiType(tensor.dtype()), MPI_SUM, impl.comm, &request),
                   "MPI_Iallreduce", what);
      }
      impl.Await(&request, deadline, what);
    }
    if (op == ReduceOp::kAverage) {
      float* values = reinterpret_cast<float*>(data);
      const float scale = 1.0f / static_cast<float>(impl.size);
      for (int64_t i = 0; i < n; ++i) values[i] *= scale;
    }
  });
}

std::shared_ptr<Work> ProcessGroupMpi::broadcast(Tensor tensor, int root) {
  Impl& impl = *impl_;
  impl.CheckTensor(tensor, "broadcast", "");
  TANDEM_CHECK(root >= 0 && root < impl.size, impl.prefix, "broadcast: root must be a rank in [0, ",
               impl.size, ") but is ", root);
  std::string what = internal::Concat("broadcast from rank ", root, " of ", Elements(tensor));
  return impl.Enqueue(what, [&impl, tensor, root, what](Clock::time_point deadline) {
    const int64_t n = tensor.numel();
    char* data = static_cast<char*>(tensor.raw_data());
    const size_t element = ElementSize(tensor.dtype());
    const int64_t step = impl.options.max_elements_per_call_;
    for (int64_t offset = 0; offset < n; offset += step) {
      const int count = static_cast<int>(std::min(step, n - offset));
      MPI_Request request;
      {
        MpiCallLock lock;
        impl.Check(MPI_Ibcast(data + offset * element, count, MpiType(tensor.dtype()), root,
                              impl.comm, &request),
                   "MPI_Ibcast", what);
      }
      impl.Await(&request, deadline, what);
    }
  });
}

std::shared_ptr<Work> ProcessGroupMpi::allgather(Tensor output, Tensor input) {
  Impl& impl = *impl_;
  impl.CheckTensor(input, "allgather", "input");
  impl.CheckTensor(output, "allgather", "output");
  TANDEM_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * impl.size,
               impl.prefix, "allgather: the output must hold ", impl.size, " x ", input.numel(),
               " ", input.dtype(), " elements (world size x input) but holds ", output.numel(), " ",
               output.dtype(), " elements");
  TANDEM_CHECK(!output.shares_storage_with(input), impl.prefix,
               "allgather: the output must not share storage with the input");
  std::string what = internal::Concat("allgather of ", Elements(input));
  return impl.Enqueue(what, [&impl, output, input, what](Clock::time_point deadline) {
    const int64_t n = input.numel();
    const char* in = static_cast<const char*>(input.raw_data());
    char* out = static_cast<char*>(output.raw_data());
    const size_t element = ElementSize(input.dtype());
    const MPI_Datatype type = MpiType(input.dtype());
    const int64_t step = impl.options.max_elements_per_call_;
    for (int64_t offset = 0; offset < n; offset += step) {
      const int count = static_cast<int>(std::min(step, n - offset));
      MPI_Request request;
      if (count == n) {
        MpiCallLock lock;
        impl.Check(MPI_Iallgather(in, count, type, out, count, type, impl.comm, &request),
                   "MPI_Iallgather", what);
      } else {
        // Piece `offset` of every rank lands at out[rank * n + offset]: receive one element of
        // a type of `count` elements whose extent is a whole rank's share.
        MPI_Datatype piece = MPI_DATATYPE_NULL;
        MPI_Datatype strided = MPI_DATATYPE_NULL;
        MpiCallLock lock;
        impl.Check(MPI_Type_contiguous(count, type, &piece), "MPI_Type_contiguous", what);
        impl.Check(MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(n * element), &strided),
                   "MPI_Type_create_resized", what);
        impl.Check(MPI_Type_commit(&strided), "MPI_Type_commit", what);
        impl.Check(MPI_Iallgather(in + offset * element, count, type, out + offset * element, 1,
                                  strided, impl.comm, &request),
                   "MPI_Iallgather", what);
        MPI_Type_free(&strided);  // freed once the pending call is done with it
        MPI_Type_free(&piece);
      }
      impl.Await(&request, deadline, what);
    }
  });
}

std::shared_ptr<Work> ProcessGroupMpi::barrier() {
  Impl& impl = *impl_;
  return impl.Enqueue("barrier", [&impl](Clock::time_point deadline) {
    MPI_Request request;
    {
      MpiCallLock lock;
      impl.Check(MPI_Ibarrier(impl.comm, &request), "MPI_Ibarrier", "barrier");
    }
    impl.Await(&request, deadline, "barrier");
  });
}

int LocalRank() {
  const char* value = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return value == nullptr ? 0 : std::atoi(value);
}

bool LaunchedByMpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

void AbortJob(int code) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  std::fflush(stdout);
  std::fflush(stderr);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace tandem::distributed
