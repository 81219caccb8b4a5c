"""The public API on the reference target: define, run, call by attribute, call-time
checks, kernel reuse."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy
from tcpy import TCError, TCInputError, TCRangeError

SOURCE = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
def scale(float(N) X, float alpha) -> (Y, s) {
    Y(i) = X(i) * alpha
    s +=! Y(i)
}
def fixed(float(N, 4) A) -> (O) {
    O(i) +=! A(i, j)
}
def shrink(float(N) A) -> (O) {
    O(i) = A(i) + A(i + 1) where i in 0:N-1
}
def third(float(N) I) -> (O) {
    O(i) = I(3 * i)
}
"""

rng = np.random.default_rng(7)


@pytest.fixture
def engine() -> tcpy.ExecutionEngine:
    e = tcpy.ExecutionEngine(target="reference")
    assert e.define(SOURCE) == ("mm", "scale", "fixed", "shrink", "third")
    return e


def test_run_and_attribute_agree(engine: tcpy.ExecutionEngine) -> None:
    A = rng.standard_normal((5, 3)).astype(np.float32)
    B = rng.standard_normal((3, 4)).astype(np.float32)
    C = engine.run("mm", A, B)
    assert isinstance(C, np.ndarray) and C.dtype == np.float32 and C.shape == (5, 4)
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(engine.mm(A, B), C)


def test_several_outputs_are_a_tuple(engine: tcpy.ExecutionEngine) -> None:
    X = np.arange(4, dtype=np.float32)
    Y, s = engine.scale(X, np.float32(2.0))
    np.testing.assert_array_equal(Y, X * 2)
    assert s.shape == () and s.dtype == np.float32 and float(s) == 12.0


@pytest.mark.parametrize("alpha", [2.0, 2, np.float32(2.0), np.array(2.0, dtype=np.float32)])
def test_scalar_inputs(engine: tcpy.ExecutionEngine, alpha: object) -> None:
    Y, _ = engine.scale(np.ones(3, dtype=np.float32), alpha)
    np.testing.assert_array_equal(Y, [2, 2, 2])


