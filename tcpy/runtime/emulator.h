/* tcpy's CUDA emulator: the built-ins of CUDA for running kernels on the CPU.

   A launch spreads its blocks over the CPU's cores (OpenMP). The threads of a block
   run in one OS thread: one after another when the translation unit uses no barrier
   and no warp operation, else as cooperative fibers that switch only where a thread
   must wait for others (a barrier, a warp operation) and, when counting, after each
   memory access, so that the lanes of a warp advance together.

   Built with TC_EMU_INSTRUMENT, the access macros of the generated source (TC_LD,
   TC_ST, TC_SLD, ...) go through hooks that check bounds and shared-memory races and
   count traffic, as the launch asks (emulator_hooks.h, which follows this file);
   without it they are the plain indexing that NVRTC compiles. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <omp.h>
#include <pthread.h>
#include <type_traits>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
using std::isfinite;

struct dim3 { unsigned int x, y, z; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(16))) double2 { double x, y; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return double2{x, y}; }
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

static thread_local dim3 blockIdx, threadIdx;
static dim3 gridDim, blockDim;
static const int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* one block at a time runs in an OS thread: its static shared memory is thread-local */
#define __shared__ static thread_local

/* What Python passes to a launch and reads back (`tcpy.runtime.emulator._Launch`). */
struct tc_emu_buffer { const char *base; long long bytes; const char *name; };
enum { TC_EMU_GLOBAL_LOAD_BYTES, TC_EMU_GLOBAL_STORE_BYTES, TC_EMU_GLOBAL_REQUESTS,
       TC_EMU_GLOBAL_SECTORS, TC_EMU_SHARED_BYTES, TC_EMU_BANK_CONFLICTS, TC_EMU_BARRIERS,
       TC_EMU_SHUFFLES, TC_EMU_ATOMICS, TC_EMU_DISTINCT_LOAD_SECTORS,
       TC_EMU_DISTINCT_STORE_SECTORS, TC_EMU_DISTINCT_SECTORS, TC_EMU_ASYNC_COPIES,
       TC_EMU_ASYNC_GROUPS, TC_EMU_MMAS, TC_EMU_GRID_BARRIERS, TC_EMU_COUNTERS };
struct tc_emu_launch {
  int check, count;
  int n_buffers;
  const tc_emu_buffer *buffers;
  const char *kernel;
  long long dynamic_shared;
  long long counters[TC_EMU_COUNTERS];
  char error[1024];
};

namespace tc_emu {

/* --- context switching ------------------------------------------------------------
   On x86-64 a switch saves the callee-saved registers and the floating-point control
   words on the old stack and loads them from the new one (swapcontext would also make
   a system call for the signal mask at every switch); elsewhere ucontext. */
#if defined(__x86_64__)
extern "C" void tc_emu_switch(void **save, void *load);
extern "C" void tc_emu_entry();
asm(R"(
  .text
  .globl tc_emu_switch
  .hidden tc_emu_switch
  .type tc_emu_switch, @function
tc_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tc_emu_switch, .-tc_emu_switch
  .globl tc_emu_entry
  .hidden tc_emu_entry
  .type tc_emu_entry, @function
tc_emu_entry:
  call tc_emu_fiber_main
  ud2
  .size tc_emu_entry, .-tc_emu_entry
)");
struct Context { void *sp; };
static inline void start_context(Context &c, char *stack, size_t bytes) {
  uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = (void *)tc_emu_entry;  /* the address `ret` jumps to; rsp is then 16-aligned */
  for (int r = 0; r < 6; r++) *--sp = nullptr;  /* rbp, rbx, r12-r15 */
  --sp;
  uint32_t mxcsr = 0x1F80; uint16_t fpcw = 0x037F;
  memcpy(sp, &mxcsr, 4); memcpy((char *)sp + 4, &fpcw, 2);
  c.sp = sp;
}
static inline void switch_context(Context &from, Context &to) { tc_emu_switch(&from.sp, to.sp); }
#else
extern "C" void tc_emu_fiber_main();
struct Context { ucontext_t uc; };
static inline void start_context(Context &c, char *stack, size_t bytes) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, tc_emu_fiber_main, 0);
}
static inline void switch_context(Context &from, Context &to) { swapcontext(&from.uc, &to.uc); }
#endif

/* --- the state of a launch and of each OS thread ------------------------------------ */
enum State { READY, AT_BARRIER, AT_WARP, AT_GRID, DONE };
enum WarpOp { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, BALLOT, ANY, ALL, SYNCWARP, LDMATRIX, MMA };
enum Access { LOAD, STORE, ATOMIC, ASYNC };  /* ASYNC: a cp.async's destination */
enum MmaKind { MMA_BF16, MMA_F16, MMA_TF32 };
static const char *const WARP_OP_NAMES[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
  "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync", "__syncwarp", "ldmatrix",
  "mma.sync"};

struct Fiber {
  Context context;
  int state;
  int site;  /* of the barrier or warp operation waited at */
  int count;  /* at a barrier: the threads it waits for (`bar.sync 1, count`), 0: all */
  bool fresh;  /* at a barrier after which a one kernel's part plays another block */
  int op, width;
  unsigned mask;
  long long arg;
  uint64_t value, result;
};

