#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install what is missing, build, and run the whole test suite.
# Usage: scripts/test.sh [BUILD_DIR [extra meson setup args...]]   (default build dir: build)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${1:-build}"
shift || true
# nvcc usually lives outside PATH; with it the CUDA backend and kernels build too.
if [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
if [[ ! -f "$build/build.ninja" ]]; then meson setup "$build" "$@"; fi
ninja -C "$build"
# PKV_TIMEOUT_MULTIPLIER: sanitizer builds run several times slower (.ci/run sets it).
meson test -C "$build" --print-errorlogs --num-processes 2 \
    --timeout-multiplier "${PKV_TIMEOUT_MULTIPLIER:-1}"
# The Python package and its pytest suite (python/run_tests.sh); PKV_SKIP_PYTHON=1 skips it.
# PKV_REPLAY: the tool just built, which pagedkv.sweep's reports must match byte for byte.
if [[ "${PKV_SKIP_PYTHON:-0}" != 1 ]]; then
    PKV_REPLAY="$(cd "$build" && pwd)/tools/pkv-replay" python/run_tests.sh build-py
fi
