"""Per-call host time of GPU calls: `bench/overhead.py --gpu` (a real device) and
`--fake-gpu` (no GPU: the CI's fake driver).

Two defs, timed in their steady state (the launch plan built, memory warm): `add`
(one kernel, `C(i) = A(i) + B(i)`) and `norm` (three kernels, a sum of squares and a
scaling), on 16 elements, so that the device's time is far below the host's.

`--gpu`, on PyTorch CUDA tensors, beside the peers on the same GPU: PyTorch eager's own
`torch.add`, an operator registered with `torch.library` (a `Library` definition whose
CUDA kernel is `torch.add`), a `torch.library.custom_op` doing the same, and Triton's
launch of a one-line add kernel when Triton is installed. Each is timed as the host's
wall time per call over a loop that never synchronises (the best of 7 rounds of 2,000
calls, the device drained between rounds), with the driver calls tcpy made per steady
call counted. Then a CUDA graph of 20 calls (10 of each def, on 4096 elements) is
captured with `torch.cuda.graph`, and its replay timed with CUDA events against the sum
of its kernels' device times (`torch.profiler`).

`--fake-gpu`: the same steady calls on arrays in the fake driver's memory
(`tests/fake_gpu.py`, kernels that do nothing; the CUDA is compiled by NVRTC all the
same): the Python time per call (best of 15 rounds of 4,000 calls), and every driver
call a steady call makes (launches only: no synchronisation, copy or memset of a status
word); for scale, the `cpu` target's call of the same add on NumPy arrays in the same
run.

Results go to `bench/results/overhead-gpu-<date>[-<tag>].json` or
`overhead-fake-gpu-<date>[-<tag>].json`. Under `--smoke` (does it still run?): one
round of `SMOKE_CALLS` calls a path, the graph replayed once; the file is tagged `smoke`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.suite import smoke_tag

ROUNDS, CALLS = 15, 4000
SMOKE_CALLS = 100  # in one round, under --smoke
ADD = "def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
NORM = "def norm(float(N) A) -> (O) {\n  S +=! A(i) * A(i)\n  O(i) = A(i) / sqrt(S)\n}"


def best_us(
    fn: Callable[[], object],
    drain: Callable[[], None] = lambda: None,
    rounds: int = ROUNDS,
    calls: int = CALLS,
) -> float:
    """The best of `rounds` rounds of `calls` calls: microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        drain()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    drain()
    return best * 1e6


def _counted(drv: Any, names: tuple[str, ...]) -> Counter[str]:
    """Count `drv`'s calls of `names` (instance attributes over its methods)."""
    calls: Counter[str] = Counter()
    for name in names:
        method = getattr(drv, name)

        def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls[_name] += 1
            return _method(*args)

        setattr(drv, name, counted)
    return calls


DRIVER_CALLS = ("launch", "synchronize", "to_host", "to_device", "memset", "alloc", "record",
                "done", "order", "event", "capturing")  # fmt: skip


def fake_gpu(rounds: int = ROUNDS, calls: int = CALLS) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from fake_gpu import DeviceVector, HostMemoryDriver

    import tcpy
    from tcpy.runtime import cuda

    class Lean(HostMemoryDriver):
        """The fake driver with a launch that only counts: what is timed is tcpy's."""

        def launch(self, function: Any, grid: Any, block: Any, args: Any, stream: int) -> None:
            self.calls["launch"] += 1

    class Static(DeviceVector):
        """A vector whose `__cuda_array_interface__` is made once (as PyTorch's
        attributes are read without building anything)."""

        def __init__(self, drv: Any, values: np.ndarray) -> None:
            super().__init__(drv, values)
            self.__dict__["face"] = DeviceVector.__cuda_array_interface__.fget(self)  # type: ignore[attr-defined]

        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            return self.__dict__["face"]  # type: ignore[no-any-return]

    os.environ.pop("TCPY_POISON", None)
    drv = Lean()
    cuda.driver = lambda: drv  # type: ignore[assignment]
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(ADD)
    engine.define(NORM)
    a, b = (Static(drv, np.ones(16, np.float32)) for _ in range(2))
    rows = []
    for name, fn in (("add: 1 kernel", lambda: engine.add(a, b)),
                     ("norm: 3 kernels", lambda: engine.norm(a))):  # fmt: skip
        for _ in range(3):
            fn()
        drv.calls.clear()
        for _ in range(1024):
            fn()
        per_call = {k: v / 1024 for k, v in sorted(drv.calls.items())}
        us = best_us(fn, rounds=rounds, calls=calls)
        rows.append({"call": name, "python_us": round(us, 2), "driver_calls_per_call": per_call})
        shown = ", ".join(f"{k} {v:g}" for k, v in per_call.items())
        print(f"{name:18} {us:6.2f} us per call (Python); driver calls per call: {shown}")
    # for scale, in the same run: the same add on the cpu target on NumPy arrays
    cpu = tcpy.ExecutionEngine("cpu")
    cpu.define(ADD)
    x, y = np.ones(16, np.float32), np.ones(16, np.float32)
    cpu.add(x, y)
    us = best_us(lambda: cpu.add(x, y), rounds=rounds, calls=calls)
    print(f"{'cpu add on NumPy':18} {us:6.2f} us per call (for scale: its kernel included)")
    return {"paths": rows, "cpu_numpy_add_us": round(us, 2)}


