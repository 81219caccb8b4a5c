"""The fuzzer's tasks, run in `tcpy.sandbox` workers: a def compiled for a target and
checked against the reference interpreter, the front end alone, and a replay re-run.

They build engines, so they live apart from the sandbox's process machinery, which the
tuner imports and which therefore imports no engine (`ExecutionEngine.tune` imports
the tuner). A replay file (`tcpy.sandbox.Replay`, written by the fuzzer and by the
tuner) holds the arguments of `replay_task`; `python -m tools.fuzz replay FILE` runs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tcpy.errors import TCError
from tcpy.sandbox import (
    COMPILE,
    RUN,
    InvalidCase,
    Outcome,
    Replay,
    Runaway,
    WrongResult,
    phase,
    run_task,
)
from tcpy.types import ScalarType

# --- inputs and the differential check --------------------------------------------------


def make_inputs(
    cdef: Any, sizes: Mapping[str, int], seed: int, kind: str = "exact"
) -> tuple[np.ndarray, ...]:
    """Inputs for `cdef` (a `tcpy.CheckedDef`) at `sizes`, from `seed`.

    `exact`: small integers in -3..3 (in float tensors too), so that every evaluation
    order of + - * min max gives the same bits; an integer tensor used as a subscript
    gets values inside every extent it indexes. `exact-nan` also puts NaN into about a
    tenth of the float elements. `smooth` (`SMOOTH`): float elements uniform in
    (-1, 1), the others as `exact`. `random`: `tcpy.inputs.random_inputs`."""
    from tcpy.inputs import random_inputs

    rng = np.random.default_rng(seed)
    if kind == "random":
        return random_inputs(cdef, sizes, rng)
    if kind == SMOOTH:
        exact = make_inputs(cdef, sizes, seed, "exact")
        return tuple(
            rng.uniform(-1.0, 1.0, size=a.shape).astype(a.dtype) if a.dtype.kind == "f" else a
            for a in exact
        )
    if kind not in ("exact", "exact-nan"):
        raise ValueError(f"unknown input kind {kind!r}")
    bounds = _gather_bounds(cdef, sizes)
    out = []
    for info in cdef.inputs:
        shape = tuple(d.evaluate(sizes) for d in info.shape)
        if info.name in bounds:
            values = rng.integers(0, max(bounds[info.name], 1), size=shape)
        elif info.scalar.is_bool:
            values = rng.integers(0, 2, size=shape)
        else:
            values = rng.integers(-3, 4, size=shape)
        array = np.array(values, dtype=info.scalar.dtype, order="C")  # 0-d stays 0-d
        if kind == "exact-nan" and info.scalar.is_float and array.size:
            array[rng.random(shape) < 0.1] = np.nan
        out.append(array)
    return tuple(out)


def _gather_bounds(cdef: Any, sizes: Mapping[str, int]) -> dict[str, int]:
    """For each tensor read inside a subscript, the least extent it indexes."""
    from tcpy.parser import ast

    bounds: dict[str, int] = {}
    for st in cdef.statements:
        for node in (n for e in st.expressions for n in ast.walk(e)):
            if not isinstance(node, ast.Access):
                continue
            shape = cdef.tensor(node.tensor).shape
            for k, arg in enumerate(node.args):
                for inner in ast.walk(arg):
                    if isinstance(inner, ast.Access):
                        extent = shape[k].evaluate(sizes)
                        bounds[inner.tensor] = min(bounds.get(inner.tensor, extent), extent)
    return bounds


def same_outputs(got: Any, want: Any) -> str | None:
    """None when `got` equals `want` exactly (NaN where NaN), else what differs."""
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    if len(got_t) != len(want_t):
        return f"{len(got_t)} outputs, expected {len(want_t)}"
    for k, (g, w) in enumerate(zip(got_t, want_t, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {k}: {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        ty = ScalarType.from_dtype(w.dtype)
        nan = ty is not None and ty.is_float  # bfloat16's dtype is of kind "V"
        if not np.array_equal(g, w, equal_nan=nan):
            bad = np.argwhere(~((g == w) | (np.isnan(g) & np.isnan(w)) if nan else (g == w)))
            where = tuple(int(i) for i in bad[0])
            return (
                f"output {k} differs at {len(bad)} of {w.size} elements; first at {where}: "
                f"{g[where]!r}, expected {w[where]!r}"
            )
    return None


SMOOTH = "smooth"
"""The input kind of a pair whose values are real (the fuzzer's chains of exponentials
against a row's maximum): its def runs in float64 (an even input seed) or float32 (an
odd one), on inputs of `make_inputs`' `smooth` kind, and its outputs must be the
reference's within `SMOOTH_RTOL` (`close_outputs`), not bit for bit."""
SMOOTH_RTOL = {"float64": 1e-9, "float32": 1e-4}


