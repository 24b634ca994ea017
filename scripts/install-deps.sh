#!/usr/bin/env bash
# Installs the Debian 12 packages lockstep needs to build, test and run its demos
# (dataset-fashion-mnist for demo.sh, fortunes for demo-gpt.sh; libonnx-dev and
# libprotobuf-dev for the ONNX export, python3-venv for its ONNX Runtime test;
# libturbojpeg0-dev, libjpeg62-turbo-dev and libpng-dev for decoding encoded-image
# shards; libdnnl-dev
# for the default CPU GEMM, Note [CPU GEMM libraries] in kernels/gemm.h;
# nlohmann-json3-dev for every JSON file written, Note [JSON by a library]
# in engine/core/json.h; python3-pip for the next step).
# Then cudnn-frontend's headers for cuDNN's fused attention, pinned by hash in
# scripts/cudnn-frontend.txt, into the user's cache (cmake/FindCudnnFrontend.cmake
# looks there); without them, or without a network, lockstep builds without it.
# Idempotent: prints nothing and touches nothing when everything is present.
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
  python3-matplotlib python3-h5py python3-pil python3-venv python3-pip
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cudnn-frontend (header-only): the wheel's include/ only, unpacked where
# cmake/FindCudnnFrontend.cmake looks. A failed fetch is not an error.
frontend_version=1.32.0
frontend_dir="${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/cudnn-frontend-$frontend_version"
if [ ! -f "$frontend_dir/include/cudnn_frontend_version.h" ]; then
  requirements="$(cd "$(dirname "$0")" && pwd)/cudnn-frontend.txt"
  pip=()
  for python in python3 /usr/bin/python3; do
    if "$python" -m pip --version >/dev/null 2>&1; then
      pip=("$python" -m pip)
      break
    fi
  done
  fetch_dir=$(mktemp -d)
  trap 'rm -rf "$fetch_dir"' EXIT
  if [ ${#pip[@]} -gt 0 ] &&
     "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 --implementation cp --abi cp311 --require-hashes \
       -r "$requirements" -d "$fetch_dir" >"$fetch_dir/pip.log" 2>&1 &&
     python3 - "$fetch_dir" "$frontend_dir" <<'UNZIP'
import glob, os, shutil, sys, zipfile
fetch_dir, target = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(fetch_dir, "*.whl"))
staging = os.path.join(fetch_dir, "unpacked")
with zipfile.ZipFile(wheel) as z:
    z.extractall(staging, [n for n in z.namelist() if n.startswith("include/")])
os.makedirs(target, exist_ok=True)
shutil.rmtree(os.path.join(target, "include"), ignore_errors=True)
shutil.move(os.path.join(staging, "include"), os.path.join(target, "include"))
UNZIP
  then
    echo "install-deps: cudnn-frontend $frontend_version headers in $frontend_dir"
  else
    echo "install-deps: could not fetch cudnn-frontend $frontend_version (no network or no pip?" \
         "see below): cuDNN's fused attention will not be built, attention on CUDA runs unfused"
    [ -f "$fetch_dir/pip.log" ] && tail -n 3 "$fetch_dir/pip.log" | sed 's/^/  /'
  fi
fi
