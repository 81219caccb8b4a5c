"""Option variants of suite kernels on a GPU, at `bench.suite.GPU_SIZES`: the device
time of each beside the CUDA target's default options and PyTorch eager, in one run,
each checked against PyTorch. What the defaults of `tcpy.mapping.gpu` are chosen by.

    python bench/gpu_variants.py [--only matmul,gelu] [--out bench/results] [--smoke]

A variant is a `MappingOptions.replace` of the def's default options (`{}` is the
default itself). Device times come from PyTorch's profiler (`bench.gpu._device_ms`).
Results go to `bench/results/gpu-variants-<date>.json`. `--smoke` checks that the
benchmark still runs: the kernels at `bench.suite.smoke_sized` sizes, each timed and
profiled once; its file is tagged `smoke`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.gpu import _device_ms, _profiled_reps, _time, gpu_torch
from bench.suite import SUITE, at_gpu_size, smoke_sized, smoke_tag, torch_peer

VARIANTS: dict[str, list[dict[str, Any]]] = {
    # the thread's register tile under shared-memory tiles (the default: 8x4)
    "matmul": [{}, {"register_tile": (8, 2)}, {"register_tile": (8, 8)}, {"register_tile": (4, 4)}],
    "mlp": [{}, {"register_tile": (8, 2)}],
    # one element per thread (tiles the size of the 32x8 block) against the default's 4
    "gelu": [{}, {"tile": (8, 32), "map_to_threads": (32, 8)}],
    # the reduction split across blocks, or each column summed by one thread
    "bias_add_grad": [{}, {"split_reductions": False}],
    # the row copied into shared memory with float4 loads, or element by element
    "softmax": [{}, {"vectorize": False}],
}


def measure(
    torch: Any, name: str, variants: list[dict[str, Any]], smoke: bool = False
) -> list[dict[str, Any]]:
    """Each of `variants` of kernel `name`, beside PyTorch eager; `smoke`: at the smoke
    sizes, each timed and profiled once."""
    sized = smoke_sized if smoke else at_gpu_size
    reps = 1 if smoke else 20
    (kernel,) = [sized(k) for k in SUITE if k.name == name]
    host = kernel.inputs(np.random.default_rng(0), kernel.sizes)
    device = [torch.as_tensor(x, device="cuda") for x in host]
    peer = torch_peer(torch, kernel)
    want = peer(*device)
    want = want if isinstance(want, tuple) else (want,)
    eager_ms = _device_ms(torch, lambda: peer(*device), reps)[0]
    rows = []
    for changes in variants:
        engine = tcpy.ExecutionEngine("cuda")
        engine.define(kernel.tc)
        options = engine.default_options(kernel.entry).replace(**changes)
        row: dict[str, Any] = {"kernel": name, "changes": changes, "eager_device_ms": eager_ms}
        try:
            compiled = engine.compile(kernel.entry, *device, options=options)
            got = compiled(*device)
            got = got if isinstance(got, tuple) else (got,)
            row["max_rel_error"] = max(
                float(torch.max(torch.abs(g - w) / (1 + torch.abs(w))))
                for g, w in zip(got, want, strict=True)
            )
            ms = _time(torch, lambda: compiled(*device), reps)  # noqa: B023
            row["device_ms"], row["kernels"] = _device_ms(
                torch,
                lambda: compiled(*device),  # noqa: B023
                1 if smoke else _profiled_reps(ms),
            )
        except tcpy.TCError as e:
            row["error"] = str(e).splitlines()[0]
        else:
            row["launches"] = [list(map(list, launch)) for launch in compiled._kernel.launches]
            row["vs_eager"] = round(eager_ms / row["device_ms"], 3)
            row["gflops"] = round(kernel.flops(kernel.sizes) / row["device_ms"] / 1e6, 1)
            row["gbps"] = round(kernel.bytes(kernel.sizes) / row["device_ms"] / 1e6, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, timed once")
    args = parser.parse_args(argv)
    torch = gpu_torch()
    if torch is None:
        return 1
    wanted = set(filter(None, args.only.split(",")))
    rows = []
    for name, variants in VARIANTS.items():
        if not wanted or name in wanted:
            rows += measure(torch, name, variants, args.smoke)
    result = {
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "tf32": False,
        "variants": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag("", args.smoke)
    path = args.out / f"gpu-variants-{result['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
