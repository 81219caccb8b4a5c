"""Progress of a tuning session: a tqdm bar on a terminal (generation, candidates
measured, the best time and its speedup over the start, failures), one log line per
generation on the `tcpy.tune` logger otherwise (and always at debug level)."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

from tcpy.genetic.search import Progress

log = logging.getLogger("tcpy.tune")


class Reporter:
    def __init__(self, entry: str, config: Any, stream: Any = None) -> None:
        self.entry = entry
        self.config = config
        self.stream = stream or sys.stderr
        self.bar: Any = None

    def __enter__(self) -> Reporter:
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.config.generations, desc=f"tuning {self.entry}", unit="gen",
                file=self.stream, leave=True,
            )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, p: Progress) -> None:
        speedup = p.start_s / p.best_s if p.best_s > 0 and math.isfinite(p.start_s) else math.nan
        failed = sum(p.failures.values())
        text = (
            f"generation {p.generation + 1}/{self.config.generations}: {p.trials} candidates, "
            f"best {p.best_s * 1e3:.3f} ms ({speedup:.2f}x the start), {failed} failed"
        )
        if p.failures:
            text += " (" + ", ".join(f"{k} {v}" for k, v in sorted(p.failures.items())) + ")"
        log.info("%s: %s", self.entry, text)
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"{p.trials} cand, best {p.best_s * 1e3:.3f} ms, {speedup:.2f}x, {failed} failed"
            )
            self.bar.update(1)
        else:  # not a terminal (a log file, CI): one line per generation
            print(f"tcpy tune {self.entry}: {text}", file=self.stream, flush=True)
