"""Shared machinery of the differential tests: corpus parameters, deterministic
inputs, and output comparison."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

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
