"""CPU benchmark: every kernel of the suite on the `cpu` target against NumPy, in the
same run, on the same inputs.

    python bench/cpu.py [--reps 25] [--only softmax,gelu] [--out bench/results]

For each kernel: the compile time from `define` to the first result (with an empty
kernel cache), a check of the result against NumPy, then tcpy and NumPy timed in
alternating blocks (with a pause before each, so that one library's spinning threads
do not slow the other) and summarised by the medians of all runs. The ratio is NumPy's
time over tcpy's (above 1: tcpy is faster). Results go to `bench/results/cpu-<date>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.suite import SUITE, Kernel


def _outputs(result: object) -> tuple[np.ndarray, ...]:
    return tuple(result) if isinstance(result, tuple) else (np.asarray(result),)


def measure(kernel: Kernel, reps: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    inputs = kernel.inputs(rng, kernel.sizes)
    engine = tcpy.ExecutionEngine("cpu")
    start = time.perf_counter()
    engine.define(kernel.tc)
    compiled = engine.compile(kernel.entry, *inputs)
    got = _outputs(compiled(*inputs))
    compile_s = time.perf_counter() - start
    want = _outputs(kernel.numpy(*inputs))
    error = max(
        float(np.max(np.abs(g.astype(np.float64) - w) / (1 + np.abs(w))))
        for g, w in zip(got, want, strict=True)
    )
    ours: list[float] = []
    peer: list[float] = []
    compiled(*inputs)
    kernel.numpy(*inputs)
    for _ in range(ROUNDS):
        _block(lambda: compiled(*inputs), reps, ours)
        _block(lambda: kernel.numpy(*inputs), reps, peer)
    tcpy_s, numpy_s = statistics.median(ours), statistics.median(peer)
    return {
        "kernel": kernel.name,
        "options": compiled.options.to_dict(),
        "sizes": kernel.sizes,
        "memory_bound": kernel.memory_bound,
        "compile_s": round(compile_s, 4),
        "max_rel_error": error,
        "tcpy_ms": round(tcpy_s * 1e3, 4),
        "numpy_ms": round(numpy_s * 1e3, 4),
        "ratio_vs_numpy": round(numpy_s / tcpy_s, 3),
        "tcpy_gflops": round(kernel.flops(kernel.sizes) / tcpy_s / 1e9, 2),
        "tcpy_gbps": round(kernel.bytes(kernel.sizes) / tcpy_s / 1e9, 2),
    }


ROUNDS = 4
GAP_S = 0.3
"""tcpy and NumPy run in alternating blocks, each after a pause: on a small machine the
threads of one library keep spinning for a while after a call and would otherwise
slow down the other."""


def _block(fn: object, reps: int, times: list[float]) -> None:
    time.sleep(GAP_S)
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6, help="runs per block (4 blocks each)")
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    wanted = set(filter(None, args.only.split(",")))
    os.environ["TCPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcpy-bench-")
    rows = []
    for kernel in SUITE:
        if wanted and kernel.name not in wanted:
            continue
        row = measure(kernel, args.reps)
        rows.append(row)
        print(
            f"{row['kernel']:18} tcpy {row['tcpy_ms']:9.3f} ms  numpy {row['numpy_ms']:9.3f} ms"
            f"  ratio {row['ratio_vs_numpy']:6.2f}  {row['tcpy_gflops']:7.1f} GFLOP/s"
            f"  compile {row['compile_s']:.2f} s  err {row['max_rel_error']:.1e}",
            flush=True,
        )
    bound = [r["ratio_vs_numpy"] for r in rows if r["memory_bound"]]
    summary = {
        "geomean_ratio_all": _geomean([r["ratio_vs_numpy"] for r in rows]),
        "geomean_ratio_memory_bound": _geomean(bound),
    }
    print(json.dumps(summary))
    result = {
        "date": datetime.date.today().isoformat(),
        "target": "cpu",
        "machine": {
            "processor": _cpu_name(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "options": tcpy.MappingOptions.cpu().to_dict(),
        "runs": {"rounds": ROUNDS, "per_block": args.reps, "pause_s": GAP_S},
        "kernels": rows,
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cpu-{result['date']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


def _geomean(values: list[object]) -> float | None:
    nums = [float(v) for v in values if isinstance(v, int | float)]
    return round(math.exp(sum(map(math.log, nums)) / len(nums)), 3) if nums else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
