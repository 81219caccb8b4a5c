"""The instructions and resources of the suite's contractions on the GPU, without one:
each kernel lowered for the H100 profile at `bench.suite.GPU_SIZES` with its CUDA
defaults, its PTX (NVRTC, compute_90) counted, and ptxas's report for sm_90 read
(registers, spills, shared memory).

    python bench/ptx_stats.py [--only matmul,conv2d] [--out bench/results] [--tag NAME]
                              [--options '{"copy_stages": 1}'] [--type bfloat16] [--smoke]

Per kernel of each def: `cp.async` copies (`cp_async`, of which 16-byte `cp_async_16`),
commit groups and waits, `ld.shared`, `st.shared` and `ld.global` instructions (vectors
counted once; `ld_shared_vector`: the shared loads of 2 or 4 values), `fma.rn.f32`
(`fma`: the CUDA cores' multiply-adds, against which the shared loads count),
barriers (`bar.sync`), `mma` and `ldmatrix` instructions, and ptxas's registers,
spill stores and loads and static shared bytes; `matrix`, whether the kernel runs on
the tensor cores. `--type` retypes the defs (float16, bfloat16: their
contractions on `mma.sync`). Counts are of the
instructions in the PTX text, not of those executed. Results go to
`bench/results/ptx-stats-<date>[-<tag>].json`. `--smoke` checks that the count still
runs, on the kernels lowered at `bench.suite.smoke_sized` sizes; its file is tagged
`smoke`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.suite import SUITE, Kernel, at_gpu_size, smoke_sized, smoke_tag
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.gpu.device import named
from tcpy.parser import check_source
from tcpy.parser.parse import retyped
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import nvrtc
from tcpy.types import ScalarType

CONTRACTIONS = (
    "matmul", "matmul_transposed", "batch_matmul", "tensordot", "mlp", "conv2d",
    "conv2d_strided", "group_conv",
)  # fmt: skip

_COUNTED = {
    "cp_async": r"^\s*cp\.async\.c[ag]\.shared\.global",
    "cp_async_16": r"^\s*cp\.async\.c[ag]\.shared\.global[^\n]*, 16;",
    "commit_groups": r"^\s*cp\.async\.commit_group",
    "waits": r"^\s*cp\.async\.wait_group",
    "ld_shared": r"^\s*ld\.shared",
    "ld_shared_vector": r"^\s*ld\.shared\.v[24]",
    "st_shared": r"^\s*st\.shared",
    "ld_global": r"^\s*ld\.global",
    "barriers": r"^\s*bar\.sync|^\s*barrier\.sync",
    "fma": r"^\s*fma\.rn\.f32",
    "mma": r"^\s*mma\.sync",
    "ldmatrix": r"^\s*ldmatrix",
}


def ptx_counts(ptx: str) -> dict[str, dict[str, int]]:
    """The counted instructions of each `.entry` of `ptx`."""
    out = {}
    for name, body in re.findall(r"\.entry\s+(\w+)\((.*?)\n}\n", ptx, re.S):
        out[name] = {key: len(re.findall(p, body, re.M)) for key, p in _COUNTED.items()}
    return out


def resources(report: str) -> dict[str, dict[str, int]]:
    """Registers, spills and shared bytes of each function in ptxas's report."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spills:
            current["spill_stores"], current["spill_loads"] = map(int, spills.groups())
        used = re.search(r"Used (\d+) registers", line)
        if used:
            current["registers"] = int(used.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            current["shared_bytes"] = int(smem.group(1)) if smem else 0
    return out


def stats(
    name: str,
    changes: dict[str, Any],
    ty: ScalarType = ScalarType.FLOAT32,
    sized: Callable[[Kernel], Kernel] = at_gpu_size,
) -> dict[str, Any]:
    """The counts and resources of the kernels of suite kernel `name`, lowered at the
    sizes `sized` gives with `changes` on its CUDA defaults."""
    kernel = sized(next(k for k in SUITE if k.name == name))
    cdef = check_source(retyped(kernel.tc, ty))[kernel.entry]
    options = cuda_defaults(cdef).replace(**changes)
    lowered = lower_to_cuda(cdef, kernel.sizes, options, device=named("h100"))
    counts = ptx_counts(nvrtc.compile_ptx(lowered.source, "compute_90", exact=lowered.exact))
    report = resources(nvrtc.ptxas_report(lowered.source, "sm_90", exact=lowered.exact))
    matrix = {f"tc_kernel_{k.index}": k.matrix for k in lowered.mapping.kernels}
    kernels = {
        k: {**counts[k], **report.get(k, {}), "matrix": matrix.get(k, False)}
        for k in sorted(counts)
    }
    return {
        "kernel": name, "type": ty.value, "sizes": kernel.sizes, "options": options.to_dict(),
        "kernels": kernels,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--tag", default="")
    parser.add_argument("--options", default="{}", help="fields changed on the defaults (JSON)")
    parser.add_argument("--type", default="float", help="the defs' float type")
    parser.add_argument("--smoke", action="store_true", help="small sizes: does it still run?")
    args = parser.parse_args(argv)
    if not nvrtc.available():
        print("no NVRTC: install the cuda extra", file=sys.stderr)
        return 1
    wanted = [n for n in CONTRACTIONS if not args.only or n in args.only.split(",")]
    changes = json.loads(args.options)
    sized = smoke_sized if args.smoke else at_gpu_size
    rows = []
    for name in wanted:
        row = stats(name, changes, ScalarType.from_name(args.type), sized)
        rows.append(row)
        for k, v in row["kernels"].items():
            print(f"{name:18s} {k:12s} " + " ".join(f"{key}={val}" for key, val in v.items()))
    date = datetime.date.today().isoformat()
    result = {"date": date, "smoke": args.smoke, "nvrtc": nvrtc.identity(), "arch": "sm_90",
              "options": changes, "type": args.type, "results": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag(args.tag, args.smoke)
    path = args.out / f"ptx-stats-{date}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
