#include "parallel/distributed/process_group_mpi.h"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "parallel/distributed/internal/hang_diagnosis.h"
#include "parallel/distributed/internal/mpi_calls.h"
#include "parallel/distributed/internal/work_queue.h"
#include "tensor/base/error.h"
#include "tensor/kernels/vectorized.h"

namespace tandem::parallel::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using internal::EnsureMpiInitialized;
using internal::MpiCallLock;
using internal::MpiErrorString;

// The most bytes of data one eager message of Open MPI's shared-memory transport carries: its
// eager limit less the headers it includes (kHeaderBytes, found by probing message sizes around
// the limit). The limit is Open MPI's default unless set for the job (`mpirun --mca
// btl_vader_eager_limit N`, or btl_sm_eager_limit from Open MPI 5, which mpirun passes on
// as OMPI_MCA_ variables). Read from the environment: asking MPI's tool interface (MPI_T)
// instead costs a noticeable fraction of a second per process, opening every component's
// parameters.
int64_t ReadEagerPieceBytes() {
  constexpr int64_t kHeaderBytes = 64;
  int64_t limit = 4096;
  for (const char* name : {"OMPI_MCA_btl_vader_eager_limit", "OMPI_MCA_btl_sm_eager_limit"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long long parsed = std::strtoll(value, &end, 10);
    if (end == value || parsed <= 0) continue;
    const char unit = static_cast<char>(std::tolower(static_cast<unsigned char>(*end)));
    limit = parsed * (unit == 'k' ? 1024 : unit == 'm' ? 1024 * 1024 : 1);
    break;
  }
  return std::max<int64_t>(limit - kHeaderBytes, 256);
}

// The MPI type that moves a dtype's elements. The 16-bit floats travel as their bits
// (MPI has no bfloat16 or float16): the all-reduce adds them itself, in float32.
MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case kFloat32:
      return MPI_FLOAT;
    case kFloat64:
      return MPI_DOUBLE;
    case kInt64:
      return MPI_INT64_T;
    case kInt32:
      return MPI_INT32_T;
    case kBFloat16:
    case kFloat16:
      return MPI_UINT16_T;
    case kBool:
    case kUInt8:
      return MPI_UINT8_T;
  }
  TANDEM_FAIL("ProcessGroupMpi: no MPI type for dtype ", DTypeName(dtype));
}

bool AllreduceSupports(DType dtype) {
  return dtype == kFloat32 || dtype == kFloat64 || dtype == kInt64 || dtype == kBFloat16 ||
         dtype == kFloat16;
}

// data[i] *= factor, in AVX2 lanes where the CPU has them (the same bits either way).
template <typename T>
TANDEM_VECTORIZE void ScaleLoop(T* __restrict data, T factor, int64_t n) {
  for (int64_t i = 0; i < n; ++i) data[i] *= factor;
}
template <typename T>
void Scale(T* data, T factor, int64_t n) {
  ::tandem::vec::Vectorized([&] { ScaleLoop(data, factor, n); });
}

std::string Elements(int64_t numel, DType dtype) {
  return tandem::internal::Concat(numel, " ", DTypeName(dtype), " elements");
}
std::string Elements(const Tensor& t) { return Elements(t.numel(), t.dtype()); }

}  // namespace

struct ProcessGroupMpi::Impl {
  // All-reduces below this many bytes use recursive doubling for a power-of-two number of
  // ranks: one exchange of the whole buffer per doubling, sent as pieces that each fit the
  // transport's eager limit (eager_piece_bytes), all in flight at once. An eager message is
  // copied through shared memory at once, where a larger one costs a rendezvous (a handshake,
  // then a single copy), so for small buffers doubling beats both the ring's steps and
  // MPI_Allreduce. From about 128 KB on the copies cost more than the handshakes, and the ring
  // (reduce-scatter, then all-gather), where every rank sends and adds only 1/size of the
  // buffer per step, is as fast or faster. The crossover is measured by
  // parallel/distributed/distributed_benchmark (figures in README.md's benchmark table).
  static constexpr int64_t kRingMinBytes = 128 << 10;
  // The ring's reduce-scatter moves a block in pieces of at most this many bytes, the next
  // one in flight while the last is added, so that its receive buffer (two pieces) stays
  // bounded. Each piece costs a rendezvous, so pieces must be large: with 512 KB ones the
  // all-reduce fell behind MPI_Allreduce on multi-megabyte buffers, where 4 MB pieces keep up
  // with it (parallel/distributed/distributed_benchmark).
  static constexpr int64_t kRingPieceBytes = 4 << 20;
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
  // spins as a caller would (WorkQueue::MaySpin).
  static constexpr std::chrono::microseconds kGroupThreadSpinFor{50};

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  ProcessGroupMpiOptions options;
  std::string prefix;             // "ProcessGroupMpi rank 0 of 2: "
  int64_t eager_piece_bytes = 0;  // see ReadEagerPieceBytes()

  // Runs the collectives in issue order, on the group's thread or a waiting caller's.
  std::unique_ptr<internal::WorkQueue> queue;
  std::vector<char> scratch;          // the running all-reduce's receive buffer
  std::vector<MPI_Request> requests;  // the running exchange's

  // Names the ranks that did not answer when a collective times out (see Await).
  std::unique_ptr<internal::HangDiagnosis> diagnosis;
  // All-reduce and reduce-scatter messages carry a tag of the sender's element count (modulo
  // this), dtype, op and collective.
  int64_t tag_count_modulus = 1;
  std::vector<float> sums;           // the running 16-bit reduce-scatter's float32 sums
  std::vector<MPI_Status> statuses;  // the running exchange's

