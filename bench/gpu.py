"""GPU benchmark: the suite on the `cuda` target against PyTorch eager (TF32 off) and
`torch.compile`, in the same run, on the same GPU.

    python bench/gpu.py [--reps 50] [--only matmul,softmax] [--out bench/results]
                        [--suite-sizes] [--no-torch-compile] [--type bfloat16]
                        [--variant '{"copy_stages": 1}'] [--tag NAME]
                        [--input-precision tf32] [--smoke]
    python bench/gpu.py --emulate    # no GPU: the emulator's traffic profile instead

The kernels run at `bench.suite.GPU_SIZES` (matmul 4096 cubed, row-wise kernels of
128 MB), sizes that fill the GPU; `--suite-sizes` takes the CPU suite's instead.

For each kernel and each option set (the `naive` preset and the CUDA default): the
time of a launch (inputs already on the device, CUDA events around the call), GFLOP/s
and GB/s from the suite's counts, and the ratios to PyTorch eager and torch.compile.
Errors: `max_rel_error` against PyTorch's output (each element's difference over 1 plus
its magnitude), and `error_vs_float64` (PyTorch's and each contender's) against
PyTorch's result on the inputs widened to float64, relative to its largest magnitude:
the measure of the tensor-core targets (tf32x3 within twice the CUDA cores' error).
Also recorded: the GPU's name and a measured device-to-device copy bandwidth. Results
go to `bench/results/gpu-<date>.json`. Made to run in one call on a lent GPU.

`--type bfloat16` (or float16) runs the defs and tensors in that type: contractions
then run on the tensor cores (`mma.sync`), as PyTorch's do. `--input-precision tf32`
(or tf32x3) sets that option on the CUDA defaults; with tf32, PyTorch's matmuls and
convolutions may use TF32 too (`allow_tf32`), as they may not otherwise.

`--smoke` checks that the benchmark still runs: the kernels at `bench.suite.smoke_sized`
sizes, each timed and profiled once, a brief copy bandwidth; its file is tagged
`smoke` (with `--emulate`, the emulator's profile at those sizes).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.suite import SUITE, Kernel, at_gpu_size, smoke_sized, smoke_tag, torch_peer
from tcpy.parser.parse import retyped
from tcpy.types import ScalarType

# at most this long is spent timing one function (at least 3 repetitions)
TIMING_BUDGET_MS = 1000.0


def _torch(tf32: bool = False):  # type: ignore[no-untyped-def]
    import torch

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return torch


def gpu_torch(tf32: bool = False):  # type: ignore[no-untyped-def]
    """PyTorch, with TF32 off (on with `tf32`), where it sees a CUDA device (tcpy's
    kernels then cached in a fresh folder unless TCPY_CACHE_DIR names one); else None,
    said on stderr."""
    torch = _torch(tf32)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return None
    os.environ.setdefault("TCPY_CACHE_DIR", tempfile.mkdtemp(prefix="tcpy-bench-"))
    return torch


def _time(torch, fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds of `fn` on the GPU, by CUDA events: `reps` repetitions, fewer
    (at least 3, or `reps` if fewer) where they would take longer than TIMING_BUDGET_MS."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once_ms = (time.perf_counter() - start) * 1e3
    reps = max(min(3, reps), min(reps, int(TIMING_BUDGET_MS / max(once_ms, 1e-3))))
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(  # type: ignore[no-untyped-def]
    torch, megabytes: int = 256, reps: int = 20
) -> float:
    """GB/s of a device-to-device copy of `megabytes` (bytes read plus bytes written)."""
    x = torch.empty(megabytes * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = _time(torch, lambda: y.copy_(x), reps)
    return 2 * x.numel() / (ms * 1e-3) / 1e9


def _device_ms(torch, fn, reps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Milliseconds of GPU work per call of `fn`, and kernels per call: what PyTorch's
    profiler (CUPTI) saw run on the device (kernels, copies, fills), summed over the
    calls, whichever API launched it. The call's host time is left out."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        events = [e for e in prof.events() if e.device_type.name == "CUDA"]
        total_us = sum(e.device_time_total for e in events)
        kernels = sum(1 for e in events if not e.name.lower().startswith(("memcpy", "memset")))
    except Exception as e:  # a profiler that cannot run here: no device times
        print(f"the profiler failed: {e!r}", file=sys.stderr)
        return math.nan, math.nan
    if not events:
        print("the profiler saw no device work", file=sys.stderr)
        return math.nan, math.nan
    return total_us / reps / 1e3, kernels / reps


def _profiled_reps(ms: float) -> int:
    """Calls to profile: about 300 ms of them, between 3 and 50."""
    return max(3, min(50, int(300 / max(ms, 1e-3))))


def measure(torch, kernel: Kernel, reps: int, torch_compile: bool,  # type: ignore[no-untyped-def]
            ty: ScalarType = ScalarType.FLOAT32,
            variant: dict[str, object] | None = None,
            precision: str = "ieee", smoke: bool = False) -> dict[str, object]:  # fmt: skip
    """One kernel: PyTorch eager (and torch.compile), then tcpy with the naive preset
    and with the CUDA target's default options for the def (what a call uses), and
    with `variant` (fields changed on those defaults) when given. Each is
    timed twice: the call as a user sees it (CUDA events around it: the host's work
    included) and its device work alone (`_device_ms`). `ty`: the float type of the
    def (retyped) and of the tensors; the bytes scale with its size."""
    rng = np.random.default_rng(0)
    host = kernel.inputs(rng, kernel.sizes)
    device = [torch.as_tensor(x, device="cuda") for x in host]
    half = getattr(torch, ty.dtype.name)
    device = [d.to(half) if d.is_floating_point() else d for d in device]
    scale = ty.dtype.itemsize / 4  # the suite's bytes are float32's
    peer = torch_peer(torch, kernel)
    eager_ms = _time(torch, lambda: peer(*device), reps)
    profiled = (lambda ms: 1) if smoke else _profiled_reps
    eager_device_ms, eager_kernels = _device_ms(torch, lambda: peer(*device), profiled(eager_ms))
    compiled_ms, compiled_error = None, "not asked for (--no-torch-compile)"
    if torch_compile:
        try:
            compiled_peer = torch.compile(peer)
            compiled_ms = _time(torch, lambda: compiled_peer(*device), reps)
        except Exception as e:  # torch.compile may be unavailable on the machine
            compiled_error = str(e).splitlines()[0]
        else:
            compiled_error = None
    row: dict[str, object] = {
        "kernel": kernel.name,
        "sizes": kernel.sizes,
        "flops": kernel.flops(kernel.sizes),
        "type": ty.value,
        "min_bytes": kernel.bytes(kernel.sizes) * scale,
        "torch_eager_ms": round(eager_ms, 4),
        "torch_eager_device_ms": round(eager_device_ms, 4),
        "torch_eager_kernels": eager_kernels,
        "torch_compile_ms": round(compiled_ms, 4) if compiled_ms else None,
        "torch_compile_error": compiled_error,
    }
    exact = _in_float64(torch, peer, device)
    row["torch_eager_error_vs_float64"] = _error_vs(torch, peer(*device), exact)
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(retyped(kernel.tc, ty))
    defaults = engine.default_options(kernel.entry).replace(input_precision=precision)
    presets = {"naive": tcpy.MappingOptions.naive(), "cuda": defaults}
    if variant:
        presets["variant"] = presets["cuda"].replace(**variant)
    for label, options in presets.items():
        try:
            start = time.perf_counter()
            compiled = engine.compile(kernel.entry, *device, options=options)
            result = compiled(*device)
            compile_s = time.perf_counter() - start
            outputs = result if isinstance(result, tuple) else (result,)
            want = peer(*device)
            want = want if isinstance(want, tuple) else (want,)
            error = max(
                float(torch.max(torch.abs(torch.as_tensor(g, device="cuda").double()
                                          - w.double()) / (1 + torch.abs(w.double()))))
                for g, w in zip(outputs, want, strict=True)
            )  # fmt: skip
            ms = _time(torch, lambda: compiled(*device), reps)  # noqa: B023
            device_ms, kernels = _device_ms(
                torch,
                lambda: compiled(*device),  # noqa: B023
                profiled(ms),
            )
        except tcpy.TCError as e:
            row[label] = {"error": str(e).splitlines()[0]}
            continue
        row[label] = {
            "ms": round(ms, 4),
            "device_ms": round(device_ms, 4),
            "kernels": kernels,
            "gflops": round(kernel.flops(kernel.sizes) / (device_ms * 1e-3) / 1e9, 2),
            "gbps": round(kernel.bytes(kernel.sizes) * scale / (device_ms * 1e-3) / 1e9, 2),
            "vs_torch_eager": round(eager_ms / ms, 3),
            "device_vs_torch_eager": round(eager_device_ms / device_ms, 3),
            "vs_torch_compile": round(compiled_ms / ms, 3) if compiled_ms else None,
            "compile_s": round(compile_s, 3),
            "max_rel_error": error,
            "error_vs_float64": _error_vs(torch, result, exact),
            "options": options.to_dict(),
        }
    return row


def _in_float64(torch, peer: Callable[..., object], inputs: list[Any]) -> tuple[Any, ...] | None:  # type: ignore[no-untyped-def]
    """PyTorch's result on `inputs` widened to float64 (None where the peer cannot run
    in float64): what every contender's error is measured against."""
    try:
        wide = peer(*[x.double() if x.is_floating_point() else x for x in inputs])
    except RuntimeError:
        return None
    return wide if isinstance(wide, tuple) else (wide,)


