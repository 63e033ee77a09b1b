// SPDX-License-Identifier: MIT
// Token sampling: greedy, or temperature softmax restricted to the top-k
// logits, driven by a caller-held splitmix64 state per sequence so that every
// output's randomness is its own. Invariant: a non-greedy draw advances the
// state by exactly one step, whatever the logits are.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pkv/generate.h"

struct pkv_sampler {
    uint32_t vocab;
    float temperature;
    uint32_t top_k;
    float *scratch; // [top_k] heap of the top-k selection
};

pkv_status pkv_sampler_create(uint32_t vocab_size, float temperature, uint32_t top_k,
                              pkv_sampler **out) {
    if (!out || vocab_size == 0 || !(temperature >= 0.0f) || isinf(temperature))
        return PKV_ERR_INVALID_ARG;
    pkv_sampler *s = calloc(1, sizeof *s);
    if (!s) return PKV_ERR_OUT_OF_MEMORY;
    s->vocab = vocab_size;
    s->temperature = temperature;
    s->top_k = top_k >= vocab_size ? 0 : top_k;
    if (s->top_k > 0) {
        s->scratch = malloc((size_t)s->top_k * sizeof(float));
        if (!s->scratch) {
            free(s);
            return PKV_ERR_OUT_OF_MEMORY;
        }
    }
    *out = s;
    return PKV_OK;
}

void pkv_sampler_destroy(pkv_sampler *s) {
    if (!s) return;
    free(s->scratch);
    free(s);
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t pkv_rng_init(uint64_t seed, uint64_t stream) {
    // Mix seed and stream so that nearby pairs give unrelated streams.
    uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull);
    return splitmix64(&s);
}

static void sift_down(float *h, uint32_t n, uint32_t i) {
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] < h[m]) m = l;
        if (r < n && h[r] < h[m]) m = r;
        if (m == i) return;
        float t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

// The k-th largest of a[0..n-1] (1 <= k <= n): a min-heap of the k largest
// seen so far lives in heap[0..k-1]; its root is the answer. O(n log k).
static float kth_largest(const float *a, uint32_t n, uint32_t k, float *heap) {
    memcpy(heap, a, (size_t)k * sizeof(float));
    for (uint32_t i = k / 2; i-- > 0;) sift_down(heap, k, i);
    for (uint32_t i = k; i < n; i++)
        if (a[i] > heap[0]) {
            heap[0] = a[i];
            sift_down(heap, k, 0);
        }
    return heap[0];
}

pkv_status pkv_sampler_sample(pkv_sampler *s, const float *logits, uint64_t *rng,
                              int32_t *token) {
    if (!s || !logits || !rng || !token) return PKV_ERR_INVALID_ARG;
    const uint32_t V = s->vocab;
    for (uint32_t i = 0; i < V; i++)
        if (isnan(logits[i])) return PKV_ERR_INVALID_ARG;
    if (s->temperature == 0.0f) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        *token = (int32_t)best;
        return PKV_OK;
    }
    float thr = -INFINITY, mx = -INFINITY;
    if (s->top_k > 0) {
        thr = kth_largest(logits, V, s->top_k, s->scratch);
    }
    for (uint32_t i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    const double inv_t = 1.0 / s->temperature;
    double sum = 0.0;
    for (uint32_t i = 0; i < V; i++)
        if (logits[i] >= thr) sum += exp((double)(logits[i] - mx) * inv_t);
    // 53 random bits -> [0, 1), scaled to the unnormalized mass.
    double u = (double)(splitmix64(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    double acc = 0.0;
    int32_t last = -1;
    for (uint32_t i = 0; i < V; i++) {
        if (logits[i] < thr) continue;
        acc += exp((double)(logits[i] - mx) * inv_t);
        last = (int32_t)i;
        if (u < acc) {
            *token = (int32_t)i;
            return PKV_OK;
        }
    }
    *token = last; // u rounded up to the total mass: the last candidate
    return PKV_OK;
}