  // A collective that has waited this long also looks, at every 16th poll, for other ranks'
  // questions and for wrongly tagged messages among its pending receives (one MPI_Test and
  // one MPI_Request_get_status per pending receive, beside the poll's own MPI_Testall); one
  // that finishes sooner pays for neither.
  static constexpr std::chrono::milliseconds kDiagnoseAfter{1};
  // How long a rank whose collective timed out waits for the others to answer (at most the
  // timeout): a rank waiting in a collective answers within a few milliseconds.
  static constexpr std::chrono::seconds kAnswerWait{1};

  // Checks an MPI return code.
  void Check(int rc, const char* call, const Work& work) const {
    if (rc != MPI_SUCCESS) {
      TANDEM_FAIL(prefix, work.description(), " failed: ", call, ": ", MpiErrorString(rc));
    }
  }

  // The tag of an all-reduce's, reduce-scatter's or all-gather's messages: its element count
  // (a reduce-scatter's and an all-gather's per rank; modulo tag_count_modulus, 2^25 with Open
  // MPI's tags: an error shows larger counts modulo that), collective (bits 4-5: Kind), op
  // (bit 3) and dtype (bits 0-2: DType's value), so that a receiver can tell a message of a
  // collective that differs from its own.
  enum Kind { kAllreduceKind = 0, kReduceScatterKind = 1, kAllgatherKind = 2 };
  static constexpr int kTagDTypeMask = 7;
  static constexpr int kTagAverageBit = 8;
  static constexpr int kTagKindShift = 4;
  static constexpr int kTagCountFactor = 64;
  int Tag(Kind kind, int64_t numel, DType dtype, ReduceOp op) const {
    static_assert(kNumDTypes <= kTagDTypeMask + 1, "the tag has 3 bits for the dtype");
    return static_cast<int>(
        (numel % tag_count_modulus) * kTagCountFactor + (kind << kTagKindShift) +
        (op == ReduceOp::kAverage ? kTagAverageBit : 0) + static_cast<int>(dtype));
  }
  int AllreduceTag(int64_t numel, DType dtype, ReduceOp op) const {
    return Tag(kAllreduceKind, numel, dtype, op);
  }
  int ReduceScatterTag(int64_t numel_per_rank, DType dtype, ReduceOp op) const {
    return Tag(kReduceScatterKind, numel_per_rank, dtype, op);
  }
  int AllgatherTag(int64_t numel_per_rank, DType dtype) const {
    return Tag(kAllgatherKind, numel_per_rank, dtype, ReduceOp::kSum);
  }

  static Kind TagKind(int tag) { return static_cast<Kind>((tag >> kTagKindShift) & 3); }
  static const char* KindName(Kind kind) {
    return kind == kReduceScatterKind ? "reduce-scatter"
           : kind == kAllgatherKind   ? "all-gather"
                                      : "all-reduce";
  }

  std::string DescribeTag(int tag) const {
    const Kind kind = TagKind(tag);
    return tandem::internal::Concat(
        tag / kTagCountFactor, " ", DTypeName(static_cast<DType>(tag & kTagDTypeMask)),
        kind == kAllreduceKind ? " elements" : " elements per rank",
        kind == kAllgatherKind ? "" : ((tag & kTagAverageBit) ? " (average)" : " (sum)"));
  }

  // Throws the error for a message of a different collective (its tag, `received`, is not
  // `tag`): what each side has, after letting go of the pending requests.
  [[noreturn]] void FailMismatch(const MPI_Status& received, int tag, MPI_Request* requests,
                                 int count, const Work& work) {
    Abandon(requests, count, /*point_to_point=*/true);
    const int peer_tag = received.MPI_TAG;
    const Kind kind = TagKind(tag);
    const Kind peer_kind = TagKind(peer_tag);
    if (kind != peer_kind) {
      TANDEM_FAIL(prefix, work.description(), " failed: the ranks run different collectives: rank ",
                  rank, " (this rank) runs ", kind == kReduceScatterKind ? "a " : "an ",
                  KindName(kind), " of ", DescribeTag(tag), ", rank ", received.MPI_SOURCE,
                  " sent a message of ", peer_kind == kReduceScatterKind ? "a " : "an ",
                  KindName(peer_kind), " of ", DescribeTag(peer_tag),
                  "; every rank must issue the same collectives in the same order");
    }
    const char* what = peer_tag / kTagCountFactor == tag / kTagCountFactor
                           ? ((peer_tag & kTagDTypeMask) != (tag & kTagDTypeMask) ? "dtype" : "op")
                           : "size";
    TANDEM_FAIL(prefix, work.description(), " failed: the ranks disagree on the ", what, " of the ",
                KindName(kind), ": rank ", rank, " (this rank) has ", DescribeTag(tag), ", rank ",
                received.MPI_SOURCE, " sent ", DescribeTag(peer_tag),
                kind == kReduceScatterKind ? "; every rank must reduce_scatter tensors of the same "
                                             "size and dtype with the same op"
                : kind == kAllgatherKind
                    ? "; every rank must all-gather an input of the same size and dtype"
                    : "; every rank must all-reduce a tensor of the same size and dtype with the "
                      "same op");
  }

