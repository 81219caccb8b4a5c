"""Size expressions: canonical forms, floor division, extrema, evaluation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tcpy.parser.symbolic import Sym, provably_le, sym_max, sym_min

N, M = Sym.of("N"), Sym.of("M")


def test_canonical_sum() -> None:
    assert N + M - 3 == (M - 1) + (N - 2)
    assert Sym() == (N - N)
    assert str(N - Sym.of("KH") + 1) == "N - KH + 1"


def test_floordiv_splits_the_divisible_part() -> None:
    assert (N * 4 + 8).floordiv(4) == N + 2
    assert (N * 2 - 2).floordiv(2) + 1 == N
    assert str((N + 2).floordiv(3)) == "floor((N + 2)/3)"


def test_extrema_drop_dominated_arguments() -> None:
    assert sym_min([N, N - 1, N + 3]) == N - 1
    assert sym_max([N, N - 1]) == N
    assert sym_min([N, M]) == sym_min([M, N])
    assert sym_min([sym_min([N, M]), N - 2]) == sym_min([M, N - 2])


def test_provably_le() -> None:
    assert provably_le(N - 1, N) is True
    assert provably_le(N, N - 1) is False
    assert provably_le(N, M) is None


@given(st.integers(1, 1000), st.integers(1, 1000), st.integers(-50, 50), st.integers(1, 7))
def test_evaluation_matches_python(n: int, m: int, c: int, d: int) -> None:
    sizes = {"N": n, "M": m}
    e = (N * 3 - M + c).floordiv(d)
    assert e.evaluate(sizes) == (3 * n - m + c) // d
    assert e.ceildiv(2).evaluate(sizes) == -(-((3 * n - m + c) // d) // 2)
    assert sym_min([N, M + c]).evaluate(sizes) == min(n, m + c)
    assert sym_max([N * 2, M]).evaluate(sizes) == max(2 * n, m)
