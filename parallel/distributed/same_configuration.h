// RequireSameConfiguration: checks, in one exchange at the start of a distributed job, that
// every rank holds the same value of each named setting (the flags that decide how many
// collectives the ranks run and what they compute, and what follows from them, such as the
// steps per epoch), and otherwise throws the same ConfigurationMismatch on every rank, naming
// each setting the ranks disagree on and every rank's value. Use it before the first
// collective whose sequence depends on those settings: ranks that disagree would otherwise
// wait for each other in different collectives, or train on silently without a word.
//
//   parallel::distributed::RequireSameConfiguration(
//       *group, {{"--epochs", "3"}, {"--seed", "1"}, {"steps per epoch", "235", true}},
//       "start every rank with the same flags");
//   // on rank 1 of 2, started with --epochs=2, every rank throws:
//   // "the 2 ranks disagree on --epochs (3 on rank 0, 2 on rank 1); start every rank ..."
#ifndef TANDEM_PARALLEL_DISTRIBUTED_SAME_CONFIGURATION_H_
#define TANDEM_PARALLEL_DISTRIBUTED_SAME_CONFIGURATION_H_

#include <string>
#include <vector>

#include "parallel/distributed/process_group.h"
#include "tensor/base/error.h"

namespace tandem::parallel::distributed {

struct Setting {
  std::string name;   // "--epochs", "steps per epoch"
  std::string value;  // as text: two values agree when their texts are equal
  // Follows from other settings (the steps per epoch from --batch_size and the data): reported
  // only when no other setting disagrees, so that a flag's disagreement is not reported again
  // through what it implies.
  bool derived = false;
};

// What RequireSameConfiguration throws: the same message on every rank, so that each can
// stop on its own (return from main with an error) without waiting for the others.
class ConfigurationMismatch : public Error {
 public:
  using Error::Error;
};

// Collective: two all-gathers (each rank's length, then everyone's text), under the group's
// timeout. `settings` must have distinct, non-empty names; `how_to_fix` ends the message.
void RequireSameConfiguration(ProcessGroup& group, const std::vector<Setting>& settings,
                              const std::string& how_to_fix);

}  // namespace tandem::parallel::distributed

#endif  // TANDEM_PARALLEL_DISTRIBUTED_SAME_CONFIGURATION_H_
