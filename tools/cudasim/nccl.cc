// cudasim's NCCL: communicators and collectives on the simulated GPUs, within one process and
// across processes. See README.md ("NCCL") for what it checks and what it cannot.
//
// Every communicator is a rendezvous in memory that all its ranks map: a header (each rank's
// arrival count, device, and the collective it is running) and one staging slot per rank.
// Ranks in one process (ncclCommInitAll) share an anonymous mapping; ranks of
// ncclCommInitRank map a POSIX shared-memory object named after the unique id, so ranks in
// other processes (under mpirun) and ranks in this one meet the same way. A collective is a
// task on the caller's simulated stream: in rounds of at most kSlotBytes per rank, each rank
// copies its part into its slot, all ranks meet at a barrier, each computes its result from
// every slot, and all meet again before the slots are reused. Each stream is its own worker
// thread, so a rank that waits for its peers blocks only its own stream, as a GPU kernel
// spinning on its peers would.
#include <fcntl.h>
#include <linux/futex.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tools/cudasim/counters.h"
#include "tools/cudasim/float16.h"
#include "tools/cudasim/runtime_internal.h"

namespace cudasim {
namespace nccl {
namespace {

constexpr int kMaxRanks = 64;
// Per rank and round: large enough that a bucket of DDP's takes a few rounds, small enough that
// 64 ranks' slots (sparse, only touched pages cost memory) fit any /dev/shm.
constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr char kIdMagic[] = "tandem-cudasim-nccl";

// ---- Errors -----------------------------------------------------------------------------------

thread_local std::string tls_last_error;

ncclResult_t Fail(ncclResult_t result, const std::string& message) {
  tls_last_error = message;
  return result;
}

// ---- Types and operations -----------------------------------------------------------------------

const char* TypeName(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return "ncclInt8";
    case ncclUint8:
      return "ncclUint8";
    case ncclInt32:
      return "ncclInt32";
    case ncclUint32:
      return "ncclUint32";
    case ncclInt64:
      return "ncclInt64";
    case ncclUint64:
      return "ncclUint64";
    case ncclFloat16:
      return "ncclFloat16";
    case ncclFloat32:
      return "ncclFloat32";
    case ncclFloat64:
      return "ncclFloat64";
    case ncclBfloat16:
      return "ncclBfloat16";
    default:
      return "an unknown ncclDataType_t";
  }
}

// Bytes per element; 0 for a type this simulator does not have.
size_t TypeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* OpName(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return "ncclSum";
    case ncclProd:
      return "ncclProd";
    case ncclMax:
      return "ncclMax";
    case ncclMin:
      return "ncclMin";
    case ncclAvg:
      return "ncclAvg";
    default:
      return "an unknown ncclRedOp_t";
  }
}

// Element access through float for the 16-bit types (NCCL adds them in float and rounds each
// step's result), and as themselves for the rest.
struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};
template <typename T>
struct Arithmetic {
  using Acc = T;
  static Acc Load(T v) { return v; }
  static T Store(Acc v) { return v; }
};
template <>
struct Arithmetic<Bf16> {
  using Acc = float;
  static float Load(Bf16 v) { return internal::BFloat16ToFloat(v.bits); }
  static Bf16 Store(float v) { return {internal::FloatToBFloat16(v)}; }
};
template <>
struct Arithmetic<Fp16> {
  using Acc = float;
  static float Load(Fp16 v) { return internal::HalfToFloat(v.bits); }
  static Fp16 Store(float v) { return {internal::FloatToHalf(v)}; }
};

// One step of the reduction, rounded to T. Integer sums and products wrap, as on a GPU.
template <typename T>
T Combine(T a, T b, ncclRedOp_t op) {
  using A = Arithmetic<T>;
  const typename A::Acc x = A::Load(a), y = A::Load(b);
  using Acc = typename A::Acc;
  if constexpr (std::is_integral_v<Acc>) {
    using U = std::make_unsigned_t<Acc>;
    if (op == ncclSum || op == ncclAvg)
      return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
    if (op == ncclProd) return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
  } else {
    if (op == ncclSum || op == ncclAvg) return A::Store(x + y);
    if (op == ncclProd) return A::Store(x * y);
  }
  if (op == ncclMax) return x < y ? b : a;
  return y < x ? b : a;  // ncclMin
}

