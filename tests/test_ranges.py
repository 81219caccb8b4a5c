"""Range inference: the examples of docs/language.md with exact expected bounds, the
bounds proofs, and goldens of the inferred ranges of every corpus program."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from tcpy.errors import TCRangeError
from tcpy.parser import check_source
from tcpy.parser.printer import summary
from tcpy.parser.symbolic import Sym, sym_min

from differential import CORPUS
from golden_util import check_golden
from programs import CONV

N, H, W, KH, KW, P, Q, M = (Sym.of(s) for s in ("N", "H", "W", "KH", "KW", "P", "Q", "M"))
ZERO = Sym()


def _ranges(source: str) -> dict[str, tuple[Sym, Sym]]:
    (cdef,) = check_source(source).values()
    return {r.var: (r.lo, r.hi) for r in cdef.statements[-1].ranges}


def test_transpose_swaps_the_shape() -> None:
    (cdef,) = check_source("def t(float(P,Q) I) -> (O) { O(i, j) = I(j, i) }").values()
    assert cdef.outputs[0].shape == (Q, P)


def test_convolution_shrinks_by_the_kernel() -> None:
    r = _ranges(CONV)
    assert r["h"] == (ZERO, H - KH + 1)
    assert r["w"] == (ZERO, W - KW + 1)
    assert r["kh"] == (ZERO, KH)


def test_strided_pooling_floors() -> None:
    r = _ranges(
        "def p(float(N,C,H,W) I) -> (O) {"
        " O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2 }"
    )
    # h < (H - 2)/2 + 1 with floor division, which is floor(H/2)
    assert r["h"] == (ZERO, (H - 2).floordiv(2) + 1)
    assert r["h"][1] == H.floordiv(2)
    assert r["kh"] == (ZERO, Sym.of(2))


def test_stride_three() -> None:
    r = _ranges("def s(float(N) I) -> (O) { O(i) = I(3 * i) }")
    assert r["i"] == (ZERO, (N + 2).floordiv(3))


def test_where_fixes_the_range() -> None:
    (cdef,) = check_source(
        "def s(float(N) A) -> (O) { O(i) = A(i) + A(i+1) where i in 0:N-1 }"
    ).values()
    assert cdef.outputs[0].shape == (N - 1,)
    assert cdef.statements[0].checks == ()  # proved in bounds at definition time


def test_two_inputs_give_the_smaller_range() -> None:
    r = _ranges("def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) + B(i) }")
    assert r["i"] == (ZERO, sym_min([N, M]))


def test_solved_indices_are_replaced_by_their_whole_range() -> None:
    r = _ranges("def f(float(N) A, float(M) B) -> (O) { O(i) +=! A(i) * B(i + j) }")
    assert r["i"] == (ZERO, N)
    assert r["j"] == (ZERO, M - N + 1)


def test_gather_bounds_through_the_index_tensor() -> None:
    r = _ranges("def g(float(E, D) T, int32(B, L) I) -> (O) { O(b, d) +=! T(I(b, l), d) }")
    assert r == {"b": (ZERO, Sym.of("B")), "d": (ZERO, Sym.of("D")), "l": (ZERO, Sym.of("L"))}


def test_negative_coefficient() -> None:
    r = _ranges("def f(float(N) A) -> (O) { O(i) = A(N - 1 - i) }")
    assert r["i"] == (ZERO, N)


def test_constant_subscripts_need_no_range() -> None:
    (cdef,) = check_source("def f(float(N, 3) A) -> (O) { O(i) = A(i, 2) - A(i, 0) }").values()
    assert cdef.outputs[0].shape == (N,)


def test_exists_contributes_a_range() -> None:
    r = _ranges("def f(float(N) A) -> (O) { O(i) = 1 where exists A(i) }")
    assert r["i"] == (ZERO, N)


def test_later_statements_see_earlier_shapes() -> None:
    (cdef,) = check_source(
        "def f(float(N, M) A) -> (O) { T(i) +=! A(i, j)  O(k) = T(k) * 2 }"
    ).values()
    assert cdef.temporaries[0].shape == (N,)
    assert cdef.outputs[0].shape == (N,)


def test_declared_output_shape_bounds_the_write() -> None:
    r = _ranges("def f(float(N) A) -> (float(N) O) { O(i) = 3 }")
    assert r["i"] == (ZERO, N)


def test_strided_bounds_are_proved() -> None:
    (cdef,) = check_source("def s(float(N) I) -> (O) { O(i) = I(3 * i) }").values()
    assert cdef.statements[0].checks == ()


def test_unprovable_bounds_are_checked_at_call_time() -> None:
    (cdef,) = check_source(
        "def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) + B(i) where i in 0:N }"
    ).values()
    (check,) = cdef.statements[0].checks
    assert (check.tensor, check.dim, check.lo, check.hi, check.extent) == ("B", 0, ZERO, N - 1, M)


def test_guarded_reads_need_not_be_in_bounds() -> None:
    (cdef,) = check_source(
        "def f(float(N) A) -> (O) { O(i) = i > 0 ? A(i - 1) : 0.0 where i in 0:N }"
    ).values()
    assert cdef.outputs[0].shape == (N,)


def test_unguarded_out_of_bounds_is_an_error() -> None:
    with pytest.raises(TCRangeError, match="reaches index -1"):
        check_source("def f(float(N) A) -> (O) { O(i) = A(i - 1) where i in 0:N }")


def test_a_start_that_depends_on_the_sizes_is_checked_at_call_time() -> None:
    # TC's convolution gradient: h starts at KH - 1, which is 0 for a 1x1 filter.
    (cdef,) = check_source(
        "def g(float(M,C,KH,KW) W1, float(N,M,H,W) O_grad) -> (I_grad) {"
        " I_grad(n,c,h,w) +=! O_grad(n,m,h-kh,w-kw) * W1(m,c,kh,kw) }"
    ).values()
    st = cdef.statements[0]
    assert st.range_of("h").lo == KH - 1  # the polyhedral domain starts there
    assert [(s.tensor, s.dim, s.var, s.lo, s.hi) for s in st.starts] == [
        ("I_grad", 2, "h", KH - 1, H),
        ("I_grad", 3, "w", KW - 1, W),
    ]
    assert cdef.outputs[0].shape[2:] == (H, W)
    assert "start     I_grad dim 2: h from KH - 1, 0 at each call" in summary(cdef)


def test_a_start_reached_by_a_negative_coefficient() -> None:
    (cdef,) = check_source("def f(float(I) B) -> (A) { A(i) = B(10 - i) }").values()
    (start,) = cdef.statements[0].starts
    assert (start.lo, start.hi) == (11 - Sym.of("I"), Sym.of(11))
    assert cdef.outputs[0].shape == (Sym.of(11),)


def test_a_start_needs_no_check_when_the_shape_is_known() -> None:
    (cdef,) = check_source(
        "def f(float(N) A) -> (float(N) O) { O(i) = A(i - 1) where i in 1:N }"
    ).values()
    assert cdef.statements[0].starts == ()


@pytest.mark.parametrize(
    ("body", "start"),
    [
        ("O(i) = I(i - 1)", "1"),
        ("O(i) = I(i - N)", "N"),  # sizes are at least 1
        ("O(i) = I(i + 1) where i in -1:N-1", "-1"),
        ("O(i) = I(i - 1) + I(i - N)", "max(1, N)"),
    ],
)
def test_a_start_nonzero_for_every_size_is_refused_at_define(body: str, start: str) -> None:
    with pytest.raises(TCRangeError, match=rf"would start at index {re.escape(start)}, not 0"):
        check_source(f"def f(float(N) I) -> (O) {{ {body} }}")


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.tc")), ids=lambda p: p.stem)
def test_corpus_ranges_golden(path: Path, accept: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defs = check_source(path.read_text(), path.name)
    text = "\n\n".join(summary(d) for d in defs.values())
    check_golden(f"ranges/{path.stem}.txt", text, accept)
