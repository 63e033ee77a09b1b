#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Mutation check of the emu suite: plant one known bug at a time in a copy of
# the CUDA kernels, build the emulated pkv-check against it, and require that it
# FAILS; the unmutated copy must pass. A planted bug that passes means the
# emulator (or the grid) cannot see that class of bug: the script then exits 1.
# Mutants: a wrong in-block offset, a missing barrier, an off-by-one context end,
# a wrong rescale in the split-K merge, a wrong token offset in the cache write;
# GQA head groups padded wrongly (offset, padded heads written), the caller's
# max_context ignored, carved rows' seq_offsets ignored or a negative one used,
# 8-bit V scales taken from K (int8 per-row, fp8 per-tensor), int8 K scales
# dropped, int8 scales of kv head 0 for every head or of the wrong row base, e4m3
# read without its 2^8 bias, 2-byte units for an 8-bit block copy; a window
# starting one token late, a dropped attention sink, a lost softmax rescale in the
# window / MLA kernel.
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

# mutate NAME FILE OLD NEW [CHECK]: the kernels with OLD replaced by NEW once in
# FILE, run by CHECK: quant (the 8-bit check) or, by default, pkv-check (or the
# 8-bit check for attn_quant.cu).
mutant_run() {
    name=$1 file=$2 old=$3 new=$4 check=${5:-}
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
    # 8-bit mutants run the 8-bit check (the write and the 8-bit decode path),
    # attn_window.cu's (and window_* ones, whose bug may sit in a shared header) the
    # window / MLA check, every other one pkv-check.
    case "$file:$name:$check" in
    attn_quant.cu:* | *:*:quant) kernels="attn_quant attn_decode" check_src=tests/emu/quant_check.c ;;
    attn_window.cu:* | *:window_*) kernels=attn_window check_src=tests/emu/window_check.c ;;
    *) kernels="attn_decode attn_cache" check_src=tools/pkv_check.c ;;
    esac
    objs=
    for k in $kernels; do
        python3 "$root/tests/emu/translate.py" "$d/$k.cu" "$d/$k.emu.cc" || return 1
        $CXX -std=gnu++17 -fno-strict-aliasing -Wno-unknown-pragmas $flags -I"$d" \
            -c "$d/$k.emu.cc" -o "$d/$k.o" || return 1
        objs="$objs $d/$k.o"
    done
    $CC -std=c11 -D_POSIX_C_SOURCE=200809L -DPKV_CHECK_EMU $flags \
        -c "$root/$check_src" -o "$d/check.o" || return 1
    # shellcheck disable=SC2086 # $objs is a list of paths without spaces
    $CXX -o "$d/check" "$d/check.o" $objs "$work/pkvemu.o" "$work/pkvemu_occupancy.o" \
        "$build/libpagedkv.a" -fopenmp -lm -lpthread || return 1
    timeout 600 "$d/check" --quick >"$d/log" 2>&1
}

# The emulator itself does not change between mutants: built once.
for f in pkvemu pkvemu_occupancy; do
    $CXX -std=gnu++17 $flags -c "$root/tests/emu/$f.cc" -o "$work/$f.o" || exit 1
done

# Mutants build and run in parallel, as many at once as there are cores
# (PKV_MUTATE_JOBS), each in its own folder; `mutant` starts one and `report` notes
# what it should do; the verdicts are read, in order, once every mutant has ended.
jobs_max=${PKV_MUTATE_JOBS:-$(nproc)}
mutant() {
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
    (mutant_run "$@"; echo $? >"$work/$1.rc") &
}
expected=()
report() { expected+=("$1:$2"); } # NAME EXPECT(pass|fail)

