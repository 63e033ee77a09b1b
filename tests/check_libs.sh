#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The lean core and symbol hygiene (issue 10):
#  1. libpagedkv-core.so needs libc only (libm/libpthread/ld.so allowed): no CUDA,
#     BLAS, OpenMP or C++ runtime, so an engine on any CUDA version can load it;
#  2. both shared libraries export pkv_* only;
#  3. the static libraries define no global symbol outside pkv_* / pkvi_* (kernels
#     and helpers are static or prefixed; C++'s EH personality reference and
#     AddressSanitizer's __odr_asan markers aside, and so are weak template
#     instances inside an anonymous namespace: nvcc names that namespace
#     _GLOBAL__N__<hash of the file>, unique per translation unit, so they cannot
#     collide with an engine's symbols).
# Usage: check_libs.sh CORE_SO CORE_A FULL_SO FULL_A
set -euo pipefail
core_so=$1 core_a=$2 full_so=$3 full_a=$4
fail=0

needed=$(readelf -d "$core_so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "libpagedkv-core.so NEEDED: $(echo $needed)"
for lib in $needed; do
    case $lib in
        libc.so.*|libm.so.*|libpthread.so.*|ld-linux*) ;;
        libasan.so.*|libubsan.so.*|liblsan.so.*|libtsan.so.*) ;; # a sanitizer build
        *) echo "FAIL: libpagedkv-core.so needs $lib"; fail=1 ;;
    esac
done
[ -n "$needed" ] || { echo "FAIL: no NEEDED entries read from $core_so"; fail=1; }

for so in "$core_so" "$full_so"; do
    bad=$(nm -D --defined-only "$so" | awk 'NF == 3 && $3 !~ /^pkv_/ && $3 !~ /^PKV_/ {print $3}' |
          grep -v '^_init$\|^_fini$' || true)
    count=$(nm -D --defined-only "$so" | awk 'NF == 3 && $3 ~ /^pkv_/' | wc -l)
    echo "$(basename "$so"): $count pkv_ symbols exported"
    [ "$count" -gt 20 ] || { echo "FAIL: too few exports in $so"; fail=1; }
    [ -z "$bad" ] || { echo "FAIL: $so exports: $bad"; fail=1; }
done

for a in "$core_a" "$full_a"; do
    bad=$(nm -g --defined-only "$a" 2>/dev/null |
          awk 'NF == 3 && $3 !~ /^pkvi?_/ && $3 != "DW.ref.__gxx_personality_v0" &&
               $3 !~ /^__odr_asan/ && !($2 == "W" && $3 ~ /_GLOBAL__N_/) {print $3}' |
          sort -u || true)
    echo "$(basename "$a"): $(nm -g --defined-only "$a" 2>/dev/null | awk 'NF == 3' | wc -l) global definitions"
    [ -z "$bad" ] || { echo "FAIL: $a defines unprefixed globals:"; echo "$bad"; fail=1; }
done
exit $fail
