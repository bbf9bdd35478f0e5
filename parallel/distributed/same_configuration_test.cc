// Runs as an MPI job (mpi_test.sh): every rank runs every test, in the same order.
#include "parallel/distributed/same_configuration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/distributed/mpi_testing.h"
#include "parallel/distributed/process_group_mpi.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::HasSubstr;

class SameConfigurationTest : public MpiTest {};

ProcessGroupMpi& Group() { return *TestGroup(); }

// The message RequireSameConfiguration throws on this rank ("" if it returns).
std::string MismatchOf(const std::vector<Setting>& settings) {
  try {
    RequireSameConfiguration(Group(), settings, "start every rank with the same flags");
  } catch (const ConfigurationMismatch& e) {
    return e.what();
  }
  return "";
}

TEST_F(SameConfigurationTest, AgreeingRanksPass) {
  EXPECT_EQ(MismatchOf({{"--epochs", "3"}, {"--model", "mlp"}, {"steps", "12", true}}), "");
  EXPECT_EQ(MismatchOf({}), "");
  // Long values travel whole (more than one word, lengths not a multiple of 8).
  EXPECT_EQ(MismatchOf({{"--path", std::string(1001, 'x')}, {"--empty", ""}}), "");
}

// Every rank gets the same message, naming each flag that differs and every rank's value.
TEST_F(SameConfigurationTest, EveryRankNamesEachDisagreeingFlagAndEveryRanksValue) {
  const int rank = Group().rank();
  const int last = Group().size() - 1;
  const std::string n = std::to_string(Group().size());
  const std::string error =
      MismatchOf({{"--epochs", rank == last ? "2" : "3"},
                  {"--batch_size", "128"},
                  {"--optimizer", rank == 0 ? "sgd" : "adam"},
                  {"steps per epoch", rank == last ? "5" : "6", /*derived=*/true}});
  const std::string others = last == 1 ? "rank 0" : "ranks 0, 1";
  const std::string after_zero = last == 1 ? "rank 1" : "ranks 1, 2";
  EXPECT_EQ(error, "the " + n + " ranks disagree on --epochs (3 on " + others + ", 2 on rank " +
                       std::to_string(last) + "); --optimizer (sgd on rank 0, adam on " +
                       after_zero + "); start every rank with the same flags");
}

// A derived setting (steps per epoch) is reported when no flag differs: the data differ.
TEST_F(SameConfigurationTest, DerivedSettingsAreReportedWhenNoFlagDiffers) {
  const int rank = Group().rank();
  const std::string error =
      MismatchOf({{"--epochs", "3"}, {"training images", rank == 0 ? "2048" : "1024", true}});
  EXPECT_THAT(error, HasSubstr("disagree on training images (2048 on rank 0, 1024 on rank"));
}

// A setting only some ranks have (another build of the program), an empty value.
TEST_F(SameConfigurationTest, MissingAndEmptyValuesAreShown) {
  const int rank = Group().rank();
  std::vector<Setting> settings = {{"--trace", rank == 0 ? "" : "t.json"}};
  if (rank == 0) settings.push_back({"--new_flag", "1"});
  const std::string error = MismatchOf(settings);
  EXPECT_THAT(error, HasSubstr("--trace ('' on rank 0, t.json on rank"));
  EXPECT_THAT(error, HasSubstr("--new_flag (1 on rank 0, no such setting on rank"));
}

TEST_F(SameConfigurationTest, BadSettingsAreAClearErrorBeforeAnyCollective) {
  EXPECT_THROW(MismatchOf({{"", "1"}}), Error);
  EXPECT_THROW(MismatchOf({{"--a", "1"}, {"--a", "1"}}), Error);
  EXPECT_THROW(MismatchOf({{"--a", std::string("x\0y", 3)}}), Error);
  // Nothing was exchanged: the group still agrees.
  EXPECT_EQ(MismatchOf({{"--a", "1"}}), "");
}

}  // namespace
}  // namespace tandem::parallel::distributed
