"""How the GPU mapping fills a device (`tcpy.mapping.gpu`): a split reduction's chunks,
an elementwise kernel's elements per thread, and a contraction's shared-memory tiles
against a warp per output. Each depends on the device's size, so the emulated runs
map for a small profile (2 SMs of 256 threads), at which sizes the emulator runs in
moments take the paths a large GPU takes at full size; every result is checked against
`reference` with the emulator's bounds and race checks on."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tcpy.mapping.gpu import device as devices
from tcpy.mapping.gpu.device import DeviceProfile
from tcpy.mapping.gpu.sizes import MIN_CHUNK

from differential import run_against_reference

SMALL = DeviceProfile(
    "small", "sm_90", 2, 1024, 256, 8, 48 * 1024, 96 * 1024, 65536, 65536, 2 << 20
)


@pytest.fixture(autouse=True)
def _small_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(devices.PROFILES, SMALL.name, SMALL)


def _run(source: str, *inputs: np.ndarray, device: str = "small"):  # type: ignore[no-untyped-def]
    compiled, got, want = run_against_reference(
        "cuda-emu", source, *inputs, emu_check=True, device=device
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return compiled


def test_a_split_reduction_keeps_the_devices_threads_resident() -> None:
    """32 columns summed over 1024 rows: one block of 32 threads would leave the device
    nearly idle, and two blocks per SM (4) too; the rows are split until the blocks hold
    every thread the device keeps resident (16 blocks of 32), in chunks of 64."""
    g = np.random.default_rng(0).standard_normal((1024, 32)).astype(np.float32)
    compiled = _run("def bag(float(B,N) G) -> (gb) { gb(n) +=! G(b,n) }", g)
    grid, block = _shape(compiled.profile(g)[-1])
    assert "atomicAdd" in compiled.source
    assert math.prod(grid) * math.prod(block) == SMALL.sms * SMALL.max_threads_per_sm
    assert grid[:2] == (1, 1024 // MIN_CHUNK) and block[0] == 32


def test_an_elementwise_kernel_gives_each_thread_four_elements_a_block_apart() -> None:
    """64x128 elements: at one per thread, 32 blocks of 32x8; the device holds 512
    threads, so 4 per thread along x (8 blocks) still fill it twice over. Every access
    stays coalesced: the emulator counts whole sectors."""
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    source = "def f(float(N,D) X) -> (Y) { Y(n,d) = tanh(X(n,d)) * 2 }"
    compiled = _run(source, x)
    (launch,) = compiled.profile(x)
    grid, block = _shape(launch)
    assert grid[0] * block[0] * 4 == 128 and grid[1] * block[1] == 64
    assert (
        launch["global_load_bytes"] + launch["global_store_bytes"] == 32 * launch["global_sectors"]
    )


def test_at_a_size_that_fills_no_device_twice_over_each_thread_keeps_one_element() -> None:
    x = np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32)
    compiled = _run("def f(float(N,D) X) -> (Y) { Y(n,d) = tanh(X(n,d)) * 2 }", x, device="h100")
    (launch,) = compiled.profile(x)
    grid, block = _shape(launch)
    assert grid[0] * block[0] == 128


def _shape(launch: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(launch["grid"]), tuple(launch["block"])


MLP = "def mlp(float(B,K) I, float(N,K) W) -> (O) { O(b,n) +=! I(b,k) * W(n,k) }"


def test_a_contraction_whose_operands_are_reused_is_tiled_in_shared_memory() -> None:
    """`I(b,k) * W(n,k)`: both operands walk k with unit stride, which alone would put k
    on a warp's lanes, an output per warp; but I stays put along n and W along b, and
    64x64 outputs make 8 tiles of 32x16, enough for the small device: the operands'
    tiles are copied into shared memory."""
    rng = np.random.default_rng(3)
    i, w = (rng.standard_normal((64, 96)).astype(np.float32) for _ in range(2))
    compiled = _run(MLP, i, w)
    assert "__shfl_xor_sync" not in compiled.source
    assert "TC_SLD(tc_shared" in compiled.source


def test_a_contraction_too_small_for_the_devices_shared_tiles_keeps_a_warp_per_output() -> None:
    rng = np.random.default_rng(4)
    i, w = (rng.standard_normal((64, 96)).astype(np.float32) for _ in range(2))
    compiled = _run(MLP, i, w, device="h100")
    assert "__shfl_xor_sync" in compiled.source
    assert "tc_shared" not in compiled.source
