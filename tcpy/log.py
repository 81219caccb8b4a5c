"""Logging: the `tcpy` logger hierarchy, and the stage timings of a compile.

Loggers: `tcpy.compile` (a record for every kernel the engine prepares: the def, the
input shapes, why, where the kernel came from and the time of each stage),
`tcpy.cache` (disk-cache hits, misses and stores) and `tcpy.tune` (the tuner). Like
any library, tcpy adds no handler of its own unless asked: `TCPY_LOG=info` (or
`debug`, `warning`) in the environment adds one on stderr at that level when tcpy
is imported; otherwise configure `logging` as usual.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
import warnings
from collections.abc import Iterator

from tcpy import knobs
from tcpy.errors import TCError, TCWarning

_stages: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "tcpy_stages", default=None
)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Add the time spent in the block to stage `name` of the compile being timed."""
    start = time.perf_counter()
    try:
        yield
    finally:
        times = _stages.get()
        if times is not None:
            times[name] = times.get(name, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    """Collect the stage times of the block (in this thread or task) in a dict."""
    times: dict[str, float] = {}
    token = _stages.set(times)
    try:
        yield times
    finally:
        _stages.reset(token)


def stage_summary(times: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in times.items())


def configure() -> None:
    """Add a stderr handler to the `tcpy` logger at the level `TCPY_LOG` names, once."""
    try:
        level = knobs.log_level()
    except TCError as e:
        warnings.warn(TCWarning(f"{e}; tcpy does not log"), stacklevel=2)
        return
    root = logging.getLogger("tcpy")
    if level is None or any(getattr(h, "_tcpy", False) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
    handler._tcpy = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
