#!/bin/sh
# SPDX-License-Identifier: MIT
# GPU check for one H200 (sm_90) lent for a few minutes of device time. The
# binaries are built on a machine without a GPU (--build-prebuilt: sm_90 only,
# static libpagedkv, no Criterion/OpenBLAS/jemalloc) together with the static
# register / SASS step; the GPU machine only runs them, in this order:
#   1. libs: the carried binaries load (ldd); static: ptxas's register lines
#      are there (and sass_loads.py runs here if the build machine had no
#      cuobjdump);
#   2. pkv-check: every CUDA kernel and the CUDA decoder against the CPU (verdict);
#      quant-check (the 8-bit cache write and decode that step 3 times) and
#      window-check (sliding window, chunks, sinks, MLA), each --quick;
#   3. decode attention bandwidth, bench_attention --gpu: MHA 32/32, GQA 32/8 and
#      64/8; batch 1, 8, 64, 256; context 1k, 4k, 32k; fp16, then 8-bit (int8,
#      fp8_e4m3); --max-mib 8192 (a point's K/V per layout);
#   4. ncu: one launch of the decode kernel (DRAM throughput, achieved occupancy,
#      warp stall reasons), batch 64, context 4096, GQA 32/8, fp16;
#   5. compute-sanitizer memcheck on pkv-check's small grid;
#   6. compute-sanitizer racecheck, last, on one split-K case.
# Each step has a time limit and the whole run a deadline (DEADLINE_S, default
# 420 s); the limits add up within it (checked before anything runs). A step
# that fails or times out is recorded and the next one runs. After every step
# OUT holds three files: report.md (the summary and each step's output),
# results.json (every step, the bench results as JSON) and logs.tar.gz (every
# log). A tool a step needs that is missing is a FAIL, never a skip.
#
# usage (from the repo root):
#   bench/gpu_check.sh --build-prebuilt DIR          here, no GPU: build into DIR
#   bench/gpu_check.sh --prebuilt DIR [--dry-run] [--steps LIST] OUT
#   bench/gpu_check.sh [--dry-run] [--steps LIST] OUT [BUILD_DIR]  (build there)
#   --prebuilt DIR  run DIR's binaries (from --build-prebuilt); no build there.
#   --dry-run       no GPU: every GPU step runs its program with --help instead
#                   (it must be built and answer), the plan is checked against
#                   the deadline, and the static step's output is checked. CI runs
#                   it with pkg-config unable to find Criterion/OpenBLAS/jemalloc.
#   --steps LIST    run only these steps (comma separated; a rerun of the failed
#                   ones): pkv_check, quant_check, window_check, bench_mha_fp16, bench_gqa_fp16,
#                   bench_gqa64_fp16, bench_mha_8bit, bench_gqa_8bit,
#                   bench_gqa64_8bit, ncu, memcheck, racecheck.
# environment: DEADLINE_S (default 420); PKV_COMMIT, the commit when the tree
#   has no .git (the device copy has none); the prebuilt DIR records its own.
# exit: 0 every step passed, 1 a step failed or timed out, 2 bad usage, no GPU,
#   or no usable build.
set -u

die() {
    echo "gpu_check: $*" >&2
    exit 2
}

mode=build
dry=0
only=
dir=
while [ $# -gt 0 ]; do
    case $1 in
    --build-prebuilt) mode=prebuild; dir=${2:-}; [ -n "$dir" ] || die "--build-prebuilt needs DIR"; shift 2 ;;
    --prebuilt) mode=prebuilt; dir=${2:-}; [ -n "$dir" ] || die "--prebuilt needs DIR"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --steps) only=",${2:-},"; [ -n "${2:-}" ] || die "--steps needs a list"; shift 2 ;;
    -h | --help) sed -n '3,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --run-build | --run-libs-check) break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) break ;;
    esac
