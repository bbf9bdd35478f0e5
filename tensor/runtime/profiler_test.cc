#include "tensor/runtime/profiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tensor/ops/ops.h"
#include "tensor/runtime/devices.h"
#include "tensor/runtime/threads.h"
#include "tensor/tensor.h"
#include "tensor/testing.h"

namespace tandem::profiler {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

const Event* Find(const Trace& trace, const std::string& name) {
  for (const Event& e : trace.events) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

TEST(ProfilerTest, ScopesOnSeveralThreadsAreRecordedWithTheirThreadsNames) {
  Start();
  {
    TANDEM_PROFILE_SCOPE("test", "outer");
    { TANDEM_PROFILE_SCOPE("test", std::string("inner ") + "1"); }
  }
  std::thread([] {
    SetThreadName("helper");
    TANDEM_PROFILE_SCOPE("test", "on the helper");
  }).join();
  const Trace trace = Stop();
  const Event* outer = Find(trace, "outer");
  const Event* inner = Find(trace, "inner 1");
  const Event* helper = Find(trace, "on the helper");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  ASSERT_NE(helper, nullptr);
  EXPECT_EQ(outer->category, "test");
  EXPECT_EQ(outer->thread, inner->thread);
  EXPECT_NE(outer->thread, helper->thread);
  EXPECT_EQ(trace.thread_names.at(outer->thread), "main");
  EXPECT_EQ(trace.thread_names.at(helper->thread), "helper");
  // The inner region lies within the outer one.
  EXPECT_LE(outer->start_us, inner->start_us);
  EXPECT_GE(outer->start_us + outer->duration_us, inner->start_us + inner->duration_us);
  EXPECT_EQ(trace.dropped, 0);
}

TEST(ProfilerTest, NothingIsRecordedWhileStoppedAndNamesAreNotBuilt) {
  int built = 0;
  auto name = [&] {
    ++built;
    return std::string("costly");
  };
  { TANDEM_PROFILE_SCOPE("test", name()); }
  EXPECT_EQ(built, 0);
  EXPECT_FALSE(IsEnabled());
  Start();
  EXPECT_TRUE(IsEnabled());
  const Trace trace = Stop();
  EXPECT_TRUE(trace.events.empty());
  EXPECT_THAT(testing::ErrorOf([] { Stop(); }), HasSubstr("the profiler is not running"));
  Start();
  EXPECT_THAT(testing::ErrorOf([] { Start(); }), HasSubstr("already running"));
  Stop();
}

TEST(ProfilerTest, ABackwardPassOverTwoDevicesShowsEachDevicesNodesOnItsThread) {
  SetCpuDeviceCount(2);
  Tensor w = randn({64, 64});
  w.set_requires_grad(true);
  Tensor x0 = randn({8, 64});
  Tensor x1 = randn({8, 64}, TensorOptions().device(Device::Cpu(1)));
  Start();
  Tensor loss = matmul(x0, w).sum() + matmul(x1, w.to(Device::Cpu(1))).sum().to(Device::Cpu(0));
  loss.backward();
  const Trace trace = Stop();
  ASSERT_NE(Find(trace, "backward"), nullptr);
  std::set<std::string> threads_with_nodes;
  for (const Event& e : trace.events) {
    if (e.category == "autograd" && e.name != "backward") {
      threads_with_nodes.insert(trace.thread_names.at(e.thread));
    }
  }
  EXPECT_THAT(threads_with_nodes, Contains("main"));
  EXPECT_THAT(threads_with_nodes, Contains("cpu:1 worker"));
}

TEST(ProfilerTest, TheChromeTraceIsJsonWithEveryEventAndThreadName) {
  Trace trace;
  trace.thread_names = {"main", "cpu:1 \"worker\""};
  trace.events.push_back({"autograd", "MulBackward", 0, 1.5, 2.25});
  trace.events.push_back({"parallel", "replica\n1", 1, 2.0, 10.0});
  const std::string json = ChromeTraceJson(trace);
  EXPECT_THAT(json, HasSubstr("\"traceEvents\":["));
  EXPECT_THAT(json, HasSubstr("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,"
                              "\"args\":{\"name\":\"cpu:1 \\\"worker\\\"\"}}"));
  EXPECT_THAT(json, HasSubstr("{\"name\":\"MulBackward\",\"cat\":\"autograd\",\"ph\":\"X\","
                              "\"pid\":0,\"tid\":0,\"ts\":1.500,\"dur\":2.250}"));
  EXPECT_THAT(json, HasSubstr("\"name\":\"replica\\n1\""));
  // Balanced brackets and braces outside strings, and nothing after the closing brace.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);

  const std::string path = ::testing::TempDir() + "/profiler_test_trace.json";
  WriteChromeTrace(trace, path);
  std::ifstream file(path);
  std::stringstream read;
  read << file.rdbuf();
  EXPECT_EQ(read.str(), json);
  EXPECT_THAT(testing::ErrorOf([&] { WriteChromeTrace(trace, "/nonexistent/dir/trace.json"); }),
              HasSubstr("cannot write Chrome trace '/nonexistent/dir/trace.json': creating a "
                        "temporary file in '/nonexistent/dir' failed: No such file or directory"));
}

}  // namespace
}  // namespace tandem::profiler
