#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "tensor/base/error.h"

namespace tandem {
namespace data {

namespace {

// A gzip (or plain) file read front to back; every zlib error becomes a tandem::Error
// naming the file.
class GzipReader {
 public:
  explicit GzipReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    TANDEM_CHECK(file_ != nullptr, "cannot open ", path, ": ",
                 errno != 0 ? std::strerror(errno) : "zlib could not allocate its state");
    gzbuffer(file_, 1 << 15);  // zlib reads 32 KiB at a time; large reads inflate in place
  }
  ~GzipReader() { gzclose(file_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Reads up to `n` bytes into `out`; fewer only at the end of the stream. At the end,
  // gzread has checked the gzip trailer (CRC-32 and length).
  size_t Read(uint8_t* out, size_t n) {
    size_t total = 0;
    while (total < n) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30));
      const int got = gzread(file_, out + total, chunk);
      const std::string error = Error();
      TANDEM_CHECK(
          got >= 0 && error.empty(), path_,
          " is not a valid gzip file or is truncated (zlib: ", error.empty() ? "read error" : error,
          "); reinstall the file or download it again");
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    return total;
  }

 private:
  // zlib's description of the stream's error state, or "" when it has none.
  std::string Error() const {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_OK || code == Z_STREAM_END) return "";
    if (code == Z_ERRNO) return std::strerror(errno);
    std::string text = message != nullptr ? message : "unknown zlib error";
    // zlib prefixes the path, which our message names already.
    if (text.rfind(path_ + ": ", 0) == 0) text = text.substr(path_.size() + 2);
    return text;
  }

  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Reads from `reader` until `out` holds `limit` bytes or the stream ends, growing `out`
// by chunks that double from 16 KiB to 4 MiB (so a header that promises too much costs no
// huge allocation, and a small file no large one).
void ReadUpTo(GzipReader& reader, std::vector<uint8_t>& out, size_t limit) {
  while (out.size() < limit) {
    const size_t old_size = out.size();
    const size_t chunk = std::clamp(old_size, size_t{1} << 14, size_t{1} << 22);
    out.resize(old_size + std::min(chunk, limit - old_size));
    const size_t got = reader.Read(out.data() + old_size, out.size() - old_size);
    out.resize(old_size + got);
    if (got == 0) break;
  }
}

// "60000x28x28".
std::string DimsToString(const std::vector<int64_t>& dims) {
  std::string text;
  for (size_t d = 0; d < dims.size(); ++d) text += (d > 0 ? "x" : "") + std::to_string(dims[d]);
  return text;
}

}  // namespace

std::vector<uint8_t> ReadGzipFile(const std::string& path, uint64_t max_bytes) {
  GzipReader reader(path);
  std::vector<uint8_t> content;
  const uint64_t limit = std::min<uint64_t>(max_bytes, std::numeric_limits<size_t>::max() - 1);
  ReadUpTo(reader, content, static_cast<size_t>(limit) + 1);
  TANDEM_CHECK(content.size() <= limit, path, " holds more than ", limit,
               " bytes (decompressed), the most this reader accepts; expected a smaller file "
               "(is it an endless device such as /dev/zero, or the wrong file?)");
  return content;
}

IdxArray ReadIdxFile(const std::string& path, int num_dims, const IdxHeaderCheck& check_header) {
  TANDEM_CHECK(num_dims >= 1 && num_dims <= 255, "ReadIdxFile: num_dims must be in 1..255 but is ",
               num_dims);
  GzipReader reader(path);
  const uint32_t expected_magic = IdxMagic(num_dims);
  uint8_t header[4 + 4 * 255];
  const size_t magic_bytes = reader.Read(header, 4);
  TANDEM_CHECK(magic_bytes == 4, path, " is too short to be an IDX file: ", magic_bytes,
               " bytes (expected a header starting with magic number ", expected_magic, ")");
  const uint32_t magic = ReadBigEndian32(header);
  TANDEM_CHECK(magic == expected_magic, path, " has magic number ", magic, " but an IDX file of ",
               num_dims, "-dimensional unsigned bytes has ", expected_magic,
               "; the file is corrupt or is not the file expected here");
  const size_t dim_bytes = 4 * static_cast<size_t>(num_dims);
  const size_t got_dim_bytes = reader.Read(header + 4, dim_bytes);
  TANDEM_CHECK(got_dim_bytes == dim_bytes, path,
               " is truncated inside its header: ", 4 + got_dim_bytes, " bytes, expected at least ",
               4 + dim_bytes);

  IdxArray array;
  uint64_t expected = 1;
  for (int d = 0; d < num_dims; ++d) {
    const uint32_t dim = ReadBigEndian32(header + 4 + 4 * d);
    array.dims.push_back(dim);
    // Saturate rather than wrap: an absurd header then fails the length check below.
    expected = (dim != 0 && expected > std::numeric_limits<uint64_t>::max() / dim)
                   ? std::numeric_limits<uint64_t>::max()
                   : expected * dim;
  }
  // The caller's check comes first: a header of the wrong shape is reported as such, not as
  // the length mismatch it leads to.
  if (check_header) check_header(array.dims);
  TANDEM_CHECK(expected <= kMaxIdxBytes, path, " has a header promising ", DimsToString(array.dims),
               " = ",
               expected == std::numeric_limits<uint64_t>::max() ? "more than 2^64"
                                                                : std::to_string(expected),
               " bytes of data, more than the ", kMaxIdxBytes,
               " an IDX file may hold here; the file is corrupt");
  // One byte more than promised, to notice trailing data; reading to the end also makes
  // zlib verify the gzip checksum.
  const auto limit = static_cast<size_t>(expected) + 1;
  ReadUpTo(reader, array.bytes, limit);
  const uint64_t found = array.bytes.size();
  TANDEM_CHECK(found >= expected, path, " is truncated: its header promises ", expected,
               " bytes of data but only ", found,
               " follow; reinstall the file or download it "
               "again");
  uint8_t extra[4096];
  const uint64_t trailing = found - expected + reader.Read(extra, sizeof(extra));
  TANDEM_CHECK(trailing == 0, path, " has ", trailing, trailing == sizeof(extra) + 1 ? "+" : "",
               " unexpected bytes after the ", expected,
               " bytes its header describes; the file is corrupt");
  array.bytes.resize(static_cast<size_t>(expected));
  return array;
}

}  // namespace data
}  // namespace tandem