/* A warp-level memory instruction being gathered: the lanes that executed the same
   access site for the same time, and what they touched. */
struct Request {
  int site;
  uint32_t occurrence;
  unsigned lanes;
  bool shared;
  int n;
  uint64_t units[128];  /* 32-byte sectors (global) or 4-byte words (shared) */
};

struct Requests {  /* the open requests of one warp */
  Request *items;
  int n, capacity;
};

/* Of one element of shared memory (one word of elements of 4 bytes or more), for the
   race check: its last writer and up to two readers since, each with the block's clock
   at the access. Elements, not words: threads may write the two halves of a word
   (float16 and bfloat16 elements), which is no race. */
struct Shadow {
  int writer = -1, reader = -1, other = -1;
  int copier = -1;  /* the thread whose cp.async into it is in flight */
  long long written = 0, read = 0, other_read = 0;
};

/* A cp.async not yet complete: it lands at its thread's wait of its group. */
struct AsyncCopy {
  char *dst;
  const char *src;
  int bytes, unit;  /* unit: the race check's (the shared array's elements, at most 4) */
  long long group;  /* the commits its thread had made when it was issued */
  const char *array;
};
struct AsyncQueue {  /* a thread's copies in flight */
  AsyncCopy *items;
  int n, capacity;
  long long committed;
};

/* A lane's part of a warp's ldmatrix (its row's address; its registers) or mma.sync
   (its fragments of A, B and C; its fragment of D). */
struct MatrixLane {
  const void *row;
  unsigned r[4], a[4], b[2];
  float c[4], d[4];
};

/* The shadows of a block's shared memory, by address: open addressing. */
struct Unwritten {  /* a read of shared memory no thread had written (`note_unwritten`) */
  uintptr_t at;
  const char *array;
  int thread;
};

struct ShadowTable {
  uintptr_t *keys = nullptr;
  Shadow *values = nullptr;
  size_t capacity = 0, used = 0;

  ~ShadowTable() { free(keys); free(values); }
  void clear() {
    if (used) memset(keys, 0, capacity * sizeof *keys);
    used = 0;
  }
  size_t slot(uintptr_t key) const {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (capacity - 1);
    while (keys[i] && keys[i] != key) i = (i + 1) & (capacity - 1);
    return i;
  }
  Shadow &at(uintptr_t key) {  /* key: an element's (a word's) address, never 0 */
    if (2 * (used + 1) > capacity) grow();
    size_t i = slot(key);
    if (!keys[i]) {
      keys[i] = key;
      values[i] = Shadow();
      used++;
    }
    return values[i];
  }
  void grow() {
    uintptr_t *old_keys = keys;
    Shadow *old_values = values;
    size_t old = capacity;
    capacity = capacity ? 2 * capacity : 4096;
    keys = (uintptr_t *)calloc(capacity, sizeof *keys);
    values = (Shadow *)malloc(capacity * sizeof *values);
    for (size_t k = 0; k < old; k++)
      if (old_keys[k]) {
        size_t i = slot(old_keys[k]);
        keys[i] = old_keys[k];
        values[i] = old_values[k];
      }
    free(old_keys);
    free(old_values);
  }
};

static inline long long smaller_of(long long a, long long b) { return a < b ? a : b; }

static tc_emu_launch *launch_info;
static int launch_sites;
static volatile int failed;
static const size_t STACK_BYTES = 256 * 1024;

/* The footprint of a counting launch: for each of its buffers, a bit per 32-byte
   sector the launch loads and one per sector it stores (an atomic does both), set by
   every block; the distinct sectors, whatever the warps and blocks that touched them. */
struct Footprint {
  uintptr_t first = 0;  /* the buffer's first sector */
  uint64_t n = 0;       /* its sectors */
  uint64_t *loads = nullptr, *stores = nullptr;
};
static Footprint *footprints;

static void open_footprints(const tc_emu_launch &L) {
  footprints = new Footprint[L.n_buffers > 0 ? L.n_buffers : 1];
  for (int k = 0; k < L.n_buffers; k++) {
    Footprint &f = footprints[k];
    uintptr_t base = (uintptr_t)L.buffers[k].base;
    long long bytes = L.buffers[k].bytes;
    if (bytes <= 0) continue;
    f.first = base / 32;
    f.n = (base + bytes - 1) / 32 - f.first + 1;
    f.loads = (uint64_t *)calloc((f.n + 63) / 64, sizeof(uint64_t));
    f.stores = (uint64_t *)calloc((f.n + 63) / 64, sizeof(uint64_t));
  }
}

static void close_footprints(tc_emu_launch &L) {
  long long loads = 0, stores = 0, either = 0;
  for (int k = 0; k < L.n_buffers; k++) {
    Footprint &f = footprints[k];
    for (uint64_t i = 0; i < (f.n + 63) / 64; i++) {
      loads += __builtin_popcountll(f.loads[i]);
      stores += __builtin_popcountll(f.stores[i]);
      either += __builtin_popcountll(f.loads[i] | f.stores[i]);
    }
    free(f.loads);
    free(f.stores);
  }
  delete[] footprints;
  footprints = nullptr;
  L.counters[TC_EMU_DISTINCT_LOAD_SECTORS] = loads;
  L.counters[TC_EMU_DISTINCT_STORE_SECTORS] = stores;
  L.counters[TC_EMU_DISTINCT_SECTORS] = either;
}

