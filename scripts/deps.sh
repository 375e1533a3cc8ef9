# Sourced by scripts/test and scripts/demo: installs what is missing from Debian's packages.
# The CUDA toolkit is expected at /usr/local/cuda (headers only at build time; NVRTC is
# loaded at run time); without it fusedopt builds without CUDA.
# libopenblas0: the host BLAS the matrix stage's GEMMs load at run time (dlopen, as NVRTC).
fusedopt_deps=(cmake ninja-build g++ pkg-config libfmt-dev libxxhash-dev doctest-dev
               libbenchmark-dev clang-format libopenmpi-dev openmpi-bin libopenblas0)

# Installs those of the Debian packages "$@" that are not installed (apt-get update first).
apt_ensure() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
}

ensure_deps() {
  apt_ensure "${fusedopt_deps[@]}"
  # The safetensors interop test (io_python) checks our files with the reference package.
  if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
    echo "installing: python3 safetensors numpy (pip)"
    python3 -m pip install --quiet safetensors numpy
  fi
  if [ ! -f /usr/local/cuda/include/nvrtc.h ]; then
    echo "note: no CUDA toolkit in /usr/local/cuda: building without CUDA (host kernels only)"
  elif ! python3 -c 'import nvidia, os, sys; sys.exit(not os.path.exists(os.path.join(list(nvidia.__path__)[0], "cu13", "bin", "cuobjdump")))' 2>/dev/null; then
    # tests/cuda/test_sass.cpp reads the SASS of our CUBINs with cuobjdump (not in the
    # toolkit's Debian layout here; NVIDIA ships it on PyPI).
    echo "installing: nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (pip)"
    python3 -m pip install --quiet nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm ||
      echo "note: could not install cuobjdump: the SASS test will be skipped"
    chmod +x "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')"/cu13/bin/* 2>/dev/null || true
  fi
}

# What the Python package's build and tests need (scripts/test-python): Debian's python3 with
# its torch (CPU), numpy, pytest, venv and headers. scikit-build-core and nanobind come
# from PyPI into the package's virtual environment.
fusedopt_python_deps=(python3-torch python3-numpy python3-pytest python3-venv python3-dev)

ensure_python_deps() {
  apt_ensure "${fusedopt_python_deps[@]}"
}

# The torch 2.x the Python package is tested with besides Debian's 1.13 (scripts/test-python):
# PyPI's build, pinned; bump it on purpose, with the suite run under the new one.
fusedopt_torch2_version=2.15.0

# A virtual environment at $1 (over Debian's python3, not its packages) with PyPI's torch
# $fusedopt_torch2_version and what the package's build and tests need; made or completed
# only where something is missing (torch and its nvidia-* dependencies: about 7 GB, 1.5 min).
ensure_torch2_venv() {
  local venv="$1" want="torch==$fusedopt_torch2_version"
  [ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")" && /usr/bin/python3 -m venv "$venv"; }
  if ! "$venv/bin/python" - "$fusedopt_torch2_version" 2>/dev/null <<'PY'
import sys
import nanobind, numpy, pytest, scikit_build_core, torch
sys.exit(torch.__version__.split("+")[0] != sys.argv[1])
PY
  then
    echo "installing: $want numpy pytest scikit-build-core nanobind (pip, into $venv)"
    "$venv/bin/python" -m pip install --quiet "$want" numpy pytest scikit-build-core nanobind
  fi
}

# Configures and builds into $1 (Release).
build_fusedopt() {
  local build="$1"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc)"
}
