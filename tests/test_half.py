"""Half precision (`float16`, `bfloat16`) on every target: the promotion and literal
rules, bit-exact conversions, float32 accumulation with one rounding, the corpus
retyped to each half type against the corpus' own float64 NumPy computations, and
half tensors in and out of NumPy and PyTorch."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import warnings
from functools import cache
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tcpy
from tcpy.codegen import halves
from tcpy.codegen.dialect import CUDA
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.gpu.device import named
from tcpy.mapping.options import MappingOptions
from tcpy.parser import ast as tc
from tcpy.parser import check_source
from tcpy.parser.parse import retyped
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import cpu, nvrtc, toolchain
from tcpy.types import ScalarType as T
from tcpy.types import builtin_result, promote

from corpus_cases import CASES, Case
from differential import CORPUS, as_tuple, make_inputs

HALVES = (T.FLOAT16, T.BFLOAT16)
TARGETS = ("reference", "cpu", "cuda-emu")
UNIT = {T.FLOAT16: 2.0**-11, T.BFLOAT16: 2.0**-8}
"""The unit roundoff of each half type: half the distance from 1 to the next value."""


@cache
def _engine(target: str, source: str) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(target=target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        engine.define(source)
    return engine


# --- types ---------------------------------------------------------------------------


def test_promotion_of_half_types() -> None:
    assert promote(T.BFLOAT16, T.BFLOAT16) is T.BFLOAT16
    assert promote(T.BFLOAT16, T.FLOAT16) is T.FLOAT32  # neither holds the other
    assert promote(T.BFLOAT16, T.INT32) is T.BFLOAT16
    assert promote(T.BFLOAT16, T.FLOAT32) is T.FLOAT32
    assert promote(T.FLOAT16, T.FLOAT64) is T.FLOAT64
    assert builtin_result((T.BFLOAT16,)) is T.BFLOAT16
    assert builtin_result((T.FLOAT16, T.INT32)) is T.FLOAT16
    assert builtin_result((T.FLOAT16, T.BFLOAT16)) is T.FLOAT32
    assert builtin_result((T.INT32,)) is T.FLOAT32
    assert T.BFLOAT16.compute is T.FLOAT32 and T.BFLOAT16.bits == 16
    assert T.from_dtype(np.dtype(ml_dtypes.bfloat16)) is T.BFLOAT16
    assert T.from_name("bfloat16") is T.BFLOAT16


def _rhs_types(source: str) -> list[tuple[str, T | None]]:
    cdef = next(iter(check_source(source).values()))
    return [(type(n).__name__, n.ty) for st in cdef.statements for n in tc.walk(st.rhs)]


@pytest.mark.parametrize(
    ("declared", "output"),
    [("float16", T.FLOAT16), ("bfloat16", T.BFLOAT16), ("double", T.FLOAT64),
     ("float", T.FLOAT32)],
)  # fmt: skip
def test_literals_take_the_type_they_meet(declared: str, output: T) -> None:
    source = f"def f({declared}(N) X) -> (Y, Z) {{ Y(i) = X(i) * 0.5 + 1.0 / 3.0\n" \
             f" Z(i) = exp(X(i)) > 0.7978845608 ? X(i) : -0.25 }}"  # fmt: skip
    cdef = check_source(source)["f"]
    assert [t.scalar for t in cdef.outputs] == [output, output]
    literals = [ty for kind, ty in _rhs_types(source) if kind == "FloatLit"]
    assert literals == [output] * len(literals) and len(literals) == 5


def test_a_literal_stored_into_a_tensor_takes_its_type() -> None:
    cdef = check_source("def f(double(N) X) -> (double(N) Y) { Y(i) = 0.1 }")["f"]
    assert cdef.statements[0].rhs.ty is T.FLOAT64
    out = _engine("reference", "def f(double(N) X) -> (double(N) Y) { Y(i) = 0.1 }").f(np.zeros(3))
    assert out[0] == 0.1  # the literal's exact value, not 0.1 rounded to float32


def test_literals_alone_are_float32() -> None:
    source = "def f(float16(N) X) -> (Y) { Y(i) = 0.5 * i where i in 0:N }"
    assert check_source(source)["f"].outputs[0].scalar is T.FLOAT32


def test_double_literal_keeps_its_value_on_every_target() -> None:
    source = "def g(double(N) X) -> (Y) { Y(i) = X(i) * 0.7978845608028654 }"
    x = np.linspace(-3, 3, 17)
    for target in ("reference", "cpu", "cuda-emu"):
        np.testing.assert_array_equal(_engine(target, source).g(x), x * 0.7978845608028654)


def test_mixed_half_types_are_float32_and_need_a_cast_to_store() -> None:
    cdef = check_source("def f(float16(N) A, bfloat16(N) B) -> (C) { C(i) = A(i) + B(i) }")
    assert cdef["f"].outputs[0].scalar is T.FLOAT32
    with pytest.raises(tcpy.TCTypeError, match="cannot store a float32 value into bfloat16"):
        check_source("def f(float(N) A) -> (bfloat16(N) B) { B(i) = A(i) }")


# --- conversions ----------------------------------------------------------------------

WIDEN = """
def widen(float16(N) H, bfloat16(N) B) -> (HF, BF) {
    HF(i) = float(H(i))
    BF(i) = float(B(i))
}
"""
NARROW = """
def narrow(float(N) X) -> (H, B) {
    H(i) = float16(X(i))
    B(i) = bfloat16(X(i))
}
"""


def _every_half() -> tuple[np.ndarray, np.ndarray]:
    bits = np.arange(1 << 16, dtype=np.uint16)
    return bits.view(np.float16), bits.view(ml_dtypes.bfloat16)


def _narrowing_cases() -> np.ndarray:
    """float32 values at and around every rounding boundary that matters: ties between
    two half values (to even), values just either side of them, subnormals of each
    type, the largest finite values, overflow, infinities and NaN."""
    rng = np.random.default_rng(7)
    below16 = np.arange(1 << 16, dtype=np.uint32) << 16  # bfloat16 values as float32
    ties = (below16 | 0x8000).view(np.float32)
    near = np.concatenate([(below16 | 0x7FFF), (below16 | 0x8001), below16 | 0x0001])
    values = [ties, near.view(np.float32), rng.standard_normal(20000).astype(np.float32)]
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    h = h[np.isfinite(h)]
    up = np.nextafter(h, np.float32(np.inf))
    mid = ((h.astype(np.float64)[:-1] + h.astype(np.float64)[1:]) / 2).astype(np.float32)
    values += [h, up, mid, np.float32([65504, 65519.99, 65520, 1e30, -1e30, np.inf, -np.inf])]
    return np.concatenate(values)


@pytest.mark.parametrize("target", TARGETS)
def test_conversions_are_bit_exact(target: str) -> None:
    """Every float16 and bfloat16 value widens exactly, and float32 values round to
    nearest-even (overflow to infinity, NaN stays NaN) as NumPy and ml_dtypes do."""
    h, b = _every_half()
    hf, bf = _engine(target, WIDEN).widen(h, b)
    np.testing.assert_array_equal(hf, h.astype(np.float32))
    np.testing.assert_array_equal(bf, b.astype(np.float32))
    # NaNs quiet and signalling, with payloads in the kept and the dropped bits: none
    # may round to an infinity or carry into the sign
    nans = np.uint32([0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000])
    x = np.concatenate([_narrowing_cases(), np.float32([np.nan, -np.nan]), nans.view(np.float32)])
    hs, bs = _engine(target, NARROW).narrow(x)
    assert hs.dtype == np.float16 and bs.dtype == ml_dtypes.bfloat16
    nan = np.isnan(x)  # NaN stays NaN; its payload is not compared
    for got, ty in ((hs, np.float16), (bs, ml_dtypes.bfloat16)):
        with np.errstate(over="ignore"):
            want = x[~nan].astype(ty).view(np.uint16)
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want)
        assert np.isnan(got[nan].astype(np.float32)).all()


EVERY_FLOAT32 = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
%s
/* the roundings written as their definitions read: a NaN stays a NaN, made quiet;
   any other value goes to the nearer value of the type, to the even one at a tie,
   and beyond the largest float16 (from 65520) to infinity */
static uint16_t nearest_bfloat16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  uint32_t kept = u >> 16, dropped = u & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u))) kept += 1;
  return (uint16_t)kept;
}
static uint16_t nearest_float16(uint32_t u) {
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  int e = a >= 0x00800000u ? (int)(a >> 23) - 127 : -126;  /* |f| = mant 2^(e - 23) */
  uint64_t mant = (a & 0x7fffffu) | (a >= 0x00800000u ? 0x800000u : 0u);
  int at = e > -14 ? e : -14;      /* float16's ulp: 2^(at - 10) */
  int shift = at - e + 13;         /* |f| in those ulps: mant / 2^shift */
  if (shift > 40) return sign;     /* below half the least subnormal */
  uint64_t units = mant >> shift, rest = mant & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rest > half || (rest == half && (units & 1u))) units += 1;
  return sign | (uint16_t)(((uint32_t)(at + 14) << 10) + units);  /* a carry moves `at` on */
}
int main(int argc, char **argv) {
  uint64_t step = argc > 1 ? strtoull(argv[1], 0, 10) : 1, wrong16 = 0, wrongb = 0;
  for (uint64_t i = 0; i < (1ull << 32); i += step) {
    uint32_t u = (uint32_t)i;
    float f;
    memcpy(&f, &u, 4);
    wrongb += tc_float_to_bfloat16(f) != nearest_bfloat16(u);
    wrong16 += tc_float_to_float16(f) != nearest_float16(u);
  }
  printf("%%llu %%llu\n", (unsigned long long)wrongb, (unsigned long long)wrong16);
  return 0;
}
"""