  // After MPI_Testall failed with `rc`: names the cause from the statuses (a message of a
  // different all-reduce or reduce-scatter among the first `receives`, or the first request's
  // own error).
  [[noreturn]] void FailFromStatuses(int rc, MPI_Request* requests, int count, int receives,
                                     int tag, const Work& work) {
    if (rc == MPI_ERR_IN_STATUS) {
      for (int i = 0; i < receives; ++i) {
        const int error = statuses[i].MPI_ERROR;
        if ((error == MPI_SUCCESS || error == MPI_ERR_TRUNCATE) && statuses[i].MPI_TAG != tag) {
          FailMismatch(statuses[i], tag, requests, count, work);
        }
      }
      for (int i = 0; i < count; ++i) {
        const int error = statuses[i].MPI_ERROR;
        if (error == MPI_SUCCESS || error == MPI_ERR_PENDING) continue;
        Abandon(requests, count, receives >= 0);
        TANDEM_FAIL(prefix, work.description(), " failed: MPI_Testall: ", MpiErrorString(error),
                    (error == MPI_ERR_TRUNCATE
                         ? ": a peer sent more than this rank expects; every rank must pass "
                           "tensors of the same size and dtype"
                         : ""));
      }
    }
    Abandon(requests, count, receives >= 0);
    TANDEM_FAIL(prefix, work.description(), " failed: MPI_Testall: ", MpiErrorString(rc));
  }

  // Polls `requests` until all have completed or `deadline` passes: spins for kSpinFor, then
  // sleeps kPollSleep between polls, and 200 us once 200 ms have passed (a peer far behind
  // should not cost a core). `receives` is -1 for a non-blocking collective's requests; for
  // point-to-point ones, the first `receives` requests are receives of an all-reduce's
  // messages, tagged `tag` (AllreduceTag): one with another tag comes from a rank that runs
  // another all-reduce, an error naming both (checked once they have completed, and from
  // kDiagnoseAfter on while they have not, since a rank with fewer messages leaves some
  // receives pending). From then on the wait also answers other ranks' questions (see
  // AskWhoWaits). On timeout, cancels the pending receives (so that nothing writes into the
  // buffers later), asks the others which collective they wait in, and throws, naming them.
  void Await(MPI_Request* requests, int count, Clock::time_point deadline, const Work& work,
             int receives = -1, int tag = 0) {
    if (statuses.size() < static_cast<size_t>(count)) statuses.resize(count);
    // The clock is read every 16 polls only, from the 16th on: most exchanges of a small
    // all-reduce are over before that.
    Clock::time_point start;
    Clock::duration waited{};
    for (int64_t polls = 1;; ++polls) {
      int done = 0;
      int rc;
      {
        MpiCallLock lock;
        rc = MPI_Testall(count, requests, &done, statuses.data());
      }
      if (rc != MPI_SUCCESS) FailFromStatuses(rc, requests, count, receives, tag, work);
      if (done) {
        for (int i = 0; i < receives; ++i) {
          if (statuses[i].MPI_TAG != tag) FailMismatch(statuses[i], tag, requests, count, work);
        }
        return;
      }
      if ((polls & 15) == 0) {
        const Clock::time_point now = Clock::now();
        if (polls == 16) start = now;
        waited = now - start;
        if (waited > kDiagnoseAfter) {
          diagnosis->AnswerQuestions(queue->started_count(), work.description());
          for (int i = 0; i < receives; ++i) {
            if (requests[i] == MPI_REQUEST_NULL) continue;
            int arrived = 0;
            MPI_Status status;
            {
              MpiCallLock lock;
              MPI_Request_get_status(requests[i], &arrived, &status);
            }
            if (arrived && status.MPI_TAG != tag) {
              FailMismatch(status, tag, requests, count, work);
            }
          }
        }
        if (now > deadline) {
          Abandon(requests, count, receives >= 0);
          const std::string who_waits =
              diagnosis->AskWhoWaits(queue->started_count(), work.description(),
                                     std::min<Clock::duration>(kAnswerWait, options.timeout()));
          TANDEM_FAIL(internal::TimeoutMessage(prefix, work.description(), options.timeout(),
                                               options.timeout_name(), who_waits));
        }
      }
      if (waited > std::chrono::milliseconds(200)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      } else if (waited > (!queue->MaySpin() ? Clock::duration(kGroupThreadSpinFor)
                                             : Clock::duration(kSpinFor))) {
        std::this_thread::sleep_for(kPollSleep);
      }
    }
  }

