#!/usr/bin/env bash
# The CUDA-free configuration under ASan and UBSan, alone: every ctest suite (the fuzz
# corpus replays included), the find_package consumer, pytest and cargo test, with any
# sanitizer report failing the test that made it. This is tools/test.sh with
# STEPGRAPH_CONFIGS=nocuda STEPGRAPH_SANITIZE_NOCUDA=1 (see there).
# Build folder: build/sanitize (build/ overridden by STEPGRAPH_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPGRAPH_CONFIGS=nocuda STEPGRAPH_SANITIZE_NOCUDA=1 exec tools/test.sh
