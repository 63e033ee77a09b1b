// SPDX-License-Identifier: MIT
// Reader and writer of the llama2.c checkpoint format (see model.h for the byte
// layout). The file's tensors are mapped onto our weight block: wq, wk and wv
// stack into the fused wqkv rows of each layer, w1 -> w_gate, w3 -> w_up,
// w2 -> w_down. Invariant: a load either produces a model whose every weight
// came from the file, or fails with the file name and the problem in `err`.
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

static void set_err(char *err, size_t cap, const char *fmt, ...) {
    if (!err || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

// Read n floats or report a short file.
static int read_floats(FILE *f, float *dst, uint64_t n) {
    return fread(dst, sizeof(float), (size_t)n, f) == (size_t)n;
}

pkv_status pkv_model_load_llama2c(const char *path, const pkv_model_params *params,
                                  pkv_model **out, char *err, size_t err_cap) {
    if (err && err_cap) err[0] = '\0';
    if (!path || !params || !out) {
        set_err(err, err_cap, "llama2c loader: NULL argument");
        return PKV_ERR_INVALID_ARG;
    }
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, err_cap, "%s: cannot open: %s", path, strerror(errno));
        return PKV_ERR_IO;
    }
    int32_t hdr[7];
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    if (fread(hdr, sizeof hdr, 1, f) != 1) {
        set_err(err, err_cap, "%s: file shorter than the 28-byte header", path);
        fclose(f);
        return PKV_ERR_FORMAT;
    }
    for (int i = 0; i < 7; i++) {
        // Each field below 2^20 keeps the size arithmetic below in range.
        if (hdr[i] == 0 || (hdr[i] < 0 && i != 5) || hdr[i] < -(1 << 20) || hdr[i] > (1 << 20)) {
            set_err(err, err_cap, "%s: header field %s = %d is invalid", path, names[i], hdr[i]);
            fclose(f);
            return PKV_ERR_FORMAT;
        }
    }
    const int shared = hdr[5] > 0;
    pkv_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "llama2c");
    c.d_model = (uint32_t)hdr[0];
    c.d_ff = (uint32_t)hdr[1];
    c.num_layers = (uint32_t)hdr[2];
    c.num_heads = (uint32_t)hdr[3];
    c.num_kv_heads = (uint32_t)hdr[4];
    c.vocab_size = (uint32_t)(shared ? hdr[5] : -hdr[5]);
    c.max_seq_len = (uint32_t)hdr[6];
    c.norm = PKV_NORM_RMSNORM;
    c.ffn = PKV_FFN_SWIGLU;
    c.pos = PKV_POS_ROPE;
    c.tied_embeddings = shared;
    c.use_bias = 0;
    c.norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    if (c.d_model % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0 ||
        (c.d_model / c.num_heads) % 2 != 0) {
        set_err(err, err_cap,
                "%s: header shape mismatch: dim %u, n_heads %u, n_kv_heads %u (need heads | dim, "
                "kv_heads | heads, even head size)",
                path, c.d_model, c.num_heads, c.num_kv_heads);
        fclose(f);
        return PKV_ERR_FORMAT;
    }
    c.head_dim = c.d_model / c.num_heads;
    // Expected size, checked before any big allocation so that a header that
    // claims a huge model fails fast on a small file.
    const uint64_t L = c.num_layers, d = c.d_model, hdim = c.d_ff, V = c.vocab_size,
                   kvd = (uint64_t)c.num_kv_heads * c.head_dim, hs = c.head_dim;
    uint64_t floats = V * d + L * d + L * d * d + 2 * L * kvd * d + L * d * d + L * d +
                      3 * L * hdim * d + d + (uint64_t)c.max_seq_len * hs + (shared ? 0 : V * d);
    if (floats > (1ull << 50)) {
        set_err(err, err_cap, "%s: header implies %llu weights, implausibly many", path,
                (unsigned long long)floats);
        fclose(f);
        return PKV_ERR_FORMAT;
    }
    uint64_t expect = 28 + 4 * floats;
    if (fseek(f, 0, SEEK_END) != 0) {
        set_err(err, err_cap, "%s: cannot seek: %s", path, strerror(errno));
        fclose(f);
        return PKV_ERR_IO;
    }
    long size = ftell(f);
    if (size < 0 || fseek(f, 28, SEEK_SET) != 0) {
        set_err(err, err_cap, "%s: cannot seek: %s", path, strerror(errno));
        fclose(f);
        return PKV_ERR_IO;
    }
    if ((uint64_t)size != expect) {
        set_err(err, err_cap,
                "%s: file is %ld bytes but its header (dim %u, hidden %u, layers %u, heads %u, "
                "kv_heads %u, vocab %u, seq_len %u) implies %llu bytes (%s)",
                path, size, c.d_model, c.d_ff, c.num_layers, c.num_heads, c.num_kv_heads,
                c.vocab_size, c.max_seq_len, (unsigned long long)expect,
                (uint64_t)size < expect ? "truncated" : "trailing bytes");
        fclose(f);
        return PKV_ERR_FORMAT;
    }
    pkv_model *m = NULL;
    pkv_status st = pkvi_model_alloc(&c, params, &m);
    if (st != PKV_OK) {
        set_err(err, err_cap, "%s: cannot allocate the model: %s", path, pkv_status_str(st));
        fclose(f);
        return st;
    }
    float *block = malloc((size_t)pkvi_weights_count(&c) * sizeof(float));
    if (!block) {
        set_err(err, err_cap, "%s: out of memory for %llu weights", path,
                (unsigned long long)pkvi_weights_count(&c));
        pkv_model_destroy(m);
        fclose(f);
        return PKV_ERR_OUT_OF_MEMORY;
    }
    pkvi_weights w;
    pkvi_weights_carve(&c, block, &w);
    const uint64_t qkv = d + 2 * kvd;
    int ok = read_floats(f, w.wte, V * d) && read_floats(f, w.ln1_w, L * d);
    for (uint64_t l = 0; ok && l < L; l++) ok = read_floats(f, w.wqkv + l * qkv * d, d * d);
    for (uint64_t l = 0; ok && l < L; l++) ok = read_floats(f, w.wqkv + (l * qkv + d) * d, kvd * d);
    for (uint64_t l = 0; ok && l < L; l++)
        ok = read_floats(f, w.wqkv + (l * qkv + d + kvd) * d, kvd * d);
    ok = ok && read_floats(f, w.wo, L * d * d) && read_floats(f, w.ln2_w, L * d) &&
         read_floats(f, w.w_gate, L * hdim * d) && read_floats(f, w.w_down, L * d * hdim) &&
         read_floats(f, w.w_up, L * hdim * d) && read_floats(f, w.lnf_w, d);
    // The two RoPE tables of old checkpoints: we compute RoPE ourselves.
    ok = ok && fseek(f, (long)((uint64_t)c.max_seq_len * hs * sizeof(float)), SEEK_CUR) == 0;
    if (ok && !shared) ok = read_floats(f, w.lm_head, V * d);
    fclose(f);
    if (!ok) {
        set_err(err, err_cap, "%s: read failed in the weights", path);
        free(block);
        pkv_model_destroy(m);
        return PKV_ERR_IO;
    }
    st = pkvi_model_set_weights(m, block);
    free(block);
    if (st != PKV_OK) {
        set_err(err, err_cap, "%s: cannot upload the weights: %s", path, pkv_status_str(st));
        pkv_model_destroy(m);
        return st;
    }
    *out = m;
    return PKV_OK;
}

