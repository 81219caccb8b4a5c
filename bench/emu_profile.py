"""The GPU benchmark suite at reduced sizes (`bench.suite.REDUCED_SIZES`) on the CUDA
emulator: each kernel's launches and memory traffic, checked against NumPy.

    python bench/emu_profile.py [--only matmul,softmax] [--options naive|JSON] [--device h100]
                                [--type bfloat16] [--tag after] [--out bench/results] [--smoke]

For each kernel: the launch shapes, the bytes the lanes request, the bytes the sectors
they touch move (`moved`: every warp request's sectors, nothing cached) and the bytes
that reach DRAM behind the device's L2 (`dram`: each launch's distinct sectors loaded
plus stored, where they fit the L2; `tcpy.runtime.profile`), the memory efficiency,
sectors per request, shared-memory bytes and bank conflicts, barriers, shuffles and
atomics, against the fewest bytes the def must move: both totals as multiples of it.

Then, mapped at the suite's GPU sizes (`bench.suite.GPU_SIZES`) for the device profile
(nothing runs), each launch's grid and whether it holds at least `FILL_WAVES` (two)
blocks per SM. The rule is judged on the launches that move at least
`JUDGED_SHARE` (10%) of the def's DRAM bytes at the reduced sizes: a launch that
zeroes a small output before a split reduction is exempt (shown as such). This is
the GPU-free measure of the generated CUDA; no time is taken. `--type` retypes the
kernels' floats (`tcpy.parser.parse.retyped`: float16 or bfloat16, the inputs rounded
to it), whose bytes then count at their own size. Results go to
`bench/results/emu-profile-<date>[-<tag>].json`. `--smoke` checks that the profile
still runs, at `bench.suite.smoke_sized` sizes (the reduced ones today); its file is
tagged `smoke`.
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
from bench.suite import GPU_SIZES, SUITE, Kernel, reduced, smoke_sized, smoke_tag
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.gpu.device import DeviceProfile, default_profile, named
from tcpy.mapping.gpu.sizes import FILL_WAVES
from tcpy.parser.parse import retyped
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import profile
from tcpy.types import ScalarType

JUDGED_SHARE = 0.1
"""The share of a def's DRAM bytes from which a launch must fill the device."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated kernel names")
    parser.add_argument(
        "--options", default=None,
        help="a preset name, or a JSON object of fields changed on the CUDA defaults",
    )  # fmt: skip
    parser.add_argument("--device", default=None, help="a device profile (default: h100)")
    parser.add_argument("--type", default="float", help="the kernels' float type")
    parser.add_argument("--tag", default="", help="a suffix of the result's file name")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--smoke", action="store_true", help="small sizes: does it still run?")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    sized = smoke_sized if args.smoke else reduced
    changes = json.loads(args.options) if (args.options or "").startswith("{") else None
    options = (
        None
        if args.options is None or changes is not None
        else tcpy.MappingOptions.preset(args.options)
    )
    ty = ScalarType.from_name(args.type)
    rng = np.random.default_rng(0)
    engine = tcpy.ExecutionEngine("cuda-emu", device=args.device)
    device = named(args.device) if args.device else default_profile()
    results = []
    for full in SUITE:
        if only and full.name not in only:
            continue
        kernel = sized(full)
        engine.define(retyped(kernel.tc, ty))
        inputs = tuple(
            x.astype(ty.dtype) if x.dtype.kind == "f" else x
            for x in kernel.inputs(rng, kernel.sizes)
        )
        compiled = engine.compile(kernel.entry, *inputs, options=options or changes)
        got = compiled(*inputs)
        want = kernel.numpy(*(x.astype(np.float64) if x.dtype != np.int32 else x for x in inputs))
        outputs = got if isinstance(got, tuple) else (got,)
        wanted = want if isinstance(want, tuple) else (want,)
        close = 2e-3 if ty is ScalarType.FLOAT32 else 4 * 2.0**-8  # a few bfloat16 ulps
        if (changes or {}).get("input_precision") == "tf32":
            close = 2e-2  # operands rounded to 10-bit mantissas
        for g, w in zip(outputs, wanted, strict=True):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=close, atol=close)
        launches = compiled.profile(*inputs)
        minimum = profile.minimum_bytes(inputs, outputs)
        shown = ", ".join(f"{k}={v}" for k, v in kernel.sizes.items())
        print(f"\n{kernel.name} ({shown})")
        print(profile.table(launches, minimum, device.l2_bytes))
        for launch in launches:
            launch["dram_bytes"] = profile.dram_bytes(launch, device.l2_bytes)
        moved = sum(profile.moved_bytes(launch) for launch in launches)
        dram = sum(launch["dram_bytes"] for launch in launches)
        sizes = GPU_SIZES[full.name]
        grids = _gpu_size_grids(engine, full, sizes, options, changes, device, launches)
        shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
        print(f"at GPU sizes ({shown}), {FILL_WAVES * device.sms} blocks for two per SM: "
              + ", ".join(_shown(g) for g in grids))  # fmt: skip
        results.append(
            {"kernel": kernel.name, "sizes": kernel.sizes, "minimum_bytes": minimum,
             "moved_bytes": moved, "dram_bytes": dram, "moved_x": round(moved / minimum, 3),
             "dram_x": round(dram / minimum, 3), "launches": launches,
             "gpu_sizes": sizes, "gpu_size_grids": grids,
             "fills": all(g["fills"] for g in grids if g["judged"])}
        )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag(args.tag, args.smoke)
    date = datetime.date.today().isoformat()
    path = args.out / f"emu-profile-{date}{'-' + tag if tag else ''}.json"
    record = {"smoke": args.smoke, "options": args.options or "cuda default", "type": ty.value,
              "device": device.key(), "l2_bytes": device.l2_bytes,
              "fill_blocks": FILL_WAVES * device.sms, "judged_share": JUDGED_SHARE,
              "kernels": results}  # fmt: skip
    path.write_text(json.dumps(record, indent=1))
    print(f"\nwritten: {path}")
    return 0


def _gpu_size_grids(
    engine: tcpy.ExecutionEngine, kernel: Kernel, sizes: dict[str, int],
    options: tcpy.MappingOptions | None, changes: dict[str, Any] | None, device: DeviceProfile,
    reduced: list[dict[str, Any]],
) -> list[dict[str, Any]]:  # fmt: skip
    """Each launch of `kernel` mapped at `sizes` for `device`: its blocks, whether they
    are `FILL_WAVES` per SM, and whether the rule is judged on it: where it moves at
    least `JUDGED_SHARE` of the DRAM bytes of the `reduced` profile's launches (every
    launch where the two mappings launch differently)."""
    cdef = engine.checked(kernel.entry)
    chosen = options or cuda_defaults(cdef).replace(**(changes or {}))
    lowered = lower_to_cuda(cdef, sizes, chosen, device=device)
    total = sum(launch["dram_bytes"] for launch in reduced)
    same = len(reduced) == len(lowered.mapping.kernels)
    grids = []
    for k, mapped in enumerate(lowered.mapping.kernels):
        judged = not same or not total or reduced[k]["dram_bytes"] >= JUDGED_SHARE * total
        fills = mapped.blocks >= FILL_WAVES * device.sms
        grids.append({"blocks": mapped.blocks, "fills": fills, "judged": judged})
    return grids


def _shown(grid: dict[str, Any]) -> str:
    verdict = "ok" if grid["fills"] else "FEWER" if grid["judged"] else "exempt, < 10% of bytes"
    return f"{grid['blocks']} blocks ({verdict})"


if __name__ == "__main__":
    raise SystemExit(main())
