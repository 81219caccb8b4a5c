"""The registration of a source's defs as PyTorch operators (`define`).

Each def `f` of a source becomes the operator `tcpy::f_<digest>`, the digest a
hash of the source, the options, the backward asked for and tcpy's version: defining
the same source twice gives the same operators, and two sources with a def of the
same name do not clash. Its backward, where it has one, is `tcpy::f_<digest>_grad`.
They are registered with `torch.library.Library` (a schema, the kernel for CPU and
CUDA tensors, a fake implementation, an autograd formula): the registrations
`torch.library.custom_op` makes, without the checks it wraps every call in (a dozen
microseconds a call, a small kernel's time).

A def with a backward is a composite operator (PyTorch's `CompositeImplicitAutograd`):
without a gradient asked for, it calls `tcpy::f_<digest>_forward`, the plain kernel;
with one, where the backward takes values the forward computed by a reduction
(`save="auto"`, `tcpy.autodiff.derive`: a layer norm's mean and variance, a linear
layer's product before its activation) rather than recompute them,
`tcpy::f_<digest>_saving`, whose kernel also returns those values and whose autograd
formula hands them to the backward, else `tcpy::f_<digest>_forward` again, which
carries the formula. The saving and the plain kernels compute the outputs by the same
statements; they may be fused differently, so the outputs may differ in their last
bits between the two modes. Eager calls that nothing traces skip the dispatcher's
second pass and `torch.library`'s autograd layers (`_direct`).

Decisions: a 0-d input (`float eps`) is a 0-d tensor in the operator's schema, like
every input, so that it may require a gradient; outputs are new contiguous tensors;
the autograd formula saves the inputs and only the outputs its backward reads; a second
derivative, or a gradient of a def defined without a backward, is a `TCGradientError`
when it is asked for; under `torch.autocast` the operators are not cast (PyTorch casts
only the operators it knows): they run in the dtypes they are given, and a def declared
float32 given float16 is an input error.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tcpy.arrays import from_numpy_torch, torch_numpy
from tcpy.autodiff import Derived, Save, derive
from tcpy.cache.kernels import tcpy_version
from tcpy.compiled import Compiled
from tcpy.engine import ExecutionEngine, OptionsArg
from tcpy.errors import TCError, TCGradientError
from tcpy.mapping.options import MappingOptions
from tcpy.parser import CheckedDef, check_source
from tcpy.parser.symbolic import Sym
from tcpy.torch.outputs import POOL
from tcpy.types import ScalarType

NAMESPACE = "tcpy"

POOL_BYTES = 1 << 20
"""Outputs of this many bytes or more come from the tensor pool (`_maker`)."""

_REGISTERED: dict[str, Any] = {}  # by qualified name: the operators defined so far
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")  # their registrations, kept alive
_LOCK = threading.Lock()

Backward = str | None
"""`"auto"` (derived by `tcpy.gradient`), TC source holding a def `<name>_grad` per def
(the interface of `tcpy.gradient`'s backwards, matched by parameter names), or None."""


class Ops:
    """The operators of a source, one attribute per def (the registered operator
    itself); `backward_source` holds the TC of their backwards."""

    def __init__(self, ops: Mapping[str, Any], backward_source: str) -> None:
        """`backward_source`: the backwards, and the forwards that save values for
        them (`<def>_saving`), as TC."""
        for name, op in ops.items():
            setattr(self, name, op)
        self._names = tuple(ops)
        self.backward_source = backward_source

    def __repr__(self) -> str:
        return f"Ops({', '.join(self._names)})"

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._names]


def define(
    source: str,
    *,
    options: OptionsArg = None,
    backward: Backward = "auto",
    save: Save = "auto",
    filename: str | None = None,
) -> Ops:
    """Register every def of `source` as a PyTorch operator (see the module); `options`
    are the forward kernels' mapping options (as for `ExecutionEngine.run`), the
    backwards take their target's defaults; `save`: what a derived backward takes
    from the forward rather than recompute (`tcpy.autodiff.saving.Save`)."""
    with warnings.catch_warnings():
        defs = check_source(source, filename)
    digest = _digest(source, options, backward, save)
    backwards, bsource = _backwards(source, defs, backward, save, filename)
    kernels = _Kernels(source, bsource, options, filename)
    ops = {}
    with _LOCK:
        for name, cdef in defs.items():
            ops[name] = _operator(name, cdef, digest, kernels, backwards.get(name))
    return Ops(ops, bsource)


