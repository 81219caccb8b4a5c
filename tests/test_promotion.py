"""Promotion (`tcpy.mapping.promotion`) and the packed tiles the C printer copies: the
footprint boxes, the decision per tensor, and packed kernels against the `reference`
target for tiles that do and do not divide the loops, with sizes fixed and generic."""

from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest
from test_registers import CONTRACTIONS, _inputs

from tcpy.codegen.status import STATUS_OUT_OF_MEMORY
from tcpy.errors import TCLaunchError, TCMappingError
from tcpy.mapping.cpu.packing import ONCE_BYTES
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.mapping.promotion import Box, box, footprint, run_stride
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c
from tcpy.runtime.status import check_status

from differential import engines

MATMUL = CONTRACTIONS["matmul"][0]


def _lower(source: str, sizes: dict[str, int], **options: object):  # type: ignore[no-untyped-def]
    (cdef,) = check_source(source).values()
    return lower_to_c(cdef, sizes, MappingOptions.cpu().replace(**options), check=True)


def _pack_marks(source: str, sizes: dict[str, int], **options: object) -> list[str]:
    text = _lower(source, sizes, **options).schedule.get_root().to_str()
    return re.findall(r'mark: "(pack(?:_once)?:[^"]*)"', text)


# --- the analysis -----------------------------------------------------------------------


def test_the_box_of_a_footprint() -> None:
    ctx = isl.Context()
    # rows 0..3 whole, a window of 8 columns from `a`, cut short at N
    fp = isl.Map("[N] -> { [a] -> t_X[i, j] : 0 <= i < 4 and a <= j < a + 8 and j < N }", ctx)
    b = box(fp, "X")
    assert b is not None and b.sizes == (4, 8)
    assert b.offsets[0].is_equal(isl.PwAff("[N] -> { [a] -> [(0)] : a < N }", ctx))
    assert b.offsets[1].is_equal(isl.PwAff("[N] -> { [a] -> [(a)] : a < N }", ctx))
    # a window as wide as N has no constant extent: no box
    whole = isl.Map("[N] -> { [a] -> t_X[i, j] : 0 <= i < 4 and 0 <= j < N }", ctx)
    assert box(whole, "X") is None


def test_the_footprint_collects_every_access_under_the_site() -> None:
    ctx = isl.Context()
    prefix = isl.UnionMap("{ S[i, j] -> [i - i mod 8] }", ctx)
    reads = isl.UnionMap("{ S[i, j] -> t_X[i, j] : 0 <= i < 32 and 0 <= j < 5; "
                         "S[i, j] -> t_X[i + 1, j] : 0 <= i < 32 and 0 <= j < 5; "
                         "S[i, j] -> t_Y[j] : 0 <= i < 32 and 0 <= j < 5 }", ctx)  # fmt: skip
    fp = footprint(prefix, reads, "X")
    assert fp is not None
    b = box(fp, "X")
    assert b is not None and b.sizes == (9, 5)  # rows i..i+8 of a tile of 8, shifted by 1
    assert footprint(prefix, reads, "Z") is None


def test_run_stride() -> None:
    def b(*sizes: int) -> Box:
        return Box("X", (), sizes)

    assert run_stride(b(128, 256), (1024, 1024), 4) == 4096  # rows of 1 KB, 4 KB apart
    assert run_stride(b(4, 1024), (1024, 1024), 4) == 0  # whole rows: one run
    assert run_stride(b(1, 8), (16, 16), 4) == 0  # a piece of one row
    assert run_stride(b(2, 4, 16), (8, 4, 16), 2) == 0  # two whole planes: one run
    assert run_stride(b(2, 2, 16), (8, 4, 16), 2) == 128  # half planes, a plane apart
    assert run_stride(b(128, 256), (None, 1024), 4) == 4096
    assert run_stride(b(128, 256), (1024, None), 4) is None


# --- where and what is packed -----------------------------------------------------------


