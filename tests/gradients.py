"""Gradient checks shared by the tests: a def's derived backward (`tcpy.autodiff.gradient`)
against central finite differences of its forward, both run in float64 on the
`reference` target (`check`), and the backward compiled for a target against the
backward on `reference` (`compiled_matches`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import tcpy
from tcpy.autodiff import Save, derive
from tcpy.parser import check_source
from tcpy.parser.parse import retyped
from tcpy.types import ScalarType

from corpus_cases import Case

CORPUS = Path(__file__).parent / "corpus"

AT_A_KINK = {"sign": "its inputs hold zeros on purpose, where sign jumps"}
"""Corpus programs not differentiable at their test inputs."""
NO_RULE = {"rounding": "trunc"}
"""Corpus programs whose entry differentiates through a builtin without a derivative."""


def differentiable(cases: Sequence[Case]) -> list[Case]:
    """The cases of the corpus with a float input and a float output, but those whose
    inputs sit at a kink."""

    def floats(case: Case) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cdef = check_source((CORPUS / case.file).read_text())[case.entry]
        ins, outs = cdef.inputs, cdef.outputs
        return any(t.scalar.is_float for t in ins) and any(t.scalar.is_float for t in outs)

    return [c for c in cases if floats(c) and c.name not in AT_A_KINK]


def case64(case: Case) -> tuple[str, list[np.ndarray]]:
    """A corpus case's source and inputs in float64."""
    inputs = case.inputs(np.random.default_rng(0), case.sizes)
    return as64((CORPUS / case.file).read_text(), inputs)


STEP = 1e-6
"""The step of the central differences, relative to each input's scale."""


@dataclass
class Backward:
    """A def's backward ready to call: its text, its def, and its arguments."""

    text: str
    name: str
    args: tuple[np.ndarray, ...]
    seeds: dict[str, np.ndarray]  # the gradient given for each float output


def as64(source: str, inputs: Sequence[np.ndarray]) -> tuple[str, list[np.ndarray]]:
    """`source` retyped to float64 (`tcpy.parser.parse.retyped`), with its inputs."""
    out = [
        np.asarray(a, dtype=np.float64) if np.asarray(a).dtype.kind == "f" else a for a in inputs
    ]
    return retyped(source, ScalarType.FLOAT64), out


def _floating(a: object) -> bool:
    """Whether `a` holds floats (bfloat16's dtype is of kind "V")."""
    ty = ScalarType.from_dtype(np.asarray(a).dtype)
    return ty is not None and ty.is_float


def _outputs(engine: tcpy.ExecutionEngine, name: str, inputs: Sequence[np.ndarray]) -> list:
    out = getattr(engine, name)(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


def backward(
    source: str, name: str, inputs: Sequence[np.ndarray], wrt: Sequence[str] | None = None,
    seed: int = 0, save: Save = None,
) -> Backward:  # fmt: skip
    """The backward of `name` with its arguments: `inputs`, the outputs it reads and the
    values it saves (the forward, or the forward that saves them, run on `reference`)
    and random gradients of the float outputs."""
    with warnings.catch_warnings():  # the forward's, said when it was defined
        warnings.simplefilter("ignore")
        cdef = check_source(source)[name]
        derived = derive(source, name, wrt, save=save)
        engine = tcpy.ExecutionEngine("reference")
        engine.define(source)
        run = name
        if derived.forward is not None:
            engine.define(derived.forward)
            run = f"{name}_saving"
    names = [t.name for t in cdef.outputs] + list(derived.saved)
    values = dict(zip(names, _outputs(engine, run, inputs), strict=True))
    outputs = {t.name: values[t.name] for t in cdef.outputs}
    rng = np.random.default_rng(seed)
    seeds = {
        n: rng.uniform(-1, 1, size=np.shape(o)).astype(np.asarray(o).dtype)
        for n, o in outputs.items()
        if _floating(o)
    }
    text = derived.backward
    bdef = check_source(text)[f"{name}_grad"]
    given = dict(zip((t.name for t in cdef.inputs), inputs, strict=True))
    args = []
    for p in bdef.inputs:
        if p.name in given:
            args.append(given[p.name])
        elif p.name in values:
            args.append(values[p.name])
        else:
            args.append(seeds[p.name.removeprefix("d_")])
    return Backward(text, f"{name}_grad", tuple(args), seeds)


def check(
    source: str, name: str, inputs: Sequence[np.ndarray], wrt: Sequence[str] | None = None,
    directions: int = 3, rtol: float = 1e-6,
) -> Backward:  # fmt: skip
    """Check the derived backward of `name` (`source` and `inputs` in float64) against
    central differences of `L = sum over float outputs of <seed, output>` along
    `directions` random directions per input differentiated; returns the backward."""
    bw = backward(source, name, inputs, wrt)
    engine = tcpy.ExecutionEngine("reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cdef = check_source(source)[name]
        engine.define(source)
        engine.define(bw.text)
    grads = getattr(engine, bw.name)(*bw.args)
    grads = list(grads) if isinstance(grads, tuple) else [grads]
    names = [t.name for t in check_source(bw.text)[bw.name].outputs]
    position = {t.name: k for k, t in enumerate(cdef.inputs)}
    rng = np.random.default_rng(1)

    def change(plus: list[np.ndarray], minus: list[np.ndarray]) -> float:
        """L(plus) - L(minus), the outputs subtracted first (a large constant output,
        a mask's -1e9, cancels exactly)."""
        names = [t.name for t in cdef.outputs]
        up = dict(zip(names, _outputs(engine, name, plus), strict=True))
        down = dict(zip(names, _outputs(engine, name, minus), strict=True))
        return sum(float(np.sum(s * (up[n] - down[n]))) for n, s in bw.seeds.items())

    for gname, g in zip(names, grads, strict=True):
        k = position[gname.removeprefix("d_")]
        x = np.asarray(inputs[k])
        assert g.shape == x.shape and g.dtype == x.dtype, (gname, g.shape, g.dtype)
        for _ in range(directions):
            v = rng.uniform(-1, 1, size=x.shape)
            h = STEP * max(1.0, float(np.max(np.abs(x), initial=0.0)))
            plus = [*inputs[:k], x + h * v, *inputs[k + 1 :]]
            minus = [*inputs[:k], x - h * v, *inputs[k + 1 :]]
            numeric = change(plus, minus) / (2 * h)
            analytic = float(np.sum(g * v))
            scale = max(1.0, abs(numeric), abs(analytic))
            assert abs(numeric - analytic) <= rtol * scale + 1e-7, (
                f"{gname}: finite differences {numeric!r}, backward {analytic!r}\n{bw.text}"
            )
    return bw


def compiled_matches(bw: Backward, target: str, options: object = None) -> None:
    """The backward compiled for `target` gives the `reference` target's gradients."""
    results = []
    for t in ("reference", target):
        engine = tcpy.ExecutionEngine(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine.define(bw.text)
        out = (
            getattr(engine, bw.name)(*bw.args)
            if options is None
            else (engine.compile(bw.name, *bw.args, options=options)(*bw.args))
        )
        results.append(list(out) if isinstance(out, tuple) else [out])
    for want, got in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
