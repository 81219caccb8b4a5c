"""Register blocking of reductions (`tcpy.mapping.cpu.registers`, and the blocks the C
printer keeps in a local array): which nests are blocked, what is printed, and the
results against the `reference` target for block sizes that do and do not divide
the loops, on the contractions of the suite, with NaN and infinities in the inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tcpy
from tcpy.errors import TCMappingError
from tcpy.genetic.space import build_space, repair
from tcpy.mapping.options import MappingOptions

from differential import engines
from programs import BATCH_MATMUL, MATMUL, renamed

CONTRACTIONS = {
    "matmul": (
        renamed(MATMUL, "f"),
        [{"M": 64, "K": 48, "N": 80}, {"M": 37, "K": 11, "N": 53}],
    ),
    "batch_matmul": (
        renamed(BATCH_MATMUL, "f"),
        [{"B": 3, "M": 16, "K": 9, "N": 32}, {"B": 2, "M": 7, "K": 5, "N": 19}],
    ),
    "conv2d": (
        """def f(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
            O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
        }""",
        [
            {"N": 2, "C": 3, "H": 10, "W": 20, "F": 8, "KH": 3, "KW": 3},
            {"N": 1, "C": 2, "H": 7, "W": 9, "F": 5, "KH": 2, "KW": 3},
        ],
    ),
    "tensordot_int": (
        "def f(int32(A,B,C) X, int32(C,B,D) Y) -> (Z) { Z(a,d) +=! X(a,b,c) * Y(c,b,d) }",
        [{"A": 12, "B": 4, "C": 3, "D": 24}, {"A": 5, "B": 3, "C": 2, "D": 7}],
    ),
    "dot_rows": (  # B is copied transposed, and n is the vector loop
        "def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
        [{"M": 64, "K": 48, "N": 40}, {"M": 9, "K": 13, "N": 7}],
    ),
    "dot_rows_squared": (  # B read twice, both reads from one transposed copy
        "def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) * B(n,k) }",
        [{"M": 24, "K": 40, "N": 16}, {"M": 9, "K": 13, "N": 7}],
    ),
    "dot_rows_int": (
        "def f(int32(M,K) A, int32(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }",
        [{"M": 16, "K": 32, "N": 8}, {"M": 5, "K": 3, "N": 11}],
    ),
    "conv2d_channels": (  # rows of 30: vectors of output channels (`channel_vectors`)
        """def f(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
            O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)
        }""",
        [
            {"N": 1, "C": 4, "H": 5, "W": 32, "F": 32, "KH": 3, "KW": 3},
            {"N": 2, "C": 3, "H": 4, "W": 13, "F": 16, "KH": 2, "KW": 3},
        ],
    ),
    "conv2d_strided_channels": (  # output channels as the vector loop, blocks across rows
        """def f(float(N,C,H,W) I, float(F,C,KH,KW) Wt) -> (O) {
            O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * Wt(f,c,kh,kw)
        }""",
        [
            {"N": 2, "C": 3, "H": 11, "W": 33, "F": 16, "KH": 3, "KW": 3},
            {"N": 1, "C": 2, "H": 9, "W": 28, "F": 32, "KH": 2, "KW": 3},
        ],
    ),
    "weight_gradient": (  # rows of OW reduced in lanes: a partial tile of lanes
        """def f(float(N,C,H,W) I, float(N,F,OH,OW) G) -> (D) {
            D(f,c,kh,kw) +=! G(n,f,h,w) * I(n,c,h+kh,w+kw) where kh in 0:3, kw in 0:3
        }""",
        [
            {"N": 2, "C": 16, "H": 6, "W": 32, "F": 32, "OH": 4, "OW": 30},
            {"N": 1, "C": 2, "H": 5, "W": 21, "F": 3, "OH": 3, "OW": 19},
        ],
    ),
    "shared_scalar": (  # lanes of a row of 100 that all read alpha: two paths
        "def f(float(M,K) A, float(K) x, float alpha) -> (y) { y(m) +=! alpha * A(m,k) * x(k) }",
        [{"M": 40, "K": 100}, {"M": 5, "K": 21}],
    ),
    "product": (
        "def f(float(M,K) A, float(K,N) B) -> (P) { P(m,n) *=! A(m,k) - B(k,n) }",
        [{"M": 8, "K": 5, "N": 16}, {"M": 9, "K": 3, "N": 13}],
    ),
    "shifted_rows": (  # A's rows read from one pointer whose first element is not A's
        """def f(float(M,K) A, float(K,N) B) -> (C) {
            C(m,n) +=! A(m+1,k+2) * B(k,n) where m in 0:M-1, k in 0:K-2
        }""",
        [{"M": 40, "K": 30, "N": 48}, {"M": 9, "K": 7, "N": 13}],
    ),
    "strided_rows": (
        "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(2*m,k) * B(k,n) }",
        [{"M": 40, "K": 30, "N": 48}, {"M": 9, "K": 7, "N": 13}],
    ),
}
BLOCKS = [(), (0,), (1,), (4, 8), (3, 5), (8, 16), (2, 2, 4)]


def _inputs(engine: tcpy.ExecutionEngine, sizes: dict[str, int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in engine.checked("f").inputs:
        shape = [d.evaluate(sizes) for d in t.shape]
        if t.scalar.is_float:
            out.append(rng.uniform(0.5, 1.5, shape).astype(t.scalar.dtype))
        else:
            out.append(rng.integers(-9, 10, shape).astype(t.scalar.dtype))
    return out


@pytest.mark.parametrize("block", BLOCKS, ids=str)
@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_blocked_contractions_compute_the_reference(name: str, block: tuple[int, ...]) -> None:
    source, size_sets = CONTRACTIONS[name]
    cpu, reference = engines("cpu", source, quiet=True)
    options = MappingOptions.cpu().replace(register_tile=block)
    for seed, sizes in enumerate(size_sets):
        inputs = _inputs(cpu, sizes, seed)
        got, want = cpu.run("f", *inputs, options=options), reference.run("f", *inputs)
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=f"{sizes}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{sizes}")


def _source(source: str, sizes: dict[str, int], **options: object) -> str:
    cpu, _ = engines("cpu", source, quiet=True)
    options_ = MappingOptions.cpu().replace(**options)
    return cpu.compile("f", *_inputs(cpu, sizes, 0), options=options_).source


def test_the_block_is_a_local_array_around_the_reduction() -> None:
    """Loaded, reduced and stored, where the reduction is cut into tiles (K of 300:
    the block's outputs are loaded again for the second tile)."""
    source, (sizes, _) = CONTRACTIONS["matmul"]
    sizes = {**sizes, "K": 300}
    lines = [ln.strip() for ln in _source(source, sizes, register_tile=(4, 8)).splitlines()]
    assert "float tc_reg[4][8];" in lines
    (load,) = [k for k, ln in enumerate(lines) if re.match(r"tc_reg\[\w+\]\[\w+\] = t_C\[", ln)]
    element = lines[load].split(" = ")[0]
    (reduction,) = [k for k, ln in enumerate(lines) if ln.startswith(f"{element} = {element} + ")]
    (store,) = [
        k for k, ln in enumerate(lines) if ln.startswith("t_C[") and ln.endswith(f"= {element};")
    ]
    assert load < reduction < store
    # C is not touched between the load and the store: the reduction runs in the block
    assert not any("t_C[" in ln for ln in lines[load + 1 : store])
    # A, read by each row apart, from one pointer at the block's first row (`_bases`)
    assert "t_A_rows[" in lines[reduction] and "t_B[" in lines[reduction]
    (rows,) = [k for k, ln in enumerate(lines) if ln.startswith("__typeof__(&t_A[0]) t_A_rows =")]
    assert load < rows < reduction
    assert lines[reduction - 4] == "#pragma GCC unroll 4"  # the rows, around the vector loop


def test_a_blocks_innermost_reduction_loop_stays_a_loop_unless_an_index_divides() -> None:
    """GCC unrolled a 3x3 convolution's 3 steps of kw around a block of 6 x 16 and then
    loaded the image's vectors once per row (1.2-1.4x slower): that loop keeps a
    loop; a strided convolution's copy is read in phases (`tc_floord`), which unrolled
    steps fold, and is left to GCC."""
    source, (sizes, _) = CONTRACTIONS["conv2d"]
    sizes = {**sizes, "W": 34, "F": 12}
    lines = [ln.strip() for ln in _source(source, sizes).splitlines()]
    updated = re.compile(r"(tc_reg\[\w+\]\[\w+\]) = \1 \+ ")
    update = next(k for k, ln in enumerate(lines) if updated.match(ln))
    loop = update - 5  # kw's loop, around the rows and the vector loop (the whole blocks')
    assert lines[loop].startswith("for (") and lines[loop - 1] == "#pragma GCC unroll 1"
    strided = source.replace("h+kh,w+kw", "2*h+kh,2*w+kw")
    text = _source(strided, {**sizes, "H": 21, "W": 67})
    assert "tc_floord(" in text and "#pragma GCC unroll 1" not in text


def test_a_reduction_vector_loop_keeps_partial_sums_per_lane() -> None:
    source, (sizes, _) = CONTRACTIONS["dot_rows_squared"]
    text = _source(source, sizes, register_tile=(2, 4), pack_operands=False)  # no B^T
    lines = [ln.strip() for ln in text.splitlines()]
    (declaration,) = [ln for ln in lines if ln.startswith("float tc_reg[2][4][")]
    (start,) = [k for k, ln in enumerate(lines) if ln.endswith("] = 0.0f;") and "tc_reg" in ln]
    # each output's whole reduction in its block: its sum starts at the identity
    (total,) = [k for k, ln in enumerate(lines) if ln == "float tc_sum = 0.0f;"]
    (store,) = [k for k, ln in enumerate(lines) if ln.startswith("t_C[") and ln.endswith("tc_sum;")]
    assert start < total < store and declaration
    assert not any("t_C[" in ln for ln in lines[:store])


def test_lanes_bounded_by_a_reduction_loop_run_under_constant_bounds(vector_width) -> None:  # type: ignore[no-untyped-def]
    """A weight gradient reduces rows of 30 in lanes: the last tile of lanes along the
    row is partial, and the row is a reduction loop, so the block cannot be tested
    once outside it. Every tile runs the lane loop under constant bounds (the block,
    indexed by constants only, stays in registers), one path for all: a lane past the
    row adds the identity (`?:` around the value, masked loads once vectorised; an
    `if` around the update, or a second path for the full tiles, left the block in
    memory: 1.2-1.3x slower)."""
    vector_width("512")  # the vectors of 16 lanes it was written for
    source, (sizes, _) = CONTRACTIONS["weight_gradient"]
    # without copies: no transposed copy makes the output channels the vector loop
    lines = [ln.strip() for ln in _source(source, sizes, pack_operands=False).splitlines()]
    (update,) = [k for k, ln in enumerate(lines) if ln.startswith("tc_reg[") and "t_G[" in ln]
    guard = re.search(r"= (tc_reg\[[^=]*\]) \+ \(\((c\d+) <= ([^?]*)\) \? \(", lines[update])
    assert guard is not None and "tc_min" not in guard.group(3), lines[update]
    assert lines[update].endswith(": 0.0f);"), lines[update]
    lane = lines[update - 1]
    assert lane.startswith(f"for (int64_t {guard.group(2)} = 0;") and "tc_min" not in lane, lane
    assert "} else {" not in lines and not any(
        ln.startswith("if (") for ln in lines[update - 12 : update]
    )


def test_lanes_that_share_a_read_keep_the_whole_tiles_on_a_path_of_their_own() -> None:
    """`alpha * A(m, k) * x(k)` reduces rows of 100 in lanes of a vector, every lane
    reading `alpha`: under the `?:` of one path GCC left the loop scalar (7x slower on
    gesummv), so the whole tiles keep a path of their own (the row's loop peeled: its
    whole tiles first), the partial one its scalar loop (`_rest_of_row`)."""
    source, (sizes, _) = CONTRACTIONS["shared_scalar"]
    lines = [ln.strip() for ln in _source(source, sizes).splitlines()]
    updates = [k for k, ln in enumerate(lines) if ln.startswith("tc_reg[") and "t_alpha[" in ln]
    assert len(updates) == 2 and not any(" ? " in lines[k] for k in updates), updates
    whole, rest = _peeled_loops(lines)
    assert whole < updates[0] < rest < updates[1]
    _rest_of_row(lines, updates[1])


def test_a_long_row_of_lanes_runs_its_whole_tiles_unguarded() -> None:
    """`A(m, k) * x(k)` over rows of 2100: 131 whole tiles of 16 lanes and one of 4. The
    row's loop is peeled: its whole tiles first, their lanes unguarded (one load per
    lane, no mask), then the rest, one lane at a time (`_rest_of_row`; a row dot
    product of 1900 x 2100: 211-250 us with every step's lanes guarded, 150-158
    peeled)."""
    source = "def f(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }"
    lines = [ln.strip() for ln in _source(source, {"M": 40, "K": 2100}).splitlines()]
    updates = [k for k, ln in enumerate(lines) if ln.startswith("tc_reg[") and "t_A[" in ln]
    assert len(updates) == 2, updates
    assert not any(" ? " in lines[k] for k in updates)
    whole, rest = _peeled_loops(lines)
    assert whole < updates[0] < rest < updates[1]
    _rest_of_row(lines, updates[1])


def _rest_of_row(lines: list[str], update: int) -> None:
    """The update at line `update`, of the tiles past a peeled row's whole ones, runs
    in a scalar loop under isl's bound (no `if`, no vector pragma: masked updates of
    the lanes made GCC store the block to memory and sum its lanes one at a time,
    gesummv at 1300 x 1300 98 -> 88 us)."""
    lane = lines[update - 1]
    assert re.match(r"for \(int64_t c\d+ = 0; c\d+ <= tc_min\(\d+, ", lane), lane
    assert lines[update - 2] != "#pragma omp simd", lines[update - 2]


def _peeled_loops(lines: list[str]) -> tuple[int, int]:
    """The lines of a peeled loop's two runs: its whole tiles (its condition and the
    test that a tile is whole), then the rest (its condition), on one iterator."""
    (whole,) = [k for k, ln in enumerate(lines) if re.match(r"for \(; \(.*\) && \(.*\);", ln)]
    iterator = re.search(r"; (c\d+) \+= ", lines[whole])
    assert iterator is not None and lines[whole - 1] == f"int64_t {iterator.group(1)} = 0;"
    (rest,) = [k for k, ln in enumerate(lines) if ln.startswith("for (; c") and " && " not in ln]
    return whole, rest


def test_convolutions_take_vectors_of_output_channels(vector_width) -> None:  # type: ignore[no-untyped-def]
    """A 3x3 convolution's 32 output channels are whole vectors: the channels are the
    vector loop of the block, the filters copied with their channels innermost, each
    image value broadcast, for rows of 30 (no whole number of vectors) and of 32 (a
    convolution's rows are read in a window) alike, the latter where the channels make
    two vectors at least; without copies, the rows are the vector loop."""
    vector_width("512")  # the vectors of 16 lanes it was written for
    source, (sizes, _) = CONTRACTIONS["conv2d_channels"]
    turned = r"(tc_pack\d+)\[[^=]*\* 32 \+ \(tc_i0\)\)\] = t_Wt\["
    text = _source(source, sizes)
    copy = re.search(turned, text)
    assert copy is not None, text
    name = copy.group(1)
    updates = [
        ln.strip()
        for ln in text.splitlines()
        if ln.strip().startswith("tc_reg[") and "t_I[" in ln and f"{name}[" in ln
    ]
    assert updates
    for update in updates:
        lane = re.match(r"tc_reg\[c\d+\]\[(c\d+)\]", update)
        assert lane is not None and f"(({lane.group(1)}) - {name}_o0))]" in update, update
    assert re.search(turned, _source(source, {**sizes, "W": 34})) is not None
    assert "= t_Wt[" not in _source(source, sizes, pack_operands=False)
    # rows of 32 and 16 channels, one vector: the rows stay the vector loop
    one = r"(tc_pack\d+)\[[^=]*\* 16 \+ \(tc_i0\)\)\] = t_Wt\["
    assert re.search(one, _source(source, {**sizes, "W": 34, "F": 16})) is None
    assert re.search(one, _source(source, {**sizes, "F": 16})) is not None  # rows of 30


@pytest.mark.parametrize(("width", "rows"), [(16, 7), (34, 6), (9, 7), (12, 5)])
def test_blocks_across_short_rows(vector_width, width: int, rows: int) -> None:  # type: ignore[no-untyped-def]
    """A convolution whose output channels are its vector loop takes blocks of 7 rows
    where 7 cover its rows whole and blocks of 6 would compute a tenth more (rows of
    14; of 7, the image's rows all short, the innermost blocked), of 5 where 5 cover
    them and 6 do not (rows of 10), 6 otherwise (rows of 32: a last block of 4 masked
    would spill in blocks of 7); the blocks of channels run outside the blocks of rows.
    Results as the reference's."""
    vector_width("256")  # 16 registers: blocks of 6 rows
    source, _ = CONTRACTIONS["conv2d_channels"]
    sizes = {"N": 1, "C": 8, "H": 9, "W": width, "F": 32, "KH": 3, "KW": 3}
    text = _source(source, sizes)
    assert f"float tc_reg[{rows}][16];" in text
    channels = re.search(r"for \(int64_t (c\d+) = 0; \1 <= 31; \1 \+= 16\)", text)
    pixels = re.search(rf"for \(int64_t (c\d+) = 0; \1 <= {width - 3}; \1 \+= {rows}\)", text)
    assert channels is not None, text
    if width - 2 > rows:  # more than one block of rows
        assert pixels is not None and channels.start() < pixels.start(), text
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=width)
    np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=2e-5)


