"""The sm_80 instructions of the generated CUDA: asynchronous copies into shared memory
(`cp.async` with its groups and waits), `ldmatrix` and the tensor cores' `mma.sync`,
as macros over inline PTX. The emulator's header defines the same macros
(`TC_ASYNC_INSTRUCTIONS`) with the semantics the PTX ISA documents, so a kernel that
uses them runs, checked, on the CPU.

    TC_CP_ASYNC(s, si, a, gi, n)   copy n (4, 8 or 16) bytes from &a[gi] to &s[si]
    TC_CP_COMMIT()                 close the thread's group of copies issued since the last
    TC_CP_WAIT(n)                  wait until at most n of its newest groups are in flight
    TC_LDMATRIX(x, trans, r, s, si)  x (1, 2, 4) 8x8 matrices of 16-bit elements into r[x]
    TC_MMA_BF16(d, a, b, c)        d[4] = a[4] x b[2] + c[4], m16n8k16, bfloat16 operands
    TC_MMA_F16(d, a, b, c)         the same with float16 operands
    TC_MMA_TF32(d, a, b, c)        m16n8k8, tf32 operands (as TC_TO_TF32 rounds them)
    TC_TO_TF32(x)                  cvt.rna.tf32.f32: the tf32 bits nearest float x

`ldmatrix` takes each lane's row address (16 bytes, aligned); `TC_LDMATRIX`'s `x` and
`trans` and the copies' `n` must be constants."""

from __future__ import annotations

CUDA_INSTRUCTIONS = r"""#ifndef TC_ASYNC_INSTRUCTIONS
#define TC_ASYNC_INSTRUCTIONS
template <int N> static __device__ __forceinline__ void tc_cp_async(void *dst, const void *src) {
  unsigned to = (unsigned)__cvta_generic_to_shared(dst);
  if (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(to), "l"(src), "n"(N));
}
#define TC_CP_ASYNC(s, si, a, gi, n) tc_cp_async<(n)>(&(s)[si], &(a)[gi])
#define TC_CP_COMMIT() asm volatile("cp.async.commit_group;\n" ::)
#define TC_CP_WAIT(n) asm volatile("cp.async.wait_group %0;\n" ::"n"(n))
template <int X, bool T>
static __device__ __forceinline__ void tc_ldmatrix(unsigned *r, const void *row) {
  unsigned at = (unsigned)__cvta_generic_to_shared(row);
  if (X == 1 && !T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(at));
  if (X == 1 && T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(at));
  if (X == 2 && !T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(at));
  if (X == 2 && T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(at));
  if (X == 4 && !T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
  if (X == 4 && T)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}
#define TC_LDMATRIX(x, trans, r, s, si) tc_ldmatrix<(x), (trans)>((r), &(s)[si])
#define TC_MMA_SHAPE(shape, types, d, a, b, c)                                              \
  asm volatile("mma.sync.aligned." shape ".row.col.f32." types ".f32 {%0, %1, %2, %3}, "   \
               "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"                        \
               : "=f"((d)[0]), "=f"((d)[1]), "=f"((d)[2]), "=f"((d)[3])                     \
               : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]), \
                 "f"((c)[0]), "f"((c)[1]), "f"((c)[2]), "f"((c)[3]))
#define TC_MMA_BF16(d, a, b, c) TC_MMA_SHAPE("m16n8k16", "bf16.bf16", d, a, b, c)
#define TC_MMA_F16(d, a, b, c) TC_MMA_SHAPE("m16n8k16", "f16.f16", d, a, b, c)
#define TC_MMA_TF32(d, a, b, c) TC_MMA_SHAPE("m16n8k8", "tf32.tf32", d, a, b, c)
static __device__ __forceinline__ unsigned tc_to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
#define TC_TO_TF32(x) tc_to_tf32(x)
#endif
"""
"""The macros over inline PTX (sm_80 and later); the emulator defines
`TC_ASYNC_INSTRUCTIONS` and its own."""

USES = ("TC_CP_ASYNC", "TC_CP_COMMIT", "TC_CP_WAIT", "TC_LDMATRIX", "TC_MMA_", "TC_TO_TF32")


def needed(source: str) -> bool:
    """Whether the kernels' `source` uses any of the instructions."""
    return any(name in source for name in USES)
