"""tcpy defs as PyTorch operators (`tcpy.torch`): every differentiable corpus program
passes `torch.autograd.gradcheck` (float64, its fast mode: the Jacobian along random
directions; `tests/test_autodiff.py` checks the same backwards against finite
differences) and `torch.library.opcheck`, compiles under
`torch.compile(fullgraph=True)` with no graph break and gives eager's outputs and
gradients; operators are named deterministically; a hand-written backward, none, and a
second derivative; a small MLP trained with tcpy operators gives PyTorch's losses."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tcpy

import gradients
from corpus_cases import CASES, Case
from programs import LAYERNORM64

torch = pytest.importorskip("torch")
import tcpy.torch  # noqa: E402  (after PyTorch is known to be there)

DIFFERENTIABLE = gradients.differentiable(CASES)
INDUCTOR = ["matmul", "layernorm", "softmax", "conv2d", "maxpool2x2", "gelu"]
OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor",
            "test_aot_dispatch_dynamic")  # fmt: skip
FIRST_OUTPUT_INTEGER = {"argmax"}  # `-> (idx, mx)`


def _op(case: Case) -> tuple[object, tuple]:
    """The corpus case's operator (float64) and its arguments, the floats requiring
    gradients."""
    source, inputs = gradients.case64(case)
    ops = tcpy.torch.define(source)
    args = tuple(
        torch.from_numpy(np.array(a)).requires_grad_(np.asarray(a).dtype.kind == "f")
        for a in inputs
    )
    return getattr(ops, case.entry), args


def _floats(op: object) -> object:
    """`op` returning its float outputs only (gradcheck differentiates each output)."""

    def call(*args: object) -> tuple:
        out = op(*args)  # type: ignore[operator]
        out = out if isinstance(out, tuple) else (out,)
        return tuple(o for o in out if o.is_floating_point())

    return call


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_corpus_operators_pass_gradcheck_and_opcheck(case: Case) -> None:
    op, args = _op(case)
    if case.name in gradients.NO_RULE:
        out = op(*args)
        loss = sum(o.sum() for o in (out if isinstance(out, tuple) else (out,)))
        with pytest.raises(tcpy.TCGradientError, match="has no gradient"):
            loss.backward()
        return
    assert torch.autograd.gradcheck(_floats(op), args, fast_mode=True)
    checks = OPCHECKS
    if case.name in FIRST_OUTPUT_INTEGER:  # PyTorch's AOT check sums the outputs into
        checks = OPCHECKS[:-1]  # the first one's dtype, and fails on the float ones
    results = torch.library.opcheck(op, args, test_utils=checks)
    assert set(results.values()) == {"SUCCESS"}, results


def _loss(out: object) -> object:
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o.sin() * (k + 1)).sum() for k, o in enumerate(outs) if o.is_floating_point())


def _compiled_matches_eager(op: object, args: tuple, backend: str, dynamic: bool = False) -> None:
    def fn(*a: object) -> object:
        return _loss(op(*a))  # type: ignore[operator]

    compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)
    results = []
    for run in (fn, compiled):
        for a in args:
            a.grad = None
        loss = run(*args)
        loss.backward()
        results.append((loss.detach(), [a.grad for a in args if a.requires_grad]))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_corpus_operators_compile_with_no_graph_break(case: Case) -> None:
    """`fullgraph=True` fails on any graph break; aot_eager runs the traced forward and
    backward graphs, which call the operators."""
    if case.name in gradients.NO_RULE:
        pytest.skip("no gradient to compile")
    torch._dynamo.reset()
    op, args = _op(case)
    _compiled_matches_eager(op, args, "aot_eager")


@pytest.mark.parametrize("name", INDUCTOR)
def test_inductor_compiles_code_around_the_operators(name: str) -> None:
    torch._dynamo.reset()
    op, args = _op(next(c for c in CASES if c.name == name))
    _compiled_matches_eager(op, args, "inductor")


def test_symbolic_sizes_reach_the_fake_implementation() -> None:
    """Compiled for any size: the output shapes come from range inference on symbolic
    sizes (`H - KH + 1`), so a second image size reuses the graph."""
    torch._dynamo.reset()
    op, args = _op(next(c for c in CASES if c.name == "conv2d"))
    _compiled_matches_eager(op, args, "aot_eager", dynamic=True)
    graphs: list[object] = []

    def backend(gm: object, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward  # type: ignore[attr-defined]

    compiled = torch.compile(lambda i, w: op(i, w), fullgraph=True, backend=backend, dynamic=True)
    weights = torch.ones(4, 3, 3, 3, dtype=torch.float64)
    for size in (9, 12):
        image = torch.ones(2, 3, size, size, dtype=torch.float64)
        assert compiled(image, weights).shape == (2, 4, size - 2, size - 2)
    assert len(graphs) == 1


def test_the_same_source_gives_the_same_operators() -> None:
    source = "def mm(double(M,K) A, double(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    first, second = tcpy.torch.define(source), tcpy.torch.define(source)
    assert first.mm is second.mm
    other = tcpy.torch.define(source.replace("A(m,k)", "2 * A(m,k)"))
    assert other.mm is not first.mm
    a, b = torch.ones(2, 3, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)
    assert float(other.mm(a, b)[0, 0]) == 2 * float(first.mm(a, b)[0, 0])
    assert first.mm.name().startswith("tcpy::mm_")


def test_a_hand_written_backward() -> None:
    """TC's `make_autograd` form: the backward is given as TC, with the interface of a
    derived one (parameters named after the forward's inputs, outputs and `d_<output>`)."""
    forward = "def square(double(N) X) -> (Y) { Y(i) = X(i) * X(i) }"
    backward = "def square_grad(double(N) X, double(N) d_Y) -> (d_X) { d_X(i) = 3 * d_Y(i) }"
    ops = tcpy.torch.define(forward, backward=backward)
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    ops.square(x).sum().backward()
    assert x.grad.tolist() == [3.0] * 4  # the given formula, wrong on purpose


def test_no_backward() -> None:
    ops = tcpy.torch.define("def twice(double(N) X) -> (Y) { Y(i) = 2 * X(i) }", backward=None)
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(tcpy.TCGradientError, match="twice has no backward"):
        ops.twice(x).sum().backward()
    assert ops.twice(x.detach()).tolist() == [2.0] * 3


def test_a_second_derivative_is_a_clear_error() -> None:
    ops = tcpy.torch.define("def cube(double(N) X) -> (Y) { Y(i) = X(i) * X(i) * X(i) }")
    x = torch.full((3,), 2.0, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(ops.cube(x).sum(), x, create_graph=True)
    assert g.tolist() == [12.0] * 3
    with pytest.raises(tcpy.TCGradientError, match="first derivatives only"):
        g.sum().backward()


def test_outputs_are_contiguous_and_scalar_inputs_are_0d_tensors() -> None:
    ops = tcpy.torch.define("def scale(double(M,N) X, double s) -> (Y) { Y(m,n) = s * X(m,n) }")
    x = torch.arange(6.0, dtype=torch.float64).reshape(2, 3).t()  # not contiguous
    s = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    y = ops.scale(x, s)
    assert y.is_contiguous() and y.shape == (3, 2)
    torch.testing.assert_close(y, 2 * x)
    y.sum().backward()
    assert float(s.grad) == float(x.sum())


def test_an_engine_still_refuses_tensors_that_require_gradients() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def twice(double(N) X) -> (Y) { Y(i) = 2 * X(i) }")
    with pytest.raises(tcpy.TCInputError, match=r"tcpy\.torch\.define"):
        engine.twice(torch.ones(3, dtype=torch.float64, requires_grad=True))


MLP = """
def linear_relu(double(B, I) X, double(H, I) W, double(H) b) -> (Y) {
    Y(n, h) +=! X(n, i) * W(h, i)
    Y(n, h) = fmax(Y(n, h) + b(h), 0)
}
def linear(double(B, H) X, double(O, H) W, double(O) b) -> (Y) {
    Y(n, o) +=! X(n, h) * W(o, h)
    Y(n, o) = Y(n, o) + b(o)
}
"""


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_training_a_two_layer_mlp_gives_pytorchs_losses(dtype: str) -> None:
    """200 steps of SGD on a regression, the same model in tcpy operators and in
    PyTorch's: the losses agree to 1e-5 (float64) and 1e-3 (float32), relatively."""
    source = MLP if dtype == "float64" else MLP.replace("double", "float")
    ops = tcpy.torch.define(source)
    tdtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=gen, dtype=tdtype)
    target = torch.randn(32, 2, generator=gen, dtype=tdtype)
    init = [torch.randn(16, 8, generator=gen, dtype=tdtype) * 0.3,
            torch.zeros(16, dtype=tdtype), torch.randn(2, 16, generator=gen, dtype=tdtype) * 0.3,
            torch.zeros(2, dtype=tdtype)]  # fmt: skip

    def train(forward: object) -> list[float]:
        params = [p.clone().requires_grad_() for p in init]
        opt = torch.optim.SGD(params, lr=0.05)
        losses = []
        for _ in range(200):
            opt.zero_grad()
            loss = ((forward(x, *params) - target) ** 2).mean()  # type: ignore[operator]
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses

    def with_tcpy(x: object, w1: object, b1: object, w2: object, b2: object) -> object:
        return ops.linear(ops.linear_relu(x, w1, b1), w2, b2)

    def with_torch(x: object, w1: object, b1: object, w2: object, b2: object) -> object:
        f = torch.nn.functional
        return f.linear(f.relu(f.linear(x, w1, b1)), w2, b2)

    ours, theirs = train(with_tcpy), train(with_torch)
    rtol = 1e-5 if dtype == "float64" else 1e-3
    np.testing.assert_allclose(ours, theirs, rtol=rtol)
    assert ours[-1] < 0.5 * ours[0]


@pytest.mark.gpu
def test_cuda_tensors_run_on_the_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = tcpy.torch.define(
            "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
        )
    a = torch.randn(64, 32, device="cuda", requires_grad=True)
    b = torch.randn(32, 16, device="cuda", requires_grad=True)
    c = ops.mm(a, b)
    assert c.is_cuda
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    c.sum().backward()
    torch.testing.assert_close(
        a.grad, torch.ones(64, 16, device="cuda") @ b.t(), rtol=1e-4, atol=1e-4
    )
    # the backward is the first CUDA work of autograd's device thread: tcpy's context
    # must be made current there
    seed = torch.randn(64, 16, device="cuda")
    da, db = torch.autograd.grad(ops.mm(a, b), (a, b), seed)
    torch.testing.assert_close(da, seed @ b.t(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, a.t() @ seed, rtol=1e-4, atol=1e-4)


def _operators_run(fn: object, qualified: str) -> set[str]:
    """The operators of def `qualified` that calling `fn` ran: "" for the def's own,
    else the suffix of its private ones (`_forward`, `_saving`, `_grad`)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()  # type: ignore[operator]
    return {e.name[len(qualified) :] for e in prof.events() if e.name.startswith(qualified)}


def test_the_backward_takes_the_values_the_forward_saved() -> None:
    """`save="auto"` (the default): a layer norm's mean and variance come from the
    forward that saves them where a gradient is asked for, and the plain forward runs
    where none is (and, with the formula, where the backward saves nothing); the
    gradients are those of the backward that recomputes them."""
    ops, recomputing = tcpy.torch.define(LAYERNORM64), tcpy.torch.define(LAYERNORM64, save="none")
    assert isinstance(ops.ln, torch._ops.OpOverload)
    assert "def ln_saving(" in ops.backward_source
    assert "ln_saving" not in recomputing.backward_source
    rng = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=rng, dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, generator=rng, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(4, 6, generator=rng, dtype=torch.float64)

    def grads(op: object) -> tuple:
        return torch.autograd.grad((op(x, g) * seed).sum(), (x, g))  # type: ignore[operator]

    name = ops.ln.name()
    assert _operators_run(lambda: grads(ops.ln), name) == {"", "_saving", "_grad"}
    with torch.no_grad():
        assert _operators_run(lambda: ops.ln(x, g), name) == {"", "_forward"}
        plain = ops.ln(x, g)
    other = recomputing.ln.name()
    assert _operators_run(lambda: grads(recomputing.ln), other) == {"", "_forward", "_grad"}
    for got, want in zip(grads(ops.ln), grads(recomputing.ln), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ops.ln(x, g).detach(), plain, rtol=1e-14, atol=1e-14)
    assert torch.autograd.gradcheck(ops.ln, (x, g))
    compiled = torch.compile(
        lambda a, b: (ops.ln(a, b) * seed).sum(), fullgraph=True, backend="aot_eager"
    )
    for got, want in zip(torch.autograd.grad(compiled(x, g), (x, g)), grads(ops.ln), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_eager_calls_run_the_kernels_directly_and_give_the_operators_results() -> None:
    """Outside any tracing, a call runs its kernels straight from the operator's Python
    (no second dispatch through the private operators); with the profiler on, the
    operators run and are recorded (`test_the_backward_takes_the_values_the_forward_saved`).
    Both give the same bits, and a graph asked of the backward still raises on a second
    derivative."""
    ops = tcpy.torch.define(LAYERNORM64)
    rng = torch.Generator().manual_seed(1)
    x = torch.randn(5, 7, generator=rng, dtype=torch.float64, requires_grad=True)
    g = torch.randn(7, generator=rng, dtype=torch.float64, requires_grad=True)
    seed = torch.randn(5, 7, generator=rng, dtype=torch.float64)

    def grads() -> tuple:
        return (ops.ln(x, g).detach(), *torch.autograd.grad((ops.ln(x, g) * seed).sum(), (x, g)))

    assert type(ops.ln(x, g).grad_fn).__name__ == "DirectBackward"
    direct = grads()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert type(ops.ln(x, g).grad_fn).__name__ != "DirectBackward"
        recorded = grads()
    for a, b in zip(direct, recorded, strict=True):
        assert torch.equal(a, b)
    (dx,) = torch.autograd.grad(ops.ln(x, g).sum(), x, create_graph=True)
    with pytest.raises(tcpy.TCGradientError, match="first derivatives only"):
        dx.sum().backward()


def test_outputs_of_a_megabyte_come_from_the_host_pool() -> None:
    """An output of 1 MB or more that the kernel writes whole is a block of the host
    pool: once the caller lets it go, the next call's output takes its pages again
    (fresh pages fault at their first write); smaller ones are plain tensors."""
    ops = tcpy.torch.define("def twice(float(N) A) -> (B) { B(i) = A(i) * 2 }")
    big, small = torch.ones(1 << 18), torch.ones(16)
    ops.twice(big)  # the first call goes through the engine and makes the ready call
    first = ops.twice(big)
    where = first.data_ptr()
    torch.testing.assert_close(first, big * 2)
    del first
    again = ops.twice(big)
    assert again.data_ptr() == where
    torch.testing.assert_close(again, big * 2)
    kept = ops.twice(big)  # the block is taken: another one
    assert kept.data_ptr() != again.data_ptr()
    torch.testing.assert_close(ops.twice(small), small * 2)