def _error_vs(torch, result: object, exact: tuple[Any, ...] | None) -> float | None:  # type: ignore[no-untyped-def]
    """The largest error of `result`'s outputs against `exact`, relative to the largest
    magnitude of the exact output (the tensor-core tests' measure)."""
    if exact is None:
        return None
    got = result if isinstance(result, tuple) else (result,)
    return max(
        float(torch.max(torch.abs(torch.as_tensor(g, device="cuda").double() - w))
              / torch.max(torch.abs(w)).clamp_min(1e-300))
        for g, w in zip(got, exact, strict=True)
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--suite-sizes",
        action="store_true",
        help="the CPU suite's sizes instead of bench.suite.GPU_SIZES",
    )
    parser.add_argument(
        "--type", default="float", help="the defs' and tensors' float type (float16, bfloat16)"
    )
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="time PyTorch eager alone (torch.compile's first call of "
                        "each kernel takes seconds)")  # fmt: skip
    parser.add_argument("--variant", default="",
                        help="a JSON object of fields changed on the CUDA defaults, timed "
                        "beside them (as 'variant')")  # fmt: skip
    parser.add_argument("--tag", default="", help="a suffix of the result's file name")
    parser.add_argument("--input-precision", default="ieee", choices=("ieee", "tf32", "tf32x3"),
                        help="the CUDA defaults' input_precision; tf32 also lets PyTorch "
                        "use TF32")  # fmt: skip
    parser.add_argument("--emulate", action="store_true",
                        help="no GPU needed: the emulator's traffic profile of every kernel "
                        "at the suite's reduced sizes (bench/emu_profile.py)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, each timed once: does it still run? (overrides "
                        "--reps and --suite-sizes)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.emulate:
        from bench import emu_profile

        only = ["--only", args.only] if args.only else []
        smoke = ["--smoke"] if args.smoke else []
        return emu_profile.main([*only, "--out", str(args.out), *smoke])
    torch = gpu_torch(tf32=args.input_precision == "tf32")
    if torch is None:
        return 1
    wanted = set(filter(None, args.only.split(",")))
    reps = 1 if args.smoke else args.reps
    bandwidth = copy_bandwidth(torch, 4, reps) if args.smoke else copy_bandwidth(torch)
    print(f"{torch.cuda.get_device_name(0)}: copy {bandwidth:.0f} GB/s", flush=True)
    rows: list[dict[str, object]] = []
    for kernel in SUITE:
        if wanted and kernel.name not in wanted:
            continue
        if args.smoke:
            sized = smoke_sized(kernel)
        else:
            sized = kernel if args.suite_sizes else at_gpu_size(kernel)
        ty = ScalarType.from_name(args.type)
        variant = json.loads(args.variant) if args.variant else None
        row = measure(
            torch, sized, reps, not args.no_torch_compile, ty, variant, args.input_precision,
            args.smoke,
        )  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(args, torch, rows, bandwidth)
    return 0


def _write(
    args: argparse.Namespace, torch, rows: list[dict[str, object]], bandwidth: float
) -> None:  # type: ignore[no-untyped-def]
    """The results so far, as JSON (rewritten after each kernel: a run cut short keeps
    what it measured)."""
    result = {
        "date": datetime.date.today().isoformat(),
        "target": "cuda",
        "smoke": args.smoke,
        "gpu": torch.cuda.get_device_name(0),
        "copy_bandwidth_gbps": round(bandwidth, 1),
        "torch": torch.__version__,
        "tf32": args.input_precision == "tf32",
        "input_precision": args.input_precision,
        "reps": 1 if args.smoke else args.reps,
        "sizes": "smoke" if args.smoke else "suite" if args.suite_sizes else "gpu",
        "kernels": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    typed = "" if args.type in ("float", "float32") else f"-{args.type}"
    typed += "" if args.input_precision == "ieee" else f"-{args.input_precision}"
    tag = smoke_tag(args.tag, args.smoke)
    path = args.out / f"gpu-{result['date']}{typed}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