def test_operands_with_rows_far_apart_are_packed_by_default() -> None:
    big = {"M": 1024, "K": 1024, "N": 1024}
    # B's rows are 4 KB apart and each is reused by the 256 rows of A's tile; A's
    # 256 x 256 tile, read by broadcasts, exceeds the budget (packing it too measured
    # no faster)
    assert _pack_marks(MATMUL, big) == ["pack:B"]
    # rows of 2 KB alias too (measured), rows of 1 KB not enough to pay: left in place
    assert _pack_marks(MATMUL, {"M": 512, "K": 512, "N": 512}) == ["pack:B"]
    assert _pack_marks(MATMUL, {"M": 256, "K": 256, "N": 256}) == []
    assert _pack_marks(MATMUL, big, pack_operands=False) == []
    # B's tile is the whole of B here: copied once, above the nest
    small = {"M": 64, "K": 48, "N": 80}
    assert _pack_marks(MATMUL, small, pack_operands=True) == ["pack_once:B", "pack:A"]


TRANSPOSED_BOTH = "def f(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }"
WEIGHT_GRADIENT = "def f(float(B,K) X, float(B,N) G) -> (W) { W(k,n) +=! X(b,k) * G(b,n) }"


def test_an_operand_a_blocks_rows_read_in_short_runs_is_copied_for_each_block_of_rows() -> None:
    """A block of 6 rows of `A^T B^T` reads 24 bytes of each row of A, rows 2 KB apart:
    A is copied below the loop over blocks of rows, once for all the blocks of columns
    that share it; where its runs are rows of 1 KB (A B), or its rows 280 bytes apart,
    it is read in place."""
    big = {"M": 512, "K": 512, "N": 512}
    assert _pack_marks(TRANSPOSED_BOTH, big) == ["pack:B^T", "pack:A"]
    text = _lower(TRANSPOSED_BOTH, big).schedule.get_root().to_str()
    # below the outer copy of B: the rows' loop, then A's copy, then the columns' loop
    assert text.index('"pack:B^T"') < text.index('"pack:A"') < text.index('"register_tile')
    assert _pack_marks(TRANSPOSED_BOTH, {"M": 100, "K": 70, "N": 90}) == ["pack_once:B^T"]
    assert _pack_marks(MATMUL, big) == ["pack:B"]
    # a weight gradient's X(b,k), rows of 2 KB: X for each block of its rows k
    assert _pack_marks(WEIGHT_GRADIENT, {"B": 1024, "K": 512, "N": 512}) == ["pack:G", "pack:X"]


@pytest.mark.parametrize(
    ("source", "sizes", "copies"),
    [
        (TRANSPOSED_BOTH, {"M": 515, "K": 517, "N": 530}, ["pack:B^T", "pack:A"]),
        (WEIGHT_GRADIENT, {"B": 600, "K": 515, "N": 529}, ["pack:G", "pack:X"]),
    ],
    ids=["transposed_both", "weight_gradient"],
)
def test_operands_copied_for_each_block_of_rows_compute_the_reference(
    source: str, sizes: dict[str, int], copies: list[str]
) -> None:
    """With edges on every side (rows and columns past whole blocks, reductions past
    whole tiles), at fixed sizes and size-generic, NaN included."""
    cpu, reference = engines("cpu", source, quiet=True)
    first, second = _inputs(cpu, sizes, seed=3)
    first[5, -1] = np.nan  # the last row of the block at the rows' edge
    assert _pack_marks(source, sizes) == copies
    want = reference.run("f", first, second)
    for generic in (False, True):
        options = MappingOptions.cpu().replace(fix_parameters_before_scheduling=not generic)
        got = cpu.run("f", first, second, options=options)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=f"generic {generic}")
        assert np.isnan(got[-1]).all() and not np.isnan(got[:-1]).any()


