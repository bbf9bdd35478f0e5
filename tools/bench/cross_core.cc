// What it costs one core to read data that another core has just written, next to data it
// wrote itself and data evicted to memory: the price a data-parallel step pays on the CPU for
// every buffer that crosses between devices (a replica reading the parameters, the
// reduce-add reading the other replica's gradients, the optimizer writing lines the other
// core has read). Where two cores share a last-level cache, the other core's data costs
// little more than this core's own; where they do not (two vCPUs that a VM's host has placed
// on different dies), it costs what memory does.
//
//   bazel run -c opt //tools/bench:cross_core -- [--cpus=0,1] [--bytes=1048576] [--rounds=21]
//
// Linux only (pins its two threads with pthread_setaffinity_np). Prints a table and, as its
// last line, one JSON object.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(std::string, cpus, "0,1", "The two CPUs: the first reads, the second writes");
ABSL_FLAG(int64_t, bytes, 1 << 20, "Buffer size in bytes (at least 4096)");
ABSL_FLAG(int, rounds, 21, "Rounds of each measurement; the median is shown");

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "cross_core: %s\n", message.c_str());
  std::exit(1);
}

void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    Fail("cannot run a thread on CPU " + std::to_string(cpu) +
         ": is it online and in this process's CPU set? (see `taskset -p $$`)");
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Brings `from` into this core's caches (by copying it into `to`) and returns the microseconds.
double ReadMicros(const std::vector<char>& from, std::vector<char>& to) {
  const Clock::time_point start = Clock::now();
  std::memcpy(to.data(), from.data(), from.size());
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

void Touch(std::vector<char>& buffer, int round) {
  for (size_t i = 0; i < buffer.size(); i += 64) buffer[i] = static_cast<char>(round + i);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("What reading another core's freshly written data costs");
  absl::ParseCommandLine(argc, argv);
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_cpus), ',')) {
    int cpu = 0;
    if (!absl::SimpleAtoi(part, &cpu) || cpu < 0) {
      Fail("--cpus must be two CPU numbers such as 0,1 but has \"" + std::string(part) + "\"");
    }
    cpus.push_back(cpu);
  }
  if (cpus.size() != 2 || cpus[0] == cpus[1]) {
    Fail("--cpus must name two different CPUs, such as 0,1, but is \"" + absl::GetFlag(FLAGS_cpus) +
         "\"");
  }
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (bytes < 4096) Fail("--bytes must be at least 4096 but is " + std::to_string(bytes));
  if (rounds < 1) Fail("--rounds must be at least 1 but is " + std::to_string(rounds));

  std::vector<char> data(bytes), copy(bytes), flush(64 << 20);
  // The writer: waits for a round number, then writes `data` (and, for the memory case, a
  // buffer larger than any cache after it), then reports the round done.
  std::atomic<int> request{0}, done{0};
  std::atomic<bool> flush_after{false};
  std::thread writer([&] {
    PinTo(cpus[1]);
    for (int seen = 0;;) {
      int round;
      while ((round = request.load(std::memory_order_acquire)) == seen) std::this_thread::yield();
      if (round < 0) return;
      seen = round;
      Touch(data, round);
      if (flush_after.load()) Touch(flush, round);
      done.store(round, std::memory_order_release);
    }
  });
  PinTo(cpus[0]);
  auto other_core = [&](bool evict, int round) {
    flush_after = evict;
    request.store(round, std::memory_order_release);
    while (done.load(std::memory_order_acquire) != round) std::this_thread::yield();
    return ReadMicros(data, copy);
  };
  std::vector<double> own, other, memory;
  int round = 0;
  for (int r = 0; r < rounds; ++r) {
    Touch(data, r);
    ReadMicros(data, copy);  // in this core's caches, as the other cases leave `copy` too
    own.push_back(ReadMicros(data, copy));
    other.push_back(other_core(false, ++round));
    memory.push_back(other_core(true, ++round));
  }
  request.store(-1, std::memory_order_release);
  writer.join();

  const double own_us = Median(own), other_us = Median(other), memory_us = Median(memory);
  std::printf("cross_core: CPU %d reads %lld bytes (median of %d rounds)\n", cpus[0],
              static_cast<long long>(bytes), rounds);
  std::printf("  %-44s %9.1f us  %6.1f GB/s\n", "that it wrote itself", own_us,
              bytes / own_us / 1e3);
  std::printf("  %-44s %9.1f us  %6.1f GB/s  (%.1fx its own)\n",
              ("that CPU " + std::to_string(cpus[1]) + " has just written").c_str(), other_us,
              bytes / other_us / 1e3, other_us / own_us);
  std::printf("  %-44s %9.1f us  %6.1f GB/s  (%.1fx its own)\n",
              ("that CPU " + std::to_string(cpus[1]) + " wrote, then evicted").c_str(), memory_us,
              bytes / memory_us / 1e3, memory_us / own_us);
  std::printf(
      "{\"benchmark\":\"cross_core\",\"cpus\":[%d,%d],\"bytes\":%lld,\"own_us\":%.2f,"
      "\"other_core_us\":%.2f,\"evicted_us\":%.2f}\n",
      cpus[0], cpus[1], static_cast<long long>(bytes), own_us, other_us, memory_us);
  return 0;
}
