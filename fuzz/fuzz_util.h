// Helpers for the fuzz targets in this folder: a scratch file per process for readers that
// take a path, and the check that turns a broken property into a crash libFuzzer reports.
//
//   static const tandem::fuzz::ScratchFile file("idx");
//   file.Write(data, size);
//   ReadIdxFile(file.path(), 1);
//   TANDEM_FUZZ_ASSERT(parsed == reparsed);
#ifndef TANDEM_FUZZ_FUZZ_UTIL_H_
#define TANDEM_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::fuzz {

// A file of this process's own in $TEST_TMPDIR, $TMPDIR or /tmp, for readers that take a
// path; removed when the process exits normally.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name) {
    const char* dir = std::getenv("TEST_TMPDIR");
    if (dir == nullptr) dir = std::getenv("TMPDIR");
    if (dir == nullptr) dir = "/tmp";
    path_ = std::string(dir) + "/tandem-fuzz-" + name + "-" + std::to_string(getpid());
  }
  ~ScratchFile() { unlink(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }

  // Replaces the file's content with `data`; aborts if it cannot (a broken setup, not a
  // finding).
  void Write(const uint8_t* data, size_t size) const {
    FILE* file = std::fopen(path_.c_str(), "wb");
    if (file == nullptr || (size > 0 && std::fwrite(data, 1, size, file) != size) ||
        std::fclose(file) != 0) {
      std::perror(path_.c_str());
      std::abort();
    }
  }

 private:
  std::string path_;
};

}  // namespace tandem::fuzz

// Aborts (a crash libFuzzer reports, with the input) when a property of the code under test
// does not hold.
#define TANDEM_FUZZ_ASSERT(condition)                                                         \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (false)

#endif  // TANDEM_FUZZ_FUZZ_UTIL_H_
