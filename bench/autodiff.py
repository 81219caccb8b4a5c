"""Training with tcpy: forward + backward of common layers written in TC, as `tcpy.torch`
operators, against PyTorch eager and `torch.compile` on the CPU; the backwards' work
against their minimum; the overhead of an operator call; and two small models trained
with tcpy operators against PyTorch's losses.

    python bench/autodiff.py [--only layernorm,softmax] [--no-train] [--tag NAME]
                             [--device cuda] [--no-compile] [--save auto|all|none]
                             [--out bench/results] [--smoke]

For each layer: the forward and backward of tcpy's operator (its backward derived by
`tcpy.gradient`), of PyTorch's eager functions, and of `torch.compile` (inductor) over
the eager function, each checked against eager first, then timed in alternating blocks
after a pause (`bench.cpu.alternating_blocks`), medians. A row's ratio is eager's time
over tcpy's (above 1: tcpy is faster). For the backward def: its statement instances over
the forward's (a contraction's backward does twice its forward's work: 2.0 is the
least), and the bytes its statements stream (each statement reading and writing its
tensors once) over the least it must move (its inputs read once, its gradients
written once).

Overhead: a `tcpy.torch` operator on 16 elements against the engine's call of the same
def, the compiled kernel alone, PyTorch's own `torch.add`, and two Python operators that
do nothing (PyTorch's floor: one made by `torch.library.custom_op`, one registered with
`torch.library.Library` as `tcpy.torch` registers its own).

Training: a two-layer MLP and a small convolutional network, 200 steps of SGD each, with
tcpy operators and with PyTorch's, in float64 and float32: the largest relative
difference of the losses (targets 1e-5 and 1e-3) and the time per step (the first,
which compiles, left out).

With `--device cuda` the layers' tensors live on the GPU (tcpy's `cuda` target), each
timed call ends with `torch.cuda.synchronize()` and PyTorch's TF32 is off; the overhead
is then that of a call on CUDA tensors. `--save` is what the backwards take from the
forwards rather than recompute (`tcpy.torch.define`'s `save`, default auto).
`--no-compile` leaves `torch.compile` out (its
first compile takes tens of seconds a layer on a GPU).

`--smoke` checks that the benchmark still runs: each layer timed once, the overhead
over one round of `SMOKE_CALLS` calls, `SMOKE_STEPS` training steps; its file is tagged
`smoke`. Results go to `bench/results/autodiff-<date>[-<tag>].json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
import tcpy.torch
from bench.cpu import SMOKE_BLOCKS, Blocks, _cpu_name, alternating_blocks
from bench.suite import smoke_tag
from tcpy.parser import check_source

BLOCKS = Blocks(least=3, most=500)
SMOKE_CALLS, SMOKE_STEPS = 100, 3  # the overhead's calls and the training steps, --smoke


@dataclass(frozen=True)
class Layer:
    """A layer in TC, its entry, its inputs (float32; the ones that require gradients
    marked), and PyTorch's eager version of it."""

    name: str
    tc: str
    entry: str
    inputs: Callable[[torch.Generator], list[torch.Tensor]]
    eager: Callable[..., torch.Tensor]


def _randn(g: torch.Generator, *shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, generator=g).requires_grad_(grad)


