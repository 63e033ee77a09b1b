// SPDX-License-Identifier: MIT
// An out-of-tree C++17 program built against the installed libpagedkv (the whole
// API through pkv/pkv.h): RAII around the handles, a batch step, a group move.
#include <pkv/pkv.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace {
struct PoolFree { void operator()(pkv_pool *p) const { pkv_pool_destroy(p); } };
struct SetFree { void operator()(pkv_seqset *s) const { pkv_seqset_destroy(s); } };
using Pool = std::unique_ptr<pkv_pool, PoolFree>;
using Set = std::unique_ptr<pkv_seqset, SetFree>;

Pool make_pool(uint32_t n) {
    pkv_pool *p = nullptr;
    return Pool(pkv_pool_create(n, &p) == PKV_OK ? p : nullptr);
}
Set make_set(pkv_pool *pool) {
    pkv_seqset *s = nullptr;
    return Set(pkv_seqset_create(pool, 16, &s) == PKV_OK ? s : nullptr);
}
} // namespace

int main() {
    Pool dev = make_pool(32), host = make_pool(32);
    if (!dev || !host) return 1;
    Set dset = make_set(dev.get()), hset = make_set(host.get());
    if (!dset || !hset) return 1;
    std::vector<pkv_seq_id> ids(4);
    if (pkv_seq_create(dset.get(), &ids[0]) != PKV_OK) return 1;
    if (pkv_seq_append(dset.get(), ids[0], 40, nullptr) != PKV_OK) return 1;
    for (int i = 1; i < 4; i++)
        if (pkv_seq_fork(dset.get(), ids[0], &ids[i]) != PKV_OK) return 1;
    std::vector<uint32_t> counts(4, 1);
    uint32_t need = 0;
    if (pkv_seqset_blocks_needed_batch(dset.get(), ids.data(), counts.data(), 4, &need) != PKV_OK)
        return 1;
    if (pkv_seqset_append_batch(dset.get(), ids.data(), counts.data(), 4, nullptr) != PKV_OK)
        return 1;
    uint32_t ncopies = 0;
    std::vector<pkv_block_copy> copies(8);
    if (pkv_seqset_take_copies(dset.get(), copies.data(), 8, &ncopies) != PKV_OK) return 1;
    std::vector<pkv_seq_id> moved(4);
    std::vector<pkv_block_copy> pairs(16);
    uint32_t np = 0;
    if (pkv_seq_move_group(dset.get(), ids.data(), 4, hset.get(), moved.data(), pairs.data(), 16,
                           &np) != PKV_OK)
        return 1;
    pkv_backend *cuda = nullptr;
    pkv_status cst = pkv_backend_create_cuda(0, &cuda);
    pkv_backend_destroy(cuda);
    std::printf("consumer (C++): step took %u blocks, %u copies, group moved on %u blocks; cuda: %s\n",
                need, ncopies, np, pkv_status_str(cst));
    return need == 3 && ncopies == 3 && np == 6 ? 0 : 1;
}
