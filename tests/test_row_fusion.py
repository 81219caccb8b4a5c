"""Row fusion on the CPU (`tcpy.mapping.rows`) and the passes that serve it: a
run of nests that a row reduction needs whole runs as one nest over blocks of rows,
its temporaries in a thread's buffers; a reduction sharing its row loop with other
statements gets a loop of its own (`split_row_reductions`); an operand read across
the vector loop is copied with as many innermost dimensions first as follow the
output's index (`W^T2`), per statement; isl schedules fixed sizes as numbers. Each
kernel is checked against the `reference` target, at sizes the blocks do not divide,
and the rules on programs that are not attention (log-sum-exp, cross-entropy, a
batched layer norm) and on programs they must leave alone."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tcpy.mapping.cpu.strategy import cpu_defaults
from tcpy.mapping.rows import ROWS
from tcpy.parser import check_source
from tcpy.pipeline import Lowered, lower_to_c
from tcpy.poly.analysis import analyse

from differential import engines

ATTENTION = """
def attention(float(T,B,H,S,E) QKV, float(B,S) M) -> (A) {
    Sc(b,h,i,j) +=! QKV(0,b,h,i,e) * QKV(1,b,h,j,e)
    Sc(b,h,i,j) = Sc(b,h,i,j) * 0.125 + M(b,j)
    mx(b,h,i) max=! Sc(b,h,i,j)
    P(b,h,i,j) = exp(Sc(b,h,i,j) - mx(b,h,i))
    sm(b,h,i) +=! P(b,h,i,j)
    A(b,h,i,e) +=! P(b,h,i,j) * QKV(2,b,h,j,e)
    A(b,h,i,e) = A(b,h,i,e) / sm(b,h,i)
}
"""
# the same attention written otherwise: statements in another valid order, other
# names, the heads dimension after the sequence's, the scale folded into the exponent
ATTENTION_REWRITTEN = """
def attention(float(T,B,S,H,E) X, float(B,S) Mask) -> (Out) {
    scores(b,q,h,k) +=! X(0,b,q,h,d) * X(1,b,k,h,d)
    top(b,q,h) max=! scores(b,q,h,k)
    w(b,q,h,k) = exp((scores(b,q,h,k) - top(b,q,h)) * 0.125 + Mask(b,k))
    total(b,q,h) +=! w(b,q,h,k)
    Out(b,q,h,d) +=! w(b,q,h,k) * X(2,b,k,h,d)
    Out(b,q,h,d) = Out(b,q,h,d) / total(b,q,h)
}
"""
LOG_SUM_EXP = """
def lse(float(B,N,C) X) -> (L) {
    m(b,n) max=! X(b,n,c)
    s(b,n) +=! exp(X(b,n,c) - m(b,n))
    L(b,n) = m(b,n) + log(s(b,n))
}
"""
CROSS_ENTROPY = """
def xent(float(B,N,C) X, int32(B,N) T) -> (L) {
    m(b,n) max=! X(b,n,c)
    E(b,n,c) = exp(X(b,n,c) - m(b,n))
    s(b,n) +=! E(b,n,c)
    L(b,n) = log(s(b,n)) + m(b,n) - X(b,n,T(b,n))
}
"""
LAYER_NORM = """
def ln(float(B,S,D) X, float(B,S,D) R, float(D) g, float(D) b) -> (L) {
    Y(n,s,d) = X(n,s,d) + R(n,s,d)
    mean(n,s) +=! Y(n,s,d) / D
    var(n,s) +=! (Y(n,s,d) - mean(n,s)) * (Y(n,s,d) - mean(n,s)) / D
    L(n,s,d) = (Y(n,s,d) - mean(n,s)) / sqrt(var(n,s) + 1e-5) * g(d) + b(d)
}
"""
# the output projection's weights are shared by every row: 2.4 MB, read again for
# every block of rows, so the contraction stays a matmul of its own; the layer norm
# after it is fused
PROJECTION_NORM = """
def out_ln(float(B,H,S,E) A, float(D,H,E) Wo, float(D) g) -> (L) {
    Y(b,s,n) +=! A(b,h,s,e) * Wo(n,h,e)
    mean(b,s) +=! Y(b,s,n) / D
    L(b,s,n) = (Y(b,s,n) - mean(b,s)) * g(n)
}
"""
# each row reads the next row's value: not independent rows
NEIGHBOURS = """
def f(float(N,C) X) -> (O) {
    m(n) max=! X(n,c)
    O(n,c) = X(n,c) - m(n + 1) where n in 0:N-1
}
"""


def _lowered(source: str, sizes: dict[str, int]) -> Lowered:
    """`source` lowered to C with the CPU's default options for it."""
    (cdef,) = check_source(source).values()
    return lower_to_c(cdef, sizes, cpu_defaults(cdef), check=True)


