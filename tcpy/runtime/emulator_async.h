/* tcpy's CUDA emulator, continued: the asynchronous copies and the warp-level matrix
   instructions of sm_80, with the semantics the PTX ISA documents.

   cp.async: a copy is issued by one thread and lands in shared memory only when that
   thread's cp.async.wait_group completes its group (or when the thread exits): reading
   or writing its bytes before then, from any thread, is a race the check reports, as
   is a write that races earlier accesses (the copy may land at any time after its
   issue). Uncommitted copies are completed by no wait_group.

   ldmatrix and mma.sync are warp collectives (every lane of the warp, mask 0xffffffff):
   each lane's registers hold the elements the ISA's fragment layouts give it. An
   mma's products are exact in float32 (two halves or two tf32 values), and its sum of
   the products and the accumulator is computed exactly and rounded once to float32. */

namespace tc_emu {

/* --- cp.async ---------------------------------------------------------------------- */
static void complete_copy(Worker &w, int t, const AsyncCopy &c) {
  memcpy(c.dst, c.src, (size_t)c.bytes);
  if (!launch_info->check) return;
  for (char *at = c.dst; at < c.dst + c.bytes; at += c.unit) {
    Shadow &s = w.shadow.at((uintptr_t)at);
    s.copier = -1;
    s.writer = t;  /* landed now: ordered for others by a barrier after the wait */
    s.written = w.clock;
    s.reader = s.other = -1;
  }
}

/* Completes thread `t`'s copies of the groups older than its `newest` most recent
   committed ones (all of them, uncommitted included, when `newest` < 0). */
static void complete_copies(Worker &w, int t, int newest) {
  if (!w.queues) return;
  AsyncQueue &q = w.queues[t];
  int kept = 0;
  for (int k = 0; k < q.n; k++) {
    if (newest < 0 || q.items[k].group < q.committed - newest)
      complete_copy(w, t, q.items[k]);
    else
      q.items[kept++] = q.items[k];
  }
  q.n = kept;
}

static void cp_async(char *dst, const char *src, int bytes, int unit, const char *array) {
  Worker &w = *worker;
  if (w.aborted) return;
  int t = w.current;
  if (!w.queues) w.queues = (AsyncQueue *)calloc((size_t)w.n, sizeof(AsyncQueue));
  AsyncQueue &q = w.queues[t];
  if (launch_info->check) {
    for (char *at = dst; at < dst + bytes; at += unit) {
      Shadow &s = w.shadow.at((uintptr_t)at);
      if (s.copier >= 0) {
        char a[96], b[96], message[512];
        where(a, sizeof a, s.copier);
        where(b, sizeof b, t);
        snprintf(message, sizeof message, "%s: shared-memory race on %s: a cp.async by %s and "
                 "a cp.async by %s into it are in flight together", launch_info->kernel, array, a, b);
        return fail_here(message);
      }
    }
    check_race(array, dst, bytes, STORE, unit);  /* the copy may land at once */
    if (w.aborted) return;
    for (char *at = dst; at < dst + bytes; at += unit) w.shadow.at((uintptr_t)at).copier = t;
  }
  if (q.n == q.capacity) {
    q.capacity = q.capacity ? 2 * q.capacity : 16;
    q.items = (AsyncCopy *)realloc(q.items, (size_t)q.capacity * sizeof(AsyncCopy));
  }
  q.items[q.n++] = AsyncCopy{dst, src, bytes, unit, q.committed, array};
  if (launch_info->count) w.counters[TC_EMU_ASYNC_COPIES] += 1;
}

static void cp_async_commit() {
  Worker &w = *worker;
  if (!w.queues) w.queues = (AsyncQueue *)calloc((size_t)w.n, sizeof(AsyncQueue));
  w.queues[w.current].committed += 1;
  if (launch_info->count) w.counters[TC_EMU_ASYNC_GROUPS] += 1;
}

static void cp_async_wait(int newest) { complete_copies(*worker, worker->current, newest); }

/* --- ldmatrix and mma.sync --------------------------------------------------------- */
static inline int lane() { return lane_of(worker->current); }

static inline float from_bf16(unsigned bits) { return __uint_as_float((bits & 0xffffu) << 16); }
static inline float from_f16(unsigned bits) { return tc_float16_to_float(__half{(unsigned short)bits}); }
static inline float from_tf32(unsigned bits) { return __uint_as_float(bits & 0xffffe000u); }

/* ldmatrix .m8n8 .x1/.x2/.x4 [.trans] .b16: matrix i's 8 rows of 8 elements are at the
   addresses of lanes 8i..8i+7; lane L's register i holds row L/4, columns 2(L%4) and
   2(L%4)+1 (the lower in the low half), or with .trans, column L/4 of rows 2(L%4) and
   2(L%4)+1. */
static void load_matrices(Worker &w, int first, int count, bool trans) {
  for (int i = 0; i < count; i++) {
    unsigned short m[8][8];
    for (int j = 0; j < 8; j++) {
      const void *row = ((MatrixLane *)w.fiber[first + 8 * i + j].value)->row;
      if (row) memcpy(m[j], row, 16);
      else memset(m[j], 0, 16);
    }
    for (int l = 0; l < 32; l++) {
      int g = l / 4, c = 2 * (l % 4);
      unsigned lo = trans ? m[c][g] : m[g][c], hi = trans ? m[c + 1][g] : m[g][c + 1];
      ((MatrixLane *)w.fiber[first + l].value)->r[i] = lo | hi << 16;
    }
  }
}

/* mma.sync.aligned .m16n8k16 (.f16, .bf16) and .m16n8k8 (.tf32), .row.col, float32
   accumulators. Lane L (g = L/4, t = L%4) holds: of C and D, (g, 2t), (g, 2t+1),
   (g+8, 2t), (g+8, 2t+1); of A (m16n8k16), pairs (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..),
   (g+8, 2t+8..); of B, pairs down the reduction (2t..2t+1, g), (2t+8..2t+9, g); of A
   (m16n8k8), (g, t), (g+8, t), (g, t+4), (g+8, t+4); of B, (t, g), (t+4, g). */
static void multiply(Worker &w, int first, int kind) {
  float a[16][16], b[16][8], c[16][8];
  int k_extent = kind == MMA_TF32 ? 8 : 16;
  for (int l = 0; l < 32; l++) {
    MatrixLane &m = *(MatrixLane *)w.fiber[first + l].value;
    int g = l / 4, t = l % 4;
    if (kind == MMA_TF32) {
      a[g][t] = from_tf32(m.a[0]);
      a[g + 8][t] = from_tf32(m.a[1]);
      a[g][t + 4] = from_tf32(m.a[2]);
      a[g + 8][t + 4] = from_tf32(m.a[3]);
      b[t][g] = from_tf32(m.b[0]);
      b[t + 4][g] = from_tf32(m.b[1]);
    } else {
      auto half = kind == MMA_BF16 ? from_bf16 : from_f16;
      for (int r = 0; r < 4; r++) {
        int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
        a[row][col] = half(m.a[r]);
        a[row][col + 1] = half(m.a[r] >> 16);
      }
      for (int r = 0; r < 2; r++) {
        b[2 * t + 8 * r][g] = half(m.b[r]);
        b[2 * t + 8 * r + 1][g] = half(m.b[r] >> 16);
      }
    }
    for (int r = 0; r < 4; r++) c[g + 8 * (r >> 1)][2 * t + (r & 1)] = m.c[r];
  }
  for (int l = 0; l < 32; l++) {
    MatrixLane &m = *(MatrixLane *)w.fiber[first + l].value;
    int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; r++) {
      int row = g + 8 * (r >> 1), col = 2 * t + (r & 1);
      double sum = c[row][col];
      for (int k = 0; k < k_extent; k++) sum += (double)a[row][k] * (double)b[k][col];
      m.d[r] = (float)sum;
    }
  }
  if (launch_info->count) w.counters[TC_EMU_MMAS] += 1;
}