// out[i] = in[0][i] op in[1][i] op ... in rank order, each step rounded to T. ncclAvg: floating
// types pre-multiply each input by 1/n (rounded to T) and sum, integers sum and then divide,
// as NCCL's PreMulSum and SumPostDiv do.
template <typename T>
void ReduceTyped(void* out, const std::vector<const void*>& in, size_t m, ncclRedOp_t op) {
  using A = Arithmetic<T>;
  using Acc = typename A::Acc;
  const int n = static_cast<int>(in.size());
  T* result = static_cast<T*>(out);
  const bool premultiply = op == ncclAvg && !std::is_integral_v<Acc>;
  const T scale = A::Store(static_cast<Acc>(1) / static_cast<Acc>(n));
  auto input = [&](int r, size_t i) {
    const T v = static_cast<const T*>(in[r])[i];
    return premultiply ? A::Store(A::Load(v) * A::Load(scale)) : v;
  };
  for (size_t i = 0; i < m; ++i) {
    T acc = input(0, i);
    for (int r = 1; r < n; ++r) acc = Combine(acc, input(r, i), op);
    if constexpr (std::is_integral_v<Acc>) {
      if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<Acc>(n));
    }
    result[i] = acc;
  }
}

void Reduce(void* out, const std::vector<const void*>& in, size_t m, ncclDataType_t type,
            ncclRedOp_t op) {
  switch (type) {
    case ncclInt8:
      return ReduceTyped<int8_t>(out, in, m, op);
    case ncclUint8:
      return ReduceTyped<uint8_t>(out, in, m, op);
    case ncclInt32:
      return ReduceTyped<int32_t>(out, in, m, op);
    case ncclUint32:
      return ReduceTyped<uint32_t>(out, in, m, op);
    case ncclInt64:
      return ReduceTyped<int64_t>(out, in, m, op);
    case ncclUint64:
      return ReduceTyped<uint64_t>(out, in, m, op);
    case ncclFloat16:
      return ReduceTyped<Fp16>(out, in, m, op);
    case ncclFloat32:
      return ReduceTyped<float>(out, in, m, op);
    case ncclFloat64:
      return ReduceTyped<double>(out, in, m, op);
    case ncclBfloat16:
      return ReduceTyped<Bf16>(out, in, m, op);
    default:
      return;  // refused by the argument checks
  }
}

// ---- The rendezvous in shared memory ----------------------------------------------------------

enum class Kind : int32_t { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kBroadcast:
      return "ncclBroadcast";
    case Kind::kReduce:
      return "ncclReduce";
    case Kind::kAllGather:
      return "ncclAllGather";
    case Kind::kReduceScatter:
      return "ncclReduceScatter";
  }
  return "?";
}

// What a rank runs: every rank of a communicator must run the same sequence of these.
struct CallRecord {
  uint64_t sequence;
  Kind kind;
  ncclDataType_t type;
  ncclRedOp_t op;
  int32_t root;
  uint64_t count;

  bool SameAs(const CallRecord& o) const {
    const bool reduces = kind != Kind::kBroadcast && kind != Kind::kAllGather;
    const bool rooted = kind == Kind::kBroadcast || kind == Kind::kReduce;
    return sequence == o.sequence && kind == o.kind && type == o.type && count == o.count &&
           (!reduces || op == o.op) && (!rooted || root == o.root);
  }
  std::string Describe() const {
    std::string text = std::string(KindName(kind)) + " #" + std::to_string(sequence) + " of " +
                       std::to_string(count) + " " + TypeName(type);
    if (kind != Kind::kBroadcast && kind != Kind::kAllGather) text += std::string(" ") + OpName(op);
    if (kind == Kind::kBroadcast || kind == Kind::kReduce) text += " root " + std::to_string(root);
    return text;
  }
};