def _roundings_wrong(tmp_path: Path, step: int) -> str:
    """The CPU's roundings to bfloat16 and float16, built as kernels are, against
    round-to-nearest-even written out, on every `step`-th float32 bit pattern: the
    counts of inputs where they differ."""
    c = tmp_path / "every.c"
    c.write_text(EVERY_FLOAT32 % halves.c_helpers([T.FLOAT16, T.BFLOAT16]))
    exe = tmp_path / "every"
    flags = [f for f in cpu.flags() if f not in ("-shared", "-fPIC", "-fopenmp")]
    compile_ = [toolchain.c_compiler(), *flags, "-include", "stdlib.h", str(c), "-o", str(exe)]
    subprocess.run(compile_, check=True)
    return subprocess.run([str(exe), str(step)], capture_output=True, text=True, check=True).stdout


def test_cpu_roundings_on_float32_samples(tmp_path: Path) -> None:
    """Every 13th float32 bit pattern (every residue of the low bits, all exponents)."""
    assert _roundings_wrong(tmp_path, 13) == "0 0\n"


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.skipif(os.environ.get("TCPY_EXHAUSTIVE") != "1", reason="TCPY_EXHAUSTIVE=1 runs it")
def test_cpu_roundings_on_every_float32(tmp_path: Path) -> None:
    assert _roundings_wrong(tmp_path, 1) == "0 0\n"


