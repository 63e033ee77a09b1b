// SPDX-License-Identifier: MIT
// pkv-size for models with KV cache groups: per group its kind, layers, shape, window,
// bytes per token and state per sequence; then per context length the KV bytes of one
// sequence window-aware (sliding / chunked groups keep only their window, state groups
// their state) and not (every attention layer keeps every token, as a uniform paged
// cache does), token-exact (pkv_model_kv_bytes_for_len's figures, before block rounding).
#include "size_groups.h"

#include <inttypes.h>
#include <stdio.h>

static double gib(uint64_t b) { return (double)b / 1073741824.0; }

// The group's shape as text: "8 x 64" (kv heads x head dim), "512 + 64" (latent + rope),
// or the state's bytes per layer.
static void shape_text(const pkv_kv_group *g, char *buf, size_t n) {
    if (g->kind == PKV_LAYER_MLA)
        snprintf(buf, n, "%u + %u", g->latent_dim, g->rope_dim);
    else if (g->kind == PKV_LAYER_STATE)
        snprintf(buf, n, "%" PRIu64 " B/layer", g->state_bytes);
    else
        snprintf(buf, n, "%u x %u%s", g->num_kv_heads, g->head_dim, g->sinks ? " +sinks" : "");
}

// Requests of `per_request` bytes in the KV budget (0 without a budget).
static uint64_t fit(const size_groups_opts *o, uint64_t per_request, uint64_t *budget) {
    *budget = 0;
    if (!o->have_memory || o->memory_bytes <= o->weights_bytes) return 0;
    *budget = (uint64_t)((double)(o->memory_bytes - o->weights_bytes) * o->gpu_util);
    return per_request ? *budget / per_request : 0;
}

static void print_json(const pkv_model_config *c, const size_groups_opts *o,
                       const pkv_kv_group *g, uint32_t n, const uint64_t *aware,
                       const uint64_t *full) {
    printf("{\"model\": \"%s\", \"layers\": %u, \"dtype\": \"%s\", \"elem_bytes\": %" PRIu64
           ", \"batch\": %" PRIu64 ", \"kv_bytes_per_token\": %" PRIu64 ", \"groups\": [",
           c->name, c->num_layers, o->dtype, o->elem_bytes, o->batch,
           pkv_model_kv_bytes_per_token(c, o->elem_bytes));
    for (uint32_t i = 0; i < n; i++)
        printf("%s{\"kind\": \"%s\", \"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, "
               "\"window\": %u, \"latent_dim\": %u, \"rope_dim\": %u, \"sinks\": %u, "
               "\"kv_bytes_per_token\": %" PRIu64 ", \"state_bytes_per_seq\": %" PRIu64 "}",
               i ? ", " : "", pkv_layer_kind_name(g[i].kind), g[i].num_layers, g[i].num_kv_heads,
               g[i].head_dim, g[i].window, g[i].latent_dim, g[i].rope_dim, g[i].sinks,
               pkv_kv_group_bytes_per_token(&g[i], o->elem_bytes), pkv_kv_group_state_bytes(&g[i]));
    printf("], \"lengths\": [");
    for (uint32_t j = 0; j < o->num_seqs; j++) {
        uint64_t budget;
        const uint64_t fit_aware = fit(o, aware[j], &budget), fit_full = fit(o, full[j], &budget);
        printf("%s{\"seq\": %" PRIu64 ", \"kv_bytes_window_aware\": %" PRIu64
               ", \"kv_bytes_all_full\": %" PRIu64 ", \"kv_bytes_total_window_aware\": %" PRIu64
               ", \"kv_bytes_total_all_full\": %" PRIu64,
               j ? ", " : "", o->seqs[j], aware[j], full[j], aware[j] * o->batch, full[j] * o->batch);
        if (o->have_memory)
            printf(", \"requests_fit_window_aware\": %" PRIu64 ", \"requests_fit_all_full\": %" PRIu64,
                   fit_aware, fit_full);
        printf("}");
    }
    printf("], \"params\": %" PRIu64 ", \"active_params\": %" PRIu64 ", \"weights_bytes\": %" PRIu64,
           o->params, pkv_model_active_param_count(c), o->weights_bytes);
    if (o->have_memory) {
        uint64_t budget;
        fit(o, 1, &budget);
        printf(", \"memory_bytes\": %" PRIu64 ", \"gpu_util\": %g, \"kv_budget_bytes\": %" PRIu64,
               o->memory_bytes, o->gpu_util, budget);
    }
    printf("}\n");
}

