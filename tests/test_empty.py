"""Calls that are empty at their sizes: a size of 0 gives empty outputs, a `!` reduction
over an empty range its operator's identity, on every target, compiling nothing; a
range empty for every size is still refused at `define`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_gpu import DeviceVector, HostMemoryDriver

import tcpy
from tcpy import empty
from tcpy.runtime import cuda

from differential import defined

SOURCE = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
def reductions(float(N,D) X, int32(N,D) I) -> (S, P, Hi, Lo, IHi, ILo) {
    S(n) +=! X(n,d)
    P(n) *=! X(n,d)
    Hi(n) max=! X(n,d)
    Lo(n) min=! X(n,d)
    IHi(n) max=! I(n,d)
    ILo(n) min=! I(n,d)
}
def accumulate(float(N,D) X) -> (O) {
    O(n) += X(n,d)
}
def pairs(float(N) A) -> (O) {
    O(i) = A(i) + A(i + 1) where i in 0:N-1
}
def softmax(float(N,D) X) -> (Y) {
    mx(n) max=! X(n,d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,d)
    Y(n,d) = e(n,d) / s(n)
}
def scale(float(B,D) X, float a) -> (Y) {
    Y(b,d) = X(b,d) * a
}
def offset(float(N) A, float(M) B) -> (O) {
    O(i) = A(i) + B(i) where i in 0:N
}
def split(float(N) A, float(M) B) -> (O, P) {
    O(i) = A(i) * 2
    P(j) = B(j) + 1
}
def mixed(float(N) A, float(M) B, float(K) C) -> (O, P) {
    O(i) = A(i) + B(i) where i in 0:N
    P(k) = C(k)
}
def running_max(float(N,D) X) -> (O) {
    O(n) max= X(n,d)
}
def grad(float(M,C,KH,KW) W1, float(N,M,H,W) G) -> (I) {
    I(n,c,h,w) +=! G(n,m,h-kh,w-kw) * W1(m,c,kh,kw)
}
"""

TARGETS = ["reference", "cpu", "cuda-emu", "cuda"]


