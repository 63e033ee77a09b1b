// SPDX-License-Identifier: MIT
// bench_vmm: the vAttention design on the CPU, measured side by side in one run.
// (1) Decode attention over the same K/V in three layouts: paged (block table,
//     shuffled blocks, HND blocks), contiguous (one malloc'd token-major cache) and
//     VMM-contiguous (a pkv_vmm_space, host MPROTECT and MEMFD modes, pages
//     committed up to the context): the contiguous kernel runs unchanged on VMM.
//     Calls alternate between layouts; each layout's median is reported.
// (2) The cost of the calls behind VMM: reserve, physical create, map and unmap per
//     page, for each host mode and page size, first growth (creates pages) and
//     regrowth (reuses the free stack).
// Prints tables, or one JSON object with --json. Exit 0 ok, 1 runtime failure, 2 bad usage.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pkv/attention.h"
#include "pkv/vmm.h"
#include "src/attention/half.h"
#include "bench_clock.h"

#define MAX_LIST 8

typedef struct opts {
    uint32_t contexts[MAX_LIST];
    uint32_t nctx;
    uint32_t pages_kib[MAX_LIST];
    uint32_t npage;
    uint32_t batch, heads, kv_heads, dim, block, threads, rounds, map_mib;
    uint32_t attn_page_kib;
    int json;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_vmm [options]\n"
            "Decode attention paged vs contiguous vs VMM-contiguous (fp16), and the cost\n"
            "of VMM reserve/create/map/unmap calls on the host.\n"
            "  --context LIST    contexts in tokens (default 512,2048,8192)\n"
            "  --batch N         sequences per call (default 16)\n"
            "  --heads N         query heads (default 32)\n"
            "  --kv-heads N      K/V heads (default 8)\n"
            "  --head-dim N      (default 128)\n"
            "  --block N         paged block size in tokens (default 16)\n"
            "  --attn-page-kib N VMM page for the attention part (default 2048)\n"
            "  --threads N       CPU threads (default 0 = all cores)\n"
            "  --rounds N        timed calls per layout and point (default 30)\n"
            "  --page-kib LIST   page sizes for the call costs (default 64,2048)\n"
            "  --map-mib N       MiB grown and released per call-cost round (default 256)\n"
            "  --json            one JSON object on stdout\n"
            "  --help            this text\n"
            "Exit: 0 ok, 1 runtime failure, 2 bad usage.\n");
}

static int parse_u32(const char *s, uint32_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > 0x7fffffffUL) return -1;
    *out = (uint32_t)v;
    return 0;
}

