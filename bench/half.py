"""Half precision on the CPU: the suite's memory-bound kernels in bfloat16 (and float16)
beside float32, against PyTorch's CPU kernels on the same half tensors.

    python bench/half.py [--only softmax,gelu] [--types bfloat16,float16] [--reps 6]
                         [--tag NAME] [--out bench/results] [--smoke]

Each kernel's TC is retyped (`tcpy.parser.parse.retyped`, literals then take the half
type) and run on the float32 inputs rounded to the half type. Per kernel and type it
records tcpy's kernel time (the compiled code on buffers bound once, as
`bench/cpu.py` times it), the float32 kernel's, PyTorch's on the half tensors, the
error against a float64 NumPy computation of the rounded inputs (relative to the
output's largest magnitude), and the ratios the half-precision issue names: half over
float32 speed (target 1.5) and PyTorch's time over tcpy's (target 1.0). JSON goes to
bench/results/half-<date>[-tag].json. `--smoke` checks that the benchmark still runs:
the kernels at `bench.suite.smoke_sized` sizes, each timed once, a brief copy
bandwidth; its file is tagged `smoke`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.cpu import (
    SMOKE_BLOCKS,
    Blocks,
    _cpu_name,
    alternating_blocks,
    copy_bandwidth_gbps,
    kernel_alone,
)
from bench.suite import SUITE, Kernel, smoke_sized, smoke_tag, torch_peer
from tcpy.parser.parse import retyped
from tcpy.types import ScalarType

RESULTS = Path(__file__).resolve().parent / "results"


def _compiled(source: str, entry: str, inputs: tuple[np.ndarray, ...]) -> tcpy.Compiled:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(source)
    return engine.compile(entry, *inputs)


def measure(  # type: ignore[type-arg]
    kernel: Kernel, ty: ScalarType, blocks: Blocks, torch: object
) -> dict:
    rng = np.random.default_rng(0)
    wide = kernel.inputs(rng, kernel.sizes)
    half = tuple(x.astype(ty.dtype) if x.dtype.kind == "f" else x for x in wide)
    rounded = tuple(
        h.astype(np.float32) if w.dtype.kind == "f" else h for w, h in zip(wide, half, strict=True)
    )
    f32 = _compiled(kernel.tc, kernel.entry, wide)
    low = _compiled(retyped(kernel.tc, ty), kernel.entry, half)
    got = np.asarray(low(*half)).astype(np.float64)
    want = np.asarray(
        kernel.numpy(*(r.astype(np.float64) if r.dtype.kind == "f" else r for r in rounded)),
        dtype=np.float64,
    )
    error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    contenders: dict[str, Callable[[], object]] = {
        "tcpy_float32": kernel_alone(f32, wide),
        f"tcpy_{ty.value}": kernel_alone(low, half),
    }
    if torch is not None:
        peer = torch_peer(torch, kernel)
        tensors = [torch.from_numpy(x) for x in wide]  # type: ignore[attr-defined]
        halves = [t.to(getattr(torch, ty.value)) if t.is_floating_point() else t for t in tensors]
        contenders["torch_float32"] = lambda: peer(*tensors)
        contenders[f"torch_{ty.value}"] = lambda: peer(*halves)
    ms = alternating_blocks(contenders, blocks)
    moved = kernel.bytes(kernel.sizes) / 2  # the float32 bytes, halved
    return {
        "kernel": kernel.name,
        "type": ty.value,
        "sizes": kernel.sizes,
        "max_error_of_largest": error,
        **{f"{n}_ms": round(v, 4) for n, v in ms.items()},
        "half_over_float32_speed": round(ms["tcpy_float32"] / ms[f"tcpy_{ty.value}"], 3),
        "torch_over_tcpy": (
            round(ms[f"torch_{ty.value}"] / ms[f"tcpy_{ty.value}"], 3) if torch else None
        ),
        "half_gbps": round(moved / ms[f"tcpy_{ty.value}"] / 1e6, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated kernel names")
    p.add_argument("--types", default="bfloat16,float16")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, timed once: does it run?")
    args = p.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    kernels = [k for k in SUITE if k.memory_bound and (not only or k.name in only)]
    if args.smoke:
        kernels = [smoke_sized(k) for k in kernels]
    blocks = SMOKE_BLOCKS if args.smoke else Blocks(least=args.reps)
    types = [ScalarType.from_name(t) for t in args.types.split(",")]
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None  # type: ignore[assignment]
    rows = []
    for kernel in kernels:
        for ty in types:
            row = measure(kernel, ty, blocks, torch)
            rows.append(row)
            print(
                f"{row['kernel']:>14} {row['type']:>8}  tcpy {row[f'tcpy_{ty.value}_ms']:8.3f} ms"
                f"  (float32 {row['tcpy_float32_ms']:8.3f})  half/f32 speed "
                f"{row['half_over_float32_speed']:5.2f}  torch/tcpy {row['torch_over_tcpy']}"
                f"  error {row['max_error_of_largest']:.2e}",
                flush=True,
            )
    record = {
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "cpu": _cpu_name(),
        "threads": os.cpu_count(),
        "copy_bandwidth_gbps": round(copy_bandwidth_gbps(4 if args.smoke else 256), 2),
        "torch": getattr(torch, "__version__", None),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag(args.tag, args.smoke)
    path = args.out / f"half-{record['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
