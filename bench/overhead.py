"""Per-call overhead: what a call of a tiny kernel costs in Python, beside the kernel.

    python bench/overhead.py [--tag NAME] [--out bench/results] [--gpu | --fake-gpu] [--smoke]

With `--gpu` (a GPU machine) or `--fake-gpu` (none: the CI's fake driver), the host
time of steady GPU calls instead (`bench/overhead_gpu.py`).

A 16-element `C(i) = A(i) + B(i)` on the `cpu` target, compiled once. Timed, as the
best of 7 rounds of 20,000 calls each: the compiled C function called directly through
ctypes with prebuilt arguments (the kernel itself: an OpenMP region), then every way
to call it from Python: `engine.add(a, b)`, with `out=`, the compiled kernel, and the
compiled kernel with `unchecked=True` (with and without `out=`). The overhead of a
path is its time less the direct call's; NumPy's `np.add` on the same arrays is shown
for scale. Also, in a fresh interpreter (best of 5): `import tcpy`, `import numpy` for
scale, and `import tcpy` with a first engine and a `define` (which load the front end).

It runs against whichever tcpy is importable (`PYTHONPATH=<checkout>` to measure
another), skipping the paths that tcpy lacks. Results go to
`bench/results/overhead-<date>[-<tag>].json`. `--smoke` checks that the benchmark
still runs: one round of `SMOKE_CALLS` calls a path, each import timed once; its file
is tagged `smoke`.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROUNDS, CALLS = 7, 20_000
SMOKE_CALLS = 100  # in one round, under --smoke


def best_us(fn: Callable[[], object], rounds: int = ROUNDS, calls: int = CALLS) -> float:
    """The best of `rounds` rounds of `calls` calls: microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


# what `import tcpy` costs, then what a first engine and a `define` add: the front end
# and the engine load with the first engine (`tcpy.__getattr__`)
IMPORT = "import time; t = time.perf_counter(); import tcpy; print(time.perf_counter() - t)"
NUMPY = "import time; t = time.perf_counter(); import numpy; print(time.perf_counter() - t)"
FIRST_DEFINE = (
    "import time; t = time.perf_counter(); import tcpy; e = tcpy.ExecutionEngine('cpu'); "
    "e.define('def f(float(N) A) -> (B) { B(i) = A(i) }'); print(time.perf_counter() - t)"
)


def import_seconds(code: str = IMPORT, runs: int = 5) -> float:
    """The best of `runs` fresh interpreters: seconds `code` reports."""
    seconds = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout)
        for _ in range(runs)
    ]  # fmt: skip
    return min(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--gpu", action="store_true", help="GPU calls on a real device")
    parser.add_argument("--fake-gpu", action="store_true", help="GPU calls on a fake driver")
    parser.add_argument("--smoke", action="store_true", help="few calls: does it still run?")
    args = parser.parse_args(argv)
    if args.gpu or args.fake_gpu:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from bench import overhead_gpu

        return overhead_gpu.main(args.gpu, args.tag, args.out, args.smoke)

    import tcpy
    from tcpy.runtime import cpu as runtime

    # the checkout's bench helpers only now: the tcpy measured is whichever is importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.suite import smoke_tag

    os.environ.pop("TCPY_POISON", None)
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
    a, b, c = (np.ones(16, np.float32) for _ in range(3))
    engine.add(a, b)
    kernel = engine.compile("add", a, b)
    library = kernel._kernel.run
    sizes = (ctypes.c_int64 * 1)(16)
    buffers = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    threads = runtime.threads_now(0)
    rounds, calls, runs = (1, SMOKE_CALLS, 1) if args.smoke else (ROUNDS, CALLS, 5)

    def best(fn: Callable[[], object]) -> float:
        return best_us(fn, rounds, calls)

    direct = best(lambda: library._fn(sizes, buffers, threads))
    paths: dict[str, Callable[[], object]] = {
        "engine.add(a, b)": lambda: engine.add(a, b),
        "engine.add(a, b, out=c)": lambda: engine.add(a, b, out=c),
        "kernel(a, b)": lambda: kernel(a, b),
        "kernel(a, b, unchecked=True)": lambda: kernel(a, b, unchecked=True),
        "kernel(a, b, out=c, unchecked=True)": lambda: kernel(a, b, out=c, unchecked=True),
    }
    rows = []
    print(f"kernel called directly: {direct:.1f} us; np.add: {best(lambda: np.add(a, b)):.1f} us")
    for name, fn in paths.items():
        try:
            fn()
        except TypeError:  # a path this tcpy does not have
            continue
        total = best(fn)
        rows.append(
            {"path": name, "call_us": round(total, 2), "overhead_us": round(total - direct, 2)}
        )
        print(f"{name:38} {total:7.1f} us   overhead {total - direct:6.1f} us")
    seconds = import_seconds(IMPORT, runs)
    numpy_seconds = import_seconds(NUMPY, runs)
    define_seconds = import_seconds(FIRST_DEFINE, runs)
    print(
        f"import tcpy: {seconds * 1e3:.0f} ms (import numpy alone: {numpy_seconds * 1e3:.0f} ms); "
        f"import, first engine and a define: {define_seconds * 1e3:.0f} ms"
    )
    record = {
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "machine": {"processor": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "python": platform.python_version()},
        "tcpy_source": str(Path(tcpy.__file__).parent),
        "rounds": rounds, "calls_per_round": calls,
        "direct_call_us": round(direct, 2), "paths": rows,
        "import_tcpy_s": round(seconds, 3), "import_numpy_s": round(numpy_seconds, 3),
        "import_engine_define_s": round(define_seconds, 3),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag(args.tag, args.smoke)
    path = args.out / f"overhead-{record['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