def test_only_tensors_read_affinely_and_not_written_are_packed() -> None:
    gather = (
        "def f(float(E,D) T, int32(B) I, float(D,F) W) -> (O) { O(b,f) +=! T(I(b),d) * W(d,f) }"
    )
    assert _pack_marks(gather, {"E": 50, "D": 40, "B": 100, "F": 600}, pack_operands=True) == [
        "pack:W"
    ]
    guarded = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! m > 2 ? A(m,k) * B(k,n) : 0 }"
    assert _pack_marks(guarded, {"M": 20, "K": 30, "N": 40}, pack_operands=True) == []
    # one-dimensional tensors are one run already
    axpy = "def f(float(N) X, float(N) Y) -> (Z) { Z(i) = 2 * X(i) + Y(i) }"
    assert _pack_marks(axpy, {"N": 4096}, pack_operands=True) == []


def _tree(parallel_above: bool) -> str:
    """A tiled nest of `S0[n, k]`, its parallel mark above or below the point loops."""
    point = '{ schedule: "[{ S0[n, k] -> [(n mod 16)] }, { S0[n, k] -> [(k)] }]" }'
    below = f'{{ mark: "omp_parallel@1", child: {point} }}'
    inner = point if parallel_above else below
    tile = f'schedule: "[{{ S0[n, k] -> [(n - (n) mod 16)] }}]", child: {inner}'
    band = (
        f'{{ mark: "omp_parallel@0", child: {{ {tile} }} }}' if parallel_above else f"{{ {tile} }}"
    )
    return f'{{ domain: "{{ S0[n, k] : 0 <= n < 64 and 0 <= k < 64 }}", child: {band} }}'


def test_no_copy_above_a_worksharing_loop() -> None:
    """Each thread copies into its own buffer: a copy above the loop the threads share
    would leave the others reading what one thread copied."""
    from tcpy.mapping.cpu.packing import pack_operands

    source = "def f(float(N,K) A) -> (S) { S(n,k) = 2 * A(n,k) }"
    scop = _lower(source, {"N": 64, "K": 64}).scop
    on = MappingOptions.cpu().replace(pack_operands=True)
    for above, want in ((True, ["pack:A"]), (False, [])):
        schedule = isl.Schedule(_tree(above), scop.ctx)
        text = pack_operands(schedule, scop, on).get_root().to_str()
        assert re.findall(r'mark: "(pack:[^"]*)"', text) == want


def test_the_packed_kernel_reads_its_buffers() -> None:
    text = _lower(MATMUL, {"M": 64, "K": 48, "N": 80}, pack_operands=True).source
    assert "aligned_alloc(64, (size_t)tc_threads * " in text
    assert "char *tc_mine = tc_arena + (size_t)omp_get_thread_num() * " in text
    assert "char *tc_shared = tc_arena + (size_t)tc_threads * " in text
    assert "free(tc_arena);" in text
    update = next(ln for ln in text.splitlines() if "tc_reg[c" in ln and "] + (" in ln)
    assert "tc_pack1_rows[" in update and "tc_pack0[" in update  # A's copy by its rows
    assert "t_A[" not in update and "t_B[" not in update
    # B's copy (all of B) is made once, shared out among the threads, who wait for
    # each other before the nest's worksharing loop; A's in the tile's scope
    shared = text.index("float *restrict tc_pack0 = (float *)(tc_shared + 0);")
    copy = text.index("#pragma omp for schedule(static) nowait", shared)
    wait = text.index("tc_barrier(&tc_team_barrier", copy)
    assert wait < text.index("#pragma omp for schedule(guided)", copy)
    assert text.index("(float *)(tc_mine + ") < text.index("float tc_reg[")
    serial = _lower(MATMUL, {"M": 64, "K": 48, "N": 80}, pack_operands=True, parallel=False)
    assert "char *tc_mine = tc_arena;" in serial.source
    assert "char *tc_shared = tc_arena + 1 * " in serial.source
    assert "omp_get_thread_num" not in serial.source and "omp for" not in serial.source


