#!/usr/bin/env bash
# Installs everything DawnPiper needs on a fresh Debian bookworm machine:
#   - compilers and libraries from apt (Open MPI, HDF5, Boost.Program_options, nlohmann-json,
#     Catch2, ccache);
#   - LibTorch 2.11 (CUDA 13 build) unpacked from the PyPI torch wheel into .deps/site/torch,
#     plus the three CUDA runtime libraries it links that the CUDA toolkit does not ship
#     (cuSPARSELt, NVSHMEM, cuFile) into .deps/site/nvidia: the same layout as site-packages,
#     so the RPATH baked into libtorch_cuda.so ($ORIGIN/../../nvidia/...) finds them;
#   - a Python environment (.deps/venv, Debian's python3.11) for the model exporter and the data
#     preparation: torch is that same unzipped wheel (a .pth file puts .deps/site on its path),
#     with torch's pure-Python dependencies, transformers, tokenizers and safetensors from PyPI.
#     Run it through scripts/python, which sets the library paths the CUDA wheel needs.
# Idempotent: a second run only checks. No other Python environment is touched.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
torch_version="${DAWNPIPER_TORCH_VERSION:-2.11.0}"

apt_pkgs=(build-essential cmake ninja-build ccache unzip python3-pip
          libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          libboost-program-options-dev nlohmann-json3-dev catch2 python3-h5py python3-matplotlib python3-venv
          slurm-wlm munge clang-format)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# pip only downloads here; any interpreter with pip will do.
pip_cmd=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -m pip --version >/dev/null 2>&1; then pip_cmd="$py -m pip"; break; fi
done
[ -n "$pip_cmd" ] || { echo "setup: no pip found (apt-get install python3-pip)" >&2; exit 1; }

fetch_wheel() {  # fetch_wheel SPEC DEST: download one wheel for CPython 3.11 / manylinux x86_64
  $pip_cmd download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$2" "$1"
}

site="$deps/site"
if [ ! -f "$site/.complete-$torch_version" ]; then
  echo "setup: fetching LibTorch $torch_version (torch wheel) and cuSPARSELt, NVSHMEM, cuFile"
  rm -rf "$site" "$deps/wheels" "$site.tmp" && mkdir -p "$deps/wheels" "$site.tmp"
  for spec in "torch==$torch_version" nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 \
              nvidia-cufile==1.20.0.107; do
    fetch_wheel "$spec" "$deps/wheels"
  done
  # The whole wheel: LibTorch for the C++ build, the Python package for the exporter.
  unzip -q "$deps"/wheels/torch-*.whl -d "$site.tmp"
  for w in "$deps"/wheels/nvidia_*.whl; do unzip -q -o "$w" 'nvidia/*/lib/lib*.so*' -d "$site.tmp"; done
  rm -rf "$deps/wheels" && mv "$site.tmp" "$site"
  touch "$site/.complete-$torch_version"
fi
# Python environment. Versions are pinned so an export made today is reproducible.
venv="$deps/venv"
py_reqs="$root/scripts/python-requirements.txt"
py_stamp="$venv/.complete-$torch_version-$(md5sum <"$py_reqs" | cut -c1-8)"
if [ ! -f "$py_stamp" ]; then
  echo "setup: creating the Python environment $venv (transformers, tokenizers, safetensors)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" >"$purelib/dawnpiper-torch.pth"
  # torch is not pip-installed, so pip reports its CUDA dependencies as missing: they are in
  # .deps/site/nvidia and /usr/local/cuda. The log is shown only if the install fails.
  "$venv/bin/python" -m pip install --disable-pip-version-check --only-binary=:all: --no-deps -r "$py_reqs" \
    >"$deps/pip.log" 2>&1 || { cat "$deps/pip.log" >&2; exit 1; }
  "$root/scripts/python" -c 'import torch, transformers, safetensors, tokenizers' ||
    { echo "setup: the Python environment does not import torch and transformers" >&2; exit 1; }
  touch "$py_stamp"
fi
echo "setup: dependencies ready (LibTorch in $site/torch, Python in $venv: scripts/python)"
