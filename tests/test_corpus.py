"""The TC corpus on the reference target: every case of corpus_cases at its default
sizes and at its odd sizes, compared with an independent NumPy computation."""

from __future__ import annotations

import zlib
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import tcpy
from corpus_cases import CASES, Case

CORPUS = Path(__file__).parent / "corpus"


def _params() -> list:
    params = []
    for case in CASES:
        for k, sizes in enumerate((case.sizes, *case.odd_sizes)):
            label = "default" if k == 0 else f"odd{k}"
            params.append(pytest.param(case, sizes, id=f"{case.name}-{label}"))
    return params


@cache
def _engine(file: str) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(target="reference")
    engine.define((CORPUS / file).read_text())
    return engine


def _as_tuple(out: object) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def make_inputs(case: Case, sizes: dict[str, int]) -> tuple:
    seed = zlib.crc32(f"{case.name}:{sorted(sizes.items())}".encode())
    return case.inputs(np.random.default_rng(seed), dict(sizes))


def check_outputs(case: Case, got: tuple, want: tuple) -> None:
    assert len(got) == len(want), f"{case.name}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{case.name} output {k}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"{case.name} output {k}: shape {g.shape}, expected {w.shape}"
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w, err_msg=f"{case.name} output {k}")
        else:
            np.testing.assert_allclose(
                g, w, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {k}"
            )


@pytest.mark.parametrize(("case", "sizes"), _params())
def test_corpus_reference(case: Case, sizes: dict[str, int]) -> None:
    inputs = make_inputs(case, sizes)
    want = case.expected(*inputs)
    engine = _engine(case.file)
    got = _as_tuple(engine.run(case.entry, *inputs))
    check_outputs(case, got, want)


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40


def test_case_names_unique() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


def test_every_corpus_file_is_used() -> None:
    files = {p.name for p in CORPUS.glob("*.tc")}
    used = {c.file for c in CASES}
    assert used <= files, f"cases name missing files: {sorted(used - files)}"
    assert files <= used, f"corpus files without a case: {sorted(files - used)}"


def test_case_inputs_are_well_formed() -> None:
    """Inputs are C-contiguous NumPy arrays or NumPy scalars; every case with size
    symbols also runs at odd sizes."""
    for case in CASES:
        for sizes in (case.sizes, *case.odd_sizes):
            for x in make_inputs(case, sizes):
                assert isinstance(x, (np.ndarray, np.generic)), case.name
                if isinstance(x, np.ndarray):
                    assert x.flags.c_contiguous, case.name
        if case.sizes:
            assert case.odd_sizes, f"{case.name} has no odd sizes"
