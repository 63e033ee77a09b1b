#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian packages the build and tests need, only those missing.
# Usage: scripts/deps.sh [--plots] [--fuzz]
#   --plots  adds python3-matplotlib for bench/ plots
#   --fuzz   adds clang, its sanitizer/libFuzzer runtimes, llvm-symbolizer and libomp
#            (scripts/fuzz.sh and the clang sanitizer build in .ci/run)
# Needs root (or sudo) only when something is missing. The CUDA toolkit is never
# installed here: with nvcc on PATH the CUDA parts build, without it they are skipped.
set -euo pipefail

pkgs=(meson ninja-build pkg-config gcc g++ libcriterion-dev libjemalloc-dev libopenblas-dev cmake)
# libxxhash-dev: xxh3-128 block hashes for the prefix pool (headers only, optional).
pkgs+=(libxxhash-dev)
# cmake: the install test checks find_package(pagedkv) (tests/install/run.sh).
# The Python package: headers for the extension, venv for python/run_tests.sh.
pkgs+=(python3-dev python3-venv)
# The ABI check against the committed baseline (scripts/abi_check.sh): abidw, abidiff.
pkgs+=(abigail-tools)
for arg in "$@"; do
    case "$arg" in
    --plots) pkgs+=(python3-matplotlib) ;;
    --fuzz) pkgs+=(clang libclang-rt-dev llvm libomp-dev) ;;
    *) echo "deps: unknown option $arg" >&2; exit 2 ;;
    esac
done

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    echo "deps: all present" >&2
    exit 0
fi
echo "deps: installing ${missing[*]}" >&2
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
