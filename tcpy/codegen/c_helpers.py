"""Helper functions of generated C: index arithmetic, checked division and indexing,
and the CUDA math functions that C's math library lacks, under CUDA's names.

Only the helpers a kernel uses are emitted; tcpy's own float32 exp, log, tanh and erf
come from `tcpy.codegen.vector_math`. The special functions are computed in
double (Newton steps on erf/erfc for the inverses, series and asymptotic expansions
for the Bessel functions), accurate well beyond float precision.
"""

from __future__ import annotations

from tcpy.codegen import vector_math
from tcpy.codegen.dialect import C, Dialect
from tcpy.codegen.exprs import Helpers, extremum_helper, numeric_extremum_helper
from tcpy.codegen.status import STATUS_DIVISION_BY_ZERO, STATUS_INDEX_OUT_OF_RANGE
from tcpy.types import ScalarType


def index_helpers(d: Dialect) -> str:
    i = d.index_type
    return f"""\
{d.function_prefix} {i} tc_floord({i} a, {i} b) {{ return (a >= 0) ? a / b : -((-a + b - 1) / b); }}
{d.function_prefix} {i} tc_min({i} a, {i} b) {{ return a < b ? a : b; }}
{d.function_prefix} {i} tc_max({i} a, {i} b) {{ return a > b ? a : b; }}
"""


def checked_index(d: Dialect) -> str:
    i = d.ctype(ScalarType.INT64)  # a gathered index is checked before it is narrowed
    store = d.status_store.format(code=STATUS_INDEX_OUT_OF_RANGE)
    return f"""\
{d.function_prefix} {i} tc_index({i} i, {i} n, int *tc_status) {{
  if (i < 0 || i >= n) {{ {store}; return 0; }}
  return i;
}}
"""


_UNSIGNED = {
    ScalarType.INT8: ScalarType.UINT8,
    ScalarType.INT16: ScalarType.UINT16,
    ScalarType.INT32: ScalarType.UINT32,
    ScalarType.INT64: ScalarType.UINT64,
}


def _extrema(ty: ScalarType, d: Dialect) -> str:
    """min and max of a type; on floats they propagate NaN (a NaN operand is the
    result), as two selects: written `(a > b || a != a) ? a : b`, GCC made the
    scalar code of a loop (the iterations a vector loop leaves) two branches on the
    data: a 2x2 max pool's forward ran 3.7x slower on random values."""
    ctype = d.ctype(ty)
    lines = []
    for smallest in (True, False):
        cmp = "<" if smallest else ">"
        chosen = f"(a {cmp} b) ? a : b"
        body = (
            f"{ctype} m = {chosen}; return (a != a) ? a : m;"
            if ty.is_float
            else f"return {chosen};"
        )
        lines.append(
            f"{d.function_prefix} {ctype} {extremum_helper(smallest, ty)}({ctype} a, {ctype} b) "
            f"{{ {body} }}"
        )
    return "\n".join(lines) + "\n"


def _numeric_extrema(ty: ScalarType, d: Dialect) -> str:
    """C's fmin and fmax of a float type as two selects, which GCC vectorises (libm's
    are calls): a NaN operand gives the other operand, two NaNs a NaN, and of equal
    operands (+0 and -0) the second, as glibc's x86-64 fminf and fmaxf give."""
    ctype = d.ctype(ty)
    lines = []
    for smallest in (True, False):
        cmp = "<" if smallest else ">"
        name = numeric_extremum_helper(smallest, ty)
        lines.append(
            f"{d.function_prefix} {ctype} {name}({ctype} a, {ctype} b) "
            f"{{ {ctype} m = (a {cmp} b) ? a : b; return (b != b) ? a : m; }}"
        )
    return "\n".join(lines) + "\n"