def close_outputs(got: Any, want: Any, rtol: float) -> str | None:
    """None when `got` is `want` within relative `rtol`, and absolute `rtol` times the
    largest finite magnitude of that output (at least 1: terms summed in another order
    leave a residue of that scale), NaN where NaN; else what differs."""
    got_t, want_t = _tuple(got), _tuple(want)
    if len(got_t) != len(want_t):
        return f"{len(got_t)} outputs, expected {len(want_t)}"
    for k, (g, w) in enumerate(zip(got_t, want_t, strict=True)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {k}: {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        finite = np.abs(w[np.isfinite(w)])
        scale = max(1.0, float(finite.max(initial=0.0)))
        ok = np.isclose(g, w, rtol=rtol, atol=rtol * scale, equal_nan=True)
        if not ok.all():
            where = tuple(int(i) for i in np.argwhere(~ok)[0])
            return (
                f"output {k} differs at {int((~ok).sum())} of {w.size} elements beyond "
                f"{rtol:g}; first at {where}: {g[where]!r}, expected {w[where]!r}"
            )
    return None


def conditioned_outputs(got: Any, want: Any, exact: Any, rtol: float) -> str | None:
    """None when `got` is within `close_outputs`' tolerance of `want`, the float32
    reference, or of `exact`, the def in float64 on the same inputs, widened by twice
    the float32 reference's own distance from it: outputs that cancel (a sum of terms
    of both signs near zero) lose to rounding what the condition number multiplies,
    in the reference as in the kernel. Else `close_outputs`' finding."""
    found = close_outputs(got, want, rtol)
    if found is None:
        return None
    for g, w, x in zip(_tuple(got), _tuple(want), _tuple(exact), strict=True):
        g64, w64, x64 = (np.asarray(a, np.float64) for a in (g, w, x))
        # what close_outputs allows around `want`, then on to `exact` (a superset)
        near = [rtol * (np.abs(a) + max(1.0, float(np.abs(a[np.isfinite(a)]).max(initial=0.0))))
                for a in (w64, x64)]  # fmt: skip
        with np.errstate(invalid="ignore"):
            allowed = near[0] + near[1] + 2 * np.abs(w64 - x64)
            ok = (np.abs(g64 - x64) <= allowed) | (g64 == x64) | (g64 == w64)
            ok |= np.isnan(g64) & (np.isnan(x64) | np.isnan(w64))
        if not ok.all():
            return found
    return None


def _exact(source: str, entry: str, args: tuple[Any, ...]) -> Any:
    """The outputs of `entry` of `source` in float64 on the reference target, on
    `args` widened to float64 (exactly)."""
    import tcpy
    from tcpy.parser.parse import retyped
    from tcpy.types import ScalarType

    ref = tcpy.ExecutionEngine("reference")
    ref.define(retyped(source, ScalarType.from_name("float64")))
    wide = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else a for a in args]
    return ref.run(entry, *wide)


def check_against_reference(
    source: str,
    entry: str,
    sizes: Mapping[str, int],
    input_seed: int,
    options: Mapping[str, Any] | None,
    target: str,
    inputs: str = "exact",
) -> dict[str, float]:
    """Compile `entry` of `source` for `target` with `options` (a `to_dict()`; None for
    the target's default), run it and the reference on the same inputs, and raise
    `WrongResult` if they differ (bit for bit; within a tolerance for `SMOOTH` inputs);
    on `COUNTED_TARGETS`, run it again in a counting build and raise `Runaway` if its
    loops ran far more than the work of the def. Returns `{"compile_seconds": ...}`."""
    import warnings

    import tcpy
    from tcpy.parser.parse import retyped
    from tcpy.types import ScalarType

    given = source
    if inputs == SMOOTH:
        float_type = ("float64", "float32")[input_seed % 2]
        source = retyped(source, ScalarType.from_name(float_type))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = tcpy.ExecutionEngine("reference")
        try:
            ref.define(source)
            args = make_inputs(ref.checked(entry), sizes, input_seed, inputs)
            want = ref.run(entry, *args)
        except TCError as e:
            raise InvalidCase(f"the reference rejects the case: {type(e).__name__}: {e}") from e
        opts = tcpy.MappingOptions.from_dict(dict(options)) if options is not None else None
        engine = tcpy.ExecutionEngine(target)
        engine.define(source)
        start = time.perf_counter()
        kernel = engine.compile(entry, *args, options=opts)
        seconds = time.perf_counter() - start
        phase(RUN)
        got = kernel(*args)
        if inputs == SMOOTH and float_type == "float32":
            rtol = SMOOTH_RTOL[float_type]
            difference = close_outputs(got, want, rtol)
            if difference is not None:  # ill-conditioned? the float64 def says
                try:
                    exact = _exact(given, entry, args)
                except TCError:  # kept as the float32 comparison found it
                    exact = None
                if exact is not None:
                    difference = conditioned_outputs(got, want, exact, rtol)
        elif inputs == SMOOTH:
            difference = close_outputs(got, want, SMOOTH_RTOL[float_type])
        else:
            difference = same_outputs(got, want)
        if difference is not None:
            raise WrongResult(difference)
        if target in COUNTED_TARGETS:
            phase(COMPILE)  # the counting build; its run stops itself at its limit
            counted = kernel.iterations(*args)
            if counted.runaway:
                raise Runaway(_runaway(counted))
    return {"compile_seconds": seconds}


COUNTED_TARGETS = ("cpu", "cuda-emu")
"""The targets whose kernels `check_against_reference` also runs in a counting build."""


def _runaway(counted: Any) -> str:
    """What a runaway's counting run (`tcpy.kernels.Iterations`) saw."""
    worst = max(range(len(counted.loops)), key=lambda k: counted.loops[k])
    ran = "stopped after" if counted.stopped else "ran"
    return (
        f"the loops {ran} {counted.total} iterations, against {counted.instances} statement "
        f"instances and {counted.threads} threads; loop {worst} (counted in source order) "
        f"ran {counted.loops[worst]}"
    )


GRADIENT = "gradient"
"""The input kind of a gradient pair (`check_gradient`): a replay with these inputs
re-runs the gradient check."""


def check_gradient(
    source: str,
    entry: str,
    sizes: Mapping[str, int],
    input_seed: int,
    options: Mapping[str, Any] | None,
    target: str,
) -> dict[str, float]:
    """Differentiate `entry` of `source` (retyped to float64): its backward
    (`tcpy.gradient`; with an odd `input_seed`, the one that takes the values
    `save="auto"` or `"all"` saves, from the forward that saves them compiled for
    `target` too) compiled for `target` with `options` must give the `reference`
    target's gradients (relative 1e-9, and absolute 1e-12 times the sum of the output
    gradients' magnitudes: terms that cancel, added in another order, leave a residue
    that grows with their number), and those must match central differences of the
    forward on `reference` along two random directions per input (relative 1e-5 at
    a step of 1e-6 or 1e-7 of the input's scale, or the two extrapolated to a step of
    0 (Richardson); a kink or a switch of `?:` between the two points fails one step
    size, seldom both). A def with nothing to differentiate,
    a builtin without a derivative, or values that are not finite make the case invalid.
    Returns `{"compile_seconds": ...}`."""
    import warnings

    import tcpy
    from tcpy.autodiff import derive
    from tcpy.parser.parse import retyped
    from tcpy.types import ScalarType

    source = retyped(source, ScalarType.FLOAT64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = tcpy.ExecutionEngine("reference")
        try:
            ref.define(source)
            cdef = ref.checked(entry)
            derived = derive(source, entry, save=(None, "auto", None, "all")[input_seed % 4])
            text = derived.backward
            ref.define(text)
            if derived.forward is not None:
                ref.define(derived.forward)
        except TCError as e:
            raise InvalidCase(f"no gradient to check: {type(e).__name__}: {e}") from e
        args = _smooth_inputs(cdef, sizes, input_seed)
        seeds, bargs = _backward_args(ref, cdef, derived, args, input_seed)
        want = _tuple(ref.run(f"{entry}_grad", *bargs))
        if not all(np.all(np.isfinite(w)) for w in want):
            raise InvalidCase("the gradient is not finite at these inputs")
        engine = tcpy.ExecutionEngine(target)
        engine.define(text)
        if derived.forward is not None:  # the saved values as the target computes them
            engine.define(derived.forward)
            _, bargs = _backward_args(engine, cdef, derived, args, input_seed)
        opts = tcpy.MappingOptions.from_dict(dict(options)) if options is not None else None
        start = time.perf_counter()
        kernel = engine.compile(f"{entry}_grad", *bargs, options=opts)
        seconds = time.perf_counter() - start
        phase(RUN)
        got = _tuple(kernel(*bargs))
        scale = max(1.0, sum(float(np.sum(np.abs(s))) for s in seeds.values()))
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            if not np.allclose(g, w, rtol=1e-9, atol=1e-12 * scale):
                worst = float(np.max(np.abs(g - w)))
                raise WrongResult(f"gradient {k} differs from the reference's by {worst!r}")
        _finite_differences(ref, cdef, args, seeds, want, input_seed)
    return {"compile_seconds": seconds}


def _tuple(out: Any) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))