fails=0
verdict() { # NAME EXPECT(pass|fail) RC
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

mutant original_quant attn_quant.cu "" ""
report original_quant pass $?

mutant original_window attn_window.cu "" ""
report original_window pass $?

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

# Issue 24: GQA group padding (a group of 12 runs as two blocks of 6 heads padded
# to 8), the caller's max_context, carved rows' seq_offsets, 8-bit scales.
mutant gqa_head_group_offset attn_decode.cu \
    'const uint32_t h0 = kvh * a.group + (blockIdx.y % a.gpk) * a.hpc;' \
    'const uint32_t h0 = kvh * a.group + (blockIdx.y % a.gpk) * G;'
report gqa_head_group_offset fail $?

mutant gqa_padded_heads_written attn_decode.cu \
    '        if (g < (int)a.hpc) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    s_red' \
    '        if (g < G) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    s_red'
report gqa_padded_heads_written fail $?

mutant max_context_cap attn_decode.cu \
    'a.cap = r.max_context;' \
    'a.cap = req.max_context;'
report max_context_cap fail $?

mutant seq_offsets_ignored attn_decode.cu \
    'int64_t row0 = a.offsets ? a.offsets[s] : (int64_t)((uint64_t)s * a.seq_stride);' \
    'int64_t row0 = (int64_t)((uint64_t)s * a.seq_stride);'
report seq_offsets_ignored fail $?

mutant seq_offsets_negative attn_decode.cu \
    'if (row0 < 0 || ((uint64_t)row0 * es) % 16 != 0) {' \
    'if (((uint64_t)row0 * es) % 16 != 0) {'
report seq_offsets_negative fail $?

# 8-bit scale handling of the decode kernel's 8-bit path (issue 24).
mutant int8_v_scale attn_decode.cu \
    'vsc = __ldg(reinterpret_cast<const float *>(a.v + o));' \
    'vsc = __ldg(reinterpret_cast<const float *>(a.k + o));' quant
report int8_v_scale fail $?

mutant fp8_v_scale attn_decode.cu \
    'a.vmul = qz->v_scale * pkvi_q8_bias(a.q8_kind);' \
    'a.vmul = qz->k_scale * pkvi_q8_bias(a.q8_kind);' quant
report fp8_v_scale fail $?

mutant int8_k_scale_dropped attn_decode.cu \
    'x *= s_sc[0][i]; // the row' \
    'x *= 1.0f; // the row' quant
report int8_k_scale_dropped fail $?

mutant int8_scale_head_stride attn_decode.cu \
    'uint64_t sc0 = a.scale_offset + (uint64_t)kvh * a.scale_hs * 4u;' \
    'uint64_t sc0 = a.scale_offset;' quant
report int8_scale_head_stride fail $?

mutant int8_scale_contig_row attn_decode.cu \
    'sc0 += (uint64_t)row0 * es;' \
    'sc0 += 0;' quant
report int8_scale_contig_row fail $?

mutant e4m3_bias attn_cuda.cuh \
    'return kind == PKVI_Q8_E4M3 ? 256.0f : 1.0f;' \
    'return 1.0f;' quant
report e4m3_bias fail $?

# Issue 20, defect 11: an 8-bit cache copied in 2-byte units counted in bytes.
mutant copy_8bit_unit attn_cache.cu \
    'launch_copy<uint8_t>(base' \
    'launch_copy<uint16_t>(base'
report copy_8bit_unit fail $?

# Issue 23: the window's first token off by one (the rule the CPU shares), the
# attention sink left out of the denominator, the online softmax's rescale lost.
mutant window_start_off_by_one attn_internal.h \
    'return p >= window ? p - window + 1u : 0u;' \
    'return p >= window ? p - window + 2u : 0u;'
report window_start_off_by_one fail $?

mutant window_sink_dropped attn_window.cu \
    'float den = a.sinks != nullptr ? expf(sink - mx) : 0.0f;' \
    'float den = 0.0f;'
report window_sink_dropped fail $?

mutant window_rescale_lost attn_window.cu \
    'const float alpha = expf(m - m_new); // 0 on the first token (m = -inf)' \
    'const float alpha = m == -INFINITY ? 0.0f : 1.0f;'
report window_rescale_lost fail $?

wait
for e in "${expected[@]}"; do
    n=${e%%:*}
    verdict "$n" "${e##*:}" "$(cat "$work/$n.rc" 2>/dev/null || echo 1)"
done

if [ $fails -eq 0 ]; then
    echo "mutate.sh: every planted bug makes the emu suite fail"
    exit 0
fi
echo "mutate.sh: $fails planted bug(s) went unnoticed (or the original failed)"
exit 1