  // Gives up on requests after a timeout or an error. A receive is cancelled; a send may be
  // too late to cancel. A non-blocking collective's request can be neither cancelled nor
  // freed (MPI forbids both): it is left pending. The scratch buffer is let go without being
  // freed, since a receive that had already matched may still write into it; the group is
  // unusable from now on anyway.
  void Abandon(MPI_Request* requests, int count, bool point_to_point) {
    MpiCallLock lock;
    for (int i = 0; point_to_point && i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&requests[i]);
      MPI_Request_free(&requests[i]);
    }
    new std::vector<char>(std::move(scratch));  // deliberately leaked, see above
  }

  // Sends `send_count` elements to `to` and receives `receive_count` from `from`, both at once
  // (as MPI_Sendrecv), as messages of at most `piece` elements that are all in flight
  // together, tagged `tag`, waiting until all have finished or the deadline has passed.
  template <typename T>
  void Exchange(const T* send, int64_t send_count, int to, T* receive, int64_t receive_count,
                int from, int64_t piece, int tag, Clock::time_point deadline, const Work& work) {
    requests.resize((receive_count + piece - 1) / piece + (send_count + piece - 1) / piece);
    const int receives =
        Post(send, send_count, to, receive, receive_count, from, piece, tag, requests.data(), work);
    Await(requests.data(), static_cast<int>(requests.size()), deadline, work, receives, tag);
  }

  // Exchange's first half: posts the receives, then the sends, each message's request into
  // `requests` (receives first; room for both counts divided by `piece`, rounded up). Sends
  // carry `tag`; the receives take any tag, for Await to check. Returns how many receives.
  template <typename T>
  int Post(const T* send, int64_t send_count, int to, T* receive, int64_t receive_count, int from,
           int64_t piece, int tag, MPI_Request* requests, const Work& work) {
    // Nothing is sent or received for an empty part: the peer skips it alike.
    const int64_t receives = (receive_count + piece - 1) / piece;
    const int64_t sends = (send_count + piece - 1) / piece;
    const MPI_Datatype type = MpiType(DTypeOf<T>::value);
    MpiCallLock lock;
    // Receives first, so that each message finds its receive posted when it arrives.
    for (int64_t k = 0; k < receives; ++k) {
      const int64_t offset = k * piece;
      const int n = static_cast<int>(std::min(piece, receive_count - offset));
      Check(MPI_Irecv(receive + offset, n, type, from, MPI_ANY_TAG, comm, &requests[k]),
            "MPI_Irecv", work);
    }
    for (int64_t k = 0; k < sends; ++k) {
      const int64_t offset = k * piece;
      const int n = static_cast<int>(std::min(piece, send_count - offset));
      Check(MPI_Isend(send + offset, n, type, to, tag, comm, &requests[receives + k]), "MPI_Isend",
            work);
    }
    return static_cast<int>(receives);
  }

  // Sums `count` elements at `data` over the ranks in place, times `factor` (1 / size for an
  // average), over non-blocking point-to-point messages (see kRingMinBytes): the same
  // algorithms as Open MPI's tuned blocking MPI_Allreduce, but with a deadline (its
  // non-blocking MPI_Iallreduce is libnbc's, several times slower on one machine, and moves
  // only when polled). Every rank ends with bit-identical results: recursive doubling adds the
  // same two halves on both sides of each exchange, and the ring has one rank add and scale
  // each block and copy it to the others (so the ring scales 1/size of the buffer per rank).
  template <typename T>
  void Allreduce(T* data, int64_t count, T factor, int tag, Clock::time_point deadline,
                 const Work& work) {
    if (size == 1 || count == 0) return;
    const int64_t bytes = count * static_cast<int64_t>(sizeof(T));
    if ((size & (size - 1)) == 0 && bytes < kRingMinBytes) {
      if (scratch.size() < static_cast<size_t>(bytes)) scratch.resize(bytes);
      T* received = reinterpret_cast<T*>(scratch.data());
      // Pieces of equal size (4 KB as two of 2 KB, not 4032 + 64 bytes).
      const int64_t largest = std::max<int64_t>(1, eager_piece_bytes / sizeof(T));
      const int64_t pieces = (count + largest - 1) / largest;
      const int64_t piece = (count + pieces - 1) / pieces;
      for (int mask = 1; mask < size; mask <<= 1) {
        const int peer = rank ^ mask;
        Exchange(data, count, peer, received, count, peer, piece, tag, deadline, work);
        ::tandem::vec::AddInto(data, received, count);
      }
      if (factor != T{1}) Scale(data, factor, count);
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
    const int64_t slot = std::min(piece, largest_block);
    if (scratch.size() < 2 * slot * sizeof(T)) scratch.resize(2 * slot * sizeof(T));
    T* const slots[2] = {reinterpret_cast<T*>(scratch.data()),
                         reinterpret_cast<T*>(scratch.data()) + slot};
    for (int step = 0; step < size - 1; ++step) {
      const int out = mod(rank - step);
      const int in = mod(rank - step - 1);
      const int64_t out_size = begin(out + 1) - begin(out);
      const int64_t in_size = begin(in + 1) - begin(in);
      // Both neighbours cut a block into pieces the same way, so piece k of `out` meets piece
      // k of the right neighbour's `in` (the same block).
      // Piece k + 1 is posted before piece k is added: the neighbour copies it out of this
      // rank's memory meanwhile (on one machine the receiver makes the copy), instead of
      // both ranks first adding, then copying.
      const int64_t pieces = (std::max(out_size, in_size) + piece - 1) / piece;
      MPI_Request pending[2][2];
      int pending_receives[2] = {0, 0};
      auto post = [&](int64_t k) {
        const int64_t offset = k * piece;
        std::fill_n(pending[k & 1], 2, MPI_REQUEST_NULL);
        pending_receives[k & 1] =
            Post(data + begin(out) + offset, std::clamp<int64_t>(out_size - offset, 0, piece),
                 right, slots[k & 1], std::clamp<int64_t>(in_size - offset, 0, piece), left, piece,
                 tag, pending[k & 1], work);
      };
      if (pieces > 0) post(0);
      for (int64_t k = 0; k < pieces; ++k) {
        Await(pending[k & 1], 2, deadline, work, pending_receives[k & 1], tag);
        if (k + 1 < pieces) post(k + 1);
        const int64_t offset = k * piece;
        ::tandem::vec::AddInto(data + begin(in) + offset, slots[k & 1],
                               std::clamp<int64_t>(in_size - offset, 0, piece));
      }
    }
    if (factor != T{1}) {
      const int summed = mod(rank + 1);
      Scale(data + begin(summed), factor, begin(summed + 1) - begin(summed));
    }
    for (int step = 0; step < size - 1; ++step) {
      const int out = mod(rank + 1 - step);
      const int in = mod(rank - step);
      const int64_t whole = std::max(largest_block, int64_t{1});
      Exchange(data + begin(out), begin(out + 1) - begin(out), right, data + begin(in),
               begin(in + 1) - begin(in), left, whole, tag, deadline, work);
    }
  }

  // The all-reduce of bfloat16 and float16 (DistributedDataParallel's gradient compression):
  // 2-byte elements on the wire, sums in float32. The ring and recursive doubling above pass
  // partial sums along, which in a 16-bit type would be rounded at every hop (as NCCL's
  // bfloat16 ring does); here each rank owns one block of the buffer instead. Reduce-scatter as
  // one all-to-all: every rank sends each peer the peer's block (the same bytes per rank as the
  // ring's, (size - 1) / size of the buffer), and the owner adds the size contributions in
  // float32, in rank order, times `factor`, and rounds once. Then all-gather: the owner sends
  // its block to every peer. Every rank gets the same bits, round(factor * (x_0 + ... +
  // x_{size-1})) with the sum in float32, for any world size.
  template <typename T>
  void AllreduceInFloat(T* data, int64_t count, float factor, int tag, Clock::time_point deadline,
                        const Work& work) {
    if (size == 1 || count == 0) return;  // factor is 1 / 1
    auto begin = [&](int block) { return count * block / size; };
    auto length = [&](int block) { return begin(block + 1) - begin(block); };
    const int64_t mine = length(rank);
    T* const own = data + begin(rank);
    const int64_t piece = std::max<int64_t>(1, kRingPieceBytes / static_cast<int64_t>(sizeof(T)));
    auto messages = [&](int64_t n) { return (n + piece - 1) / piece; };
    // Peer r's contribution to this rank's block lands in slot r (this rank's slot is unused).
    if (scratch.size() < static_cast<size_t>(size * mine) * sizeof(T))
      scratch.resize(static_cast<size_t>(size * mine) * sizeof(T));
    T* const slots = reinterpret_cast<T*>(scratch.data());

    // Reduce-scatter: the receives first (Await checks their tags), then the sends.
    int64_t total = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) total += messages(mine) + messages(length(peer));
    }
    requests.assign(static_cast<size_t>(total), MPI_REQUEST_NULL);
    int posted = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      posted += Post<T>(nullptr, 0, peer, slots + peer * mine, mine, peer, piece, tag,
                        requests.data() + posted, work);
    }
    const int receives = posted;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      Post<T>(data + begin(peer), length(peer), peer, nullptr, 0, peer, piece, tag,
              requests.data() + posted, work);
      posted += static_cast<int>(messages(length(peer)));
    }
    Await(requests.data(), posted, deadline, work, receives, tag);
    std::vector<float> sum(static_cast<size_t>(mine), 0.0f);
    for (int r = 0; r < size; ++r) {
      const T* in = r == rank ? own : slots + r * mine;
      for (int64_t i = 0; i < mine; ++i) sum[i] += static_cast<float>(in[i]);
    }
    for (int64_t i = 0; i < mine; ++i) own[i] = T(sum[i] * factor);

    // All-gather: every block from its owner.
    total = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) total += messages(length(peer)) + messages(mine);
    }
    requests.assign(static_cast<size_t>(total), MPI_REQUEST_NULL);
    posted = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      posted += Post<T>(nullptr, 0, peer, data + begin(peer), length(peer), peer, piece, tag,
                        requests.data() + posted, work);
    }
    const int gathers = posted;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      Post<T>(own, mine, peer, nullptr, 0, peer, piece, tag, requests.data() + posted, work);
      posted += static_cast<int>(messages(mine));
    }
    Await(requests.data(), posted, deadline, work, gathers, tag);
  }

  // Reduce-scatter of `chunk` elements per rank: `output` = factor * (chunk `rank` of every
  // rank's `input`, summed in rank order). One all-to-all: each rank sends every peer the
  // peer's chunk and adds the size contributions to its own, in `Acc` (float32 for bfloat16
  // and float16, rounded once, as AllreduceInFloat; the dtype itself otherwise). So the result
  // is the plain sum in rank order (not always allreduce's bits: its ring adds each block in a
  // rotated order), and the bytes each rank sends are the ring's, (size - 1) / size of the
  // input, in one round of latency instead of size - 1. The chunk goes
  // in windows of at most kRingPieceBytes (and max_elements_per_call) elements, the next
  // window's messages in flight while the last is added, so that the receive buffer stays at two
  // windows from each peer. The messages carry ReduceScatterTag, which Await checks.
  template <typename T, typename Acc>
  void ReduceScatter(const T* input, T* output, int64_t chunk, Acc factor, int tag,
                     Clock::time_point deadline, const Work& work) {
    if (chunk == 0) return;
    const int peers = size - 1;
    const int64_t window =
        std::max<int64_t>(1, std::min<int64_t>(kRingPieceBytes / static_cast<int64_t>(sizeof(T)),
                                               options.max_elements_per_call()));
    const int64_t slot = std::min(window, chunk);
    const size_t scratch_bytes = static_cast<size_t>(2 * peers * slot) * sizeof(T);
    if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
    T* const slots[2] = {reinterpret_cast<T*>(scratch.data()),
                         reinterpret_cast<T*>(scratch.data()) + peers * slot};
    // Peer `rank + j` receives first from this rank, and this rank from `rank - j`, so that the
    // ranks do not all send to rank 0 first. Its contribution lands in slot j - 1.
    auto peer_to = [&](int j) { return (rank + j) % size; };
    auto peer_from = [&](int j) { return (rank - j + size) % size; };
    const MPI_Datatype type = MpiType(DTypeOf<T>::value);
    const int64_t windows = (chunk + window - 1) / window;
    // Window k's requests (receives first, as Await wants them) at (k & 1) * 2 * peers.
    requests.assign(static_cast<size_t>(4 * peers), MPI_REQUEST_NULL);
    auto post = [&](int64_t k) {
      const int64_t offset = k * window;
      const int m = static_cast<int>(std::min(window, chunk - offset));
      MPI_Request* posted = requests.data() + (k & 1) * 2 * peers;
      MpiCallLock lock;
      for (int j = 1; j <= peers; ++j) {
        Check(MPI_Irecv(slots[k & 1] + (j - 1) * slot, m, type, peer_from(j), MPI_ANY_TAG, comm,
                        &posted[j - 1]),
              "MPI_Irecv", work);
      }
      for (int j = 1; j <= peers; ++j) {
        Check(MPI_Isend(input + peer_to(j) * chunk + offset, m, type, peer_to(j), tag, comm,
                        &posted[peers + j - 1]),
              "MPI_Isend", work);
      }
    };
    std::vector<const T*> parts(static_cast<size_t>(size));
    if (peers > 0) post(0);
    for (int64_t k = 0; k < windows; ++k) {
      const int64_t offset = k * window;
      const int64_t m = std::min(window, chunk - offset);
      if (peers > 0) {
        Await(requests.data() + (k & 1) * 2 * peers, 2 * peers, deadline, work, peers, tag);
        if (k + 1 < windows) post(k + 1);
      }
      parts[rank] = input + rank * chunk + offset;
      for (int j = 1; j <= peers; ++j) parts[peer_from(j)] = slots[k & 1] + (j - 1) * slot;
      T* const out = output + offset;
      if constexpr (std::is_same_v<T, Acc>) {
        std::copy_n(parts[0], m, out);
        for (int r = 1; r < size; ++r) ::tandem::vec::AddInto(out, parts[r], m);
        if (factor != Acc{1}) Scale(out, factor, m);
      } else {
        sums.assign(static_cast<size_t>(m), 0.0f);
        for (int r = 0; r < size; ++r) {
          const T* in = parts[r];
          for (int64_t i = 0; i < m; ++i) sums[i] += static_cast<float>(in[i]);
        }
        for (int64_t i = 0; i < m; ++i) out[i] = T(sums[i] * factor);
      }
    }
  }

  // All-gather of `n` elements of `element` bytes per rank: rank r's `input` lands at
  // output[r * n]. One all-to-all straight into `output` (each rank sends its input to every
  // peer: the ring's bytes, in one round of latency), in windows of at most kRingPieceBytes (and
  // max_elements_per_call) elements, two windows in flight. Unlike MPI_Iallgather (libnbc), whose
  // error on a peer's longer message aborts the job and which takes a shorter one silently, the
  // messages carry AllgatherTag, which Await checks: ranks that disagree fail naming both sides.
  void Allgather(const char* input, char* output, int64_t n, DType dtype, int tag,
                 Clock::time_point deadline, const Work& work) {
    if (n == 0) return;
    const size_t element = ElementSize(dtype);
    std::memcpy(output + rank * n * element, input, n * element);
    const int peers = size - 1;
    if (peers == 0) return;
    const int64_t window =
        std::max<int64_t>(1, std::min<int64_t>(kRingPieceBytes / static_cast<int64_t>(element),
                                               options.max_elements_per_call()));
    auto peer_to = [&](int j) { return (rank + j) % size; };
    auto peer_from = [&](int j) { return (rank - j + size) % size; };
    const MPI_Datatype type = MpiType(dtype);
    const int64_t windows = (n + window - 1) / window;
    requests.assign(static_cast<size_t>(4 * peers), MPI_REQUEST_NULL);
    auto post = [&](int64_t k) {
      const int64_t offset = k * window;
      const int m = static_cast<int>(std::min(window, n - offset));
      MPI_Request* posted = requests.data() + (k & 1) * 2 * peers;
      MpiCallLock lock;
      for (int j = 1; j <= peers; ++j) {
        Check(MPI_Irecv(output + (peer_from(j) * n + offset) * element, m, type, peer_from(j),
                        MPI_ANY_TAG, comm, &posted[j - 1]),
              "MPI_Irecv", work);
      }
      for (int j = 1; j <= peers; ++j) {
        Check(MPI_Isend(input + offset * element, m, type, peer_to(j), tag, comm,
                        &posted[peers + j - 1]),
              "MPI_Isend", work);
      }
    };
    post(0);
    if (windows > 1) post(1);
    for (int64_t k = 0; k < windows; ++k) {
      Await(requests.data() + (k & 1) * 2 * peers, 2 * peers, deadline, work, peers, tag);
      if (k + 2 < windows) post(k + 2);
    }
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
        TANDEM_CHECK(options.timeout().count() > 0,
                     "ProcessGroupMpi: the timeout must be positive but is ",
                     options.timeout().count(), " ms");
        TANDEM_CHECK(
            options.max_elements_per_call() >= 1 && options.max_elements_per_call() <= INT_MAX,
            "ProcessGroupMpi: max_elements_per_call must be in [1, ", INT_MAX, "] but is ",
            options.max_elements_per_call());
        EnsureMpiInitialized();
        auto impl = std::make_unique<Impl>();
        impl->options = options;
        impl->eager_piece_bytes = ReadEagerPieceBytes();
        {
          MpiCallLock lock;
          const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &impl->comm);
          TANDEM_CHECK(rc == MPI_SUCCESS, "ProcessGroupMpi: MPI_Comm_dup(MPI_COMM_WORLD) failed: ",
                       MpiErrorString(rc));
          MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
          MPI_Comm_rank(impl->comm, &impl->rank);
          MPI_Comm_size(impl->comm, &impl->size);
        }
        impl->diagnosis = std::make_unique<internal::HangDiagnosis>("ProcessGroupMpi");
        MpiCallLock lock;
        int* tag_ub = nullptr;
        int has_tag_ub = 0;
        MPI_Comm_get_attr(impl->comm, MPI_TAG_UB, &tag_ub, &has_tag_ub);
        // MPI guarantees tags up to 32767 at least; Open MPI allows 2^31 - 1 (counts mod 2^27).
        const int64_t largest_tag = has_tag_ub && tag_ub != nullptr ? *tag_ub : 32767;
        impl->tag_count_modulus = std::max<int64_t>(
            1, (largest_tag - (Impl::kTagCountFactor - 1)) / Impl::kTagCountFactor + 1);
        impl->prefix =
            tandem::internal::Concat("ProcessGroupMpi rank ", impl->rank, " of ", impl->size, ": ");
        return impl;
      }()) {}