/* Marks the sectors of an access of `bytes` at `address` in the buffer holding it. */
static void touch(const tc_emu_launch &L, const void *address, long long bytes, bool load,
                  bool store) {
  uintptr_t a = (uintptr_t)address, first = a / 32, last = (a + bytes - 1) / 32;
  for (int k = 0; k < L.n_buffers; k++) {
    Footprint &f = footprints[k];
    if (first < f.first || first - f.first >= f.n) continue;
    for (uintptr_t s = first; s <= last && s - f.first < f.n; s++) {
      uint64_t i = s - f.first, bit = 1ull << (i % 64);
      if (load) __atomic_fetch_or(&f.loads[i / 64], bit, __ATOMIC_RELAXED);
      if (store) __atomic_fetch_or(&f.stores[i / 64], bit, __ATOMIC_RELAXED);
    }
    return;
  }
}

struct Worker {
  int n = 0;  /* threads in a block */
  bool fibers = false;
  Fiber *fiber = nullptr;
  char *stacks = nullptr;
  size_t stacks_bytes = 0;
  Context scheduler;
  int current = 0;
  dim3 block;
  /* the race check's clock: it ticks at every barrier and completed __syncwarp; an
     access is ordered before another thread's if a barrier passed since, or a
     __syncwarp of both lanes (`paired`, per warp and pair of lanes) */
  long long clock = 1, barrier_clock = 0;
  long long *paired = nullptr;
  bool aborted = false;
  void (*body)(void *) = nullptr;
  void *arg = nullptr;
  char *dynamic_shared = nullptr;
  long long counters[TC_EMU_COUNTERS] = {};
  uint32_t *occurrences = nullptr;  /* per thread and access site */
  Requests *requests = nullptr;  /* per warp */
  int warps = 0;
  AsyncQueue *queues = nullptr;  /* per thread, once one issues a cp.async */
  ShadowTable shadow;
  Unwritten *unwritten = nullptr;  /* reads to check at the next barrier */
  int n_unwritten = 0, unwritten_capacity = 0;
  char sink[64] __attribute__((aligned(16)));  /* where a refused access goes */

  ~Worker() {
    if (stacks) munmap(stacks, stacks_bytes);
    delete[] fiber;
    free(dynamic_shared);
    free(occurrences);
    free(paired);
    for (int k = 0; k < warps; k++) free(requests[k].items);
    free(requests);
    if (queues)
      for (int t = 0; t < n; t++) free(queues[t].items);
    free(queues);
    free(unwritten);
  }
};
static thread_local Worker *worker;

static inline dim3 unflatten(long long i, dim3 d) {
  return dim3{(unsigned)(i % d.x), (unsigned)(i / d.x % d.y), (unsigned)(i / d.x / d.y)};
}

static inline int lane_of(int t) { return t % 32; }

/* --- errors: the first one of a launch is kept, and the launch stops --------------- */
static void record_failure(const char *message) {
  if (__sync_bool_compare_and_swap(&failed, 0, 1))
    snprintf(launch_info->error, sizeof launch_info->error, "%s", message);
}

static void where(char *out, size_t size, int t) {
  Worker &w = *worker;
  dim3 th = unflatten(t, blockDim);
  snprintf(out, size, "block (%u, %u, %u) thread (%u, %u, %u)", w.block.x, w.block.y,
           w.block.z, th.x, th.y, th.z);
}

/* Called in a thread of the kernel: records the error and leaves the block (a fiber
   switches away for good; a thread run in sequence carries on into the sink, and the
   launch stops after it). */
static void fail_here(const char *message) {
  record_failure(message);
  Worker &w = *worker;
  w.aborted = true;
  if (w.fibers) switch_context(w.fiber[w.current].context, w.scheduler);
}

static inline void yield(int state) {
  Worker &w = *worker;
  w.fiber[w.current].state = state;
  switch_context(w.fiber[w.current].context, w.scheduler);
}

/* defined with the hooks (emulator_hooks.h) and the instructions (emulator_async.h) */
static void finish_requests(Worker &w);
static void check_unwritten(Worker &w);
static void order_lanes(Worker &w, int warp, const int *lanes, int n);
static void complete_copies(Worker &w, int t, int newest);
static bool warp_matrix(Worker &w, int first, const int *lanes, int n);

extern "C" __attribute__((used, visibility("hidden"))) void tc_emu_fiber_main() {
  for (;;) {
    Worker &w = *worker;
    w.body(w.arg);
    complete_copies(w, w.current, -1);  /* a thread's copies land, waited for or not */
    w.fiber[w.current].state = DONE;
    switch_context(w.fiber[w.current].context, w.scheduler);
  }
}

