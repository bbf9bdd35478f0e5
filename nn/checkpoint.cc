#include "nn/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>

#include "tensor/base/atomic_file.h"
#include "tensor/base/max_dims.h"
#include "tensor/core/autograd.h"

namespace tandem::nn {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoints store tensor data as little-endian bytes; add byte swapping to port "
              "this to a big-endian machine");

constexpr char kMagic[8] = {'T', 'A', 'N', 'D', 'E', 'M', 'C', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = sizeof(kMagic) + 4 + 4 + 4;

uint32_t Crc32(const uint8_t* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large buffers in pieces.
  while (size > 0) {
    const uInt piece = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    crc = crc32(crc, data, piece);
    data += piece;
    size -= piece;
  }
  return static_cast<uint32_t>(crc);
}

// ---- Writing ---------------------------------------------------------------------------

class ByteWriter {
 public:
  void Bytes(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + size);
  }
  template <typename T>
  void Int(T value) {
    Bytes(&value, sizeof(value));  // the host is little-endian (static_assert above)
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

std::vector<uint8_t> Serialize(const std::vector<CheckpointEntry>& entries) {
  ByteWriter file;
  file.Bytes(kMagic, sizeof(kMagic));
  file.Int<uint32_t>(kVersion);
  file.Int<uint32_t>(static_cast<uint32_t>(entries.size()));
  file.Int<uint32_t>(Crc32(file.bytes().data(), file.bytes().size()));
  for (const CheckpointEntry& entry : entries) {
    TANDEM_CHECK(entry.value.defined(), "checkpoint: tensor '", entry.name, "' is undefined");
    const Tensor& value = entry.value;
    ByteWriter body;
    body.Int<uint8_t>(entry.is_buffer ? 1 : 0);
    body.Int<uint8_t>(static_cast<uint8_t>(value.dtype()));
    body.Int<uint32_t>(static_cast<uint32_t>(entry.name.size()));
    body.Bytes(entry.name.data(), entry.name.size());
    body.Int<uint32_t>(static_cast<uint32_t>(value.dim()));
    for (int64_t size : value.shape()) body.Int<int64_t>(size);
    const uint64_t data_bytes = static_cast<uint64_t>(value.numel()) * ElementSize(value.dtype());
    body.Int<uint64_t>(data_bytes);
    const Tensor host = value.detach().to(Device::Cpu(0)).contiguous();
    body.Bytes(host.raw_data(), data_bytes);
    TANDEM_CHECK(body.bytes().size() <= UINT32_MAX, "checkpoint: tensor '", entry.name, "' (",
                 ShapeToString(value.shape()), ") is too large for format version ", kVersion,
                 " (records hold at most 4 GiB)");
    file.Int<uint32_t>(static_cast<uint32_t>(body.bytes().size()));
    file.Bytes(body.bytes().data(), body.bytes().size());
    file.Int<uint32_t>(Crc32(body.bytes().data(), body.bytes().size()));
  }
  return std::move(file.bytes());
}

std::string ErrnoText() { return std::strerror(errno); }

// ---- Reading ---------------------------------------------------------------------------

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}

  size_t remaining() const { return size_ - position_; }

  // Reads `size` bytes of `what`, or reports a truncated file.
  const uint8_t* Take(size_t size, const std::string& what) {
    TANDEM_CHECK(size <= remaining(), "checkpoint '", path_, "' is truncated or corrupted: ", what,
                 " needs ", size, " bytes at offset ", position_, " but the file ends after ",
                 remaining(), " more");
    const uint8_t* p = data_ + position_;
    position_ += size;
    return p;
  }
  template <typename T>
  T Int(const std::string& what) {
    T value;
    std::memcpy(&value, Take(sizeof(T), what), sizeof(T));
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  std::string path_;
  size_t position_ = 0;
};

void CheckMagic(const uint8_t* data, const std::string& path) {
  TANDEM_CHECK(std::memcmp(data, kMagic, sizeof(kMagic)) == 0, "'", path,
               "' is not a Tandem checkpoint (it does not start with \"TANDEMCK\")");
}

// The whole file, read with a cap: a regular file larger than `max_bytes` is refused before
// reading, and anything else (a device such as /dev/zero, a pipe) stops at the cap; a file
// that does not start with the magic is refused after its first 8 bytes.
std::vector<uint8_t> ReadWholeFile(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TANDEM_CHECK(fd >= 0, "cannot open checkpoint '", path, "': ", ErrnoText());
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat info;
  const bool regular = fstat(fd, &info) == 0 && S_ISREG(info.st_mode);
  if (regular) {
    TANDEM_CHECK(static_cast<uint64_t>(info.st_size) <= max_bytes, "checkpoint '", path, "' is ",
                 info.st_size, " bytes, more than the limit of ", max_bytes,
                 " bytes; if it really is this large, pass a larger max_bytes to ReadCheckpoint");
  }
  std::vector<uint8_t> bytes;
  if (regular) bytes.reserve(static_cast<size_t>(info.st_size));
  uint8_t buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n >= 0, "cannot read checkpoint '", path, "': ", ErrnoText());
    if (n == 0) break;
    const bool had_magic = bytes.size() >= sizeof(kMagic);
    bytes.insert(bytes.end(), buffer, buffer + n);
    if (!had_magic && bytes.size() >= sizeof(kMagic)) CheckMagic(bytes.data(), path);
    TANDEM_CHECK(bytes.size() <= max_bytes, "checkpoint '", path, "' holds more than ", max_bytes,
                 " bytes, the limit; expected a checkpoint file (is it an endless device or "
                 "pipe?); if it really is this large, pass a larger max_bytes to ReadCheckpoint");
  }
  return bytes;
}

