#!/usr/bin/env bash
# The GPU peer scripts' self-tests, which need no GPU (tools/test.sh runs them after the
# bindings). bench/peers/*.sh run on the GPU machine, where a broken parser or file writer
# costs device time; their selftests check the parsers against sample outputs, write small
# files as the peers' files are written and run them on stepgraph's CPU reference, and
# drive `stepgraph serve` with the load generator (when the tests' SmolLM2 file is there).
#
#   tools/peer_selftest.sh BUILD_DIR     # a build folder holding the stepgraph program
#
# Needs numpy and PyYAML (tools/test.sh installs them) and the gguf package: imported
# where it is installed, else the wheel .peer-deps/ holds (gguf_peer.sh prepare), else the
# wheel pip downloads (a pure-Python wheel, unpacked onto PYTHONPATH; nothing installed).
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:?usage: tools/peer_selftest.sh BUILD_DIR}" && pwd)
[[ -x $build/stepgraph ]] || { echo "peer_selftest: no $build/stepgraph" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! python3 -c "import gguf" 2>/dev/null; then
  wheel=$(ls .peer-deps/gguf-*.whl 2>/dev/null | head -1 || true)
  if [[ -z $wheel ]]; then
    python3 -m pip download -q --no-deps --only-binary :all: -d "$work/wheel" gguf >&2
    wheel=$(ls "$work"/wheel/gguf-*.whl | head -1)
  fi
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
    "$wheel" "$work/pylib"
  export PYTHONPATH=$work/pylib${PYTHONPATH:+:$PYTHONPATH}
fi
export SG_BUILD=$build SG_PEER_WORK=$work/peers
echo "== peer_selftest: gguf_peer.sh" >&2
bench/peers/gguf_peer.sh selftest
echo "== peer_selftest: family_peer.sh" >&2
bench/peers/family_peer.sh selftest
smollm2="${XDG_CACHE_HOME:-$HOME/.cache}/stepgraph-test/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ -f $smollm2 ]] && ! grep -qa "this stepgraph was built without HTTP" "$build/stepgraph"; then
  echo "== peer_selftest: serve_peer.sh" >&2
  bench/peers/serve_peer.sh selftest
else
  echo "peer_selftest: serve_peer.sh skipped (no $smollm2, or a build without the server)" >&2
fi
