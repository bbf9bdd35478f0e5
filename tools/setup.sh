#!/usr/bin/env bash
# Installs what Tandem needs to build and test on Debian 12 (bookworm):
#   bash tools/setup.sh
# Runs apt-get as root, or through sudo otherwise. Packages already installed
# are left alone; when everything is present apt is not touched at all (set
# TANDEM_SETUP_FORCE=1 to run apt-get update/install anyway).
# The CUDA toolkit is not a Debian package and is optional: with it at
# $CUDA_PATH (default /usr/local/cuda) the CUDA targets build too.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap        # Bazel 4.2.3 (pulls in a JDK and build-essential)
  bazel-platforms
  g++
  gfortran               # static libgfortran.a for //third_party:openblas_static
  git
  ca-certificates
  python3                # lcov merger for `bazel coverage`
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libabsl-dev
  libopenblas-dev
  libdnnl-dev            # oneDNN 2.6: bf16 GEMM on AVX512-BF16 CPUs (tensor/cpu/internal/onednn_matmul.h)
  zlib1g-dev
  libopenmpi-dev         # Open MPI: //parallel/distributed (processes, CPU collectives)
  openmpi-bin            # mpirun
  clang-14               # libFuzzer targets in fuzz/ (bash fuzz/run.sh)
  libclang-rt-14-dev     # libFuzzer and the sanitizer runtimes for clang-14
  dataset-fashion-mnist
  fortunes               # English text for the GPT example (data/text_corpus.h)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 && "${TANDEM_SETUP_FORCE:-0}" != "1" ]]; then
  echo "setup: all ${#PACKAGES[@]} packages are installed"
  exit 0
fi
if [[ "${TANDEM_SETUP_FORCE:-0}" == "1" ]]; then
  missing=("${PACKAGES[@]}")
fi

if [[ "$(id -u)" -eq 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  echo "setup: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}"
