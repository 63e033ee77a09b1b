#!/bin/sh
# SPDX-License-Identifier: MIT
# Mutation check of the emu suite: plant one known bug at a time in a copy of
# the CUDA kernels, build the emulated pkv-check against it, and require that it
# FAILS; the unmutated copy must pass. A planted bug that passes means the
# emulator (or the grid) cannot see that class of bug: the script then exits 1.
# Mutants: a wrong in-block offset, a missing barrier, an off-by-one context end,
# a wrong rescale in the split-K merge, a wrong token offset in the cache write,
# 2-byte units for an 8-bit block copy.
#
# usage: tests/emu/mutate.sh BUILD_DIR   (from the repository root; BUILD_DIR is a
#        configured and built tree: its libpagedkv.a and pkv_config.h are used)
# exit: 0 every mutant caught and the original passes, 1 otherwise, 2 bad usage.
set -u
if [ $# -ne 1 ] || [ ! -f "$1/pkv_config.h" ] || [ ! -f "$1/libpagedkv.a" ]; then
    echo "usage: $0 BUILD_DIR (a built tree with libpagedkv.a; run from the repo root)" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
CXX=${CXX:-c++}
CC=${CC:-cc}
flags="-O1 -g -I$root/tests/emu/include -I$root/tests/emu -I$root/include -I$root -I$build"

# mutate NAME FILE OLD NEW: the kernels with OLD replaced by NEW once in FILE.
mutant() {
    name=$1 file=$2 old=$3 new=$4
    d="$work/$name"
    mkdir -p "$d"
    cp "$root"/src/attention/*.cu "$root"/src/attention/*.cuh "$root"/src/attention/*.h "$d"/
    if [ -n "$old" ]; then
        python3 - "$d/$file" "$old" "$new" <<'EOF' || return 1
import sys
path, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
if text.count(old) < 1:
    sys.exit(f"mutate.sh: pattern not found in {path}: {old!r}")
open(path, "w").write(text.replace(old, new, 1))
EOF
    fi
    for k in attn_decode attn_cache; do
        python3 "$root/tests/emu/translate.py" "$d/$k.cu" "$d/$k.emu.cc" || return 1
        $CXX -std=gnu++17 -fno-strict-aliasing -Wno-unknown-pragmas $flags -I"$d" \
            -c "$d/$k.emu.cc" -o "$d/$k.o" || return 1
    done
    $CXX -std=gnu++17 $flags -c "$root/tests/emu/pkvemu.cc" -o "$d/pkvemu.o" || return 1
    $CC -std=c11 -D_POSIX_C_SOURCE=200809L -DPKV_CHECK_EMU $flags \
        -c "$root/tools/pkv_check.c" -o "$d/check.o" || return 1
    $CXX -o "$d/check" "$d/check.o" "$d/attn_decode.o" "$d/attn_cache.o" "$d/pkvemu.o" \
        "$build/libpagedkv.a" -fopenmp -lm -lpthread || return 1
    timeout 600 "$d/check" --quick >"$d/log" 2>&1
}

fails=0
report() { # NAME EXPECT(pass|fail) RC
    if { [ "$2" = pass ] && [ "$3" -eq 0 ]; } || { [ "$2" = fail ] && [ "$3" -ne 0 ]; }; then
        echo "ok      $1 ($( [ "$2" = pass ] && echo passes || echo caught))"
    else
        echo "MISSED  $1 (expected to $2, exit $3)"
        sed -n '1,15p' "$work/$1/log" 2>/dev/null
        fails=$((fails + 1))
    fi
}

mutant original attn_decode.cu "" ""
report original pass $?

mutant in_block_offset attn_decode.cu \
    'uint64_t in = t & ((1u << a.block_shift) - 1u);' \
    'uint64_t in = (t + 1) & ((1u << a.block_shift) - 1u);'
report in_block_offset fail $?

mutant missing_barrier attn_decode.cu \
    '        __syncthreads();
        if (paged && t1 < end) {' \
    '        if (paged && t1 < end) {'
report missing_barrier fail $?

mutant off_by_one_end attn_decode.cu \
    'const uint32_t end = min((uint64_t)len, (uint64_t)start + a.part_len);' \
    'const uint32_t end = min((uint64_t)len - 1, (uint64_t)start + a.part_len);'
report off_by_one_end fail $?

mutant split_k_rescale attn_decode.cu \
    'x += ml[2 * p + 1] * expf(ml[2 * p] - m) * a.ws_o[(hrow * a.parts + p) * D + d];' \
    'x += ml[2 * p + 1] * a.ws_o[(hrow * a.parts + p) * D + d];'
report split_k_rescale fail $?

mutant cache_write_offset attn_cache.cu \
    'const uint64_t base = blk * block_stride + off * token_stride;' \
    'const uint64_t base = blk * block_stride + off * token_stride + (off == 3);'
report cache_write_offset fail $?

# Issue 20, defect 11: an 8-bit cache copied in 2-byte units counted in bytes.
mutant copy_8bit_unit attn_cache.cu \
    'launch_copy<uint8_t>(base' \
    'launch_copy<uint16_t>(base'
report copy_8bit_unit fail $?

if [ $fails -eq 0 ]; then
    echo "mutate.sh: every planted bug makes the emu suite fail"
    exit 0
fi
echo "mutate.sh: $fails planted bug(s) went unnoticed (or the original failed)"
exit 1