def test_an_input_read_across_the_output_rows_is_copied_transposed() -> None:
    """`C(m,n) +=! A(m,k) * B(n,k)`: B's tile is copied with k outermost, so that n, the
    output's unit-stride index, is the vector loop of an outer-product block; without
    copies (`pack_operands=False`) k stays the vector loop, with a sum per lane."""
    source, _ = CONTRACTIONS["dot_rows"]
    sizes = {"M": 64, "K": 48, "N": 48}  # rows of whole vectors (`channel_vectors`: 40)
    text = _source(source, sizes)
    (copy,) = re.findall(
        r"(tc_pack\d+)\[\(\(int64_t\)\(tc_i1\) \* \d+ \+ \(tc_i0\)\)\] = t_B", text
    )
    assert re.search(rf"tc_reg\[c\d+\]\[c\d+\] \+ \(t_A_rows\[.*\] \* {copy}\[", text)
    assert "tc_sum" not in text
    assert "tc_sum" in _source(source, sizes, pack_operands=False)


def test_blocking_off_and_unblocked_reductions() -> None:
    source, (sizes, _) = CONTRACTIONS["matmul"]
    assert "tc_reg" not in _source(source, sizes, register_tile=(0,))
    assert "tc_reg" in _source(source, sizes)  # the target's choice blocks matmul
    minimum = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) min=! A(m,k) + B(k,n) }"
    assert "tc_reg" not in _source(minimum, sizes)  # min keeps its NaN-tracking scalar
    rows = "def f(float(M,K) A) -> (S) { S(m) +=! A(m,k) }"
    assert "tc_reg" not in _source(rows, {"M": 16, "K": 8})  # the vector loop reduces