def _division(ty: ScalarType, d: Dialect) -> str:
    ctype, name = d.ctype(ty), ty.value
    store = d.status_store.format(code=STATUS_DIVISION_BY_ZERO)
    overflow = mod_overflow = ""
    if ty in _UNSIGNED:
        # INT_MIN / -1 traps like a division by zero; C wraps it to INT_MIN.
        unsigned = d.ctype(_UNSIGNED[ty])
        overflow = f"  if (b == -1) return ({ctype})(({unsigned})0 - ({unsigned})a);\n"
        mod_overflow = "  if (b == -1) return 0;\n"
    return f"""\
{d.function_prefix} {ctype} tc_div_{name}({ctype} a, {ctype} b, int *tc_status) {{
  if (b == 0) {{ {store}; return 0; }}
{overflow}  return a / b;
}}
{d.function_prefix} {ctype} tc_mod_{name}({ctype} a, {ctype} b, int *tc_status) {{
  if (b == 0) {{ {store}; return 0; }}
{mod_overflow}  return a % b;
}}
"""


_DOUBLE_MATH = {
    "rsqrt": "static inline double rsqrt(double x) { return 1.0 / sqrt(x); }",
    "rcbrt": "static inline double rcbrt(double x) { return 1.0 / cbrt(x); }",
    "cospi": "static inline double cospi(double x) { return cos(M_PI * x); }",
    "sinpi": "static inline double sinpi(double x) { return sin(M_PI * x); }",
    "fdivide": "static inline double fdivide(double x, double y) { return x / y; }",
    "rhypot": "static inline double rhypot(double x, double y) { return 1.0 / hypot(x, y); }",
    "norm3d": "static inline double norm3d(double a, double b, double c) "
    "{ return sqrt(a * a + b * b + c * c); }",
    "rnorm3d": "static inline double rnorm3d(double a, double b, double c) "
    "{ return 1.0 / sqrt(a * a + b * b + c * c); }",
    "norm4d": "static inline double norm4d(double a, double b, double c, double d) "
    "{ return sqrt(a * a + b * b + c * c + d * d); }",
    "rnorm4d": "static inline double rnorm4d(double a, double b, double c, double d) "
    "{ return 1.0 / sqrt(a * a + b * b + c * c + d * d); }",
    "normcdf": "static inline double normcdf(double x) { return 0.5 * erfc(-x * M_SQRT1_2); }",
    "erfcx": """\
static inline double erfcx(double x) {
  if (x < 25.0) return exp(x * x) * erfc(x);
  double r = 1.0 / (x * x);  /* asymptotic series */
  return (1.0 - 0.5 * r * (1.0 - 1.5 * r * (1.0 - 2.5 * r))) / (x * 1.7724538509055160273);
}""",
    "erfinv": """\
static inline double erfinv(double y) {
  if (y <= -1.0) return y == -1.0 ? -HUGE_VAL : NAN;
  if (y >= 1.0) return y == 1.0 ? HUGE_VAL : NAN;
  /* a closed-form first guess (a = 0.147), then Newton steps on erf */
  double l = log((1.0 - y) * (1.0 + y)), t = 2.0 / (M_PI * 0.147) + 0.5 * l;
  double x = copysign(sqrt(sqrt(t * t - l / 0.147) - t), y);
  for (int k = 0; k < 3; k++)
    x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
  return x;
}""",
    "erfcinv": """\
static inline double erfcinv(double y) {
  if (y <= 0.0) return y == 0.0 ? HUGE_VAL : NAN;
  if (y >= 2.0) return y == 2.0 ? -HUGE_VAL : NAN;
  double x = erfinv(1.0 - y);
  if (!isfinite(x)) x = y < 1.0 ? sqrt(-log(y)) : -sqrt(-log(2.0 - y));
  for (int k = 0; k < 4; k++)
    x += (erfc(x) - y) / (1.1283791670955126 * exp(-x * x));
  return x;
}""",
    "normcdfinv": "static inline double normcdfinv(double p) { return -M_SQRT2 * erfcinv(2.0 * p); }",
    "cyl_bessel_i0": """\
static inline double cyl_bessel_i0(double x) {
  double a = fabs(x);
  if (a > 30.0) {  /* asymptotic expansion */
    double r = 1.0 / (8.0 * a);
    return exp(a) / sqrt(2.0 * M_PI * a) * (1.0 + r * (1.0 + r * (4.5 + r * 37.5)));
  }
  double q = 0.25 * a * a, term = 1.0, sum = 1.0;
  for (int k = 1; k < 200 && term > 1e-17 * sum; k++) { term *= q / ((double)k * k); sum += term; }
  return sum;
}""",
    "cyl_bessel_i1": """\
static inline double cyl_bessel_i1(double x) {
  double a = fabs(x), s;
  if (a > 30.0) {
    double r = 1.0 / (8.0 * a);
    s = exp(a) / sqrt(2.0 * M_PI * a) * (1.0 - r * (3.0 + r * (7.5 + r * 52.5)));
  } else {
    double q = 0.25 * a * a, term = 0.5 * a; s = term;
    for (int k = 1; k < 200 && term > 1e-17 * s; k++) { term *= q / ((double)k * (k + 1)); s += term; }
  }
  return x < 0 ? -s : s;
}""",
}

