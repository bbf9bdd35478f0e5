// libFuzzer target: data::ReadIdxFile and data::ReadGzipFile on arbitrary bytes (a plain or
// gzipped file), read as labels (1 dimension) and as images (3 dimensions, with the header
// check Fashion-MNIST uses). Every input must either throw tandem::Error or give exactly the
// bytes its header promises.
//
//   bash fuzz/run.sh idx_fuzzer 30          # 30 s of fuzzing from fuzz/corpus/idx
#include <cstdint>
#include <vector>

#include "data/idx.h"
#include "fuzz/fuzz_util.h"
#include "tensor/base/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  static const fuzz::ScratchFile file("idx");
  file.Write(data, size);
  for (const int num_dims : {1, 3}) {
    try {
      const data::IdxArray array =
          data::ReadIdxFile(file.path(), num_dims, [&](const std::vector<int64_t>& dims) {
            TANDEM_FUZZ_ASSERT(dims.size() == static_cast<size_t>(num_dims));
            TANDEM_CHECK(num_dims == 1 || (dims[1] == 28 && dims[2] == 28), "not 28x28");
          });
      uint64_t product = 1;
      for (const int64_t d : array.dims) product *= static_cast<uint64_t>(d);
      TANDEM_FUZZ_ASSERT(array.dims.size() == static_cast<size_t>(num_dims));
      TANDEM_FUZZ_ASSERT(product == array.bytes.size());
    } catch (const Error&) {
    }
  }
  try {
    const std::vector<uint8_t> content = data::ReadGzipFile(file.path(), 1 << 20);
    TANDEM_FUZZ_ASSERT(content.size() <= (1 << 20));
  } catch (const Error&) {
  }
  return 0;
}
