#include "data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

#include "tensor/error.h"

namespace tandem {
namespace data {

namespace {

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};

// zlib's description of the stream's error state, or "" when it has none.
std::string GzipError(gzFile file, const std::string& path) {
  int code = Z_OK;
  const char* message = gzerror(file, &code);
  if (code == Z_OK || code == Z_STREAM_END) return "";
  if (code == Z_ERRNO) return std::strerror(errno);
  std::string text = message != nullptr ? message : "unknown zlib error";
  // zlib prefixes the path, which our message names already.
  if (text.rfind(path + ": ", 0) == 0) text = text.substr(path.size() + 2);
  return text;
}

uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

std::vector<uint8_t> ReadGzipFile(const std::string& path) {
  errno = 0;
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  TANDEM_CHECK(file != nullptr, "cannot open ", path, ": ",
               errno != 0 ? std::strerror(errno) : "zlib could not allocate its state");
  gzbuffer(file.get(), 1 << 17);
  std::vector<uint8_t> content;
  constexpr size_t kChunk = 1 << 20;
  while (true) {
    const size_t old_size = content.size();
    content.resize(old_size + kChunk);
    const int got = gzread(file.get(), content.data() + old_size, kChunk);
    const std::string error = GzipError(file.get(), path);
    TANDEM_CHECK(
        got >= 0 && error.empty(), path,
        " is not a valid gzip file or is truncated (zlib: ", error.empty() ? "read error" : error,
        "); reinstall the file or download it again");
    content.resize(old_size + static_cast<size_t>(got));
    if (got == 0) break;  // end of the stream; gzread has checked the gzip CRC and length
  }
  content.shrink_to_fit();
  return content;
}

IdxArray ReadIdxFile(const std::string& path, int num_dims) {
  TANDEM_CHECK(num_dims >= 1 && num_dims <= 255, "ReadIdxFile: num_dims must be in 1..255 but is ",
               num_dims);
  std::vector<uint8_t> content = ReadGzipFile(path);
  const uint32_t expected_magic = IdxMagic(num_dims);
  TANDEM_CHECK(content.size() >= 4, path, " is too short to be an IDX file: ", content.size(),
               " bytes (expected a header starting with magic number ", expected_magic, ")");
  const uint32_t magic = ReadBigEndian32(content.data());
  TANDEM_CHECK(magic == expected_magic, path, " has magic number ", magic, " but an IDX file of ",
               num_dims, "-dimensional unsigned bytes has ", expected_magic,
               "; the file is corrupt or is not the file expected here");
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(num_dims);
  TANDEM_CHECK(content.size() >= header_bytes, path,
               " is truncated inside its header: ", content.size(), " bytes, expected at least ",
               header_bytes);
  IdxArray array;
  uint64_t expected_elements = 1;
  for (int d = 0; d < num_dims; ++d) {
    const uint32_t dim = ReadBigEndian32(content.data() + 4 + 4 * d);
    array.dims.push_back(dim);
    // Dimensions are 32-bit, so this product only overflows for absurd headers, which the
    // length check below rejects anyway; saturate instead of wrapping.
    expected_elements = (dim != 0 && expected_elements > std::numeric_limits<uint64_t>::max() / dim)
                            ? std::numeric_limits<uint64_t>::max()
                            : expected_elements * dim;
  }
  const uint64_t found_elements = content.size() - header_bytes;
  TANDEM_CHECK(found_elements >= expected_elements, path, " is truncated: its header promises ",
               expected_elements, " bytes of data but only ", found_elements,
               " follow; reinstall the file or download it again");
  TANDEM_CHECK(found_elements == expected_elements, path, " has ",
               found_elements - expected_elements, " unexpected bytes after the ",
               expected_elements, " bytes its header describes; the file is corrupt");
  content.erase(content.begin(), content.begin() + static_cast<std::ptrdiff_t>(header_bytes));
  array.bytes = std::move(content);
  return array;
}

}  // namespace data
}  // namespace tandem
