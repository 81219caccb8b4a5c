"""tcpy's own float32 `exp`, `log`, `tanh` and `erf` for generated C: branch-free inline
functions (range reduction, a polynomial, selects for the special values) that GCC
vectorises inside `#pragma omp simd` loops, in place of libm's or libmvec's calls.

Each multiply-add is an explicit `__builtin_fmaf`, and no other product feeds an
addition, so the compiler has nothing to contract: a loop's vector body and its scalar
remainder give the same bits, on any vector width and thread count. Where the CPU has
no FMA instruction, `fmaf` is libm's (exact, and slow).

Maximum errors, measured over every float32 input against glibc's float64 functions
(`tools/check_vector_math.py --exhaustive`, see docs/design/codegen.md): `ERROR_ULPS`.
NaN gives NaN, infinities and signed zeros what IEEE libm gives, `exp` overflows to inf
and underflows through the denormals to +0, `log` of a negative number is NaN and of
±0 is -inf. The polynomials were fitted (near-minimax, Lawson's iteration) in float64
and rounded to float32.
"""

from __future__ import annotations

OWN = frozenset({"exp", "log", "tanh", "erf"})
"""The functions tcpy has its own float32 versions of (`tc_<name>f`); every other math
call, and all of float64, goes to libm (vectorised by libmvec where present)."""

FASTER_IN_LIBMVEC = frozenset({"tanh", "erf"})
"""Those that glibc 2.36's libmvec computes faster (tools/ab_vector_math.py: gelu 0.83x
with tcpy's tanh; in a loop of calls alone, tanh 0.61x and erf 0.75x as fast at 512-bit
vectors), left to libmvec where it is present."""


def chosen(libmvec: bool) -> frozenset[str]:
    """The functions whose float32 calls are tcpy's, with or without `libmvec`."""
    return OWN - FASTER_IN_LIBMVEC if libmvec else OWN


ERROR_ULPS = {"exp": 1.02, "log": 0.89, "tanh": 1.34, "erf": 1.12}
"""Documented bounds in ULPs of the float32 result: the maxima measured over every input
(exp 1.014, log 0.887, tanh 1.332, erf 1.113), rounded up."""

_BITS = """\
static inline __attribute__((always_inline)) uint32_t tc_bits_f32(float x) {
  union { float f; uint32_t u; } v = { x };
  return v.u;
}
static inline __attribute__((always_inline)) float tc_f32_bits(uint32_t u) {
  union { uint32_t u; float f; } v = { u };
  return v.f;
}"""

_EXP = """\
/* exp(x) = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2; 2^n applied in two halves so
   that results in the denormals are rounded once. */
static inline __attribute__((always_inline)) float tc_expf(float x) {
  float c = x > 89.0f ? 89.0f : x;  /* past the overflow and underflow bounds; NaN kept */
  c = c < -104.0f ? -104.0f : c;
  float z = __builtin_fmaf(c, 0x1.715476p+0f, 0x1.8p23f);  /* round(c / ln 2) + 1.5 * 2^23 */
  float k = z - 0x1.8p23f;
  int32_t n = (int32_t)(tc_bits_f32(z) - 0x4b400000u);
  float r = __builtin_fmaf(k, -0x1.62e430p-1f, c);  /* c - k ln 2, ln 2 in two pieces */
  r = __builtin_fmaf(k, 0x1.05c610p-29f, r);
  float q = __builtin_fmaf(0x1.6a243ep-10f, r, 0x1.1239d6p-7f);
  q = __builtin_fmaf(q, r, 0x1.5558f2p-5f);
  q = __builtin_fmaf(q, r, 0x1.555492p-3f);
  q = __builtin_fmaf(q, r, 0x1.fffffcp-2f);
  float p = __builtin_fmaf(r * r, q, r) + 1.0f;  /* e^r = 1 + r + r^2 q(r) */
  int32_t n1 = n >> 1;
  float s1 = tc_f32_bits((uint32_t)(n1 + 127) << 23);
  float s2 = tc_f32_bits((uint32_t)(n - n1 + 127) << 23);
  return p * s1 * s2;
}"""

