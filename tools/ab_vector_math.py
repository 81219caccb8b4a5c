"""A/B timing of tcpy's own float32 math functions (`tcpy.codegen.vector_math`) against
glibc's libmvec, in the suite's kernels that call them (softmax: exp, gelu: tanh).

    TCPY_CACHE_DIR=off python tools/ab_vector_math.py [--only softmax,gelu] [--rounds 8]

Each kernel is built both ways in this process (with every function of
`vector_math.OWN` tcpy's, and with none), checked against NumPy, and timed on
buffers allocated once in alternating blocks (`bench.cpu.alternating_blocks`); prints
the median milliseconds and the ratio libmvec / own (above 1: tcpy's are faster).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.cpu import Blocks, alternating_blocks, kernel_alone
from bench.suite import SUITE
from tcpy.codegen import vector_math


def _compiled(kernel, inputs, own: bool) -> tcpy.Compiled:  # type: ignore[no-untyped-def]
    """The kernel built with tcpy's functions (`own`) or with libmvec's."""
    kept = vector_math.OWN, vector_math.FASTER_IN_LIBMVEC
    if own:
        vector_math.FASTER_IN_LIBMVEC = frozenset()
    else:
        vector_math.OWN = frozenset()
    try:
        engine = tcpy.ExecutionEngine("cpu")
        engine.define(kernel.tc)
        compiled = engine.compile(kernel.entry, *inputs)
    finally:
        vector_math.OWN, vector_math.FASTER_IN_LIBMVEC = kept
    uses = "tc_" if own else ""
    assert any(f"{uses}{fn}f(" in compiled.source for fn in ("exp", "tanh")), compiled.source
    return compiled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="softmax,gelu")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    blocks = Blocks(rounds=args.rounds)
    for kernel in SUITE:
        if kernel.name not in args.only.split(","):
            continue
        inputs = kernel.inputs(np.random.default_rng(0), kernel.sizes)
        want = np.asarray(kernel.numpy(*inputs))
        runs = {}
        for label, own in (("own", True), ("libmvec", False)):
            compiled = _compiled(kernel, inputs, own)
            got = np.asarray(compiled(*inputs))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            runs[label] = kernel_alone(compiled, inputs)
        ms = alternating_blocks(runs, blocks)
        gbps = {k: kernel.bytes(kernel.sizes) / (v * 1e-3) / 1e9 for k, v in ms.items()}
        print(
            f"{kernel.name:8s} own {ms['own']:.3f} ms ({gbps['own']:.1f} GB/s)  "
            f"libmvec {ms['libmvec']:.3f} ms ({gbps['libmvec']:.1f} GB/s)  "
            f"libmvec/own {ms['libmvec'] / ms['own']:.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