// Lives in the mapping; all-zero is its initial state (a fresh shared-memory object is zeros),
// so no rank has to initialise it before the others open it.
struct RankState {
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> arrivals;  // barriers this rank has reached
  int32_t pid;
  int32_t device;
  CallRecord call;
};
struct Header {
  std::atomic<uint32_t> nranks;
  std::atomic<uint32_t> bell;  // a futex word: bumped at every arrival, abort and failure
  std::atomic<uint32_t> failed;
  char failure[512];  // the first failure's message (written under the `failed` exchange)
  RankState ranks[kMaxRanks];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");
constexpr size_t kHeaderBytes = (sizeof(Header) + 4095) / 4096 * 4096;
constexpr size_t kMappingBytes = kHeaderBytes + kMaxRanks * kSlotBytes;

void Ring(std::atomic<uint32_t>* bell) {
  bell->fetch_add(1, std::memory_order_acq_rel);
  // Not FUTEX_PRIVATE: the waiters may be in other processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(bell), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void WaitForBell(std::atomic<uint32_t>* bell, uint32_t seen) {
  struct timespec timeout = {0, 100 * 1000 * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(bell), FUTEX_WAIT, seen, &timeout, nullptr, 0);
}

// How long a rank waits for its peers before it fails, naming them: a GPU would hang forever.
std::chrono::seconds Timeout() {
  const char* text = std::getenv("TANDEM_CUDASIM_NCCL_TIMEOUT_S");
  const long seconds = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
  return std::chrono::seconds(seconds > 0 ? seconds : 300);
}

struct Mapping {
  Header* header = nullptr;
  std::string name;  // the shared-memory object's, empty for an anonymous mapping
  ~Mapping() {
    if (header != nullptr) munmap(header, kMappingBytes);
  }
  char* Slot(int rank) const {
    return reinterpret_cast<char*>(header) + kHeaderBytes + rank * kSlotBytes;
  }
};

std::string ShmName(const ncclUniqueId& id) {
  static const char kHex[] = "0123456789abcdef";
  std::string name = "/tandem-cudasim-nccl-";
  for (size_t i = sizeof(kIdMagic); i < sizeof(kIdMagic) + 16; ++i) {
    const unsigned char byte = static_cast<unsigned char>(id.internal[i]);
    name += kHex[byte >> 4];
    name += kHex[byte & 15];
  }
  return name;
}

// ---- Communicators ------------------------------------------------------------------------------

struct Call {
  CallRecord record;
  const void* send;
  void* recv;
};

// A rank's state, shared by its handle and the tasks it queued (a task may outlive
// ncclCommAbort's return).
struct RankComm {
  std::shared_ptr<Mapping> mapping;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  std::string name;       // "rank 1 of 2 on cuda:1"
  uint64_t issued = 0;    // host side: collectives issued
  uint32_t barriers = 0;  // stream side: barriers passed (tasks run one at a time)
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t finished = 0;  // collectives done (or abandoned) on the stream
  bool aborted = false;
  std::atomic<int> async_error{ncclSuccess};
  std::string failure;

  Header& header() const { return *mapping->header; }
};

}  // namespace
}  // namespace nccl
}  // namespace cudasim

struct ncclComm {
  std::shared_ptr<cudasim::nccl::RankComm> state;
};