LAYERS = [
    Layer(
        "layernorm",
        """
def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y) {
    mean(n) +=! X(n, d) / D
    var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
    Y(n, d) = gamma(d) * (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5) + beta(d)
}""",
        "layernorm",
        lambda g: [_randn(g, 512, 768), _randn(g, 768), _randn(g, 768)],
        lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
    ),
    Layer(
        "softmax",
        """
def softmax(float(N, D) X) -> (Y) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    Y(n, d) = e(n, d) / s(n)
}""",
        "softmax",
        lambda g: [_randn(g, 512, 1024)],
        lambda x: torch.softmax(x, -1),
    ),
    Layer(
        "conv2d",
        """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
}""",
        "conv2d",
        lambda g: [_randn(g, 8, 16, 32, 32), _randn(g, 32, 16, 3, 3)],
        lambda i, w: F.conv2d(i, w),
    ),
    Layer(
        "maxpool",
        """
def maxpool(float(N, C, H, W) I) -> (O) {
    O(n, c, h, w) max=! I(n, c, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2
}""",
        "maxpool",
        lambda g: [_randn(g, 8, 32, 64, 64)],
        lambda i: F.max_pool2d(i, 2),
    ),
    Layer(
        "linear_gelu",
        """
def linear_gelu(float(B, I) X, float(O, I) W, float(O) b) -> (Y) {
    Z(n, o) +=! X(n, i) * W(o, i)
    Y(n, o) = 0.5 * (Z(n, o) + b(o)) * (1 + erf((Z(n, o) + b(o)) * 0.70710678))
}""",
        "linear_gelu",
        lambda g: [_randn(g, 256, 512), _randn(g, 512, 512), _randn(g, 512)],
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
    ),
    Layer(
        "embedding_bag",
        """
def embedding_bag(float(V, D) E, int32(B, L) idx) -> (O) {
    O(b, d) +=! E(idx(b, l), d) / L
}""",
        "embedding_bag",
        lambda g: [
            _randn(g, 1000, 64),
            torch.randint(0, 1000, (128, 8), generator=g, dtype=torch.int32),
        ],
        lambda e, idx: F.embedding_bag(idx.long(), e, mode="mean"),
    ),
    Layer(
        "cross_entropy",
        """
def cross_entropy(float(B, K) X, int32(B) label) -> (loss) {
    mx(b) max=! X(b, k)
    s(b) +=! exp(X(b, k) - mx(b))
    loss() +=! (log(s(b)) + mx(b) - X(b, label(b))) / B
}""",
        "cross_entropy",
        lambda g: [
            _randn(g, 256, 1000),
            torch.randint(0, 1000, (256,), generator=g, dtype=torch.int32),
        ],
        lambda x, label: F.cross_entropy(x, label.long()),
    ),
]


DEVICE = "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _fwd_bwd(fn: Callable[..., torch.Tensor], args: list[torch.Tensor]) -> Callable[[], object]:
    """One forward and backward: the gradients of every input that requires one, for
    a fixed random gradient of the output."""
    diff = [a for a in args if a.requires_grad]
    out = fn(*args)
    seed = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def run() -> object:
        return torch.autograd.grad(fn(*args), diff, seed)

    return run


def _work(layer: Layer, ops: tcpy.torch.Ops, args: list[torch.Tensor]) -> dict[str, float]:
    """The backward's statement instances over the forward's, and the bytes its
    statements stream over the least it must move."""
    forward = check_source(layer.tc)[layer.entry]
    backward = check_source(ops.backward_source)[f"{layer.entry}_grad"]
    sizes: dict[str, int] = {}
    for t, a in zip(forward.inputs, args, strict=True):
        for extent, n in zip(t.shape, a.shape, strict=True):
            if not extent.is_const and len(extent.terms) == 1:
                sizes.setdefault(str(extent), int(n))
    out = getattr(ops, layer.entry)(*[a.detach() for a in args])
    for t, n in zip(backward.inputs, [*args, out, out], strict=False):
        for extent, d in zip(t.shape, n.shape, strict=False):
            if not extent.is_const and len(extent.terms) == 1:
                sizes.setdefault(str(extent), int(d))

    def nbytes(cdef_tensor: Any) -> int:
        return math.prod(e.evaluate(sizes) for e in cdef_tensor.shape) * 4

    streamed = 0
    for st in backward.statements:
        touched = {st.tensor} | {n.tensor for n in _accesses(st.rhs)}
        streamed += sum(nbytes(backward.tensor(t)) for t in touched)
    least = sum(nbytes(t) for t in backward.inputs if t.scalar.is_float) + sum(
        nbytes(t) for t in backward.outputs
    )
    return {
        "backward_instances_over_forward": round(
            _instances(backward, sizes) / _instances(forward, sizes), 2
        ),
        "backward_bytes_over_least": round(streamed / least, 2),
    }


