"""Arrays in and out of a call: the caller's library comes back, DLPack is taken,
`out=` writes into the caller's arrays, and gradients are refused with a clear error.

The PyTorch tests run against a real `torch` (the CPU build; CI installs it where it
can) and skip without it."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy

SOURCE = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
def two(float(N) X) -> (S, D) {
    S(i) = X(i) + 1
    D(i) = X(i) * 2
}
def acc(float(N) X) -> (O) {
    O(i) += X(i)
}
"""

TARGETS = ["reference", "cpu", "cuda-emu"]

# `acc` starts from zero on purpose (the warning says to write `+=!`)
pytestmark = pytest.mark.filterwarnings("ignore:.*is not initialised before")


@pytest.fixture(scope="module", params=TARGETS)
def engine(request: pytest.FixtureRequest) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(request.param)
    engine.define(SOURCE)
    return engine


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((5, 7), dtype=np.float32), rng.random((7, 3), dtype=np.float32)


# --- out= ---------------------------------------------------------------------------


def test_out_receives_the_result_and_is_returned(engine: tcpy.ExecutionEngine) -> None:
    a, b = _inputs()
    out = np.full((5, 3), 123.0, np.float32)
    returned = engine.mm(a, b, out=out)
    assert returned is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_out_is_only_a_destination(engine: tcpy.ExecutionEngine) -> None:
    """A reduction without `!` starts from zero, whatever `out` held before."""
    x = np.arange(6, dtype=np.float32)
    out = np.full(6, 1000.0, np.float32)
    engine.acc(x, out=out)
    np.testing.assert_array_equal(out, x)


def test_out_for_several_outputs(engine: tcpy.ExecutionEngine) -> None:
    x = np.arange(4, dtype=np.float32)
    s, d = np.empty(4, np.float32), np.empty(4, np.float32)
    returned = engine.two(x, out=(s, d))
    assert returned[0] is s and returned[1] is d
    np.testing.assert_array_equal(s, x + 1)
    np.testing.assert_array_equal(d, x * 2)


def test_out_that_is_an_input_gives_the_result_without_out(
    engine: tcpy.ExecutionEngine,
) -> None:
    """C = A @ B written into A itself: a kernel writing C(m, n) while later terms
    still read A(m, n) would give a wrong product."""
    rng = np.random.default_rng(1)
    a, b = rng.random((6, 6), dtype=np.float32), rng.random((6, 6), dtype=np.float32)
    want = a @ b
    assert engine.mm(a, b, out=a) is a
    np.testing.assert_allclose(a, want, rtol=1e-5)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (np.empty((3, 5), np.float32), "of shape (5, 3), but is float32 of shape (3, 5)"),
        (np.empty((5, 3), np.float64), "must be float32 of shape (5, 3), but is float64"),
        (np.empty((3, 5), np.float32).T, "writable C-contiguous"),
        ([[0.0] * 3] * 5, "must be a NumPy array, a PyTorch tensor or a CuPy array"),
        ((np.empty((5, 3), np.float32), np.empty((5, 3), np.float32)), "out= gives 2"),
    ],
)
def test_bad_out_is_a_clear_error(out: object, message: str) -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    with pytest.raises(tcpy.TCInputError, match="out") as err:
        engine.mm(*_inputs(), out=out)
    assert message in str(err.value)


