// IDX files: the simple big-endian array format of MNIST and Fashion-MNIST, optionally
// gzipped. ReadIdxFile reads an unsigned-byte IDX file (plain or gzip, detected by zlib),
// checks its magic number, header and length, and returns the dimensions and the bytes.
// Every defect is a tandem::Error naming the file: a bad or truncated gzip stream (the
// gzip CRC is verified), a wrong magic number, fewer or more bytes than the header says.
//
//   tandem::data::IdxArray labels = tandem::data::ReadIdxFile(
//       "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", /*num_dims=*/1);
//   // labels.dims == {10000}, labels.bytes.size() == 10000
#ifndef TANDEM_DATA_IDX_H_
#define TANDEM_DATA_IDX_H_

#include <cstdint>
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

// Reads an unsigned-byte IDX file with `num_dims` dimensions; see above for the checks.
IdxArray ReadIdxFile(const std::string& path, int num_dims);

// The whole decompressed content of a gzip file (or of a plain file, read as is).
// Throws tandem::Error naming `path` if it cannot be opened or the gzip stream is corrupt
// or truncated.
std::vector<uint8_t> ReadGzipFile(const std::string& path);

}  // namespace data
}  // namespace tandem

#endif  // TANDEM_DATA_IDX_H_
