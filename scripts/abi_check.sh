#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ABI check of the shared libraries (libpagedkv, libpagedkv-core) against the committed
# baseline in abi/, with libabigail (Debian: abigail-tools). CHANGELOG.md states the
# policy this enforces: an incompatible change (a pkv_ function or variable removed, a
# signature or a public type changed) needs a new SONAME, i.e. a minor bump while 0.x.
#
# Usage: scripts/abi_check.sh [--update] [BUILD_DIR]   (default build-abi)
#   check     build the libraries, describe them with abidw, compare with abidiff:
#             exit 1 on an incompatible change while the SONAME is the baseline's;
#             with a new SONAME, or with additions only, say so and exit 0.
#   --update  rewrite abi/*.abi from this tree (after a release's bump, or after
#             merging compatible additions); commit the result.
#
# The build options are fixed here, so the baseline and the check describe the same
# build whatever the caller's tree was configured with: CUDA, BLAS and the tests do not
# change the public pkv_ interface, and only pkv_ symbols are compared (abi/pkv.suppr).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

update=0
if [[ "${1:-}" == "--update" ]]; then update=1; shift; fi
build="${1:-build-abi}"
for tool in abidw abidiff; do
    command -v "$tool" >/dev/null ||
        { echo "abi_check: $tool not found (Debian: apt-get install abigail-tools; scripts/deps.sh)" >&2; exit 2; }
done

# Debug info is what abidw reads; -O0 keeps every parameter's type in it.
# A reused build directory gets the same options again.
opts=(-Dcuda=disabled -Dblas=disabled -Djemalloc=disabled -Dpython=disabled -Dtests=false
      -Dbench=false --buildtype=debug)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [[ -f "$build/build.ninja" ]]; then setup=(meson configure "$build"); else setup=(meson setup "$build"); fi
"${setup[@]}" "${opts[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 2; }
libs=(pagedkv-core pagedkv)
targets=()
for lib in "${libs[@]}"; do
    targets+=("$(meson introspect "$build" --targets |
        python3 -c 'import json,sys; n=sys.argv[1]; print([t["filename"][0] for t in json.load(sys.stdin) if t["name"]==n and t["type"]=="shared library"][0])' "$lib")")
done
build_abs=$(cd "$build" && pwd)
ninja -C "$build" "${targets[@]#"$build_abs/"}" >/dev/null

mkdir -p "$build/abi"
status=0
for i in "${!libs[@]}"; do
    lib=${libs[$i]}
    so=${targets[$i]}
    base=abi/lib$lib.abi
    new=$build/abi/lib$lib.abi
    # Public headers only (the generated version.h lives in the build tree); no paths,
    # locations or DT_NEEDED, so that the file depends on the interface, not the machine.
    abidw --headers-dir include/pkv --header-file "$build/include/pkv/version.h" \
        --suppressions abi/pkv.suppr --drop-private-types --no-corpus-path --no-comp-dir-path \
        --no-show-locs --no-elf-needed --type-id-style hash --out-file "$new" "$so"
    if ((update)); then
        cp "$new" "$base"
        echo "abi_check: wrote $base ($(sed -n "s/.*soname='\([^']*\)'.*/\1/p" "$new" | head -1))"
        continue
    fi
    if [[ ! -f "$base" ]]; then
        echo "abi_check: no baseline $base; run scripts/abi_check.sh --update" >&2
        status=1
        continue
    fi
    old_soname=$(sed -n "s/.*soname='\([^']*\)'.*/\1/p" "$base" | head -1)
    new_soname=$(sed -n "s/.*soname='\([^']*\)'.*/\1/p" "$new" | head -1)
    # Additions are compatible (a minor bump later documents them); everything left after
    # --no-added-syms is a removal or a change of something a program already uses.
    rc=0
    abidiff --no-added-syms --suppressions abi/pkv.suppr "$base" "$new" >"$build/abi/lib$lib.diff" 2>&1 || rc=$?
    if ((rc & 1 || rc & 2)); then
        echo "abi_check: abidiff failed on $lib (status $rc):" >&2
        cat "$build/abi/lib$lib.diff" >&2
        status=1
    elif ((rc == 0)); then
        added=$(abidiff --suppressions abi/pkv.suppr "$base" "$new" 2>&1 | grep -c "^  \[A\]" || true)
        echo "abi_check: $lib ($new_soname) compatible with the baseline ($added added)"
    elif [[ "$old_soname" != "$new_soname" ]]; then
        echo "abi_check: $lib changed incompatibly and its SONAME moved $old_soname -> $new_soname:"
        echo "           allowed; regenerate the baseline (scripts/abi_check.sh --update)"
    else
        echo "abi_check: $lib changed incompatibly but its SONAME is still $new_soname." >&2
        echo "           Bump the version in meson.build (a minor while 0.x), note it in" >&2
        echo "           CHANGELOG.md, then scripts/abi_check.sh --update. abidiff says:" >&2
        cat "$build/abi/lib$lib.diff" >&2
        status=1
    fi
done
exit "$status"