def _instances(cdef: Any, sizes: dict[str, int]) -> int:
    """The statement instances of `cdef` at `sizes`: each statement's ranges are a box
    (a guard in its body does not shrink it)."""
    return sum(
        math.prod(max(0, r.hi.evaluate(sizes) - r.lo.evaluate(sizes)) for r in st.ranges)
        for st in cdef.statements
    )


def _accesses(e: Any) -> list[Any]:
    from tcpy.parser import ast

    return [n for n in ast.walk(e) if isinstance(n, ast.Access)]


def measure(
    layer: Layer, compile: bool = True, save: str = "auto", blocks: Blocks = BLOCKS
) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ops = tcpy.torch.define(layer.tc, save=save)
    op = getattr(ops, layer.entry)
    args = [
        a.detach().to(DEVICE).requires_grad_(a.requires_grad)
        for a in layer.inputs(torch.Generator().manual_seed(0))
    ]
    compiled = torch.compile(layer.eager) if compile else None
    start = time.perf_counter()
    tcpy_run = _fwd_bwd(op, args)
    first = tcpy_run()  # compiles the forward and the backward
    compile_s = time.perf_counter() - start
    contenders = {"tcpy": tcpy_run, "eager": _fwd_bwd(layer.eager, args)}
    if compiled is not None:
        contenders["compile"] = _fwd_bwd(compiled, args)
    want = contenders["eager"]()
    checked = [first] + ([contenders["compile"]()] if "compile" in contenders else [])
    error = max(
        float(((g - w).abs() / (1 + w.abs())).max())
        for got in checked
        for g, w in zip(got, want, strict=True)  # type: ignore[call-overload]
    )
    ms = alternating_blocks(contenders, blocks, _seconds)
    return {
        "layer": layer.name,
        "shapes": [list(a.shape) for a in args],
        "tcpy_compile_s": round(compile_s, 2),
        "max_rel_error": error,
        **{f"{n}_ms": round(v, 3) for n, v in ms.items()},
        "ratio_vs_eager": round(ms["eager"] / ms["tcpy"], 3),
        "ratio_vs_compile": round(ms["compile"] / ms["tcpy"], 3) if "compile" in ms else None,
        **_work(layer, ops, args),
    }


