"""GPU benchmark: the suite on the `cuda` target against PyTorch eager (TF32 off) and
`torch.compile`, in the same run, on the same GPU.

    python bench/gpu.py [--reps 50] [--only matmul,softmax] [--out bench/results]
    python bench/gpu.py --emulate    # no GPU: the emulator's traffic profile instead

For each kernel and each option set (the `naive` preset and the CUDA default): the
time of a launch (inputs already on the device, CUDA events around the call), GFLOP/s
and GB/s from the suite's counts, and the ratios to PyTorch eager and torch.compile.
Also recorded: the GPU's name and a measured device-to-device copy bandwidth. Results
go to `bench/results/gpu-<date>.json`. Made to run in one call on a lent GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.suite import SUITE, Kernel, torch_peer


def _torch():  # type: ignore[no-untyped-def]
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def _time(torch, fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Median milliseconds of `fn` on the GPU, by CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(torch) -> float:  # type: ignore[no-untyped-def]
    """GB/s of a large device-to-device copy (bytes read plus bytes written)."""
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = _time(torch, lambda: y.copy_(x), 20)
    return 2 * x.numel() / (ms * 1e-3) / 1e9


def measure(torch, kernel: Kernel, reps: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    host = kernel.inputs(rng, kernel.sizes)
    device = [torch.as_tensor(x, device="cuda") for x in host]
    peer = torch_peer(torch, kernel)
    eager_ms = _time(torch, lambda: peer(*device), reps)
    try:
        compiled_peer = torch.compile(peer)
        compiled_ms = _time(torch, lambda: compiled_peer(*device), reps)
    except Exception as e:  # torch.compile may be unavailable on the machine
        compiled_ms, compiled_error = None, str(e).splitlines()[0]
    else:
        compiled_error = None
    row: dict[str, object] = {
        "kernel": kernel.name,
        "sizes": kernel.sizes,
        "torch_eager_ms": round(eager_ms, 4),
        "torch_compile_ms": round(compiled_ms, 4) if compiled_ms else None,
        "torch_compile_error": compiled_error,
    }
    for label, options in (("naive", tcpy.MappingOptions.naive()),
                           ("cuda", tcpy.MappingOptions.cuda())):  # fmt: skip
        engine = tcpy.ExecutionEngine("cuda")
        engine.define(kernel.tc)
        try:
            start = time.perf_counter()
            compiled = engine.compile(kernel.entry, *device, options=options)
            result = compiled(*device)
            compile_s = time.perf_counter() - start
            outputs = result if isinstance(result, tuple) else (result,)
            want = peer(*device)
            want = want if isinstance(want, tuple) else (want,)
            error = max(
                float(torch.max(torch.abs(torch.as_tensor(g, device="cuda") - w)
                                / (1 + torch.abs(w))))
                for g, w in zip(outputs, want, strict=True)
            )  # fmt: skip
            ms = _time(torch, lambda: compiled(*device), reps)  # noqa: B023
        except tcpy.TCError as e:
            row[label] = {"error": str(e).splitlines()[0]}
            continue
        row[label] = {
            "ms": round(ms, 4),
            "gflops": round(kernel.flops(kernel.sizes) / (ms * 1e-3) / 1e9, 2),
            "gbps": round(kernel.bytes(kernel.sizes) / (ms * 1e-3) / 1e9, 2),
            "vs_torch_eager": round(eager_ms / ms, 3),
            "vs_torch_compile": round(compiled_ms / ms, 3) if compiled_ms else None,
            "compile_s": round(compile_s, 3),
            "max_rel_error": error,
            "options": options.to_dict(),
        }
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--emulate", action="store_true",
                        help="no GPU needed: the emulator's traffic profile of every kernel "
                        "at the suite's reduced sizes (bench/emu_profile.py)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.emulate:
        from bench import emu_profile

        only = ["--only", args.only] if args.only else []
        return emu_profile.main([*only, "--out", str(args.out)])
    torch = _torch()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 1
    os.environ.setdefault("TCPY_CACHE_DIR", tempfile.mkdtemp(prefix="tcpy-bench-"))
    wanted = set(filter(None, args.only.split(",")))
    rows = []
    for kernel in SUITE:
        if wanted and kernel.name not in wanted:
            continue
        row = measure(torch, kernel, args.reps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "date": datetime.date.today().isoformat(),
        "target": "cuda",
        "gpu": torch.cuda.get_device_name(0),
        "copy_bandwidth_gbps": round(copy_bandwidth(torch), 1),
        "torch": torch.__version__,
        "tf32": False,
        "reps": args.reps,
        "kernels": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gpu-{result['date']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
