/* tcpy's CUDA emulator, continued: the hooks of the access macros. Counting groups
   the lanes of a warp into warp-level requests; checking tracks the last writer and
   readers of every shared element (of every word of the wider ones) for the race check, and
   bounds every access. */

namespace tc_emu {

/* --- counting: warp-level requests ------------------------------------------------- */
static void finish_request(Worker &w, Request &r) {
  if (!r.shared) {
    w.counters[TC_EMU_GLOBAL_REQUESTS] += 1;
    w.counters[TC_EMU_GLOBAL_SECTORS] += r.n;
    return;
  }
  /* a shared request takes as many wavefronts as the most distinct words in one bank;
     the fewest it could take is one per 32 words */
  int per_bank[32] = {};
  int most = 0;
  for (int k = 0; k < r.n; k++) {
    int in_bank = ++per_bank[r.units[k] % 32];
    most = in_bank > most ? in_bank : most;
  }
  long long fewest = ((long long)r.n + 31) / 32;
  if (most > fewest) w.counters[TC_EMU_BANK_CONFLICTS] += most - fewest;
}

static int live_lanes(Worker &w, int warp) {
  int live = 0;
  for (int t = warp * 32; t < smaller_of(w.n, warp * 32 + 32); t++) live += w.fiber[t].state != DONE;
  return live;
}

static void count_access(int site, const void *address, long long bytes, bool shared) {
  Worker &w = *worker;
  int t = w.current, warp = t / 32;
  uint32_t occurrence = ++w.occurrences[(size_t)t * launch_sites + site];
  Requests &open = w.requests[warp];
  Request *r = nullptr;
  for (int k = 0; k < open.n; k++)
    if (open.items[k].site == site && open.items[k].occurrence == occurrence) r = &open.items[k];
  if (!r) {
    if (open.n == open.capacity) {
      open.capacity = open.capacity ? 2 * open.capacity : 4;
      open.items = (Request *)realloc(open.items, open.capacity * sizeof(Request));
    }
    r = &open.items[open.n++];
    r->site = site;
    r->occurrence = occurrence;
    r->lanes = 0;
    r->shared = shared;
    r->n = 0;
  }
  r->lanes |= 1u << lane_of(t);
  uintptr_t a = (uintptr_t)address;
  uint64_t unit = shared ? 4 : 32;
  for (uint64_t k = a / unit; k <= (a + bytes - 1) / unit; k++) {
    bool seen = false;
    for (int u = 0; u < r->n; u++) seen |= r->units[u] == k;
    if (!seen && r->n < 128) r->units[r->n++] = k;
  }
  if (__builtin_popcount(r->lanes) >= live_lanes(w, warp)) {
    finish_request(w, *r);
    *r = open.items[--open.n];
  }
}

static void finish_requests(Worker &w) {
  for (int k = 0; k < w.warps; k++) {
    Requests &open = w.requests[k];
    for (int i = 0; i < open.n; i++) finish_request(w, open.items[i]);
    open.n = 0;
  }
}

/* --- checking: the race check of shared memory ------------------------------------- */
static void race(const char *array, int other, const char *first, const char *second) {
  Worker &w = *worker;
  char a[96], b[96], message[512];
  where(a, sizeof a, other);
  where(b, sizeof b, w.current);
  snprintf(message, sizeof message,
           "%s: shared-memory race on %s: %s by %s and %s by %s with no barrier between them",
           launch_info->kernel, array, first, a, second, b);
  fail_here(message);
}

static void in_flight(const char *array, int copier, const char *access) {
  Worker &w = *worker;
  char a[96], b[96], message[512];
  where(a, sizeof a, w.current);
  where(b, sizeof b, copier);
  snprintf(message, sizeof message,
           "%s: shared-memory race on %s: %s by %s while a cp.async by %s into it is in flight "
           "(no cp.async.wait_group has completed it)", launch_info->kernel, array, access, a, b);
  fail_here(message);
}

/* A read of shared memory that no thread of the block had written (since the block, or
   the part of a one kernel, began): kept until the next barrier, since a write by
   another thread before it is a race, reported as one; an element still unwritten
   then was read undefined (`check_unwritten`). */
static void note_unwritten(const char *array, uintptr_t at) {
  Worker &w = *worker;
  if (w.n_unwritten == w.unwritten_capacity) {
    w.unwritten_capacity = w.unwritten_capacity ? 2 * w.unwritten_capacity : 64;
    w.unwritten = (Unwritten *)realloc(w.unwritten, (size_t)w.unwritten_capacity * sizeof(Unwritten));
  }
  w.unwritten[w.n_unwritten++] = Unwritten{at, array, w.current};
}

/* At a barrier or the block's end: a read noted by `note_unwritten` of an element that
   no thread has written since fails the launch. */
static void check_unwritten(Worker &w) {
  for (int k = 0; k < w.n_unwritten && !w.aborted; k++) {
    const Unwritten &u = w.unwritten[k];
    if (w.shadow.at(u.at).writer >= 0) continue;
    char a[96], message[512];
    where(a, sizeof a, u.thread);
    snprintf(message, sizeof message,
             "%s: a read of shared %s by %s of an element no thread of the block has written: "
             "undefined on a GPU", launch_info->kernel, u.array, a);
    record_failure(message);
    w.aborted = true;
  }
  w.n_unwritten = 0;
}

static bool ordered(Worker &w, int first, long long at, int then) {
  if (first == then || w.barrier_clock > at) return true;
  if (first / 32 != then / 32 || !w.paired) return false;
  return w.paired[((size_t)(first / 32) * 32 + lane_of(first)) * 32 + lane_of(then)] > at;
}

/* An access of `bytes` at `address` to a shared array whose elements are `unit` bytes
   (at most 4): its race check unit by unit, each keyed by the address it starts at. */
static void check_race(const char *array, const void *address, long long bytes, int kind,
                       long long unit) {
  Worker &w = *worker;
  int t = w.current;
  if (kind == ATOMIC) return;
  uintptr_t a = (uintptr_t)address;
  for (uintptr_t at = a; at < a + bytes; at += unit) {
    Shadow &s = w.shadow.at(at);
    const char *access = kind == LOAD ? "a read" : "a write";
    if (s.copier >= 0) return in_flight(array, s.copier, access);
    if (kind == LOAD && s.writer < 0) note_unwritten(array, at);
    if (s.writer >= 0 && !ordered(w, s.writer, s.written, t))
      return race(array, s.writer, "a write", access);
    if (kind == STORE) {
      if (s.reader >= 0 && !ordered(w, s.reader, s.read, t))
        return race(array, s.reader, "a read", access);
      if (s.other >= 0 && !ordered(w, s.other, s.other_read, t))
        return race(array, s.other, "a read", access);
      s.writer = t;
      s.written = w.clock;
      s.reader = s.other = -1;
    } else if (s.reader < 0 || s.reader == t || ordered(w, s.reader, s.read, t)) {
      s.reader = t;
      s.read = w.clock;
    } else {
      s.other = t;
      s.other_read = w.clock;
    }
  }
}

/* --- the hooks of the access macros ------------------------------------------------ */
static void out_of_bounds(const char *space, const char *array, long long index, long long n) {
  char at[96], message[512];
  where(at, sizeof at, worker->current);
  snprintf(message, sizeof message,
           "%s: %s access out of bounds: %s has %lld elements, index %lld, by %s",
           launch_info->kernel, space, array, n, index, at);
  fail_here(message);
}

template <class T>
static T *global_access(T *base, long long index, long long bytes, int kind, int site) {
  Worker &w = *worker;
  if (w.aborted) return (T *)w.sink;
  const tc_emu_launch &L = *launch_info;
  if (L.check) {
    const tc_emu_buffer *found = nullptr;
    for (int k = 0; k < L.n_buffers; k++)
      if (L.buffers[k].base == (const char *)base) found = &L.buffers[k];
    if (!found) {
      char message[256];
      snprintf(message, sizeof message, "%s: a global access through a pointer that is not "
               "the start of a buffer of the launch", L.kernel);
      fail_here(message);
      return (T *)w.sink;
    }
    long long n = found->bytes / (long long)sizeof(T);
    if (index < 0 || index * (long long)sizeof(T) + bytes > found->bytes) {
      out_of_bounds("global", found->name, index, n);
      return (T *)w.sink;
    }
    /* a vector access must be aligned to its size, in the address space (a buffer
       may start anywhere: a view into another) */
    if ((unsigned long long)(const void *)(base + index) % (unsigned long long)bytes) {
      char at[96], message[512];
      where(at, sizeof at, w.current);
      snprintf(message, sizeof message, "%s: misaligned %lld-byte access to %s at index %lld, by %s",
               L.kernel, bytes, found->name, index, at);
      fail_here(message);
      return (T *)w.sink;
    }
  }
  T *address = base + index;
  if (L.count) touch(L, address, bytes, kind != STORE, kind != LOAD);
  if (L.count && kind != ATOMIC) {
    w.counters[kind == LOAD ? TC_EMU_GLOBAL_LOAD_BYTES : TC_EMU_GLOBAL_STORE_BYTES] += bytes;
    count_access(site, address, bytes, false);
    yield(READY);
  }
  return address;
}

template <class T>
static T *shared_access(T *base, long long n, const char *name, long long index, long long bytes,
                        int kind, int site) {
  Worker &w = *worker;
  if (w.aborted) return (T *)w.sink;
  const tc_emu_launch &L = *launch_info;
  if (L.check) {
    if (index < 0 || index * (long long)sizeof(T) + bytes > n * (long long)sizeof(T)) {
      out_of_bounds("shared", name, index, n);
      return (T *)w.sink;
    }
    if ((unsigned long long)(const void *)(base + index) % (unsigned long long)bytes) {
      char at[96], message[512];
      where(at, sizeof at, w.current);
      snprintf(message, sizeof message, "%s: misaligned %lld-byte access to shared %s at index %lld, by %s",
               L.kernel, bytes, name, index, at);
      fail_here(message);
      return (T *)w.sink;
    }
    if (kind != ASYNC)  /* a cp.async checks its destination itself (emulator_async.h) */
      check_race(name, base + index, bytes, kind, sizeof(T) < 4 ? (long long)sizeof(T) : 4);
    if (w.aborted) return (T *)w.sink;
  }
  T *address = base + index;
  if (L.count && kind != ATOMIC) {
    w.counters[TC_EMU_SHARED_BYTES] += bytes;
    count_access(site, address, bytes, true);
    yield(READY);
  }
  return address;
}

/* A shared array's elements: all of a static array; from `base` to the end of the
   launch's dynamic shared memory for a pointer into it. */
template <class A>
static auto shared(A &a, const char *name, long long index, long long bytes, int kind, int site) {
  if constexpr (std::is_array<A>::value) {
    return shared_access(&a[0], (long long)std::extent<A>::value, name, index, bytes, kind, site);
  } else {
    using T = typename std::remove_pointer<A>::type;
    Worker &w = *worker;
    long long n = (w.dynamic_shared + launch_info->dynamic_shared - (char *)a) / (long long)sizeof(T);
    return shared_access(a, n, name, index, bytes, kind, site);
  }
}

static inline void *dynamic_shared() { return worker->dynamic_shared; }

/* A __syncwarp completed: the lanes' earlier shared accesses are ordered before their
   later ones. */
static void order_lanes(Worker &w, int warp, const int *lanes, int n) {
  if (!w.paired) w.paired = (long long *)calloc((size_t)((w.n + 31) / 32) * 1024, sizeof(long long));
  long long now = ++w.clock;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      w.paired[((size_t)warp * 32 + lane_of(lanes[i])) * 32 + lane_of(lanes[j])] = now;
}
}  // namespace tc_emu

