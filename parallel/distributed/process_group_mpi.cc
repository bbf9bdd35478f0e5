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
#include "tensor/internal/vectorized.h"
#include "tensor/profiler.h"

namespace tandem::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// True on a group's own thread (see Impl::Await).
thread_local bool t_on_group_thread = false;

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

std::string Elements(int64_t numel, DType dtype) {
  return internal::Concat(numel, " ", DTypeName(dtype), " elements");
}
std::string Elements(const Tensor& t) { return Elements(t.numel(), t.dtype()); }

}  // namespace

struct ProcessGroupMpi::Impl {
  struct Op {
    std::shared_ptr<Work> work;
    std::function<void(const Work& work, Clock::time_point deadline)> body;
    Clock::time_point issued;
  };

  // A Work whose wait() runs the collective on the waiting thread when it can (RunOnCaller).
  class MpiWork final : public Work {
   public:
    MpiWork(Impl* impl, std::function<std::string()> describe)
        : Work(std::move(describe)), impl_(impl) {}

   private:
    void RunIfNotStarted() override { impl_->RunOnCaller(this); }
    Impl* const impl_;  // the group waits for its collectives before it goes
  };

  // All-reduces below this many bytes use recursive doubling (one exchange of the whole
  // buffer per doubling, for a power-of-two number of ranks): fewest messages, and each still
  // fits Open MPI's shared-memory eager limit (4 KB with its header), past which a message
  // costs a rendezvous. Larger ones use the ring (reduce-scatter, then all-gather), where
  // every rank sends and adds only 1/size of the buffer per step: at 4 KB on 2 ranks its two
  // 2 KB exchanges are both eager, and took 1.7 us against 5.7 us for one 4 KB exchange.
  static constexpr int64_t kRingMinBytes = 4096;
  // The ring moves a block in pieces of at most this many bytes, so that the piece just
  // received is still in cache when it is added (128 KB and 2 MB measured no better).
  static constexpr int64_t kRingPieceBytes = 512 << 10;
  // Await spins this long before it sleeps between polls. A transfer needs both sides' polls
  // (on one machine the receiver's poll does the copy), so a collective whose peers are both
  // at it finishes within the spin; past it, sleeping costs the core far less, and unlike
  // yielding still makes progress: a thread that yields to a busy compute thread on the same
  // core (DDP's backward) ran only every few milliseconds, and hid none of the all-reduce.
  static constexpr std::chrono::milliseconds kSpinFor{2};
  static constexpr std::chrono::microseconds kPollSleep{50};
  // The group's own thread spins only this long: it shares a core with the compute thread
  // (DDP's backward), which a spin would take half of, so it polls every kPollSleep instead.
  // But while a caller waits for the collective it runs, that caller's core is free: it
  // spins as a caller would (caller_waits).
  static constexpr std::chrono::microseconds kGroupThreadSpinFor{50};
  // See Run().
  static constexpr std::chrono::microseconds kDeferredStart{1000};
  static constexpr std::chrono::milliseconds kIdleBeforeSleep{100};

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  ProcessGroupMpiOptions options;
  std::string prefix;  // "ProcessGroupMpi rank 0 of 2: "

  std::mutex mutex;  // guards what follows, to `thread`
  std::condition_variable cv;
  std::deque<Op> queue;  // issued, not started
  // A collective is running, on the group's thread or on a waiting caller's: the next one
  // starts after it (issue order is the order every rank runs them in).
  bool running = false;
  bool stop = false;
  // The last collective was run by the thread that waited for it: see Run().
  bool callers_run_their_collectives = false;
  Clock::time_point last_issued;
  std::string failure;  // the first error; the group is unusable once set
  std::thread thread;
  // A caller is blocked in wait() on the collective that the group's thread runs now.
  std::atomic<bool> caller_waits{false};
  std::vector<char> scratch;  // the running all-reduce's receive buffer

  // Checks an MPI return code.
  void Check(int rc, const char* call, const Work& work) const {
    if (rc != MPI_SUCCESS) {
      TANDEM_FAIL(prefix, work.description(), " failed: ", call, ": ", MpiErrorString(rc));
    }
  }

