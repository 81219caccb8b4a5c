"""Jammed reductions (`tcpy.mapping.cpu.registers.jam`, printed by `tcpy.codegen.jam`):
a vector loop of outputs, each reduced in a register over a few steps of the
reduction inside it. Which nests are jammed, what is printed, results against the
`reference` target (steps and columns that do and do not divide, NaN and infinities,
every reduction kind, size-generic kernels), and bit for bit the unjammed nest's."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tcpy
from tcpy.mapping import marks
from tcpy.mapping.cpu.strategy import cpu_defaults, map_to_cpu
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.poly.analysis import analyse

from differential import engines

JAMMED = {
    "transposed_matvec": "def f(float(M,N) A, float(M) t) -> (y) { y(n) +=! A(m,n) * t(m) }",
    "column_sum": "def f(float(M,N) A) -> (y) { y(n) +=! A(m,n) }",
    "column_max": "def f(float(M,N) A) -> (y) { y(n) max=! A(m,n) }",
    "column_min": "def f(float(M,N) A) -> (y) { y(n) min=! A(m,n) }",
    "column_product": "def f(float(M,N) A) -> (y) { y(n) *=! A(m,n) }",
    "column_sum_int": "def f(int32(M,N) A) -> (y) { y(n) +=! A(m,n) }",
    "batched": "def f(float(B,M,N) A, float(M) w) -> (y) { y(b,n) +=! A(b,m,n) * w(m) }",
    "two_reductions": "def f(float(B,M,N) A, float(M) w) -> (y) { y(n) +=! A(b,m,n) * w(m) }",
    "scaled": """def f(float(M,N) A, float(M) t, float alpha) -> (y) {
        y(n) +=! alpha * A(m,n) * t(m) * t(m)
    }""",
    "window": "def f(float(C,W) I, float(C,K) Wt) -> (O) { O(c,w) +=! I(c,w+k) * Wt(c,k) }",
}
GENERIC = MappingOptions.cpu().replace(fix_parameters_before_scheduling=False)
SIZES = [
    {"M": 37, "N": 53, "B": 3, "C": 5, "W": 40, "K": 3},
    {"M": 8, "N": 16, "B": 2, "C": 2, "W": 19, "K": 2},
    {"M": 2, "N": 1, "B": 1, "C": 1, "W": 4, "K": 1},
    {"M": 130, "N": 300, "B": 2, "C": 3, "W": 70, "K": 5},
]


def _inputs(engine: tcpy.ExecutionEngine, sizes: dict[str, int], seed: int) -> list[object]:
    rng = np.random.default_rng(seed)
    out: list[object] = []
    for t in engine.checked("f").inputs:
        shape = [d.evaluate(sizes) for d in t.shape]
        if t.scalar.is_float:
            out.append(rng.uniform(0.5, 1.5, shape).astype(t.scalar.dtype))
        else:
            out.append(rng.integers(-3, 4, shape).astype(t.scalar.dtype))
    return out


def _source(source: str, sizes: dict[str, int], **options: object) -> str:
    cpu, _ = engines("cpu", source, quiet=True)
    chosen = MappingOptions.cpu().replace(**options)
    return cpu.compile("f", *_inputs(cpu, sizes, 0), options=chosen).source


def _jam_marks(source: str, sizes: dict[str, int]) -> list[marks.Mark]:
    cdef = check_source(source)["f"]
    options = cpu_defaults(cdef)
    analysis = analyse(cdef, {k: v for k, v in sizes.items() if k in cdef.size_symbols}, options)
    mapped = map_to_cpu(analysis.schedule, analysis.scop, analysis.deps, analysis.options)
    found: list[marks.Mark] = []

    def visit(node: object) -> bool:
        mark = marks.of(node)  # type: ignore[arg-type]
        if isinstance(mark, marks.Jam):
            found.append(mark)
        return True

    mapped.get_root().foreach_descendant_top_down(visit)
    return found


@pytest.mark.parametrize("name", sorted(JAMMED))
def test_jammed_reductions_compute_the_reference(name: str) -> None:
    source = JAMMED[name]
    cpu, reference = engines("cpu", source, quiet=True)
    for seed, sizes in enumerate(SIZES):
        inputs = _inputs(cpu, sizes, seed)
        want = reference.f(*inputs)
        for got in (cpu.f(*inputs), cpu.f(*inputs, options=GENERIC)):
            if np.asarray(want).dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=f"{sizes}")
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"{sizes}")


@pytest.mark.parametrize("name", ["column_max", "column_min", "column_sum", "column_product"])
def test_jammed_reductions_keep_nan_and_infinities(name: str) -> None:
    cpu, reference = engines("cpu", JAMMED[name], quiet=True)
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.5, (41, 35)).astype(np.float32)
    a[5, 3] = np.nan
    a[:, 7] = np.inf
    a[17, 9] = -np.inf
    a[40, 34] = np.nan
    np.testing.assert_allclose(cpu.f(a), reference.f(a), rtol=2e-5)


@pytest.mark.parametrize("name", ["transposed_matvec", "scaled", "batched", "two_reductions"])
def test_jamming_leaves_every_bit_of_the_result(name: str) -> None:
    """Each output takes the reduction's steps in their order, jammed or not: the
    results are equal bit for bit to the nest mapped without register blocks."""
    source = JAMMED[name]
    cpu, _ = engines("cpu", source, quiet=True)
    unjammed = MappingOptions.cpu().replace(register_tile=(0,))
    for seed, sizes in enumerate(SIZES):
        inputs = _inputs(cpu, sizes, seed)
        jammed = cpu.compile("f", *inputs)
        assert "tc_acc" in jammed.source or sizes["M"] < 4
        plain = cpu.compile("f", *inputs, options=unjammed)
        np.testing.assert_array_equal(jammed(*inputs), plain(*inputs), err_msg=f"{sizes}")


def test_the_vector_loop_reduces_each_output_in_a_register() -> None:
    """`y(n) +=! A(m,n) * t(m)`: under `#pragma omp simd`, each output loaded once into
    `tc_acc`, four steps of m unrolled into it, stored once; the four values of t the
    steps read loaded into a local array before the vector loop."""
    sizes = {"M": 64, "N": 300}
    lines = [ln.strip() for ln in _source(JAMMED["transposed_matvec"], sizes).splitlines()]
    (load,) = [k for k, ln in enumerate(lines) if ln.startswith("float tc_acc = t_y[")]
    assert lines[load - 2] == "#pragma omp simd" and lines[load - 1].startswith("for (")
    assert lines[load + 1] == "#pragma GCC unroll 4"
    step = re.match(r"for \(int64_t (c\d+) = 0; \1 <= 3; \1\+\+\) \{", lines[load + 2])
    assert step is not None, lines[load + 2]
    update = lines[load + 3]
    local = re.search(r"\* (tc_h\d+)\[" + step.group(1) + r"\]\)", update)
    assert update.startswith("tc_acc = tc_acc + (t_A[") and local is not None, update
    assert lines[load + 5].startswith("t_y[") and lines[load + 5].endswith("= tc_acc;")
    assert f"float {local.group(1)}[4];" in lines[:load]
    fill = [ln for ln in lines[:load] if ln.startswith(f"{local.group(1)}[")]
    assert fill and "= t_t[" in fill[0], fill


def test_a_partial_tile_of_steps_takes_a_path_of_its_own() -> None:
    """37 rows in steps of 4: the whole tiles run the steps under constant bounds (the
    compiler unrolls them), the last one under isl's bounds."""
    lines = [
        ln.strip()
        for ln in _source(JAMMED["column_sum"], {"M": 37, "N": 64}, tile=(64, 37)).splitlines()
    ]
    loads = [k for k, ln in enumerate(lines) if ln.startswith("float tc_acc = t_y[")]
    assert len(loads) == 2
    assert re.match(r"for \(int64_t (c\d+) = 0; \1 <= 3; \1\+\+\) \{", lines[loads[0] + 2])
    assert "tc_min(3, " in lines[loads[1] + 2], lines[loads[1] + 2]
    assert "} else {" in lines[loads[0] : loads[1]]