/* --- barriers and warp operations -------------------------------------------------- */
/* The thread waits at the barrier of `site` for `count` threads (0: the block's);
   `fresh`: after it, the block's shared memory is new (`block_sync`). */
static void wait_at_barrier(int site, int count, bool fresh) {
  Worker &w = *worker;
  if (!w.fibers) return;
  Fiber &f = w.fiber[w.current];
  f.site = site;
  f.count = count;
  f.fresh = fresh;
  yield(AT_BARRIER);
}

static void syncthreads(int site) { wait_at_barrier(site, 0, false); }

/* `__syncthreads()` after a block a one kernel's part played: the block's shared memory
   is the next block's, as new (no element of it written). */
static void block_sync(int site) { wait_at_barrier(site, 0, true); }

/* `bar.sync 1, n`: a barrier of the block's first `n` threads, whole warps (a part of
   one kernel that has fewer threads than the block, `tcpy.codegen.one_kernel`). */
static void named_sync(unsigned n, int site) {
  Worker &w = *worker;
  if (launch_info->check && (n == 0 || n % 32 || (int)n > w.n || w.current >= (int)n)) {
    char at[96], message[512];
    where(at, sizeof at, w.current);
    snprintf(message, sizeof message, "%s: bar.sync 1, %u by %s: the barrier's threads must be "
             "whole warps of the block's %d, this thread among them", launch_info->kernel, n, at,
             w.n);
    fail_here(message);
    return;
  }
  wait_at_barrier(site, (int)n, false);
}

/* A grid-wide barrier of a cooperative launch: the block's threads all wait here, then
   the block waits for every other block of the grid (`arrive_at_grid`). */
static void grid_sync(int site) {
  Worker &w = *worker;
  w.fiber[w.current].site = site;
  yield(AT_GRID);
}

static uint64_t warp_op(int op, int site, unsigned mask, uint64_t value, long long arg, int width) {
  Worker &w = *worker;
  Fiber &f = w.fiber[w.current];
  if (launch_info->check && !(mask >> lane_of(w.current) & 1)) {
    char at[96], message[512];
    where(at, sizeof at, w.current);
    snprintf(message, sizeof message, "%s: %s by %s, a lane not in its mask 0x%08x",
             launch_info->kernel, WARP_OP_NAMES[op], at, mask);
    fail_here(message);
    return value;
  }
  f.op = op; f.site = site; f.mask = mask; f.value = value; f.arg = arg; f.width = width;
  yield(AT_WARP);
  return f.result;
}

/* The result of a warp operation for lane `t` of a group that has all arrived. */
static uint64_t warp_result(Worker &w, int t, int first) {
  Fiber &f = w.fiber[t];
  int lane = lane_of(t), width = f.width, base = lane & ~(width - 1);
  unsigned mask = f.mask;
  auto member = [&](int l) { return l >= 0 && l < 32 && (mask >> l & 1) && first + l < w.n; };
  auto from = [&](int l) { return member(l) ? w.fiber[first + l].value : f.value; };
  switch (f.op) {
    case SHFL_IDX: return from(base + (int)(f.arg & (width - 1)));
    case SHFL_UP: return (lane - base) < f.arg ? f.value : from(lane - (int)f.arg);
    case SHFL_DOWN: return (lane - base) + f.arg >= width ? f.value : from(lane + (int)f.arg);
    case SHFL_XOR: {
      int src = lane ^ (int)f.arg;
      return src >= base + width ? f.value : from(src);
    }
    default: {
      unsigned ballot = 0;
      for (int l = 0; l < 32; l++)
        if (member(l) && w.fiber[first + l].value) ballot |= 1u << l;
      unsigned present = 0;
      for (int l = 0; l < 32; l++) present |= (unsigned)member(l) << l;
      if (f.op == BALLOT) return ballot;
      if (f.op == ANY) return ballot != 0;
      if (f.op == ALL) return ballot == present;
      return 0;
    }
  }
}


