"""Robustness: mutated corpus programs and random token soups go through the whole
front end (and, when they check, the reference target on small random inputs).
Only a TCError may escape; a hang is caught by an alarm and fails the test."""

from __future__ import annotations

import re
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.inputs import random_inputs, resolve_sizes

HERE = Path(__file__).parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from tools.fuzz.mutate import TOKENS  # noqa: E402  (one token list, the fuzzer's)

SEEDS = sorted((HERE / "corpus").glob("*.tc")) + sorted((HERE / "golden" / "parse").glob("*.tc"))
TEXTS = [p.read_text() for p in SEEDS]


HANG_SECONDS = 20


@contextmanager
def no_hang() -> Iterator[None]:
    def fail(signum: int, frame: object) -> None:
        raise AssertionError(f"the front end ran for more than {HANG_SECONDS} s")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(HANG_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def exercise(source: str, target: str = "reference") -> None:
    """Define `source` and run every def that checks; only TCError may escape, and on
    a compiled target a program that checks must also compile."""
    engine = tcpy.ExecutionEngine(target)
    with no_hang(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            names = engine.define(source)
        except tcpy.TCError as e:
            assert e.line is not None and e.line >= 1
            str(e)  # renders
            return
        for name in names:
            cdef = engine.checked(name)
            try:
                sizes = resolve_sizes(cdef, {s: 3 for s in cdef.size_symbols})
                inputs = random_inputs(cdef, sizes, np.random.default_rng(0))
                engine.run(name, *inputs)
            except (tcpy.TCCompileError, tcpy.TCLaunchError):
                raise
            except tcpy.TCError as e:
                str(e)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "duplicate", "replace", "rename"]))
        if not text:
            break
        a = draw(st.integers(0, len(text) - 1))
        b = draw(st.integers(a, min(len(text), a + 12)))
        match kind:
            case "delete":
                text = text[:a] + text[b:]
            case "insert":
                text = text[:a] + draw(st.sampled_from(TOKENS)) + text[a:]
            case "duplicate":
                text = text[:b] + text[a:b] + text[b:]
            case "replace":
                text = text[:a] + draw(st.sampled_from(TOKENS)) + text[b:]
            case "rename":
                names = sorted(set(re.findall(r"[A-Za-z_]\w*", text)))
                old, new = draw(st.sampled_from(names)), draw(st.sampled_from(names))
                text = re.sub(rf"\b{old}\b", new, text, count=draw(st.integers(1, 3)))
    return text


token_soup = st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mutated())
def test_mutated_programs(source: str) -> None:
    exercise(source)


@FUZZ
@given(token_soup)
def test_token_soup(source: str) -> None:
    exercise("def f(float(N) A) -> (B) { " + source + " }")
    exercise(source)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_programs_compile_on_cpu(source: str) -> None:
    exercise(source, "cpu")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_programs_compile_on_cuda_emu(source: str) -> None:
    exercise(source, "cuda-emu")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text(source: str) -> None:
    exercise(source)


def test_seeds_are_valid_programs() -> None:
    assert len(TEXTS) >= 10
    for text in TEXTS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tcpy.ExecutionEngine().define(text)