namespace cudasim {
namespace nccl {
namespace {

std::mutex& LiveMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::set<ncclComm_t>& Live() {
  static std::set<ncclComm_t>* live = new std::set<ncclComm_t>;
  return *live;
}

// The communicator behind `comm`, or a failure naming the call.
ncclResult_t Resolve(ncclComm_t comm, const char* call, std::shared_ptr<RankComm>* state) {
  if (comm == nullptr) {
    return Fail(ncclInvalidArgument, std::string(call) +
                                         ": comm is NULL; pass a communicator "
                                         "from ncclCommInitRank/ncclCommInitAll");
  }
  std::lock_guard<std::mutex> lock(LiveMutex());
  if (Live().count(comm) == 0) {
    return Fail(ncclInvalidArgument, std::string(call) +
                                         ": comm is not a live communicator (destroyed or aborted "
                                         "already?)");
  }
  *state = comm->state;
  return ncclSuccess;
}

// Records `message` as the communicator's failure for every rank (the first one wins), and
// wakes every waiter so that the peers fail too instead of waiting for their timeout.
void FailEverywhere(RankComm& comm, const std::string& message) {
  Header& h = comm.header();
  uint32_t expected = 0;
  if (h.failed.compare_exchange_strong(expected, 1)) {
    std::snprintf(h.failure, sizeof(h.failure), "%s", message.c_str());
    h.failed.store(2, std::memory_order_release);
  }
  Ring(&h.bell);
}

std::string FailureOf(const Header& h) {
  // The failing rank writes its message between storing 1 and 2: wait out that short window
  // (bounded, in case that rank died inside it) so that the peers name the cause.
  for (int i = 0; i < 1000000 && h.failed.load(std::memory_order_acquire) == 1; ++i) {
    std::this_thread::yield();
  }
  return h.failed.load(std::memory_order_acquire) == 2 ? std::string(h.failure)
                                                       : std::string("a rank failed");
}

// Waits until every rank's arrival count (`joined`: its join flag) reaches `target`, failing on
// abort, on a peer's failure, or past the timeout, naming the ranks that did not arrive.
bool WaitForRanks(RankComm& comm, uint32_t target, bool joined, const std::string& what,
                  std::string* error) {
  Header& h = comm.header();
  const auto deadline = std::chrono::steady_clock::now() + Timeout();
  for (;;) {
    const uint32_t seen = h.bell.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(comm.mutex);
      if (comm.aborted) {
        *error = comm.name + ": " + what + " stopped: ncclCommAbort";
        return false;
      }
    }
    std::string missing;
    for (int r = 0; r < comm.nranks; ++r) {
      const RankState& s = h.ranks[r];
      const uint32_t have = joined ? s.joined.load(std::memory_order_acquire)
                                   : s.arrivals.load(std::memory_order_acquire);
      if (static_cast<int32_t>(have - target) < 0) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    // Once every rank has arrived, each goes on and finds a mismatch itself, in its own words;
    // a peer's failure stops only ranks that would otherwise wait for it.
    if (missing.empty()) return true;
    if (h.failed.load(std::memory_order_acquire) != 0) {
      *error = comm.name + ": " + what + " stopped: " + FailureOf(h);
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      *error = comm.name + ": " + what + ": rank(s) " + missing + " did not arrive within " +
               std::to_string(Timeout().count()) +
               " s (TANDEM_CUDASIM_NCCL_TIMEOUT_S); every rank must make the same calls in the "
               "same order";
      return false;
    }
    WaitForBell(&h.bell, seen);
  }
}

bool Barrier(RankComm& comm, const std::string& what, std::string* error) {
  ++comm.barriers;
  comm.header().ranks[comm.rank].arrivals.store(comm.barriers, std::memory_order_release);
  Ring(&comm.header().bell);
  return WaitForRanks(comm, comm.barriers, /*joined=*/false, what, error);
}

// ---- A collective, on the stream ---------------------------------------------------------------

// Elements per round: each rank's slot holds one round of its part (reduce-scatter: of all
// nranks destinations).
size_t RoundElements(const Call& call, int nranks) {
  const size_t size = TypeSize(call.record.type);
  const size_t per = call.record.kind == Kind::kReduceScatter ? size * nranks : size;
  return kSlotBytes / per;
}

bool RunCollective(RankComm& comm, const Call& call, std::string* error) {
  const CallRecord& rec = call.record;
  const size_t size = TypeSize(rec.type);
  const int n = comm.nranks;
  const int me = comm.rank;
  Header& h = comm.header();
  const std::string what = rec.Describe();
  const char* send = static_cast<const char*>(call.send);
  char* recv = static_cast<char*>(call.recv);
  const size_t step = RoundElements(call, n);
  h.ranks[me].call = rec;
  for (size_t offset = 0; offset < rec.count; offset += step) {
    const size_t m = std::min(step, rec.count - offset);
    const size_t bytes = m * size;
    char* mine = comm.mapping->Slot(me);
    switch (rec.kind) {
      case Kind::kBroadcast:
        if (me == rec.root) std::memcpy(mine, send + offset * size, bytes);
        break;
      case Kind::kReduceScatter:
        for (int d = 0; d < n; ++d) {
          std::memcpy(mine + d * bytes, send + (d * rec.count + offset) * size, bytes);
        }
        break;
      default:
        std::memcpy(mine, send + offset * size, bytes);
    }
    if (!Barrier(comm, what, error)) return false;
    if (offset == 0) {
      for (int r = 0; r < n; ++r) {
        const CallRecord& other = h.ranks[r].call;
        if (!other.SameAs(rec)) {
          *error = comm.name + " ran " + what + " but rank " + std::to_string(r) + " ran " +
                   other.Describe() +
                   " at the same point; every rank must make the same collective calls, with "
                   "the same count, type, operation and root, in the same order";
          return false;
        }
      }
    }
    std::vector<const void*> slots;
    for (int r = 0; r < n; ++r) slots.push_back(comm.mapping->Slot(r));
    switch (rec.kind) {
      case Kind::kBroadcast:
        std::memcpy(recv + offset * size, slots[rec.root], bytes);
        break;
      case Kind::kAllReduce:
        Reduce(recv + offset * size, slots, m, rec.type, rec.op);
        break;
      case Kind::kReduce:
        if (me == rec.root) Reduce(recv + offset * size, slots, m, rec.type, rec.op);
        break;
      case Kind::kAllGather:
        for (int r = 0; r < n; ++r) {
          std::memcpy(recv + (r * rec.count + offset) * size, slots[r], bytes);
        }
        break;
      case Kind::kReduceScatter:
        for (const void*& s : slots) s = static_cast<const char*>(s) + me * bytes;
        Reduce(recv + offset * size, slots, m, rec.type, rec.op);
        break;
    }
    if (!Barrier(comm, what, error)) return false;
  }
  return true;
}

// ncclCommCount, ncclCommCuDevice, ncclCommUserRank: one field of the communicator.
ncclResult_t Query(ncclComm_t comm, const char* call, const char* argument, int RankComm::*field,
                   int* out) {
  std::shared_ptr<RankComm> state;
  if (ncclResult_t r = Resolve(comm, call, &state); r != ncclSuccess) return r;
  if (out == nullptr) {
    return Fail(ncclInvalidArgument, std::string(call) + ": " + argument + " is NULL");
  }
  *out = (*state).*field;
  return ncclSuccess;
}

// ---- Group calls --------------------------------------------------------------------------------

// Inside ncclGroupStart/End, NCCL defers what it launches to ncclGroupEnd; so does this, and
// ncclCommInitRank's wait for its peers, which lets one thread create several ranks.
struct Group {
  int depth = 0;
  std::vector<std::function<void()>> launches;
  std::vector<std::shared_ptr<RankComm>> joining;
};
thread_local Group tls_group;

ncclResult_t WaitForJoin(RankComm& comm) {
  std::string error;
  if (!WaitForRanks(comm, 1, /*joined=*/true, "ncclCommInitRank", &error)) {
    return Fail(ncclSystemError, error);
  }
  Header& h = comm.header();
  // NCCL refuses two ranks on one GPU; each process here has GPUs of its own.
  for (int r = 0; r < comm.nranks; ++r) {
    if (r != comm.rank && h.ranks[r].pid == h.ranks[comm.rank].pid &&
        h.ranks[r].device == comm.device) {
      return Fail(ncclInvalidUsage,
                  "Duplicate GPU detected: " + comm.name + " and rank " + std::to_string(r) +
                      " are both on cuda:" + std::to_string(comm.device) + " of this process");
    }
  }
  // Every rank has opened the object: its name is no longer needed (the mappings stay).
  if (comm.rank == 0 && !comm.mapping->name.empty()) shm_unlink(comm.mapping->name.c_str());
  return ncclSuccess;
}

// ---- Creation -----------------------------------------------------------------------------------

ncclResult_t Join(std::shared_ptr<Mapping> mapping, int nranks, int rank, int device,
                  std::shared_ptr<RankComm>* out) {
  Header& h = *mapping->header;
  uint32_t expected = 0;
  if (!h.nranks.compare_exchange_strong(expected, static_cast<uint32_t>(nranks)) &&
      expected != static_cast<uint32_t>(nranks)) {
    return Fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                                         " says the communicator has " + std::to_string(nranks) +
                                         " ranks but another rank said " +
                                         std::to_string(expected));
  }
  RankState& s = h.ranks[rank];
  s.pid = static_cast<int32_t>(getpid());
  s.device = device;
  if (s.joined.exchange(1) != 0) {
    return Fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                                         " of this unique id joined twice; each rank number "
                                         "must be used once");
  }
  auto comm = std::make_shared<RankComm>();
  comm->mapping = std::move(mapping);
  comm->rank = rank;
  comm->nranks = nranks;
  comm->device = device;
  comm->name = "NCCL rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
               " on cuda:" + std::to_string(device);
  Ring(&h.bell);
  *out = std::move(comm);
  return ncclSuccess;
}

ncclComm_t Publish(std::shared_ptr<RankComm> state) {
  ncclComm_t comm = new ncclComm{std::move(state)};
  std::lock_guard<std::mutex> lock(LiveMutex());
  Live().insert(comm);
  return comm;
}

ncclResult_t CheckDevice(int device, const char* call) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    return Fail(ncclInvalidArgument, std::string(call) + ": cuda:" + std::to_string(device) +
                                         " is not a simulated device (there are " +
                                         std::to_string(count) + "; TANDEM_CUDASIM_DEVICES)");
  }
  return ncclSuccess;
}

