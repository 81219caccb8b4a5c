"""Host memory for `cpu` outputs kept from call to call (`tcpy.runtime.host_pool`)."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import tcpy
from tcpy.runtime.host_pool import MIN_BYTES, HostPool


def test_a_block_comes_back_when_its_last_view_goes() -> None:
    pool = HostPool()
    a = pool.empty((MIN_BYTES // 4,), np.dtype(np.float32))
    address = a.ctypes.data
    view = a[10:]
    del a
    gc.collect()
    assert pool.idle_bytes == 0  # the view still holds the block
    del view
    assert pool.idle_bytes == pool.rounded(MIN_BYTES)
    b = pool.empty((MIN_BYTES // 8, 2), np.dtype(np.float32))  # the same size: reused
    reused = b.ctypes.data
    assert reused == address and pool.idle_bytes == 0
    assert b.shape == (MIN_BYTES // 8, 2) and b.flags.writeable and b.flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float64, np.int32, ml_dtypes.bfloat16, np.float16])
def test_pooled_arrays_have_their_dtype_and_shape(dtype: type) -> None:
    pool = HostPool()
    a = pool.empty((3, MIN_BYTES // 3), np.dtype(dtype))
    assert a.dtype == np.dtype(dtype) and a.shape == (3, MIN_BYTES // 3)
    a[...] = 1
    assert float(a.astype(np.float64).sum()) == a.size


def test_small_arrays_and_the_idle_limit() -> None:
    pool = HostPool(idle_limit=3 * MIN_BYTES // 2)
    small = pool.empty((16,), np.dtype(np.float32))  # plain NumPy: not pooled
    del small
    assert pool.idle_bytes == 0
    a, b = (pool.empty((MIN_BYTES,), np.dtype(np.uint8)) for _ in range(2))
    kept = b.ctypes.data
    del a, b
    assert pool.idle_bytes == MIN_BYTES  # the second block made room: the first freed
    assert pool.empty((MIN_BYTES,), np.dtype(np.uint8)).ctypes.data == kept
    huge = pool.empty((2 * MIN_BYTES,), np.dtype(np.uint8))
    del huge
    assert pool.idle_bytes == MIN_BYTES and len(pool.idle) == 1  # larger than the limit


def test_a_pool_full_of_idle_blocks_makes_room_for_the_next_size() -> None:
    """The blocks idle longest are freed for a block given back: one large call's
    output, never asked for again, does not keep later outputs out of the pool."""
    pool = HostPool(idle_limit=4 * MIN_BYTES)
    one_off = pool.empty((3 * MIN_BYTES,), np.dtype(np.uint8))
    del one_off
    assert pool.idle_bytes == 3 * MIN_BYTES
    first = pool.empty((2 * MIN_BYTES,), np.dtype(np.uint8))
    address = first.ctypes.data
    del first  # makes room: the one-off block goes
    assert pool.idle_bytes == 2 * MIN_BYTES and len(pool.by_size[3 * MIN_BYTES]) == 0
    again = pool.empty((2 * MIN_BYTES,), np.dtype(np.uint8))
    assert again.ctypes.data == address


def test_outputs_of_calls_reuse_their_pages_and_are_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two calls in a row write the second output into the first one's block once
    the caller has let go of it; an output kept is never written by a later call.
    (Outside the tests' poisoned buffers, which come from NumPy.)"""
    monkeypatch.setenv("TCPY_POISON", "0")
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def f(float(N) A) -> (B) { B(i) = A(i) * 2 }")
    a = np.arange(MIN_BYTES // 2, dtype=np.float32)
    first = engine.f(a)
    kept = first.copy()
    second = engine.f(a + 1)
    addresses = first.ctypes.data, second.ctypes.data  # (not in an assert: pytest keeps those)
    assert addresses[1] != addresses[0]  # first is still held
    np.testing.assert_array_equal(first, kept)
    del second
    third = engine.f(a)
    reused = third.ctypes.data
    assert reused == addresses[1]
    np.testing.assert_array_equal(third, a * 2)
