#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Occupancy and bytes-in-flight model of the CUDA decode kernels on an H200.

MODELLED, NOT MEASURED. From each decode kernel's registers and static shared
memory as ptxas reported them for sm_90 (tests/emu/kernel_resources.h, the table
the CPU emulator answers occupancy from), the H200's SM limits, and the kernel's
design constants (128 threads, U 16-byte K/V loads in flight per thread per step:
8 rows of one load each, 4 rows of two loads for fp32 D = 256 G = 8; 8-bit
caches: one load per two rows, 16 rows per step, at most a 128-token tile),
print per kernel: registers, resident blocks per SM, bytes of
K/V loads in flight per SM, and the share of HBM bandwidth Little's law allows:
min(copy ceiling, SMs x in-flight bytes / latency) / peak. Then, per workload
(heads, batch, context), the split-K plan (attn_plan.c's wave-aware rule, the
same arithmetic), the waves it fills and the modelled share of HBM =
bandwidth share x wave efficiency (work / (waves x resident blocks x partition)).
Assumptions (change them with the options): 132 SMs, 4.8 TB/s peak, a device
copy reaches 4.3 TB/s, 700 ns loaded DRAM latency. Not modelled: the softmax
phases between load phases (barriers), L2 hits, launch cost, the merge kernel.

usage: bench/occupancy_model.py [--header tests/emu/kernel_resources.h]
       [--latency-ns 700] [--markdown]
"""
import argparse
import re

SMS = 132
REGS_PER_PARTITION, PARTITIONS, REG_UNIT = 16384, 4, 256
SMEM_PER_SM, SMEM_RESERVED, SMEM_UNIT = 228 << 10, 1024, 128
WARPS_PER_SM, BLOCKS_PER_SM = 64, 32
THREADS = 128
MIN_PARTITION, MAX_SPLITS, BLOCK_COST, TILE_ROUND = 512, 64, 128, 256
DTYPES = {"f": ("fp32", 4), "6__half": ("fp16", 2), "13__nv_bfloat16": ("bf16", 2)}


def blocks_per_sm(regs, smem, block=THREADS):
    warps = (block + 31) // 32
    n = WARPS_PER_SM // warps
    per_warp = (regs * 32 + REG_UNIT - 1) // REG_UNIT * REG_UNIT
    n = min(n, REGS_PER_PARTITION // per_warp * PARTITIONS // warps)
    s = (smem + SMEM_RESERVED + SMEM_UNIT - 1) // SMEM_UNIT * SMEM_UNIT
    return min(n, SMEM_PER_SM // s, BLOCKS_PER_SM)


def loads_per_thread(es, d, g, q8=False):
    if q8:  # lane pairs share a 16-byte load per two rows (attn_decode.cu: q8_swap)
        nrg = THREADS // min(d // 8, 32)
        rows = min(16, 128 // nrg)
        return rows // 2
    vpr = d * es // 16            # 16-byte loads per row
    nv = vpr // min(vpr, 32)      # per lane per row
    return (4 if g >= 8 and nv > 1 else 8) * nv


def kernels(header):
    """(name, es, D, G, regs, smem) of every decode kernel; 8-bit caches (C =
    unsigned char, mangled 'h') are named 'int8/fp8 (q <dtype>)'."""
    text = open(header, encoding="utf-8").read()
    pat = (r'\{"_ZN13decode_kernelI(f|6__half|13__nv_bfloat16)(f|h|S\d*_)Li(\d+)ELi(\d+)EEEv'
           r'[^"]*", (\d+), (\d+)\}')
    for m in re.finditer(pat, text):
        name, es = DTYPES[m.group(1)]
        if m.group(2) == "h":
            name = f"8-bit (q {name})"
        yield name, es, int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6))


def partition(ctx, n):
    if n <= 1:
        return ctx, 1
    ln = (ctx + n - 1) // n
    ln = (ln + TILE_ROUND - 1) // TILE_ROUND * TILE_ROUND
    return ln, (ctx + ln - 1) // ln


def plan(ctas, wave, ctx):
    def cost(ln, parts):
        return -(-ctas * parts // wave) * (ln + BLOCK_COST)
    best, splits = cost(ctx, 1), 1
    for want in range(2, min(ctx // MIN_PARTITION, MAX_SPLITS) + 1):
        ln, parts = partition(ctx, want)
        c = cost(ln, parts)
        if c < best:
            best, splits = c, parts
    return splits


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--header", default="tests/emu/kernel_resources.h")
    p.add_argument("--latency-ns", type=float, default=700.0)
    p.add_argument("--peak-tbs", type=float, default=4.8)
    p.add_argument("--copy-tbs", type=float, default=4.3)
    a = p.parse_args()
    share = {}
    print("MODELLED (not measured): H200, %d SMs, %.0f ns latency, peak %.1f TB/s, copy %.1f TB/s"
          % (SMS, a.latency_ns, a.peak_tbs, a.copy_tbs))
    print()
    print("| kernel | regs | blocks/SM | loads in flight/thread | KiB in flight/SM | modelled % of HBM |")
    print("|---|---|---|---|---|---|")
    for name, es, d, g, regs, smem in sorted(kernels(a.header), key=lambda k: (k[0], k[2], k[3])):
        b = blocks_per_sm(regs, smem)
        lpt = loads_per_thread(es, d, g, name.startswith("8-bit"))
        inflight = b * THREADS * lpt * 16
        bw = min(a.copy_tbs, SMS * inflight / (a.latency_ns * 1e-9) / 1e12)
        share[(name, d, g)] = (b, bw / a.peak_tbs)
        print(f"| {name} D={d} G={g} | {regs} | {b} | {lpt} | {inflight / 1024:.0f} | {100 * bw / a.peak_tbs:.0f} |")
    for kname in ("fp16", "8-bit (q fp16)"):
        print()
        print(f"| {kname} D=128, heads | batch | context | G kernel | splits | waves | wave eff. | modelled % of HBM |")
        print("|---|---|---|---|---|---|---|---|")
        for heads, kvh in ((32, 32), (32, 8), (64, 8)):
            group = heads // kvh
            g = 1 if group == 1 else 2 if group == 2 else 4 if group <= 4 else 8
            b, frac = share[(kname, 128, g)]
            for batch in (1, 8, 64, 256):
                for ctx in (1024, 4096, 32768):
                    ctas = batch * kvh
                    wave = SMS * b
                    n = plan(ctas, wave, ctx)
                    ln, parts = partition(ctx, n)
                    blocks = ctas * parts
                    waves = -(-blocks // wave)
                    eff = ctas * ctx / (waves * wave * ln)
                    print(f"| {heads}/{kvh} | {batch} | {ctx} | G={g} | {parts} | {blocks / wave:.2f} -> {waves} "
                          f"| {100 * eff:.0f}% | {100 * frac * eff:.0f} |")


if __name__ == "__main__":
    main()
