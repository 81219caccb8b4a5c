"""The CPU's tile sizes chosen from the loop extents (`tcpy.mapping.cpu.tiles`)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tcpy import knobs
from tcpy.mapping.cpu import tiles
from tcpy.mapping.cpu.strategy import cpu_defaults
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c

from differential import engines

COLUMN_SUMS = """def colsum(float(N, D) X, float(N) s) -> (Y) {
    Y(d) +=! X(n, d) * s(n)
}"""


def _vector_tile(cores: int, n: int, d: int, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(knobs, "cores", lambda: cores)
    cdef = check_source(COLUMN_SUMS)["colsum"]
    source = lower_to_c(cdef, {"N": n, "D": d}, cpu_defaults(cdef)).source
    nest = source[source.rindex("* s(n) */") :]  # the reduction's, not its initialisation's
    steps = re.findall(rf"c0 <= {d - 1}; c0 \+= (\d+)\)", nest)
    assert len(steps) == 1, source
    return int(steps[0])


@pytest.mark.parametrize(
    ("cores", "d", "tile"),
    [(2, 1024, 512), (2, 768, 384), (4, 768, 192), (2, 200, 112), (3, 100, 48)],
)
def test_a_column_sums_columns_are_one_tile_per_core(
    cores: int, d: int, tile: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column sum's columns are its only parallel loop: each core's share is one
    tile (a multiple of 16), so that each row's slice is one long run (768 columns in
    3 tiles of 256 would also leave one of 2 cores idle a third of the time)."""
    assert _vector_tile(cores, 512, d, monkeypatch) == tile


@pytest.mark.parametrize(
    ("cores", "d", "tile"), [(2, 20000, 2048), (2, 16384, 4096), (4, 40000, 2048)]
)
def test_wide_column_shares_are_cut_into_tiles_that_keep_every_core_busy(
    cores: int, d: int, tile: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 4096 columns a core's share is cut (its slice of the outputs stays in L1),
    halved until the tiles share out evenly: 20000 columns in 5 tiles of 4096 would
    leave one of 2 cores idle a fifth of the time."""
    assert _vector_tile(cores, 64, d, monkeypatch) == tile


def test_column_sums_in_shared_tiles_compute_the_reference() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 768)).astype(np.float32)
    s = rng.standard_normal(64).astype(np.float32)
    want = (x * s[:, None]).sum(axis=0)
    engine, reference = engines("cpu", COLUMN_SUMS)
    np.testing.assert_allclose(reference.colsum(x, s), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(engine.colsum(x, s), want, rtol=1e-4, atol=1e-4)


WEIGHT_GRADIENT = """def dw(float(N, C, H, W) I, float(N, F, P, Q) d_O) -> (d_W) {
    d_W(f, c, kh, kw) +=! d_O(n, f, h, w) * I(n, c, h + kh, w + kw)
        where kh in 0:3, kw in 0:3
}"""


def test_a_lane_reductions_short_reduction_runs_inside_its_register_block() -> None:
    """A convolution's weight gradient sums over the images `n` (8), the rows and the
    columns, the columns in vector lanes: the images run inside the register block,
    so that the block is loaded and stored once per tile of filters and channels
    rather than once per image (the gradient 4% faster)."""
    cdef = check_source(WEIGHT_GRADIENT)["dw"]
    sizes = {"N": 8, "C": 16, "H": 32, "W": 32, "F": 32, "P": 30, "Q": 30}
    source = lower_to_c(cdef, sizes, cpu_defaults(cdef)).source
    block = source[source.index("tc_reg[") :]
    assert re.search(r"for \(int64_t c\d+ = 0; c\d+ <= 7; c\d+\+\+\)", block), source
    rng = np.random.default_rng(0)
    i = rng.standard_normal((8, 16, 32, 32)).astype(np.float32)
    d_o = rng.standard_normal((8, 32, 30, 30)).astype(np.float32)
    engine, reference = engines("cpu", WEIGHT_GRADIENT)
    np.testing.assert_allclose(engine.dw(i, d_o), reference.dw(i, d_o), rtol=1e-4, atol=1e-3)


MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def _rows_tile(cores: int, m: int, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(knobs, "cores", lambda: cores)
    cdef = check_source(MATMUL)["mm"]
    source = lower_to_c(cdef, {"M": m, "K": 300, "N": 200}, cpu_defaults(cdef)).source
    nest = source[source.rindex("* B(k,n) */") :]
    (step,) = re.findall(rf"c0 <= {m - 1}; c0 \+= (\d+)\)", nest)
    return int(step)


@pytest.mark.parametrize(
    ("bits", "cores", "m", "tile"),
    [
        ("512", 2, 800, 400),  # not 256 + 256 rows for one core and 256 + 32 for the other
        ("512", 2, 600, 304),
        ("512", 2, 2048, 512),
        ("512", 2, 1000, 504),  # 504 and 496
        ("512", 4, 800, 200),
        ("512", 2, 384, 192),
        ("512", 2, 40, 32),  # at least OUTER_TILE: a tile copies its operands again
        # blocks of 6 rows with 16 vector registers: whole blocks in every tile
        ("256", 2, 800, 402),
        ("256", 2, 600, 300),
        ("256", 2, 2048, 516),  # 4 tiles, one block past 512 rather than 5 tiles
        ("256", 4, 800, 204),
        ("256", 2, 40, 36),  # OUTER_TILE rounded up to whole blocks
    ],
)
def test_a_contractions_rows_are_cut_into_equal_tiles_for_the_cores(
    bits: str, cores: int, m: int, tile: int, monkeypatch: pytest.MonkeyPatch, vector_width
) -> None:  # type: ignore[no-untyped-def]
    """A contraction's rows tile: as few tiles as can be of 512 rows at most, their
    number a multiple of the cores, of equal size (a multiple of the register block's
    rows: 8 with AVX-512, 6 below): the threads take equal runs of tiles, so equal
    rows, and every block of a tile is whole."""
    vector_width(bits)
    assert _rows_tile(cores, m, monkeypatch) == tile


def _balance_tile_by_tile(
    rows: int, rows_tile: int, columns: int | None, columns_tile: int, cores: int, outer: int
) -> float:
    heights = [min(rows_tile, rows - r) for r in range(0, rows, rows_tile)]
    step = columns_tile if columns and columns_tile else (columns or 1)
    widths = [min(step, columns - c) for c in range(0, columns, step)] if columns else [1]
    work = [h * w for _ in range(outer) for h in heights for w in widths]
    share, extra = divmod(len(work), cores)
    loads, start = [], 0
    for core in range(cores):
        end = start + share + (core < extra)
        loads.append(sum(work[start:end]))
        start = end
    return sum(work) / cores / max(loads)


def test_the_balance_of_the_tiles_is_the_static_schedules() -> None:
    """`_balance`, computed from sums, agrees with the tiles dealt out one by one in
    OpenMP's static runs; and a contraction of a million rows and columns under a
    million outer iterations gets its tile without dealing them out."""
    rng = np.random.default_rng(7)
    for _ in range(500):
        case = (
            int(rng.integers(1, 900)),
            int(rng.choice([8, 32, 64, 200, 256, 512])),
            None if rng.random() < 0.2 else int(rng.integers(1, 700)),
            int(rng.choice([0, 16, 64, 128])),
            int(rng.integers(2, 7)),
            int(rng.integers(1, 8)),
        )
        assert tiles._balance(*case) == pytest.approx(_balance_tile_by_tile(*case), rel=1e-12)
    assert tiles._rows_tile(10**6, 10**6, 128, 10**6) == 512