CheckpointEntry ParseRecordBody(const uint8_t* data, size_t size, const std::string& path,
                                uint32_t index) {
  const std::string where = "record " + std::to_string(index);
  ByteReader in(data, size, path);
  auto corrupt = [&](const std::string& what) {
    TANDEM_FAIL("checkpoint '", path, "' is corrupted: ", where, " ", what);
  };
  CheckpointEntry entry;
  const uint8_t kind = in.Int<uint8_t>(where + " kind");
  if (kind > 1) corrupt("has kind " + std::to_string(kind) + " (expected 0 or 1)");
  entry.is_buffer = kind == 1;
  const uint8_t dtype_code = in.Int<uint8_t>(where + " dtype");
  if (!IsValidDTypeCode(dtype_code)) corrupt("has dtype code " + std::to_string(dtype_code));
  const DType dtype = static_cast<DType>(dtype_code);
  const uint32_t name_size = in.Int<uint32_t>(where + " name length");
  const uint8_t* name = in.Take(name_size, where + " name");
  entry.name.assign(reinterpret_cast<const char*>(name), name_size);
  const std::string named = where + " ('" + entry.name + "')";
  auto corrupt_named = [&](const std::string& what) {
    TANDEM_FAIL("checkpoint '", path, "' is corrupted: ", named, " ", what);
  };
  const uint32_t rank = in.Int<uint32_t>(named + " rank");
  if (rank > static_cast<uint32_t>(kMaxDims)) {
    corrupt_named("has rank " + std::to_string(rank) + " but tensors have at most " +
                  std::to_string(kMaxDims) + " dimensions");
  }
  Shape shape(rank);
  uint64_t numel = 1;
  for (uint32_t d = 0; d < rank; ++d) {
    shape[d] = in.Int<int64_t>(named + " sizes");
    if (shape[d] < 0) {
      corrupt_named("has size " + std::to_string(shape[d]) + " in dimension " + std::to_string(d) +
                    " of " + std::to_string(rank) + " (sizes are at least 0)");
    }
    if (shape[d] > 0 && numel > UINT64_MAX / static_cast<uint64_t>(shape[d])) {
      corrupt_named("has an impossible shape (more than 2^64 elements)");
    }
    numel *= static_cast<uint64_t>(shape[d]);
  }
  const uint64_t data_bytes = in.Int<uint64_t>(named + " data length");
  if (numel > UINT64_MAX / ElementSize(dtype) || data_bytes != numel * ElementSize(dtype)) {
    corrupt("holds " + std::to_string(data_bytes) + " data bytes for a " + DTypeName(dtype) +
            " tensor of shape " + ShapeToString(shape));
  }
  const uint8_t* values = in.Take(data_bytes, named + " data");
  if (in.remaining() != 0) corrupt("has " + std::to_string(in.remaining()) + " stray bytes");
  entry.value = empty(shape, TensorOptions(dtype));
  // A zero-element tensor's data pointer may be null: memcpy must not see it (undefined
  // behaviour even for 0 bytes).
  if (data_bytes > 0) std::memcpy(entry.value.raw_data(), values, data_bytes);
  return entry;
}

}  // namespace

void WriteCheckpoint(const std::vector<CheckpointEntry>& entries, const std::string& path) {
  // Everything is read from the devices before the file is touched.
  const std::vector<uint8_t> bytes = Serialize(entries);
  WriteFileAtomically(path, bytes.data(), bytes.size(), "checkpoint");
}

