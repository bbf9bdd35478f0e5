#include "tensor/base/atomic_file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/testing.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/atomic_file_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string dir_;
};

TEST_F(AtomicFileTest, WritesAndReplacesKeepingTheModeAndFollowingLinks) {
  const std::string path = dir_ + "/log.csv";
  WriteFileAtomically(path, "first\n", "--log_csv file");
  EXPECT_EQ(ReadText(path), "first\n");
  ASSERT_EQ(chmod(path.c_str(), 0640), 0);
  WriteFileAtomically(path, "second\n", "--log_csv file");
  EXPECT_EQ(ReadText(path), "second\n");
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0640u);
  fs::create_symlink("log.csv", dir_ + "/link.csv");
  WriteFileAtomically(dir_ + "/link.csv", "third\n", "--log_csv file");
  EXPECT_TRUE(fs::is_symlink(dir_ + "/link.csv"));
  EXPECT_EQ(ReadText(path), "third\n");
  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"link.csv", "log.csv"}));
  WriteFileAtomically(path, "", "--log_csv file");  // an empty file is a valid result
  EXPECT_EQ(ReadText(path), "");
}

TEST_F(AtomicFileTest, AMissingFolderIsNamedWithTheSystemsReason) {
  EXPECT_THAT(testing::ErrorOf(
                  [&] { WriteFileAtomically(dir_ + "/no/such/plot.svg", "x", "--plot file"); }),
              HasSubstr("cannot write --plot file '" + dir_ +
                        "/no/such/plot.svg': creating a "
                        "temporary file in '" +
                        dir_ + "/no/such' failed: No such file or directory"));
}

// A write that fails part-way (the file may not grow past 100 bytes: RLIMIT_FSIZE, with
// SIGXFSZ ignored so that write() reports EFBIG instead of killing the process) removes its
// temporary file, says why, and leaves the previous file as it was.
TEST_F(AtomicFileTest, AWriteThatFailsPartWayKeepsThePreviousFileAndRemovesTheTemporary) {
  const std::string path = dir_ + "/trace.json";
  WriteFileAtomically(path, "previous", "Chrome trace");
  std::string error;
  {
    testing::FileSizeLimit limit(100);
    error = testing::ErrorOf(
        [&] { WriteFileAtomically(path, std::string(4096, 'x'), "Chrome trace"); });
  }
  EXPECT_THAT(error,
              HasSubstr("cannot write Chrome trace '" + path + "': writing '" + path + ".tmp."));
  EXPECT_THAT(error, HasSubstr("' failed: File too large; the previous file, if any, is "
                               "unchanged (the temporary file was removed)"));
  EXPECT_EQ(ReadText(path), "previous");
  EXPECT_EQ(Listing(dir_), std::vector<std::string>{"trace.json"});
}

// A real full file system: a 64 KiB tmpfs mounted in a private mount namespace of a child
// process (as root, or as any user where unprivileged user namespaces are allowed; skipped
// where neither works). The child reports what it saw through a pipe.
TEST_F(AtomicFileTest, AFullDiskSaysNoSpaceLeftOnDeviceAndKeepsThePreviousFile) {
  const std::string mount_point = dir_ + "/full";
  fs::create_directories(mount_point);
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const uid_t uid = geteuid();
  const gid_t gid = getegid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(report[0]);
    auto say = [&](const std::string& text) { (void)!write(report[1], text.data(), text.size()); };
    bool isolated = unshare(CLONE_NEWNS) == 0;
    if (!isolated && unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0) {
      std::ofstream("/proc/self/setgroups") << "deny";
      std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
      std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
      isolated = true;
    }
    if (!isolated || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tandem-full", mount_point.c_str(), "tmpfs", 0, "size=64k") != 0) {
      say(std::string("skip: cannot mount a small tmpfs here: ") + std::strerror(errno));
      _exit(77);
    }
    const std::string path = mount_point + "/log.csv";
    std::string error;
    try {
      WriteFileAtomically(path, "epoch,loss\n1,0.5\n", "--log_csv file");
      error = testing::ErrorOf(
          [&] { WriteFileAtomically(path, std::string(1 << 20, 'x'), "--log_csv file"); });
    } catch (const std::exception& e) {
      error = std::string("the first write failed: ") + e.what();
    }
    std::string files;
    for (const std::string& name : Listing(mount_point)) files += name + " ";
    say(error + "\n--\n" + ReadText(path) + "--\n" + files);
    _exit(0);
  }
  close(report[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(report[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  close(report[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << text;
  ASSERT_EQ(WEXITSTATUS(status), 0) << text;
  const std::string path = mount_point + "/log.csv";
  EXPECT_THAT(text, HasSubstr("cannot write --log_csv file '" + path + "': "));
  EXPECT_THAT(text, HasSubstr("failed: No space left on device; the previous file, if any, is "
                              "unchanged (the temporary file was removed)"));
  // The previous file whole, and nothing else left in the folder.
  EXPECT_THAT(text, HasSubstr("\n--\nepoch,loss\n1,0.5\n--\nlog.csv "));
}

}  // namespace
}  // namespace tandem