// ---- Collectives: the checks, and the launch ----------------------------------------------------

// NCCL's pointer check: the buffer must be device memory of the communicator's device.
ncclResult_t CheckBuffer(const RankComm& comm, const void* ptr, size_t bytes, const char* call,
                         const char* role) {
  int device = -1;
  if (ptr == nullptr) {
    return Fail(ncclInvalidArgument,
                std::string(call) + ": " + role + " is NULL (" + comm.name + ")");
  }
  if (!internal::FindDeviceMemory(ptr, bytes, &device)) {
    return Fail(ncclInvalidArgument,
                std::string(call) + ": " + role + " " + std::to_string(bytes) + " bytes from " +
                    std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                    " is not inside one cudaMalloc block (host memory, freed memory, or a "
                    "count too large for the buffer?) (" +
                    comm.name + ")");
  }
  if (device != comm.device) {
    return Fail(ncclInvalidArgument,
                std::string(call) + ": " + role + " is memory of cuda:" + std::to_string(device) +
                    " but the communicator's " + "device is cuda:" + std::to_string(comm.device) +
                    " (" + comm.name + ")");
  }
  return ncclSuccess;
}

ncclResult_t Launch(ncclComm_t handle, Kind kind, const void* send, void* recv, size_t count,
                    ncclDataType_t type, ncclRedOp_t op, int root, cudaStream_t stream) {
  const char* call = KindName(kind);
  std::shared_ptr<RankComm> comm;
  if (ncclResult_t r = Resolve(handle, call, &comm); r != ncclSuccess) return r;
  const size_t size = TypeSize(type);
  if (size == 0) {
    return Fail(ncclInvalidArgument,
                std::string(call) + ": datatype " + std::to_string(static_cast<int>(type)) +
                    " is not one of the ncclDataType_t values cudasim simulates (int8, uint8, "
                    "int32, uint32, int64, uint64, float16, bfloat16, float32, float64)");
  }
  const bool reduces = kind != Kind::kBroadcast && kind != Kind::kAllGather;
  if (reduces && (static_cast<int>(op) < 0 || op >= ncclNumOps)) {
    return Fail(ncclInvalidArgument, std::string(call) + ": op " +
                                         std::to_string(static_cast<int>(op)) +
                                         " is not ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg");
  }
  const bool rooted = kind == Kind::kBroadcast || kind == Kind::kReduce;
  if (rooted && (root < 0 || root >= comm->nranks)) {
    return Fail(ncclInvalidArgument, std::string(call) + ": root " + std::to_string(root) +
                                         " is not a rank of the communicator (0 to " +
                                         std::to_string(comm->nranks - 1) + ")");
  }
  const size_t scale = kind == Kind::kAllGather || kind == Kind::kReduceScatter ? comm->nranks : 1;
  if (count > SIZE_MAX / size / scale) {
    return Fail(ncclInvalidArgument, std::string(call) + ": count " + std::to_string(count) +
                                         " overflows the buffer size");
  }
  // NCCL runs on the communicator's device: a null stream is that device's default stream.
  internal::Stream* s = nullptr;
  if (stream == nullptr) {
    int current = 0;
    cudaGetDevice(&current);
    cudaSetDevice(comm->device);
    s = internal::ResolveStream(nullptr);
    cudaSetDevice(current);
  } else {
    s = internal::ResolveStream(stream);
  }
  if (s == nullptr) {
    return Fail(ncclInvalidArgument, std::string(call) + ": stream is not a live CUDA stream");
  }
  if (s->device() != comm->device) {
    return Fail(ncclInvalidArgument, std::string(call) + ": stream is on cuda:" +
                                         std::to_string(s->device()) + " but " + comm->name);
  }
  if (internal::StickyError(comm->device) != cudaSuccess) {
    return Fail(ncclUnhandledCudaError, std::string(call) +
                                            ": cuda:" + std::to_string(comm->device) +
                                            " has failed already (a sticky CUDA error)");
  }
  const size_t bytes = count * size;
  if (count > 0) {
    const bool send_used = kind != Kind::kBroadcast || comm->rank == root;
    const bool recv_used = kind != Kind::kReduce || comm->rank == root;
    const size_t send_bytes = kind == Kind::kReduceScatter ? bytes * scale : bytes;
    const size_t recv_bytes = kind == Kind::kAllGather ? bytes * scale : bytes;
    if (send_used) {
      if (ncclResult_t r = CheckBuffer(*comm, send, send_bytes, call, "sendbuff"); r != ncclSuccess)
        return r;
    }
    if (recv_used) {
      if (ncclResult_t r = CheckBuffer(*comm, recv, recv_bytes, call, "recvbuff"); r != ncclSuccess)
        return r;
    }
  }
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (comm->aborted)
    return Fail(ncclInvalidUsage, std::string(call) + ": the communicator was aborted");
  // A zero count is a no-op that no peer waits for, as in NCCL.
  if (count == 0) return ncclSuccess;
  // Each collective takes its place in the communicator's order when issued, which a replay
  // would repeat: not simulated (a GPU's NCCL can be captured).
  if (s->capturing()) {
    return Fail(ncclInvalidUsage, std::string(call) +
                                      ": cudasim does not simulate NCCL collectives captured in a "
                                      "CUDA Graph");
  }
  Call c{{comm->issued++, kind, type, op, root, count}, send, recv};
  auto launch = [comm, c, s, call] {
    internal::CountLaunch(call, 0, 0);  // NCCL launches one kernel per collective
    s->Enqueue([comm, c] {
      // Tasks of one communicator run in the order issued, whichever streams they are on.
      bool aborted = false;
      {
        std::unique_lock<std::mutex> lock(comm->mutex);
        comm->changed.wait(lock,
                           [&] { return comm->aborted || comm->finished == c.record.sequence; });
        aborted = comm->aborted;
      }
      std::string error;
      const bool ok = !aborted && RunCollective(*comm, c, &error);
      {
        std::lock_guard<std::mutex> lock(comm->mutex);
        ++comm->finished;
        if (!ok && !comm->aborted) {
          comm->async_error = ncclSystemError;
          comm->failure = error;
        }
      }
      comm->changed.notify_all();
      if (!ok && !error.empty()) {
        FailEverywhere(*comm, error);
        internal::SetStickyError(comm->device, cudaErrorLaunchFailure, "cudasim NCCL: " + error);
      }
    });
  };
  if (tls_group.depth > 0) {
    tls_group.launches.push_back(std::move(launch));
  } else {
    launch();
  }
  return ncclSuccess;
}

}  // namespace
}  // namespace nccl
}  // namespace cudasim

