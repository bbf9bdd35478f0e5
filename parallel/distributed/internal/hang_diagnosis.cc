#include "parallel/distributed/internal/hang_diagnosis.h"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <thread>
#include <utility>

#include "parallel/distributed/internal/mpi_calls.h"
#include "tensor/base/error.h"

namespace tandem::parallel::distributed::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kQuestionTag = 1;
constexpr int kAnswerTag = 2;
constexpr int kAnswerBytes = 256;  // the collective number, then its description
constexpr int kHostBytes = 64;     // a host name, cut to 63 characters

}  // namespace

HangDiagnosis::HangDiagnosis(const std::string& owner) {
  EnsureMpiInitialized();
  MpiCallLock lock;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &control_);
  TANDEM_CHECK(rc == MPI_SUCCESS, owner,
               ": MPI_Comm_dup(MPI_COMM_WORLD) failed: ", MpiErrorString(rc));
  MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(control_, &rank_);
  MPI_Comm_size(control_, &size_);
  // Every rank's host, so that a timeout on several machines names where the silent rank ran.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  std::vector<char> names(static_cast<size_t>(size_) * kHostBytes, '\0');
  std::memcpy(names.data() + static_cast<size_t>(rank_) * kHostBytes, name,
              std::min<size_t>(static_cast<size_t>(length), kHostBytes - 1));
  rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, names.data(), kHostBytes, MPI_CHAR,
                     control_);
  TANDEM_CHECK(rc == MPI_SUCCESS, owner,
               ": MPI_Allgather of the ranks' host names failed: ", MpiErrorString(rc));
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(names.data() + r * kHostBytes);
  multi_host_ = std::any_of(hosts_.begin(), hosts_.end(),
                            [&](const std::string& host) { return host != hosts_[0]; });
  rc = MPI_Irecv(&question_in_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, control_, &question_);
  TANDEM_CHECK(rc == MPI_SUCCESS, owner, ": MPI_Irecv failed: ", MpiErrorString(rc));
}

HangDiagnosis::~HangDiagnosis() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (abandoned_ || finalized) return;
  MpiCallLock lock;
  if (question_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
  }
  // An answer still in flight goes to a rank that asked and then stopped listening: its
  // buffer must outlive the send, which cannot be waited for.
  for (Answer& answer : answers_sent_) {
    int sent = 0;
    MPI_Test(&answer.request, &sent, MPI_STATUS_IGNORE);
    if (sent) continue;
    MPI_Request_free(&answer.request);
    static_cast<void>(answer.bytes.release());  // deliberately leaked, see above
  }
  MPI_Comm_free(&control_);
}

std::unique_ptr<char[]> HangDiagnosis::AnswerBytes(int64_t number,
                                                   const std::string& description) const {
  auto bytes = std::make_unique<char[]>(kAnswerBytes);
  std::memset(bytes.get(), 0, kAnswerBytes);
  std::memcpy(bytes.get(), &number, sizeof(number));
  std::memcpy(bytes.get() + sizeof(number), description.data(),
              std::min<size_t>(description.size(), kAnswerBytes - sizeof(number) - 1));
  return bytes;
}