static int write_floats(FILE *f, const float *src, uint64_t n) {
    return fwrite(src, sizeof(float), (size_t)n, f) == (size_t)n;
}

pkv_status pkv_model_save_llama2c(const pkv_model *m, const char *path) {
    if (!m || !path) return PKV_ERR_INVALID_ARG;
    const pkv_model_config *c = &m->cfg;
    if (c->norm != PKV_NORM_RMSNORM || c->ffn != PKV_FFN_SWIGLU || c->pos != PKV_POS_ROPE ||
        c->use_bias || c->head_dim * c->num_heads != c->d_model || c->d_model > INT32_MAX ||
        c->vocab_size > INT32_MAX || c->num_kv_groups) // the format has no layer kinds
        return PKV_ERR_UNSUPPORTED;
    float *block = malloc((size_t)pkvi_weights_count(c) * sizeof(float));
    if (!block) return PKV_ERR_OUT_OF_MEMORY;
    pkv_status st = pkvi_model_get_weights(m, block);
    if (st != PKV_OK) {
        free(block);
        return st;
    }
    pkvi_weights w;
    pkvi_weights_carve(c, block, &w);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(block);
        return PKV_ERR_IO;
    }
    int32_t hdr[7] = {(int32_t)c->d_model,      (int32_t)c->d_ff,
                      (int32_t)c->num_layers,   (int32_t)c->num_heads,
                      (int32_t)c->num_kv_heads, (int32_t)c->vocab_size * (c->tied_embeddings ? 1 : -1),
                      (int32_t)c->max_seq_len};
    const uint64_t L = c->num_layers, d = c->d_model, hdim = c->d_ff, V = c->vocab_size,
                   kvd = (uint64_t)c->num_kv_heads * c->head_dim, qkv = d + 2 * kvd;
    int ok = fwrite(hdr, sizeof hdr, 1, f) == 1 && write_floats(f, w.wte, V * d) &&
             write_floats(f, w.ln1_w, L * d);
    for (uint64_t l = 0; ok && l < L; l++) ok = write_floats(f, w.wqkv + l * qkv * d, d * d);
    for (uint64_t l = 0; ok && l < L; l++) ok = write_floats(f, w.wqkv + (l * qkv + d) * d, kvd * d);
    for (uint64_t l = 0; ok && l < L; l++)
        ok = write_floats(f, w.wqkv + (l * qkv + d + kvd) * d, kvd * d);
    ok = ok && write_floats(f, w.wo, L * d * d) && write_floats(f, w.ln2_w, L * d) &&
         write_floats(f, w.w_gate, L * hdim * d) && write_floats(f, w.w_down, L * d * hdim) &&
         write_floats(f, w.w_up, L * hdim * d) && write_floats(f, w.lnf_w, d);
    // Zeroed RoPE tables keep the layout of the format; readers recompute them.
    const float zero = 0.0f;
    for (uint64_t i = 0; ok && i < (uint64_t)c->max_seq_len * c->head_dim; i++)
        ok = fwrite(&zero, sizeof zero, 1, f) == 1;
    if (ok && !c->tied_embeddings) ok = write_floats(f, w.lm_head, V * d);
    free(block);
    if (fclose(f) != 0) ok = 0;
    return ok ? PKV_OK : PKV_ERR_IO;
}