/* Completes every warp operation whose lanes have all arrived; false when none has. */
static bool resolve_warps(Worker &w) {
  bool released = false;
  for (int first = 0; first < w.n; first += 32) {
    for (int t = first; t < smaller_of(w.n, first + 32); t++) {
      Fiber &f = w.fiber[t];
      if (f.state != AT_WARP) continue;
      bool complete = true;
      for (int l = 0; l < 32 && complete; l++) {
        if (!(f.mask >> l & 1) || first + l >= w.n) continue;
        Fiber &g = w.fiber[first + l];
        if (g.state == DONE && launch_info->check) {
          char at[96], message[512];
          where(at, sizeof at, t);
          snprintf(message, sizeof message, "%s: %s by %s names lane %d in its mask 0x%08x, "
                   "which has exited", launch_info->kernel, WARP_OP_NAMES[f.op], at, l, f.mask);
          record_failure(message);
          w.aborted = true;
          return false;
        }
        complete = g.state == DONE || (g.state == AT_WARP && g.mask == f.mask);
      }
      if (!complete) continue;
      unsigned group = f.mask;
      bool shuffle = f.op <= SHFL_XOR;
      int lanes[32], n_lanes = 0;
      for (int l = 0; l < 32; l++)
        if ((group >> l & 1) && first + l < w.n && w.fiber[first + l].state == AT_WARP)
          lanes[n_lanes++] = first + l;
      for (int k = 0; k < n_lanes; k++) {
        int u = lanes[k];
        if ((launch_info->check || f.op >= LDMATRIX) && w.fiber[u].op != f.op) {
          char message[512];
          snprintf(message, sizeof message, "%s: the lanes of mask 0x%08x of warp %d meet at "
                   "different warp operations (%s and %s)", launch_info->kernel, group, first / 32,
                   WARP_OP_NAMES[f.op], WARP_OP_NAMES[w.fiber[u].op]);
          record_failure(message);
          w.aborted = true;
          return false;
        }
        if (f.op < LDMATRIX) w.fiber[u].result = warp_result(w, u, first);
      }
      if (f.op >= LDMATRIX && !warp_matrix(w, first, lanes, n_lanes)) return false;
      for (int k = 0; k < n_lanes; k++) w.fiber[lanes[k]].state = READY;
      if (shuffle) w.counters[TC_EMU_SHUFFLES] += 1;
      if (f.op == SYNCWARP && launch_info->check) order_lanes(w, first / 32, lanes, n_lanes);
      released = true;
    }
  }
  return released;
}

/* Releases a named barrier (`named_sync`) that all its threads have reached, the
   block's first `count`; false when none has. */
static bool release_named(Worker &w) {
  for (int t = 0; t < w.n; t++) {
    int count = w.fiber[t].state == AT_BARRIER ? w.fiber[t].count : 0;
    if (!count) continue;
    bool all = true;
    for (int u = 0; u < count && all; u++)
      all = w.fiber[u].state == AT_BARRIER && w.fiber[u].count == count;
    if (!all) continue;
    check_unwritten(w);
    for (int u = 0; u < count; u++) w.fiber[u].state = READY;
    w.barrier_clock = ++w.clock;
    w.counters[TC_EMU_BARRIERS] += 1;
    return true;
  }
  return false;
}

/* --- the grid's barriers (a cooperative launch: every block runs at once, each in an
   OS thread of its own) ------------------------------------------------------------- */
struct GridBarrier {  /* pthreads': C++'s <mutex> doubles the time to build a unit */
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t passed = PTHREAD_COND_INITIALIZER;
  long long blocks = 0, arrived = 0, exited = 0, passes = 0;
};
static GridBarrier grid;

static void grid_failure(const char *what) {
  char message[512];
  snprintf(message, sizeof message, "%s: grid barrier divergence: %s", launch_info->kernel, what);
  record_failure(message);
}

/* Every live thread of the block waits at a grid barrier: the block waits for the other
   blocks. False (the block stops) where some block left the kernel instead, or the
   launch failed. */
static bool arrive_at_grid(Worker &w) {
  pthread_mutex_lock(&grid.lock);
  if (grid.exited) {
    grid_failure("a block left the kernel while others wait at tc_grid_sync()");
    pthread_cond_broadcast(&grid.passed);
    pthread_mutex_unlock(&grid.lock);
    return false;
  }
  long long pass = grid.passes;
  if (++grid.arrived == grid.blocks) {
    grid.arrived = 0;
    grid.passes++;
    pthread_cond_broadcast(&grid.passed);
  } else {
    while (grid.passes == pass && !failed) pthread_cond_wait(&grid.passed, &grid.lock);
  }
  pthread_mutex_unlock(&grid.lock);
  w.counters[TC_EMU_GRID_BARRIERS] += 1;
  return !failed;
}

/* A block of a cooperative launch left the kernel (or stopped on an error). */
static void leave_grid() {
  pthread_mutex_lock(&grid.lock);
  grid.exited++;
  if (grid.arrived && !failed) grid_failure("a block left the kernel while others wait at tc_grid_sync()");
  pthread_cond_broadcast(&grid.passed);
  pthread_mutex_unlock(&grid.lock);
}

/* Whether every live thread waits at a grid barrier; reports threads that wait at one
   while others wait elsewhere or have left. */
static bool at_grid(Worker &w) {
  int waiting = 0, live = 0;
  for (int t = 0; t < w.n; t++) {
    waiting += w.fiber[t].state == AT_GRID;
    live += w.fiber[t].state != DONE;
  }
  if (!waiting) return false;
  if (waiting == w.n) return true;
  char message[160];
  snprintf(message, sizeof message, "in block %u, %d threads wait at tc_grid_sync() while %d %s",
           w.block.x, waiting, w.n - waiting, live == waiting ? "have left" : "wait elsewhere");
  grid_failure(message);
  w.aborted = true;
  return false;
}

/* Every live thread waits at a barrier and no warp operation can complete: release
   the barrier, or report why the block cannot go on. */