void HangDiagnosis::AnswerQuestions(int64_t number, const std::string& description) {
  MpiCallLock lock;
  while (true) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&question_, &arrived, &status) != MPI_SUCCESS || !arrived) break;
    Answer answer{MPI_REQUEST_NULL, AnswerBytes(number, description)};
    if (MPI_Isend(answer.bytes.get(), kAnswerBytes, MPI_CHAR, status.MPI_SOURCE, kAnswerTag,
                  control_, &answer.request) == MPI_SUCCESS) {
      answers_sent_.push_back(std::move(answer));
    }
    if (MPI_Irecv(&question_in_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQuestionTag, control_,
                  &question_) != MPI_SUCCESS) {
      question_ = MPI_REQUEST_NULL;
      break;
    }
  }
  for (size_t i = 0; i < answers_sent_.size();) {
    int sent = 0;
    MPI_Test(&answers_sent_[i].request, &sent, MPI_STATUS_IGNORE);
    if (sent) {
      answers_sent_.erase(answers_sent_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

std::string HangDiagnosis::AskWhoWaits(int64_t number, const std::string& description,
                                       Clock::duration wait) {
  question_out_ = number;
  const size_t bytes = static_cast<size_t>(size_) * kAnswerBytes;
  char* answers = new char[bytes]();  // leaked below if a receive stays pending
  std::vector<MPI_Request> receives(size_, MPI_REQUEST_NULL);
  {
    MpiCallLock lock;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Irecv(answers + r * kAnswerBytes, kAnswerBytes, MPI_CHAR, r, kAnswerTag, control_,
                &receives[r]);
      MPI_Request send = MPI_REQUEST_NULL;
      if (MPI_Isend(&question_out_, 1, MPI_INT64_T, r, kQuestionTag, control_, &send) ==
          MPI_SUCCESS) {
        MPI_Request_free(&send);
      }
    }
  }
  const Clock::time_point give_up = Clock::now() + wait;
  std::vector<bool> answered(size_, false);
  answered[rank_] = true;
  while (true) {
    AnswerQuestions(number, description);  // another rank that timed out may be asking this one
    bool all = true;
    {
      MpiCallLock lock;
      for (int r = 0; r < size_; ++r) {
        if (answered[r]) continue;
        int arrived = 0;
        MPI_Test(&receives[r], &arrived, MPI_STATUS_IGNORE);
        answered[r] = arrived != 0;
        all = all && answered[r];
      }
    }
    if (all || Clock::now() > give_up) break;
    // Polling, as the question's sends and receives move only when tested; the answers come
    // within milliseconds from every rank that waits in a collective.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // This rank's description as an answer carries it (cut to the same length).
  const std::string own(AnswerBytes(number, description).get() + sizeof(number));
  std::vector<int> silent;
  std::vector<std::string> elsewhere;
  std::vector<int> alongside;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (!answered[r]) {
      silent.push_back(r);
      continue;
    }
    int64_t sequence = 0;
    std::memcpy(&sequence, answers + r * kAnswerBytes, sizeof(sequence));
    answers[(r + 1) * kAnswerBytes - 1] = '\0';
    const std::string theirs(answers + r * kAnswerBytes + sizeof(sequence));
    if (sequence == number && theirs == own) {
      alongside.push_back(r);
    } else {
      elsewhere.push_back(tandem::internal::Concat(
          "rank ", r, multi_host_ ? " (on host " + hosts_[r] + ")" : "",
          " waits in its collective number ", sequence, " (", theirs, ")"));
    }
  }
  if (!silent.empty()) {
    MpiCallLock lock;
    for (MPI_Request& request : receives) {
      if (request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&request);
      MPI_Request_free(&request);
    }
  } else {
    delete[] answers;
  }
  std::ostringstream text;
  // On one machine the host says nothing; across machines it says where to look.
  auto ranks = [&](const std::vector<int>& list) {
    std::ostringstream out;
    out << (list.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < list.size(); ++i) {
      out << (i == 0 ? "" : ", ") << list[i];
      if (multi_host_) out << " (on host " << hosts_[list[i]] << ")";
    }
    return out.str();
  };
  if (!silent.empty()) {
    text << ranks(silent) << (silent.size() == 1 ? " did" : " do")
         << " not answer (stopped, hung or dead, or busy outside this group's collectives)";
  }
  if (!elsewhere.empty()) {
    if (!silent.empty()) text << "; ";
    for (size_t i = 0; i < elsewhere.size(); ++i) text << (i == 0 ? "" : ", ") << elsewhere[i];
    text << ", where this rank is in its collective number " << number
         << ": the ranks issued different collectives";
  }
  if (!alongside.empty()) {
    if (!silent.empty() || !elsewhere.empty()) text << "; ";
    text << ranks(alongside) << (alongside.size() == 1 ? " waits" : " wait")
         << " in this collective too";
  }
  return text.str();
}

std::string TimeoutMessage(const std::string& prefix, const std::string& description,
                           std::chrono::milliseconds timeout, const std::string& timeout_name,
                           const std::string& who_waits) {
  std::ostringstream seconds;
  seconds << std::fixed << std::setprecision(1) << std::chrono::duration<double>(timeout).count();
  return tandem::internal::Concat(prefix, description, " did not finish within ", seconds.str(),
                                  " s: ", who_waits,
                                  ". Every rank must issue the same collectives in the same "
                                  "order; raise ",
                                  timeout_name, " if a rank is only slow");
}

}  // namespace tandem::parallel::distributed::internal
