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
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{case.name} output {k}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"{case.name} output {k}: shape {g.shape}, expected {w.shape}"
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w, err_msg=f"{case.name} output {k}")
        else:
            np.testing.assert_allclose(
                g, w, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {k}"
            )


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")  # nonbang.tc warns on purpose
@pytest.mark.parametrize(("case", "sizes"), _params())
def test_corpus_reference(case: Case, sizes: dict[str, int]) -> None:
    inputs = make_inputs(case, sizes)
    want = case.expected(*inputs)
    before = [np.array(x, copy=True) for x in inputs]
    engine = _engine(case.file)
    got = _as_tuple(engine.run(case.entry, *inputs))
    check_outputs(case, got, want)
    for k, (x, saved) in enumerate(zip(inputs, before, strict=True)):
        np.testing.assert_array_equal(x, saved, err_msg=f"{case.name}: input {k} was modified")


def test_nonbang_reductions_warn() -> None:
    """A non-! reduction into a tensor no statement has written starts from zero, and
    defining it says so."""
    engine = tcpy.ExecutionEngine(target="reference")
    with pytest.warns(tcpy.TCWarning, match="starts from zero"):
        engine.define((CORPUS / "nonbang.tc").read_text())


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


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")
def test_case_inputs_match_declared_types() -> None:
    """Every input has exactly the dtype and rank its TC declaration says, every size
    set names exactly the size symbols of the entry, and every def is run by a case."""
    from tcpy.parser import check_source

    entries = {(c.file, c.entry) for c in CASES}
    for path in sorted(CORPUS.glob("*.tc")):
        for name in check_source(path.read_text(), str(path)):
            assert (path.name, name) in entries, f"{path.name}: def {name} has no case"
    for case in CASES:
        cdef = check_source((CORPUS / case.file).read_text())[case.entry]
        for sizes in (case.sizes, *case.odd_sizes):
            assert set(sizes) == set(cdef.size_symbols), case.name
            inputs = make_inputs(case, sizes)
            assert len(inputs) == len(cdef.inputs), case.name
            for x, info in zip(inputs, cdef.inputs, strict=True):
                assert np.asarray(x).dtype == info.scalar.dtype, f"{case.name}: {info.name}"
                assert np.ndim(x) == info.rank, f"{case.name}: {info.name}"
