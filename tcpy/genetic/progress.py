"""Progress of a tuning session: a tqdm bar on a terminal (generation, candidates
measured, the best time and its speedup over the start, failures), one plain line per
generation otherwise (a log file or CI has no use for carriage returns), and the same
line on the `tcpy.tune` logger at debug level, for those who collect its details."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any, TextIO

from tcpy.genetic.search import Progress

log = logging.getLogger("tcpy.tune")


class Reporter:
    """Reports each generation of a session on `stream` (stderr by default, as stdout
    may be the program's output); a context manager, so the bar is closed on errors."""

    def __init__(self, entry: str, config: Any, stream: TextIO | None = None) -> None:
        self.entry = entry
        self.config = config
        self.stream = stream or sys.stderr
        self.bar: Any = None

    def __enter__(self) -> Reporter:
        if _is_terminal(self.stream):
            from tqdm import tqdm  # only here: `import tcpy` stays light

            self.bar = tqdm(
                total=self.config.generations, desc=f"tuning {self.entry}", unit="gen",
                file=self.stream, leave=True,
            )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, p: Progress) -> None:
        """Called by the search after each generation."""
        text = describe(p, self.config.generations)
        log.debug("%s: %s", self.entry, text)
        if self.bar is not None:
            self.bar.set_postfix_str(_short(p), refresh=False)
            self.bar.update(1)
        else:
            print(f"tcpy tune {self.entry}: {text}", file=self.stream, flush=True)


def describe(p: Progress, generations: int) -> str:
    """One generation in words, e.g. `generation 2/10: 40 candidates, best 1.234 ms
    (1.52x the start), 3 failed (compile_error 2, timeout 1)`."""
    text = (
        f"generation {p.generation + 1}/{generations}: {p.trials} candidates, "
        f"best {p.best_s * 1e3:.3f} ms ({_speedup(p):.2f}x the start), "
        f"{sum(p.failures.values())} failed"
    )
    if p.failures:
        text += " (" + ", ".join(f"{k} {v}" for k, v in sorted(p.failures.items())) + ")"
    return text


def _short(p: Progress) -> str:
    """The bar's postfix: the same facts as `describe`, in the width a bar has."""
    failed = sum(p.failures.values())
    return f"{p.trials} cand, best {p.best_s * 1e3:.3f} ms, {_speedup(p):.2f}x, {failed} failed"


def _speedup(p: Progress) -> float:
    """The start's time over the best (nan while either is unknown: all failed)."""
    if p.best_s > 0 and math.isfinite(p.best_s) and math.isfinite(p.start_s):
        return p.start_s / p.best_s
    return math.nan


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (OSError, ValueError):  # a closed or detached stream
        return False