@pytest.fixture(params=TARGETS)
def engine(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tcpy.ExecutionEngine:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    return defined(request.param, SOURCE, quiet=True)  # reductions without `!` warn


def _ones(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


def test_an_empty_batch_gives_an_empty_output(engine: tcpy.ExecutionEngine) -> None:
    c = engine.mm(_ones(0, 3), _ones(3, 4))
    assert isinstance(c, np.ndarray) and c.shape == (0, 4) and c.dtype == np.float32
    assert engine.mm(_ones(2, 3), _ones(3, 0)).shape == (2, 0)
    assert engine.scale(_ones(0, 5), 2.0).shape == (0, 5)
    assert engine.stats.compiles == 0  # nothing to compile


def test_a_sum_over_nothing_is_zero(engine: tcpy.ExecutionEngine) -> None:
    np.testing.assert_array_equal(engine.mm(_ones(2, 0), _ones(0, 3)), np.zeros((2, 3)))


def test_reductions_over_nothing_give_their_identities(engine: tcpy.ExecutionEngine) -> None:
    x, i = _ones(3, 0), np.ones((3, 0), np.int32)
    s, p, hi, lo, ihi, ilo = engine.reductions(x, i)
    np.testing.assert_array_equal(s, np.zeros(3))
    np.testing.assert_array_equal(p, np.ones(3))
    np.testing.assert_array_equal(hi, np.full(3, -np.inf))  # as np.max(initial=-inf)
    np.testing.assert_array_equal(lo, np.full(3, np.inf))
    np.testing.assert_array_equal(ihi, np.full(3, np.iinfo(np.int32).min))
    np.testing.assert_array_equal(ilo, np.full(3, np.iinfo(np.int32).max))
    assert ihi.dtype == np.int32


def test_a_reduction_without_bang_starts_from_zero(engine: tcpy.ExecutionEngine) -> None:
    np.testing.assert_array_equal(engine.accumulate(_ones(4, 0)), np.zeros(4))


def test_a_range_that_goes_negative_gives_an_empty_output(engine: tcpy.ExecutionEngine) -> None:
    # `where i in 0:N-1` at N = 0 is 0:-1, and the output's extent N - 1 is taken as 0
    assert engine.pairs(_ones(0)).shape == (0,)
    assert engine.pairs(_ones(1)).shape == (0,)
    if engine.target != "cuda" or cuda.has_gpu():  # a call that is not empty runs a kernel
        np.testing.assert_array_equal(engine.pairs(np.arange(3, dtype=np.float32)), [1, 3])


def test_an_empty_temporary(engine: tcpy.ExecutionEngine) -> None:
    assert engine.softmax(_ones(0, 5)).shape == (0, 5)
    assert engine.softmax(_ones(3, 0)).shape == (3, 0)  # mx is -inf, e and s empty


def test_an_empty_range_skips_the_bounds_it_would_need(engine: tcpy.ExecutionEngine) -> None:
    # B(i) for i in 0:N needs M >= N, but at N = 0 nothing is read
    assert engine.offset(_ones(0), _ones(0)).shape == (0,)
    with pytest.raises(tcpy.TCRangeError, match="reaches index 1, outside 0:1"):
        engine.offset(_ones(2), _ones(1))


def test_out_receives_an_empty_calls_results(engine: tcpy.ExecutionEngine) -> None:
    c = np.full((2, 3), 7, np.float32)
    assert engine.mm(_ones(2, 0), _ones(0, 3), out=c) is c
    np.testing.assert_array_equal(c, np.zeros((2, 3)))
    empty = np.empty((0, 3), np.float32)
    assert engine.mm(_ones(0, 4), _ones(4, 3), out=empty) is empty
    with pytest.raises(tcpy.TCInputError, match=r"of shape \(0, 3\)"):
        engine.mm(_ones(0, 4), _ones(4, 3), out=np.empty((1, 3), np.float32))


def test_a_kernel_compiled_for_an_empty_call_serves_only_its_shapes(
    engine: tcpy.ExecutionEngine,
) -> None:
    kernel = engine.compile("mm", _ones(0, 2), _ones(2, 4))
    assert kernel(_ones(0, 2), _ones(2, 4)).shape == (0, 4)
    assert "reference interpreter" in kernel.source
    with pytest.raises(tcpy.TCInputError, match="compiled for other input shapes"):
        kernel(_ones(1, 2), _ones(2, 4))


def test_dtype_and_rank_are_still_checked(engine: tcpy.ExecutionEngine) -> None:
    with pytest.raises(tcpy.TCInputError, match="must be float32"):
        engine.mm(np.ones((0, 3), np.float64), _ones(3, 4))
    with pytest.raises(tcpy.TCInputError, match="K"):
        engine.mm(_ones(0, 3), _ones(2, 4))


def test_pytorch_in_gives_pytorch_out(engine: tcpy.ExecutionEngine) -> None:
    torch = pytest.importorskip("torch")
    c = engine.mm(torch.ones(0, 3), torch.ones(3, 4))
    assert isinstance(c, torch.Tensor) and tuple(c.shape) == (0, 4)
    s = engine.mm(torch.ones(2, 0), torch.ones(0, 3))
    assert torch.equal(s, torch.zeros(2, 3))


def test_a_size_generic_kernel_leaves_empty_calls_to_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE.replace("O(n) += X", "O(n) +=! X").replace("max= X", "max=! X"))
    generic = {"fix_parameters_before_scheduling": False}
    rng = np.random.default_rng(0)
    a, b = rng.random((5, 3), dtype=np.float32), rng.random((3, 4), dtype=np.float32)
    kernel = engine.compile("mm", a[:2], b, options=generic)
    assert kernel.generic
    np.testing.assert_array_equal(kernel(_ones(3, 0), _ones(0, 4)), np.zeros((3, 4)))
    assert kernel(_ones(0, 3), b).shape == (0, 4)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-5)  # and on with other sizes
    assert engine.stats.compiles == 1


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("O(i) = A(i) where i in 0:0", "empty range"),
        ("O(i) = A(i) where i in N:N", "empty range"),
    ],
)
def test_a_range_empty_for_every_size_is_refused_at_define(body: str, fragment: str) -> None:
    engine = tcpy.ExecutionEngine("reference")
    with pytest.raises(tcpy.TCRangeError, match=fragment):
        engine.define(f"def f(float(N) A) -> (O) {{ {body} }}")


