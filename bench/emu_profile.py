"""The GPU benchmark suite at reduced sizes (`bench.suite.REDUCED_SIZES`) on the CUDA
emulator: each kernel's launches and memory traffic, checked against NumPy.

    python bench/emu_profile.py [--only matmul,softmax] [--options naive] [--device h100]
                                [--tag after] [--out bench/results]

For each kernel: the launch shapes, the bytes the lanes request and the bytes the
sectors they touch move, the memory efficiency, sectors per request, shared-memory
bytes and bank conflicts, barriers, shuffles and atomics, against the fewest bytes the
def must move. Then, mapped at the suite's full sizes for the device profile (nothing
runs), each kernel's grid: how many blocks it launches against two waves of the
device's SMs. This is the GPU-free measure of the generated CUDA; no time is taken.
Results go to `bench/results/emu-profile-<date>[-<tag>].json`.
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
from bench.suite import SUITE, Kernel, reduced
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.gpu.device import DeviceProfile, default_profile, named
from tcpy.mapping.gpu.sizes import FILL_WAVES
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated kernel names")
    parser.add_argument("--options", default=None, help="a preset name (default: cuda's)")
    parser.add_argument("--device", default=None, help="a device profile (default: h100)")
    parser.add_argument("--tag", default="", help="a suffix of the result's file name")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    options = None if args.options is None else tcpy.MappingOptions.preset(args.options)
    rng = np.random.default_rng(0)
    engine = tcpy.ExecutionEngine("cuda-emu", device=args.device)
    device = named(args.device) if args.device else default_profile()
    results = []
    for full in SUITE:
        if only and full.name not in only:
            continue
        kernel = reduced(full)
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
        grids = _full_size_grids(engine, full, options, device)
        shown = ", ".join(f"{k}={v}" for k, v in full.sizes.items())
        print(f"at full size ({shown}): " + ", ".join(f"{g} blocks" for g in grids))
        results.append(
            {"kernel": kernel.name, "sizes": kernel.sizes, "minimum_bytes": minimum,
             "moved_bytes": moved, "launches": launches,
             "full_sizes": full.sizes, "full_size_blocks": grids}
        )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"-{args.tag}" if args.tag else ""
    path = args.out / f"emu-profile-{datetime.date.today().isoformat()}{tag}.json"
    record = {"options": args.options or "cuda default", "device": device.key(),
              "fill_blocks": FILL_WAVES * device.sms, "kernels": results}  # fmt: skip
    path.write_text(json.dumps(record, indent=1))
    print(f"\nwritten: {path}")
    return 0


def _full_size_grids(
    engine: tcpy.ExecutionEngine, kernel: Kernel, options: tcpy.MappingOptions | None,
    device: DeviceProfile,
) -> list[int]:  # fmt: skip
    """The blocks of each launch of `kernel` mapped at its full sizes for `device`."""
    cdef = engine.checked(kernel.entry)
    chosen = options or cuda_defaults(cdef)
    lowered = lower_to_cuda(cdef, kernel.sizes, chosen, device=device)
    return [k.blocks for k in lowered.mapping.kernels]


if __name__ == "__main__":
    raise SystemExit(main())