# --- one rounding ---------------------------------------------------------------------

SUMS = """
def sums(bfloat16(N, K) X, bfloat16(N) Y0, int32(K) I) -> (S, P, Y, bfloat16(N) Z) {
    S(n) +=! X(n, k)
    P(n) = Y0(n)
    P(n) += X(n, k)
    Y(n) = S(n) * 1.0
    Z(I(k)) += X(0, k)
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_reductions_into_half_accumulate_in_float32(target: str) -> None:
    """1024 ones summed into bfloat16 give 1024: rounded at every step, the sum would
    stop at 256 (256 + 1 is no bfloat16). The same for `+=` onto a tensor's values and
    for a scatter-add, which start from the values already there."""
    n, k = 3, 1024
    x = np.ones((n, k), dtype=ml_dtypes.bfloat16)
    y0 = np.full(n, 8, dtype=ml_dtypes.bfloat16)
    index = np.zeros(k, dtype=np.int32)
    s, p, y, z = _engine(target, SUMS).sums(x, y0, index)
    assert s.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(s.astype(np.float32), 1024)
    np.testing.assert_array_equal(p.astype(np.float32), 1032)  # 1032 is a bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), 1024)
    np.testing.assert_array_equal(z.astype(np.float32), [1024, 0, 0])


def test_a_store_rounds_once() -> None:
    """`Y(i) = X(i) * 3.0 + 1.0` rounds the float32 value once: not after the product."""
    source = "def f(bfloat16(N) X) -> (Y) { Y(i) = X(i) * 3.0 + 1.0 }"
    x = np.arange(-512, 512, dtype=np.float32).astype(ml_dtypes.bfloat16) / 7
    x = x.astype(ml_dtypes.bfloat16)
    want = (x.astype(np.float32) * 3 + 1).astype(ml_dtypes.bfloat16)
    for target in TARGETS:
        got = _engine(target, source).f(x)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=target)


EXACT = """
def pick(bfloat16(N) X, bfloat16(N) Y) -> (M, R, A, S, Q, P, H) {
    M(i) = max(X(i), Y(i))
    R(i) = fmax(X(i), 0)
    A(i) = -fabs(X(i))
    S(i) = X(i) > Y(i) ? X(i) : Y(i)
    Q(i) = min(X(i), 0.5)
    P(i) max=! X(2 * i + k) where k in 0:2, i in 0:N/2
    H(i) = max(X(i), 0.1)
}
"""


def test_values_already_bfloat16_are_stored_as_they_are() -> None:
    """On `cpu` a value that is a bfloat16 by construction (a minimum, maximum, ReLU,
    negated magnitude or choice of bfloat16 reads, a literal bfloat16 holds, a max
    pool) is stored as its upper 16 bits, not rounded; `max(X(i), 0.1)` still rounds.
    Every bfloat16 bit pattern (NaNs, infinities, subnormals, signed zeros) gives what
    `reference` gives."""
    x = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    y = np.random.default_rng(3).permutation(x)
    compiled = _engine("cpu", EXACT).compile("pick", x, y)
    for name in "MRASQPH":
        stores = [s for s in compiled.source.splitlines() if s.strip().startswith(f"t_{name}[")]
        assert stores and all(("tc_exact_bfloat16(" in s) == (name != "H") for s in stores)
    got = _engine("cpu", EXACT).pick(x, y)
    want = _engine("reference", EXACT).pick(x, y)
    for name, g, w in zip("MRASQPH", got, want, strict=True):
        nan = np.isnan(w.astype(np.float32))
        np.testing.assert_array_equal(np.isnan(g.astype(np.float32)), nan, err_msg=name)
        np.testing.assert_array_equal(g.view(np.uint16)[~nan], w.view(np.uint16)[~nan], name)


# --- the corpus in half precision -----------------------------------------------------

BEYOND_RANGE = {("causal_mask", T.FLOAT16): "its mask value, -1e9, is beyond float16's 65504"}
"""Corpus programs that cannot run in a half type, with the reason."""


def halved(case: Case, ty: T) -> tuple[str, list, list]:
    """A corpus case retyped to half type `ty` (`tcpy.parser.parse.retyped`, the helper
    the gradient checks use for float64): its source, its inputs with every float
    rounded to `ty`, and the same rounded values in the inputs' own float types, for
    the case's float64 NumPy computation."""
    inputs = make_inputs(case, case.sizes)
    rounded, same = [], []
    for x in inputs:
        if np.asarray(x).dtype.kind != "f":
            rounded.append(x)
            same.append(x)
            continue
        r = np.asarray(x).astype(ty.dtype)
        rounded.append(r if np.ndim(x) else r[()])
        same.append(
            np.asarray(r.astype(np.asarray(x).dtype))
            if np.ndim(x)
            else r.astype(np.asarray(x).dtype)[()]
        )
    return retyped((CORPUS / case.file).read_text(), ty), rounded, same