static int parse_list(const char *s, uint32_t *out, uint32_t *n) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return -1;
    strcpy(buf, s);
    *n = 0;
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        if (*n == MAX_LIST || parse_u32(t, &out[*n])) return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    const uint32_t c[3] = {512, 2048, 8192};
    memcpy(o->contexts, c, sizeof c);
    o->nctx = 3;
    o->pages_kib[0] = 64;
    o->pages_kib[1] = 2048;
    o->npage = 2;
    o->batch = 16;
    o->heads = 32;
    o->kv_heads = 8;
    o->dim = 128;
    o->block = 16;
    o->rounds = 30;
    o->map_mib = 256;
    o->attn_page_kib = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        } else if (!v) {
            fprintf(stderr, "bench_vmm: unknown option or missing value: %s\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--context")) bad = parse_list(v, o->contexts, &o->nctx);
        else if (!strcmp(a, "--page-kib")) bad = parse_list(v, o->pages_kib, &o->npage);
        else if (!strcmp(a, "--batch")) bad = parse_u32(v, &o->batch);
        else if (!strcmp(a, "--heads")) bad = parse_u32(v, &o->heads);
        else if (!strcmp(a, "--kv-heads")) bad = parse_u32(v, &o->kv_heads);
        else if (!strcmp(a, "--head-dim")) bad = parse_u32(v, &o->dim);
        else if (!strcmp(a, "--block")) bad = parse_u32(v, &o->block);
        else if (!strcmp(a, "--threads")) bad = parse_u32(v, &o->threads);
        else if (!strcmp(a, "--rounds")) bad = parse_u32(v, &o->rounds);
        else if (!strcmp(a, "--map-mib")) bad = parse_u32(v, &o->map_mib);
        else if (!strcmp(a, "--attn-page-kib")) bad = parse_u32(v, &o->attn_page_kib);
        else {
            fprintf(stderr, "bench_vmm: unknown option: %s\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "bench_vmm: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (o->heads % o->kv_heads) {
        fprintf(stderr, "bench_vmm: --kv-heads must divide --heads\n");
        return 2;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint16_t rand_h(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return pkvi_f32_to_f16((float)((rng >> 40) & 0xffff) / 65536.0f - 0.5f);
}

enum { L_PAGED, L_CONTIG, L_VMM_MPROTECT, L_VMM_MEMFD, NUM_LAYOUTS };
static const char *layout_names[NUM_LAYOUTS] = {"paged", "contiguous", "vmm-mprotect",
                                                "vmm-memfd"};

typedef struct point {
    uint32_t context;
    double median[NUM_LAYOUTS]; // seconds per decode call
} point;

// One context: the same K/V values in every layout, then alternating timed calls.
static int bench_attention_point(const opts *o, uint32_t ctx, point *pt) {
    const uint32_t B = o->batch, H = o->kv_heads, D = o->dim, bs = o->block;
    const uint64_t tok_elems = (uint64_t)H * D; // one token of one layer's K (or V)
    const uint32_t nb_seq = (ctx + bs - 1) / bs, nblocks = B * nb_seq;
    const uint64_t blk_elems = (uint64_t)bs * tok_elems;
    int rc = 1;
    uint16_t *pk = malloc(nblocks * blk_elems * 2), *pv = malloc(nblocks * blk_elems * 2);
    uint16_t *ck = malloc((uint64_t)B * ctx * tok_elems * 2);
    uint16_t *cv = malloc((uint64_t)B * ctx * tok_elems * 2);
    uint16_t *q = malloc((uint64_t)B * o->heads * D * 2), *out = malloc((uint64_t)B * o->heads * D * 2);
    int32_t *table = malloc((size_t)nblocks * 4), *lens = malloc((size_t)B * 4);
    pkv_vmm_space *sp[2] = {NULL, NULL};
    double *times = malloc(sizeof(double) * o->rounds * NUM_LAYOUTS);
    if (!pk || !pv || !ck || !cv || !q || !out || !table || !lens || !times) goto done;
    for (uint32_t i = 0; i < nblocks; i++) table[i] = (int32_t)i;
    for (uint32_t i = nblocks; i > 1; i--) { // shuffle: blocks scattered like a busy pool
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t j = (uint32_t)((rng >> 33) % i);
        int32_t t = table[i - 1];
        table[i - 1] = table[j];
        table[j] = t;
    }
    for (uint32_t s = 0; s < B; s++) lens[s] = (int32_t)ctx;
    for (uint64_t i = 0; i < (uint64_t)B * o->heads * D; i++) q[i] = rand_h();
    // Contiguous token-major [seq][token][kv_head][dim]; paged HND [block][head][tok][dim].
    for (uint32_t s = 0; s < B; s++)
        for (uint32_t t = 0; t < ctx; t++)
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t d = 0; d < D; d++) {
                    uint16_t kx = rand_h(), vx = rand_h();
                    uint64_t c = ((uint64_t)s * ctx + t) * tok_elems + (uint64_t)h * D + d;
                    uint64_t b = (uint64_t)table[s * nb_seq + t / bs];
                    uint64_t p = b * blk_elems + ((uint64_t)h * bs + t % bs) * D + d;
                    ck[c] = pk[p] = kx;
                    cv[c] = pv[p] = vx;
                }
    const pkv_vmm_host_mode modes[2] = {PKV_VMM_HOST_MPROTECT, PKV_VMM_HOST_MEMFD};
    void *vk[2], *vv[2];
    uint64_t row_elems = 0;
    for (int m = 0; m < 2; m++) {
        pkv_vmm_params p = pkv_vmm_params_default();
        p.num_slots = B;
        p.num_buffers = 2;
        p.buffer_bytes = (uint64_t)ctx * tok_elems * 2;
        p.page_bytes = (uint64_t)o->attn_page_kib << 10;
        p.host_mode = modes[m];
        pkv_status st = pkv_vmm_space_create_host(&p, &sp[m]);
        if (st != PKV_OK) {
            fprintf(stderr, "bench_vmm: VMM space: %s\n", pkv_status_str(st));
            goto done;
        }
        pkv_vmm_info info;
        pkv_vmm_get_info(sp[m], &info);
        row_elems = info.buffer_bytes / 2;
        pkv_vmm_buffer_ptr(sp[m], 0, &vk[m]);
        pkv_vmm_buffer_ptr(sp[m], 1, &vv[m]);
        for (uint32_t s = 0; s < B; s++) {
            uint32_t slot;
            if (pkv_vmm_slot_acquire(sp[m], &slot) != PKV_OK ||
                pkv_vmm_slot_resize(sp[m], slot, (uint64_t)ctx * tok_elems * 2) != PKV_OK) {
                fprintf(stderr, "bench_vmm: VMM commit failed\n");
                goto done;
            }
            memcpy((uint16_t *)vk[m] + slot * row_elems, ck + (uint64_t)s * ctx * tok_elems,
                   (uint64_t)ctx * tok_elems * 2);
            memcpy((uint16_t *)vv[m] + slot * row_elems, cv + (uint64_t)s * ctx * tok_elems,
                   (uint64_t)ctx * tok_elems * 2);
        }
    }
    pkv_attn_shape sh = {o->heads, H, D, PKV_DTYPE_F16, 0.088f, o->threads};
    pkv_attn_paged_kv paged = {pk, pv, blk_elems, (uint64_t)bs * D, D, bs, nblocks,
                               table, nb_seq, lens};
    pkv_attn_contig_kv contig = {ck, cv, (uint64_t)ctx * tok_elems, D, tok_elems, ctx, lens, NULL};
    pkv_attn_contig_kv vm[2];
    for (int m = 0; m < 2; m++) {
        pkv_attn_contig_kv x = {vk[m], vv[m], row_elems, D, tok_elems, ctx, lens, NULL};
        vm[m] = x;
    }
    for (uint32_t r = 0; r <= o->rounds; r++) { // round 0 warms up
        for (int l = 0; l < NUM_LAYOUTS; l++) {
            double t0 = now();
            pkv_status st = l == L_PAGED    ? pkv_attn_decode_paged_cpu(&sh, B, q, &paged, out)
                            : l == L_CONTIG ? pkv_attn_decode_contig_cpu(&sh, B, q, &contig, out)
                                            : pkv_attn_decode_contig_cpu(&sh, B, q,
                                                                         &vm[l - L_VMM_MPROTECT], out);
            double t = now() - t0;
            if (st != PKV_OK) {
                fprintf(stderr, "bench_vmm: decode (%s): %s\n", layout_names[l],
                        pkv_status_str(st));
                goto done;
            }
            if (r) times[(size_t)l * o->rounds + r - 1] = t;
        }
    }
    pt->context = ctx;
    for (int l = 0; l < NUM_LAYOUTS; l++) {
        qsort(times + (size_t)l * o->rounds, o->rounds, sizeof(double), cmp_double);
        pt->median[l] = times[(size_t)l * o->rounds + o->rounds / 2];
    }
    rc = 0;
done:
    for (int m = 0; m < 2; m++) pkv_vmm_space_destroy(sp[m]);
    free(pk), free(pv), free(ck), free(cv), free(q), free(out), free(table), free(lens);
    free(times);
    return rc;
}

typedef struct call_cost {
    const char *mode;
    uint32_t page_kib;
    uint64_t pages;
    double reserve_us, create_us, map_first_us, map_reuse_us, unmap_us; // per call
} call_cost;

// Grow one row page by page to map_mib (one map call per page), release it, regrow
// from the free stack, release again; `rounds` times. Per-call means from the stats.
static int bench_calls(const opts *o, pkv_vmm_host_mode mode, uint32_t page_kib, call_cost *c) {
    pkv_vmm_params p = pkv_vmm_params_default();
    p.page_bytes = (uint64_t)page_kib << 10;
    p.buffer_bytes = (uint64_t)o->map_mib << 20;
    if (p.buffer_bytes < p.page_bytes) p.buffer_bytes = p.page_bytes;
    p.host_mode = mode;
    uint32_t rounds = o->rounds < 5 ? o->rounds : 5;
    memset(c, 0, sizeof *c);
    c->mode = mode == PKV_VMM_HOST_MEMFD ? "memfd" : "mprotect";
    c->page_kib = page_kib;
    double first_s = 0, reuse_s = 0, unmap_s = 0, create_s = 0, reserve_s = 0;
    uint64_t first_n = 0, reuse_n = 0, unmap_n = 0, create_n = 0;
    for (uint32_t r = 0; r < rounds; r++) {
        pkv_vmm_space *s = NULL;
        if (pkv_vmm_space_create_host(&p, &s) != PKV_OK) return 1;
        pkv_vmm_info info;
        pkv_vmm_get_info(s, &info);
        c->pages = info.pages_per_row;
        uint32_t slot;
        pkv_vmm_slot_acquire(s, &slot);
        pkv_vmm_stats st;
        pkv_vmm_get_stats(s, &st);
        reserve_s += st.reserve_seconds;
        for (int pass = 0; pass < 2; pass++) {
            pkv_vmm_reset_stats(s);
            for (uint64_t pg = 1; pg <= info.pages_per_row; pg++) {
                if (pkv_vmm_slot_resize(s, slot, pg * info.page_bytes) != PKV_OK) {
                    pkv_vmm_space_destroy(s);
                    return 1;
                }
            }
            if (pkv_vmm_slot_resize(s, slot, 0) != PKV_OK) {
                pkv_vmm_space_destroy(s);
                return 1;
            }
            pkv_vmm_get_stats(s, &st);
            if (pass == 0) {
                first_s += st.map_seconds, first_n += st.map_calls;
                create_s += st.create_seconds, create_n += st.create_calls;
            } else {
                reuse_s += st.map_seconds, reuse_n += st.map_calls;
            }
            unmap_s += st.unmap_seconds, unmap_n += st.unmap_calls;
        }
        pkv_vmm_space_destroy(s);
    }
    c->reserve_us = 1e6 * reserve_s / rounds;
    c->create_us = create_n ? 1e6 * create_s / (double)create_n : 0;
    c->map_first_us = first_n ? 1e6 * first_s / (double)first_n : 0;
    c->map_reuse_us = reuse_n ? 1e6 * reuse_s / (double)reuse_n : 0;
    c->unmap_us = unmap_n ? 1e6 * unmap_s / (double)unmap_n : 0;
    return 0;
}

int main(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    point pts[MAX_LIST];
    for (uint32_t i = 0; i < o.nctx; i++)
        if (bench_attention_point(&o, o.contexts[i], &pts[i])) return 1;
    call_cost costs[2 * MAX_LIST];
    uint32_t nc = 0;
    for (uint32_t i = 0; i < o.npage; i++)
        for (int m = 0; m < 2; m++)
            if (bench_calls(&o, m ? PKV_VMM_HOST_MPROTECT : PKV_VMM_HOST_MEMFD, o.pages_kib[i],
                            &costs[nc++])) {
                fprintf(stderr, "bench_vmm: call-cost run failed (page %u KiB)\n",
                        o.pages_kib[i]);
                return 1;
            }
    if (o.json) {
        printf("{\"batch\":%u,\"heads\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"block\":%u,"
               "\"attn_page_kib\":%u,\"dtype\":\"fp16\",\"decode\":[",
               o.batch, o.heads, o.kv_heads, o.dim, o.block, o.attn_page_kib);
        for (uint32_t i = 0; i < o.nctx; i++) {
            printf("%s{\"context\":%u", i ? "," : "", pts[i].context);
            for (int l = 0; l < NUM_LAYOUTS; l++)
                printf(",\"%s_ms\":%.4f", layout_names[l], 1e3 * pts[i].median[l]);
            printf("}");
        }
        printf("],\"calls\":[");
        for (uint32_t i = 0; i < nc; i++)
            printf("%s{\"mode\":\"%s\",\"page_kib\":%u,\"pages\":%llu,\"reserve_us\":%.2f,"
                   "\"create_us\":%.2f,\"map_first_us\":%.2f,\"map_reuse_us\":%.2f,"
                   "\"unmap_us\":%.2f}",
                   i ? "," : "", costs[i].mode, costs[i].page_kib,
                   (unsigned long long)costs[i].pages, costs[i].reserve_us, costs[i].create_us,
                   costs[i].map_first_us, costs[i].map_reuse_us, costs[i].unmap_us);
        printf("]}\n");
        return 0;
    }
    printf("decode attention, fp16, batch %u, heads %u/%u, head_dim %u, paged block %u, "
           "VMM page %u KiB (median of %u calls; ratio = layout / contiguous)\n",
           o.batch, o.heads, o.kv_heads, o.dim, o.block, o.attn_page_kib, o.rounds);
    printf("%8s %11s %11s %11s %11s %7s %9s %9s\n", "context", "paged_ms", "contig_ms",
           "vmm_mprot", "vmm_memfd", "paged/c", "mprot/c", "memfd/c");
    for (uint32_t i = 0; i < o.nctx; i++) {
        const double *m = pts[i].median;
        printf("%8u %11.3f %11.3f %11.3f %11.3f %7.2f %9.2f %9.2f\n", pts[i].context,
               1e3 * m[L_PAGED], 1e3 * m[L_CONTIG], 1e3 * m[L_VMM_MPROTECT],
               1e3 * m[L_VMM_MEMFD], m[L_PAGED] / m[L_CONTIG], m[L_VMM_MPROTECT] / m[L_CONTIG],
               m[L_VMM_MEMFD] / m[L_CONTIG]);
    }
    printf("\nVMM calls on the host (%u MiB grown page by page; microseconds per call)\n",
           o.map_mib);
    printf("%9s %9s %7s %10s %10s %10s %10s %10s\n", "mode", "page_KiB", "pages",
           "reserve", "create", "map_first", "map_reuse", "unmap");
    for (uint32_t i = 0; i < nc; i++)
        printf("%9s %9u %7llu %10.2f %10.2f %10.2f %10.2f %10.2f\n", costs[i].mode,
               costs[i].page_kib, (unsigned long long)costs[i].pages, costs[i].reserve_us,
               costs[i].create_us, costs[i].map_first_us, costs[i].map_reuse_us,
               costs[i].unmap_us);
    return 0;
}