def test_a_convolutions_filters_are_copied_once_and_its_blocks_added_in() -> None:
    """A strided convolution whose output channels are whole vectors runs them as its
    vector loop: the filters' box is the same for every row of output, so it is copied
    once, above the nest, by the threads together into a buffer they share; the image,
    read by broadcast, is read in place; each block of 6 pixels x 16 channels (rows of
    the output far apart) starts at zero and is added into the output at the end,
    channel after channel, never loaded first (here each output's whole reduction runs
    in its block, so the output's initialisation is left out: `0.0f + tc_reg`).
    Results as the reference's, and the same on 1, 2 and 3 threads."""
    source = STRIDED_CONV
    sizes = {"N": 2, "C": 4, "H": 17, "W": 29, "F": 32, "KH": 3, "KW": 3}
    lowered = _lower(source, sizes)
    tree = lowered.schedule.get_root().to_str()
    assert _pack_marks(source, sizes) == ["pack_once:K^T3"]  # no copy of I
    assert "register_tile:fresh/across/" in tree
    text = lowered.source
    shared = text.index("float *restrict tc_pack0 = (float *)(tc_shared + 0);")
    copy = text.index("#pragma omp for schedule(static) nowait", shared)
    assert "tc_pack0[" in text[copy : text.index("tc_barrier(&tc_team_barrier", copy)]
    assert re.search(r"tc_reg\[c\d+\]\[c\d+\] = 0\.0f;", text)
    assert re.search(r"t_O\[[^;]*\] = 0\.0f \+ tc_reg\[", text)
    assert "[initialisation]" not in text
    assert not re.search(r"tc_reg\[c\d+\]\[c\d+\] = t_O\[", text)
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=5)
    want = reference.run("f", *inputs)
    runs = [
        cpu.run("f", *inputs, options=MappingOptions.cpu().replace(threads=n)) for n in (1, 2, 3)
    ]
    np.testing.assert_allclose(runs[0], want, rtol=1e-5)
    for got in runs[1:]:
        np.testing.assert_array_equal(got, runs[0])


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ({"N": 1, "C": 96, "H": 30, "W": 30, "F": 64}, "pack:K^T3"),
        ({"N": 1, "C": 96, "H": 30, "W": 30, "F": 72}, "pack_once:K^T3"),
        # 442 KB: the images split among the tiles, the input channels in two
        ({"N": 2, "C": 384, "H": 9, "W": 9, "F": 32}, "pack:K^T3"),
    ],
    ids=["blocks", "not-whole-blocks", "split"],
)
def test_filters_larger_than_a_threads_buffers(  # type: ignore[no-untyped-def]
    vector_width, sizes: dict[str, int], expected: str
) -> None:
    """Filters of 64 x 96 x 3 x 3 (216 KB, more than a thread's copy, `PACK_BYTES`)
    are tiled by blocks of 16 output channels (two vectors of 8), each tile's filters
    copied with rows of 16 (`[c][kh][kw][16]`), the blocks of channels the outermost
    loop the threads share; 72 channels (not whole blocks) are copied once above the
    nest (`ONCE_BYTES`), so the output channels stay the vector loop either way.
    Results as the reference's."""
    vector_width("256")  # blocks of 16 channels
    source = STRIDED_CONV.replace("2*", "")
    sizes = {**sizes, "KH": 3, "KW": 3}
    assert _pack_marks(source, sizes) == [expected]
    text = _lower(source, sizes).source
    blocked = expected.startswith("pack:")
    assert bool(re.search(r"tc_pack0\[[^=]*\* 16 \+ \(tc_i0\)\)\] = t_K\[", text)) is blocked
    if blocked:  # the tile's image rows (7) inside it: its copy made once per tile
        nest = text[text.rindex("* K(f,c,kh,kw) */") :]  # the contraction's nest
        rows = re.search(r"for \(int64_t (c\d+) = 0; \1 <= 6; \1\+\+\)", nest)
        assert sizes["H"] != 9 or (rows and nest.index("tc_pack0 = ") < rows.start()), nest
    if blocked and sizes["N"] == 1:  # the blocks of channels the loop the threads share
        nest = text[text.rindex("* K(f,c,kh,kw) */") :]  # the contraction's nest
        first = (
            rf"#pragma omp for[^\n]*\n\s*for \(int64_t c0 = 0; c0 <= {sizes['F'] - 1}; c0 \+= 16\)"
        )
        assert re.search(first, nest)
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=7)
    np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=1e-5)