def _smooth_inputs(cdef: Any, sizes: Mapping[str, int], seed: int) -> list[np.ndarray]:
    """Inputs for a gradient check: integer tensors as `make_inputs` gives them (in
    range where they index), float ones uniform in (-1, 1), away from ties."""
    exact = make_inputs(cdef, sizes, seed, "exact")
    rng = np.random.default_rng(seed + 1)
    return [
        rng.uniform(-1.0, 1.0, size=a.shape).astype(a.dtype) if a.dtype.kind == "f" else a
        for a in exact
    ]


def _backward_args(
    engine: Any, cdef: Any, derived: Any, args: list[np.ndarray], seed: int
) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The gradients given for the float outputs, and the backward's arguments (the
    forward's outputs and saved values as `engine` computes them)."""
    from tcpy.parser import check_source

    run = cdef.name if derived.forward is None else f"{cdef.name}_saving"
    names = [t.name for t in cdef.outputs] + list(derived.saved)
    outs = dict(zip(names, _tuple(engine.run(run, *args)), strict=True))
    if not all(np.all(np.isfinite(o)) for o in outs.values() if o.dtype.kind == "f"):
        raise InvalidCase("the forward is not finite at these inputs")
    rng = np.random.default_rng(seed + 2)
    seeds = {
        t.name: rng.uniform(-1, 1, outs[t.name].shape).astype(outs[t.name].dtype)
        for t in cdef.outputs
        if outs[t.name].dtype.kind == "f"
    }
    given = dict(zip((t.name for t in cdef.inputs), args, strict=True))
    bargs = []
    for p in check_source(derived.backward)[f"{cdef.name}_grad"].inputs:
        value = given.get(p.name, outs.get(p.name))
        bargs.append(value if value is not None else seeds[p.name.removeprefix("d_")])
    return seeds, bargs