@pytest.mark.parametrize(
    ("source", "jammed"),
    [
        (JAMMED["transposed_matvec"], True),
        (JAMMED["column_sum"], True),
        # the reduction is the vector loop: lanes of partial sums, not a jam
        ("def f(float(M,N) A, float(N) x) -> (y) { y(m) +=! A(m,n) * x(n) }", False),
        # rows share B: a register block
        ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", False),
        # no reduction
        ("def f(float(M,N) A) -> (y) { y(m,n) = A(m,n) * 2 }", False),
        # two reductions of the columns fused (`fuse_rows`): the columns loop outside,
        # each statement's reduction alone in its innermost band
        ("def f(float(M,N) A) -> (y) { y(n) +=! A(m,n) \n z(n) +=! y(n) * A(m,n) }", False),
    ],
)
def test_which_nests_are_jammed(source: str, jammed: bool) -> None:
    found = _jam_marks(source, {"M": 64, "N": 128, "K": 32})
    assert bool(found) == jammed, found
    assert all(m == marks.Jam(4) for m in found)


def test_a_short_reduction_is_jammed_whole() -> None:
    """A window of 3 along the reduction: its three steps in one jam."""
    found = _jam_marks(JAMMED["window"], {"C": 8, "W": 64, "K": 3})
    assert found == [marks.Jam(3)]