def test_rows_of_a_copy_made_once_that_alias_in_the_cache_are_padded() -> None:
    """Filters of 128 output channels, copied once with the channels innermost, make
    rows of 512 bytes, whose reads by a block alias in the cache: each row is held
    with a cache line more (144 floats); rows of 64 channels (256 bytes) are not.
    Results as the reference's."""
    source = STRIDED_CONV.replace("2*", "")
    sizes = {"N": 1, "C": 32, "H": 30, "W": 30, "F": 128, "KH": 3, "KW": 3}
    assert _pack_marks(source, sizes) == ["pack_once:K^T3"]
    text = _lower(source, sizes).source
    assert re.search(r"tc_pack0\[[^=]*\* 144 \+ \(tc_i0\)\)\] = t_K\[", text)
    assert "* 144 + ((c" in text  # the reads of the block too
    narrow = _lower(source, {**sizes, "C": 64, "F": 64}).source
    assert re.search(r"tc_pack0\[[^=]*\* 64 \+ \(tc_i0\)\)\] = t_K\[", narrow)
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=8)
    np.testing.assert_allclose(cpu.run("f", *inputs), reference.run("f", *inputs), rtol=1e-5)


def test_pack_operands_is_validated_and_tuned() -> None:
    with pytest.raises(TCMappingError, match="pack_operands"):
        MappingOptions(pack_operands=1)  # type: ignore[arg-type]
    assert MappingOptions.from_json('{"pack_operands": null}').pack_operands is None
    assert MappingOptions.from_json(MappingOptions(pack_operands=True).to_json()).pack_operands
    from tcpy.genetic.space import build_space

    (cdef,) = check_source(MATMUL).values()
    space = build_space(cdef, {"M": 64, "K": 48, "N": 80}, "cpu", MappingOptions.cpu())
    (gene,) = [g for g in space.genes if g.name == "pack_operands"]
    assert set(gene.alleles) == {None, True, False}


def test_a_failed_allocation_is_a_launch_error() -> None:
    with pytest.raises(TCLaunchError, match="packed tiles"):
        check_status(STATUS_OUT_OF_MEMORY)


# --- packed kernels compute the reference -------------------------------------------------

TILES = [(), (8, 16, 4), (5, 7, 3), (32, 32, 32)]


@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_packed_contractions_compute_the_reference(name: str, tile: tuple[int, ...]) -> None:
    source, size_sets = CONTRACTIONS[name]
    cpu, reference = engines("cpu", source, quiet=True)
    for k, sizes in enumerate(size_sets):
        inputs = _inputs(cpu, sizes, seed=k)
        want = reference.run("f", *inputs)
        for generic in (False, True):
            options = MappingOptions.cpu().replace(
                pack_operands=True, tile=tile, fix_parameters_before_scheduling=not generic
            )
            got = cpu.run("f", *inputs, options=options)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=str(sizes))


def test_packed_large_matmul_computes_the_reference() -> None:
    """At a size the default packs (rows of 4 KB), with edges on every side."""
    cpu, reference = engines("cpu", MATMUL, quiet=True)
    sizes = {"M": 67, "K": 1030, "N": 1025}
    assert _pack_marks(MATMUL, sizes) == ["pack:A,B"]
    a, b = _inputs(cpu, sizes, seed=5)
    np.testing.assert_allclose(cpu.run("f", a, b), reference.run("f", a, b), rtol=1e-4, atol=1e-3)


def test_nan_reaches_the_output_through_a_packed_tile() -> None:
    cpu, _ = engines("cpu", MATMUL, quiet=True)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((9, 33)).astype(np.float32)
    b = rng.standard_normal((33, 17)).astype(np.float32)
    a[4, 20] = np.nan
    b[7, 3] = np.inf
    got = cpu.run("f", a, b, options=MappingOptions.cpu().replace(pack_operands=True))
    with np.errstate(invalid="ignore"):
        want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[4]).all()


