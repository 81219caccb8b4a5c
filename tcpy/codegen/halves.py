"""Half-precision storage in generated code: `float16` and `bfloat16` values are
loaded into float32, computed there, and rounded to nearest-even when stored.

The conversions are helpers of the translation unit, one pair per type. On the CPU
both types are their 16 bits in a `uint16_t`, converted with integer operations that
GCC vectorises. CUDA source stays self-contained (NVRTC is given no headers): `__half` and
`__nv_bfloat16` are 16-bit structs converted by PTX's `cvt` (`cvt.rn.bf16.f32` from
sm_80; integer operations before), and the emulator's header defines the same names
with bit-exact conversions on the CPU.
"""

from __future__ import annotations

import numpy as np

from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef
from tcpy.types import ScalarType


def half_types(cdef: CheckedDef) -> list[ScalarType]:
    """The half types a definition stores or casts to, in a fixed order."""
    used = {t.scalar for t in cdef.tensors if t.scalar.is_half}
    for st in cdef.statements:
        for e in st.expressions:
            used |= {n.to for n in ast.walk(e) if isinstance(n, ast.Cast) and n.to.is_half}
    return [t for t in (ScalarType.FLOAT16, ScalarType.BFLOAT16) if t in used]


def to_float(ty: ScalarType) -> str:
    """The helper converting a stored value of half type `ty` to float32."""
    return f"tc_{ty.value}_to_float"


def from_float(ty: ScalarType) -> str:
    """The helper rounding a float32 value to half type `ty`."""
    return f"tc_float_to_{ty.value}"


# bfloat16 is float32's upper half: widening shifts; rounding adds 0x7fff and the
# lowest kept bit (ties to even), or to a NaN its quiet bit where it lacks it, and keeps
# the upper half. One select of the addend, in 32 bits: GCC 12 narrows a select of the
# two 16-bit results to 16 bits, packing both and the mask, and the row kernels' stores
# took 1.4x as long (a bfloat16 softmax 3.2 against 2.7 ms on one thread, Zen 3); the
# two forms agree on all 2^32 inputs.
_BFLOAT16 = """\
static inline float tc_bfloat16_to_float(uint16_t x) {
  union { uint32_t u; float f; } v;
  v.u = (uint32_t)x << 16;
  return v.f;
}
static inline uint16_t tc_float_to_bfloat16(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  uint32_t u = v.u;
  uint32_t addend = f != f ? ~u & 0x400000u : 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)((u + addend) >> 16);
}
static inline uint16_t tc_exact_bfloat16(float f) {  /* f is a bfloat16 value: no rounding */
  union { uint32_t u; float f; } v;
  v.f = f;
  return (uint16_t)(v.u >> 16);
}
"""

# float16 with integer operations too, so that GCC vectorises them (GCC 12 vectorises
# C's _Float16 conversions in a copy, not in the loops of a row kernel): widening moves
# the exponent and mantissa into place and rescales (exact, subnormals included).
# Rounding lets the FPU round: a float32 M whose ulp is float16's ulp at |f| (2^13
# times |f|'s power of two, or 2^-1 below 2^-14, where float16's ulp is fixed at its
# least subnormal) added to |f| rounds it to nearest-even, and the sum's bits less M's
# count the float16 ulps (a carry into the next power of two included); |f| is first
# clamped to 2^16, which gives infinity, and a NaN sets the quiet bit of an infinity.
# The float16 is built in the upper half of 32 bits and shifted down once: built in
# the lower half, GCC 12 narrowed each term to 16 bits on its own, packing five times
# per vector (a float16 softmax 6.7 against 4.9 ms on one thread, Zen 3). It agrees
# with the masks' form it replaced on all 2^32 inputs. The choices are masks and
# minima, not selects: GCC 12 gives up vectorising a loop where two selects test the
# same value.
_FLOAT16 = """\
static inline float tc_float16_to_float(uint16_t x) {
  union { uint32_t u; float f; } v, scale;
  uint32_t magnitude = (uint32_t)(x & 0x7fffu) << 13;
  scale.u = 0x77800000u;  /* 2^112: from float16's exponent bias to float32's */
  v.u = magnitude;
  v.f *= scale.f;
  uint32_t special = (0u - ((0x0f7fffffu - magnitude) >> 31)) & 0x7f800000u;  /* inf, NaN */
  v.u = v.u | special | (uint32_t)(x & 0x8000u) << 16;
  return v.f;
}
static inline uint16_t tc_float_to_float16(float f) {
  union { uint32_t u; float f; } v, m;
  v.f = f;
  uint32_t sign = v.u & 0x80000000u, a = v.u & 0x7fffffffu;
  uint32_t nan = ((0x7f800000u - a) >> 31) << 25;  /* the quiet bit, 0x200 once shifted */
  a = a < 0x47800000u ? a : 0x47800000u;  /* from 2^16 (and infinity, NaN): 2^16 */
  uint32_t e = a & 0x7f800000u;
  e = e > 0x38800000u ? e : 0x38800000u;  /* |f|'s power of two, 2^-14 at least */
  m.u = e + 0x06800000u;  /* M = 2^13 e */
  v.u = a;
  v.f += m.f;  /* rounded to nearest-even at float16's ulp */
  uint32_t h = ((e - 0x38800000u) << 3) + ((v.u - m.u) << 16);  /* exponent + ulps */
  return (uint16_t)((h | nan | sign) >> 16);
}
"""


