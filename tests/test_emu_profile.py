"""Traffic counters and checking of generated kernels on `cuda-emu`, through the
engine (`Compiled.profile`), the CLI (`tcpy run --profile`) and their errors. The
counts expected here follow from the definitions' shapes alone: bytes requested are
the elements each statement touches, and a warp of 32 lanes reading 32 consecutive
floats touches 4 sectors while lanes 256 bytes apart touch one sector each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.cli import main
from tcpy.mapping.options import MappingOptions
from tcpy.runtime import profile

from programs import CONV, MATMUL

COPY = """
def copy(float(N,M) I) -> (O) {
    O(i,j) = I(i,j)
}
def transpose(float(N,M) I) -> (O) {
    O(j,i) = I(i,j)
}
"""


def _engine(check: bool | None = None) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=check)
    engine.define(COPY)
    return engine


def _one(launches: list[dict[str, int]]) -> dict[str, int]:
    (launch,) = launches
    return launch


def test_profile_of_a_copy_is_coalesced() -> None:
    x = np.random.default_rng(0).standard_normal((16, 64), dtype=np.float32)
    compiled = _engine().compile("copy", x)
    launch = _one(compiled.profile(x))
    assert launch["global_load_bytes"] == launch["global_store_bytes"] == x.nbytes
    # every request of 32 lanes covers 128 consecutive bytes: 4 sectors
    assert launch["global_sectors"] * 32 == 2 * x.nbytes
    assert launch["global_requests"] == 2 * x.nbytes // 128
    assert profile.efficiency(launch) == 1.0
    assert launch["shared_bytes"] == launch["barriers"] == launch["atomics"] == 0
    assert launch["kernel"] == "copy#0" and len(launch["grid"]) == len(launch["block"]) == 3


def test_profile_of_a_transpose_has_one_strided_side() -> None:
    """Whichever side the mapping makes coalesced, the other side's lanes are 64 floats
    apart: one sector per element there, an eighth of a sector per element on the
    coalesced side."""
    x = np.random.default_rng(1).standard_normal((64, 64), dtype=np.float32)
    compiled = _engine().compile("transpose", x)
    launch = _one(compiled.profile(x))
    np.testing.assert_array_equal(compiled(x), x.T)
    assert launch["global_sectors"] == x.size + x.size // 8
    assert launch["global_load_bytes"] == launch["global_store_bytes"] == x.nbytes
    assert profile.efficiency(launch) == 2 * x.nbytes / (32 * (x.size + x.size // 8))


def test_plain_build_profiles_through_its_instrumented_twin() -> None:
    x = np.random.default_rng(2).standard_normal((16, 64), dtype=np.float32)
    plain = _engine(check=False).compile("copy", x)
    assert "TC_LD(" in plain.source
    checked = _engine(check=True).compile("copy", x)
    assert plain.profile(x) == checked.profile(x)
    np.testing.assert_array_equal(plain(x), x)


def test_profile_needs_the_emulator() -> None:
    engine = tcpy.ExecutionEngine("reference")
    engine.define(COPY)
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(tcpy.TCError, match="cuda-emu"):
        engine.compile("copy", x).profile(x)


def test_emu_check_is_an_option_of_the_emulator_only() -> None:
    with pytest.raises(tcpy.TCError, match="emu_check"):
        tcpy.ExecutionEngine("cpu", emu_check=True)


def test_minimum_bytes_and_table() -> None:
    a, b = np.zeros((4, 8), np.float32), np.zeros(3, np.float64)
    assert profile.minimum_bytes([a], [b]) == 128 + 24
    launch = {
        "kernel": "k#0", "grid": (2, 1, 1), "block": (32, 1, 1), "global_load_bytes": 256,
        "global_store_bytes": 0, "global_requests": 2, "global_sectors": 16, "shared_bytes": 0,
        "bank_conflicts": 0, "barriers": 0, "shuffles": 0, "atomics": 0,
        "distinct_load_sectors": 8, "distinct_store_sectors": 0, "distinct_sectors": 8,
    }  # fmt: skip
    text = profile.table([launch], minimum=256)
    assert "0.500" in text  # 256 bytes asked for, 16 sectors of 32 moved
    assert "8.00" in text  # sectors per request
    # the two requests read the same 8 sectors: once from DRAM behind an L2
    assert text.splitlines()[-1] == (
        "total: 512 bytes moved, 256 DRAM bytes, 256 the definition must move "
        "(moved 2.00x, DRAM 1.00x)"
    )
    # an L2 smaller than the footprint keeps nothing: DRAM bytes are the moved bytes
    assert "total: 512 bytes moved, 512 DRAM bytes" in profile.table([launch], 256, l2_bytes=128)


def test_cli_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "copy.tc"
    f.write_text(COPY)
    argv = ["run", str(f), "--entry", "copy", "--sizes", "N=8,M=64", "--target", "cuda-emu"]
    assert main([*argv, "--profile"]) == 0
    out = capsys.readouterr().out
    assert "efficiency" in out and "copy#0" in out
    assert "total: 4096 bytes moved, 4096 DRAM bytes, 4096 the definition must move" in out
    assert main(["run", str(f), "--entry", "copy", "--target", "cpu", "--profile"]) == 1
    assert "--target cuda-emu" in capsys.readouterr().err


def test_a_threads_outputs_in_registers_read_the_shared_operands_they_share_once() -> None:
    """A 64^3 matmul in 32x32 tiles: each thread reads A's and B's values from shared
    memory for each of its 4 outputs and each k (2 x 4 x 64^3 / 4 reads), or, with its
    outputs in registers, B's value once for all 4 (5 reads for 4 outputs)."""
    engine = tcpy.ExecutionEngine("cuda-emu")
    engine.define(MATMUL)
    a = np.ones((64, 64), np.float32)
    shared = {}
    for private in (False, True):
        options = MappingOptions.cuda().replace(use_private_memory=private)
        launches = engine.compile("mm", a, a, options=options).profile(a, a)
        copies = 4 * (32 * 64 + 64 * 32)  # 2 x 2 blocks each store A's and B's tiles
        shared[private] = sum(launch["shared_bytes"] for launch in launches) // 4 - copies
    assert shared == {False: 2 * 64**3, True: 64**3 * 5 // 4}


def test_shared_copies_read_16_byte_vectors_where_the_rows_start_on_one() -> None:
    """A 64^3 matmul in 32x32 tiles copies 16384 elements of A and B into shared
    memory: one warp request per 32 elements, or with `vectorize` per 32 float4s; C
    is loaded and stored once (256 requests). The bytes and sectors are the same, and
    the rotated stores meet no bank conflict. An A one element into its buffer (not on
    16 bytes; the profile copies its inputs to aligned buffers, a call does not) or
    rows of 45 elements are copied element by element, and still right."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define(MATMUL)
    rng = np.random.default_rng(0)
    buffer = rng.standard_normal(64 * 64 + 1).astype(np.float32)
    aligned, shifted = buffer[:-1].reshape(64, 64), buffer[1:].reshape(64, 64)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    requests = {}
    for vectorize in (False, True):
        options = MappingOptions.cuda().replace(vectorize=vectorize)
        kernel = engine.compile("mm", aligned, b, options=options)
        for a in (aligned, shifted):  # the checker fails a vector load off 16 bytes
            np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
        update = kernel.profile(aligned, b)[1]
        assert update["global_sectors"] == 3072 and update["bank_conflicts"] == 0
        requests[vectorize] = update["global_requests"]
    assert requests == {False: 256 + 16384 // 32, True: 256 + 16384 // 128}
    odd = rng.standard_normal((64, 45)).astype(np.float32)
    kernel = engine.compile("mm", odd, odd.T.copy(), options=MappingOptions.cuda())
    np.testing.assert_allclose(kernel(odd, odd.T.copy()), odd @ odd.T, rtol=1e-4, atol=1e-4)
    assert "TC_LDV(float4, t_A" not in kernel.source  # rows of 45 are not whole vectors


@pytest.mark.parametrize("k", [256, 200])
def test_a_threads_outputs_are_held_in_registers_across_the_tiles_of_k(k: int) -> None:
    """A 64x64 matmul copies its operands in tiles of 64 values of k. The outputs each
    thread keeps in registers are loaded and stored once (private_depth 0, the
    default), or once per tile of k (a depth below the tile loop): 64x64 floats of C
    each way, or that times the tiles (4, the last one partial at k = 200). Right
    either way, under the emulator's checks."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define(MATMUL)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, k)).astype(np.float32)
    b = rng.standard_normal((k, 64)).astype(np.float32)
    c_bytes = {}
    for depth in (0, 3):
        options = MappingOptions.cuda().replace(private_depth=depth)
        kernel = engine.compile("mm", a, b, options=options)
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
        update = kernel.profile(a, b)[1]
        operands = 4 * (a.size + b.size) * 2  # 2x2 blocks: each reads a strip of A and B
        assert update["global_load_bytes"] - operands == update["global_store_bytes"]
        c_bytes[depth] = update["global_store_bytes"]
    assert c_bytes == {0: 64 * 64 * 4, 3: 4 * 64 * 64 * 4}


@pytest.mark.parametrize(
    ("register_tile", "runs", "requests"), [((8, 2), 2, 768), ((2, 4), 4, 832)]
)
def test_a_threads_adjacent_outputs_move_as_vectors(
    register_tile: tuple[int, int], runs: int, requests: int
) -> None:
    """With a register tile of 2 or 4 outputs per thread along x, each thread's are
    adjacent: C is loaded and stored, and B read from shared memory, a float2 or float4
    at a time. At 128x128x64 every warp request then moves 32 vectors: C's 64 KB each
    way in 256-byte (float2) or 512-byte (float4) requests, plus the float4 copies of
    the tiles of A and B (64x64 and 64x64 per block of 64x64 outputs, 16x64 and 64x128
    per block of 16x128: 256 and 576 requests of 512 bytes). Without `vectorize` the
    outputs are strided by the block and every access is scalar. Where the tiles do not
    divide N (130), the outputs stay strided. Right in every case, under the checks."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define(MATMUL)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    for n, vectorize, expected in ((128, True, runs), (128, False, 1), (130, True, 1)):
        b = rng.standard_normal((64, n)).astype(np.float32)
        options = MappingOptions.cuda().replace(register_tile=register_tile, vectorize=vectorize)
        kernel = engine.compile("mm", a, b, options=options)
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
        assert (f"TC_STV(float{runs}, t_C" in kernel.source) == (expected > 1)
        update = kernel.profile(a, b)[1]
        assert update["bank_conflicts"] == 0
        if n == 128:
            moved = update["global_load_bytes"] + update["global_store_bytes"]
            assert update["global_sectors"] == moved // 32
        if vectorize and n == 128:
            assert update["global_requests"] == requests


def test_the_channel_tile_shrinks_until_a_convolutions_input_fits_shared_memory() -> None:
    """A 3x3 convolution's input box spans every channel of the reduction's tile and
    the windows of the block's 16x32 outputs: 16 channels of 18x34 floats (39 KB, 35
    floats a row in the copy) fit 48 KB, but not a ring of two (`copy_stages`): the
    channel tile halves to 8, two stages of 8 channels (10,080 floats; 2 tiles, a
    barrier each and one after them, per block). In 12,000 bytes the channel tile
    halves until one buffer fits (4 channels: 2,520 floats, 4 tiles of 2 barriers per
    block, synchronous), and each block still reads its input box, weights and
    outputs once; where even 4 channels do not fit (1,000 bytes) the input is read
    from global memory, 9 times per element. Right every time, under the checks."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define(CONV)
    rng = np.random.default_rng(5)
    i = rng.standard_normal((1, 16, 18, 34)).astype(np.float32)
    k = rng.standard_normal((2, 16, 3, 3)).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(i, (3, 3), axis=(2, 3))
    expected = np.einsum("nchwij,fcij->nfhw", windows, k)
    once = 2 * (i.nbytes + k[0].nbytes + 4 * 16 * 32)  # 2 blocks, one filter each
    for limit, floats, barriers in ((0, 2 * 8 * 18 * 35, 6), (12000, 4 * 18 * 35, 16)):
        options = MappingOptions.cuda().replace(max_shared_memory=limit)
        kernel = engine.compile("conv", i, k, options=options)
        np.testing.assert_allclose(kernel(i, k), expected, rtol=1e-4, atol=1e-4)
        assert f"__shared__ __align__(16) float tc_shared0[{floats}];" in kernel.source
        update = kernel.profile(i, k)[1]
        assert (update["global_load_bytes"], update["barriers"]) == (once, barriers)
    kernel = engine.compile(
        "conv", i, k, options=MappingOptions.cuda().replace(max_shared_memory=1000)
    )
    np.testing.assert_allclose(kernel(i, k), expected, rtol=1e-4, atol=1e-4)
    assert kernel.profile(i, k)[1]["global_load_bytes"] > 7 * once