_LOG = """\
/* `keep ? a : b` in bit operations: GCC 12 does not if-convert (so vectorise) the
   select that ends tc_logf */
static inline __attribute__((always_inline)) float tc_blend_f32(int keep, float a, float b) {
  uint32_t mask = keep ? 0xffffffffu : 0u;
  return tc_f32_bits((tc_bits_f32(a) & mask) | (tc_bits_f32(b) & ~mask));
}
/* log(x) = k ln 2 + log(m), m = x / 2^k in [sqrt(1/2), sqrt(2)), log(1 + f) = f + f^2 q(f). */
static inline __attribute__((always_inline)) float tc_logf(float x) {
  float shift = x < 0x1p-126f ? 23.0f : 0.0f;  /* denormals made normal */
  uint32_t i = tc_bits_f32(x * tc_f32_bits((uint32_t)(shift + 127.0f) << 23)) - 0x3f3504f3u;
  float k = (float)((int32_t)i >> 23) - shift;  /* 0x3f3504f3: the bits of sqrt(1/2) */
  float f = tc_f32_bits((i & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  float q = __builtin_fmaf(-0x1.383d64p-4f, f, 0x1.084e84p-3f);
  q = __builtin_fmaf(q, f, -0x1.0f37a8p-3f);
  q = __builtin_fmaf(q, f, 0x1.227088p-3f);
  q = __builtin_fmaf(q, f, -0x1.54273ep-3f);
  q = __builtin_fmaf(q, f, 0x1.99a402p-3f);
  q = __builtin_fmaf(q, f, -0x1.000428p-2f);
  q = __builtin_fmaf(q, f, 0x1.55555p-2f);
  q = __builtin_fmaf(q, f, -0x1.fffff8p-2f);
  /* k ln 2 + f summed exactly (ln 2's first 15 bits times k fit a float; |k ln 2| > |f|
     where k != 0), the rounding error carried into the small part */
  float a = k * 0x1.62e4p-1f;
  float s = a + f;
  float lo = __builtin_fmaf(k, 0x1.7f7d1cp-20f, (f * f) * q) + ((a - s) + f);
  float special = x < 0.0f ? __builtin_nanf("") : x + x;  /* NaN, +inf, +-0 */
  special = x == 0.0f ? -__builtin_inff() : special;
  return tc_blend_f32((x > 0.0f) & (x < __builtin_inff()), s + lo, special);
}"""

_TANH = """\
/* tanh(x) = x + x^3 q(x^2) for |x| < 0.625, else sign(x) (1 - 2 / (e^(2|x|) + 1)),
   which is 1 in float32 from |x| = 9.01. */
static inline __attribute__((always_inline)) float tc_tanhf(float x) {
  float a = __builtin_fabsf(x);  /* on |x|, the sign put back last: tanh(-0) = -0 */
  float a2 = a * a;
  float q = __builtin_fmaf(0x1.18e1fep-9f, a2, -0x1.0bf508p-7f);
  q = __builtin_fmaf(q, a2, 0x1.638b5cp-6f);
  q = __builtin_fmaf(q, a2, -0x1.b9ee90p-5f);
  q = __builtin_fmaf(q, a2, 0x1.111066p-3f);
  q = __builtin_fmaf(q, a2, -0x1.555554p-2f);
  float small = __builtin_fmaf(a * a2, q, a);
  float e = tc_expf(2.0f * (a > 9.5f ? 9.5f : a));  /* NaN kept */
  float large = 1.0f - 2.0f / (e + 1.0f);
  return __builtin_copysignf(a < 0.625f ? small : large, x);
}"""

_ERF = """\
/* erf(x) = x + x q(x^2) for |x| < 1, else sign(x) (1 - e^(p(|x|))) with p(a) close to
   log(erfc(a)); 1 in float32 from |x| = 3.92. */
static inline __attribute__((always_inline)) float tc_erff(float x) {
  float a = __builtin_fabsf(x);  /* on |x|, the sign put back last */
  float a2 = a * a;
  float q = __builtin_fmaf(0x1.496df0p-14f, a2, -0x1.a3f88ap-11f);
  q = __builtin_fmaf(q, a2, 0x1.5405f0p-8f);
  q = __builtin_fmaf(q, a2, -0x1.b7f916p-6f);
  q = __builtin_fmaf(q, a2, 0x1.ce2cf8p-4f);
  q = __builtin_fmaf(q, a2, -0x1.81273ep-2f);
  q = __builtin_fmaf(q, a2, 0x1.06eba8p-3f);
  float small = __builtin_fmaf(a, q, a);
  float b = a > 3.92f ? 3.92f : a;  /* NaN kept */
  float p = __builtin_fmaf(-0x1.6c079ep-16f, b, 0x1.ceebbap-12f);
  p = __builtin_fmaf(p, b, -0x1.13993ap-8f);
  p = __builtin_fmaf(p, b, 0x1.9d0c02p-6f);
  p = __builtin_fmaf(p, b, -0x1.bc18e2p-4f);
  p = __builtin_fmaf(p, b, -0x1.4434eep-1f);
  p = __builtin_fmaf(p, b, -0x1.212c2ep+0f);
  p = __builtin_fmaf(p, b, 0x1.8b42acp-13f);
  return __builtin_copysignf(a < 1.0f ? small : 1.0f - tc_expf(p), x);
}"""

_SOURCES = {"exp": _EXP, "log": _LOG, "tanh": _TANH, "erf": _ERF}
_NEEDS = {"tanh": ("exp",), "erf": ("exp",)}


def c_name(name: str) -> str:
    """The C name of tcpy's float32 version of the math function `name`."""
    return f"tc_{name}f"


def source(names: set[str] | frozenset[str]) -> str:
    """The C definitions of tcpy's functions `names` (of `OWN`) and of those they call;
    "" for none. The translation unit includes <stdint.h>."""
    wanted = set(names) | {dep for n in names for dep in _NEEDS.get(n, ())}
    if not wanted:
        return ""
    return "\n".join([_BITS, *(_SOURCES[n] for n in _SOURCES if n in wanted)]) + "\n"