def tolerance(source: str, entry: str, ty: T) -> float:
    """The largest error allowed, relative to the output's largest magnitude: one unit
    roundoff of `ty` for the final rounding and one for each statement that stores a
    half value on the way (a temporary, or the output written again), and 1e-5 for the
    float32 arithmetic and accumulation."""
    cdef = check_source(source)[entry]
    stores = sum(1 for st in cdef.statements if cdef.tensor(st.tensor).scalar.is_half)
    return UNIT[ty] * (1 + stores) + 1e-5


def _half_cases() -> list:
    params = []
    for case in CASES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cdef = check_source((CORPUS / case.file).read_text())[case.entry]
        if not any(t.scalar.is_float for t in cdef.tensors):
            continue  # nothing to retype
        for ty in HALVES:
            marks = []
            if (case.name, ty) in BEYOND_RANGE:
                marks = [pytest.mark.skip(reason=BEYOND_RANGE[(case.name, ty)])]
            params.append(pytest.param(case, ty, id=f"{case.name}-{ty.value}", marks=marks))
    return params


HALF_CASES = _half_cases()


def check_half_case(case: Case, ty: T, target: str) -> None:
    source, rounded, same = halved(case, ty)
    want = case.expected(*same)
    got = as_tuple(_engine(target, source).run(case.entry, *rounded))
    tol = tolerance(source, case.entry, ty)
    declared = [t.scalar for t in check_source(source)[case.entry].outputs]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{case.name} output {k}"
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=f"{case.name} output {k}")
            continue
        assert g.dtype == declared[k].dtype, f"{case.name} output {k} is {g.dtype}"
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        np.testing.assert_array_equal(g64[~finite], w64[~finite])
        scale = max(float(np.max(np.abs(w64[finite]), initial=0.0)), np.finfo(np.float32).tiny)
        error = float(np.max(np.abs(g64[finite] - w64[finite]), initial=0.0)) / scale
        assert error <= tol, f"{case.name} output {k}: error {error:.3g} of the largest > {tol:.3g}"


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize(("case", "ty"), HALF_CASES)
@pytest.mark.parametrize("target", TARGETS)
def test_corpus_in_half_precision(case: Case, ty: T, target: str) -> None:
    check_half_case(case, ty, target)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize(("case", "ty"), HALF_CASES)