@pytest.mark.parametrize("alpha", [2.5, np.float32(2.5), np.array(2.5, dtype=np.float32)])
def test_a_call_with_scalars_is_checked_once_per_signature(
    engine: tcpy.ExecutionEngine, alpha: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python floats and NumPy scalars take the path of a signature checked before, as
    arrays do (binding them again took 15 us of a call with two scalars); an `int`,
    whose range is checked, and another dtype are bound again."""
    import tcpy.compiled
    import tcpy.engine

    x = np.arange(3, dtype=np.float32)
    compiled = engine.compile("scale", x, alpha)
    np.testing.assert_array_equal(engine.scale(x, alpha)[0], 2.5 * x)
    np.testing.assert_array_equal(compiled(x, alpha)[0], 2.5 * x)

    def refused(*args: object) -> None:
        raise AssertionError("bound again")

    monkeypatch.setattr(tcpy.engine, "bind", refused)
    monkeypatch.setattr(tcpy.compiled, "bind", refused)
    for value in (alpha, type(alpha)(-1.5) if not isinstance(alpha, np.ndarray) else alpha * -0.6):
        np.testing.assert_array_equal(engine.scale(x, value)[0], np.float32(value) * x)
        np.testing.assert_array_equal(compiled(x, value)[0], np.float32(value) * x)
    with pytest.raises(AssertionError, match="bound again"):
        engine.scale(x, np.float64(2.5))  # not the signature checked: bound, and refused


def test_non_contiguous_inputs_are_read_correctly(engine: tcpy.ExecutionEngine) -> None:
    A = rng.standard_normal((6, 3)).astype(np.float32)[::2]
    B = np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32))
    np.testing.assert_allclose(engine.mm(A, B), A @ B, rtol=1e-5, atol=1e-6)


def test_kernels_are_reused_per_signature(engine: tcpy.ExecutionEngine) -> None:
    A = np.ones((2, 3), np.float32)
    B = np.ones((3, 2), np.float32)
    engine.mm(A, B)
    engine.mm(A, B)
    engine.mm(np.ones((4, 3), np.float32), B)
    assert engine.stats.memory_hits == 1


def test_redefining_replaces(engine: tcpy.ExecutionEngine) -> None:
    engine.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) max=! A(m,k) * B(k,n) }")
    A = np.array([[1, 2]], np.float32)
    B = np.array([[3], [5]], np.float32)
    assert engine.mm(A, B)[0, 0] == 10.0


def test_unknown_entry(engine: tcpy.ExecutionEngine) -> None:
    with pytest.raises(TCError, match="no def named 'nope'"):
        engine.run("nope")
    with pytest.raises(AttributeError):
        engine.nope  # noqa: B018


def test_unknown_target() -> None:
    with pytest.raises(TCError, match="unknown target 'tpu'"):
        tcpy.ExecutionEngine(target="tpu")


def test_define_returns_nothing_partial_on_error() -> None:
    e = tcpy.ExecutionEngine("reference")
    with pytest.raises(TCError):
        e.define("def ok(float(N) A) -> (B) { B(i) = A(i) }\ndef bad(float(N) A) -> (B) { }")
    assert e.entries == ()


# --- call-time input errors ---------------------------------------------------------


def _call_error(engine: tcpy.ExecutionEngine, entry: str, *args: object) -> TCError:
    with pytest.raises(TCError) as info:
        engine.run(entry, *args)
    return info.value


def test_wrong_input_count(engine: tcpy.ExecutionEngine) -> None:
    err = _call_error(engine, "mm", np.ones((2, 2), np.float32))
    assert isinstance(err, TCInputError)
    assert "takes 2 inputs (A, B), but 1 was given" in str(err)


def test_wrong_dtype_is_not_cast(engine: tcpy.ExecutionEngine) -> None:
    err = _call_error(engine, "mm", np.ones((2, 2)), np.ones((2, 2), np.float32))
    assert isinstance(err, TCInputError)
    assert "input A must be float32, but the array is float64" in str(err)


def test_wrong_rank(engine: tcpy.ExecutionEngine) -> None:
    err = _call_error(engine, "mm", np.ones(2, np.float32), np.ones((2, 2), np.float32))
    assert "input A must have 2 dimension(s), but has 1" in str(err)


def test_inconsistent_sizes(engine: tcpy.ExecutionEngine) -> None:
    err = _call_error(engine, "mm", np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    assert isinstance(err, TCInputError)
    assert "input B has 4 in dimension 0 (size K), but input A dimension 1 gave K = 3" in str(err)


def test_fixed_size_mismatch(engine: tcpy.ExecutionEngine) -> None:
    err = _call_error(engine, "fixed", np.ones((2, 5), np.float32))
    assert "input A must have size 4 in dimension 1, but has 5" in str(err)


def test_float_scalar_for_int_input_is_rejected() -> None:
    e = tcpy.ExecutionEngine("reference")
    e.define("def f(int32 k, float(N) A) -> (B) { B(i) = A(i) * k }")
    with pytest.raises(TCInputError, match="does not convert"):
        e.f(1.5, np.ones(2, np.float32))
    with pytest.raises(TCInputError, match="out of its range"):
        e.f(2**40, np.ones(2, np.float32))


def test_non_array_input(engine: tcpy.ExecutionEngine) -> None:
    err = _call_error(engine, "mm", "text", np.ones((2, 2), np.float32))
    assert (
        "must be an array of float32 (NumPy, PyTorch, CuPy or any DLPack producer), not str"
        in str(err)
    )


def test_a_range_empty_at_the_calls_sizes_gives_an_empty_output(
    engine: tcpy.ExecutionEngine,
) -> None:
    out = engine.shrink(np.ones(1, np.float32))  # its range is 0:N-1, empty at N=1
    assert out.shape == (0,) and out.dtype == np.float32


def test_deferred_bounds_hold(engine: tcpy.ExecutionEngine) -> None:
    for n in (1, 2, 3, 7, 10):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(engine.third(x), x[::3])


def test_deferred_bounds_fail_at_call_time() -> None:
    e = tcpy.ExecutionEngine("reference")
    e.define("def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) + B(i) where i in 0:N }")
    np.testing.assert_array_equal(e.f(np.ones(2, np.float32), np.ones(3, np.float32)), [2, 2])
    with pytest.raises(
        TCRangeError, match=r"reaches index 2, outside 0:2 of its dimension 0 \(at M=2, N=3\)"
    ):
        e.f(np.ones(3, np.float32), np.ones(2, np.float32))


class _FakeDeviceArray:
    """Something that says it lives in GPU memory, like a CUDA tensor."""

    def __init__(self, shape: tuple[int, ...], typestr: str, strides: object = None):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (12345, False), "version": 3,
            "strides": strides,
        }  # fmt: skip


def test_device_inputs_are_checked_without_copy() -> None:
    from tcpy.binding import DeviceInput, bind

    e = tcpy.ExecutionEngine("reference")
    e.define(SOURCE)
    cdef = e.checked("mm")
    binding = bind(cdef, [_FakeDeviceArray((2, 3), "<f4"), _FakeDeviceArray((3, 4), "<f4")])
    assert isinstance(binding.arrays[0], DeviceInput) and binding.arrays[0].pointer == 12345
    assert binding.sizes == {"M": 2, "K": 3, "N": 4}
    with pytest.raises(TCInputError, match="must be float32, but the array is float64"):
        bind(cdef, [_FakeDeviceArray((2, 3), "<f8"), _FakeDeviceArray((3, 4), "<f4")])
    with pytest.raises(TCInputError, match="strided view in GPU memory"):
        bind(cdef, [_FakeDeviceArray((2, 3), "<f4", (4, 8)), _FakeDeviceArray((3, 4), "<f4")])


def test_host_targets_refuse_device_inputs() -> None:
    e = tcpy.ExecutionEngine("cpu")
    e.define(SOURCE)
    with pytest.raises(TCInputError, match="in GPU memory; use the cuda target"):
        e.mm(_FakeDeviceArray((2, 3), "<f4"), _FakeDeviceArray((3, 4), "<f4"))


def test_cuda_target_without_gpu_says_so() -> None:
    from tcpy.runtime import cuda as runtime

    if runtime.has_gpu():
        pytest.skip("this machine has a GPU")
    e = tcpy.ExecutionEngine("cuda")
    e.define(SOURCE)
    A, B = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    compiled = e.compile("mm", A, B)  # the source is still produced
    assert "__global__ void" in compiled.source
    with pytest.raises(tcpy.TCLaunchError, match="no CUDA GPU could be used"):
        e.mm(A, B)


# --- what a call's shapes decide, worked out once ----------------------------------------


def test_shapes_checked_once_still_refuse_bad_calls_at_every_call() -> None:
    """The sizes and checks a call's shapes decide are kept per definition and shapes:
    good shapes bind as before, and shapes that break a check raise at every call,
    before and after good ones."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(
        "def shift(float(N) A, float(M) B) -> (C) { C(i) = A(i + 2) + B(i) where i in 0:M }"
    )
    a, b = np.arange(6, dtype=np.float32), np.ones(4, np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(engine.shift(a, b), a[2:] + 1)
        with pytest.raises(TCRangeError):
            engine.shift(a[:5], b)  # A(i + 2) reaches 5, outside 0:5
        with pytest.raises(TCInputError):
            engine.shift(a.reshape(2, 3), b)


def test_two_definitions_with_equal_shapes_bind_their_own_sizes() -> None:
    from tcpy.binding import bind

    one = tcpy.ExecutionEngine("cpu")
    one.define("def f(float(N) A) -> (B) { B(i) = A(i) }")
    two = tcpy.ExecutionEngine("cpu")
    two.define("def f(float(M) A) -> (B) { B(i) = A(i) * 2 }")
    a = np.ones(5, np.float32)
    for _ in range(2):
        assert dict(bind(one.checked("f"), [a]).sizes) == {"N": 5}
        assert dict(bind(two.checked("f"), [a]).sizes) == {"M": 5}


def test_numpy_scalars_bind_as_zero_dimensional_arrays() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def scale(float(N) A, float s) -> (B) { B(i) = A(i) * s }")
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(engine.scale(a, np.float32(2)), a * 2)
    with pytest.raises(TCInputError, match="must be float32, but the array is float64"):
        engine.scale(a, np.float64(2))