@pytest.mark.parametrize("form", ["matmul", "dot_rows"])
@pytest.mark.parametrize("block", [(), (4, 8), (3, 5)], ids=str)
def test_nan_and_infinities_propagate_through_a_block(form: str, block: tuple[int, ...]) -> None:
    source, (sizes, _) = CONTRACTIONS[form]
    cpu, reference = engines("cpu", source, quiet=True)
    a, b = _inputs(cpu, sizes, 1)
    if form == "dot_rows":
        b = np.ascontiguousarray(np.resize(b, (sizes["K"], 80)).T)  # B(n, k) as B(k, n).T
        b = b.astype(np.float32)
        sizes = {**sizes, "N": 80}
    a[3, 7] = np.nan
    a[10, 2] = np.inf
    bt = b if form == "matmul" else b.T  # bt(k, n) either way
    bt[2, 5] = 0.0  # inf * 0 is NaN in C(10, 5) only
    bt[9, 60] = -np.inf
    a[20, 9] = np.inf  # C(20, 60) is -inf, the rest of its row inf
    got = cpu.run("f", a, b, options=MappingOptions.cpu().replace(register_tile=block))
    want = reference.run("f", a, b)
    assert np.isnan(want[3]).all() and np.isnan(want[10, 5])
    assert want[20, 60] == -np.inf and want[20, 0] == np.inf
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5)
    np.testing.assert_array_equal(np.sign(got[~np.isnan(want)]), np.sign(want[~np.isnan(want)]))


