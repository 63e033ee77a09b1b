// SPDX-License-Identifier: MIT
// libFuzzer harness for every trace reader. The first byte picks the format
// (auto, native, Azure, BurstGPT, Mooncake) and --skip-bad; the rest is the
// file. A load either fails with PKV_ERR_FORMAT and a message, or returns a
// valid trace that survives the save-and-reload oracle (fuzz_common.h).
#include <stdint.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const pkv_trace_format formats[] = {PKV_TRACE_AUTO, PKV_TRACE_NATIVE, PKV_TRACE_AZURE,
                                               PKV_TRACE_BURSTGPT, PKV_TRACE_MOONCAKE};
    pkv_trace_load_options o = pkv_trace_load_options_default();
    o.format = formats[(data[0] & 0x7f) % 5];
    o.skip_bad = data[0] >> 7;
    // Auto detection also looks at the name: exercise ".jsonl" sometimes.
    const char *name = (data[0] & 0x7f) % 10 == 5 ? "f.jsonl" : "f.csv";
    pkv_trace *t = NULL;
    pkv_trace_error err;
    memset(&err, 0xAB, sizeof err); // the loader must terminate every string it reports
    pkv_status st = pkv_trace_parse((const char *)data + 1, size - 1, name, &o, &t, &err);
    if (st == PKV_OK) {
        CHECK(t != NULL, "OK without a trace");
        fuzz_check_round_trip(t);
        pkv_trace_destroy(t);
    } else {
        CHECK(st == PKV_ERR_FORMAT || st == PKV_ERR_OUT_OF_MEMORY, "status %d", (int)st);
        CHECK(t == NULL, "failed load wrote *out");
        if (st == PKV_ERR_FORMAT) {
            CHECK(memchr(err.message, 0, sizeof err.message) && err.message[0] != '\0',
                  "no message");
            CHECK(memchr(err.field, 0, sizeof err.field) && memchr(err.file, 0, sizeof err.file),
                  "unterminated field/file");
        }
    }
    return 0;
}