def _finite_differences(
    ref: Any, cdef: Any, args: list[np.ndarray], seeds: dict[str, np.ndarray],
    grads: tuple[np.ndarray, ...], seed: int,
) -> None:  # fmt: skip
    """Raise `WrongResult` where the gradients disagree with central differences."""
    floats = [k for k, t in enumerate(cdef.inputs) if t.scalar.is_float]
    names = [t.name for t in cdef.outputs]
    rng = np.random.default_rng(seed + 3)

    def change(k: int, v: np.ndarray, h: float) -> float:
        up = [*args[:k], args[k] + h * v, *args[k + 1 :]]
        down = [*args[:k], args[k] - h * v, *args[k + 1 :]]
        hi = dict(zip(names, _tuple(ref.run(cdef.name, *up)), strict=True))
        lo = dict(zip(names, _tuple(ref.run(cdef.name, *down)), strict=True))
        return sum(float(np.sum(s * (hi[n] - lo[n]))) for n, s in seeds.items()) / (2 * h)

    for g, k in zip(grads, floats, strict=True):
        for _ in range(2):
            v = rng.uniform(-1, 1, args[k].shape)
            analytic = float(np.sum(g * v))
            scale = max(1.0, float(np.max(np.abs(args[k]), initial=0.0)))
            numeric = [change(k, v, h * scale) for h in (1e-6, 1e-7)]
            # the two steps' truncation errors (of order h^2) extrapolated away: near a
            # pole (a sum of signed terms close to zero) neither step is small enough
            extrapolated = numeric[1] + (numeric[1] - numeric[0]) / 99
            if not any(
                abs(n - analytic) <= 1e-5 * max(1.0, abs(n), abs(analytic))
                for n in (*numeric, extrapolated)
            ):
                raise WrongResult(
                    f"d_{cdef.inputs[k].name}: along a random direction the backward gives "
                    f"{analytic!r}, central differences {numeric[0]!r} (step 1e-6), "
                    f"{numeric[1]!r} (step 1e-7), extrapolated {extrapolated!r}"
                )


def define_only(source: str) -> str:
    """The front end alone: a `TCError` is the expected answer to a bad program and is
    returned as text; anything else escapes and is classified by `run_task`."""
    import warnings

    import tcpy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tcpy.ExecutionEngine("reference").define(source)
        except TCError as e:
            return type(e).__name__
    return "ok"


def replay_task(
    source: str,
    entry: str,
    sizes: Mapping[str, int],
    input_seed: int,
    options: Mapping[str, Any] | None,
    target: str,
    inputs: str = "exact",
) -> Any:
    """The task a replay re-runs: target `define` is the front end alone (the source
    mutator's failures), any other target the differential check."""
    if target == "define":
        return define_only(source)
    if inputs == GRADIENT:
        return check_gradient(source, entry, sizes, input_seed, options, target)
    return check_against_reference(source, entry, sizes, input_seed, options, target, inputs)


def replay(path: str | Path) -> Outcome:
    """Re-run the replay at `path` in this process (a crash takes this process down;
    run it under `run_tasks` to classify one) and return its outcome."""
    r = Replay.load(path)
    return run_task(replay_task, r.args())