def test_register_tile_is_validated() -> None:
    with pytest.raises(TCMappingError, match="register_tile"):
        MappingOptions(register_tile=(64, 32))
    with pytest.raises(TCMappingError, match="register_tile"):
        MappingOptions(register_tile=(-1,))
    with pytest.raises(TCMappingError, match="register_tile must be a tuple"):
        MappingOptions(register_tile=[4, 8])  # type: ignore[arg-type]


def test_the_tuner_searches_register_blocks() -> None:
    source, (sizes, _) = CONTRACTIONS["matmul"]
    cpu, _ = engines("cpu", source, quiet=True)
    space = build_space(cpu.checked("f"), sizes, "cpu", MappingOptions.cpu())
    genes = [g for g in space.genes if g.name == "register_tile"]
    assert len(genes) == 2 and 8 in genes[1].alleles and 0 in genes[1].alleles
    repaired = repair(MappingOptions.cpu(), {"register_tile": (64, 64)})
    assert repaired.register_tile == (32, 32)  # the larger size halved until 1024 fit
    assert repair(MappingOptions.cpu(), {"register_tile": (4, 8)}).register_tile == (4, 8)


EDGE_SIZES = {"M": 37, "K": 30, "N": 53}  # blocks of 8 x 32: 5 rows, 21 columns at the edges