def _schedule(source: str, sizes: dict[str, int]) -> str:
    return str(_lowered(source, sizes).schedule.get_root().to_str())


def _inputs(source: str, sizes: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Random inputs for `source`'s parameters at `sizes` (int32 ones index below the
    last dimension, as a class label does)."""
    rng = np.random.default_rng(seed)
    header = source.split("->")[0]
    out = []
    for kind, dims in re.findall(r"(float|int32)\(([^)]*)\)", header):
        shape = [sizes[d.strip()] for d in dims.split(",")]
        if kind == "int32":
            out.append(rng.integers(0, sizes["C"], size=shape).astype(np.int32))
        else:
            out.append(rng.standard_normal(shape, dtype=np.float32))
    return out


def _check(source: str, entry: str, sizes: dict[str, int], seed: int = 0) -> None:
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(source, sizes, seed)
    got = cpu.run(entry, *inputs)
    want = reference.run(entry, *inputs)
    scale = max(1.0, float(np.max(np.abs(want))))  # sums of many products: their size
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _fused_rows(text: str) -> list[str]:
    """The temporaries of each row-fused nest's thread buffers (`scratch:` marks)."""
    return re.findall(r'mark: "scratch:([^"]*)"', text)


ATTENTION_SIZES = [
    {"T": 3, "B": 1, "H": 2, "S": 20, "E": 8},
    {"T": 3, "B": 2, "H": 3, "S": 37, "E": 9},  # rows the blocks do not divide
    {"T": 3, "B": 1, "H": 2, "S": 2 * ROWS + 5, "E": 16},
]


@pytest.mark.parametrize("sizes", ATTENTION_SIZES, ids=lambda s: f"S{s['S']}")
def test_attention_runs_each_block_of_rows_through_every_statement(sizes: dict[str, int]) -> None:
    """One nest: the scores, their maximum, exponentials and sum stay in the thread's
    buffers (the score matrix never reaches memory), the keys are copied transposed
    per block of rows, and the result is the reference's."""
    text = _schedule(ATTENTION, sizes)
    assert len(re.findall(r'mark: "omp_parallel@', text)) == 1
    (scratch,) = _fused_rows(text)
    assert set(scratch.split(",")) == {"Sc", "P", "mx", "sm"}
    assert 'mark: "pack:QKV^T"' in text
    _check(ATTENTION, "attention", sizes)


@pytest.mark.parametrize("sizes", ATTENTION_SIZES[:2], ids=lambda s: f"S{s['S']}")
def test_attention_written_otherwise_is_fused_the_same_way(sizes: dict[str, int]) -> None:
    """Other names, another order of the statements, the heads after the sequence:
    the rows (b, q, h) are found from the dependences, not from names or positions."""
    shaped = {"T": 3, "B": sizes["B"], "S": sizes["S"], "H": sizes["H"], "E": sizes["E"]}
    text = _schedule(ATTENTION_REWRITTEN, shaped)
    (scratch,) = _fused_rows(text)
    assert set(scratch.split(",")) == {"scores", "w", "top", "total"}
    _check(ATTENTION_REWRITTEN, "attention", shaped)


@pytest.mark.parametrize(
    ("source", "entry", "temporaries"),
    [
        (LOG_SUM_EXP, "lse", {"m", "s"}),
        (CROSS_ENTROPY, "xent", {"m", "E", "s"}),
        (LAYER_NORM, "ln", {"Y", "mean", "var"}),
    ],
    ids=["log-sum-exp", "cross-entropy", "layer-norm"],
)
def test_row_chains_that_are_not_attention_are_fused(
    source: str, entry: str, temporaries: set[str]
) -> None:
    sizes = {"B": 3, "N": 37, "S": 37, "C": 70, "D": 70}
    text = _schedule(source, sizes)
    (scratch,) = _fused_rows(text)
    assert set(scratch.split(",")) == temporaries
    _check(source, entry, sizes)


