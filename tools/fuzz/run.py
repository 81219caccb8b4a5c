"""The fuzzing loops: differential (program, options) pairs, and front-end mutations.

Every case runs in a `tcpy.sandbox` worker, so a crash or a hang is classified rather
than fatal. Failures are written as `Replay` JSON files and shrunk (within a time
bound) to a minimal replay beside the original. Pair `i` of seed `S` is generated from
`random.Random(S * 1_000_003 + i)`, which the replay keeps, so the shrinker can rebuild
the program's IR from the file.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tcpy.fuzz_tasks import GRADIENT, SMOOTH, define_only, replay_task
from tcpy.sandbox import Failure, Outcome, Replay, Sandbox, run_tasks
from tools.fuzz.generate import generate
from tools.fuzz.mutate import mutate, seed_sources, token_soup
from tools.fuzz.options import sample_options
from tools.fuzz.program import Program
from tools.fuzz.shrink import Case, TextCase, shrink_case, shrink_text

WORKER_ENV = {
    "TCPY_VERIFY": "1",
    "TCPY_POISON": "1",
    "TCPY_NUM_THREADS": "2",
    "TCPY_EMU_CHECK": "1",  # cuda-emu runs instrumented: bounds, races, barriers
}


RUN_TIMEOUT = 10.0
"""Seconds a pair's kernel may run once compiled (the compile has the pair's timeout):
at the fuzzer's sizes any kernel runs in well under a second, unless it runs away."""


def pair_seed(seed: int, i: int) -> int:
    return seed * 1_000_003 + i


def make_pair(
    seed: int,
    target: str,
    gradient: bool = False,
    float_type: str | None = None,
    online: bool = False,
) -> Replay:
    """The (program, options) pair of a generator seed, as a not-yet-failed replay;
    with `gradient`, a pair whose backward is checked (`fuzz_tasks.check_gradient`);
    `float_type`: the program's float type (`program.FLOAT_TYPES`, or "half" for one of
    the two half types) instead of the generator's draw; `online`: the program a chain
    of exponentials (`generate.online_chain`)."""
    rng = random.Random(seed)
    program = _typed(generate(rng, online), seed, float_type)
    options = sample_options(rng)
    inputs = (
        GRADIENT if gradient
        else SMOOTH if program.smooth
        else "exact-nan" if program.nan
        else "exact"
    )  # fmt: skip
    return Replay(
        source=program.render(),
        entry=program.name,
        sizes=dict(program.sizes),
        input_seed=seed,
        options=options.to_dict(),
        target=target,
        failure="",
        inputs=inputs,
        meta={"generator_seed": seed, "float_type": float_type, "online": online},
    )


def _typed(program: Program, seed: int, float_type: str | None) -> Program:
    if float_type is None:
        return program
    if float_type == "half":
        float_type = ("float16", "bfloat16")[seed % 2]
    return dataclasses.replace(program, float_type=float_type)


@dataclass
class Summary:
    pairs: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    tc_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    rejects: int = 0
    slowest: float = 0.0
    slowest_pair: int | None = None  # index of the pair with the slowest compile
    longest: float = 0.0  # the longest a case took, compile and runs and all
    saved: list[Path] = field(default_factory=list)

    def add(self, outcome: Outcome, index: int | None = None) -> None:
        self.pairs += 1
        self.longest = max(self.longest, outcome.seconds)
        if outcome.invalid:
            self.rejects += 1
        elif outcome.failure is not None:
            self.failures[outcome.failure.value] += 1
            if outcome.failure is Failure.COMPILE_ERROR:
                self.tc_errors[outcome.detail.split(":", 1)[0]] += 1
        if isinstance(outcome.value, dict):
            seconds = outcome.value.get("compile_seconds", 0.0)
            if seconds > self.slowest:
                self.slowest, self.slowest_pair = seconds, index

    def line(self) -> str:
        f = self.failures
        errors = ",".join(f"{k}:{v}" for k, v in sorted(self.tc_errors.items())) or "0"
        return (
            f"pairs={self.pairs} mismatches={f['wrong_result']} escapes={f['internal_error']} "
            f"crashes={f['crash']} hangs={f['hang']} runaways={f['runaway']} "
            f"tc_errors={errors} generator_rejects={self.rejects} "
            f"slowest_compile={self.slowest:.2f}s slowest_case={self.longest:.2f}s"
        )