def test_a_fixed_size_still_has_to_match() -> None:
    engine = tcpy.ExecutionEngine("reference")
    engine.define("def f(float(N, 4) A) -> (O) { O(n) +=! A(n, j) }")
    assert engine.f(_ones(0, 4)).shape == (0,)
    with pytest.raises(tcpy.TCInputError, match="4"):
        engine.f(_ones(0, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not cuda.has_gpu(), reason="needs a GPU")
def test_device_inputs_give_device_outputs_on_an_empty_call() -> None:
    torch = pytest.importorskip("torch")
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(SOURCE)
    a, b = torch.ones(2, 0, device="cuda"), torch.ones(0, 3, device="cuda")
    c = engine.mm(a, b)
    assert isinstance(c, torch.Tensor) and c.is_cuda
    assert torch.equal(c.cpu(), torch.zeros(2, 3))
    out = torch.full((2, 3), 7.0, device="cuda")
    assert engine.mm(a, b, out=out) is out
    assert torch.equal(out.cpu(), torch.zeros(2, 3))
    assert tuple(
        engine.mm(torch.ones(0, 4, device="cuda"), torch.ones(4, 3, device="cuda")).shape
    ) == (0, 3)


def test_the_outputs_that_are_not_empty_are_still_computed(engine: tcpy.ExecutionEngine) -> None:
    a = np.arange(3, dtype=np.float32)
    o, p = engine.split(a, _ones(0))  # P is empty, so the interpreter computes both
    np.testing.assert_array_equal(o, a * 2)
    assert p.shape == (0,)


def test_a_statement_that_runs_still_has_its_bounds_checked(
    engine: tcpy.ExecutionEngine,
) -> None:
    o, p = engine.mixed(_ones(2), _ones(2), _ones(0))
    np.testing.assert_array_equal(o, [2, 2])
    assert p.shape == (0,)
    with pytest.raises(tcpy.TCRangeError, match="reaches index 1, outside 0:1"):
        engine.mixed(_ones(2), _ones(1), _ones(0))  # the call is empty, O's reads are not


def test_a_max_without_bang_starts_from_zero(engine: tcpy.ExecutionEngine) -> None:
    np.testing.assert_array_equal(engine.running_max(_ones(3, 0)), np.zeros(3))


@pytest.mark.parametrize(
    ("entry", "shapes"),
    [
        ("mm", [(0, 3), (3, 2)]),
        ("mm", [(2, 0), (0, 3)]),
        ("reductions", [(2, 0), (2, 0)]),
        ("softmax", [(2, 0)]),
        ("accumulate", [(0, 2)]),
        ("split", [(2,), (0,)]),
        ("grad", [(0, 2, 1, 1), (2, 0, 3, 3)]),  # the reduction over m is empty
        ("grad", [(1, 2, 1, 1), (0, 1, 3, 3)]),  # an empty batch
    ],
)
def test_every_target_agrees_with_the_reference(
    engine: tcpy.ExecutionEngine, entry: str, shapes: list[tuple[int, ...]]
) -> None:
    rng = np.random.default_rng(1)
    cdef = engine.checked(entry)
    inputs = [
        rng.integers(-3, 4, shape).astype(info.scalar.dtype)
        for info, shape in zip(cdef.inputs, shapes, strict=True)
    ]
    reference = defined("reference", SOURCE, quiet=True)
    got, want = getattr(engine, entry)(*inputs), getattr(reference, entry)(*inputs)
    for g, w in zip(_tuple(got), _tuple(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_a_start_is_checked_unless_its_output_is_empty(engine: tcpy.ExecutionEngine) -> None:
    # I's h starts at KH - 1: a 3x3 filter is refused even when the reduction over m is
    # empty (the `!` would set I's elements from 2 on, and leave 0 and 1 unset) ...
    with pytest.raises(tcpy.TCRangeError, match="would start at index 2"):
        engine.grad(_ones(0, 2, 3, 3), _ones(1, 0, 4, 4))
    # ... and accepted for an empty batch, where I has no elements to leave unset
    assert engine.grad(_ones(2, 2, 3, 3), _ones(0, 2, 4, 4)).shape == (0, 2, 4, 4)


def test_out_takes_several_outputs_of_an_empty_call(engine: tcpy.ExecutionEngine) -> None:
    o, p = np.full(2, 7, np.float32), np.empty(0, np.float32)
    got = engine.split(np.arange(2, dtype=np.float32), _ones(0), out=(o, p))
    assert got[0] is o and got[1] is p
    np.testing.assert_array_equal(o, [0, 2])


def test_pytorch_out_receives_an_empty_calls_results(engine: tcpy.ExecutionEngine) -> None:
    torch = pytest.importorskip("torch")
    out = torch.full((2, 3), 7.0)
    assert engine.mm(torch.ones(2, 0), torch.ones(0, 3), out=out) is out
    assert torch.equal(out, torch.zeros(2, 3))


def test_a_kernel_for_fixed_sizes_refuses_an_empty_call(engine: tcpy.ExecutionEngine) -> None:
    kernel = engine.compile("scale", _ones(2, 3), 1.0)
    with pytest.raises(tcpy.TCInputError, match="compiled for other input shapes"):
        kernel(_ones(0, 3), 1.0)


def test_a_size_generic_kernel_is_not_run_on_an_empty_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE.replace("O(n) += X", "O(n) +=! X").replace("max= X", "max=! X"))
    generic = {"fix_parameters_before_scheduling": False}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(engine.softmax(x, options=generic).shape, (2, 3))
    kernel = engine.compile("softmax", x, options=generic)
    assert kernel.generic

    def fail(*_: Any) -> None:
        raise AssertionError("the compiled code ran on an empty call")

    object.__setattr__(kernel._kernel, "run", fail)  # the engine's kernel, shared
    assert engine.softmax(_ones(0, 3), options=generic).shape == (0, 3)
    assert kernel(_ones(3, 0)).shape == (3, 0)
    # unchecked calls too: the kernel was built for non-empty ranges
    assert kernel(_ones(0, 3), unchecked=True).shape == (0, 3)
    out = np.empty((3, 0), np.float32)
    assert kernel(_ones(3, 0), out=out, unchecked=True) is out
    with pytest.raises(AssertionError, match="compiled code ran"):
        kernel(x, unchecked=True)
    assert engine.stats.compiles == 1


@pytest.fixture
def gpu_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[tcpy.ExecutionEngine, HostMemoryDriver]:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    drv = HostMemoryDriver()
    monkeypatch.setattr(empty, "_driver", lambda: drv)
    return defined("cuda", SOURCE, quiet=True), drv


def test_device_inputs_give_device_outputs_without_a_gpu(
    gpu_engine: tuple[tcpy.ExecutionEngine, HostMemoryDriver],
) -> None:
    engine, drv = gpu_engine
    a = np.arange(3, dtype=np.float32)
    o, p = engine.split(DeviceVector(drv, a), DeviceVector(drv, _ones(0)))
    assert isinstance(o, cuda.DeviceArray) and isinstance(p, cuda.DeviceArray)
    np.testing.assert_array_equal(o.get(), a * 2)
    assert p.shape == (0,) and p.dtype == np.float32
    c = engine.mm(DeviceVector(drv, _ones(2, 0)), DeviceVector(drv, _ones(0, 3)))
    np.testing.assert_array_equal(c.get(), np.zeros((2, 3)))
    assert engine.stats.compiles == 0


def test_device_out_receives_an_empty_calls_results_without_a_gpu(
    gpu_engine: tuple[tcpy.ExecutionEngine, HostMemoryDriver],
) -> None:
    engine, drv = gpu_engine
    out = DeviceVector(drv, np.full((2, 3), 7, np.float32))
    got = engine.mm(DeviceVector(drv, _ones(2, 0)), _ones(0, 3), out=out)
    assert got is out
    host = np.empty((2, 3), np.float32)
    drv.to_host(host, out.pointer, 0)
    np.testing.assert_array_equal(host, np.zeros((2, 3)))
    c = np.full((2, 3), 7, np.float32)  # a host out= from device inputs
    assert engine.mm(DeviceVector(drv, _ones(2, 0)), _ones(0, 3), out=c) is c
    np.testing.assert_array_equal(c, np.zeros((2, 3)))


def test_an_empty_calls_copies_go_to_the_callers_stream(
    gpu_engine: tuple[tcpy.ExecutionEngine, HostMemoryDriver],
) -> None:
    """The first device array's stream (A's), ordered against the other one's (B's), as
    a kernel's work would be."""
    engine, drv = gpu_engine
    a, b = 0x5A000, 0x5B000
    x = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=a)
    y = DeviceVector(drv, _ones(0), stream=b)
    drv.streams.clear()
    o, _ = engine.split(x, y)
    assert {stream for _, stream in drv.streams} == {a}
    assert ("to_host", a) in drv.streams and ("to_device", a) in drv.streams
    assert drv.orders == [(a, b), (b, a)]
    assert o.stream == a
    np.testing.assert_array_equal(o.get(), [0, 2, 4])


def _tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)