static void release_barrier(Worker &w) {
  if (release_named(w)) return;
  int site = -1, waiting = 0, exited = 0, warp = -1;
  bool differ = false, named = false;
  for (int t = 0; t < w.n; t++) {
    Fiber &f = w.fiber[t];
    if (f.state == AT_BARRIER && f.count) {
      named = true;  /* a named barrier some of whose threads are elsewhere */
    } else if (f.state == AT_BARRIER) {
      differ |= site >= 0 && f.site != site;
      site = f.site;
      waiting++;
    } else if (f.state == DONE) {
      exited++;
    } else if (f.state == AT_WARP && warp < 0) {
      warp = t;
    }
  }
  char message[512];
  if (warp >= 0) {
    char at[96];
    where(at, sizeof at, warp);
    snprintf(message, sizeof message, "%s: %s by %s waits for lanes of mask 0x%08x that "
             "never reach it", launch_info->kernel, WARP_OP_NAMES[w.fiber[warp].op], at,
             w.fiber[warp].mask);
    record_failure(message);
    w.aborted = true;
    return;
  }
  if (launch_info->check && (differ || exited || named)) {
    snprintf(message, sizeof message, "%s: barrier divergence in block (%u, %u, %u): %s",
             launch_info->kernel, w.block.x, w.block.y, w.block.z,
             named    ? "some threads of a bar.sync 1, n wait elsewhere or have exited"
             : differ ? "its threads wait at different __syncthreads()"
                      : "some threads exited while others wait at __syncthreads()");
    record_failure(message);
    w.aborted = true;
    return;
  }
  check_unwritten(w);
  bool fresh = false;  /* a one kernel's part begins another block: its shared memory is new */
  for (int t = 0; t < w.n; t++) {
    fresh |= w.fiber[t].state == AT_BARRIER && w.fiber[t].fresh;
    if (w.fiber[t].state == AT_BARRIER) w.fiber[t].state = READY;
  }
  if (fresh && launch_info->check) w.shadow.clear();
  w.barrier_clock = ++w.clock;
  w.counters[TC_EMU_BARRIERS] += 1;
}

/* --- running blocks ---------------------------------------------------------------- */
static void prepare(Worker &w, int threads, bool fibers) {
  w.n = threads;
  w.fibers = fibers;
  if (fibers && !w.fiber) {
    w.fiber = new Fiber[threads]();
    w.stacks_bytes = (size_t)threads * STACK_BYTES;
    void *m = mmap(nullptr, w.stacks_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      record_failure("the emulator could not map the stacks of a block's threads");
      w.aborted = true;
      return;
    }
    w.stacks = (char *)m;
    long page = sysconf(_SC_PAGESIZE);
    for (int t = 0; t < threads; t++)  /* a guard page below each stack */
      mprotect(w.stacks + (size_t)t * STACK_BYTES, (size_t)page, PROT_NONE);
  }
  if (launch_info->dynamic_shared && !w.dynamic_shared)
    w.dynamic_shared = (char *)aligned_alloc(16, ((size_t)launch_info->dynamic_shared + 15) & ~(size_t)15);
  if (launch_info->count && !w.occurrences) {
    w.occurrences = (uint32_t *)calloc((size_t)threads * launch_sites, sizeof(uint32_t));
    w.warps = (threads + 31) / 32;
    w.requests = (Requests *)calloc((size_t)w.warps, sizeof(Requests));
  }
}

static void run_block(Worker &w, long long b) {
  w.block = unflatten(b, gridDim);
  blockIdx = w.block;
  if (w.queues)  /* empty unless a block before was aborted with copies in flight */
    for (int t = 0; t < w.n; t++) w.queues[t].n = 0, w.queues[t].committed = 0;
  if (launch_info->check) w.shadow.clear();
  if (launch_info->count)
    memset(w.occurrences, 0, (size_t)w.n * launch_sites * sizeof(uint32_t));
  if (!w.fibers) {
    for (int t = 0; t < w.n && !w.aborted; t++) {
      w.current = t;
      threadIdx = unflatten(t, blockDim);
      w.body(w.arg);
      complete_copies(w, t, -1);
    }
    check_unwritten(w);
    return;
  }
  for (int t = 0; t < w.n; t++) {
    w.fiber[t].state = READY;
    start_context(w.fiber[t].context, w.stacks + (size_t)t * STACK_BYTES, STACK_BYTES);
  }
  for (;;) {
    bool ready = false, all_done = true;
    for (int t = 0; t < w.n && !w.aborted; t++) {
      if (w.fiber[t].state != READY) continue;
      w.current = t;
      threadIdx = unflatten(t, blockDim);
      switch_context(w.scheduler, w.fiber[t].context);
    }
    if (w.aborted) return;
    for (int t = 0; t < w.n; t++) {
      ready |= w.fiber[t].state == READY;
      all_done &= w.fiber[t].state == DONE;
    }
    if (all_done) {
      check_unwritten(w);
      break;
    }
    if (ready || resolve_warps(w)) continue;
    if (w.aborted) return;
    if (at_grid(w)) {
      check_unwritten(w);
      if (w.aborted || !arrive_at_grid(w)) {
        w.aborted = true;
        return;
      }
      for (int t = 0; t < w.n; t++) w.fiber[t].state = READY;
      if (launch_info->check) w.shadow.clear();  /* the next part's shared memory is new */
      w.barrier_clock = ++w.clock;
      continue;
    }
    if (w.aborted) return;
    release_barrier(w);
    if (w.aborted) return;
  }
  if (launch_info->count) finish_requests(w);
}