def test_packed_kernels_serve_every_shape_when_generic() -> None:
    cpu, reference = engines("cpu", MATMUL, quiet=True)
    options = MappingOptions.cpu().replace(
        pack_operands=True, fix_parameters_before_scheduling=False
    )
    for sizes in ({"M": 40, "K": 300, "N": 70}, {"M": 3, "K": 5, "N": 600}):
        a, b = _inputs(cpu, sizes, seed=1)
        got = cpu.run("f", a, b, options=options)
        np.testing.assert_allclose(got, reference.run("f", a, b), rtol=1e-5, atol=1e-4)
    compiled = cpu.compile("f", a, b, options=options)
    assert compiled.generic and "tc_pack0[" in compiled.source


def test_a_copy_inside_the_innermost_tile_loop_is_not_hoisted() -> None:
    """With tiles of one iteration the copy loops are the only loops inside the last
    tile loop; the reads they make change with it and must stay inside."""
    cpu, reference = engines("cpu", MATMUL, quiet=True)
    sizes = {"M": 4, "K": 16, "N": 12}
    a, b = _inputs(cpu, sizes, seed=2)
    for parallel in (False, True):
        options = MappingOptions.cpu().replace(
            pack_operands=True, tile=(1, 1, 1), parallel=parallel
        )
        assert _pack_marks(MATMUL, sizes, pack_operands=True, tile=(1, 1, 1)) == ["pack:A,B"]
        got = cpu.run("f", a, b, options=options)
        np.testing.assert_allclose(got, reference.run("f", a, b), rtol=1e-5, atol=1e-4)


def test_a_footprint_isl_cannot_bound_is_not_packed() -> None:
    """Found by the fuzzer: a strided access under skewed tiles gave an extent isl's
    maximum refused (`isl_pw_aff_max_val`); the tensor is left in place."""
    source = """def f(float(M, 5, S) O) -> (do, inline) {
        do(kw, i, b) max=! O(2*b + restrict, r, i) where restrict in 0:1, kw in 0:M
        inline(extern, p0) = min(max((O(p0, p0, p0) - do(p0, extern, extern)), (-100.0)), 100.0)
        inline(nan, h) max= min(max(do(nan, 25, h), (-9.0)), 9.0)
    }"""
    options = MappingOptions.cpu().replace(
        intra_tile_schedule_fusion=Fusion.MIN,
        outer_schedule_fusion=Fusion.PRESERVE3_COINCIDENT,
        allow_skewing=True,
        positive_orthant=False,
        fix_parameters_before_scheduling=False,
        tile=(3, 64, 4),
        unroll=16,
        register_tile=(16,),
        vectorize=False,
    )
    cpu, reference = engines("cpu", source, quiet=True)
    rng = np.random.default_rng(0)
    o = rng.standard_normal((17, 5, 31)).astype(np.float32)
    for got, want in zip(cpu.run("f", o, options=options), reference.run("f", o), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


# --- copies with the dimensions reversed --------------------------------------------------

DOT_ROWS = "def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
PROJECTION = "def f(float(S,D) X, float(T,H,E,D) W) -> (O) { O(t,h,s,e) +=! X(s,d) * W(t,h,e,d) }"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (DOT_ROWS, {"B"}),
        (MATMUL, set()),  # B(k,n) is read along n already
        # B read twice by the statement: both reads come from the one transposed copy
        ("def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) * B(n,k) }", {"B"}),
        # C's rows are n: A is the one read across them
        ("def f(float(M,K) A, float(N,K) B) -> (C) { C(n,m) +=! A(m,k) * B(n,k) }", {"A"}),
        ("def f(float(M,K) A, float(N,K) B) -> (C) { C(m,n) max=! A(m,k) * B(n,k) }", set()),
        (  # the mlp of the benchmark
            """def f(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
                O(b, n) +=! I(b, k) * W(n, k)
                O(b, n) = fmax(O(b, n) + bias(n), 0)
            }""",
            {"W"},
        ),
        # a matrix-vector product reads each element of A once: no copy pays
        ("def f(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }", set()),
        # a projection to four dimensions: W(t,h,e,d) held as (d,t,h,e)
        (PROJECTION, {"W"}),
        # e is not W's second-to-last dimension: no copy makes it unit-stride
        (
            "def f(float(S,D) X, float(E,H,D) W) -> (O) { O(h,s,e) +=! X(s,d) * W(e,h,d) }",
            set(),
        ),
    ],
)
def test_which_inputs_are_copied_transposed(source: str, expected: set[str]) -> None:
    (cdef,) = check_source(source).values()
    sizes = {s: 300 for s in cdef.size_symbols}
    marks = _pack_marks(source, sizes)
    assert {
        t[:-2] for m in marks for t in m.split(":")[1].split(",") if t.endswith("^T")
    } == expected
    assert not any("^T" in m for m in _pack_marks(source, sizes, pack_operands=False))


