"""Device profiles: the facts the CUDA mapping decides with, chosen by name for
`cuda-emu` (an engine option, `TCPY_CUDA_DEVICE`), and part of the cache keys."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy
from tcpy.mapping.gpu import device

from programs import MATMUL


def test_named_profiles_and_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TCPY_CUDA_DEVICE", raising=False)
    assert device.default_profile().name == "h100"
    assert device.named("H100").sms == 132 and device.named("a100").arch == "sm_80"
    # the L2 the emulator's DRAM bytes are counted behind (published sizes)
    mib = 1 << 20
    l2 = {name: p.l2_bytes for name, p in device.PROFILES.items()}
    assert l2 == {"h100": 50 * mib, "h200": 50 * mib, "a100": 40 * mib, "l4": 48 * mib}
    monkeypatch.setenv("TCPY_CUDA_DEVICE", "l4")
    assert device.default_profile().sms == 58
    with pytest.raises(tcpy.TCError, match=r"unknown device profile 'v100'.*a100, h100"):
        device.named("v100")


def test_the_device_option_belongs_to_cuda_emu() -> None:
    with pytest.raises(tcpy.TCError, match="device is an option of the cuda-emu target"):
        tcpy.ExecutionEngine("cpu", device="h100")
    with pytest.raises(tcpy.TCError, match="unknown device profile"):
        tcpy.ExecutionEngine("cuda-emu", device="nope")


def test_each_profile_is_its_own_compilation(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The same def and shape mapped for two devices: two builds, each right, with
    the launch shapes of its device; the same device again is a disk hit."""
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((64, 8), dtype=np.float32)
    B = rng.standard_normal((8, 256), dtype=np.float32)
    blocks, stats = {}, []
    for name in ("l4", "h100", "l4"):
        engine = tcpy.ExecutionEngine("cuda-emu", device=name)
        engine.define(MATMUL)
        plain = tcpy.MappingOptions.cuda().replace(use_shared_memory=False)
        compiled = engine.compile("mm", A, B, options=plain)
        np.testing.assert_allclose(compiled(A, B), A @ B, rtol=1e-5, atol=1e-5)
        blocks[name] = compiled.profile(A, B)[1]["block"]
        stats.append((engine.stats.compiles, engine.stats.disk_hits))
    assert stats == [(1, 0), (1, 0), (0, 1)]
    assert blocks == {"l4": (32, 4, 1), "h100": (32, 1, 1)}  # 8 x 8 blocks of 32x8 at most
