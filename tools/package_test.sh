#!/usr/bin/env bash
# stepgraph as a CMake package: installs a finished build into a temporary prefix, checks
# that nothing installed points back into the source or build tree, then configures,
# builds and runs tests/package_consumer against the prefix with find_package(stepgraph).
# Usage: tools/package_test.sh [build-dir]   (default: build/nocuda, already built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/nocuda}
[[ -f $build/CMakeCache.txt ]] || { echo "package_test: $build is not a configured build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

# Quiet unless a step fails; then its output.
run() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; echo "package_test: failed: $*" >&2; exit 1; }; }

run cmake --install "$build" --prefix "$prefix"
config=$(find "$prefix" -name stepgraphConfig.cmake -print -quit)
[[ -n $config ]] || { echo "package_test: no stepgraphConfig.cmake under $prefix" >&2; exit 1; }
# Public headers only through the install interface: an installed target that named a
# path of this checkout would work here and break everywhere else.
if grep -rlF "$PWD" "$(dirname "$config")"; then
  echo "package_test: the installed package names paths of the source tree ($PWD)" >&2
  exit 1
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# A build with ASan and UBSan (STEPGRAPH_SANITIZE) installs instrumented libraries: the
# consumer links the sanitizer runtimes too.
link_flags=()
if grep -q "^STEPGRAPH_SANITIZE:BOOL=ON" "$build/CMakeCache.txt"; then
  link_flags=(-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined)
fi
run cmake -S tests/package_consumer -B "$work/consumer" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" "${link_flags[@]}"
run cmake --build "$work/consumer"
"$work/consumer/package_consumer"