@dataclass(frozen=True)
class _Gradient:
    """A def's backward, and the forward that returns the values the backward takes
    from it after its outputs (`saving`; None where it takes none)."""

    backward: CheckedDef
    saving: CheckedDef | None = None


def _digest(source: str, options: OptionsArg, backward: Backward, save: Save) -> str:
    """A hash of what an operator means: the source, the options, the backward asked
    for, and tcpy's own sources (a derived backward's interface may change with them,
    and PyTorch's compiled-graph caches outlive a process)."""
    if isinstance(options, MappingOptions):
        options = options.to_dict()
    save = save if save is None or isinstance(save, str) else list(save)
    text = json.dumps(
        [source, options, backward, save, tcpy_version()], sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _backwards(
    source: str,
    defs: Mapping[str, CheckedDef],
    backward: Backward,
    save: Save,
    filename: str | None,
) -> tuple[dict[str, _Gradient | TCGradientError], str]:
    """The backward of each def that has one, or why a derived one could not be had
    (raised when a gradient is asked of it), and the TC source of the backwards and
    of the forwards that save values for them."""
    if backward is None:
        return {}, ""
    if backward != "auto":
        given = check_source(backward)
        return {n: _Gradient(given[f"{n}_grad"]) for n in defs if f"{n}_grad" in given}, backward
    derived: dict[str, Derived] = {}
    failed: dict[str, TCGradientError] = {}
    for name, cdef in defs.items():
        if not any(t.scalar.is_float for t in cdef.inputs) or not any(
            t.scalar.is_float for t in cdef.outputs
        ):
            continue
        try:
            derived[name] = derive(source, name, filename=filename, save=save)
        except TCGradientError as e:
            failed[name] = e
    bsource = "\n".join(t for d in derived.values() for t in (d.forward, d.backward) if t)
    checked = check_source(bsource) if bsource else {}
    found: dict[str, _Gradient | TCGradientError] = dict(failed)
    for n, d in derived.items():
        saving = checked[f"{n}_saving"] if d.saved else None
        found[n] = _Gradient(checked[f"{n}_grad"], saving)
    return found, bsource


@dataclass
class _Kernels:
    """The engines that run a source's defs and their backwards, by device type:
    `cpu` for CPU tensors, `cuda` for CUDA tensors (made at first use)."""

    source: str
    backward_source: str
    options: OptionsArg
    filename: str | None
    engines: dict[tuple[str, bool], ExecutionEngine] = field(default_factory=dict)
    # by def, direction and the inputs' shapes and dtypes: the host kernel's call made
    # ready (None: no ready call there, e.g. an empty one)
    ready: dict[tuple[Any, ...], _Ready | None] = field(default_factory=dict)

    def engine(self, args: Sequence[Any], backward: bool) -> ExecutionEngine:
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        key = ("cuda" if cuda else "cpu", backward)
        engine = self.engines.get(key)
        if engine is None:
            engine = ExecutionEngine(key[0])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # said when the source was checked
                engine.define(self.backward_source if backward else self.source, self.filename)
            self.engines[key] = engine
        return engine

    def run(
        self, name: str, args: Sequence[torch.Tensor], backward: bool, options: OptionsArg = None
    ) -> tuple[Any, ...]:
        """Run def `name` (of the backward source if `backward`) on `args`, with
        `options` (as for `ExecutionEngine.run`)."""
        key = (name, backward, *[(t.shape, t.dtype, t.is_cuda) for t in args])
        ready = self.ready.get(key)
        if ready is not None and all(t.is_contiguous() for t in args):
            try:
                return ready(args)  # addresses only: nothing for autograd to record
            except TCError:
                pass  # the checked call below says where the values went wrong
        tensors = [a.detach().contiguous() for a in args]  # below autograd: no graph here
        engine = self.engine(tensors, backward)
        if any(t.is_cuda for t in tensors):
            out = engine.run(name, *tensors, options=options)
            return out if isinstance(out, tuple) else (out,)
        # host tensors as NumPy views (no copy either way)
        arrays = [torch_numpy(t) for t in tensors]
        out = engine.run(name, *arrays, options=options)
        if key not in self.ready and len(self.ready) < 64:
            self.ready[key] = _Ready.of(engine.compile(name, *arrays, options=options), arrays)
        return tuple(from_numpy_torch(o) for o in (out if isinstance(out, tuple) else (out,)))


@dataclass(frozen=True)
class _Ready:
    """A host kernel's call at one signature, checked by a first call through the
    engine: later calls at that signature allocate the outputs as tensors and run the
    kernel on the tensors' addresses, with nothing checked again but the values (a
    fault goes back to the engine, which explains it)."""

    call: Callable[[Sequence[int]], None]
    outputs: tuple[Callable[[], torch.Tensor], ...]  # each makes a new output

    @staticmethod
    def of(compiled: Compiled, arrays: Sequence[np.ndarray]) -> _Ready | None:
        prepared = compiled.prepared(*arrays)
        call = None if prepared is None else prepared.by_address()
        if prepared is None or call is None:
            return None
        scalars = [t.scalar for t in compiled.cdef.outputs]
        makers = [_maker(s, z, t) for (s, z), t in zip(prepared.outputs, scalars, strict=True)]
        return _Ready(call, tuple(makers))

    def __call__(self, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        outs = tuple([make() for make in self.outputs])
        self.call([t.data_ptr() for t in tensors] + [o.data_ptr() for o in outs])
        return outs


def _maker(shape: tuple[int, ...], zero: bool, scalar: ScalarType) -> Callable[[], torch.Tensor]:
    """What makes a new output of `shape` and type `scalar` for a ready call: zeroed
    where the kernel does not write it whole; else from the tensor pool
    (`tcpy.torch.outputs`: a block already mapped from a megabyte up; a fresh one is
    fresh pages, a fault a page at the kernel's first write: a layer norm's backward
    ran 3x slower so)."""
    dtype = torch_dtype(scalar)
    if zero:
        return lambda: torch.zeros(shape, dtype=dtype)
    if math.prod(shape) * scalar.dtype.itemsize < POOL_BYTES:
        return lambda: torch.empty(shape, dtype=dtype)
    return lambda: POOL.empty(shape, dtype)


def _operator(
    name: str,
    cdef: CheckedDef,
    digest: str,
    kernels: _Kernels,
    grad: _Gradient | TCGradientError | None,
) -> Any:
    qualified = f"{NAMESPACE}::{name}_{digest}"
    known = _REGISTERED.get(qualified)
    if known is not None:
        return known
    if isinstance(grad, _Gradient):
        op = _composite(qualified, cdef, kernels, grad)
    else:
        op = _kernel_operator(qualified, name, cdef, kernels)
        if grad is None:
            grad = TCGradientError(
                f"{name} has no backward: it was defined with backward=None, or a hand-written "
                f"backward source without a def {name}_grad"
            )
        _no_gradient(qualified, grad)  # raised when a gradient is asked for
    _REGISTERED[qualified] = op
    return op


def _kernel_operator(
    qualified: str,
    name: str,
    cdef: CheckedDef,
    kernels: _Kernels,
    backward: bool = False,
    options: bool = True,
) -> Any:
    """The operator that runs def `name`'s kernel (a def of the backward source if
    `backward`), with the forward's options if `options`: a schema, the kernel for
    CPU and CUDA tensors, and the fake implementation."""
    single = len(cdef.outputs) == 1
    given = kernels.options if options else None

    def forward(*args: torch.Tensor) -> Any:
        out = kernels.run(name, args, backward, given)
        return out[0] if single else out

    opname = qualified.split("::")[1]
    _LIBRARY.define(opname + _schema(cdef))
    for device in ("CPU", "CUDA"):
        _LIBRARY.impl(opname, forward, device)
    torch.library.register_fake(qualified, _fake(cdef), lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), opname).default


def _composite(qualified: str, cdef: CheckedDef, kernels: _Kernels, grad: _Gradient) -> Any:
    """Def `cdef` as a composite operator (see the module): `<qualified>_forward`
    where no gradient is asked for; where one is, `<qualified>_saving` where the
    backward takes values from the forward, else `<qualified>_forward` again (it
    carries the autograd formula)."""
    n = len(cdef.outputs)
    plain = _kernel_operator(f"{qualified}_forward", cdef.name, cdef, kernels)
    saving, run = plain, cdef
    if grad.saving is not None:
        run = grad.saving
        saving = _kernel_operator(f"{qualified}_saving", run.name, run, kernels, backward=True)
    grad_op = _backward_operator(f"{qualified}_grad", grad.backward, kernels)
    setup, formula = _autograd(cdef, run, grad.backward, grad_op, kernels)
    torch.library.register_autograd(saving, formula, setup_context=setup, lib=_LIBRARY)

    direct = _direct(run.name, grad.saving is not None, kernels, setup, formula)

    def composite(*args: torch.Tensor) -> Any:
        traced = _traced(args, grad_mode=False)
        if torch.is_grad_enabled() and any(a.requires_grad for a in args):
            out = saving(*args) if traced else direct.apply(*args)
            out = out if isinstance(out, tuple) else (out,)
            return out[0] if n == 1 else tuple(out[:n])
        if traced:
            return plain(*args)
        out = kernels.run(cdef.name, args, False, kernels.options)
        return out[0] if n == 1 else out

    opname = qualified.split("::")[1]
    _LIBRARY.define(opname + _schema(cdef))
    _LIBRARY.impl(opname, composite, "CompositeImplicitAutograd")
    return getattr(getattr(torch.ops, NAMESPACE), opname).default


def _backward_operator(qualified: str, bdef: CheckedDef, kernels: _Kernels) -> Any:
    known = _REGISTERED.get(qualified)
    if known is not None:
        return known
    op = _kernel_operator(qualified, bdef.name, bdef, kernels, backward=True, options=False)
    second = TCGradientError(
        f"{bdef.name} has no derivative: tcpy operators have first derivatives only"
    )
    _no_gradient(qualified, second)
    _REGISTERED[qualified] = op
    return op


def _no_gradient(qualified: str, error: TCGradientError) -> None:
    """An autograd formula for operator `qualified` that raises `error`: it has no
    gradient."""

    def formula(ctx: Any, *grads: Any) -> Any:
        raise error

    torch.library.register_autograd(
        qualified, formula, setup_context=lambda ctx, inputs, output: None, lib=_LIBRARY
    )


def _schema(cdef: CheckedDef) -> str:
    args = ", ".join(f"Tensor {_arg(t.name)}" for t in cdef.inputs)
    outs = ["Tensor"] * len(cdef.outputs)
    return f"({args}) -> " + (outs[0] if len(outs) == 1 else f"({', '.join(outs)})")


def _arg(name: str) -> str:
    """A TC name as an argument of a schema (where `self` and `out` mean more)."""
    return f"{name}_" if name in ("self", "out", "input") else name


def torch_dtype(scalar: ScalarType) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, scalar.dtype.name)  # bfloat16 too
    return dtype