/* The worker of an OS thread running blocks of a launch of `body(arg)`. */
static Worker *open_worker(void (*body)(void *), void *arg) {
  Worker *w = new Worker();
  worker = w;
  w->body = body;
  w->arg = arg;
  return w;
}

/* Adds the worker's counters to the launch's, and deletes it. */
static void close_worker(Worker *w, tc_emu_launch *L) {
  #pragma omp critical
  for (int k = 0; k < TC_EMU_COUNTERS; k++) L->counters[k] += w->counters[k];
  worker = nullptr;
  delete w;
}

/* A cooperative launch: each block in an OS thread of its own, its threads as fibers. */
static int run_cooperative(long long blocks, int threads, void (*body)(void *), void *arg,
                           tc_emu_launch *L) {
  grid.blocks = blocks;
  grid.arrived = grid.exited = 0;
  #pragma omp parallel num_threads((int)blocks)
  {
    Worker *w = open_worker(body, arg);
    if (omp_get_num_threads() != blocks) {
      #pragma omp single
      record_failure("the emulator could not run every block of a cooperative launch at once");
    } else {
      prepare(*w, threads, true);
      if (!failed && !w->aborted) run_block(*w, omp_get_thread_num());
    }
    leave_grid();
    close_worker(w, L);
  }
  if (L->count) close_footprints(*L);
  return failed;
}

/* Runs every block of a launch; `sync`: the unit uses barriers or warp operations;
   `cooperative`: its blocks wait for one another (`grid_sync`), so all run at once. */
static int run(const long long *dims, void (*body)(void *), void *arg, tc_emu_launch *L,
               bool sync, int sites, bool cooperative = false) {
  launch_info = L;
  launch_sites = sites;
  failed = 0;
  L->error[0] = 0;
  for (int k = 0; k < TC_EMU_COUNTERS; k++) L->counters[k] = 0;
  gridDim = dim3{(unsigned)dims[0], (unsigned)dims[1], (unsigned)dims[2]};
  blockDim = dim3{(unsigned)dims[3], (unsigned)dims[4], (unsigned)dims[5]};
  long long blocks = dims[0] * dims[1] * dims[2];
  int threads = (int)(dims[3] * dims[4] * dims[5]);
  if (blocks <= 0 || threads <= 0) return 0;
  bool fibers = sync || L->count;
  if (L->count) open_footprints(*L);
  if (cooperative) return run_cooperative(blocks, threads, body, arg, L);
  int teams = (int)smaller_of(blocks, omp_get_max_threads());
  #pragma omp parallel num_threads(teams > 0 ? teams : 1)
  {
    Worker *w = open_worker(body, arg);
    prepare(*w, threads, fibers);
    #pragma omp for schedule(dynamic, 1)
    for (long long b = 0; b < blocks; b++) {
      if (failed || w->aborted) continue;
      run_block(*w, b);
    }
    close_worker(w, L);
  }
  if (L->count) close_footprints(*L);
  return failed;
}

/* --- atomics ----------------------------------------------------------------------- */
static inline void count_atomic() {
  if (worker && launch_info->count) worker->counters[TC_EMU_ATOMICS] += 1;
}

template <class T> static inline T atomic_update(T *p, T (*f)(T, T), T v) {
  count_atomic();
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, f(old, v), true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}

template <class F> static inline F atomic_update_float(F *p, F (*f)(F, F), F v) {
  count_atomic();
  using U = typename std::conditional<sizeof(F) == 4, uint32_t, uint64_t>::type;
  U *q = (U *)p;
  U old = __atomic_load_n(q, __ATOMIC_RELAXED), next;
  for (;;) {
    F o, n;
    memcpy(&o, &old, sizeof o);
    n = f(o, v);
    memcpy(&next, &n, sizeof n);
    if (__atomic_compare_exchange_n(q, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return o;
  }
}

template <class T> static T add(T a, T b) { return a + b; }
template <class T> static T larger(T a, T b) { return a > b ? a : b; }
template <class T> static T smaller(T a, T b) { return a < b ? a : b; }

template <class T> static inline uint64_t bits(T v) {
  uint64_t u = 0;
  memcpy(&u, &v, sizeof v);
  return u;
}
template <class T> static inline T unbits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof v);
  return v;
}

}  // namespace tc_emu

