// Work, the handle every collective returns: waiting, errors and timing, with the collective
// played by a thread that starts and finishes it as a process group does.
#include "parallel/distributed/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tensor/base/error.h"

namespace tandem::parallel::distributed {
namespace {

using ::testing::HasSubstr;

// A waiter must wake whether the collective ends while it spins (the first 50 us), just as it
// goes to sleep, or long after: delays from 0 to 400 us cover all three, many times over.
TEST(WorkTest, WaitReturnsOnceTheCollectiveFinishesHoweverLateThatIs) {
  for (int round = 0; round < 300; ++round) {
    Work work("allreduce of 4 float32 elements");
    const auto delay = std::chrono::microseconds((round * 37) % 400);
    std::thread runner([&work, delay] {
      work.Start();
      std::this_thread::sleep_for(delay);
      work.Finish();
    });
    work.wait();
    EXPECT_TRUE(work.is_completed());
    EXPECT_GE(work.run_time(), delay) << "round " << round;
    runner.join();
  }
}

TEST(WorkTest, EveryWaiterWakes) {
  Work work("barrier");
  std::atomic<int> woken{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      work.wait();
      woken.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin: they sleep
  EXPECT_EQ(woken.load(), 0);
  EXPECT_FALSE(work.is_completed());
  work.Start();
  work.Finish();
  for (std::thread& waiter : waiters) waiter.join();
  EXPECT_EQ(woken.load(), 4);
}

TEST(WorkTest, WaitRethrowsTheErrorTheCollectiveFailedWith) {
  Work work("broadcast from rank 0 of 8 float32 elements");
  std::thread runner([&work] {
    work.Start();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    work.Finish(std::make_exception_ptr(Error("rank 1 did not answer")));
  });
  EXPECT_THAT([&] { work.wait(); }, ::testing::ThrowsMessage<Error>(HasSubstr("did not answer")));
  runner.join();
  // Every later wait says the same.
  EXPECT_THAT([&] { work.wait(); }, ::testing::ThrowsMessage<Error>(HasSubstr("did not answer")));
}

TEST(WorkTest, RunTimeIsZeroUntilFinishedAndNeverNegative) {
  Work work("barrier");
  EXPECT_EQ(work.run_time(), std::chrono::steady_clock::duration::zero());
  const std::chrono::steady_clock::time_point started = work.Start();
  EXPECT_LE(started, std::chrono::steady_clock::now());
  EXPECT_EQ(work.run_time(), std::chrono::steady_clock::duration::zero());
  work.Finish();
  EXPECT_GE(work.run_time(), std::chrono::steady_clock::duration::zero());
}

// Formatting a description costs as much as a small all-reduce: it is made once, on demand.
TEST(WorkTest, TheDescriptionIsMadeOnlyWhenAskedForAndOnlyOnce) {
  int made = 0;
  Work work([&made] {
    ++made;
    return std::string("allreduce (sum) of 1024 float32 elements");
  });
  work.Start();
  work.Finish();
  work.wait();
  EXPECT_EQ(made, 0);
  EXPECT_EQ(work.description(), "allreduce (sum) of 1024 float32 elements");
  EXPECT_EQ(work.description(), "allreduce (sum) of 1024 float32 elements");
  EXPECT_EQ(made, 1);
}

}  // namespace
}  // namespace tandem::parallel::distributed