def test_a_block_at_the_edge_runs_whole_with_masked_loads(vector_width) -> None:  # type: ignore[no-untyped-def]
    """A block partly outside the domain, at least half inside along each loop, runs
    under constant bounds, its loads outside the domain masked, the B row it shares
    loaded once per step for its rows, and only its elements inside stored; a block
    less than half inside keeps isl's bounds."""
    vector_width("512")  # the blocks of 8 x 32 of EDGE_SIZES
    source = _source(renamed(MATMUL, "f"), EDGE_SIZES)
    paths = re.split(r"\} else (?:if \((.*)\) )?\{", source)
    assert len(paths) >= 3, source
    masked = paths[2]
    assert re.search(r"tc_m0\[c\d+\] = \(\(c\d+ <= .*\) \? t_B\[", masked)
    assert re.search(r"\? t_A\[", masked)  # the rows past the edge read nothing
    assert re.search(r"if \(c\d+ <= .* && c\d+ <= .*\) t_C\[", masked)
    assert "tc_min(" not in masked  # constant bounds: the block stays in registers
    assert "tc_min(" in paths[4]  # the general path, for blocks less than half inside


def test_an_integer_block_at_the_edge_keeps_isls_bounds() -> None:
    """An integer division by the 0 loaded outside the domain would trap: integer
    blocks at the edge run isl's bounds."""
    source, _ = CONTRACTIONS["dot_rows_int"]
    printed = _source(source.replace("A(m,k) * B(n,k)", "A(m,k) / B(n,k)"), EDGE_SIZES)
    assert "tc_m0" not in printed and "} else if (" not in printed


