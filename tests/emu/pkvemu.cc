// SPDX-License-Identifier: MIT
// pkvemu runtime: fibers, the block scheduler, barriers and warp collectives with
// their checks, the device-memory registry with guard pages, and the runtime API
// subset (pkvemu.h says what is emulated and what is reported).
// Invariant: one launch at a time on the calling OS thread; a launch runs to
// completion before it returns (every call is synchronous, streams are ignored).
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <vector>

#include "pkvemu.h"

#if defined(__SANITIZE_ADDRESS__)
#define PKVEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PKVEMU_ASAN 1
#endif
#endif
#ifdef PKVEMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

extern "C" char __start_pkvemu_shared[];
extern "C" char __stop_pkvemu_shared[];
// The section must exist even if no kernel declares __shared__ memory.
static __attribute__((section("pkvemu_shared"), used)) char pkvemu_shared_anchor[16];

namespace pkvemu {

thread_ctx *g_cur;
void thread_exit();

namespace {

const size_t kStack = 256u << 10; // per fiber; a PROT_NONE page below it
const int kMaxThreads = 1024;

// ---- context switch --------------------------------------------------------
#if defined(__x86_64__)
// pkvemu_swap(save, to): push the callee-saved registers, save rsp in *save,
// load `to` as rsp, pop, return into the other context.
extern "C" void pkvemu_swap(void **save, void *to);
asm(".text\n"
    ".globl pkvemu_swap\n"
    ".hidden pkvemu_swap\n"
    ".type pkvemu_swap,@function\n"
    "pkvemu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size pkvemu_swap,.-pkvemu_swap\n");
#endif

struct fiber {
    thread_ctx ctx;
    char *stack = nullptr; // usable stack [stack, stack + kStack)
#if defined(__x86_64__)
    void *sp = nullptr;
#else
    ucontext_t uc;
#endif
    int state = 0;                     // 0 runnable, 1 waiting, 2 done
    const uint64_t *wait_gen = nullptr; // waiting until *wait_gen != wait_val
    uint64_t wait_val = 0;
    const char *wfile = "";
    int wline = 0;
    int coll = 0; // warp collectives this lane has entered
};

struct warp_state {
    uint64_t gen = 0; // collectives completed
    int count = 0;    // lanes arrived at the open one
    unsigned mask = 0;
    unsigned exited = 0;
    const char *file = "";
    int line = 0;
    uint64_t slots[2][32];
};

struct block_state {
    uint64_t gen = 0;
    int count = 0;
    int exited = 0;
    const char *file = "";
    int line = 0;
    int acc[3] = {0, 1, 0}; // or, and, count of the open barrier
    int result[2][3];
};

struct buffer {
    char *user;  // what cudaMalloc returned
    size_t size; // bytes asked for
    char *map;   // the whole mapping, guard pages included
    size_t map_size;
};

struct state {
    std::vector<fiber> fibers;
    std::vector<warp_state> warps;
    block_state block;
    int nthreads = 0;
    fiber *running = nullptr;
#if defined(__x86_64__)
    void *sched_sp = nullptr;
#else
    ucontext_t sched_uc;
#endif
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    const std::function<void()> *body = nullptr;
    std::map<uintptr_t, buffer> buffers;
    std::map<const void *, int> dyn_smem_attr;
    cudaError_t last_error = cudaSuccess;
    uint64_t launches = 0;
    dim3 grids[2]; // the last two launches' grids, newest first
    const char *capturing = nullptr; // inside pkvemu_capture_begin/end: what is captured
    int mode = -1;
    int preempt = 0;
    uint64_t rng = 0x853c49e6748fea9bull;
    int in_kernel = 0;
    size_t page = 4096;
    char *altstack = nullptr;
};

state &S() {
    static state s;
    return s;
}

uint32_t rnd() {
    state &s = S();
    s.rng = s.rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(s.rng >> 33);
}

void where(char *buf, size_t n) {
    state &s = S();
    if (s.in_kernel && g_cur != nullptr) {
        snprintf(buf, n, " [block (%u,%u,%u) thread (%u,%u,%u), launch %llu]", g_cur->bid.x,
                 g_cur->bid.y, g_cur->bid.z, g_cur->tid.x, g_cur->tid.y, g_cur->tid.z,
                 (unsigned long long)s.launches);
    } else {
        buf[0] = '\0';
    }
}

// ---- switching between the scheduler and fibers -----------------------------
void to_fiber(fiber *f) {
    state &s = S();
    s.running = f;
    g_cur = &f->ctx;
#ifdef PKVEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, kStack);
#endif
#if defined(__x86_64__)
    pkvemu_swap(&s.sched_sp, f->sp);
#else
    swapcontext(&s.sched_uc, &f->uc);
#endif
#ifdef PKVEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    s.running = nullptr;
}

void to_scheduler(bool dying) {
    state &s = S();
    fiber *f = s.running;
#ifdef PKVEMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(dying ? nullptr : &fake, s.sched_bottom, s.sched_size);
#else
    (void)dying;
#endif
#if defined(__x86_64__)
    pkvemu_swap(&f->sp, s.sched_sp);
#else
    swapcontext(&f->uc, &s.sched_uc);
#endif
#ifdef PKVEMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void block_wait(const uint64_t *gen, uint64_t val, const char *file, int line) {
    fiber *f = S().running;
    f->state = 1;
    f->wait_gen = gen;
    f->wait_val = val;
    f->wfile = file;
    f->wline = line;
    to_scheduler(false);
    f->state = 0;
}

extern "C" void pkvemu_fiber_main() {
    state &s = S();
#ifdef PKVEMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &s.sched_bottom, &s.sched_size);
#endif
    (*s.body)();
    thread_exit();
    s.running->state = 2;
    to_scheduler(true);
    abort(); // never resumed
}

void fiber_init(fiber &f) {
    state &s = S();
    if (f.stack == nullptr) {
        char *m = static_cast<char *>(mmap(nullptr, kStack + s.page, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        if (m == MAP_FAILED) {
            fail(__FILE__, __LINE__, "cannot map a fiber stack");
        }
        mprotect(m, s.page, PROT_NONE); // overflow faults
        f.stack = m + s.page;
    }
#if defined(__x86_64__)
    // Entered by pkvemu_swap's ret: 6 popped registers, then the entry address;
    // at entry rsp + 8 is 16-byte aligned, as after a call.
    uintptr_t top = ((uintptr_t)f.stack + kStack) & ~(uintptr_t)15;
    void **sp = reinterpret_cast<void **>(top);
    *--sp = nullptr; // fake return address of pkvemu_fiber_main
    *--sp = reinterpret_cast<void *>(&pkvemu_fiber_main);
    for (int i = 0; i < 6; i++) {
        *--sp = nullptr;
    }
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = kStack;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, pkvemu_fiber_main, 0);
#endif
    f.state = 0;
    f.wait_gen = nullptr;
    f.coll = 0;
}

const char *mode_name(int m) {
    static const char *const n[4] = {"blocks forward, threads forward",
                                     "blocks reverse, threads reverse",
                                     "blocks shuffled, threads forward, preempting",
                                     "blocks shuffled, threads reverse, preempting"};
    return n[m & 3];
}

void deadlock() {
    state &s = S();
    fprintf(stderr, "pkvemu: ERROR: deadlock (%s); threads wait at:\n", mode_name(s.mode));
    int shown = 0;
    for (int i = 0; i < s.nthreads && shown < 8; i++) {
        fiber &f = s.fibers[i];
        if (f.state == 1) {
            fprintf(stderr, "  thread %d: %s:%d\n", i, f.wfile, f.wline);
            shown++;
        }
    }
    g_cur = nullptr;
    fail(__FILE__, __LINE__, "deadlock: divergent barriers or warp collectives");
}

void run_block(dim3 grid, dim3 block, uint3 bid, int mode) {
    state &s = S();
    const int n = (int)(block.x * block.y * block.z);
    s.nthreads = n;
    s.block = block_state();
    s.warps.assign((size_t)(n + 31) / 32, warp_state());
    for (size_t w = 0; w < s.warps.size(); w++) {
        int lanes = n - (int)w * 32;
        s.warps[w].exited = lanes >= 32 ? 0u : ~((1u << lanes) - 1u); // absent lanes
    }
    // Shared memory: NaN bytes at block start (uninitialized reads show).
    memset(__start_pkvemu_shared, 0xff, (size_t)(__stop_pkvemu_shared - __start_pkvemu_shared));
    for (int i = 0; i < n; i++) {
        fiber &f = s.fibers[i];
        fiber_init(f);
        f.ctx.tid = uint3{(unsigned)i % block.x, (unsigned)i / block.x % block.y,
                          (unsigned)i / (block.x * block.y)};
        f.ctx.bid = bid;
        f.ctx.bdim = block;
        f.ctx.gdim = grid;
    }
    const bool reverse = mode == 1 || mode == 3;
    int done = 0;
    while (done < n) {
        bool progress = false;
        done = 0;
        for (int k = 0; k < n; k++) {
            fiber &f = s.fibers[reverse ? n - 1 - k : k];
            if (f.state == 2) {
                done++;
                continue;
            }
            if (f.state == 1 && *f.wait_gen == f.wait_val) {
                continue;
            }
            to_fiber(&f);
            progress = true;
            done += f.state == 2;
        }
        if (!progress && done < n) {
            deadlock();
        }
    }
    g_cur = nullptr;
}

void on_segv(int sig, siginfo_t *si, void *) {
    state &s = S();
    char msg[512];
    uintptr_t a = (uintptr_t)si->si_addr;
    const char *what = "an address outside every device buffer";
    char buf[256] = "";
    for (auto &kv : s.buffers) {
        const buffer &b = kv.second;
        if (a >= (uintptr_t)b.map && a < (uintptr_t)b.map + b.map_size) {
            long off = (long)(a - (uintptr_t)b.user);
            snprintf(buf, sizeof buf, "byte %ld of a %zu-byte device buffer (out of bounds)", off,
                     b.size);
            what = buf;
        }
    }
    for (int i = 0; i < (int)s.fibers.size(); i++) {
        const fiber &f = s.fibers[i];
        if (f.stack && a >= (uintptr_t)f.stack - s.page && a < (uintptr_t)f.stack) {
            what = "a fiber stack's guard page (stack overflow)";
        }
    }
    char w[160];
    where(w, sizeof w);
    int len = snprintf(msg, sizeof msg, "pkvemu: ERROR: signal %d: access to %s%s\n", sig, what, w);
    if (write(2, msg, (size_t)len) < 0) {
    }
    _exit(1);
}

void install_handler() {
    state &s = S();
    if (s.altstack != nullptr) {
        return;
    }
    s.page = (size_t)sysconf(_SC_PAGESIZE);
    s.altstack = static_cast<char *>(malloc(1 << 16));
    stack_t st = {};
    st.ss_sp = s.altstack;
    st.ss_size = 1 << 16;
    sigaltstack(&st, nullptr);
    struct sigaction sa = {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    const char *m = getenv("PKVEMU_MODE");
    if (m != nullptr && *m) {
        s.mode = atoi(m);
    }
}

const buffer *find_buffer(const void *p) {
    state &s = S();
    auto it = s.buffers.upper_bound((uintptr_t)p);
    if (it == s.buffers.begin()) {
        return nullptr;
    }
    --it;
    const buffer &b = it->second;
    return (uintptr_t)p < (uintptr_t)b.user + (b.size ? b.size : 1) ? &b : nullptr;
}

// Host-side range check of a runtime-API call on device memory.
bool device_range(const void *p, size_t n) {
    const buffer *b = find_buffer(p);
    return b != nullptr && (uintptr_t)p + n <= (uintptr_t)b->user + b->size;
}

} // namespace

[[noreturn]] void fail(const char *file, int line, const char *fmt, ...) {
    char w[160];
    where(w, sizeof w);
    fprintf(stderr, "pkvemu: ERROR at %s:%d%s: ", file, line, w);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(1);
}

int lane_id() {
    return (int)(S().running - S().fibers.data()) & 31;
}

void syncthreads(const char *file, int line) {
    (void)syncthreads_reduce(0, 0, file, line);
}

int syncthreads_reduce(int pred, int op, const char *file, int line) {
    state &s = S();
    block_state &b = s.block;
    if (b.exited > 0) {
        fail(file, line, "__syncthreads reached after %d thread(s) of the block exited", b.exited);
    }
    if (b.count == 0) {
        b.file = file;
        b.line = line;
        b.acc[0] = 0;
        b.acc[1] = 1;
        b.acc[2] = 0;
    } else if (b.line != line || strcmp(b.file, file) != 0) {
        fail(file, line, "divergent __syncthreads: others wait at %s:%d", b.file, b.line);
    }
    b.acc[0] |= pred != 0;
    b.acc[1] &= pred != 0;
    b.acc[2] += pred != 0;
    const uint64_t g = b.gen;
    if (++b.count == s.nthreads) {
        memcpy(b.result[g & 1], b.acc, sizeof b.acc);
        b.count = 0;
        b.gen++;
    } else {
        block_wait(&b.gen, g, file, line);
    }
    return b.result[g & 1][op];
}

const uint64_t *warp_collect(unsigned mask, uint64_t v, const char *file, int line) {
    state &s = S();
    const int t = (int)(s.running - s.fibers.data());
    warp_state &w = s.warps[(size_t)t / 32];
    const int lane = t & 31;
    if ((mask >> lane & 1u) == 0) {
        fail(file, line, "warp collective called by lane %d, which its mask 0x%08x excludes",
             lane, mask);
    }
    if (mask & w.exited) {
        fail(file, line, "warp collective with mask 0x%08x waits for exited lanes 0x%08x", mask,
             mask & w.exited);
    }
    if (w.count == 0) {
        w.mask = mask;
        w.file = file;
        w.line = line;
    } else if (w.mask != mask || w.line != line || strcmp(w.file, file) != 0) {
        fail(file, line, "divergent warp collective (mask 0x%08x): lanes wait at %s:%d with "
             "mask 0x%08x", mask, w.file, w.line, w.mask);
    }
    const uint64_t g = w.gen;
    w.slots[g & 1][lane] = v;
    if (++w.count == __builtin_popcount(mask)) {
        w.count = 0;
        w.gen++;
    } else {
        block_wait(&w.gen, g, file, line);
    }
    return w.slots[g & 1];
}

void check_load(const void *p, size_t bytes, size_t align, const char *file, int line) {
    state &s = S();
    if ((uintptr_t)p % align != 0) {
        fail(file, line, "misaligned %zu-byte load at %p", bytes, p);
    }
    const buffer *b = find_buffer(p);
    if (b == nullptr) {
        fail(file, line, "__ldg of %p, outside every device buffer", p);
    }
    if ((uintptr_t)p + bytes > (uintptr_t)b->user + b->size) {
        fail(file, line, "__ldg of bytes %zu..%zu of a %zu-byte device buffer",
             (size_t)((uintptr_t)p - (uintptr_t)b->user),
             (size_t)((uintptr_t)p - (uintptr_t)b->user) + bytes - 1, b->size);
    }
    if (s.preempt && rnd() % 3 == 0) {
        to_scheduler(false); // yield: stays runnable, others run first
    }
}

void launch_impl(dim3 grid, dim3 block, size_t smem, const void *kernel,
                 const std::function<void()> &body) {
    state &s = S();
    install_handler();
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads == 0 || threads > (uint64_t)kMaxThreads || block.z > 64 || grid.x == 0 ||
        grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535u ||
        grid.z > 65535u) {
        fprintf(stderr, "pkvemu: launch refused: grid (%u,%u,%u) block (%u,%u,%u)\n", grid.x,
                grid.y, grid.z, block.x, block.y, block.z);
        s.last_error = cudaErrorInvalidConfiguration;
        return;
    }
    auto it = s.dyn_smem_attr.find(kernel);
    const size_t allowed = it != s.dyn_smem_attr.end() ? (size_t)it->second : 48u << 10;
    if (smem > allowed || smem > (227u << 10)) {
        fprintf(stderr, "pkvemu: launch refused: %zu bytes of dynamic shared memory, %zu "
                "allowed (cudaFuncSetAttribute raises it)\n", smem, allowed);
        s.last_error = cudaErrorInvalidValue;
        return;
    }
    if (s.fibers.size() < (size_t)kMaxThreads) {
        s.fibers.resize(kMaxThreads);
    }
    const int mode = s.mode >= 0 ? (s.mode & 3) : (int)(s.launches % 4);
    s.preempt = mode >= 2;
    s.launches++;
    s.grids[1] = s.grids[0];
    s.grids[0] = grid;
    const uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
    std::vector<uint64_t> order(nb);
    for (uint64_t i = 0; i < nb; i++) {
        order[i] = mode == 1 ? nb - 1 - i : i;
    }
    if (mode >= 2) {
        for (uint64_t i = nb; i > 1; i--) {
            std::swap(order[i - 1], order[rnd() % i]);
        }
    }
    s.body = &body;
    s.in_kernel = 1;
    for (uint64_t i = 0; i < nb; i++) {
        uint64_t b = order[i];
        uint3 bid = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                     (unsigned)(b / ((uint64_t)grid.x * grid.y))};
        run_block(grid, block, bid, mode);
    }
    s.in_kernel = 0;
    s.body = nullptr;
}

void thread_exit() {
    state &s = S();
    const int t = (int)(s.running - s.fibers.data());
    warp_state &w = s.warps[(size_t)t / 32];
    if (w.count > 0 && (w.mask >> (t & 31) & 1u)) {
        fail(w.file, w.line, "lane %d exited while its warp waits for it in a collective", t & 31);
    }
    w.exited |= 1u << (t & 31);
    if (s.block.count > 0) {
        fail(s.block.file, s.block.line,
             "thread %d exited while %d thread(s) wait at __syncthreads", t, s.block.count);
    }
    s.block.exited++;
}

void func_set_attr(const void *kernel, int attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        S().dyn_smem_attr[kernel] = value;
    }
}