/* The access macros of generated code: its own prelude defines them as plain indexing
   for NVRTC and the uninstrumented build; here, the hooks. */
#define TC_DYNAMIC_SHARED(T, s) T *s = (T *)tc_emu::dynamic_shared()
#ifdef TC_EMU_INSTRUMENT
#define TC_ACCESS_MACROS
#define TC_LD(a, i) (*tc_emu::global_access((a), (long long)(i), (long long)sizeof(*(a)), tc_emu::LOAD, __COUNTER__))
#define TC_LDG(a, i) ((void)sizeof(__ldg(&(a)[i])), TC_LD(a, i))  /* __ldg must exist for the type */
#define TC_ST(a, i) (*tc_emu::global_access((a), (long long)(i), (long long)sizeof(*(a)), tc_emu::STORE, __COUNTER__))
#define TC_AT(a, i) (tc_emu::global_access((a), (long long)(i), (long long)sizeof(*(a)), tc_emu::ATOMIC, 0))
#define TC_LDV(T, a, i) (*(const T *)tc_emu::global_access((a), (long long)(i), (long long)sizeof(T), tc_emu::LOAD, __COUNTER__))
#define TC_STV(T, a, i) (*(T *)tc_emu::global_access((a), (long long)(i), (long long)sizeof(T), tc_emu::STORE, __COUNTER__))
#define TC_SLD(s, i) (*tc_emu::shared((s), #s, (long long)(i), (long long)sizeof((s)[0]), tc_emu::LOAD, __COUNTER__))
#define TC_SLDV(T, s, i) (*(const T *)tc_emu::shared((s), #s, (long long)(i), (long long)sizeof(T), tc_emu::LOAD, __COUNTER__))
#define TC_SST(s, i) (*tc_emu::shared((s), #s, (long long)(i), (long long)sizeof((s)[0]), tc_emu::STORE, __COUNTER__))
#define TC_SAT(s, i) (tc_emu::shared((s), #s, (long long)(i), (long long)sizeof((s)[0]), tc_emu::ATOMIC, 0))
#endif