def real_gpu(rounds: int = ROUNDS, calls: int = CALLS, replays: int = 50) -> dict[str, Any]:
    import torch

    import tcpy
    from tcpy.runtime import cuda

    os.environ.pop("TCPY_POISON", None)
    os.environ.pop("TCPY_LAUNCH_BLOCKING", None)
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(ADD)
    engine.define(NORM)
    a, b = (torch.ones(16, device="cuda") for _ in range(2))
    drain = torch.cuda.synchronize
    lib = torch.library.Library("tcpy_overhead", "DEF")
    lib.define("add(Tensor a, Tensor b) -> Tensor")
    lib.impl("add", lambda x, y: torch.add(x, y), "CUDA")

    # the schema given, since this module's annotations are strings that name a local
    add_custom = torch.library.custom_op(
        "tcpy_overhead::add_custom", lambda x, y: torch.add(x, y), mutates_args=(),
        schema="(Tensor x, Tensor y) -> Tensor",
    )  # fmt: skip

    paths: dict[str, Callable[[], object]] = {
        "tcpy engine.add: 1 kernel": lambda: engine.add(a, b),
        "tcpy engine.norm: 3 kernels": lambda: engine.norm(a),
        "torch.add (eager)": lambda: torch.add(a, b),
        "torch.library Library op": lambda: torch.ops.tcpy_overhead.add(a, b),
        "torch.library.custom_op": lambda: add_custom(a, b),
    }
    triton_add = _triton_add(torch)
    if triton_add is not None:
        paths["triton add (launch)"] = lambda: triton_add(a, b)
    rows = []
    drv = cuda.driver()
    for name, fn in paths.items():
        for _ in range(3):
            fn()
        drain()
        host_us = best_us(fn, drain, rounds, calls)
        row: dict[str, Any] = {"call": name, "host_us": round(host_us, 2)}
        if name.startswith("tcpy"):
            counted = _counted(drv, DRIVER_CALLS)
            for _ in range(1024):
                fn()
            drain()
            row["driver_calls_per_call"] = {k: v / 1024 for k, v in sorted(counted.items())}
            for attr in DRIVER_CALLS:  # the driver's own methods again
                drv.__dict__.pop(attr, None)
        rows.append(row)
        print(f"{name:30} {row['host_us']:7.2f} us per call on the host")
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "driver_layer": drv.name, "paths": rows,
            "graph": _graph(torch, engine, replays)}  # fmt: skip


def _graph(torch: Any, engine: Any, replays: int = 50) -> dict[str, Any]:
    """20 calls captured into a CUDA graph: replay time (the best of `replays`) against
    its kernels' time."""
    x = torch.rand(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            engine.add(engine.norm(x), x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(10):
            y = engine.add(engine.norm(y), x)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    kernel_us = sum(e.device_time for e in kernels)  # microseconds
    replay = min(times)
    ratio = replay / kernel_us if kernel_us else None
    print(f"graph of 20 calls ({len(kernels)} kernels): replay {replay:.1f} us, kernels "
          f"{kernel_us:.1f} us" + (f" ({ratio:.2f}x)" if ratio else ""))  # fmt: skip
    return {"calls": 20, "kernels": len(kernels), "replay_us": round(replay, 2),
            "kernels_us": round(kernel_us, 2), "ratio": ratio}  # fmt: skip


def _triton_add(torch: Any) -> Callable[[Any, Any], Any] | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def add_kernel(x, y, out, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out + offsets, tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask),
                 mask=mask)  # fmt: skip

    def add(x: Any, y: Any) -> Any:
        out = torch.empty_like(x)
        add_kernel[(1,)](x, y, out, x.numel(), BLOCK=16)
        return out

    return add


def main(gpu: bool, tag: str, out: Path, smoke: bool = False) -> int:
    """Measure (`gpu`: on a real device), and write the results to `out`; `smoke`: one
    round of `SMOKE_CALLS` calls, the graph replayed once."""
    rounds, calls = (1, SMOKE_CALLS) if smoke else (ROUNDS, CALLS)
    found = real_gpu(rounds, calls, 1 if smoke else 50) if gpu else fake_gpu(rounds, calls)
    import tcpy

    record = {
        "date": datetime.date.today().isoformat(),
        "smoke": smoke,
        "machine": {"processor": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "python": platform.python_version()},
        "tcpy_source": str(Path(tcpy.__file__).parent),
        "rounds": rounds, "calls_per_round": calls, **found,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    kind = "gpu" if gpu else "fake-gpu"
    tag = smoke_tag(tag, smoke)
    path = out / f"overhead-{kind}-{record['date']}{f'-{tag}' if tag else ''}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0