/* A warp's ldmatrix or mma.sync whose lanes have all arrived: false (the launch
   failed) unless every lane of the warp takes part with the same instruction. */
static bool warp_matrix(Worker &w, int first, const int *lanes, int n) {
  Fiber &f = w.fiber[lanes[0]];
  for (int k = 0; k < n; k++)
    if (w.fiber[lanes[k]].arg != f.arg) n = -1;
  if (n != 32 || f.mask != 0xffffffffu) {
    char at[96], message[512];
    where(at, sizeof at, lanes[0]);
    snprintf(message, sizeof message, "%s: %s by %s: %s", launch_info->kernel,
             WARP_OP_NAMES[f.op], at, n < 0 ? "the lanes of the warp execute different shapes"
             : "it needs all 32 lanes of the warp, mask 0xffffffff");
    record_failure(message);
    w.aborted = true;
    return false;
  }
  if (f.op == LDMATRIX) load_matrices(w, first, (int)(f.arg & 7), f.arg >> 4 & 1);
  else multiply(w, first, (int)f.arg);
  for (int k = 0; k < n; k++) w.fiber[lanes[k]].result = 0;
  return true;
}

static void ldmatrix(int count, bool trans, unsigned *r, const void *row) {
  if ((uintptr_t)row & 15) {  /* each row's address must be 16-byte aligned */
    char at[96], message[512];
    where(at, sizeof at, worker->current);
    snprintf(message, sizeof message, "%s: ldmatrix by %s: a row address not on 16 bytes",
             launch_info->kernel, at);
    fail_here(message);
  }
  MatrixLane m{};
  m.row = row;
  warp_op(LDMATRIX, 0, 0xffffffffu, (uint64_t)(uintptr_t)&m, count | (trans ? 16 : 0), 32);
  for (int i = 0; i < count; i++) r[i] = m.r[i];
}

