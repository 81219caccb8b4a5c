"""Regressions found by differential fuzzing: each program, with the sizes and the
options that exposed it, against the `reference` target on `cpu` and `cuda-emu`.

Options are spelled out field by field (never left to a target's defaults), so that
later changes to how partial options are resolved cannot change what a test tests.
"""

from __future__ import annotations

import warnings

import islpy as isl
import numpy as np
import pytest

import tcpy
from tcpy.errors import InternalError
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.poly.dependences import compute_dependences
from tcpy.poly.scop import build_scop
from tcpy.poly.transforms import verify

COMPILED = ("cpu", "cuda-emu")


def options(**fields: object) -> MappingOptions:
    """MappingOptions with the scheduling fields written out; `fields` overrides."""
    base: dict[str, object] = {
        "outer_schedule_fusion": Fusion.PRESERVE3_COINCIDENT,
        "intra_tile_schedule_fusion": Fusion.PRESERVE3_COINCIDENT,
        "allow_skewing": False,
        "positive_orthant": True,
        "fix_parameters_before_scheduling": False,
        "tile": (),
        "unroll": 1,
        "interchange": (),
        "parallel": True,
        "vectorize": True,
    }
    base.update(fields)
    return MappingOptions(**base)  # type: ignore[arg-type]


def run_both(
    source: str, entry: str, inputs: tuple[np.ndarray, ...], target: str, opts: MappingOptions
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The outputs of `entry` on `target` with `opts`, and on `reference`."""
    got_engine, want_engine = tcpy.ExecutionEngine(target), tcpy.ExecutionEngine("reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        got_engine.define(source)
        want_engine.define(source)
    got = got_engine.run(entry, *inputs, options=opts)
    want = want_engine.run(entry, *inputs)
    as_tuple = lambda x: x if isinstance(x, tuple) else (x,)  # noqa: E731
    return as_tuple(got), as_tuple(want)


def assert_same(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # NaN positions must agree too


# --- 1. statement order under intra-tile Min fusion ------------------------------------

ORDER = """
def f(float(N) A) -> (O) {
    O(i) +=! A(k) where i in 0:N
    O(i) += A(t) where t in 0:1
}
"""


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("fixed", [True, False])
def test_intra_tile_min_fusion_keeps_statement_order(target: str, fixed: bool) -> None:
    a = np.arange(1, 17, dtype=np.float32)
    opts = options(intra_tile_schedule_fusion=Fusion.MIN, fix_parameters_before_scheduling=fixed)
    got, want = run_both(ORDER, "f", (a,), target, opts)
    assert want[0][0] == a.sum() + a[0]
    assert_same(got, want)


def test_verify_treats_set_children_as_unordered() -> None:
    """A `set` node promises no order among its children: a dependence between two of
    them must fail verification, though `Schedule.get_map()` orders them."""
    (cdef,) = check_source(ORDER).values()
    scop = build_scop(cdef, {"N": 4})
    deps = compute_dependences(scop)
    children = isl.UnionSetList.alloc(scop.ctx, 3)
    for name in ("I0", "S0", "S1"):  # a reduction's own updates are unordered
        children = children.add(isl.UnionSet.from_set(scop.statement(name).domain))
    root = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    as_sequence = root.insert_sequence(children).get_schedule()
    verify(as_sequence, deps.validity, scop.domain)  # source order: valid
    as_set = root.insert_set(children).get_schedule()
    with pytest.raises(InternalError, match="violates dependences"):
        verify(as_set, deps.validity, scop.domain)


# --- 3. NaN in min and max -------------------------------------------------------------

EXTREMA = """
def f(float(M,N) A) -> (O, P, Q, R) {
    O(i) max=! A(i,j)
    P(i) min=! A(i,j)
    Q(i,j) = max(A(i,j), 0.0)
    R(i,j) = min(0.0, A(i,j))
}
"""


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("vectorize", [True, False])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_min_and_max_propagate_nan(target: str, vectorize: bool, n: int) -> None:
    """NaN anywhere in a row (first, middle, last lane) makes its min and max NaN, on
    every target; a row of -inf has the maximum -inf, a row of +inf the minimum +inf."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((6, n)).astype(np.float32)
    a[0, 0] = np.nan
    a[1, n // 2] = np.nan
    a[2, n - 1] = np.nan
    a[3] = -np.inf
    a[4] = np.inf
    got, want = run_both(EXTREMA, "f", (a,), target, options(vectorize=vectorize))
    assert np.isnan(want[0][:3]).all() and want[0][3] == -np.inf
    assert want[1][4] == np.inf
    assert_same(got, want)


# --- 2 and 4. user names never reach isl, C or CUDA as written -------------------------

HOSTILE = (
    "and", "and_", "nan", "NAN", "Nan", "INFINITY", "Infinity", "ceild", "floord",
    "infty", "S0", "I0", "c0", "b0", "t0", "tc_status", "tc_acc", "int", "float2",
    "threadIdx", "restrict", "_o0", "e_A_0", "s_N", "t_A",
)  # fmt: skip


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("start", range(0, len(HOSTILE), 3))
def test_any_identifier_is_an_index_size_or_tensor(target: str, start: int) -> None:
    """Names that are isl keywords, C or CUDA keywords, or names the generated code
    uses itself, as indices, sizes and tensors: each computes what reference does."""
    names = [HOSTILE[(start + k) % len(HOSTILE)] for k in range(8)]
    i, j, m, n, x, y, out, total = names
    source = f"""
    def f(float({m}, {n}) {x}, float {y}) -> ({out}, {total}) {{
        {out}({i}, {j}) = {x}({i}, {j}) * {y}
        {total}({j}) +=! {x}({i}, {j}) where {j} in 0:{n}
    }}
    """
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got, want = run_both(source, "f", (a, np.float32(2.0)), target, options())
    assert_same(got, want)
    np.testing.assert_array_equal(want[0], a * 2)
    np.testing.assert_array_equal(want[1], a.sum(axis=0))


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("name", ["tc_status", "my_tc_status", "tc_sizes", "tc_buffers"])
def test_a_scalar_input_named_like_the_launcher_arguments(target: str, name: str) -> None:
    source = f"""
    def f(float(N) A, float {name}, int32(N) {name}_t) -> (O) {{
        O(i) = A(i) * {name} + float({name}_t(i))
    }}
    """
    a = np.arange(5, dtype=np.float32)
    t = np.arange(5, dtype=np.int32) * 10
    got, want = run_both(source, "f", (a, np.float32(3.0), t), target, options())
    assert_same(got, want)
    np.testing.assert_array_equal(want[0], a * 3 + t)