#define __syncthreads() tc_emu::syncthreads(__LINE__)
/* the barriers of one kernel (tcpy/codegen/one_kernel.py): the grid's keeps no words */
#define TC_GRID_INSTRUCTIONS
#define tc_bar_sync(n) tc_emu::named_sync((n), __LINE__)
#define tc_block_sync() tc_emu::block_sync(__LINE__)
#define tc_grid_sync(words) tc_emu::grid_sync(__LINE__)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* CUDA's __ldg takes built-in types only: so does this one (other types find none) */
template <class T, class = typename std::enable_if<std::is_arithmetic<T>::value>::type>
static inline T __ldg(const T *p) { return *p; }
static inline int __float_as_int(float v) { return tc_emu::unbits<int>(tc_emu::bits(v)); }
static inline unsigned int __float_as_uint(float v) { return tc_emu::unbits<unsigned>(tc_emu::bits(v)); }
static inline float __int_as_float(int v) { return tc_emu::unbits<float>(tc_emu::bits(v)); }
static inline float __uint_as_float(unsigned int v) { return tc_emu::unbits<float>(tc_emu::bits(v)); }
static inline long long __double_as_longlong(double v) { return tc_emu::unbits<long long>(tc_emu::bits(v)); }
static inline double __longlong_as_double(long long v) { return tc_emu::unbits<double>(tc_emu::bits(v)); }

/* The half types of the generated source (tcpy/codegen/halves.py) and their
   conversions, bit for bit those of PTX's cvt.f32.f16, cvt.rn.f16.f32 and
   cvt.rn.bf16.f32: round to nearest, ties to even; a NaN stays a quiet NaN. */
#define TC_HALF_TYPES
struct __attribute__((aligned(2))) __half { unsigned short x; };
struct __attribute__((aligned(2))) __nv_bfloat16 { unsigned short x; };
static inline float tc_float16_to_float(__half h) {
  _Float16 v;
  memcpy(&v, &h.x, 2);
  return (float)v;
}
static inline __half tc_float_to_float16(float f) {
  _Float16 v = (_Float16)f;
  __half h;
  memcpy(&h.x, &v, 2);
  return h;
}
static inline float tc_bfloat16_to_float(__nv_bfloat16 h) { return __uint_as_float((unsigned int)h.x << 16); }
static inline __nv_bfloat16 tc_float_to_bfloat16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40u)};
  return __nv_bfloat16{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

#define TC_EMU_ATOMIC_INT(T)                                                              \
  static inline T atomicAdd(T *p, T v) { tc_emu::count_atomic(); return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
  static inline T atomicSub(T *p, T v) { tc_emu::count_atomic(); return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
  static inline T atomicMax(T *p, T v) { return tc_emu::atomic_update<T>(p, tc_emu::larger<T>, v); } \
  static inline T atomicMin(T *p, T v) { return tc_emu::atomic_update<T>(p, tc_emu::smaller<T>, v); } \
  static inline T atomicExch(T *p, T v) { tc_emu::count_atomic(); return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
  static inline T atomicCAS(T *p, T compare, T v) {                                       \
    tc_emu::count_atomic();                                                               \
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
    return compare;                                                                       \
  }
TC_EMU_ATOMIC_INT(int)
TC_EMU_ATOMIC_INT(unsigned int)
TC_EMU_ATOMIC_INT(long long)
TC_EMU_ATOMIC_INT(unsigned long long)
static inline float atomicAdd(float *p, float v) { return tc_emu::atomic_update_float<float>(p, tc_emu::add<float>, v); }
static inline double atomicAdd(double *p, double v) { return tc_emu::atomic_update_float<double>(p, tc_emu::add<double>, v); }
static inline float atomicExch(float *p, float v) {
  tc_emu::count_atomic();
  uint32_t old = __atomic_exchange_n((uint32_t *)p, (uint32_t)tc_emu::bits(v), __ATOMIC_RELAXED);
  return tc_emu::unbits<float>(old);
}

/* warp operations: the value travels as 64 bits */
template <class T> static inline T tc_emu_shfl(int op, int site, unsigned mask, T v, long long arg, int width) {
  return tc_emu::unbits<T>(tc_emu::warp_op(op, site, mask, tc_emu::bits<T>(v), arg, width));
}
#define __shfl_sync(mask, v, lane, ...) tc_emu_shfl(tc_emu::SHFL_IDX, __LINE__, (mask), (v), (lane), tc_emu_width(__VA_ARGS__ + 0))
#define __shfl_up_sync(mask, v, delta, ...) tc_emu_shfl(tc_emu::SHFL_UP, __LINE__, (mask), (v), (delta), tc_emu_width(__VA_ARGS__ + 0))
#define __shfl_down_sync(mask, v, delta, ...) tc_emu_shfl(tc_emu::SHFL_DOWN, __LINE__, (mask), (v), (delta), tc_emu_width(__VA_ARGS__ + 0))
#define __shfl_xor_sync(mask, v, lanes, ...) tc_emu_shfl(tc_emu::SHFL_XOR, __LINE__, (mask), (v), (lanes), tc_emu_width(__VA_ARGS__ + 0))
static inline int tc_emu_width(int width) { return width > 0 && width <= 32 ? width : 32; }
static inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return (unsigned)tc_emu::warp_op(tc_emu::BALLOT, 0, mask, predicate != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int predicate) {
  return (int)tc_emu::warp_op(tc_emu::ANY, 0, mask, predicate != 0, 0, 32);
}
static inline int __all_sync(unsigned mask, int predicate) {
  return (int)tc_emu::warp_op(tc_emu::ALL, 0, mask, predicate != 0, 0, 32);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  tc_emu::warp_op(tc_emu::SYNCWARP, 0, mask, 0, 0, 32);
}
