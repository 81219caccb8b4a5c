"""Online reductions over tiles of a row (`online_tile`) on the CPU: log-sum-exp,
cross-entropy, softmax and attention heads, with the option off and at several tiles,
beside PyTorch eager.

    python bench/online.py [--only lse,attention] [--reps 6] [--tag NAME]
                           [--out bench/results] [--smoke]

Per def and size it records tcpy's full call (outputs allocated) with `online_tile`
0 (the default: the row's chain in two passes, or fused over blocks of rows) and at
each tile listed, PyTorch's (`logsumexp`, `cross_entropy`, `softmax`,
`scaled_dot_product_attention`), all timed in alternating blocks in one process, the
largest difference of each tiled result from the untiled one (relative to its largest
magnitude), and the memory each variant's first call made resident (its buffers, kept
for the next calls: a score matrix held in memory shows there). JSON goes to
bench/results/online-<date>[-tag].json; `--smoke` runs each def once at a tiny size
(tagged `smoke`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.cpu import SMOKE_BLOCKS, Blocks, _cpu_name, alternating_blocks
from bench.suite import smoke_tag

RESULTS = Path(__file__).resolve().parent / "results"

SOURCES = {
    "lse": """
def lse(float(R,N) X) -> (out) {
    m(r) max=! X(r,j)
    l(r) +=! exp(X(r,j) - m(r))
    out(r) = m(r) + log(l(r))
}""",
    "cross_entropy": """
def cross_entropy(float(B, K) X, int32(B) label) -> (loss) {
    mx(b) max=! X(b, k)
    s(b) +=! exp(X(b, k) - mx(b))
    loss() +=! (log(s(b)) + mx(b) - X(b, label(b))) / B
}""",
    "softmax": """
def softmax(float(N, D) I) -> (O) {
    maxVal(n) max=! I(n, d)
    expSum(n) +=! exp(I(n, d) - maxVal(n))
    O(n, d) = exp(I(n, d) - maxVal(n)) / expSum(n)
}""",
    "attention": """
def attention(float(B,H,S,E) Q, float(B,H,S,E) K, float(B,H,S,E) V) -> (A) {
    Sc(b,h,i,j) +=! Q(b,h,i,e) * K(b,h,j,e)
    Sc(b,h,i,j) = Sc(b,h,i,j) * 0.125
    mx(b,h,i) max=! Sc(b,h,i,j)
    P(b,h,i,j) = exp(Sc(b,h,i,j) - mx(b,h,i))
    sm(b,h,i) +=! P(b,h,i,j)
    A(b,h,i,e) +=! P(b,h,i,j) * V(b,h,j,e)
    A(b,h,i,e) = A(b,h,i,e) / sm(b,h,i)
}""",
}


@dataclass(frozen=True)
class Case:
    name: str  # a key of SOURCES
    shape: tuple[int, ...]  # rows x row for the row defs; heads, sequence for attention
    tiles: tuple[int, ...]


CASES = (
    Case("lse", (256, 131072), (256, 2048)),
    Case("lse", (4096, 1024), (256, 2048)),
    Case("cross_entropy", (256, 131072), (256, 2048)),
    Case("cross_entropy", (512, 50257), (256, 2048)),
    Case("cross_entropy", (4096, 1024), (256, 2048)),
    Case("softmax", (256, 131072), (2048,)),
    Case("softmax", (4096, 1024), (2048,)),
    Case("attention", (12, 384), (64, 128, 384)),
    Case("attention", (1, 8192), (256,)),
)
SMOKE = (
    Case("lse", (5, 37), (4,)),
    Case("cross_entropy", (5, 37), (4,)),
    Case("softmax", (5, 37), (4,)),
    Case("attention", (2, 21), (8,)),
)


def inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    if case.name == "attention":
        heads, seq = case.shape
        return tuple(rng.standard_normal((1, heads, seq, 64)).astype(np.float32) for _ in range(3))
    x = (rng.standard_normal(case.shape) * 3).astype(np.float32)
    if case.name == "cross_entropy":
        return x, rng.integers(0, case.shape[1], case.shape[0]).astype(np.int32)
    return (x,)


def torch_peer(case: Case, args: tuple[np.ndarray, ...]) -> Callable[[], object] | None:
    try:
        import torch
        import torch.nn.functional as f
    except ImportError:
        return None
    t = [torch.from_numpy(a) for a in args]
    peers: dict[str, Callable[[], object]] = {
        "lse": lambda: torch.logsumexp(t[0], 1),
        "cross_entropy": lambda: f.cross_entropy(t[0], t[1].long()),
        "softmax": lambda: torch.softmax(t[0], 1),
        "attention": lambda: f.scaled_dot_product_attention(t[0], t[1], t[2], scale=0.125),
    }
    return peers[case.name]


def measure(case: Case, blocks: Blocks) -> dict[str, Any]:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCES[case.name])
    args = inputs(case, np.random.default_rng(0))
    default = engine.default_options(case.name)
    contenders: dict[str, Callable[[], object]] = {}
    results: dict[str, np.ndarray] = {}
    memory: dict[str, int] = {}
    for tile in (0, *case.tiles):
        compiled = engine.compile(case.name, *args, options=default.replace(online_tile=tile))
        before = _resident_mb()
        results[f"tile_{tile}"] = np.asarray(compiled(*args))
        memory[f"tile_{tile}_first_call_mb"] = round(_resident_mb() - before, 1)
        contenders[f"tile_{tile}"] = lambda c=compiled: c(*args)
    peer = torch_peer(case, args)
    if peer is not None:
        contenders["torch"] = peer
    ms = alternating_blocks(contenders, blocks)
    base = results["tile_0"]
    scale = float(np.max(np.abs(base))) or 1.0
    row: dict[str, Any] = {"def": case.name, "shape": list(case.shape)}
    for name, value in ms.items():
        row[f"{name}_ms"] = round(value, 4)
    for tile in case.tiles:
        row[f"tile_{tile}_error_of_largest"] = float(
            np.max(np.abs(results[f"tile_{tile}"] - base)) / scale
        )
    row.update(memory)
    return row


def _resident_mb() -> float:
    """The process's resident memory now (Linux; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * resource.getpagesize() / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated def names")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, timed once: does it run?")
    args = p.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    cases = [c for c in (SMOKE if args.smoke else CASES) if not only or c.name in only]
    blocks = SMOKE_BLOCKS if args.smoke else Blocks(least=args.reps)
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None  # type: ignore[assignment]
    rows = []
    for case in cases:
        row = measure(case, blocks)
        rows.append(row)
        timed = "  ".join(f"{k[:-3]} {v:.3f}" for k, v in row.items() if k.endswith("_ms"))
        print(f"{case.name:>14} {'x'.join(map(str, case.shape)):>12}  {timed}", flush=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "cpu": _cpu_name(),
        "threads": os.cpu_count(),
        "torch": getattr(torch, "__version__", None),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag(args.tag, args.smoke)
    path = args.out / f"online-{record['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
