// IDX files: the simple big-endian array format of MNIST and Fashion-MNIST, optionally
// gzipped. ReadIdxFile reads an unsigned-byte IDX file (plain or gzip, detected by zlib),
// checks its magic number, header and length, and returns the dimensions and the bytes.
// Every defect is a tandem::Error naming the file: a bad or truncated gzip stream (the
// gzip CRC is verified), a wrong magic number, a header the caller's check refuses (before
// any data is read), a header that promises more than kMaxIdxBytes, fewer or more bytes than
// the header says.
//
//   tandem::data::IdxArray labels = tandem::data::ReadIdxFile(
//       "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", /*num_dims=*/1);
//   // labels.dims == {10000}, labels.bytes.size() == 10000
#ifndef TANDEM_DATA_IDX_H_
#define TANDEM_DATA_IDX_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tandem {
namespace data {

struct IdxArray {
  std::vector<int64_t> dims;   // from the header, outermost first
  std::vector<uint8_t> bytes;  // the elements, row-major: product of dims bytes
};

// The magic number of an unsigned-byte IDX file with `num_dims` dimensions: 0x0800 + num_dims
// (2049 for labels, 2051 for images).
constexpr uint32_t IdxMagic(int num_dims) { return 0x0800u + static_cast<uint32_t>(num_dims); }

// The most data bytes an IDX file (or ReadGzipFile) may hold: 4 GiB, 90 times Fashion-MNIST's
// training images. It bounds what a corrupt header or an endless file (/dev/zero, a pipe)
// can make the reader allocate.
inline constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 32;

// Called with the header's dimensions (outermost first) before any data is read; throws
// to refuse the file. Lets a caller report "32x24 images, expected 28x28" instead of the
// length mismatch such a header leads to.
using IdxHeaderCheck = std::function<void(const std::vector<int64_t>& dims)>;

// Reads an unsigned-byte IDX file with `num_dims` dimensions; see above for the checks.
IdxArray ReadIdxFile(const std::string& path, int num_dims,
                     const IdxHeaderCheck& check_header = nullptr);

// The whole decompressed content of a gzip file (or of a plain file, read as is).
// Throws tandem::Error naming `path` if it cannot be opened, the gzip stream is corrupt
// or truncated, or it holds more than `max_bytes` bytes.
std::vector<uint8_t> ReadGzipFile(const std::string& path, uint64_t max_bytes = kMaxIdxBytes);

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_IDX_H_
