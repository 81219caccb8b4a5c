"""Half-precision storage in generated code: `float16` and `bfloat16` values are
loaded into float32, computed there, and rounded to nearest-even when stored.

The conversions are helpers of the translation unit, one pair per type. On the CPU a
`float16` is C's `_Float16` (F16C's instructions where the CPU has them) and a
`bfloat16` its 16 bits in a `uint16_t`, converted with integer operations that GCC
vectorises. CUDA source stays self-contained (NVRTC is given no headers): `__half` and
`__nv_bfloat16` are 16-bit structs converted by PTX's `cvt` (`cvt.rn.bf16.f32` from
sm_80; integer operations before), and the emulator's header defines the same names
with bit-exact conversions on the CPU.
"""

from __future__ import annotations

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
# lowest kept bit (ties to even) and keeps a NaN a (quiet) NaN.
_BF16_BITS = """\
{prefix} float tc_bfloat16_bits_to_float(unsigned int b) {{
  {bits_to_float}
}}
{prefix} unsigned short tc_float_to_bfloat16_bits(float f) {{
  {float_to_bits}
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}}
"""


def c_helpers(types: list[ScalarType]) -> str:
    """The C conversions of `types`."""
    prefix = "static inline"
    parts = []
    if ScalarType.FLOAT16 in types:
        parts.append(
            f"{prefix} float tc_float16_to_float(_Float16 x) {{ return (float)x; }}\n"
            f"{prefix} _Float16 tc_float_to_float16(float x) {{ return (_Float16)x; }}\n"
        )
    if ScalarType.BFLOAT16 in types:
        parts.append(
            _BF16_BITS.format(
                prefix=prefix,
                bits_to_float="union { uint32_t u; float f; } v; v.u = b << 16; return v.f;",
                float_to_bits="union { uint32_t u; float f; } v; v.f = f; uint32_t u = v.u;",
            )
            + f"{prefix} float tc_bfloat16_to_float(uint16_t x) "
            "{ return tc_bfloat16_bits_to_float(x); }\n"
            f"{prefix} uint16_t tc_float_to_bfloat16(float x) "
            "{ return tc_float_to_bfloat16_bits(x); }\n"
        )
    return "\n".join(parts)


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
"""
"""The CUDA half types and their conversions (the emulator's header defines
`TC_HALF_TYPES` and its own, bit-exact on the CPU)."""