@pytest.mark.parametrize(
    ("sizes", "tile", "expected"),
    [
        ({"M": 70, "K": 600, "N": 300}, (), "pack"),
        # a tile of 256 x 512 (512 KB) too large for a thread: the whole of B, once
        ({"M": 70, "K": 600, "N": 300}, (64, 256, 512), "pack_once"),
        # the whole of B (17.6 MB) too large for the copies made once as well
        ({"M": 6, "K": 2100, "N": 2100}, (64, 256, 512), None),
    ],
    ids=["fits", "tile-too-large", "too-large"],
)
def test_a_transposed_copy_that_cannot_be_placed_leaves_the_nest_as_it_was(
    sizes: dict[str, int], tile: tuple[int, ...], expected: str | None
) -> None:
    """A tile of B too large for the thread's buffers is copied once above the nest,
    whole, where it fits ONCE_BYTES; where it does not, B is not copied, and the nest is
    then mapped as if no copy were planned: k stays its vector loop (n would gather)."""
    marks = _pack_marks(DOT_ROWS, sizes, tile=tile)
    assert [m.split(":")[0] for m in marks if "B^T" in m] == ([expected] if expected else [])
    assert ONCE_BYTES < 2100 * 2100 * 4
    cpu, reference = engines("cpu", DOT_ROWS, quiet=True)
    inputs = _inputs(cpu, sizes, seed=len(tile))
    options = MappingOptions.cpu().replace(tile=tile)
    got = cpu.run("f", *inputs, options=options)
    np.testing.assert_allclose(got, reference.run("f", *inputs), rtol=1e-5)


@pytest.mark.parametrize("tile", [(), (1, 2, 24, 8, 40)], ids=["auto", "partial"])
def test_a_copy_with_the_innermost_dimension_first_is_right(tile: tuple[int, ...]) -> None:
    """W(t,h,e,d) copied as (d,t,h,e) tiles, none of which the sizes divide (the
    `partial` tiles hold several heads and parts of e), gives the reference's result;
    without copies too."""
    sizes = {"S": 37, "D": 100, "T": 3, "H": 5, "E": 27}
    assert any("W^T" in m for m in _pack_marks(PROJECTION, sizes, tile=tile))
    cpu, reference = engines("cpu", PROJECTION, quiet=True)
    inputs = _inputs(cpu, sizes, seed=3)
    want = reference.run("f", *inputs)
    for pack in (None, False):
        options = MappingOptions.cpu().replace(tile=tile, pack_operands=pack)
        np.testing.assert_allclose(cpu.run("f", *inputs, options=options), want, rtol=1e-5)


# --- copies held in phases ----------------------------------------------------------------