def _fake(cdef: CheckedDef) -> Callable[..., Any]:
    """The fake implementation of `cdef`: outputs of the shapes range inference gives
    them at the inputs' sizes (symbolic ones too), on the inputs' device."""

    def fake(*args: torch.Tensor) -> Any:
        sizes: dict[str, Any] = {}
        for t, a in zip(cdef.inputs, args, strict=True):
            for extent, d in zip(t.shape, a.shape, strict=True):
                if (
                    len(extent.terms) == 1
                    and extent.const == 0
                    and isinstance(extent.terms[0][0], str)
                ):
                    sizes.setdefault(extent.terms[0][0], d)
        device = args[0].device if args else torch.device("cpu")
        outs = tuple(
            torch.empty(
                [_size(e, sizes) for e in t.shape], dtype=torch_dtype(t.scalar), device=device
            )
            for t in cdef.outputs
        )
        return outs[0] if len(outs) == 1 else outs

    return fake


def _size(extent: Sym, sizes: Mapping[str, Any]) -> Any:
    try:
        return extent.evaluate(sizes)
    except KeyError as e:
        raise TCError(f"the size {e.args[0]} is not known from the inputs") from None


def _autograd(
    cdef: CheckedDef, run: CheckedDef, bdef: CheckedDef, grad_op: Any, kernels: _Kernels
) -> tuple[Callable[..., None], Callable[..., Any]]:
    """The autograd formula of `cdef`, computed by the kernel of `run` (`cdef` itself,
    or its saving forward: `cdef`'s outputs, then the values saved for the backward),
    from its backward `bdef` (parameters matched by name: the forward's inputs, its
    outputs and saved values, `d_<output>`): what to save, and how to call the
    backward: `grad_op` where PyTorch may be recording or tracing the call (a graph
    asked of the backward, whose second derivative must raise; a tracing mode;
    tensors of a subclass), else its kernel directly (`kernels`, the dispatcher's
    two passes through an operator's Python layers skipped: a layer norm's backward
    without its kernel 94 -> 72 us)."""
    names = [t.name for t in cdef.inputs]
    outputs = [t.name for t in cdef.outputs]
    returned = [t.name for t in run.outputs]  # `outputs`, then the saved values
    read = [n for n in returned if n in {t.name for t in bdef.inputs}]
    kept = [returned.index(n) for n in read]
    # the outputs with no gradient: the saved values, and those of integer types
    fixed = [k for k, t in enumerate(run.outputs) if k >= len(outputs) or not t.scalar.is_float]
    # each parameter of the backward: a saved tensor's index, or -1 - k for the
    # gradient of output k
    where = [
        [*names, *read].index(p)
        if p in names or p in read
        else -1 - outputs.index(p.removeprefix("d_"))
        for p in (t.name for t in bdef.inputs)
    ]
    results = [t.name.removeprefix("d_") for t in bdef.outputs]
    # each input's gradient: the backward's result k, or None
    answers = [results.index(n) if n in results else None for n in names]

    def setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*inputs, *[outs[k] for k in kept])
        if fixed:
            ctx.mark_non_differentiable(*[outs[k] for k in fixed])
        ctx.set_materialize_grads(False)  # no zeros made for the saved values' gradients
        ctx.shapes = [(o.shape, o.dtype) for o in outs[: len(outputs)]]

    def formula(ctx: Any, *grads: Any) -> Any:
        saved = ctx.saved_tensors
        args = [saved[w] if w >= 0 else grads[-1 - w] for w in where]
        for j, w in enumerate(where):
            if args[j] is None:  # an output nothing read
                shape, dtype = ctx.shapes[-1 - w]
                args[j] = torch.zeros(shape, dtype=dtype, device=saved[0].device)
        if _traced(args):
            out = grad_op(*args)
        else:
            out = kernels.run(bdef.name, args, True)
            out = out[0] if len(out) == 1 else out
        out = out if isinstance(out, tuple) else (out,)
        answer = tuple(None if k is None else out[k] for k in answers)
        return answer[0] if len(answer) == 1 else answer

    return setup, formula


