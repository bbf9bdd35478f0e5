// Atomic file writes: the whole new contents or, on any failure, the previous file exactly
// as it was. What every writer of a result file uses (checkpoints, the trainer's CSV log
// and SVG plot, the profiler's Chrome trace), so that a full disk, a killed process or a
// missing folder never leaves a truncated or empty file where a good one was.
//
//   tandem::WriteFileAtomically("/tmp/run.csv", csv_text, "--log_csv file");
//   // on a full disk: tandem::Error "cannot write --log_csv file '/tmp/run.csv': writing
//   // '/tmp/run.csv.tmp.Xy12ab' failed: No space left on device; the previous file, if
//   // any, is unchanged (the temporary file was removed)"
//
// How: a temporary file "<path>.tmp.XXXXXX" in the same folder, written in full, fsynced and
// renamed over `path`, then the folder fsynced. On failure the temporary file is removed and
// the error gives the system's reason (strerror). The temporaries of earlier writes to the
// same path that were killed part-way are removed (a live write locks its own, so it is never
// taken). Writing through a symbolic link replaces the link's target and keeps the link; an
// existing file keeps its mode, and a new one gets 0666 less the umask, as open() does.
#ifndef TANDEM_TENSOR_BASE_ATOMIC_FILE_H_
#define TANDEM_TENSOR_BASE_ATOMIC_FILE_H_

#include <cstddef>
#include <string>

namespace tandem {

// Writes `size` bytes at `data` to `path` atomically. `what` names the file in errors
// ("checkpoint", "--log_csv file"): a failure throws tandem::Error "cannot write <what>
// '<path>': <step> failed: <strerror>; ...".
void WriteFileAtomically(const std::string& path, const void* data, size_t size,
                         const std::string& what);

inline void WriteFileAtomically(const std::string& path, const std::string& text,
                                const std::string& what) {
  WriteFileAtomically(path, text.data(), text.size(), what);
}

}  // namespace tandem

#endif  // TANDEM_TENSOR_BASE_ATOMIC_FILE_H_