@contextmanager
def private_cache() -> Iterator[None]:
    """Kernels built while fuzzing go to a temporary cache, deleted at the end, so the
    user's cache is not filled with thousands of one-off kernels."""
    old = os.environ.get("TCPY_CACHE_DIR")
    path = tempfile.mkdtemp(prefix="tcpy-fuzz-cache-")
    os.environ["TCPY_CACHE_DIR"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TCPY_CACHE_DIR", None)
        else:
            os.environ["TCPY_CACHE_DIR"] = old
        shutil.rmtree(path, ignore_errors=True)


def fuzz(
    target: str,
    n: int,
    seed: int = 0,
    jobs: int | None = None,
    timeout: float = 120.0,
    out: Path | None = Path("fuzz-failures"),
    shrink_seconds: float = 60.0,
    log: Any = sys.stderr,
    run_timeout: float = RUN_TIMEOUT,
    gradient: bool = False,
    float_type: str | None = None,
    online: bool = False,
) -> Summary:
    """Run `n` pairs on `target`; save and shrink the failures under `out`. A failure
    is saved as soon as it is found, so a run that is stopped keeps what it found;
    shrinking waits for the end. A pair has `timeout` seconds to compile and
    `run_timeout` to run its kernel after that. `gradient`: check the backwards of the
    programs instead (`fuzz_tasks.check_gradient`); `online`: every program a chain of
    exponentials."""
    summary = Summary()
    pairs = [make_pair(pair_seed(seed, i), target, gradient, float_type, online) for i in range(n)]
    start, last = time.monotonic(), time.monotonic()
    failed: list[Path] = []
    with private_cache():
        env = {**WORKER_ENV, "TCPY_CACHE_DIR": os.environ["TCPY_CACHE_DIR"]}
        for i, outcome in run_tasks(replay_task, [p.args() for p in pairs], jobs=jobs,
                                    timeout=timeout, env=env, run_timeout=run_timeout):  # fmt: skip
            summary.add(outcome, i)
            if outcome.failure is not None and out is not None:
                r = dataclasses.replace(
                    pairs[i], failure=outcome.failure.value, detail=outcome.detail)  # fmt: skip
                out.mkdir(parents=True, exist_ok=True)
                mode = "gradient-" if gradient else ""
                path = out / f"{target}-{mode}{r.failure}-{r.meta['generator_seed']}.json"
                r.save(path)
                summary.saved.append(path)
                failed.append(path)
                if log:
                    print(f"{r.failure}: saved {path}", file=log, flush=True)
            if log and time.monotonic() - last > 10:
                last = time.monotonic()
                print(f"[{time.monotonic() - start:.0f}s] {summary.line()}", file=log, flush=True)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            if summary.slowest_pair is not None:  # to profile the slowest compile
                slowest = pairs[summary.slowest_pair]
                slowest = dataclasses.replace(
                    slowest, detail=f"compiled in {summary.slowest:.2f} s"
                )
                slowest.save(out / f"{target}-slowest-compile.json")
            if shrink_seconds > 0:
                for path in failed:
                    summary.saved.append(
                        shrink_file(path, shrink_seconds, timeout, env, run_timeout)
                    )
    return summary


def signature(outcome: Outcome) -> tuple[str, str]:
    """What must stay the same while shrinking: the class, and for errors the type."""
    if outcome.failure is None:
        return ("", "")
    detail = outcome.detail.strip()
    if outcome.failure is Failure.COMPILE_ERROR:
        return (outcome.failure.value, detail.split(":", 1)[0])
    if outcome.failure is Failure.INTERNAL_ERROR:
        return (outcome.failure.value, detail.splitlines()[-1].split(":", 1)[0])
    return (outcome.failure.value, "")


def shrink_file(
    path: Path,
    seconds: float,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    run_timeout: float = RUN_TIMEOUT,
) -> Path:
    """Shrink the replay at `path`; writes and returns `<name>.min.json` beside it."""
    original = Replay.load(path)
    with Sandbox(env={**WORKER_ENV, **(env or {})}) as sb:
        want = signature(sb.run(replay_task, original.args(), timeout, run_timeout))
        if want == ("", ""):
            raise SystemExit(f"{path} does not fail any more")

        def fails(r: Replay) -> bool:
            return signature(sb.run(replay_task, r.args(), timeout, run_timeout)) == want

        smallest = _shrink(original, fails, seconds)
    out = path.with_name(path.name.removesuffix(".json") + ".min.json")
    smallest.save(out)
    return out


def _shrink(original: Replay, fails: Any, seconds: float) -> Replay:
    seed = original.meta.get("generator_seed")
    gradient = original.inputs == GRADIENT
    float_type = original.meta.get("float_type")
    online = bool(original.meta.get("online", False))
    rebuilt = (
        make_pair(seed, original.target, gradient, float_type, online)
        if isinstance(seed, int)
        else None
    )
    if rebuilt is not None and rebuilt.source == original.source:
        program = _typed(generate(random.Random(seed), online), seed, float_type)

        def as_replay(c: Case) -> Replay:
            return dataclasses.replace(original, source=c.program.render(),
                                       sizes=dict(c.program.sizes), options=c.options)  # fmt: skip

        best = shrink_case(Case(program, dict(original.options or {})),
                           lambda c: fails(as_replay(c)), seconds)  # fmt: skip
        return as_replay(best)

    def text_replay(c: TextCase) -> Replay:
        return dataclasses.replace(original, source=c.source, sizes=c.sizes, options=c.options)

    best_text = shrink_text(TextCase(original.source, original.sizes, original.options),
                            lambda c: fails(text_replay(c)), seconds)  # fmt: skip
    return text_replay(best_text)


def fuzz_frontend(
    n: int, seed: int = 0, jobs: int | None = None, timeout: float = 20.0,
    out: Path | None = Path("fuzz-failures"), log: Any = sys.stderr,
) -> Summary:  # fmt: skip
    """Run `n` mutated sources through the front end; anything but a TCError (or
    acceptance) is a failure, saved as a replay of target `define`."""
    rng = random.Random(seed)
    seeds = seed_sources()
    sources = [mutate(rng.choice(seeds), rng) if rng.random() < 0.8 else token_soup(rng)
               for _ in range(n)]  # fmt: skip
    summary = Summary()
    for i, outcome in run_tasks(define_only, [(s,) for s in sources], jobs=jobs,
                                timeout=timeout, env=WORKER_ENV):  # fmt: skip
        summary.add(outcome)
        if outcome.failure is not None and out is not None:
            out.mkdir(parents=True, exist_ok=True)
            r = Replay(sources[i], "", {}, 0, None, "define", outcome.failure.value,
                       outcome.detail, meta={"mutation_seed": seed, "index": i})  # fmt: skip
            path = out / f"define-{r.failure}-{seed}-{i}.json"
            r.save(path)
            summary.saved.append(path)
    return summary