def test_read_only_out_is_refused() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    out = np.empty((5, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(tcpy.TCInputError, match="writable"):
        engine.mm(*_inputs(), out=out)


def test_outs_that_overlap_are_refused() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    buffer = np.empty(5, np.float32)
    with pytest.raises(tcpy.TCInputError, match="share memory"):
        engine.two(np.ones(4, np.float32), out=(buffer[:4], buffer[1:]))


def test_compiled_kernel_takes_out_checked_and_unchecked() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    a, b = _inputs()
    kernel = engine.compile("mm", a, b)
    for unchecked in (False, True):
        out = np.zeros((5, 3), np.float32)
        assert kernel(a, b, out=out, unchecked=unchecked) is out
        np.testing.assert_allclose(out, a @ b, rtol=1e-5)
        np.testing.assert_allclose(kernel(a, b, unchecked=unchecked), a @ b, rtol=1e-5)


def test_unchecked_generic_kernel_reads_the_sizes_of_each_call() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    options = engine.default_options("mm").replace(fix_parameters_before_scheduling=False)
    kernel = engine.compile("mm", *_inputs(), options=options)
    assert kernel.generic
    rng = np.random.default_rng(3)
    a, b = rng.random((9, 4), dtype=np.float32), rng.random((4, 6), dtype=np.float32)
    np.testing.assert_allclose(kernel(a, b, unchecked=True), a @ b, rtol=1e-5)


# --- errors and non-NumPy inputs -----------------------------------------------------


def test_input_error_is_a_value_error() -> None:
    engine = tcpy.ExecutionEngine("reference")
    engine.define(SOURCE)
    with pytest.raises(ValueError, match="input A must have 2 dimension"):
        engine.mm(np.ones(3, np.float32), np.ones((3, 3), np.float32))


class _Producer:
    """A DLPack producer that is not an array of any library tcpy knows."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: object) -> object:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()


def test_any_dlpack_producer_is_an_input(engine: tcpy.ExecutionEngine) -> None:
    a, b = _inputs()
    result = engine.mm(_Producer(a), _Producer(b))
    assert type(result) is np.ndarray
    np.testing.assert_allclose(result, a @ b, rtol=1e-5)


# --- PyTorch ---------------------------------------------------------------------------


def test_torch_in_gives_torch_out(engine: tcpy.ExecutionEngine) -> None:
    torch = pytest.importorskip("torch")
    a, b = (torch.from_numpy(x) for x in _inputs())
    c = engine.mm(a, b)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32 and c.device.type == "cpu"
    torch.testing.assert_close(c, a @ b)
    s, d = engine.two(torch.arange(4, dtype=torch.float32))
    assert isinstance(s, torch.Tensor) and isinstance(d, torch.Tensor)


def test_a_repeated_call_on_torch_cpu_tensors_binds_nothing(
    engine: tcpy.ExecutionEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second call with CPU tensors of the same shapes and dtypes takes the known
    call's kernel and sizes, the tensors as NumPy views; other shapes, a strided view
    and a tensor that requires a gradient are checked as on a first call."""
    torch = pytest.importorskip("torch")
    a, b = (torch.from_numpy(x) for x in _inputs(3))
    torch.testing.assert_close(engine.mm(a, b), a @ b)

    def unexpected(*args: object) -> None:
        raise AssertionError("a known call binds nothing")

    with monkeypatch.context() as patched:
        patched.setattr("tcpy.engine.bind", unexpected)
        c = engine.mm(a * 2, b)  # other values, same shapes
    assert isinstance(c, torch.Tensor)
    torch.testing.assert_close(c, (a * 2) @ b)
    wide = torch.ones(7, 6)
    torch.testing.assert_close(engine.mm(a, wide), a @ wide)  # new shapes: bound, compiled
    strided = torch.ones(3, 14)[:, ::2].T  # (7, 3), not contiguous
    torch.testing.assert_close(engine.mm(a, strided), a @ strided)
    with pytest.raises(tcpy.TCInputError, match="requires a gradient"):
        engine.mm(a, b.clone().requires_grad_())


def test_torch_inputs_are_not_copied() -> None:
    """A torch CPU tensor is seen through its memory: writing the array tcpy sees
    shows in the tensor."""
    torch = pytest.importorskip("torch")
    from tcpy.arrays import host_view

    t = torch.zeros(4)
    view = host_view("X", t, np.dtype(np.float32))
    view[2] = 7.0
    assert t[2].item() == 7.0


def test_torch_out(engine: tcpy.ExecutionEngine) -> None:
    torch = pytest.importorskip("torch")
    a, b = (torch.from_numpy(x) for x in _inputs())
    out = torch.empty(5, 3)
    assert engine.mm(a, b, out=out) is out
    torch.testing.assert_close(out, a @ b)


def test_torch_dlpack_capsule_is_an_input(engine: tcpy.ExecutionEngine) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.dlpack import to_dlpack

    a, b = _inputs()
    capsules = to_dlpack(torch.from_numpy(a)), to_dlpack(torch.from_numpy(b))
    np.testing.assert_allclose(engine.mm(*capsules), a @ b, rtol=1e-5)


def test_torch_wrong_dtype_hint_is_torch() -> None:
    torch = pytest.importorskip("torch")
    engine = tcpy.ExecutionEngine("reference")
    engine.define(SOURCE)
    with pytest.raises(tcpy.TCInputError, match=r"x\.to\(torch\.float32\)"):
        engine.mm(torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2))


def test_tensor_requiring_grad_is_refused() -> None:
    torch = pytest.importorskip("torch")
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    a = torch.ones(2, 2, requires_grad=True)
    refused = r"input A requires a gradient.*tcpy\.torch\.define.*A\.detach\(\)"
    with pytest.raises(tcpy.TCInputError, match=refused):
        engine.mm(a, torch.ones(2, 2))
    with pytest.raises(tcpy.TCInputError, match="out C requires a gradient"):
        engine.mm(torch.ones(2, 2), torch.ones(2, 2), out=torch.ones(2, 2, requires_grad=True))
    np.testing.assert_allclose(engine.mm(a.detach(), torch.ones(2, 2)).numpy(), 2.0)