def _direct(
    name: str,
    backward: bool,
    kernels: _Kernels,
    setup: Callable[..., None],
    formula: Callable[..., Any],
) -> type[torch.autograd.Function]:
    """The forward `name` (a def of the backward source if `backward`: a saving
    forward) and its backward as a `torch.autograd.Function` that
    runs their kernels directly, for eager calls that nothing traces: the autograd
    layers `torch.library` wraps an operator in, and the second dispatch to the
    saving operator, cost a small layer's forward and backward some 20 us of Python
    (a layer norm's calls with their kernels left out: 181 -> 157-165 us, with the
    backward called directly too). Same kernels, same saved values, same formula."""

    class Direct(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: torch.Tensor) -> Any:
            out = kernels.run(name, args, backward, kernels.options)
            setup(ctx, args, out)
            return out

        backward = staticmethod(formula)

    return Direct


def _traced(args: Sequence[torch.Tensor], grad_mode: bool = True) -> bool:
    """Whether a call on `args` may be recorded or traced by PyTorch: grad mode on
    (where `grad_mode`), a dispatch mode active (`make_fx`, fake tensors), a
    `torch.func` transform, an argument of a tensor subclass (a fake or functional
    tensor), or the profiler on (whose record names the operators)."""
    return (
        (grad_mode and torch.is_grad_enabled())
        or torch.autograd.profiler._is_profiler_enabled
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._functorch.peek_interpreter_stack() is not None
        or any(type(a) is not torch.Tensor for a in args)
    )
