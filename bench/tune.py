"""Tuning benchmark: what the genetic tuner gains over the default options on the CPU
suite, how fast it gets there, and how it compares with random search.

    python bench/tune.py [--only matmul,softmax] [--max-time 120] [--generations 8]
                         [--population 12] [--versus matmul_transposed,softmax] [--seeds 3]
                         [--tag NAME] [--out bench/results] [--smoke]

For each kernel: a tuning session from the default options (budget: `--generations`
and `--max-time` seconds), then the default and the tuned kernels timed side by side in
alternating blocks (medians; the tuner's own timings are only used to choose), with
NumPy and, where installed, PyTorch's eager call in the same run. Reported: default
and tuned times, the speedup, the ratios to NumPy and to the faster peer, the tuning
wall time, the trials, and when the session first came within 10% of its final best
(from its history). Then, for the `--versus` kernels, the genetic search and random
search at the same trial budget over `--seeds` seeds (the median best time of each).
JSON and convergence plots go to `bench/results/`.

`--smoke` checks that the benchmark still runs: the kernels at `bench.suite.smoke_sized`
sizes, a session of one generation of four, one seed against random search, each
kernel timed once (`SMOKE_CONFIG`, `bench.cpu.SMOKE_BLOCKS`); its files are tagged
`smoke`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.cpu import (
    SMOKE_BLOCKS,
    Blocks,
    _cpu_name,
    _geomean,
    _outputs,
    _torch,
    alternating_blocks,
)
from bench.suite import SUITE, Kernel, smoke_sized, smoke_tag, torch_peer

SMOKE_CONFIG: dict[str, Any] = {
    "generations": 1, "population": 4, "elites": 1, "max_time_s": 30.0, "runs": 1, "workers": 1,
}  # fmt: skip
"""The tuner's budget under --smoke: one generation, each candidate timed once."""


def tune_one(
    kernel: Kernel, config: tcpy.TunerConfig, blocks: Blocks, plot: Path, torch: Any
) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    inputs = kernel.inputs(rng, kernel.sizes)
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(kernel.tc)
    default = engine.compile(kernel.entry, *inputs, options=engine.default_options(kernel.entry))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        result = engine.tune(kernel.entry, *inputs, config=config)
    tuned = engine.compile(kernel.entry, *inputs)
    assert tuned.options == result.options
    contenders = {
        "default": lambda: default(*inputs),
        "tuned": lambda: tuned(*inputs),
        "numpy": lambda: kernel.numpy(*inputs),
    }
    if torch is not None:
        tensors = [torch.from_numpy(x) if isinstance(x, np.ndarray) else float(x) for x in inputs]
        peer = torch_peer(torch, kernel)
        contenders["torch"] = lambda: peer(*tensors)
    want = _outputs(kernel.numpy(*inputs))
    for name in ("default", "tuned", "torch"):  # every contender checked before it is timed
        if name in contenders:
            for g, w in zip(_outputs(contenders[name]()), want, strict=True):
                np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3 * float(np.max(np.abs(w))))
    ms = alternating_blocks(contenders, blocks)
    best = min(ms[p] for p in ("numpy", "torch") if p in ms)
    result.plot(plot)
    return {
        "kernel": kernel.name,
        "sizes": kernel.sizes,
        "default_ms": round(ms["default"], 4),
        "tuned_ms": round(ms["tuned"], 4),
        "numpy_ms": round(ms["numpy"], 4),
        "torch_ms": round(ms["torch"], 4) if "torch" in ms else None,
        "speedup": round(ms["default"] / ms["tuned"], 3),
        # the tuner kept options compiled the same as the defaults: their ratio is noise
        "same_as_default": tuned.source == default.source,
        "tuner_speedup": round(result.speedup, 3),  # the session's own side-by-side times
        "tuned_vs_numpy": round(ms["numpy"] / ms["tuned"], 3),
        "default_vs_numpy": round(ms["numpy"] / ms["default"], 3),
        "tuned_vs_best": round(best / ms["tuned"], 3),
        "default_vs_best": round(best / ms["default"], 3),
        "tuning_wall_s": round(result.wall_s, 1),
        "trials": result.trials,
        "failures": result.failures,
        "seconds_to_90pct": _time_to_within(result.history, 0.10),
        "options": result.options.to_dict(),
        "history": result.history,
    }


def _time_to_within(history: list[dict[str, Any]], margin: float) -> float | None:
    """When the session's best first came within `margin` of its final best: "90% of
    the final best" read as a time at most (1 + margin) times the final one."""
    if not history:
        return None
    final = history[-1]["best_s"]
    for h in history:
        if h["best_s"] <= final * (1 + margin):
            return round(float(h["elapsed_s"]), 1)
    return None


