"""The GPU benchmark suite at reduced sizes (`bench.suite.REDUCED_SIZES`) on the CUDA
emulator: each kernel's launches and memory traffic, checked against NumPy.

    python bench/emu_profile.py [--only matmul,softmax] [--options naive] [--out bench/results]

For each kernel: the launch shapes, the bytes the lanes request and the bytes the
sectors they touch move, the memory efficiency, sectors per request, shared-memory
bytes and bank conflicts, barriers, shuffles and atomics, against the fewest bytes the
def must move. This is the GPU-free measure of the generated CUDA; no time is taken.
Results go to `bench/results/emu-profile-<date>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.suite import SUITE, reduced
from tcpy.runtime import profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated kernel names")
    parser.add_argument("--options", default=None, help="a preset name (default: cuda's)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    options = None if args.options is None else tcpy.MappingOptions.preset(args.options)
    rng = np.random.default_rng(0)
    engine = tcpy.ExecutionEngine("cuda-emu")
    results = []
    for kernel in map(reduced, SUITE):
        if only and kernel.name not in only:
            continue
        engine.define(kernel.tc)
        inputs = kernel.inputs(rng, kernel.sizes)
        compiled = engine.compile(kernel.entry, *inputs, options=options)
        got = compiled(*inputs)
        want = kernel.numpy(*inputs)
        outputs = got if isinstance(got, tuple) else (got,)
        wanted = want if isinstance(want, tuple) else (want,)
        for g, w in zip(outputs, wanted, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-3)
        launches = compiled.profile(*inputs)
        minimum = profile.minimum_bytes(inputs, outputs)
        shown = ", ".join(f"{k}={v}" for k, v in kernel.sizes.items())
        print(f"\n{kernel.name} ({shown})")
        print(profile.table(launches, minimum))
        moved = sum(profile.moved_bytes(launch) for launch in launches)
        results.append(
            {"kernel": kernel.name, "sizes": kernel.sizes, "minimum_bytes": minimum,
             "moved_bytes": moved, "launches": launches}
        )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"emu-profile-{datetime.date.today().isoformat()}.json"
    record = {"options": args.options or "cuda default", "kernels": results}
    path.write_text(json.dumps(record, indent=1))
    print(f"\nwritten: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