def test_corpus_in_half_precision_on_the_gpu(case: Case, ty: T) -> None:
    check_half_case(case, ty, "cuda")


# --- arrays -----------------------------------------------------------------------------


def test_half_arrays_must_match_the_declared_type() -> None:
    engine = _engine("cpu", "def f(bfloat16(N) X) -> (Y) { Y(i) = X(i) * 0.5 }")
    with pytest.raises(tcpy.TCInputError, match=r"must be bfloat16.*ml_dtypes\.bfloat16"):
        engine.f(np.ones(3, np.float32))
    with pytest.raises(tcpy.TCInputError, match="must be bfloat16, but the array is float16"):
        engine.f(np.ones(3, np.float16))
    engine = _engine("cpu", "def g(float(N) X) -> (Y) { Y(i) = X(i) * 0.5 }")
    with pytest.raises(tcpy.TCInputError, match="must be float32"):
        engine.g(np.ones(3, ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pytorch_half_tensors_in_and_out(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    source = f"def f({dtype}(N, D) X) -> (Y) {{ Y(n, d) = X(n, d) * 2.0 + 1.0 }}"
    engine = _engine("cpu", source)
    x = torch.randn(5, 7).to(getattr(torch, dtype))
    y = engine.f(x)
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype
    torch.testing.assert_close(y, (x.float() * 2 + 1).to(x.dtype), rtol=0, atol=0)
    again = engine.f(x)  # the repeated call's path
    assert again.dtype == x.dtype and torch.equal(again, y)
    with pytest.raises(tcpy.TCInputError, match=f"x.to\\(torch.{dtype}\\)"):
        engine.f(x.float())


NVRTC_PROGRAMS = ("softmax", "matmul", "layernorm", "conv2d", "embedding_backward", "argmax")


@pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (the cuda extra)")
@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize("name", NVRTC_PROGRAMS)
@pytest.mark.parametrize("ty", HALVES, ids=lambda t: t.value)
def test_half_programs_compile_with_nvrtc(name: str, ty: T) -> None:
    """The half types' CUDA (PTX conversions from sm_80, integer ones before) compiles
    for the GPUs of both kinds, each mapped for its own (sm_80's instructions, the
    tensor cores' and `cp.async`, only on the later)."""
    case = next(c for c in CASES if c.name == name)
    source = retyped((CORPUS / case.file).read_text(), ty)
    cdef = check_source(source)[case.entry]
    turing = dataclasses.replace(named("l4"), arch="sm_75")
    for arch, device in (("sm_75", turing), ("sm_90", named("h100"))):
        lowered = lower_to_cuda(cdef, case.sizes, cuda_defaults(cdef), device=device)
        assert "__half" in lowered.source or "__nv_bfloat16" in lowered.source
        assert nvrtc.compile_cubin(lowered.source, arch)[:4] == b"\x7fELF"


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize("ty", HALVES, ids=lambda t: t.value)
def test_half_inputs_read_through_the_readonly_cache(ty: T) -> None:
    """`use_readonly_cache` loads a half element with `__ldg` of its bits, since CUDA's
    own `__ldg` takes built-in types only (found on an H100: NVRTC refused the kernel).
    The emulator's `__ldg` takes what CUDA's takes, so it would have refused it too:
    here it runs the kernel, checked against the reference, and NVRTC compiles it."""
    case = next(c for c in CASES if c.name == "layernorm")
    source, rounded, _ = halved(case, ty)
    cdef = check_source(source)[case.entry]
    options = cuda_defaults(cdef).replace(use_readonly_cache=True)
    engine = _engine("cuda-emu", source)
    got = as_tuple(engine.compile(case.entry, *rounded, options=options)(*rounded))
    want = as_tuple(_engine("reference", source).run(case.entry, *rounded))
    tol = tolerance(source, case.entry, ty)  # float32 sums in another order
    for g, w in zip(got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.max(np.abs(g64 - w64)) <= tol * np.max(np.abs(w64))
    if nvrtc.available():
        lowered = lower_to_cuda(cdef, case.sizes, options, device=named("h100"))
        assert "TC_LDG" in lowered.source
        assert nvrtc.compile_cubin(lowered.source, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize("ty", HALVES, ids=lambda t: t.value)
@pytest.mark.parametrize("k", [256, 250, 255], ids=["pairs", "pairs-partial", "elements"])
def test_half_tiles_go_through_the_ring_of_async_copies(ty: T, k: int) -> None:
    """A half matmul on the CUDA cores (`use_tensor_cores` off: the tensor cores' tiles
    are laid out apart, `tests/test_tensor_cores.py`) copies its operand tiles into
    shared memory, rows of 66 halves (32 words and one, so that rows stay on 4 bytes),
    through a ring filled by `cp.async` of pairs (4 bytes, the least a copy takes)
    where the rows hold whole pairs that start on one at run time, else by a load and
    a store of each element (K odd). Checked against the reference, under the
    emulator's checks."""
    case = next(c for c in CASES if c.name == "matmul")
    source = retyped((CORPUS / case.file).read_text(), ty)
    rng = np.random.default_rng(k)
    a = rng.standard_normal((128, k)).astype(np.float32).astype(ty.dtype)
    b = rng.standard_normal((k, 96)).astype(np.float32).astype(ty.dtype)
    cuda_cores = MappingOptions.cuda().replace(use_tensor_cores=False)
    kernel = _engine("cuda-emu", source).compile(case.entry, a, b, options=cuda_cores)
    assert "tc_fill" in kernel.source and f"{CUDA.ctype(ty)} tc_shared0[" in kernel.source
    assert (
        "TC_CP_ASYNC(tc_shared0, tc_s * 2112 + ((int)(tc_i0) * 66 + (tc_i1)), t_A," in kernel.source
    )
    got = np.asarray(kernel(a, b), np.float64)
    want = np.asarray(_engine("reference", source).run(case.entry, a, b), np.float64)
    tol = tolerance(source, case.entry, ty)
    assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))


def test_the_fuzzers_comparison_takes_half_nans_as_equal() -> None:
    """bfloat16's dtype is of kind "V": NaN where NaN is still equal, a value is not."""
    from tcpy.fuzz_tasks import same_outputs

    for dtype in (np.float16, ml_dtypes.bfloat16):
        a = np.array([np.nan, 1.0, -2.0], dtype=dtype)
        assert same_outputs(a, a.copy()) is None
        b = a.copy()
        b[1] = 3.0
        assert same_outputs(b, a) is not None


# --- gradients of half inputs ---------------------------------------------------------

GRADIENT_PROGRAMS = ("softmax", "layernorm", "matmul", "conv2d")


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize("target", ["reference", "cpu", "cuda-emu"])
@pytest.mark.parametrize("ty", HALVES, ids=lambda t: t.value)
@pytest.mark.parametrize("name", GRADIENT_PROGRAMS)
def test_gradients_of_half_inputs(name: str, ty: T, target: str) -> None:
    """The backward derived from a half def (`tcpy.gradient`) is itself a half def:
    run on `target` it gives the gradients the float64 backward gives on the same
    (rounded) arguments, within the half tolerance of its own statements. The float64
    backward is checked against finite differences by the gradient tests."""
    from gradients import backward

    case = next(c for c in CASES if c.name == name)
    source = (CORPUS / case.file).read_text()
    _, rounded, _ = halved(case, ty)
    half = backward(retyped(source, ty), case.entry, rounded)
    wide = backward(retyped(source, T.FLOAT64), case.entry, [_wide(a) for a in rounded])
    args64 = [_wide(a) for a in half.args]
    want = as_tuple(_engine("reference", wide.text).run(wide.name, *args64))
    got = as_tuple(_engine(target, half.text).run(half.name, *half.args))
    tol = tolerance(half.text, half.name, ty)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == ty.dtype
        g64 = g.astype(np.float64)
        error = float(np.max(np.abs(g64 - w))) / float(np.max(np.abs(w)))
        assert error <= tol, f"{name} gradient {k}: error {error:.3g} of the largest > {tol:.3g}"


def _wide(a: object) -> object:
    """A half (or float) array as float64; other arrays as they are."""
    ty = T.from_dtype(np.asarray(a).dtype)
    return np.asarray(a).astype(np.float64) if ty is not None and ty.is_float else a


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pytorch_operators_train_in_half_precision(dtype: str) -> None:
    """A `tcpy.torch` operator of a half def takes and gives half tensors, and its
    gradients match PyTorch's float64 layer norm on the same rounded values within the
    tolerance of the backward's own half statements."""
    torch = pytest.importorskip("torch")
    import tcpy.torch as tt

    source = retyped((CORPUS / "layernorm.tc").read_text(), T.from_name(dtype))
    ops = tt.define(source)
    half = getattr(torch, dtype)
    rng = np.random.default_rng(3)
    x, g, b = (torch.tensor(rng.standard_normal(s)).to(half) for s in ((6, 48), (48,), (48,)))
    eps = torch.tensor(1e-5).to(half)
    leaves = [t.clone().requires_grad_() for t in (x, g, b)]
    y = ops.layernorm(*leaves, eps)
    assert y.dtype == half
    seed = torch.tensor(rng.uniform(-1, 1, (6, 48))).to(half)
    y.backward(seed)
    wide = [t.double().requires_grad_() for t in (x, g, b)]
    want = torch.nn.functional.layer_norm(wide[0], (48,), wide[1], wide[2], float(eps.double()))
    want.backward(seed.double())
    tol = tolerance(tcpy.gradient(source, "layernorm"), "layernorm_grad", T.from_name(dtype))
    for leaf, w in zip(leaves, wide, strict=True):
        assert leaf.grad is not None and leaf.grad.dtype == half
        error = float((leaf.grad.double() - w.grad).abs().max() / w.grad.abs().max())
        assert error <= tol, error


def test_the_tuner_tunes_a_half_def() -> None:
    """Candidates of a bfloat16 def are checked against the reference's bfloat16 outputs
    (within two units in the last place: sums added in another order round apart) and
    timed; the problem file keeps bfloat16 arrays as their bits."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def mm(bfloat16(M,K) A, bfloat16(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    rng = np.random.default_rng(5)
    a = rng.uniform(-1, 1, (40, 36)).astype(ml_dtypes.bfloat16)
    b = rng.uniform(-1, 1, (36, 24)).astype(ml_dtypes.bfloat16)
    result = engine.tune("mm", a, b, config=tcpy.TunerConfig(generations=1, population=4))
    assert result.trials >= 1 and not result.failures, result.failures
    assert result.inputs == [[[40, 36], "bfloat16"], [[36, 24], "bfloat16"]]