def versus_random(kernel: Kernel, config: tcpy.TunerConfig, seeds: int) -> dict[str, Any]:
    """The genetic search and random search at the same trial budget, per seed, with
    one evaluator (candidates compiled, checked and timed the same way)."""
    from tcpy.binding import bind
    from tcpy.genetic.evaluate import Evaluator
    from tcpy.genetic.search import random_search, search
    from tcpy.genetic.space import build_space
    from tcpy.genetic.tasks import save_problem

    rng = np.random.default_rng(0)
    inputs = kernel.inputs(rng, kernel.sizes)
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(kernel.tc)
    cdef = engine.checked(kernel.entry)
    preset = engine.default_options(kernel.entry)
    space = build_space(cdef, bind(cdef, inputs).sizes, "cpu", preset)
    reference = tcpy.ExecutionEngine("reference")
    reference.define(kernel.tc)
    want = _outputs(reference.run(kernel.entry, *inputs))
    rows = []
    with tempfile.TemporaryDirectory(prefix="tcpy-versus-") as scratch:
        problem = save_problem(
            Path(scratch), cdef.source, kernel.entry, "cpu", inputs, want, tcpy.ExecutionEngine
        )
        for seed in range(seeds):
            cfg = tcpy.TunerConfig(**{**_fields(config), "seed": seed, "patience": 0})
            evaluator = Evaluator(problem, cfg, Path(scratch) / f"cache{seed}", Path(scratch))
            try:
                ga = search(space, [preset], evaluator, cfg)
                rnd = random_search(space, [preset], evaluator, ga.trials, seed)
            finally:
                evaluator.close()
            rows.append({"seed": seed, "trials": ga.trials, "ga_ms": ga.best_s * 1e3,
                         "random_ms": rnd.best_s * 1e3, "start_ms": ga.start_s * 1e3})  # fmt: skip
            print(f"  {kernel.name} seed {seed}: GA {ga.best_s * 1e3:.3f} ms, random "
                  f"{rnd.best_s * 1e3:.3f} ms ({ga.trials} trials each)", flush=True)  # fmt: skip
    return {
        "kernel": kernel.name,
        "runs": rows,
        "ga_median_ms": statistics.median(r["ga_ms"] for r in rows),
        "random_median_ms": statistics.median(r["random_ms"] for r in rows),
    }


def _fields(config: tcpy.TunerConfig) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--population", type=int, default=12)
    parser.add_argument("--max-time", type=float, default=120.0, help="seconds per session")
    parser.add_argument("--reps", type=int, default=5, help="least runs per timing block")
    parser.add_argument("--versus", default="matmul_transposed,softmax,conv2d",
                        help="kernels for GA against random search ('' to skip)")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="", help="suffix of the JSON file's name")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and budgets, timed once: does it still run? "
                        "(overrides --generations, --population, --max-time, --reps and "
                        "--seeds)")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ["TCPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcpy-bench-tune-")
    wanted = set(filter(None, args.only.split(",")))
    config = tcpy.TunerConfig(
        generations=args.generations, population=args.population, max_time_s=args.max_time,
        runs=5, workers=2, timeout_s=60, patience=3,
    )  # fmt: skip
    blocks, seeds = Blocks(least=args.reps), args.seeds
    if args.smoke:
        config = tcpy.TunerConfig(**{**_fields(config), **SMOKE_CONFIG})
        blocks, seeds = SMOKE_BLOCKS, 1
    suite = tuple(map(smoke_sized, SUITE)) if args.smoke else SUITE
    tag = smoke_tag(args.tag, args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, torch = [], _torch()
    for kernel in suite:
        if wanted and kernel.name not in wanted:
            continue
        start = time.monotonic()
        suffix = "".join(f"-{t}" for t in (args.tag, "smoke" if args.smoke else "") if t)
        plot = args.out / f"tune-{kernel.name}{suffix}.png"  # a tagged run keeps the others
        row = tune_one(kernel, config, blocks, plot, torch)
        rows.append(row)
        print(
            f"{row['kernel']:18} default {row['default_ms']:9.3f} ms  tuned {row['tuned_ms']:9.3f}"
            f" ms  x{row['speedup']:5.2f}  vs best peer {row['default_vs_best']:6.2f}"
            f" -> {row['tuned_vs_best']:6.2f}"
            f"{' (same code)' if row['same_as_default'] else ''}"
            f"  {row['trials']:3d} trials  {row['tuning_wall_s']:6.1f} s tuning"
            f"  90% at {row['seconds_to_90pct']} s  ({time.monotonic() - start:.0f} s)",
            flush=True,
        )
    versus = [versus_random(k, config, seeds)
              for k in suite if k.name in set(filter(None, args.versus.split(",")))]  # fmt: skip
    summary = {
        "geomean_speedup": _geomean([r["speedup"] for r in rows]),
        "min_speedup": min((r["speedup"] for r in rows), default=None),
        "geomean_speedup_changed": _geomean(
            [r["speedup"] for r in rows if not r["same_as_default"]]
        ),
        "geomean_default_vs_best": _geomean([r["default_vs_best"] for r in rows]),
        "geomean_tuned_vs_best": _geomean([r["tuned_vs_best"] for r in rows]),
        "ga_beats_random": [v["ga_median_ms"] <= v["random_median_ms"] for v in versus],
    }
    print(json.dumps(summary))
    result = {
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "target": "cpu",
        "smoke": args.smoke,
        "machine": {"processor": _cpu_name(), "cores": os.cpu_count()},
        "config": {k: v for k, v in _fields(config).items() if k != "executor"},
        "runs": {
            "rounds": blocks.rounds,
            "least_per_block": blocks.least,
            "block_s": blocks.block_s,
        },
        "kernels": rows,
        "ga_vs_random": versus,
        "summary": summary,
    }
    path = args.out / f"tune-{result['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(result, indent=1, default=_plain) + "\n")
    print(f"wrote {path}")
    return 0


def _commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def _plain(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


if __name__ == "__main__":
    sys.exit(main())
