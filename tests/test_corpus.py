"""The TC corpus on the reference target: every case of corpus_cases at its default
sizes and at its odd sizes, compared with an independent NumPy computation."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

import tcpy

from corpus_cases import CASES, Case
from differential import CORPUS, as_tuple, check_outputs, corpus_params, make_inputs


@cache
def _engine(file: str) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(target="reference")
    engine.define((CORPUS / file).read_text())
    return engine


@pytest.mark.filterwarnings("ignore::tcpy.TCWarning")  # nonbang.tc warns on purpose
@pytest.mark.parametrize(("case", "sizes"), corpus_params())
def test_corpus_reference(case: Case, sizes: dict[str, int]) -> None:
    inputs = make_inputs(case, sizes)
    want = case.expected(*inputs)
    before = [np.array(x, copy=True) for x in inputs]
    engine = _engine(case.file)
    got = as_tuple(engine.run(case.entry, *inputs))
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