std::vector<CheckpointEntry> ReadCheckpoint(const std::string& path, uint64_t max_bytes) {
  const std::vector<uint8_t> bytes = ReadWholeFile(path, max_bytes);
  ByteReader in(bytes.data(), bytes.size(), path);
  CheckMagic(in.Take(sizeof(kMagic), "the header"), path);
  const uint32_t version = in.Int<uint32_t>("the header");
  const uint32_t count = in.Int<uint32_t>("the header");
  const uint32_t header_crc = in.Int<uint32_t>("the header");
  TANDEM_CHECK(header_crc == Crc32(bytes.data(), kHeaderBytes - 4), "checkpoint '", path,
               "' is corrupted: its header fails its CRC32 check");
  TANDEM_CHECK(version == kVersion, "checkpoint '", path, "' has format version ", version,
               " but this build reads version ", kVersion);
  std::vector<CheckpointEntry> entries;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string where = "record " + std::to_string(i) + " of " + std::to_string(count);
    const uint32_t size = in.Int<uint32_t>(where);
    const uint8_t* body = in.Take(size, where);
    const uint32_t stored_crc = in.Int<uint32_t>(where + " checksum");
    const uint32_t actual_crc = Crc32(body, size);
    if (stored_crc != actual_crc) {
      std::ostringstream message;
      message << "checkpoint '" << path << "' is corrupted: " << where
              << " fails its CRC32 check (stored 0x" << std::hex << stored_crc << ", computed 0x"
              << actual_crc << ")";
      TANDEM_FAIL(message.str());
    }
    entries.push_back(ParseRecordBody(body, size, path, i));
  }
  TANDEM_CHECK(in.remaining() == 0, "checkpoint '", path, "' is corrupted: ", in.remaining(),
               " unexpected bytes follow its last record");
  return entries;
}

std::vector<CheckpointEntry> ModuleCheckpointEntries(const Module& module) {
  std::vector<CheckpointEntry> entries;
  for (NamedTensor& p : module.named_parameters()) {
    entries.push_back({std::move(p.name), false, std::move(p.value)});
  }
  for (NamedTensor& b : module.named_buffers()) {
    entries.push_back({std::move(b.name), true, std::move(b.value)});
  }
  return entries;
}

void SaveCheckpoint(const Module& module, const std::string& path) {
  WriteCheckpoint(ModuleCheckpointEntries(module), path);
}

void LoadCheckpoint(Module& module, const std::string& path) {
  LoadModuleEntries(module, ReadCheckpoint(path), path);
}

void LoadModuleEntries(Module& module, const std::vector<CheckpointEntry>& entries,
                       const std::string& path) {
  std::map<std::pair<bool, std::string>, Tensor> from_file;
  for (const CheckpointEntry& e : entries) {
    const bool fresh = from_file.emplace(std::make_pair(e.is_buffer, e.name), e.value).second;
    TANDEM_CHECK(fresh, "checkpoint '", path, "' holds '", e.name, "' twice");
  }

  // Match everything before changing anything.
  std::vector<std::string> problems;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (module tensor, file tensor)
  for (const bool is_buffer : {false, true}) {
    const char* kind = is_buffer ? "buffer" : "parameter";
    for (NamedTensor& t : is_buffer ? module.named_buffers() : module.named_parameters()) {
      auto it = from_file.find({is_buffer, t.name});
      if (it == from_file.end()) {
        problems.push_back(std::string(kind) + " '" + t.name + "' is missing from the checkpoint");
        continue;
      }
      const Tensor& stored = it->second;
      if (stored.shape() != t.value.shape() || stored.dtype() != t.value.dtype()) {
        problems.push_back(std::string(kind) + " '" + t.name + "' is " +
                           ShapeToString(stored.shape()) + " " + DTypeName(stored.dtype()) +
                           " in the checkpoint but " + ShapeToString(t.value.shape()) + " " +
                           DTypeName(t.value.dtype()) + " in the module");
      } else {
        copies.emplace_back(t.value, stored.to(t.value.device()));
      }
      from_file.erase(it);
    }
  }
  for (const auto& [key, value] : from_file) {
    problems.push_back(std::string("the checkpoint's ") + (key.first ? "buffer" : "parameter") +
                       " '" + key.second + "' is not in the module");
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    TANDEM_FAIL("checkpoint '", path, "' does not match ", module.name(),
                " (nothing was loaded):", list);
  }
  // The values were moved to the module's devices above: the in-place copies allocate nothing.
  NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

}  // namespace tandem::nn