static void mma(int kind, float *d, const unsigned *a, const unsigned *b, const float *c) {
  MatrixLane m{};
  memcpy(m.a, a, sizeof m.a);
  memcpy(m.b, b, sizeof m.b);
  memcpy(m.c, c, sizeof m.c);
  warp_op(MMA, 0, 0xffffffffu, (uint64_t)(uintptr_t)&m, kind, 32);
  memcpy(d, m.d, sizeof m.d);
}

/* cvt.rna.tf32.f32: to the nearest tf32 value (10 explicit bits), ties away from zero */
static inline unsigned to_tf32(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x00400000u) & 0xffffe000u;  /* NaN */
  return (u + 0x1000u) & 0xffffe000u;
}

}  // namespace tc_emu

/* The instructions' macros (the generated source's prelude defines them with inline
   PTX for NVRTC: tcpy/codegen/instructions.py) */
#define TC_ASYNC_INSTRUCTIONS
#ifdef TC_EMU_INSTRUMENT
#define TC_CP_ASYNC(s, si, a, gi, n) tc_emu::cp_async( \
    (char *)tc_emu::shared((s), #s, (long long)(si), (long long)(n), tc_emu::ASYNC, __COUNTER__), \
    (const char *)tc_emu::global_access((a), (long long)(gi), (long long)(n), tc_emu::LOAD, __COUNTER__), \
    (n), sizeof((s)[0]) < 4 ? (int)sizeof((s)[0]) : 4, #s)
#define TC_LDMATRIX(x, trans, r, s, si) tc_emu::ldmatrix((x), (trans), (r), tc_emu::lane() < 8 * (x) \
    ? (const void *)tc_emu::shared((s), #s, (long long)(si), 16, tc_emu::LOAD, __COUNTER__) : nullptr)
#else
#define TC_CP_ASYNC(s, si, a, gi, n) tc_emu::cp_async((char *)&(s)[si], (const char *)&(a)[gi], (n), \
    sizeof((s)[0]) < 4 ? (int)sizeof((s)[0]) : 4, #s)
#define TC_LDMATRIX(x, trans, r, s, si) tc_emu::ldmatrix((x), (trans), (r), \
    tc_emu::lane() < 8 * (x) ? (const void *)&(s)[si] : nullptr)
#endif
#define TC_CP_COMMIT() tc_emu::cp_async_commit()
#define TC_CP_WAIT(n) tc_emu::cp_async_wait(n)
#define TC_MMA_BF16(d, a, b, c) tc_emu::mma(tc_emu::MMA_BF16, (d), (a), (b), (c))
#define TC_MMA_F16(d, a, b, c) tc_emu::mma(tc_emu::MMA_F16, (d), (a), (b), (c))
#define TC_MMA_TF32(d, a, b, c) tc_emu::mma(tc_emu::MMA_TF32, (d), (a), (b), (c))
#define TC_TO_TF32(x) tc_emu::to_tf32(x)