// A call that a CUDA graph capture would refuse or that breaks one (allocation,
// a copy to or from the host, a synchronization) while capturing is a failure.
void capture_check(const char *call) {
    if (S().capturing != nullptr) {
        fail(__FILE__, __LINE__, "%s while capturing %s: a CUDA graph capture cannot hold it",
             call, S().capturing);
    }
}

} // namespace pkvemu

using pkvemu::S;
using pkvemu::capture_check;

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    capture_check("cudaMalloc");
    pkvemu::install_handler();
    auto &s = S();
    if (ptr == nullptr) {
        return cudaErrorInvalidValue;
    }
    // [guard page][data, ending at a page boundary][guard page]; the pointer is
    // 16-byte aligned and its buffer ends within 15 bytes of the upper guard.
    size_t round = (bytes + 15) / 16 * 16;
    size_t data = (round + s.page - 1) / s.page * s.page;
    if (data == 0) {
        data = s.page;
    }
    size_t total = data + 2 * s.page;
    char *m = static_cast<char *>(
        mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (m == MAP_FAILED) {
        s.last_error = cudaErrorMemoryAllocation; // pending, as the runtime leaves it
        return cudaErrorMemoryAllocation;
    }
    mprotect(m, s.page, PROT_NONE);
    mprotect(m + s.page + data, s.page, PROT_NONE);
    char *user = m + s.page + data - round;
    memset(user, 0xa5, round); // cudaMalloc memory is not zeroed
    s.buffers[(uintptr_t)user] = pkvemu::buffer{user, bytes, m, total};
    *ptr = user;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    capture_check("cudaFree");
    auto &s = S();
    if (ptr == nullptr) {
        return cudaSuccess;
    }
    auto it = s.buffers.find((uintptr_t)ptr);
    if (it == s.buffers.end()) {
        return cudaErrorInvalidDevicePointer;
    }
    munmap(it->second.map, it->second.map_size);
    s.buffers.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    capture_check("cudaMemcpy");
    bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (bytes == 0) {
        return cudaSuccess;
    }
    if ((dst_dev && !pkvemu::device_range(dst, bytes)) ||
        (src_dev && !pkvemu::device_range(src, bytes))) {
        return cudaErrorInvalidValue;
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    (void)stream;
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    capture_check("cudaMemset");
    if (bytes && !pkvemu::device_range(dst, bytes)) {
        return cudaErrorInvalidValue;
    }
    memset(dst, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
    (void)stream;
    return cudaMemset(dst, value, bytes);
}

cudaError_t cudaDeviceSynchronize(void) {
    capture_check("cudaDeviceSynchronize");
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    (void)stream;
    capture_check("cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *dev) {
    *dev = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidValue; }

int pkvemu_num_sms(void) {
    const char *e = getenv("PKVEMU_SMS");
    int n = e != nullptr ? atoi(e) : 0;
    return n > 0 ? n : 132; // an H200's, so that split plans are the GPU's
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev) {
    if (dev != 0 || value == nullptr) {
        return cudaErrorInvalidValue;
    }
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
        *value = 1024;
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
        *value = 48 << 10;
        return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
        *value = pkvemu_num_sms();
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = 227 << 10;
        return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev) {
    if (dev != 0 || prop == nullptr) {
        return cudaErrorInvalidValue;
    }
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "pkvemu CPU emulator");
    prop->totalGlobalMem = 1ull << 34;
    prop->sharedMemPerBlock = 48 << 10;
    prop->sharedMemPerBlockOptin = 227 << 10;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = pkvemu_num_sms();
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->l2CacheSize = 50 << 20;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = S().last_error;
    S().last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return S().last_error; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInitializationError:
    case cudaErrorStubLibrary:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
        return "the CUDA runtime cannot start (never raised by the emulator)";
    }
    return "unknown error";
}

uint64_t pkvemu_launch_count(void) { return S().launches; }
void pkvemu_set_mode(int mode) { S().mode = mode; }
void pkvemu_capture_begin(const char *what) { S().capturing = what; }
void pkvemu_capture_end(void) { S().capturing = nullptr; }
void pkvemu_launch_grid(int back, unsigned grid[3]) {
    const dim3 g = S().grids[back == 0 ? 0 : 1];
    grid[0] = g.x, grid[1] = g.y, grid[2] = g.z;
}

} // extern "C"