ProcessGroupMpi::ProcessGroupMpi(ProcessGroupMpiOptions options, std::unique_ptr<Impl> impl)
    : ProcessGroup(impl->rank, impl->size), options_(options), impl_(std::move(impl)) {
  impl_->queue = std::make_unique<internal::WorkQueue>(
      "ProcessGroupMpi rank " + std::to_string(impl_->rank) + " thread", impl_->prefix,
      options_.timeout());
}

ProcessGroupMpi::~ProcessGroupMpi() {
  impl_->queue->Stop();
  // After a failure a request may still be pending on the communicators: leave them be.
  if (!impl_->queue->failure().empty()) {
    impl_->diagnosis->Abandon();
    return;
  }
  impl_->diagnosis.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MpiCallLock lock;
    MPI_Comm_free(&impl_->comm);
  }
}

std::shared_ptr<Work> ProcessGroupMpi::allreduce(Tensor tensor, ReduceOp op) {
  Impl& impl = *impl_;
  impl.CheckTensor(tensor, "allreduce", "");
  TANDEM_CHECK(AllreduceSupports(tensor.dtype()), impl.prefix,
               "allreduce takes float32, float64, int64, bfloat16 or float16 tensors but this one "
               "is ",
               tensor.dtype(), "; convert it with .to(dtype) (and back afterwards)");
  TANDEM_CHECK(op != ReduceOp::kAverage || IsFloatingPoint(tensor.dtype()), impl.prefix,
               "allreduce: average is defined for floating-point tensors but this one is ",
               tensor.dtype(), "; use ReduceOp::kSum and divide yourself");
  // Small enough for std::function to hold without allocating (unlike the tensor).
  auto describe = [numel = tensor.numel(), dtype = tensor.dtype(), op] {
    return tandem::internal::Concat("allreduce (", ReduceOpName(op), ") of ",
                                    Elements(numel, dtype));
  };
  return impl.queue->Enqueue(describe, [&impl, tensor, op](const Work& work,
                                                           Clock::time_point deadline) {
    const int64_t n = tensor.numel();
    const int64_t step = impl.options.max_elements_per_call();
    // An average is the sum scaled by the rank that finishes each block's sum, in the pass
    // that has it in cache, rather than in a separate pass over the whole result.
    const float factor = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(impl.size) : 1.0f;
    const int tag = impl.AllreduceTag(n, tensor.dtype(), op);
    for (int64_t offset = 0; offset < n; offset += step) {
      const int64_t count = std::min(step, n - offset);
      switch (tensor.dtype()) {
        case kFloat32:
          impl.Allreduce(tensor.data<float>() + offset, count, factor, tag, deadline, work);
          break;
        case kFloat64:
          impl.Allreduce(tensor.data<double>() + offset, count,
                         op == ReduceOp::kAverage ? 1.0 / impl.size : 1.0, tag, deadline, work);
          break;
        case kBFloat16:
          impl.AllreduceInFloat(tensor.data<BFloat16>() + offset, count, factor, tag, deadline,
                                work);
          break;
        case kFloat16:
          impl.AllreduceInFloat(tensor.data<Half>() + offset, count, factor, tag, deadline, work);
          break;
        default:
          impl.Allreduce(tensor.data<int64_t>() + offset, count, int64_t{1}, tag, deadline, work);
          break;
      }
    }
  });
}