def test_a_contraction_whose_operand_every_row_shares_is_left_a_matmul() -> None:
    """The output projection keeps its own register-blocked nest (its weights of
    2.4 MB would be read again for every block of rows); the norm after it is one
    row nest; and the weights are copied with their last two dimensions first."""
    sizes = {"B": 1, "H": 12, "S": 40, "E": 64, "D": 768}
    text = _schedule(PROJECTION_NORM, sizes)
    assert "register_tile" in text
    assert re.search(r'mark: "pack:[^"]*\bWo\^T2\b', text)
    (scratch,) = _fused_rows(text)
    assert scratch == "mean"
    _check(PROJECTION_NORM, "out_ln", {"B": 2, "H": 3, "S": 37, "E": 20, "D": 50})


def test_rows_that_read_one_another_are_not_fused() -> None:
    sizes = {"N": 37, "C": 70}
    assert not _fused_rows(_schedule(NEIGHBOURS, sizes))
    _check(NEIGHBOURS, "f", sizes)


def test_a_matmul_alone_is_not_a_row_nest() -> None:
    source = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    text = _schedule(source, {"M": 64, "K": 64, "N": 64})
    assert not _fused_rows(text) and "register_tile" in text


# --- the passes around it ---------------------------------------------------------------


def test_a_row_reduction_gets_a_loop_of_its_own_and_vector_lanes(vector_width) -> None:  # type: ignore[no-untyped-def]
    """A layer norm fused per row by isl (`Max`): the sum's loop is split from the
    statement before it, so its partial sums live in vector lanes (`tc_lane`) instead
    of one chain of additions through memory."""
    vector_width("512")  # the vectors of 16 lanes it was written for
    source = LAYER_NORM.replace("(n,s,d)", "(s,d)").replace("(n,s)", "(s)")
    source = source.replace("float(B,S,D) X, float(B,S,D) R", "float(S,D) X, float(S,D) R")
    sizes = {"S": 37, "D": 300}
    code = _lowered(source, sizes).source
    assert code.count("tc_lane[64]") == 2  # the mean's loop and the variance's
    _check(source, "ln", sizes)


def test_a_row_loop_beside_a_value_at_one_of_its_points_is_vectorised() -> None:
    """A cross-entropy's backward: `d_s(b)` runs at one point of the row loop of
    `d_X(b, k) = d_s(b) * exp(...)`, whose member then carried the dependence on it;
    split into a statement before the row's loop, the loop is a vector loop."""
    source = """
    def ce_grad(float(B, K) X, int32(B) label, float(B) mx, float(B) s, float d_loss)
        -> (d_X) {
        d_s(b) = d_loss / B * (1 / s(b))
        d_X(i, j) = d_s(i) * exp(X(i, j) - mx(i)) where i in 0:B, j in 0:K
        d_X(b, label(b)) += -(d_loss / B)
    }"""
    sizes = {"B": 37, "K": 300}
    code = _lowered(source, sizes).source
    row = code[: code.index("tc_expf((t_X[")].rsplit("for (", 1)[0].rstrip().splitlines()[-1]
    assert row.strip() == "#pragma omp simd", code
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 300), dtype=np.float32)
    label = rng.integers(0, 300, 37).astype(np.int32)
    mx, s = x.max(1), rng.uniform(1, 3, 37).astype(np.float32)
    cpu, reference = engines("cpu", source, quiet=True)
    args = (x, label, mx, s, np.float32(0.7))
    np.testing.assert_allclose(cpu.ce_grad(*args), reference.ce_grad(*args), rtol=1e-5, atol=1e-7)


def test_fixed_sizes_are_scheduled_as_numbers() -> None:
    """With the sizes fixed, a size is not a shift isl can fuse loops with: each
    statement of a batched layer norm keeps its own loop over the row, no member
    offsets a statement by a multiple of D (`n + 2*D` fused three rows' loops into
    one loop, walking the rows across their columns)."""
    (cdef,) = check_source(LAYER_NORM).values()
    sizes = {"B": 1, "S": 40, "D": 300}
    text = str(analyse(cdef, sizes, cpu_defaults(cdef)).schedule.get_root().to_str())
    assert not re.search(r"\d+ ?\* ?D|D \+|\+ ?D\b", text)


