#!/usr/bin/env bash
# Installs the Debian 12 packages lockstep needs to build, test and run its demos
# (dataset-fashion-mnist for demo.sh, fortunes for demo-gpt.sh; libonnx-dev and
# libprotobuf-dev for the ONNX export, python3-venv for its ONNX Runtime test;
# libturbojpeg0-dev, libjpeg62-turbo-dev and libpng-dev for decoding encoded-image
# shards; libdnnl-dev
# for the default CPU GEMM, Note [CPU GEMM libraries] in kernels/gemm.h;
# nlohmann-json3-dev for every JSON file written, Note [JSON by a library]
# in engine/core/json.h).
# Idempotent: prints nothing and touches nothing when every package is present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools zlib1g-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
  catch2 libfmt-dev libopenblas-dev libdnnl-dev libcli11-dev nlohmann-json3-dev
  libonnx-dev libprotobuf-dev
  clang-format
  dataset-fashion-mnist fortunes
  python3-matplotlib python3-h5py python3-pil python3-venv
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
