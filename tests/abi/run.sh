#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Test of the ABI check itself (scripts/abi_check.sh): in a copy of this tree, an added
# function must pass the check, a public function that gains a parameter while the
# version stays must fail it, and the same change with the minor bumped (a new SONAME)
# must pass it.
# Usage: tests/abi/run.sh [WORKDIR]   (default build-abi-test)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mkdir -p "${1:-build-abi-test}" && cd "${1:-build-abi-test}" && pwd)
tree=$work/tree
rm -rf "$tree"
mkdir -p "$tree"
# The files of this checkout (committed or not), without build directories.
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tree")

fail=0
expect() { # expect pass|fail LABEL: run the check on the copy
    local rc=0
    "$tree/scripts/abi_check.sh" "$work/build-$2" >"$work/$2.log" 2>&1 || rc=$?
    if [[ $1 == pass && $rc == 0 ]] || [[ $1 == fail && $rc == 1 ]]; then
        echo "ok   $2 (check exited $rc)"
    else
        echo "FAIL $2: expected the check to $1, it exited $rc:"; cat "$work/$2.log"; fail=1
    fi
}

# A compatible addition (a new function) passes without a bump.
sed -i 's/^int pkv_version(void);/int pkv_version(void);\nint pkv_abi_test_added(void);/' \
    "$tree/include/pkv/version.h.in"
printf '\nint pkv_abi_test_added(void) { return 1; }\n' >>"$tree/src/allocator/status.c"
expect pass added-function

# The signature change: int pkv_version(void) -> int pkv_version(int).
sed -i 's/int pkv_version(void)/int pkv_version(int abi_test)/' \
    "$tree/include/pkv/version.h.in" "$tree/src/allocator/status.c"
sed -i 's/{ return PKV_VERSION; }/{ (void)abi_test; return PKV_VERSION; }/' "$tree/src/allocator/status.c"
grep -q 'pkv_version(int abi_test)' "$tree/include/pkv/version.h.in" ||
    { echo "FAIL: the test could not change pkv_version's signature"; exit 1; }
expect fail changed-signature-same-soname

# The same change released as the next minor: libpagedkv.so.0.N+1.
ver=$(sed -n "s/^  version: '\([0-9.]*\)',/\1/p" "$tree/meson.build" | head -1)
IFS=. read -r major minor patch <<<"$ver"
sed -i "s/^  version: '$ver',/  version: '$major.$((minor + 1)).0',/" "$tree/meson.build"
expect pass changed-signature-bumped
exit "$fail"