@pytest.mark.parametrize(
    ("source", "turns"),
    [
        ("def f(float(S,K) X, float(N,K) W) -> (O) { O(s,n) +=! X(s,k) * W(n,k) }", "W^T"),
        (
            "def f(float(B,H,S,E) A, float(D,H,E) Wo) -> (Y) {"
            " Y(b,s,n) +=! A(b,h,s,e) * Wo(n,h,e) }",
            "Wo^T2",
        ),
    ],
    ids=["one", "two"],
)
def test_an_operand_is_copied_with_the_dimensions_after_the_output_index_first(
    source: str, turns: str
) -> None:
    sizes = {"S": 37, "K": 70, "N": 300, "B": 1, "H": 4, "E": 33, "D": 150}
    sizes = {k: v for k, v in sizes.items() if re.search(rf"\b{k}\b", source.split("->")[0])}
    text = _schedule(source, sizes)
    assert re.search(rf'mark: "pack:([^"]*,)?{re.escape(turns)}[,"]', text)
    entry = re.search(r"def (\w+)", source)
    assert entry is not None
    _check(source, entry.group(1), sizes)


# --- random row chains ------------------------------------------------------------------


def _row_chain(rng: np.random.Generator) -> tuple[str, dict[str, int]]:
    """A random def over rows `(b, r)` (or `(r)`) of `C` columns: a pointwise start,
    then statements drawn from a row maximum, a row sum of an expression of the row
    and earlier row values, a pointwise rewrite of the row against a row value, a
    contraction with an operand every row shares, in a random valid order, the last
    row tensor the output. The rows, names and layouts vary; the rule must find them."""
    batched = bool(rng.integers(2))
    rows, row_shape = ("b,r", "B,R") if batched else ("r", "R")
    row = lambda t, c="c": f"{t}({rows},{c})"  # noqa: E731
    value = lambda t: f"{t}({rows})"  # noqa: E731
    lines = [f"{row('T0')} = exp(0.25 * {row('X')})"]
    tensors, values, k = ["T0"], [], 1
    for _ in range(int(rng.integers(2, 6))):
        t = tensors[int(rng.integers(len(tensors)))]
        kind = rng.choice(["max", "sum", "rewrite", "contract"])
        if kind == "max" or (kind in ("sum", "rewrite") and not values):
            lines.append(f"{value(f'v{k}')} max=! {row(t)}")
            values.append(f"v{k}")
        elif kind == "sum":
            v = values[int(rng.integers(len(values)))]
            lines.append(f"{value(f'v{k}')} +=! ({row(t)} - {value(v)}) * {row(t)}")
            values.append(f"v{k}")
        elif kind == "rewrite":
            v = values[int(rng.integers(len(values)))]
            lines.append(f"{row(f'T{k}')} = {row(t)} / (1 + fabs({value(v)}))")
            tensors.append(f"T{k}")
        else:
            lines.append(f"{row(f'T{k}', 'd')} +=! {row(t)} * W(c,d) where d in 0:C")
            tensors.append(f"T{k}")
        k += 1
    last = tensors[-1]
    total = values[-1] if values else None
    out = f"{row('O')} = {row(last)}" + (f" + {value(total)}" if total else "")
    source = f"def chain(float({row_shape},C) X, float(C,C) W) -> (O) {{\n    "
    source += "\n    ".join([*lines, out]) + "\n}\n"
    sizes = {
        "B": int(rng.integers(1, 4)),
        "R": int(rng.integers(1, 70)),
        "C": int(rng.integers(1, 40)),
    }
    return source, sizes


@pytest.mark.parametrize("seed", range(24))
def test_random_row_chains_give_the_references_results(seed: int) -> None:
    """Random chains of row statements, with default options, with row fusion off,
    and for every size (a size-generic kernel): the reference's results each time."""
    rng = np.random.default_rng(seed)
    source, sizes = _row_chain(rng)
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(source, sizes, seed)
    want = reference.run("chain", *inputs)
    scale = max(1.0, float(np.max(np.abs(want))))
    for options in ({}, {"fuse_rows": False}, {"fix_parameters_before_scheduling": False}):
        got = cpu.run("chain", *inputs, options=cpu_defaults_of(source).replace(**options))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=source)


def cpu_defaults_of(source: str):  # type: ignore[no-untyped-def]
    (cdef,) = check_source(source).values()
    return cpu_defaults(cdef)


def test_most_random_row_chains_are_fused() -> None:
    """The chains above are not left to the unfused path: most run as one row nest
    (18 of these 24; a chain whose last statement is a lone row value, or whose rows
    are one, may have no run)."""
    fused = 0
    for seed in range(24):
        source, sizes = _row_chain(np.random.default_rng(seed))
        fused += bool(_fused_rows(_schedule(source, sizes)))
    assert fused >= 12