def test_shared_depth_copies_the_operands_above_the_tiles_of_k() -> None:
    """A 64x64 matmul over k = 96 copies A's and B's tiles once per 64 values of k (2
    tiles) by default, pipelined (`copy_stages` 2: a barrier per tile and one after the
    loop); at shared_depth 2 (below the grid's two members) once for all of k (32x96
    and 96x32 floats: 2 barriers). Where those do not all fit max_shared_memory (20000
    bytes: A's alone would), the copies stay per tile, and synchronous (two tiles'
    buffers do not fit either: 2 barriers each)."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define(MATMUL)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 64)).astype(np.float32)
    barriers = {}
    for depth, limit in ((0, 0), (2, 0), (2, 20000)):
        options = MappingOptions.cuda().replace(shared_depth=depth, max_shared_memory=limit)
        kernel = engine.compile("mm", a, b, options=options)
        np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
        update = kernel.profile(a, b)[1]
        assert update["global_load_bytes"] == 4 * (a.size + b.size) * 2 + 4 * 64 * 64
        barriers[depth, limit] = update["barriers"] // 4  # per block
    assert barriers == {(0, 0): 3, (2, 0): 2, (2, 20000): 4}


@pytest.mark.parametrize("vectorize", [False, True])
def test_lanes_walking_a_column_of_a_ring_of_short_rows_meet_no_bank_conflict(
    vectorize: bool,
) -> None:
    """`C = A * B^T` with tiles of 16 values of k in a ring of 2: the lanes walk n, a
    column of B's tile, whose rows of 16 floats unpadded would put a warp in 2 banks
    (16 wavefronts a read: 368,640 conflicts here). A step of k at a time (`vectorize`
    off), rows padded to 17: the reads meet none, and the fills (4 bytes a lane, a
    warp's over two rows) one a warp request. 4 steps at a time, each lane reading
    its row's 4 values as one float4: rows of 20 (5 whole vectors), neither the reads
    nor the fills (16 bytes a lane now) meet any."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define("""def mmt(float(M,K) A, float(N,K) B) -> (C) {
        C(m,n) +=! A(m,k) * B(n,k)
    }""")
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal((n, 256)).astype(np.float32) for n in (128, 96))
    options = MappingOptions.cuda().replace(
        copy_stages=4, max_shared_memory=12 * 1024, reduce_across_threads=False,
        vectorize=vectorize,
    )  # fmt: skip
    kernel = engine.compile("mmt", a, b, options=options)
    assert "for (int c2 = 0; c2 <= 15; c2++)" in kernel.source  # tiles of 16
    row = 20 if vectorize else 17
    fill = f"TC_CP_ASYNC(tc_shared1, tc_s * {32 * row} + ((int)(tc_i0) * {row} + (tc_i1))"
    assert fill in kernel.source
    assert ("TC_SLDV(float4, tc_shared1, tc_a)" in kernel.source) is vectorize
    np.testing.assert_allclose(kernel(a, b), a @ b.T, rtol=1e-4, atol=1e-4)
    update = kernel.profile(a, b)[1]
    assert update["async_copies"] > 0
    assert update["bank_conflicts"] == (0 if vectorize else update["async_copies"] // 32)


def test_a_contraction_over_heads_and_their_values_copies_both_operands() -> None:
    """An output projection `Y(s,n) = A(s,h,e) * Wo(n,h,e)` at BERT-base's sizes: a
    tile of 4 heads (the smallest tried before) held 32 KB of each operand, so only
    `A` was copied and the lanes read `Wo` across memory, a row of 3 KB apart (7x the
    sectors its bytes need); tiles of the reduction now count `e`'s 64 values, and a
    tile of one head copies both, in a ring of 2."""
    engine = tcpy.ExecutionEngine("cuda-emu", emu_check=True)
    engine.define("""def proj(float(S,H,E) A, float(D,H,E) Wo) -> (Y) {
        Y(s,n) +=! A(s,h,e) * Wo(n,h,e)
    }""")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((384, 12, 64), dtype=np.float32)
    w = rng.standard_normal((768, 12, 64), dtype=np.float32)
    kernel = engine.compile("proj", a, w)
    assert "TC_CP_ASYNC(tc_shared0" in kernel.source and "TC_CP_ASYNC(tc_shared1" in kernel.source
    want = np.einsum("she,nhe->sn", a.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(kernel(a, w), want, rtol=1e-4, atol=1e-3)