STRIDED_CONV = """def f(float(N,C,H,W) I, float(F,C,KH,KW) K) -> (O) {
    O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * K(f,c,kh,kw)
}"""
CONV_SIZES = {"N": 2, "C": 16, "H": 33, "W": 65, "F": 10, "KH": 3, "KW": 3}
"""Filters of no whole number of vectors: with whole vectors, a strided convolution runs
its output channels as the vector loop instead (`channel_vectors`, tested below)."""


def _phased(marks: list[str]) -> set[str]:
    return {t for m in marks for t in m.split(":")[1].split(",") if "%" in t}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (STRIDED_CONV, {"I%2"}),
        (STRIDED_CONV.replace("2*", "3*"), {"I%3"}),
        (STRIDED_CONV.replace("2*", ""), set()),  # unit stride: the copy stays as it is
        # the rows are strided, the vector loop's reads are not
        (STRIDED_CONV.replace("2*w", "w"), set()),
        # shifted by one: the phase a read starts in is the shift's
        (STRIDED_CONV.replace("2*w+kw", "2*w+kw+1"), {"I%2"}),
        # every read at even positions: a slice of its box, copied in neither form
        (STRIDED_CONV.replace("2*w+kw", "2*w+2*kw"), set()),
        # two strides along the vector loop: no layout serves both
        (
            STRIDED_CONV.replace("* K(f,c,kh,kw)", "* K(f,c,kh,kw) * I(n,c,h+kh,w+kw)"),
            set(),
        ),
    ],
)
def test_which_copies_are_held_in_phases(source: str, expected: set[str]) -> None:
    """A copy whose vector loop reads its rows at one stride of 2 or more holds each
    row's phases one after the other; other copies are as they were."""
    sizes = {**CONV_SIZES, "H": 40, "W": 200}
    assert _phased(_pack_marks(source, sizes)) == expected


@pytest.mark.parametrize(
    ("edit", "sizes"),
    [
        ({}, CONV_SIZES),
        ({}, {**CONV_SIZES, "W": 66, "H": 21}),  # rows of an even length: phases of 33
        ({"2*": "3*"}, {**CONV_SIZES, "W": 195, "KW": 4}),  # a window wider than the stride
        ({"2*w+kw": "2*w+kw+1"}, {**CONV_SIZES, "W": 66}),  # shifted by one
        ({}, {**CONV_SIZES, "N": 1, "C": 3, "W": 200, "F": 34}),  # rows split into tiles
    ],
    ids=["odd", "even", "stride3", "shifted", "tiled"],
)
def test_a_copy_held_in_phases_gives_the_reference(
    edit: dict[str, str], sizes: dict[str, int]
) -> None:
    """Strided convolutions whose input is copied in phases (odd and even rows, phases
    of unequal length, windows wider than the stride, a constant shift, rows longer
    than one tile) give the reference's result, with and without the copies."""
    source = STRIDED_CONV
    for old, new in edit.items():
        source = source.replace(old, new)
    assert _phased(_pack_marks(source, sizes))
    cpu, reference = engines("cpu", source, quiet=True)
    inputs = _inputs(cpu, sizes, seed=len(edit))
    want = reference.run("f", *inputs)
    for pack in (None, False):
        got = cpu.run("f", *inputs, options=MappingOptions.cpu().replace(pack_operands=pack))
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_phased_copy_reads_unit_stride_in_the_vector_loop(vector_width) -> None:  # type: ignore[no-untyped-def]
    """The printed kernel fills each phase from the tensor's every other element and
    reads it with the vector loop's iterator alone, without a factor: the load is a
    vector's, not a gather's (the stride-2 read ran 2x slower)."""
    vector_width("512")  # the vectors of 16 lanes it was written for
    source = _lower(STRIDED_CONV, CONV_SIZES).source
    assert "tc_p < 2" in source
    loads = re.findall(r"tc_pack0\[[^;]*tc_floord[^;]*\]\s*\*", source)  # full and edge blocks
    vector = re.findall(r"#pragma omp simd\n\s*for \(int64_t (c\d+) = ", source)[-1]
    assert loads and all(f"+ ({vector})" in ld and f"2 * ({vector})" not in ld for ld in loads)