def exact_from_float(ty: ScalarType) -> str | None:
    """The C helper storing a float32 value that is already one of `ty`'s (no rounding
    to do: the upper half of a bfloat16's bits); None where `ty` has none."""
    return "tc_exact_bfloat16" if ty is ScalarType.BFLOAT16 else None


def exact(e: ast.Expr, ty: ScalarType) -> bool:
    """Whether `e`, computed in float32, is a value of half type `ty` by construction: a
    read of a `ty` tensor or a cast to `ty`, a literal that `ty` holds, or the minimum,
    maximum, magnitude, negation or choice of such values (a max pool, a ReLU, a
    transpose). Rounding such a value changes nothing."""
    match e:
        case ast.Access() | ast.Cast():
            return e.ty is ty
        case ast.FloatLit(value=v) | ast.IntLit(value=v):
            wide = np.float32(v)
            narrow = wide.astype(ty.dtype).astype(np.float32)
            return float(wide) == v and (narrow == wide or bool(np.isinf(wide)))
        case ast.Binary(op=ast.BinaryOp.MIN | ast.BinaryOp.MAX, lhs=a, rhs=b):
            return exact(a, ty) and exact(b, ty)
        case ast.Call(name="fmin" | "fmax" | "fabs", args=args):
            return all(exact(a, ty) for a in args)
        case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
            return exact(v, ty)
        case ast.Ternary(then=a, orelse=b):
            return exact(a, ty) and exact(b, ty)
    return False


def c_helpers(types: list[ScalarType]) -> str:
    """The C conversions of `types`."""
    return "".join(_FLOAT16 if t is ScalarType.FLOAT16 else _BFLOAT16 for t in types)


CUDA_HALF_TYPES = r"""#ifndef TC_HALF_TYPES
#define TC_HALF_TYPES
struct __align__(2) __half { unsigned short x; };
struct __align__(2) __nv_bfloat16 { unsigned short x; };
static __device__ __forceinline__ float tc_float16_to_float(__half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x));
  return f;
}
static __device__ __forceinline__ __half tc_float_to_float16(float f) {
  __half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f));
  return h;
}
static __device__ __forceinline__ float tc_bfloat16_to_float(__nv_bfloat16 h) {
  return __uint_as_float((unsigned int)h.x << 16);
}
static __device__ __forceinline__ __nv_bfloat16 tc_float_to_bfloat16(float f) {
  __nv_bfloat16 h;
#if __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.x) : "f"(f));
#else
  unsigned int u = __float_as_uint(f);
  h.x = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                         : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
  return h;
}
#endif
#ifndef TC_HALF_LDG
#define TC_HALF_LDG
static __device__ __forceinline__ __half __ldg(const __half *p) {
  __half h;
  h.x = __ldg(&p->x);
  return h;
}
static __device__ __forceinline__ __nv_bfloat16 __ldg(const __nv_bfloat16 *p) {
  __nv_bfloat16 h;
  h.x = __ldg(&p->x);
  return h;
}
#endif
"""
"""The CUDA half types and their conversions (the emulator's header defines
`TC_HALF_TYPES` and its own, bit-exact on the CPU), and `__ldg` of a half element
through its bits (CUDA's own `__ldg` takes built-in types only), which the emulator
compiles as it is."""