@pytest.mark.parametrize(
    "sizes",
    [EDGE_SIZES, {"M": 13, "K": 7, "N": 17}, {"M": 8, "K": 5, "N": 48}, {"M": 21, "K": 9, "N": 5}],
    ids=str,
)
def test_masked_edge_blocks_give_the_unblocked_results_bit_for_bit(sizes: dict[str, int]) -> None:
    """The elements of an edge block inside the domain are reduced in the order the
    unblocked kernel reduces them: the same bits; NaN and infinities at the edge rows
    and columns reach the outputs they should, and no other."""
    source = renamed(MATMUL, "f")
    cpu, reference = engines("cpu", source, quiet=True)
    a, b = _inputs(cpu, sizes, 5)
    a[-1, 2] = np.nan  # the last row: NaN
    b[1, -1] = np.inf  # the last column: inf (or NaN with the NaN row)
    got = cpu.run("f", a, b)
    plain = cpu.run("f", a, b, options=MappingOptions.cpu().replace(register_tile=(0,)))
    np.testing.assert_array_equal(got, plain)
    want = reference.run("f", a, b)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    assert np.isnan(got[-1]).all() and np.isinf(got[:-1, -1]).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5)


def test_a_read_twice_in_a_masked_block_is_loaded_once_for_its_rows() -> None:
    source = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) * B(k,n) }"
    printed = _source(source, EDGE_SIZES)
    masked = re.split(r"\} else (?:if \(.*\) )?\{", printed)[1]
    assert len(re.findall(r"tc_m0\[c\d+\] = ", masked)) == 1 and "tc_m1" not in masked
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, EDGE_SIZES, 2)
    np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=2e-5)