static void print_text(const pkv_model_config *c, const size_groups_opts *o,
                       const pkv_kv_group *g, uint32_t n, const uint64_t *aware,
                       const uint64_t *full) {
    printf("model              %s\n", c->name);
    printf("layers             %u in %u KV cache groups\n", c->num_layers, n);
    printf("dtype              %s (%" PRIu64 " bytes)\n", o->dtype, o->elem_bytes);
    printf("batch              %" PRIu64 "\n", o->batch);
    printf("\ngroup  kind      layers  shape (heads x dim | latent + rope)  window  "
           "kv bytes/token  state bytes/seq\n");
    for (uint32_t i = 0; i < n; i++) {
        char shape[48], window[16];
        shape_text(&g[i], shape, sizeof shape);
        if (g[i].window)
            snprintf(window, sizeof window, "%u", g[i].window);
        else
            snprintf(window, sizeof window, "-");
        printf("%-6u %-9s %-7u %-36s %-7s %-15" PRIu64 " %" PRIu64 "\n", i,
               pkv_layer_kind_name(g[i].kind), g[i].num_layers, shape, window,
               pkv_kv_group_bytes_per_token(&g[i], o->elem_bytes), pkv_kv_group_state_bytes(&g[i]));
    }
    printf("\nkv per token       %" PRIu64 " bytes (every attention layer keeping it)\n",
           pkv_model_kv_bytes_per_token(c, o->elem_bytes));
    printf("\nper request (token-exact)  window-aware                 all layers full (paged)"
           "      saved\n");
    for (uint32_t j = 0; j < o->num_seqs; j++)
        printf("%-10" PRIu64 " tokens  %15" PRIu64 " B (%8.3f GiB)  %15" PRIu64
               " B (%8.3f GiB)  %5.1f%%\n",
               o->seqs[j], aware[j], gib(aware[j]), full[j], gib(full[j]),
               full[j] ? 100.0 * (double)(full[j] - aware[j]) / (double)full[j] : 0.0);
    if (o->batch > 1)
        for (uint32_t j = 0; j < o->num_seqs; j++)
            printf("batch of %" PRIu64 " at %" PRIu64 " tokens: %.3f GiB window-aware, %.3f GiB "
                   "all full\n",
                   o->batch, o->seqs[j], gib(aware[j] * o->batch), gib(full[j] * o->batch));
    printf("\nweights            %" PRIu64 " bytes (%.3f GiB, %" PRIu64 " params; %" PRIu64
           " active per token)\n",
           o->weights_bytes, gib(o->weights_bytes), o->params, pkv_model_active_param_count(c));
    if (o->have_memory) {
        uint64_t budget;
        fit(o, 1, &budget);
        printf("memory             %" PRIu64 " bytes (%.3f GiB)\n", o->memory_bytes,
               gib(o->memory_bytes));
        if (o->memory_bytes <= o->weights_bytes) {
            printf("requests that fit  0 (the weights alone need %.3f GiB)\n", gib(o->weights_bytes));
            return;
        }
        printf("kv budget          %" PRIu64 " bytes (%.3f GiB: (memory - weights) x %g)\n", budget,
               gib(budget), o->gpu_util);
        for (uint32_t j = 0; j < o->num_seqs; j++) {
            uint64_t b;
            printf("requests that fit  %" PRIu64 " window-aware, %" PRIu64
                   " all full, of %" PRIu64 " tokens\n",
                   fit(o, aware[j], &b), fit(o, full[j], &b), o->seqs[j]);
        }
    }
}

int size_groups_report(const pkv_model_config *c, const size_groups_opts *o) {
    pkv_kv_group g[PKV_MAX_KV_GROUPS];
    uint32_t n = 0;
    if (pkv_model_kv_groups(c, g, &n) != PKV_OK) {
        fprintf(stderr, "pkv-size: model '%s': inconsistent KV cache groups\n", c->name);
        return 2;
    }
    uint64_t aware[8], full[8];
    for (uint32_t j = 0; j < o->num_seqs && j < 8; j++) {
        aware[j] = pkv_model_kv_bytes_for_len(c, o->elem_bytes, o->seqs[j], 1);
        full[j] = pkv_model_kv_bytes_for_len(c, o->elem_bytes, o->seqs[j], 0);
        if (full[j] == 0 || full[j] > UINT64_MAX / o->batch) {
            fprintf(stderr, "pkv-size: the KV cache of %" PRIu64 " tokens x %" PRIu64
                            " requests does not fit in 64 bits\n", o->seqs[j], o->batch);
            return 2;
        }
    }
    if (o->json)
        print_json(c, o, g, n, aware, full);
    else
        print_text(c, o, g, n, aware, full);
    return 0;
}