using cudasim::nccl::Fail;
using cudasim::nccl::Kind;
using cudasim::nccl::Launch;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return Fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, cudasim::nccl::kIdMagic, sizeof(cudasim::nccl::kIdMagic));
  std::random_device random;
  for (size_t i = sizeof(cudasim::nccl::kIdMagic); i < sizeof(cudasim::nccl::kIdMagic) + 16; ++i) {
    id->internal[i] = static_cast<char>(random());
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  using namespace cudasim::nccl;
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || nranks > kMaxRanks) {
    return Fail(ncclInvalidArgument, "ncclCommInitRank: nranks is " + std::to_string(nranks) +
                                         "; cudasim simulates 1 to " + std::to_string(kMaxRanks));
  }
  if (rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) +
                                         " is not in [0, " + std::to_string(nranks) + ")");
  }
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0) {
    return Fail(ncclInvalidArgument,
                "ncclCommInitRank: the unique id did not come from ncclGetUniqueId (was rank 0's "
                "id sent to every rank before the call?)");
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return Fail(ncclUnhandledCudaError, "ncclCommInitRank: cudaGetDevice failed");
  }
  if (ncclResult_t r = CheckDevice(device, "ncclCommInitRank"); r != ncclSuccess) return r;
  auto mapping = std::make_shared<Mapping>();
  mapping->name = ShmName(id);
  const int fd = shm_open(mapping->name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) {
    return Fail(ncclSystemError, "ncclCommInitRank: shm_open(" + mapping->name +
                                     ") failed: " + std::strerror(errno) +
                                     " (cudasim's NCCL meets its peers in /dev/shm)");
  }
  // Every rank sets the same size: a fresh object is zeros, the header's initial state.
  void* memory = MAP_FAILED;
  if (ftruncate(fd, kMappingBytes) == 0) {
    memory = mmap(nullptr, kMappingBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int saved = errno;
  close(fd);
  if (memory == MAP_FAILED) {
    return Fail(ncclSystemError,
                "ncclCommInitRank: mapping " + mapping->name + " failed: " + std::strerror(saved));
  }
  mapping->header = static_cast<Header*>(memory);
  std::shared_ptr<RankComm> state;
  if (ncclResult_t r = Join(mapping, nranks, rank, device, &state); r != ncclSuccess) return r;
  if (tls_group.depth > 0) {
    tls_group.joining.push_back(state);
  } else if (ncclResult_t r = WaitForJoin(*state); r != ncclSuccess) {
    return r;
  }
  *comm = Publish(std::move(state));
  return ncclSuccess;
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  using namespace cudasim::nccl;
  if (comms == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1 || ndev > kMaxRanks) {
    return Fail(ncclInvalidArgument, "ncclCommInitAll: ndev is " + std::to_string(ndev) +
                                         "; cudasim simulates 1 to " + std::to_string(kMaxRanks));
  }
  std::vector<int> devices;
  for (int i = 0; i < ndev; ++i) {
    const int device = devlist != nullptr ? devlist[i] : i;
    if (ncclResult_t r = CheckDevice(device, "ncclCommInitAll"); r != ncclSuccess) return r;
    for (int j = 0; j < i; ++j) {
      if (devices[j] == device) {
        return Fail(ncclInvalidUsage, "ncclCommInitAll: Duplicate GPU detected: ranks " +
                                          std::to_string(j) + " and " + std::to_string(i) +
                                          " are both cuda:" + std::to_string(device));
      }
    }
    devices.push_back(device);
  }
  // One process: an anonymous mapping serves, and leaves nothing behind in /dev/shm.
  void* memory = mmap(nullptr, kMappingBytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory == MAP_FAILED) {
    return Fail(ncclSystemError,
                std::string("ncclCommInitAll: mmap failed: ") + std::strerror(errno));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->header = static_cast<Header*>(memory);
  for (int i = 0; i < ndev; ++i) {
    std::shared_ptr<RankComm> state;
    if (ncclResult_t r = Join(mapping, ndev, i, devices[i], &state); r != ncclSuccess) return r;
    comms[i] = Publish(std::move(state));
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++cudasim::nccl::tls_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  using namespace cudasim::nccl;
  Group& group = tls_group;
  if (group.depth == 0) {
    return Fail(ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
  }
  if (--group.depth > 0) return ncclSuccess;
  std::vector<std::shared_ptr<RankComm>> joining = std::move(group.joining);
  std::vector<std::function<void()>> launches = std::move(group.launches);
  group.joining.clear();
  group.launches.clear();
  ncclResult_t result = ncclSuccess;
  for (const auto& comm : joining) {
    if (ncclResult_t r = WaitForJoin(*comm); r != ncclSuccess && result == ncclSuccess) result = r;
  }
  for (auto& launch : launches) launch();
  return result;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  using namespace cudasim::nccl;
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  std::shared_ptr<RankComm> state;
  if (ncclResult_t r = Resolve(comm, "ncclCommDestroy", &state); r != ncclSuccess) return r;
  {
    // Like NCCL, destroying waits for the collectives already queued.
    std::unique_lock<std::mutex> lock(state->mutex);
    state->changed.wait(lock, [&] { return state->aborted || state->finished == state->issued; });
  }
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().erase(comm);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  using namespace cudasim::nccl;
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<RankComm> state;
  if (ncclResult_t r = Resolve(comm, "ncclCommAbort", &state); r != ncclSuccess) return r;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->aborted = true;
  }
  state->changed.notify_all();
  // Peers waiting for this rank fail with its name instead of timing out.
  FailEverywhere(*state, state->name + " called ncclCommAbort");
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().erase(comm);
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  using namespace cudasim::nccl;
  std::shared_ptr<RankComm> state;
  if (ncclResult_t r = Resolve(comm, "ncclCommGetAsyncError", &state); r != ncclSuccess) return r;
  if (async_error == nullptr) {
    return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  }
  *async_error = static_cast<ncclResult_t>(state->async_error.load());
  if (*async_error != ncclSuccess) {
    std::lock_guard<std::mutex> lock(state->mutex);
    tls_last_error = state->failure;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return cudasim::nccl::Query(comm, "ncclCommCount", "count", &cudasim::nccl::RankComm::nranks,
                              count);
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return cudasim::nccl::Query(comm, "ncclCommCuDevice", "device", &cudasim::nccl::RankComm::device,
                              device);
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return cudasim::nccl::Query(comm, "ncclCommUserRank", "rank", &cudasim::nccl::RankComm::rank,
                              rank);
}

// NCCL's own texts.
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return cudasim::nccl::tls_last_error.c_str(); }

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return Launch(comm, Kind::kReduce, sendbuff, recvbuff, count, datatype, op, root, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return Launch(comm, Kind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return Launch(comm, Kind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return Launch(comm, Kind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Launch(comm, Kind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0,
                stream);
}

}  // extern "C"