done
[ -x /usr/local/cuda/bin/nvcc ] && PATH="$PATH:/usr/local/cuda/bin"
PATH="$PATH:$HOME/.local/bin"
export PATH

# meson and ninja, also where pip installed them off PATH (python3 -m ...).
find_meson() {
    if command -v meson >/dev/null 2>&1; then
        echo meson
    elif python3 -c 'import mesonbuild' >/dev/null 2>&1; then
        echo "python3 -m mesonbuild.mesonmain"
    fi
}
find_ninja() {
    if command -v ninja >/dev/null 2>&1; then
        command -v ninja
    elif python3 -c 'import ninja' >/dev/null 2>&1; then
        python3 -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))'
    fi
}
src_commit() {
    c=$(git rev-parse --short HEAD 2>/dev/null) || c=
    if [ -n "$c" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        c="$c-dirty"
    fi
    echo "${c:-${PKV_COMMIT:-unknown}}"
}
# C++ names demangled where c++filt exists (binutils; not on every GPU image).
demangle() {
    if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi
}
# The programs the GPU steps run: all that a prebuilt folder holds.
progs="tools/pkv-check tests/quant-check tests/window-check bench/bench_attention"

# setup_and_build BUILD_DIR LOG: an sm_90 build of the programs above, ptxas's
# register / shared memory / spill lines kept in the log (--ptxas-options=-v).
setup_and_build() {
    m=$(find_meson)
    n=$(find_ninja)
    [ -n "$m" ] || { echo "meson not found (PATH, python3 -m mesonbuild, ~/.local/bin)"; return 1; }
    [ -n "$n" ] || { echo "ninja not found (PATH, python3 -m ninja, ~/.local/bin)"; return 1; }
    command -v nvcc >/dev/null 2>&1 || { echo "nvcc not found"; return 1; }
    if [ ! -f "$1/build.ninja" ]; then
        # shellcheck disable=SC2086
        NINJA="$n" $m setup "$1" -Dcuda=enabled -Dgpu_archs=90 -Dbuildtype=release \
            -Ddefault_library=static -Dtests=true -Dcriterion=disabled -Dblas=disabled \
            -Djemalloc=disabled -Dbench=true -Dpython=disabled -Dcuda_args=--ptxas-options=-v || return 1
    fi
    # Recompile the CUDA objects so that ptxas prints their resources again.
    find "$1" -name '*.cu.o' -exec rm -f {} +
    # shellcheck disable=SC2086
    "$n" -C "$1" -j "$(nproc 2>/dev/null || echo 2)" $progs
}

# Entry points for step(): timeout(1) runs programs, not shell functions.
# --run-build DIR: setup_and_build DIR. --run-libs-check BIN...: each BIN's
# shared libraries resolve.
if [ "${1:-}" = --run-build ]; then
    setup_and_build "$2"
    exit $?
fi
if [ "${1:-}" = --run-libs-check ]; then
    shift
    for b in "$@"; do
        ldd "$b" || exit 1
        if ldd "$b" | grep -q 'not found'; then
            echo "$b: a shared library is missing (above)"
            exit 1
        fi
    done
    exit 0
fi

# ---------------- --build-prebuilt DIR: here, on a machine without a GPU ----------------
if [ $mode = prebuild ]; then
    meson_dir="$dir.meson"
    # DIR is replaced: refuse a folder that is not one of ours.
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ] && [ ! -f "$dir/COMMIT" ]; then
        die "$dir exists and is not a prebuilt folder (no COMMIT): pick another DIR"
    fi
    mkdir -p "$dir" || die "cannot create $dir"
    rm -f "$dir"/*
    echo "gpu_check: building sm_90 binaries in $meson_dir (a few minutes on 2 cores)"
    setup_and_build "$meson_dir" >"$dir/build.log" 2>&1 || {
        tail -30 "$dir/build.log" >&2
        die "build failed (log: $dir/build.log)"
    }
    for p in $progs; do
        cp "$meson_dir/$p" "$dir/" || die "no $meson_dir/$p after the build"
    done
    src_commit >"$dir/COMMIT"
    {
        echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -m), $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')"
        echo "nvcc: $(nvcc --version | tail -1)"
        echo "options: -Dgpu_archs=90 -Dbuildtype=release -Ddefault_library=static -Dtests=true -Dcriterion=disabled (only the programs below are built)"
    } >"$dir/BUILD_INFO"
    # Static step: ptxas's resources per kernel (always), and the SASS loads in
    # flight when this machine has cuobjdump (else the GPU machine runs it).
    grep -E 'ptxas info *: (Compiling|Function properties|Used)|spill' "$dir/build.log" \
        | sed 's/^.*ptxas info *: //' | demangle >"$dir/ptxas.txt"
    [ -s "$dir/ptxas.txt" ] || die "no ptxas resource lines in $dir/build.log"
    if command -v cuobjdump >/dev/null 2>&1; then
        # shellcheck disable=SC2046
        python3 bench/sass_loads.py --arch sm_90 "$dir/pkv-check" >"$dir/sass.txt" 2>&1 || die "bench/sass_loads.py failed ($dir/sass.txt)"
    fi
    ls -l "$dir"
    echo "gpu_check: $dir is ready: carry it and run bench/gpu_check.sh --prebuilt $dir OUT"
    exit 0
fi

# ---------------- a check: on the GPU machine, or a dry run ----------------
[ $# -ge 1 ] || die "no OUT directory (see --help)"
out=$1
build=${2:-build-gpucheck}
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
rm -f "$out/report.md" "$out/results.json" "$out/logs.tar.gz"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || die "mktemp failed"
deadline_s=${DEADLINE_S:-420}
start=$(date +%s)
deadline=$((start + deadline_s))
status=0
bindir=
[ $mode = prebuilt ] && bindir=$dir

# Step plan: name and limit in seconds, in the order they run. The limits add
# up within the default deadline (checked below): pkv-check and the benchmarks
# first, the sanitizers last, racecheck (the slowest per kernel) on one case.
# (sass runs there only when the build machine had no cuobjdump.)
plan="libs:10 sass:20 pkv_check:75 quant_check:25 window_check:15 bench_mha_fp16:25
bench_gqa_fp16:25 bench_gqa64_fp16:25 bench_mha_8bit:25 bench_gqa_8bit:25 bench_gqa64_8bit:25
ncu:45 memcheck:40 racecheck:35"
if [ $mode = build ]; then # a build there takes its time from the later steps' share
    plan="build:150 libs:10 sass:20 pkv_check:60 quant_check:15 window_check:10
bench_mha_fp16:10 bench_gqa_fp16:10 bench_gqa64_fp16:10 bench_mha_8bit:10 bench_gqa_8bit:10
bench_gqa64_8bit:10 ncu:25 memcheck:25 racecheck:20"
fi
limit_of() { echo "$plan" | tr ' ' '\n' | sed -n "s/^$1://p"; }
for s in $(echo "$only" | tr ',' ' '); do
    [ -n "$(limit_of "$s")" ] || die "--steps: no step '$s' (see --help)"
done
sum=0 # the limits of the steps that will run (libs and the build always do)
for s in $plan; do
    case ${s%%:*} in
    libs | build) sum=$((sum + ${s#*:})) ;;
    *) if [ -z "$only" ] || case $only in *",${s%%:*},"*) true ;; *) false ;; esac; then
        sum=$((sum + ${s#*:}))
    fi ;;
    esac
done

# ---- the three files in OUT, rewritten after every step ----
commit=$(src_commit)
built_commit=$(cat "$bindir/COMMIT" 2>/dev/null || echo "")
: >"$work/steps.tsv"
: >"$work/sections.md"
if [ $dry -eq 0 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$work/gpu.txt" 2>&1; then
        die "no NVIDIA GPU visible (nvidia-smi failed); use --dry-run here"
    fi
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version \
        --format=csv >>"$work/gpu.txt" 2>&1
else
    echo "dry run: no GPU used" >"$work/gpu.txt"
fi

write_out() {
    verdict=${1:-running}
    {
        echo "# GPU check$([ $dry -eq 1 ] && echo ' (dry run: GPU steps replaced by --help)')"
        echo
        echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); elapsed $(($(date +%s) - start)) s of a $deadline_s s deadline (step limits add up to $sum s)"
        echo "- commit: $commit$([ -n "$built_commit" ] && echo "; binaries built from $built_commit")"
        [ -f "$bindir/BUILD_INFO" ] && sed 's/^/- /' "$bindir/BUILD_INFO"
        echo "- GPU: $(sed -n 1p "$work/gpu.txt")"
        echo "- verdict: **$verdict**"
        echo
        echo "| step | result | seconds | limit |"
        echo "|---|---|---|---|"
        awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$work/steps.tsv"
        cat "$work/sections.md"
    } >"$out/report.md.tmp" && mv "$out/report.md.tmp" "$out/report.md"
    python3 - "$work" "$out/results.json" "$verdict" "$commit" "$built_commit" "$deadline_s" \
        "$dry" <<'PY' || echo "gpu_check: could not write results.json" >&2
import json, os, sys
work, dest, verdict, commit, built, deadline, dry = sys.argv[1:8]
steps = []
with open(os.path.join(work, "steps.tsv")) as f:
    for line in f:
        name, result, secs, limit = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
        steps.append({"step": name, "result": result, "seconds": secs, "limit_s": limit})
bench = {}
for name in sorted(os.listdir(work)):
    if name.endswith(".json"):
        try:
            with open(os.path.join(work, name)) as f:
                bench[name[:-5]] = json.load(f)
        except (OSError, ValueError):
            bench[name[:-5]] = None  # a step killed while writing it
with open(os.path.join(work, "gpu.txt")) as f:
    gpu = f.read().strip()
doc = {"verdict": verdict, "commit": commit, "binaries_commit": built or None,
       "deadline_s": int(deadline), "dry_run": dry == "1", "gpu": gpu, "steps": steps,
       "results": bench}
tmp = dest + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
os.replace(tmp, dest)
PY
    # shellcheck disable=SC2012
    if (cd "$work" && ls -- *.log *.txt 2>/dev/null | tar czf "$out/logs.tar.gz.tmp" -T -); then
        mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz"
    else
        rm -f "$out/logs.tar.gz.tmp"
    fi
}

record() { # NAME RESULT SECONDS LIMIT
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$work/steps.tsv"
    case $2 in PASS*) ;; *) status=1 ;; esac
    write_out
}

section() { # TITLE COMMAND LOGFILE [BYTES]
    {
        echo
        echo "## $1"
        echo
        [ -n "$2" ] && echo "command: \`$2\`" && echo
        echo '```'
        cmd="$work/${3%.log}.cmd.txt"
        if [ -s "$cmd" ]; then # dry run: what would run, and that the program answered
            cat "$cmd"
            echo "(dry run: $(head -1 "$work/$3" 2>/dev/null))"
        elif [ -s "$work/$3" ]; then
            head -c "${4:-12000}" "$work/$3"
        else
            echo "(no output)"
        fi
        echo '```'
    } >>"$work/sections.md"
    write_out
}

wanted() { [ -z "$only" ] || case $only in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# step NAME CMD...: CMD under NAME's limit (bounded by the deadline), output in
# NAME.log. Returns CMD's status.
step() {
    name=$1
    shift
    limit=$(limit_of "$name")
    left=$((deadline - $(date +%s)))
    if [ "$left" -lt 5 ]; then
        record "$name" "FAIL (deadline reached before it ran)" 0 "$limit"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >"$work/$name.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    case $rc in
    0) res=PASS ;;
    124 | 137) res="TIMEOUT (${limit} s)" ;;
    *) res="FAIL (exit $rc)" ;;
    esac
    record "$name" "$res" "$secs" "$limit"
    return $rc
}

# need NAME TOOL...: FAIL step NAME unless every TOOL is on PATH (dry run: noted).
need() {
    name=$1
    shift
    for t in "$@"; do
        if ! command -v "$t" >/dev/null 2>&1; then
            if [ $dry -eq 1 ]; then
                echo "dry run: $t not on this machine (the GPU machine has it)" >>"$work/tools.txt"
                continue
            fi
            record "$name" "FAIL (missing tool: $t)" 0 "$(limit_of "$name")"
            return 1
        fi
    done
    return 0
}

# gpu NAME CMD...: a step that needs the GPU. A dry run runs the first word
# that is an executable file (after any ncu / compute-sanitizer prefix) with
# --help instead, and records the command it would have run.
gpu() {
    name=$1
    shift
    wanted "$name" || return 0
    if [ $dry -eq 0 ]; then
        step "$name" "$@"
        return $?
    fi
    prog=
    for w in "$@"; do
        if [ -f "$w" ] && [ -x "$w" ]; then
            prog=$w
            break
        fi
    done
    echo "would run: $*" >"$work/$name.cmd.txt"
    if [ -z "$prog" ]; then
        record "$name" "FAIL (no built program in: $*)" 0 "$(limit_of "$name")"
        return 1
    fi
    step "$name" "$prog" --help
}

finished=0
finish() {
    [ $finished -eq 1 ] && return
    finished=1
    write_out "$([ $status -eq 0 ] && echo PASS || echo FAIL)"
    rm -rf "$work"
}
trap finish EXIT
trap 'status=1; record "(interrupted)" FAIL - -; finish; exit 1' INT TERM
write_out

# ---- plan: the limits must fit the deadline ----
if [ "$sum" -gt "$deadline_s" ]; then
    record plan "FAIL (step limits add up to $sum s, over the $deadline_s s deadline)" 0 0
else
    record plan "PASS ($sum s of limits within $deadline_s s)" 0 0
fi

# ---- 1. binaries: prebuilt (carried) or built here; then every tool ----
if [ $mode = prebuilt ]; then
    for p in $progs; do
        [ -x "$dir/${p##*/}" ] || die "$dir/${p##*/} missing: run bench/gpu_check.sh --build-prebuilt $dir first"
    done
    check="$dir/pkv-check"
    qcheck="$dir/quant-check"
    wcheck="$dir/window-check"
    battn="$dir/bench_attention"
    [ -f "$dir/ptxas.txt" ] && cp "$dir/ptxas.txt" "$work/ptxas.txt"
    [ -f "$dir/sass.txt" ] && cp "$dir/sass.txt" "$work/sass.txt"
else
    step build "$0" --run-build "$build" || exit 1
    grep -E 'ptxas info *: (Compiling|Function properties|Used)|spill' "$work/build.log" \
        | sed 's/^.*ptxas info *: //' | demangle >"$work/ptxas.txt"
    check="$build/tools/pkv-check"
    qcheck="$build/tests/quant-check"
    wcheck="$build/tests/window-check"
    battn="$build/bench/bench_attention"
fi
# Runtime libraries of a build from another machine: the toolkit's and pip's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
for d in $(python3 -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib")))' 2>/dev/null); do
    LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
step libs "$0" --run-libs-check "$check" "$qcheck" "$wcheck" "$battn"
# The static step must have produced ptxas's resource lines for every build.
if grep -q 'Used [0-9]* registers' "$work/ptxas.txt" 2>/dev/null; then
    record static "PASS ($(grep -c 'Used [0-9]* registers' "$work/ptxas.txt") kernels in ptxas.txt)" 0 0
else
    record static "FAIL (no ptxas register lines: rebuild with --build-prebuilt)" 0 0
fi
[ -s "$work/ptxas.txt" ] && section "Registers, shared memory, spills per kernel (ptxas, sm_90; static)" \
    "" ptxas.txt 8000

# ---- 2. static SASS loads in flight, if the build machine had no cuobjdump ----
if [ ! -s "$work/sass.txt" ] && [ $dry -eq 0 ] && wanted sass; then
    if need sass cuobjdump python3; then
        step sass python3 bench/sass_loads.py --arch sm_90 "$check"
        cp "$work/sass.log" "$work/sass.txt" 2>/dev/null
    fi
fi
[ -s "$work/sass.txt" ] && section "Global loads in flight per thread (sm_90 SASS; static)" \
    "bench/sass_loads.py --arch sm_90" sass.txt 8000

# ---- 3. correctness first: a kernel that is wrong is not worth timing ----
gpu pkv_check "$check"
wanted pkv_check && section "pkv-check: CUDA against the CPU" "pkv-check" pkv_check.log
gpu quant_check "$qcheck" --quick
wanted quant_check && section "quant-check: the 8-bit kernels against the CPU" "quant-check --quick" \
    quant_check.log
gpu window_check "$wcheck" --quick
wanted window_check && section "window-check: window, chunk, sink and MLA decode against the CPU" \
    "window-check --quick" window_check.log

# ---- 4. decode attention bandwidth ----
grid="--gpu --batch 1,8,64,256 --context 1024,4096,32768 --max-mib 8192 --min-time 0.05"
bench() { # NAME HEADS KV_HEADS DTYPES TITLE
    # shellcheck disable=SC2086
    wanted "$1" || return 0
    # shellcheck disable=SC2086
    gpu "$1" "$battn" $grid --dtype "$4" --heads "$2" --kv-heads "$3" --json-out "$work/$1.json"
    section "Decode attention, $5" "bench_attention $grid --dtype $4 --heads $2 --kv-heads $3" "$1.log"
}
bench bench_mha_fp16 32 32 fp16 "MHA 32/32, fp16"
bench bench_gqa_fp16 32 8 fp16 "GQA 32/8 (Llama-3-8B heads), fp16"
bench bench_gqa64_fp16 64 8 fp16 "GQA 64/8 (Llama-3-70B heads), fp16"
bench bench_mha_8bit 32 32 int8,fp8_e4m3 "MHA 32/32, 8-bit"
bench bench_gqa_8bit 32 8 int8,fp8_e4m3 "GQA 32/8, 8-bit"
bench bench_gqa64_8bit 64 8 int8,fp8_e4m3 "GQA 64/8, 8-bit"

# ---- 5. one ncu profile of the decode kernel ----
if wanted ncu && need ncu ncu; then
    gpu ncu ncu --clock-control none -k regex:decode --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section WarpStateStats \
        "$battn" --gpu --dtype fp16 --batch 64 --context 4096 --heads 32 --kv-heads 8 \
        --min-time 0.01
    section "ncu: decode kernel, GQA 32/8, batch 64, context 4096, fp16" "" ncu.log 16000
fi

# ---- 6. memcheck on the small grid, then racecheck on one split-K case ----
if wanted memcheck && need memcheck compute-sanitizer; then
    gpu memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$check" --quick \
        --only decode --only splitk --only prefill --only write --only copy --only bad
    section "compute-sanitizer memcheck (pkv-check --quick)" "" memcheck.log 4000
fi
if wanted racecheck && need racecheck compute-sanitizer; then
    gpu racecheck compute-sanitizer --tool racecheck --error-exitcode 9 "$check" --quick \
        --only splitk --max-cases 1
    section "compute-sanitizer racecheck (pkv-check --quick --only splitk --max-cases 1)" "" \
        racecheck.log 4000
fi

[ -s "$work/tools.txt" ] && section "Tools not checked in the dry run" "" tools.txt
finish
cat "$out/report.md"
exit $status