def _empty_custom_op() -> Callable[..., object]:
    """A `torch.library` custom operator with an autograd formula that only returns a
    new empty tensor: what PyTorch's own dispatch of a Python operator costs."""
    name = "tcpy_bench::empty_like_first"
    known = getattr(_empty_custom_op, "op", None)
    if known is not None:
        return known

    def impl(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    op = torch.library.custom_op(name, impl, mutates_args=())
    op.register_fake(lambda x, y: torch.empty_like(x))
    op.register_autograd(lambda ctx, g: (g, g), setup_context=lambda ctx, inputs, output: None)
    _empty_custom_op.op = op  # type: ignore[attr-defined]
    return op


def _empty_library_op() -> Callable[..., object]:
    """An operator that does nothing, registered as `tcpy.torch` registers its own
    (`torch.library.Library`: schema, CPU and CUDA kernels, fake, autograd formula)."""
    known = getattr(_empty_library_op, "op", None)
    if known is not None:
        return known
    lib = torch.library.Library("tcpy_bench", "FRAGMENT")
    lib.define("empty_like_first_lib(Tensor x, Tensor y) -> Tensor")
    for device in ("CPU", "CUDA"):
        lib.impl("empty_like_first_lib", lambda x, y: torch.empty_like(x), device)
    name = "tcpy_bench::empty_like_first_lib"
    torch.library.register_fake(name, lambda x, y: torch.empty_like(x), lib=lib)
    torch.library.register_autograd(
        name, lambda ctx, g: (g, g), setup_context=lambda ctx, inputs, output: None, lib=lib
    )
    op = torch.ops.tcpy_bench.empty_like_first_lib.default
    _empty_library_op.op = op  # type: ignore[attr-defined]
    _empty_library_op.lib = lib  # type: ignore[attr-defined]  (kept alive)
    return op


def overhead(rounds: int = 7, calls: int = 5000) -> dict[str, float]:
    """A `tcpy.torch` operator call on 16 elements, beside the engine's call, the kernel
    alone, `torch.add` and a custom operator that does nothing (PyTorch's floor for an
    operator written in Python), in µs (best of `rounds` rounds of `calls` calls)."""
    source = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
    ops = tcpy.torch.define(source)
    engine = tcpy.ExecutionEngine("cuda" if DEVICE == "cuda" else "cpu")
    engine.define(source)
    a, b = torch.rand(16, device=DEVICE), torch.rand(16, device=DEVICE)
    floor, library_floor = _empty_custom_op(), _empty_library_op()
    paths = {
        "torch_op": lambda: ops.add(a, b),
        "custom_op_floor": lambda: floor(a, b),
        "library_op_floor": lambda: library_floor(a, b),
        "engine_call": lambda: engine.add(a, b),
        "torch_add": lambda: torch.add(a, b),
    }
    if DEVICE == "cpu":
        an, bn = a.numpy(), b.numpy()
        kernel = engine.compile("add", an, bn)
        out = np.empty(16, np.float32)
        paths["kernel_unchecked"] = lambda: kernel(an, bn, out=out, unchecked=True)

    def best(fn: Callable[[], object]) -> float:
        fn()
        per_call = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync()
            per_call.append((time.perf_counter() - t0) / calls)
        return min(per_call) * 1e6

    us = {n: round(best(fn), 2) for n, fn in paths.items()}
    if "kernel_unchecked" in us:
        us["torch_op_over_kernel"] = round(us["torch_op"] - us["kernel_unchecked"], 2)
    return us


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

CONVNET = """
def conv_relu(double(N, C, H, W) I, double(F, C, KH, KW) Wt, double(F) b) -> (O) {
    O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw)
    O(n, f, h, w) = fmax(O(n, f, h, w) + b(f), 0)
}
def pool(double(N, F, H, W) I) -> (O) {
    O(n, f, h, w) max=! I(n, f, 2 * h + kh, 2 * w + kw) where kh in 0:2, kw in 0:2
}
def head(double(N, F, H, W) X, double(K, F, H, W) Wt, double(K) b) -> (Y) {
    Y(n, k) +=! X(n, f, h, w) * Wt(k, f, h, w)
    Y(n, k) = Y(n, k) + b(k)
}
"""


def train(model: str, dtype: torch.dtype, steps: int = 200) -> dict[str, Any]:
    """`steps` steps (at least 2) of SGD on random data, the model in tcpy operators and
    in PyTorch's."""
    source = MLP if model == "mlp" else CONVNET
    if dtype == torch.float32:
        source = source.replace("double", "float")
    ops = tcpy.torch.define(source)
    g = torch.Generator().manual_seed(0)
    if model == "mlp":
        x, y = (
            torch.randn(64, 32, generator=g, dtype=dtype),
            torch.randn(64, 4, generator=g, dtype=dtype),
        )
        shapes = [(64, 32), (64,), (4, 64), (4,)]
    else:
        x, y = (
            torch.randn(128, 3, 12, 12, generator=g, dtype=dtype),
            torch.randn(128, 5, generator=g, dtype=dtype),
        )
        shapes = [(8, 3, 3, 3), (8,), (5, 8, 5, 5), (5,)]
    init = [torch.randn(s, generator=g, dtype=dtype) * 0.2 for s in shapes]

    def tcpy_model(x: torch.Tensor, p: list[torch.Tensor]) -> torch.Tensor:
        if model == "mlp":
            return ops.linear(ops.linear_relu(x, p[0], p[1]), p[2], p[3])
        return ops.head(ops.pool(ops.conv_relu(x, p[0], p[1])), p[2], p[3])

    def torch_model(x: torch.Tensor, p: list[torch.Tensor]) -> torch.Tensor:
        if model == "mlp":
            return F.linear(F.relu(F.linear(x, p[0], p[1])), p[2], p[3])
        h = F.max_pool2d(F.relu(F.conv2d(x, p[0], p[1])), 2)
        return torch.einsum("nfhw,kfhw->nk", h, p[2]) + p[3]

    runs = {}
    for name, forward in (("tcpy", tcpy_model), ("torch", torch_model)):
        params = [p.clone().requires_grad_() for p in init]
        opt = torch.optim.SGD(params, lr=0.01)
        losses = []
        for step in range(steps):
            if step == 1:  # the first step compiles tcpy's kernels: not timed
                start = time.perf_counter()
            opt.zero_grad()
            loss = ((forward(x, params) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        runs[name] = (losses, (time.perf_counter() - start) / (steps - 1) * 1e3)
    ours, theirs = np.array(runs["tcpy"][0]), np.array(runs["torch"][0])
    return {
        "model": model,
        "dtype": str(dtype).removeprefix("torch."),
        "loss_first": float(theirs[0]),
        "loss_last": float(theirs[-1]),
        "max_rel_loss_difference": float(np.max(np.abs(ours - theirs) / np.abs(theirs))),
        "tcpy_ms_per_step": round(runs["tcpy"][1], 3),
        "torch_ms_per_step": round(runs["torch"][1], 3),
    }


def _geomean(values: list[float]) -> float | None:
    return round(math.exp(statistics.mean(map(math.log, values))), 3) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="layers to run, by name, comma-separated")
    parser.add_argument("--no-train", action="store_true", help="skip the training runs")
    parser.add_argument("--train-only", action="store_true", help="only the training runs")
    parser.add_argument("--tag", help="appended to the result file's name")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--save", choices=["auto", "all", "none"], default="auto",
                        help="what backwards take from the forwards (default auto)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--smoke", action="store_true", help="each timed once: does it run?")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    # FP32 against FP32: PyTorch's CUDA convolutions use TF32 unless told not to
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    chosen = [layer for layer in LAYERS if not args.only or layer.name in args.only.split(",")]
    chosen = [] if args.train_only else chosen
    blocks = SMOKE_BLOCKS if args.smoke else BLOCKS
    rows = []
    for layer in chosen:
        row = measure(layer, compile=not args.no_compile, save=args.save, blocks=blocks)
        rows.append(row)
        print(
            f"{row['layer']:14} tcpy {row['tcpy_ms']:9.3f} ms  eager {row['eager_ms']:9.3f}  "
            f"compile {row.get('compile_ms')}  vs eager {row['ratio_vs_eager']:6.3f}x  "
            f"vs compile {row['ratio_vs_compile']}x  "
            f"work {row['backward_instances_over_forward']}x  "
            f"bytes {row['backward_bytes_over_least']}x",
            flush=True,
        )
    geo = _geomean([r["ratio_vs_eager"] for r in rows])
    geo_c = _geomean([r["ratio_vs_compile"] for r in rows if r["ratio_vs_compile"]])
    print(f"geometric mean vs eager {geo}x, vs torch.compile {geo_c}x")
    calls = (1, SMOKE_CALLS) if args.smoke else (7, 5000)
    over = {} if args.train_only else overhead(*calls)
    print("overhead (us):", over)
    training = []
    if not args.no_train:
        for model in ("mlp", "convnet"):
            for dtype in (torch.float64, torch.float32):
                t = train(model, dtype, SMOKE_STEPS if args.smoke else 200)
                training.append(t)
                print("train", t, flush=True)
    result = {
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "cpu": _cpu_name(),
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "layers": rows,
        "geomean_vs_eager": geo,
        "geomean_vs_compile": geo_c,
        "overhead_us": over,
        "training": training,
        "save": args.save,
    }
    tag = smoke_tag(args.tag or "", args.smoke)
    name = f"autodiff-{result['date']}" + (f"-{tag}" if tag else "") + ".json"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
