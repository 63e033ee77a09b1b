#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install what is missing, build, and run the main job: replay a bundled trace
# with every KV-cache policy and print the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
if [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
if [[ ! -f build/build.ninja ]]; then meson setup build --buildtype=release; fi
ninja -C build
if [[ -x build/tools/pkv-replay ]]; then
    exec build/tools/pkv-replay traces/conv_small.csv --policy all "$@"
else
    exec build/bench/bench_alloc "$@"
fi
