#include "tensor/base/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/base/error.h"

namespace tandem {
namespace {

std::string ErrnoText() { return std::strerror(errno); }

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The file a write to `path` replaces: `path` itself or, when it is a symbolic link, the file
// its chain of links ends at (which need not exist yet), so that writing through a link
// replaces the link's target and keeps the link.
std::string FollowLinks(const std::string& path, const std::string& what) {
  std::string current = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat info;
    if (lstat(current.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return current;
    std::vector<char> target(PATH_MAX + 1);
    const ssize_t n = readlink(current.c_str(), target.data(), PATH_MAX);
    TANDEM_CHECK(n >= 0, "cannot write ", what, " '", path, "': reading the symbolic link '",
                 current, "' failed: ", ErrnoText());
    const std::string next(target.data(), static_cast<size_t>(n));
    current = next[0] == '/' ? next : DirectoryOf(current) + "/" + next;
  }
  TANDEM_FAIL("cannot write ", what, " '", path,
              "': it is a chain of more than 40 symbolic links (a loop?); expected a link to a "
              "file; fix the links or write to another path");
}

// Removes the temporaries that earlier writes to `path` left behind when they were killed:
// files named "<path>.tmp.XXXXXX" (six characters), regular, ours, and not locked. A write in
// progress holds a lock on its temporary file for as long as it runs (the kernel drops it
// when the process dies), so the temporaries of live writes, in this process or another, are
// never touched. `own` names this write's temporary file.
void RemoveStaleTemporaries(const std::string& path, const std::string& own) {
  const std::string dir = DirectoryOf(path);
  const std::string prefix = BaseName(path) + ".tmp.";
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return;
  while (const dirent* entry = readdir(listing)) {
    const std::string name = entry->d_name;
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0 ||
        name == BaseName(own)) {
      continue;
    }
    const std::string file = dir + "/" + name;
    const int fd = open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat opened, named;
    if (fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) && opened.st_uid == geteuid() &&
        flock(fd, LOCK_EX | LOCK_NB) == 0 && lstat(file.c_str(), &named) == 0 &&
        named.st_dev == opened.st_dev && named.st_ino == opened.st_ino) {
      unlink(file.c_str());
    }
    close(fd);
  }
  closedir(listing);
}

// Creates and locks (flock) a new temporary file "<path>.tmp.XXXXXX" with `mode` (less the
// umask); returns its descriptor and sets `temp`, or returns -1 with errno set.
int CreateTemporary(const std::string& path, mode_t mode, std::string* temp) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device seed;
  std::mt19937_64 random((static_cast<uint64_t>(seed()) << 32) ^ seed() ^ getpid());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    *temp = path + ".tmp.";
    for (int i = 0; i < 6; ++i) temp->push_back(kChars[random() % (sizeof(kChars) - 1)]);
    const int fd = open(temp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return -1;
    }
    // Another write's clean-up may have removed the file between open() and flock(): then
    // it is no longer in the folder and this try starts again.
    struct stat info;
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &info) == 0 && info.st_nlink > 0) return fd;
    close(fd);
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

void WriteFileAtomically(const std::string& requested, const void* data, size_t size,
                         const std::string& what) {
  const std::string path = FollowLinks(requested, what);
  struct stat old;
  const bool replacing = stat(path.c_str(), &old) == 0 && S_ISREG(old.st_mode);
  std::string temp;
  const int fd = CreateTemporary(path, replacing ? (old.st_mode & 0777) : 0666, &temp);
  TANDEM_CHECK(fd >= 0, "cannot write ", what, " '", requested, "': creating a temporary file in '",
               DirectoryOf(path), "' failed: ", ErrnoText(),
               "; the previous file, if any, is unchanged");
  RemoveStaleTemporaries(path, temp);
  auto fail = [&](const std::string& step) {
    const std::string reason = ErrnoText();
    close(fd);
    unlink(temp.c_str());
    TANDEM_FAIL("cannot write ", what, " '", requested, "': ", step, " '", temp,
                "' failed: ", reason,
                "; the previous file, if any, is unchanged (the temporary file was removed)");
  };
  const auto* bytes = static_cast<const uint8_t*>(data);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, bytes + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    // write() returning 0 for a non-empty request sets no errno: name the usual cause.
    if (n == 0) errno = ENOSPC;
    if (n <= 0) fail("writing");
    written += static_cast<size_t>(n);
  }
  if (replacing && fchmod(fd, old.st_mode & 07777) != 0) fail("setting permissions of");
  // A full disk often shows only here (delayed allocation, network file systems).
  if (fsync(fd) != 0) fail("flushing");
  if (close(fd) != 0) {
    const std::string reason = ErrnoText();
    unlink(temp.c_str());
    TANDEM_FAIL("cannot write ", what, " '", requested, "': closing '", temp, "' failed: ", reason,
                "; the previous file, if any, is unchanged (the temporary file was removed)");
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = ErrnoText();
    unlink(temp.c_str());
    TANDEM_FAIL("cannot write ", what, " '", requested,
                "': renaming the temporary file over it failed: ", reason,
                "; the previous file, if any, is unchanged");
  }
  // Make the rename itself durable. A failure here does not undo a complete write.
  const int dir = open(DirectoryOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
}

}  // namespace tandem