std::shared_ptr<Work> ProcessGroupMpi::broadcast(Tensor tensor, int root) {
  Impl& impl = *impl_;
  impl.CheckTensor(tensor, "broadcast", "");
  TANDEM_CHECK(root >= 0 && root < impl.size, impl.prefix, "broadcast: root must be a rank in [0, ",
               impl.size, ") but is ", root);
  auto describe = [tensor, root] {
    return tandem::internal::Concat("broadcast from rank ", root, " of ", Elements(tensor));
  };
  return impl.queue->Enqueue(
      describe, [&impl, tensor, root](const Work& work, Clock::time_point deadline) {
        const int64_t n = tensor.numel();
        char* data = static_cast<char*>(tensor.raw_data());
        const size_t element = ElementSize(tensor.dtype());
        const int64_t step = impl.options.max_elements_per_call();
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
  TANDEM_CHECK(output.dtype() == input.dtype(), impl.prefix,
               "allgather: the output must have the input's dtype, but the input is ",
               input.dtype(), " and the output ", output.dtype(),
               "; convert one of them with .to(dtype)");
  TANDEM_CHECK(output.numel() == input.numel() * impl.size, impl.prefix,
               "allgather: the output must hold world size x input = ", impl.size, " x ",
               input.numel(), " = ", input.numel() * impl.size, " elements but holds ",
               output.numel(), "; make it empty({world size * input.numel()})");
  TANDEM_CHECK(!output.shares_storage_with(input), impl.prefix,
               "allgather: the output must not share storage with the input; gather into a "
               "tensor of its own");
  auto describe = [input] { return tandem::internal::Concat("allgather of ", Elements(input)); };
  return impl.queue->Enqueue(
      describe, [&impl, output, input](const Work& work, Clock::time_point deadline) {
        impl.Allgather(static_cast<const char*>(input.raw_data()),
                       static_cast<char*>(output.raw_data()), input.numel(), input.dtype(),
                       impl.AllgatherTag(input.numel(), input.dtype()), deadline, work);
      });
}

std::shared_ptr<Work> ProcessGroupMpi::reduce_scatter(Tensor output, Tensor input, ReduceOp op) {
  Impl& impl = *impl_;
  impl.CheckTensor(input, "reduce_scatter", "input");
  impl.CheckTensor(output, "reduce_scatter", "output");
  const DType dtype = input.dtype();
  TANDEM_CHECK(output.dtype() == dtype, impl.prefix,
               "reduce_scatter: the output must have the input's dtype, but the input is ", dtype,
               " and the output ", output.dtype(), "; convert one of them with .to(dtype)");
  TANDEM_CHECK(AllreduceSupports(dtype), impl.prefix,
               "reduce_scatter takes float32, float64, int64, bfloat16 or float16 tensors but "
               "these are ",
               dtype, "; convert them with .to(dtype) (and back afterwards)");
  TANDEM_CHECK(op != ReduceOp::kAverage || IsFloatingPoint(dtype), impl.prefix,
               "reduce_scatter: average is defined for floating-point tensors but these are ",
               dtype, "; use ReduceOp::kSum and divide yourself");
  const int64_t chunk = output.numel();
  TANDEM_CHECK(input.numel() == chunk * impl.size, impl.prefix,
               "reduce_scatter: the input must hold world size x output = ", impl.size, " x ",
               chunk, " = ", chunk * impl.size, " elements but holds ", input.numel(),
               input.numel() % impl.size == 0
                   ? tandem::internal::Concat("; make the output input.numel() / world size = ",
                                              input.numel() / impl.size, " elements")
                   : tandem::internal::Concat(", not a multiple of the world size; pad the "
                                              "input to a multiple of ",
                                              impl.size, " elements"));
  TANDEM_CHECK(!output.shares_storage_with(input), impl.prefix,
               "reduce_scatter: the output must not share storage with the input; reduce into a "
               "tensor of its own");
  auto describe = [chunk, size = impl.size, dtype, op] {
    return tandem::internal::Concat("reduce_scatter (", ReduceOpName(op), ") of ",
                                    Elements(chunk * size, dtype), ", ", chunk, " per rank");
  };
  return impl.queue->Enqueue(
      describe, [&impl, output, input, op](const Work& work, Clock::time_point deadline) {
        const int64_t chunk = output.numel();
        const bool average = op == ReduceOp::kAverage;
        const float factor = average ? 1.0f / static_cast<float>(impl.size) : 1.0f;
        const int tag = impl.ReduceScatterTag(chunk, input.dtype(), op);
        switch (input.dtype()) {
          case kFloat32:
            impl.ReduceScatter(input.data<float>(), output.data<float>(), chunk, factor, tag,
                               deadline, work);
            break;
          case kFloat64:
            impl.ReduceScatter(input.data<double>(), output.data<double>(), chunk,
                               average ? 1.0 / impl.size : 1.0, tag, deadline, work);
            break;
          case kBFloat16:
            impl.ReduceScatter(input.data<BFloat16>(), output.data<BFloat16>(), chunk, factor, tag,
                               deadline, work);
            break;
          case kFloat16:
            impl.ReduceScatter(input.data<Half>(), output.data<Half>(), chunk, factor, tag,
                               deadline, work);
            break;
          default:
            impl.ReduceScatter(input.data<int64_t>(), output.data<int64_t>(), chunk, int64_t{1},
                               tag, deadline, work);
            break;
        }
      });
}

std::shared_ptr<Work> ProcessGroupMpi::barrier() {
  Impl& impl = *impl_;
  return impl.queue->Enqueue([] { return std::string("barrier"); },
                             [&impl](const Work& work, Clock::time_point deadline) {
                               MPI_Request request;
                               {
                                 MpiCallLock lock;
                                 impl.Check(MPI_Ibarrier(impl.comm, &request), "MPI_Ibarrier",
                                            work);
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

}  // namespace tandem::parallel::distributed
