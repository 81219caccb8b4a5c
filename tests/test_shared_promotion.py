"""Which tensors a CUDA block copies into shared memory (`tcpy.mapping.gpu.shared`), and
what the emulator's counters show of it: a tensor reused inside a tile (by a loop
that leaves it in place, or by overlapping windows) or read with a stride by a warp
is copied in with coalesced rows; a row kernel's blocks keep enough rows that the
operands every row reads are not fetched once per row. Each kernel is checked
against the `reference` target, with the emulator's bounds and race checks on."""

from __future__ import annotations

import re
import warnings

import numpy as np

import tcpy
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.gpu.rows import SHARED_OPERAND_SHARE
from tcpy.mapping.locality import strided_reads
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_cuda
from tcpy.poly.schedule import bands
from tcpy.runtime import profile

from differential import engines, run_against_reference
from programs import CONV, LAYERNORM, SOFTMAX

STRIDED_CONV = """def sconv(float(N,C,H,W) I, float(F,C,KH,KW) K) -> (O) {
    O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * K(f,c,kh,kw)
}"""
MAXPOOL = """def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2
}"""


def _profiled(source: str, *inputs: np.ndarray):  # type: ignore[no-untyped-def]
    """The emulated kernel's outputs (checked against the reference), its source and
    its profile."""
    compiled, got, want = run_against_reference("cuda-emu", source, *inputs, emu_check=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return got, compiled.source, compiled.profile(*inputs)


def _copied(source: str) -> list[str]:
    """The tensors the kernels copy into shared memory, in the order copied."""
    return re.findall(r"tc_v\[tc_u\] = TC_LD\(t_(\w+),", source)


def _inputs(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_a_strided_convolution_copies_its_input_in_coalesced_rows() -> None:
    """Along threadIdx.x's `w`, `I(.., 2*w+kw)` strides: a warp read it from twice
    the sectors it used (efficiency 0.43). Copied into shared memory a box at a time,
    every launch reads whole sectors."""
    x, k = _inputs(0, (2, 4, 33, 33), (4, 4, 3, 3))
    _, source, launches = _profiled(STRIDED_CONV, x, k)
    assert sorted(set(_copied(source))) == ["I", "K"]
    for launch in launches:
        assert profile.efficiency(launch) >= 0.8, launch


def test_a_pooling_window_is_copied_with_vector_loads() -> None:
    """Each element of a 2x2 pooling's input is read once, but with a stride of 2 along
    threadIdx.x: the copy reads the rows whole, 16 bytes a lane."""
    (x,) = _inputs(1, (2, 4, 32, 32))
    _, source, launches = _profiled(MAXPOOL, x)
    assert _copied(source) == ["I"] and "TC_LDV(float4, t_I," in source
    for launch in launches:  # rows of 32 floats, read whole: every sector used up
        assert profile.efficiency(launch) == 1.0, launch


def test_overlapping_windows_are_reuse() -> None:
    """No loop of a convolution leaves `I(n,c,h+kh,w+kw)` in place, but neighbouring
    threads read each element again at the next step of a window: about 7 reads per
    element copied. The copy removes the unaligned rows the windows read."""
    x, k = _inputs(2, (2, 4, 18, 18), (4, 4, 3, 3))
    _, source, launches = _profiled(CONV, x, k)
    assert sorted(set(_copied(source))) == ["I", "K"]
    assert all(profile.efficiency(launch) >= 0.8 for launch in launches)
    assert "TC_LD(t_I," in source.split("__syncthreads();")[1]  # only in the copy


def test_a_box_over_the_budget_shrinks_the_channel_tile_or_stays_in_global_memory() -> None:
    """At 32 channels a strided convolution's input box is 268 KB (32 x 33 x 65 for a
    block's 16x32 outputs): over the block's 48 KB, the channel tile halves until it
    fits (4 channels: 33 KB; rows of 65 words, an odd number, unpadded: a warp walking
    a column already meets 32 banks). Where even that does not fit
    `max_shared_memory`, the input is read from global memory and only the filter is
    copied."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cdef = check_source(STRIDED_CONV)["sconv"]
    sizes = {"N": 8, "C": 32, "H": 65, "W": 65, "F": 32, "KH": 3, "KW": 3}
    lowered = lower_to_cuda(cdef, sizes, cuda_defaults(cdef), check=True)
    assert sorted(set(_copied(lowered.source))) == ["I", "K"]
    assert f"float tc_shared0[{4 * 33 * 65}];" in lowered.source
    options = cuda_defaults(cdef).replace(max_shared_memory=20000)
    lowered = lower_to_cuda(cdef, sizes, options, check=True)
    assert _copied(lowered.source) == ["K"]


def test_strided_reads_name_the_tensors_a_member_strides_across() -> None:
    cdef = check_source(STRIDED_CONV)["sconv"]
    sizes = {"N": 2, "C": 4, "H": 33, "W": 33, "F": 4, "KH": 3, "KW": 3}
    lowered = lower_to_cuda(cdef, sizes, tcpy.MappingOptions.naive(), check=True)
    tile, point, c, kh, kw = bands(lowered.mapping.unbound)
    assert strided_reads(tile, 0, lowered.scop) == {"I"}  # n: across I's rows, not K's
    assert strided_reads(tile, 1, lowered.scop) == {"K"}
    assert strided_reads(point, 3, lowered.scop) == {"I"}  # w: 2 apart along I's rows
    assert strided_reads(c, 0, lowered.scop) == strided_reads(kh, 0, lowered.scop) == {"I", "K"}
    assert strided_reads(kw, 0, lowered.scop) == set()  # unit stride along both


def test_layernorm_keeps_the_rows_that_share_its_operands_in_one_block() -> None:
    """A layernorm's blocks copy `g` and `b` once each: with a row a block, they were
    read once per row, 2x the bytes the definition must move. Its blocks keep 4 rows,
    the fewest that bound the copies to a quarter of the rows' traffic, in one
    launch."""
    x, g, b = _inputs(3, (64, 128), (128,), (128,))
    got, _, launches = _profiled(LAYERNORM, x, g, b)
    (launch,) = launches
    assert tuple(launch["block"]) == (32, 4, 1) and tuple(launch["grid"]) == (16, 1, 1)
    requested = launch["global_load_bytes"] + launch["global_store_bytes"]
    minimum = profile.minimum_bytes((x, g, b), (got,))
    assert requested == x.nbytes + got.nbytes + 16 * (g.nbytes + b.nbytes)  # 16 blocks
    assert requested <= (1 + SHARED_OPERAND_SHARE) * minimum
    assert profile.moved_bytes(launch) == requested


def test_a_softmax_with_no_shared_operand_still_fills_the_device_row_by_row() -> None:
    """Nothing but its rows: a block a row, as many blocks as rows."""
    (x,) = _inputs(4, (64, 128))
    _, _, launches = _profiled(SOFTMAX, x)
    (launch,) = launches
    assert tuple(launch["block"]) == (32, 1, 1) and tuple(launch["grid"]) == (64, 1, 1)
    assert launch["global_load_bytes"] + launch["global_store_bytes"] == 2 * x.nbytes


def test_an_unrolled_copy_loads_four_vectors_per_thread_before_storing_them() -> None:
    """The rows softmax copies into shared memory: with `unroll_copy_shared` (the
    default) each thread loads 4 vectors into registers, then stores them, 4 loads in
    flight; without, one at a time. The same bytes, requests and results either way."""
    x = np.random.default_rng(7).standard_normal((16, 512)).astype(np.float32)
    emu, want = engines("cuda-emu", SOFTMAX, emu_check=True)
    profiles = []
    for unroll, batch in ((True, 4), (False, 1)):
        options = emu.default_options("softmax").replace(unroll_copy_shared=unroll)
        compiled = emu.compile("softmax", x, options=options)
        assert f"float4 tc_v[{batch}];" in compiled.source
        np.testing.assert_allclose(compiled(x), want.softmax(x), rtol=1e-5, atol=1e-6)
        (launch,) = compiled.profile(x)
        profiles.append((launch["global_load_bytes"], launch["global_requests"]))
    assert profiles[0] == profiles[1]