# The float versions compute in double and round once.
_DEPENDS = {"erfcinv": ["erfinv"], "normcdfinv": ["erfcinv", "erfinv"]}
_ARITY = {"fdivide": 2, "rhypot": 2, "norm3d": 3, "rnorm3d": 3, "norm4d": 4, "rnorm4d": 4}


def _float_version(name: str) -> str:
    n = _ARITY.get(name, 1)
    params = ", ".join(f"float x{i}" for i in range(n))
    args = ", ".join(f"(double)x{i}" for i in range(n))
    return f"static inline float {name}f({params}) {{ return (float){name}({args}); }}"


def helper_source(helpers: Helpers, d: Dialect = C) -> str:
    """The helpers a kernel uses; for CUDA only the index helpers, since every math
    function exists on the device (and in the emulator's header)."""
    parts = [index_helpers(d)]
    if helpers.checked_index:
        parts.append(checked_index(d))
    parts.extend(_division(t, d) for t in sorted(helpers.divisions, key=lambda t: t.value))
    parts.extend(_extrema(t, d) for t in sorted(helpers.extrema, key=lambda t: t.value))
    numeric = sorted(helpers.numeric_extrema, key=lambda t: t.value)
    parts.extend(_numeric_extrema(t, d) for t in numeric)
    if d is not C:
        return "\n".join(parts)
    own = {name for name in vector_math.OWN if vector_math.c_name(name) in helpers.builtins}
    return "\n".join(
        p for p in [*parts, math_helpers(helpers.builtins), vector_math.source(own)] if p
    )


def math_helpers(builtins: set[str]) -> str:
    """C versions of the CUDA math functions C lacks, for the functions in `builtins`."""
    parts: list[str] = []
    wanted: list[str] = []
    for fn in sorted(builtins):
        base = fn[:-1] if fn.endswith("f") and fn[:-1] in _DOUBLE_MATH else fn
        if base in _DOUBLE_MATH:
            for dep in [*_DEPENDS.get(base, []), base]:
                if dep not in wanted:
                    wanted.append(dep)
    order = [name for name in _DOUBLE_MATH if name in wanted]
    parts.extend(_DOUBLE_MATH[name] for name in order)
    for fn in sorted(builtins):
        if fn.endswith("f") and fn[:-1] in _DOUBLE_MATH:
            parts.append(_float_version(fn[:-1]))
    return "\n".join(parts)


# Functions glibc's libmvec provides in vector form (glibc 2.35 and later); declaring
# them `simd` lets the compiler vectorise loops that call them.
VECTOR_MATH = frozenset(
    {"acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "cos", "cosh",
     "erf", "erfc", "exp", "exp10", "exp2", "expm1", "hypot", "log", "log10", "log1p",
     "log2", "pow", "sin", "sinh", "tan", "tanh"}
)  # fmt: skip
_ARITY2 = {"atan2", "hypot", "pow"}


def vector_math_declarations(builtins: set[str]) -> str:
    lines = []
    for fn in sorted(builtins):
        single = fn.endswith("f") and fn[:-1] in VECTOR_MATH
        if not single and fn not in VECTOR_MATH:
            continue
        base = fn[:-1] if single else fn
        ctype = "float" if single else "double"
        params = ", ".join([ctype] * (2 if base in _ARITY2 else 1))
        lines.append(f'{ctype} {fn}({params}) __attribute__((simd("notinbranch")));')
    return "\n".join(lines)