ROWS_OF_SEVEN = """
def f(bfloat16(N, S) O, bfloat16(L, S) tmp, bfloat16(L, Q) A) -> (C, V) {
    T(j, w) +=! min(max((O(j, b) * tmp(w, b)), (-9.0)), 9.0)
    V(j) min=! min(max(T(j, w), (-100.0)), 100.0)
    X(j, w) = min(max((T(j, w) - V(j)), (-50.0)), 50.0)
    C(j, kh) +=! (min(max(X(j, w), (-9.0)), 9.0) * A(w, kh))
}
"""


def test_a_block_whose_rows_of_lanes_are_short_is_declared_with_rows_of_a_power_of_two() -> None:
    """`T` reduces rows of 7 in lanes, a block of 2 x 3 outputs (`tc_reg[2][3][7]` as
    the loops see it). Declared so, GCC 12.2 at -O3 unrolled the block's loops and got
    some sums wrong (a case of the fuzzer's); each row is declared 8 long, its last
    element unused, and the results are the reference's."""
    import ml_dtypes

    options = MappingOptions.cpu().replace(
        tile=(15,), unroll=2, interchange=(0,), pack_operands=True, parallel=False, threads=1
    )
    rng = np.random.default_rng(0)
    inputs = [
        rng.integers(-3, 4, size=shape).astype(ml_dtypes.bfloat16)
        for shape in ((8, 7), (3, 7), (3, 4))
    ]
    cpu, reference = engines("cpu", ROWS_OF_SEVEN)
    assert "float tc_reg[2][3][8];" in cpu.compile("f", *inputs, options=options).source
    for got, want in zip(cpu.f(*inputs, options=options), reference.f(*inputs), strict=True):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_a_block_over_the_whole_reduction_starts_at_the_identity() -> None:
    """Where each output's whole reduction runs in one visit of its block (a batch
    matmul's K of 9), the block starts at zero and no nest initialises the output
    (`registers.fresh_blocks`): the output is written once; where the reduction is cut
    into tiles (K of 300), the initialisation stays and the block loads the outputs.
    Results as the reference's, NaN and infinities included."""
    source, (sizes, _) = CONTRACTIONS["batch_matmul"]
    text = _source(source, sizes)
    assert "[initialisation]" not in text
    assert re.search(r"tc_reg\[\w+\]\[\w+\] = 0\.0f;", text), text
    assert "= t_Z[" not in text  # never read
    tiled = _source(source, {**sizes, "K": 300})
    assert "[initialisation]" in tiled and re.search(r"tc_reg\[\w+\]\[\w+\] = t_Z\[", tiled)
    cpu, reference = engines("cpu", source, quiet=True)
    for k in (9, 300):
        inputs = _inputs(cpu, {**sizes, "K": k}, seed=k)
        inputs[0][0, 1, 2], inputs[1][1, 3, 4] = np.nan, np.inf
        np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=2e-5)


