"""CPU benchmark: every kernel of the suite, and a matmul size sweep, on the `cpu`
target against NumPy and PyTorch eager (when installed), in the same run, on the same
inputs.

    python bench/cpu.py [--reps 6] [--only softmax,gelu] [--no-sweep] [--loaded] [--generic]
                        [--users] [--convs] [--interleaved] [--tag NAME] [--out bench/results]
                        [--smoke]

First the machine's limits are measured: the FP32 FMA peak (a C loop of independent
vector FMAs on every core, at each vector width the compiler offers) and the copy
bandwidth (the best of NumPy's copy and a tcpy copy kernel, bytes read plus written).
Then, for each kernel: the compile time from `define` to the first result (empty
kernel cache), a check against NumPy, and tcpy's full call (allocating its outputs),
tcpy's kernel alone on preallocated buffers, NumPy and PyTorch timed in alternating
blocks (with a pause before each, so that one library's spinning threads do not slow
the next) and summarised by medians. Ratios are the peer's time over tcpy's full call
(above 1: tcpy is faster); GFLOP/s and GB/s are of the kernel alone, against the peak
and the copy bandwidth.

`--users` times the kernels of `bench/users.py` (what users write beyond the suite:
PolyBench's linear algebra, BERT layer blocks, element-wise kernels) instead of the
suite; `--convs`, the suite's convolutions at a ResNet's layer shapes
(`bench.suite.conv_sweep`), each against PyTorch's `conv2d`. `--interleaved` also
times each kernel in a loop that alternates one tcpy call and one call of its NumPy
peer, as code mixing the two libraries does: tcpy's call right after NumPy's and
NumPy's right after tcpy's, against their quiet times, and tcpy's at each thread count
(the best thread count in that state); and each library's calls made one at a time
after a pause (`SPORADIC_S`), as a program that does other work between its calls
makes them, against their quiet times; and tcpy's calls alternating with PyTorch's
peer, each against its quiet time.
`--loaded` runs one single-threaded busy process at normal priority beside everything,
as another user of the machine would. `--smoke` checks that the benchmark still runs:
the kernels at `bench.suite.smoke_sized` sizes, each timed once, the machine's limits
measured briefly (what CI runs, tests/test_bench.py). Results go to
`bench/results/cpu-<date>[-<tag>].json` (the tag defaults to `loaded` under --loaded;
`users` is put first under --users, `smoke` added under --smoke).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.suite import (
    SUITE,
    Kernel,
    conv_sweep,
    matmul_sweep,
    smoke_sized,
    smoke_tag,
    torch_peer,
)
from bench.users import USERS, smoke_user
from tcpy.binding import bind
from tcpy.runtime import cpu as runtime
from tcpy.runtime.cpu import address

ROUNDS = 4
GAP_S = 0.3
BLOCK_S = 0.25
"""Each contender runs in alternating blocks of about `BLOCK_S` (at least `--reps`
runs), each after a pause: on a small machine the threads of one library keep spinning
for a while after a call and would otherwise slow down the next. The first runs after
a pause are slow for every contender (the cores wake up: 3x on a 0.5 ms kernel here),
so a block must be long enough for its median to be the steady state."""
WARM_S = 0.05  # each contender's runs before the blocks are sized (`warm_run`)


# --- the machine's limits ---------------------------------------------------------------

_PEAK_C = r"""
#include <omp.h>
typedef float vec __attribute__((vector_size(%(bytes)d)));
double peak(long iters) {
  double total = 0;
  #pragma omp parallel reduction(+:total)
  {
    vec a[12], b, c;
    for (int k = 0; k < (int)(sizeof(vec) / 4); k++) { b[k] = 0.999999f; c[k] = 1e-6f; }
    for (int j = 0; j < 12; j++) a[j] = b * (float)j;
    for (long i = 0; i < iters; i++) {
      #pragma GCC unroll 12
      for (int j = 0; j < 12; j++) a[j] = a[j] * b + c;  /* 12 independent FMA chains */
    }
    for (int j = 0; j < 12; j++)
      for (int k = 0; k < (int)(sizeof(vec) / 4); k++) total += a[j][k];
  }
  return total;
}
"""


def fma_peak_gflops(iters: int = 2_000_000, widths: tuple[int, ...] = (16, 32, 64)) -> float:
    """The best FP32 GFLOP/s of independent vector FMAs on all cores, over the vector
    `widths` (in bytes) the compiler builds for this CPU, `iters` times 12 FMAs a
    thread."""
    best = 0.0
    threads = os.cpu_count() or 1
    for width in widths:
        with tempfile.TemporaryDirectory() as tmp:
            source, lib = Path(tmp, "peak.c"), Path(tmp, "peak.so")
            source.write_text(_PEAK_C % {"bytes": width})
            built = subprocess.run(
                [runtime.compiler(), "-O2", "-march=native", "-fopenmp", "-shared", "-fPIC",
                 "-o", str(lib), str(source)],
                capture_output=True, check=False,
            )  # fmt: skip
            if built.returncode != 0:
                continue
            peak = ctypes.CDLL(str(lib)).peak
            peak.restype, peak.argtypes = ctypes.c_double, [ctypes.c_long]
            peak(iters // 10)
            seconds = min(_seconds(lambda: peak(iters)) for _ in range(5))  # noqa: B023
            flops = threads * iters * 12 * (width // 4) * 2
            best = max(best, flops / seconds / 1e9)
    return best


def copy_bandwidth_gbps(megabytes: int = 256) -> float:
    """GB/s (bytes read plus written) of copying `megabytes`: the best of NumPy's copy
    and a tcpy copy kernel (on every core)."""
    src = np.ones(megabytes * 2**18, np.float32)
    dst = np.empty_like(src)
    numpy_s = min(_seconds(lambda: np.copyto(dst, src)) for _ in range(5))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def copy(float(N) X) -> (Y) { Y(i) = X(i) }")
    kernel = kernel_alone(engine.compile("copy", src), (src,))
    kernel()
    tcpy_s = min(_seconds(kernel) for _ in range(5))
    return 2 * src.nbytes / min(numpy_s, tcpy_s) / 1e9


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- timing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Blocks:
    """How `alternating_blocks` times: `rounds` rounds, each a block per contender of
    about `block_s` seconds (at least `least` runs, at most `most`), each block after a
    pause of `pause_s`."""

    least: int = 6
    rounds: int = ROUNDS
    block_s: float = BLOCK_S
    pause_s: float = GAP_S
    most: int = 2000
    warm_s: float = WARM_S


SMOKE_BLOCKS = Blocks(least=1, rounds=1, block_s=0.0, pause_s=0.0, warm_s=0.0)
"""One run of each contender, no pause: whether the timing runs, not what it says."""


def alternating_blocks(
    contenders: Mapping[str, Callable[[], object]],
    blocks: Blocks,
    seconds: Callable[[Callable[[], object]], float] = _seconds,
) -> dict[str, float]:
    """The median milliseconds of each contender, timed in alternating blocks (tcpy and
    its peers take turns, so that a noisy machine disturbs all of them alike). A
    block's runs are fixed before the first round from each contender's runs warm
    (`warm_run`). `seconds` times one run (default: wall time; a GPU's caller
    synchronises in it)."""
    runs = {
        name: max(
            blocks.least, min(blocks.most, round(blocks.block_s / warm_run(fn, blocks, seconds)))
        )
        for name, fn in contenders.items()
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(blocks.rounds):
        for name, fn in contenders.items():
            time.sleep(blocks.pause_s)
            times[name] += [seconds(fn) for _ in range(runs[name])]
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def warm_run(
    fn: Callable[[], object], blocks: Blocks, seconds: Callable[[Callable[[], object]], float]
) -> float:
    """The seconds of a run of `fn`: the median of its runs for `blocks.warm_s` (one at
    least). Sized from a single run, a block of a contender whose one run was cold (after
    another library's call, or the first of its kind) was a few runs, all cold: two
    compilations of one kernel with the same options measured 0.16 and 0.24 ms."""
    took = [seconds(fn)]
    began = time.perf_counter()
    while time.perf_counter() - began < blocks.warm_s:
        took.append(seconds(fn))
    return statistics.median(took)


# --- one kernel -----------------------------------------------------------------------------


def kernel_alone(compiled: tcpy.Compiled, inputs: tuple[np.ndarray, ...]) -> Callable[[], None]:
    """tcpy's compiled code on buffers allocated once, called by their addresses (as
    `host_kernels.Steady` calls it): the call without checking the inputs or allocating
    the outputs."""
    binding = bind(compiled.cdef, inputs)
    kernel = compiled._kernel  # a HostKernel: the cpu target's
    sizes, buffers, _ = kernel._buffers(binding, kernel._shapes_at(binding))
    call = kernel.run.at(sizes, len(buffers))
    addresses = [address(b) for b in buffers]

    # `addresses` are the buffers' only: the default keeps the arrays alive
    def run(_keep: object = buffers) -> None:
        call(addresses)

    return run


def _outputs(result: object) -> tuple[np.ndarray, ...]:
    if isinstance(result, tuple):
        return tuple(np.asarray(r) for r in result)
    return (np.asarray(result),)


def measure(  # type: ignore[type-arg]
    kernel: Kernel,
    blocks: Blocks,
    torch: object,
    limits: dict[str, float],
    generic: bool = False,
) -> dict:
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
    contenders: dict[str, Callable[[], object]] = {
        "tcpy": lambda: compiled(*inputs),
        "tcpy_kernel": kernel_alone(compiled, inputs),
        "numpy": lambda: kernel.numpy(*inputs),
    }
    if torch is not None:
        tensors = [
            torch.from_numpy(x) if isinstance(x, np.ndarray) else float(x)  # type: ignore[attr-defined]
            for x in inputs
        ]
        peer = torch_peer(torch, kernel)
        contenders["torch"] = lambda: peer(*tensors)
    extra: dict[str, object] = {}
    if generic:
        extra, contenders["tcpy_generic"] = _generic(engine, kernel, compiled, inputs, want)
    ms = alternating_blocks(contenders, blocks)
    peers = [ms[p] for p in ("numpy", "torch") if p in ms]
    flops, moved = kernel.flops(kernel.sizes), kernel.bytes(kernel.sizes)
    gflops = flops / ms["tcpy_kernel"] / 1e6
    gbps = moved / ms["tcpy_kernel"] / 1e6
    return {
        "kernel": kernel.name,
        "options": compiled.options.to_dict(),
        "sizes": kernel.sizes,
        "memory_bound": kernel.memory_bound,
        "compile_s": round(compile_s, 4),
        "max_rel_error": error,
        **{f"{name}_ms": round(value, 4) for name, value in ms.items()},
        "ratio_vs_numpy": round(ms["numpy"] / ms["tcpy"], 3),
        "ratio_vs_torch": round(ms["torch"] / ms["tcpy"], 3) if "torch" in ms else None,
        "ratio_vs_best": round(min(peers) / ms["tcpy"], 3),
        "tcpy_gflops": round(gflops, 2),
        "fraction_of_fma_peak": round(gflops / limits["fma_peak_gflops"], 3),
        "tcpy_gbps": round(gbps, 2),
        "fraction_of_copy_bandwidth": round(gbps / limits["copy_bandwidth_gbps"], 3),
        **extra,
        **(
            {"generic_over_fixed": round(ms["tcpy_generic"] / ms["tcpy"], 3)}
            if "tcpy_generic" in ms
            else {}
        ),
    }


def interleaved(kernel: Kernel, blocks: Blocks, quiet: dict, torch=None) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """The kernel in a loop alternating one tcpy call and one call of its NumPy peer
    (`blocks.rounds` blocks of about `blocks.block_s` seconds after a pause): the median
    of each, with tcpy's threads chosen at each call and at each fixed count, against
    the quiet medians of `quiet` (`measure`'s row); and, given `torch`, alternating with
    its PyTorch peer (whose OpenMP threads spin for milliseconds after each call)."""
    inputs = kernel.inputs(np.random.default_rng(0), kernel.sizes)
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(kernel.tc)
    options = engine.default_options(kernel.entry)
    counts = [0, *range(1, (os.cpu_count() or 1) + 1)]  # 0: chosen at each call
    tcpy_ms: dict[str, float] = {}
    numpy_ms = 0.0
    for count in counts:
        compiled = engine.compile(kernel.entry, *inputs, options=options.replace(threads=count))
        ours, theirs = _alternating(
            functools.partial(compiled, *inputs), lambda: kernel.numpy(*inputs), blocks
        )
        tcpy_ms[str(count) if count else "chosen"] = round(ours, 4)
        numpy_ms = round(theirs, 4) if count == 0 else numpy_ms
    best = min(v for k, v in tcpy_ms.items() if k != "chosen")
    compiled = engine.compile(kernel.entry, *inputs, options=options)
    alone = {
        "tcpy": sporadic(functools.partial(compiled, *inputs), blocks),
        "numpy": sporadic(lambda: kernel.numpy(*inputs), blocks),
    }
    beside_torch: dict[str, float] = {}
    if torch is not None:
        tensors = [torch.from_numpy(x) if isinstance(x, np.ndarray) else float(x) for x in inputs]
        peer = torch_peer(torch, kernel)
        ours, theirs = _alternating(
            functools.partial(compiled, *inputs), lambda: peer(*tensors), blocks
        )
        beside_torch = {
            "tcpy_after_torch_ms": round(ours, 4),
            "torch_after_tcpy_ms": round(theirs, 4),
            "tcpy_over_quiet_beside_torch": round(ours / quiet["tcpy_ms"], 3),
            "torch_over_quiet": round(theirs / quiet["torch_ms"], 3),
        }
    return {
        **beside_torch,
        "tcpy_after_numpy_ms": tcpy_ms,
        "numpy_after_tcpy_ms": numpy_ms,
        "tcpy_over_quiet": round(tcpy_ms["chosen"] / quiet["tcpy_ms"], 3),
        "tcpy_over_best_count": round(tcpy_ms["chosen"] / best, 3),
        "numpy_over_quiet": round(numpy_ms / quiet["numpy_ms"], 3),
        "tcpy_sporadic_ms": round(alone["tcpy"], 4),
        "numpy_sporadic_ms": round(alone["numpy"], 4),
        "tcpy_sporadic_over_quiet": round(alone["tcpy"] / quiet["tcpy_ms"], 3),
        "numpy_sporadic_over_quiet": round(alone["numpy"] / quiet["numpy_ms"], 3),
    }


SPORADIC_S = 0.1
"""The pause before each call timed on its own (`sporadic`): longer than OpenBLAS's
threads spin after a call, shorter than a step of most programs."""


def sporadic(call: Callable[[], object], blocks: Blocks) -> float:
    """The median milliseconds of `call` made `5 * blocks.rounds` times, each after a
    pause (`SPORADIC_S`, or the blocks' own where shorter)."""
    times = []
    for _ in range(5 * blocks.rounds):
        time.sleep(min(SPORADIC_S, blocks.pause_s))
        times.append(_seconds(call))
    return statistics.median(times) * 1e3


def _alternating(
    ours: Callable[[], object], theirs: Callable[[], object], blocks: Blocks
) -> tuple[float, float]:
    """The median milliseconds of `ours` and `theirs` called in turn."""
    runs = max(
        blocks.least, min(blocks.most, round(blocks.block_s / (_seconds(ours) + _seconds(theirs))))
    )
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(blocks.rounds):
        time.sleep(blocks.pause_s)
        for _ in range(runs):
            times[0].append(_seconds(ours))
            times[1].append(_seconds(theirs))
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def _interleaved_summary(rows: list[dict]) -> dict[str, float | None]:  # type: ignore[type-arg]
    """The geometric means and the worst of each interleaved ratio."""
    out: dict[str, float | None] = {}
    for key in (
        "tcpy_over_quiet",
        "tcpy_over_best_count",
        "numpy_over_quiet",
        "tcpy_sporadic_over_quiet",
        "numpy_sporadic_over_quiet",
        "tcpy_over_quiet_beside_torch",
        "torch_over_quiet",
    ):
        values = [r["interleaved"][key] for r in rows if key in r["interleaved"]]
        out[f"interleaved_{key}_geomean"] = _geomean(values)
        out[f"interleaved_{key}_worst"] = max(values, default=None)
    return out


def _generic(  # type: ignore[no-untyped-def]
    engine: tcpy.ExecutionEngine, kernel: Kernel, fixed, inputs, want
) -> tuple[dict[str, object], Callable[[], object]]:
    """The size-generic kernel of the def (`fix_parameters_before_scheduling=False` on
    the defaults), checked, and called at a second shape: whether that call compiled
    again, and the compile counts."""
    options = fixed.options.replace(fix_parameters_before_scheduling=False)
    start = time.perf_counter()
    compiled = engine.compile(kernel.entry, *inputs, options=options)
    compile_s = time.perf_counter() - start
    got = _outputs(compiled(*inputs))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)
    other = {k: v - 1 if v > 8 else v for k, v in kernel.sizes.items()}  # a new shape
    before = engine.stats.compiles
    engine.run(kernel.entry, *kernel.inputs(np.random.default_rng(1), other), options=options)
    facts = {
        "generic": compiled.generic,
        "generic_compile_s": round(compile_s, 4),
        "compiles_for_a_new_shape": engine.stats.compiles - before,
    }
    return facts, lambda: compiled(*inputs)


# --- the run ---------------------------------------------------------------------------------

SMOKE_SWEEP = (64,)  # the matmul sweep's sizes under --smoke


def _torch() -> object:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    return torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reps", type=int, default=6, help="least runs per block (4 blocks each, of about 0.25 s)"
    )
    parser.add_argument("--only", default="", help="comma-separated kernel names")
    parser.add_argument("--no-sweep", action="store_true", help="leave out the matmul sweep")
    parser.add_argument("--loaded", action="store_true", help="a busy process runs beside")
    parser.add_argument(
        "--generic", action="store_true", help="also time each def's size-generic kernel"
    )
    parser.add_argument("--tag", default="", help="added to the results file's name")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, timed once: does it still run?"
    )
    parser.add_argument("--users", action="store_true", help="bench/users.py's kernels")
    parser.add_argument(
        "--convs", action="store_true", help="convolutions at a ResNet's layer shapes"
    )
    parser.add_argument(
        "--interleaved", action="store_true", help="also each call right after NumPy's"
    )
    args = parser.parse_args(argv)
    blocks = SMOKE_BLOCKS if args.smoke else Blocks(least=args.reps)
    wanted = set(filter(None, args.only.split(",")))
    os.environ["TCPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcpy-bench-")
    torch = _torch()
    busy = None
    if args.loaded:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        limits = _limits(args.smoke)
        print(json.dumps(limits), flush=True)
        suite = tuple(map(smoke_sized, SUITE)) if args.smoke else SUITE
        sweep = matmul_sweep(SMOKE_SWEEP) if args.smoke else matmul_sweep()
        kernels = suite if args.no_sweep else (*suite, *sweep)
        if args.users:
            kernels = tuple(map(smoke_user, USERS)) if args.smoke else USERS
        if args.convs:
            kernels = conv_sweep(smoke=args.smoke)
        rows = []
        for kernel in kernels:
            if wanted and kernel.name not in wanted:
                continue
            row = measure(kernel, blocks, torch, limits, generic=args.generic)
            if args.interleaved:
                row["interleaved"] = interleaved(kernel, blocks, row, torch)
                print(_interleaved_line(row), flush=True)
            rows.append(row)
            print(_line(row), flush=True)
    finally:
        if busy is not None:
            busy.kill()
    summary = {
        "geomean_vs_numpy": _geomean([r["ratio_vs_numpy"] for r in rows]),
        "geomean_vs_torch": _geomean([r["ratio_vs_torch"] for r in rows]),
        "geomean_vs_best": _geomean([r["ratio_vs_best"] for r in rows]),
        "geomean_vs_best_memory_bound": _geomean(
            [r["ratio_vs_best"] for r in rows if r["memory_bound"]]
        ),
        **(
            {"geomean_generic_over_fixed": _geomean([r["generic_over_fixed"] for r in rows])}
            if args.generic
            else {}
        ),
        **(_interleaved_summary(rows) if args.interleaved else {}),
        "worst_vs_best": min((r["ratio_vs_best"] for r in rows), default=None),
    }
    print(json.dumps(summary))
    modes = (
        ("users", args.users),
        ("loaded", args.loaded),
        ("generic", args.generic),
        ("interleaved", args.interleaved),
    )
    named = args.tag or "-".join(mode for mode, on in modes[1:] if on)
    for kind, on in (("users", args.users), ("convs", args.convs)):
        if on and not named.startswith(kind):  # apart from the suite's of that tag
            named = "-".join(filter(None, (kind, named)))
    tag = smoke_tag(named, args.smoke)
    result = {
        "date": datetime.date.today().isoformat(),
        "target": "cpu",
        "smoke": args.smoke,
        "loaded": args.loaded,
        "machine": {
            "processor": _cpu_name(),
            "cores": os.cpu_count(),
            "compiler_vector_bytes": runtime.vector_bytes(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": getattr(torch, "__version__", None),
            **limits,
        },
        "options": tcpy.MappingOptions.cpu().to_dict(),
        "runs": {
            "rounds": blocks.rounds,
            "least_per_block": blocks.least,
            "block_s": blocks.block_s,
            "pause_s": blocks.pause_s,
        },
        "kernels": rows,
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cpu-{result['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


def _limits(smoke: bool) -> dict[str, float]:
    """The machine's FMA peak and copy bandwidth; under `--smoke` briefly (16-byte
    vectors, 1% of the FMAs, a 4 MB copy), which is enough to show they still run."""
    peak = fma_peak_gflops(20_000, (16,)) if smoke else fma_peak_gflops()
    bandwidth = copy_bandwidth_gbps(4) if smoke else copy_bandwidth_gbps()
    return {"fma_peak_gflops": round(peak, 1), "copy_bandwidth_gbps": round(bandwidth, 1)}


def _line(row: dict) -> str:  # type: ignore[type-arg]
    torch = f"{row['torch_ms']:9.3f}" if "torch_ms" in row else "        -"
    return (
        f"{row['kernel']:18} tcpy {row['tcpy_ms']:9.3f} ms (kernel {row['tcpy_kernel_ms']:9.3f})"
        f"  numpy {row['numpy_ms']:9.3f}  torch {torch}  best/tcpy {row['ratio_vs_best']:6.2f}"
        f"  {row['tcpy_gflops']:7.1f} GFLOP/s ({row['fraction_of_fma_peak']:.0%} of peak)"
        f"  {row['tcpy_gbps']:6.1f} GB/s ({row['fraction_of_copy_bandwidth']:.0%} of copy)"
        f"  compile {row['compile_s']:.2f} s" + _generic_line(row)
    )


def _interleaved_line(row: dict) -> str:  # type: ignore[type-arg]
    i = row["interleaved"]
    return (
        f"{row['kernel']:18} interleaved: tcpy {i['tcpy_after_numpy_ms']['chosen']:8.3f} ms"
        f" (x{i['tcpy_over_quiet']:.2f} quiet, x{i['tcpy_over_best_count']:.2f} best count)"
        f"  numpy {i['numpy_after_tcpy_ms']:8.3f} ms (x{i['numpy_over_quiet']:.2f} quiet);"
        f" one at a time: tcpy x{i['tcpy_sporadic_over_quiet']:.2f},"
        f" numpy x{i['numpy_sporadic_over_quiet']:.2f} quiet"
        + (
            f"; with PyTorch: tcpy x{i['tcpy_over_quiet_beside_torch']:.2f},"
            f" torch x{i['torch_over_quiet']:.2f} quiet"
            if "torch_over_quiet" in i
            else ""
        )
    )


def _generic_line(row: dict) -> str:  # type: ignore[type-arg]
    if "generic_over_fixed" not in row:
        return ""
    new = row["compiles_for_a_new_shape"]
    return f"  generic/fixed {row['generic_over_fixed']:.2f} (a new shape: {new} compiles)"


def _geomean(values: list[object]) -> float | None:
    """The geometric mean of the numbers among `values`; a ratio rounded to 0 (a
    kernel over 2000x slower than its peer, as a single timed run on a busy machine
    can be under --smoke) counts as 0.0005, its rounding's middle."""
    nums = [max(float(v), 0.0005) for v in values if isinstance(v, int | float)]
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