  // Polls `requests` until all have completed or `deadline` passes: spins for kSpinFor, then
  // sleeps kPollSleep between polls, and 200 us once 200 ms have passed (a peer far behind
  // should not cost a core). On timeout, cancels the pending receives (so that nothing writes
  // into the buffers later) and throws.
  void Await(MPI_Request* requests, int count, Clock::time_point deadline, const Work& work) {
    // The clock is read every 16 polls only, from the 16th on: most exchanges of a small
    // all-reduce are over before that.
    Clock::time_point start;
    Clock::duration waited{};
    for (int64_t polls = 1;; ++polls) {
      int done = 0;
      {
        MpiCallLock lock;
        Check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall", work);
      }
      if (done) return;
      if ((polls & 15) == 0) {
        const Clock::time_point now = Clock::now();
        if (polls == 16) start = now;
        waited = now - start;
        if (now > deadline) {
          Abandon(requests, count);
          std::ostringstream seconds;
          seconds << std::fixed << std::setprecision(1)
                  << std::chrono::duration<double>(options.timeout_).count();
          TANDEM_FAIL(prefix, work.description(), " did not finish within ", seconds.str(),
                      " s: a peer rank has failed, exited or not issued the same collective "
                      "(every rank must issue the same collectives in the same order); raise "
                      "ProcessGroupMpiOptions::timeout if a rank is only slow");
        }
      }
      if (waited > std::chrono::milliseconds(200)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } else if (waited > (t_on_group_thread && !caller_waits.load(std::memory_order_relaxed)
                               ? Clock::duration(kGroupThreadSpinFor)
                               : Clock::duration(kSpinFor))) {
        std::this_thread::sleep_for(kPollSleep);
      }
    }
  }