BAG = "def f(float(E,N) T, int32(B,L) I) -> (y) { y(b,n) +=! T(I(b,l), n) }"
WEIGHTED_BAG = "def f(float(E,N) T, int32(B,L) I) -> (y) { y(b,n) +=! T(I(b,l), n) * I(b,l) }"


def _bag(sizes: tuple[int, int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    e, n, b, length = sizes
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((e, n)).astype(np.float32)
    return table, rng.integers(0, e, (b, length)).astype(np.int32)


def test_a_gathers_index_is_checked_as_it_is_loaded() -> None:
    """An embedding bag, `y(b,n) +=! T(I(b,l), n)`, jammed: each index is checked
    against T's rows as it is loaded into the local array before the vector loop, and
    the loop reads T's rows at the checked indices as they are (checked inside the
    loop, GCC did not vectorise it: 3.7x slower at 10000 x 64, 256 bags of 50)."""
    cpu, _ = engines("cpu", BAG, quiet=True)
    text = cpu.compile("f", *_bag((100, 64, 8, 10), 0)).source
    lines = [ln.strip() for ln in text.splitlines()]
    fills = [ln for ln in lines if re.match(r"tc_h\d+\[c\d+\] = tc_index\(t_I\[", ln)]
    assert fills, text
    local = fills[0].split("[")[0]
    assert f"int64_t {local}[4];" in lines
    updates = [ln for ln in lines if ln.startswith("tc_acc = tc_acc + t_T[")]
    assert updates and all("tc_index" not in u and f"{local}[" in u for u in updates), updates


@pytest.mark.parametrize("sizes", [(100, 64, 8, 10), (7, 5, 3, 3), (50, 33, 4, 1), (9, 130, 2, 4)])
def test_embedding_bags_compute_the_reference(sizes: tuple[int, int, int, int]) -> None:
    """Bags of whole and partial tiles of steps, fixed-size and size-generic, with an
    index also used as a value (which keeps its own type: no checked local for it)."""
    for source in (BAG, WEIGHTED_BAG):
        cpu, reference = engines("cpu", source, quiet=True)
        inputs = _bag(sizes, sum(sizes))
        want = reference.f(*inputs)
        for options in (MappingOptions.cpu(), GENERIC):
            got = cpu.f(*inputs, options=options)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5 * np.abs(want).max())
    text = cpu.compile("f", *inputs).source
    assert "int64_t tc_h" not in text


@pytest.mark.parametrize(
    ("b", "step", "bad"), [(0, 0, 100), (7, 9, -1), (3, 8, 100), (5, 4, 1 << 20)]
)
def test_a_gathered_index_out_of_range_is_reported_where_it_is(b: int, step: int, bad: int) -> None:
    """An index out of T's rows, in a whole tile of steps or in the last partial one
    (10 steps: 4, 4, 2), is an input error naming the element and the bag."""
    cpu, _ = engines("cpu", BAG, quiet=True)
    table, index = _bag((100, 64, 8, 10), 1)
    index[b, step] = bad
    with pytest.raises(
        tcpy.TCInputError, match=rf"index {bad} of its dimension 0.* b={b}, .*l={step}"
    ):
        cpu.f(table, index)
