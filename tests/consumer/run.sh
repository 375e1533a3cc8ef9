#!/usr/bin/env bash
# Builds tests/consumer against fusedopt and runs it, one way per MODE:
#   installed     install BUILD_DIR into a prefix; find_package(fusedopt) on it
#   build-tree    find_package(fusedopt) on BUILD_DIR itself (its export())
#   installed-core
#                 install BUILD_DIR into a prefix; find_package(fusedopt COMPONENTS core) on it
#                 where MPI, fmt and xxHash cannot be found (CMAKE_DISABLE_FIND_PACKAGE_*):
#                 the core needs none of them; and, where the package's comm is a static
#                 library built with MPI, COMPONENTS comm is refused there, saying why
#   shared-subdirectory
#                 add_subdirectory(SOURCE_DIR) in tests/consumer/subdirectory, with
#                 BUILD_SHARED_LIBS=ON and FUSEDOPT_CUDA=OFF (so it also proves the build
#                 without CUDA); run it; install that build (fusedopt's own install rules) into
#                 a prefix; check that libfusedopt.so exports the public API and none of the
#                 internals, and libfusedopt_comm.so none of them either; find_package on
#                 that prefix. One library build serves both.
# Usage: run.sh MODE BUILD_DIR SOURCE_DIR CXX_COMPILER [COMPILER_LAUNCHER]
# Work goes to BUILD_DIR/consumer-MODE.
set -euo pipefail
mode="$1"
build="$(cd "$2" && pwd)"
src="$(cd "$3" && pwd)"
cxx="$4"
launcher="${5:-}"
work="$build/consumer-$mode"
# The vendored library build is kept between runs (incremental, like the main build); the
# install prefix, the consumer build and its cache are made anew each time.
rm -rf "$work/prefix" "$work/build" "$work/cache" "$work/log.txt"
mkdir -p "$work"
common=(-G Ninja -DCMAKE_CXX_COMPILER="$cxx")
[ -z "$launcher" ] || common+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
log="$work/log.txt"
step() {  # runs a command with its output in the log; prints the log if it fails
  if ! "$@" >>"$log" 2>&1; then
    echo "consumer ($mode): failed: $*" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
}

consumer=(cmake -S "$src/tests/consumer" -B "$work/build" "${common[@]}")
case "$mode" in
  installed)
    step cmake --install "$build" --prefix "$work/prefix"
    step "${consumer[@]}" -DCMAKE_PREFIX_PATH="$work/prefix"
    ;;
  build-tree)
    step "${consumer[@]}" -Dfusedopt_DIR="$build"
    ;;
  installed-core)
    step cmake --install "$build" --prefix "$work/prefix"
    none=(-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_xxHash=ON)
    config="$(find "$work/prefix" -name fusedoptConfig.cmake | head -n 1)"
    if grep -q 'if(ON AND NOT OFF AND NOT TARGET MPI::MPI_CXX)' "$config"; then
      # A static comm built with MPI: asked for without MPI, find_package fails, saying so.
      if cmake -S "$src/tests/consumer" -B "$work/build-comm" "${common[@]}" \
           -DCMAKE_PREFIX_PATH="$work/prefix" -DFUSEDOPT_COMPONENTS="core;comm" "${none[@]}" \
           >>"$log" 2>&1; then
        echo "consumer ($mode): COMPONENTS comm was found without MPI" >&2
        exit 1
      fi
      grep -q "fusedopt::core needs no MPI" "$log" || {
        echo "consumer ($mode): COMPONENTS comm without MPI did not say why" >&2
        tail -n 30 "$log" >&2
        exit 1
      }
      rm -rf "$work/build-comm"
    fi
    step "${consumer[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" -DFUSEDOPT_COMPONENTS=core \
      "${none[@]}"
    ;;
  shared-subdirectory)
    # No build type: the library is rebuilt only to be linked, so it compiles unoptimised.
    step cmake -S "$src/tests/consumer/subdirectory" -B "$work/vendored" "${common[@]}" \
      -DFUSEDOPT_SOURCE_DIR="$src" -DBUILD_SHARED_LIBS=ON -DFUSEDOPT_CUDA=OFF \
      -DCMAKE_INSTALL_PREFIX="$work/prefix"
    step cmake --build "$work/vendored" -j 2
    FUSEDOPT_CACHE_DIR="$work/cache" "$work/vendored/consumer"
    step cmake --install "$work/vendored"
    lib="$(find "$work/prefix" -name 'libfusedopt.so.*' -type f | head -n 1)"
    [ -n "$lib" ] || { echo "consumer (shared): no libfusedopt.so.* installed" >&2; exit 1; }
    symbols="$(nm -DC --defined-only "$lib")"
    for api in 'fusedopt::compile_kernel(' 'fusedopt::Rule::preset(' \
               'fusedopt::Optimizer::step(' 'typeinfo for fusedopt::Error' \
               'fusedopt::OptimizerExtension::set_reduction_hook('; do
      grep -qF "$api" <<<"$symbols" || {
        echo "consumer (shared): $lib does not export $api" >&2; exit 1; }
    done
    # The internals, support's included: libfusedopt_comm links its own hidden copy of the
    # support pieces it uses (DynLib, the log), and must not export them either.
    internal='fusedopt::(lang|codegen|jit|provider|runtime|cache|io|support|detail)::'
    comm_lib="$(find "$work/prefix" -name 'libfusedopt_comm.so.*' -type f | head -n 1)"
    [ -n "$comm_lib" ] || {
      echo "consumer (shared): no libfusedopt_comm.so.* installed" >&2; exit 1; }
    for checked in "$lib" "$comm_lib"; do
      internals="$(nm -DC --defined-only "$checked" | grep -E "$internal" || true)"
      if [ -n "$internals" ]; then
        echo "consumer (shared): $checked exports internals:" >&2
        head -n 20 <<<"$internals" >&2
        exit 1
      fi
    done
    echo "consumer (shared): $(basename "$lib") exports $(wc -l <<<"$symbols") symbols," \
         "no internals; $(basename "$comm_lib") none of the core's or support's"
    step "${consumer[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DFUSEDOPT_EXPECT_TYPE=SHARED_LIBRARY
    ;;
  *)
    echo "usage: run.sh installed|build-tree|installed-core|shared-subdirectory BUILD_DIR" \
         "SOURCE_DIR CXX [LAUNCHER]" >&2
    exit 2
    ;;
esac
step cmake --build "$work/build" -j 2
FUSEDOPT_CACHE_DIR="$work/cache" "$work/build/consumer"
rm -rf "$work/prefix" "$work/build" "$work/cache"
