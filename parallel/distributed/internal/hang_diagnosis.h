// HangDiagnosis: names the ranks that did not answer when a collective times out. Every rank
// keeps a receive posted on a communicator of its own (a duplicate of MPI_COMM_WORLD, so that a
// question never matches a collective's messages); a rank waiting in a collective answers the
// questions that have come with the collective's number and description, and a rank whose
// collective timed out asks every other rank and sorts them: did not answer (stopped, hung,
// dead, or outside this group's collectives), waits in another collective, or waits in this
// one too (across several hosts, naming each rank's host). ProcessGroupMpi answers from its
// polling loop; ProcessGroupNccl's watchdog answers while a collective's GPU work is pending.
// Not thread-safe: one thread at a time uses it.
//
//   internal::HangDiagnosis diagnosis("ProcessGroupNccl");  // collective over MPI_COMM_WORLD
//   while (!finished()) {
//     diagnosis.AnswerQuestions(number, description);
//     if (Clock::now() > deadline) {
//       TANDEM_FAIL(internal::TimeoutMessage(prefix, description, timeout, timeout_name,
//                                            diagnosis.AskWhoWaits(number, description,
//                                                                  std::chrono::seconds(1))));
//     }
//   }
#ifndef TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_HANG_DIAGNOSIS_H_
#define TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_HANG_DIAGNOSIS_H_

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::parallel::distributed::internal {

class HangDiagnosis {
 public:
  // Collective over MPI_COMM_WORLD (initialises MPI if needed): every rank creates its
  // diagnoses in the same order. `owner` names the group in errors ("ProcessGroupMpi").
  explicit HangDiagnosis(const std::string& owner);
  // Lets go of the communicator, unless Abandon() was called.
  ~HangDiagnosis();
  HangDiagnosis(const HangDiagnosis&) = delete;
  HangDiagnosis& operator=(const HangDiagnosis&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Answers every question that has come: this rank waits in its collective number `number`,
  // `description`. Lets go of the answers already delivered.
  void AnswerQuestions(int64_t number, const std::string& description);

  // After this rank's collective number `number` timed out: asks every other rank which
  // collective it waits in (answering their questions meanwhile, as they may be asking too),
  // waits at most `wait` for the answers, and says who did not answer and who waits where.
  std::string AskWhoWaits(int64_t number, const std::string& description,
                          std::chrono::steady_clock::duration wait);

  // After a failure: requests may still be pending on the communicator, which therefore is
  // neither cancelled nor freed (the group is unusable from now on).
  void Abandon() { abandoned_ = true; }

 private:
  std::unique_ptr<char[]> AnswerBytes(int64_t number, const std::string& description) const;

  struct Answer {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<char[]> bytes;
  };
  MPI_Comm control_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  MPI_Request question_ = MPI_REQUEST_NULL;  // always posted, for the next question
  int64_t question_in_ = 0;                  // the asker's collective number (not needed)
  int64_t question_out_ = 0;                 // this rank's, when it asks (outlives the sends)
  std::vector<Answer> answers_sent_;
  bool abandoned_ = false;
  std::vector<std::string> hosts_;  // each rank's MPI_Get_processor_name
  bool multi_host_ = false;         // the ranks run on more than one host
};

// The error of a collective that did not finish within `timeout`: "<prefix><description> did
// not finish within 1.5 s: <who_waits>. Every rank must issue the same collectives in the same
// order; raise <timeout_name> if a rank is only slow".
std::string TimeoutMessage(const std::string& prefix, const std::string& description,
                           std::chrono::milliseconds timeout, const std::string& timeout_name,
                           const std::string& who_waits);

}  // namespace tandem::parallel::distributed::internal

#endif  // TANDEM_PARALLEL_DISTRIBUTED_INTERNAL_HANG_DIAGNOSIS_H_