  // Gives up on requests after a timeout. A receive is cancelled; a send may be too late to
  // cancel. The scratch buffer is let go without being freed, since a receive that had already
  // matched may still write into it; the group is unusable from now on anyway.
  void Abandon(MPI_Request* requests, int count) {
    MpiCallLock lock;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&requests[i]);
      MPI_Request_free(&requests[i]);
    }
    new std::vector<char>(std::move(scratch));  // deliberately leaked, see above
  }

  // Sends `send_count` elements to `to` and receives `receive_count` from `from`, both at once
  // (as MPI_Sendrecv), waiting until both have finished or the deadline has passed.
  template <typename T>
  void Exchange(const T* send, int64_t send_count, int to, T* receive, int64_t receive_count,
                int from, Clock::time_point deadline, const Work& work) {
    // Nothing is sent or received for an empty part: the peer skips it alike.
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    const MPI_Datatype type = MpiType(DTypeOf<T>::value);
    {
      MpiCallLock lock;
      if (receive_count > 0) {
        Check(
            MPI_Irecv(receive, static_cast<int>(receive_count), type, from, 0, comm, &requests[0]),
            "MPI_Irecv", work);
      }
      if (send_count > 0) {
        Check(MPI_Isend(send, static_cast<int>(send_count), type, to, 0, comm, &requests[1]),
              "MPI_Isend", work);
      }
    }
    Await(requests, 2, deadline, work);
  }

  // Sums `count` elements at `data` over the ranks in place, over non-blocking point-to-point
  // messages (see kRingMinBytes): the same algorithms as Open MPI's tuned
  // blocking MPI_Allreduce, but with a deadline (its non-blocking MPI_Iallreduce is libnbc's,
  // several times slower on one machine, and moves only when polled). Every rank ends with
  // bit-identical sums: recursive doubling adds the same two halves on both sides of each
  // exchange, and the ring has one rank add each block and copy it to the others.
  template <typename T>
  void AllreduceSum(T* data, int64_t count, Clock::time_point deadline, const Work& work) {
    if (size == 1 || count == 0) return;
    const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
    if ((size & (size - 1)) == 0 && bytes < kRingMinBytes) {
      if (scratch.size() < static_cast<size_t>(bytes)) scratch.resize(bytes);
      T* received = reinterpret_cast<T*>(scratch.data());
      for (int mask = 1; mask < size; mask <<= 1) {
        const int peer = rank ^ mask;
        Exchange(data, count, peer, received, count, peer, deadline, work);
        ::tandem::internal::AddInto(data, received, count);
      }
      return;
    }
    // Ring: block b is elements [begin(b), begin(b + 1)). In reduce-scatter step s each rank
    // sends block rank - s to its right neighbour and adds block rank - s - 1 from its left
    // one, so after size - 1 steps it holds the sum of block rank + 1; in all-gather step s it
    // passes on block rank + 1 - s and receives block rank - s.
    auto begin = [&](int block) { return count * block / size; };
    auto mod = [&](int block) { return ((block % size) + size) % size; };
    const int right = (rank + 1) % size;
    const int left = (rank + size - 1) % size;
    const int64_t piece = std::max<int64_t>(1, kRingPieceBytes / static_cast<int64_t>(sizeof(T)));
    const int64_t largest_block = (count + size - 1) / size;
    const int64_t scratch_bytes = std::min(piece, largest_block) * sizeof(T);
    if (scratch.size() < static_cast<size_t>(scratch_bytes)) scratch.resize(scratch_bytes);
    T* received = reinterpret_cast<T*>(scratch.data());
    for (int step = 0; step < size - 1; ++step) {
      const int out = mod(rank - step);
      const int in = mod(rank - step - 1);
      const int64_t out_size = begin(out + 1) - begin(out);
      const int64_t in_size = begin(in + 1) - begin(in);
      // Both neighbours cut a block into pieces the same way, so piece k of `out` meets piece
      // k of the right neighbour's `in` (the same block).
      for (int64_t offset = 0; offset < std::max(out_size, in_size); offset += piece) {
        const int64_t send = std::clamp<int64_t>(out_size - offset, 0, piece);
        const int64_t take = std::clamp<int64_t>(in_size - offset, 0, piece);
        Exchange(data + begin(out) + offset, send, right, received, take, left, deadline, work);
        ::tandem::internal::AddInto(data + begin(in) + offset, received, take);
      }
    }
    for (int step = 0; step < size - 1; ++step) {
      const int out = mod(rank + 1 - step);
      const int in = mod(rank - step);
      Exchange(data + begin(out), begin(out + 1) - begin(out), right, data + begin(in),
               begin(in + 1) - begin(in), left, deadline, work);
    }
  }

  // Runs one collective that this thread has taken off the queue (with `earlier_failure`,
  // the group's failure when it did).
  void Execute(Op& op, const std::string& earlier_failure) {
    if (!earlier_failure.empty()) {
      op.work->Finish(std::make_exception_ptr(
          Error(prefix + op.work->description() +
                " was not run: the group failed earlier: " + earlier_failure)));
      return;
    }
    try {
      TANDEM_PROFILE_SCOPE("distributed", op.work->description());
      op.work->Start();
      op.body(*op.work, Clock::now() + options.timeout_);
      op.work->Finish();
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (failure.empty()) failure = e.what();
      }
      op.work->Finish(std::current_exception());
    }
  }

  // The group's thread: runs the collectives in issue order whenever no waiting caller runs
  // them itself.
  //
  // Waking it costs more than a small all-reduce: a futex call, and on a machine whose cores
  // all run ranks, two context switches on a core that a rank (this one or a peer) needs
  // (3-4 us against 1-5 us for 4 KB on 2 ranks). So while the issuing threads run their
  // collectives themselves (the last one was run by its waiter), Enqueue does not wake it;
  // instead it looks every kDeferredStart for one that nobody has started, so that every
  // collective still starts without a wait (DDP's first buckets start at most that late).
  // Starting one itself ends that mode; after kIdleBeforeSleep without collectives it sleeps
  // until woken. (Waking for collectives of 1 MiB and more at once was measured too: it cost
  // the all-reduce up to half its bandwidth there, the thread racing the waiting caller.)
  void Run() {
    t_on_group_thread = true;
    profiler::SetThreadName("ProcessGroupMpi rank " + std::to_string(rank) + " thread");
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      if (running || queue.empty()) {
        if (stop && !running && queue.empty()) return;
        if (callers_run_their_collectives) {
          cv.wait_for(lock, kDeferredStart);
          if (queue.empty() && Clock::now() - last_issued > kIdleBeforeSleep) {
            callers_run_their_collectives = false;
          }
        } else {
          cv.wait(lock);
        }
        continue;
      }
      if (callers_run_their_collectives && !stop) {
        const Clock::time_point due = queue.front().issued + kDeferredStart;
        if (Clock::now() < due) {
          cv.wait_until(lock, due);
          continue;
        }
      }
      callers_run_their_collectives = false;  // its issuer has not come for it
      Op op = std::move(queue.front());
      queue.pop_front();
      running = true;
      const std::string earlier_failure = failure;
      lock.unlock();
      Execute(op, earlier_failure);
      op = Op();  // releases the tensors before the next wait
      caller_waits.store(false, std::memory_order_relaxed);
      lock.lock();
      running = false;
    }
  }

  // Called by wait() on `target`: when no collective is running, runs the queued ones up to
  // and including `target` on the calling thread, in issue order. For the usual
  // issue-then-wait this saves waking the group's thread and being woken by it; the result
  // is the same, since one collective at a time runs either way, in the same order.
  void RunOnCaller(const Work* target) {
    std::unique_lock<std::mutex> lock(mutex);
    // Another thread runs a collective (ours or one before it): if the group's, it may spin.
    if (running) caller_waits.store(true, std::memory_order_relaxed);
    while (!running && std::any_of(queue.begin(), queue.end(),
                                   [target](const Op& op) { return op.work.get() == target; })) {
      Op op = std::move(queue.front());
      queue.pop_front();
      running = true;
      if (!callers_run_their_collectives) {
        callers_run_their_collectives = true;
        cv.notify_one();  // from an untimed sleep to looking every kDeferredStart
      }
      const std::string earlier_failure = failure;
      lock.unlock();
      Execute(op, earlier_failure);
      op = Op();
      lock.lock();
      running = false;
    }
    // The group's thread waits while a collective runs: let it take the later ones.
    if (!queue.empty()) cv.notify_one();
  }

  std::shared_ptr<Work> Enqueue(std::function<std::string()> describe,
                                std::function<void(const Work&, Clock::time_point)> body) {
    auto work = std::make_shared<MpiWork>(this, std::move(describe));
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mutex);
      TANDEM_CHECK(failure.empty(), prefix, "cannot run ", work->description(),
                   ": the group failed earlier: ", failure);
      last_issued = Clock::now();
      queue.push_back(Op{work, std::move(body), last_issued});
      wake = !callers_run_their_collectives;
    }
    if (wake) cv.notify_one();
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
  // Small enough for std::function to hold without allocating (unlike the tensor).
  auto describe = [numel = tensor.numel(), dtype = tensor.dtype(), op] {
    return internal::Concat("allreduce (", ReduceOpName(op), ") of ", Elements(numel, dtype));
  };
  return impl.Enqueue(describe, [&impl, tensor, op](const Work& work, Clock::time_point deadline) {
    const int64_t n = tensor.numel();
    const int64_t step = impl.options.max_elements_per_call_;
    for (int64_t offset = 0; offset < n; offset += step) {
      const int64_t count = std::min(step, n - offset);
      if (tensor.dtype() == kFloat32) {
        impl.AllreduceSum(tensor.data<float>() + offset, count, deadline, work);
      } else {
        impl.AllreduceSum(tensor.data<int64_t>() + offset, count, deadline, work);
      }
    }
    if (op == ReduceOp::kAverage) {
      float* values = tensor.data<float>();
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
  auto describe = [tensor, root] {
    return internal::Concat("broadcast from rank ", root, " of ", Elements(tensor));
  };
  return impl.Enqueue(
      describe, [&impl, tensor, root](const Work& work, Clock::time_point deadline) {
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
                       "MPI_Ibcast", work);
          }
          impl.Await(&request, 1, deadline, work);
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
  auto describe = [input] { return internal::Concat("allgather of ", Elements(input)); };
  return impl.Enqueue(describe, [&impl, output, input](const Work& work,
                                                       Clock::time_point deadline) {
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
                   "MPI_Iallgather", work);
      } else {
        // Piece `offset` of every rank lands at out[rank * n + offset]: receive one element of
        // a type of `count` elements whose extent is a whole rank's share.
        MPI_Datatype piece = MPI_DATATYPE_NULL;
        MPI_Datatype strided = MPI_DATATYPE_NULL;
        MpiCallLock lock;
        impl.Check(MPI_Type_contiguous(count, type, &piece), "MPI_Type_contiguous", work);
        impl.Check(MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(n * element), &strided),
                   "MPI_Type_create_resized", work);
        impl.Check(MPI_Type_commit(&strided), "MPI_Type_commit", work);
        impl.Check(MPI_Iallgather(in + offset * element, count, type, out + offset * element, 1,
                                  strided, impl.comm, &request),
                   "MPI_Iallgather", work);
        MPI_Type_free(&strided);  // freed once the pending call is done with it
        MPI_Type_free(&piece);
      }
      impl.Await(&request, 1, deadline, work);
    }
  });
}

std::shared_ptr<Work> ProcessGroupMpi::barrier() {
  Impl& impl = *impl_;
  return impl.Enqueue([] { return std::string("barrier"); },
                      [&impl](const Work& work, Clock::time_point deadline) {
                        MPI_Request request;
                        {
                          MpiCallLock lock;
                          impl.Check(MPI_Ibarrier(impl.comm, &request), "MPI_Ibarrier", work);
                        }
                        impl.Await(&request, 1, deadline, work);
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
