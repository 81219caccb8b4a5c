"""Shared machinery of the differential tests: corpus parameters, deterministic
inputs, output comparison, and engines on a target beside a `reference` engine with
the same source defined (`engines`, `corpus_engines`, `check_corpus_case`,
`run_against_reference`)."""

from __future__ import annotations

import warnings
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcpy
from tcpy.mapping.options import MappingOptions

from corpus_cases import CASES, Case

CORPUS = Path(__file__).parent / "corpus"


def corpus_params() -> list:
    """One parameter per case and size set (the default sizes, then the odd ones)."""
    params = []
    for case in CASES:
        for k, sizes in enumerate((case.sizes, *case.odd_sizes)):
            label = "default" if k == 0 else f"odd{k}"
            params.append(pytest.param(case, sizes, id=f"{case.name}-{label}"))
    return params


def as_tuple(out: object) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def make_inputs(case: Case, sizes: dict[str, int]) -> tuple:
    seed = zlib.crc32(f"{case.name}:{sorted(sizes.items())}".encode())
    return case.inputs(np.random.default_rng(seed), dict(sizes))


def check_outputs(case: Case, got: tuple, want: tuple, what: str = "") -> None:
    name = f"{case.name}{what}"
    assert len(got) == len(want), f"{name}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{name} output {k}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"{name} output {k}: shape {g.shape}, expected {w.shape}"
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} output {k}")
        else:
            np.testing.assert_allclose(
                g, w, rtol=case.rtol, atol=case.atol, err_msg=f"{name} output {k}"
            )


# --- engines ----------------------------------------------------------------------------


def define_quietly(engine: tcpy.ExecutionEngine, source: str) -> tuple[str, ...]:
    """`engine.define(source)` with its `TCWarning`s ignored; the names defined."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        return engine.define(source)


def _define(engine: tcpy.ExecutionEngine, source: str, quiet: bool) -> tuple[str, ...]:
    return define_quietly(engine, source) if quiet else engine.define(source)


def defined(
    target: str, source: str, *, quiet: bool = False, **engine_options: Any
) -> tcpy.ExecutionEngine:
    """An engine on `target` (made with `engine_options`) with `source` defined; with
    `quiet`, the `TCWarning`s of the definition are ignored."""
    engine = tcpy.ExecutionEngine(target, **engine_options)
    _define(engine, source, quiet)
    return engine


def _defined_pair(
    target: str, source: str, quiet: bool, engine_options: dict[str, Any]
) -> tuple[tcpy.ExecutionEngine, tcpy.ExecutionEngine, tuple[str, ...]]:
    engine = tcpy.ExecutionEngine(target, **engine_options)
    reference = tcpy.ExecutionEngine("reference")
    names = _define(engine, source, quiet)
    _define(reference, source, quiet)
    return engine, reference, names


def engines(
    target: str, source: str, *, quiet: bool = False, **engine_options: Any
) -> tuple[tcpy.ExecutionEngine, tcpy.ExecutionEngine]:
    """An engine on `target` (made with `engine_options`) and one on `reference`, each
    with `source` defined (on `target` first); with `quiet`, the `TCWarning`s of the
    definitions are ignored."""
    engine, reference, _ = _defined_pair(target, source, quiet, engine_options)
    return engine, reference


def corpus_engines(target: str, file: str) -> tuple[tcpy.ExecutionEngine, tcpy.ExecutionEngine]:
    """`engines` for the corpus program in `file`, its warnings ignored."""
    return engines(target, (CORPUS / file).read_text(), quiet=True)


_kept_corpus_engines = cache(corpus_engines)
"""`corpus_engines`, made once per target and file for the whole session."""


def check_corpus_case(
    target: str, case: Case, sizes: dict[str, int], options: MappingOptions | None
) -> None:
    """The outputs of `case` at `sizes` on `target` with `options` are the reference's
    (to the case's tolerances)."""
    inputs = make_inputs(case, sizes)
    engine, reference = _kept_corpus_engines(target, case.file)
    want = as_tuple(reference.run(case.entry, *inputs))
    got = as_tuple(engine.run(case.entry, *inputs, options=options))
    check_outputs(case, got, want, f" on {target} with {options}")


def run_against_reference(
    target: str,
    source: str,
    *inputs: Any,
    options: MappingOptions | None = None,
    **engine_options: Any,
) -> tuple[tcpy.Compiled, Any, Any]:
    """Compile the one def of `source` on `target` (an engine made with
    `engine_options`) for `inputs` with `options`, and run it and the `reference`
    target on them: (the compiled kernel, its outputs, the reference's outputs)."""
    engine, reference, (entry,) = _defined_pair(target, source, False, engine_options)
    compiled = engine.compile(entry, *inputs, options=options)
    got = compiled(*inputs)
    return compiled, got, reference.run(entry, *inputs)