def test_outputs_an_empty_reduction_does_not_reach_are_still_zero() -> None:
    """A reduction over an empty range computes nothing: its initialisation is the
    output's only value, kept whether or not a block would start at the identity."""
    source = (
        "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) where k in 2:K }"
    )
    cpu, reference = engines("cpu", source, quiet=True)
    for k in (2, 3):
        inputs = _inputs(cpu, {"M": 20, "K": k, "N": 40}, seed=k)
        got = cpu.run("f", *inputs)
        np.testing.assert_allclose(got, reference.run("f", *inputs), rtol=2e-5)
        assert got.any() == (k > 2)


@pytest.mark.parametrize(("width", "fresh"), [(34, False), (32, True)])
def test_blocks_across_rows_4kb_apart_load_their_initialised_outputs(  # type: ignore[no-untyped-def]
    vector_width, width: int, fresh: bool
) -> None:
    """A block across the output's rows (its vectors over 32 output channels) started
    at the identity stores into lines it never read: with the channels' rows 4 KB
    apart (32 x 32 images), all in one set of the L1 cache, the output is initialised
    and loaded instead (1.4x faster measured); 32 x 30 images' rows fall in 16 sets
    and start at the identity."""
    vector_width("512")
    source, _ = CONTRACTIONS["conv2d_channels"]
    sizes = {"N": 1, "C": 4, "H": 34, "W": width, "F": 32, "KH": 3, "KW": 3}
    text = _source(source, sizes)
    assert "float tc_reg[" in text
    assert ("[initialisation]" not in text) == fresh, text
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=width)
    np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=2e-5)


def _shapeless(monkeypatch: pytest.MonkeyPatch) -> None:
    """The printer finds no block's shape under a fresh mark (`UnprintedBlock`)."""
    from tcpy.codegen import c

    real = c.print_register_block

    def shapeless(*args, **kwargs):  # type: ignore[no-untyped-def]
        return False if args[-1] is True else real(*args, **kwargs)  # `fresh`, passed last

    monkeypatch.setattr(c, "print_register_block", shapeless)


def _isl_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fresh_blocks` fails in isl (its operation budget)."""
    import islpy as isl

    from tcpy.mapping.cpu import registers

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise isl.Error("the operation budget")

    monkeypatch.setattr(registers, "_initialised_by", failing)


@pytest.mark.parametrize("failure", [_shapeless, _isl_fails], ids=["unprinted", "isl"])
def test_a_fresh_block_that_cannot_be_had_loads_its_initialised_outputs(
    monkeypatch: pytest.MonkeyPatch, failure
) -> None:  # type: ignore[no-untyped-def]
    """Where the printer cannot print a fresh block as a block, the kernel is printed
    again from the schedule without fresh blocks; where isl fails in the pass, the
    schedule stays as mapped. Either way the initialisation is back, the block loads
    its outputs, and the results are the reference's."""
    failure(monkeypatch)
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")  # not the cached fresh kernel
    source, (sizes, _) = CONTRACTIONS["batch_matmul"]
    text = _source(source, sizes)
    assert "[initialisation]" in text and re.search(r"tc_reg\[\w+\]\[\w+\] = t_Z\[", text)
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=3)
    np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=2e-5)
