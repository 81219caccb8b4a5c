"""The convergence plot of a tuning session: the best time so far and each
generation's median against the number of candidates measured, with the starting
options' time as a horizontal line, so one glance says whether the search was still
improving (tune longer) or flat (enough), and how far it got from the start.

matplotlib is an extra (`pip install tcpy[plot]`) and is imported here only, under the
Agg backend: plotting must work without a display (a server, CI) and must not change
the backend of a user's interactive session beyond this figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from tcpy.errors import TCError


class Plotted(Protocol):
    """What the plot reads of a tuning session's result: a `tcpy.genetic.tuner.TuneResult`,
    described by its fields here because the tuner imports this module."""

    entry: str
    target: str
    device: str
    time_s: float
    baseline_s: float
    history: list[dict[str, Any]]

    @property
    def speedup(self) -> float: ...


def convergence(result: Plotted, path: Path) -> None:
    """Draw `result`'s convergence to `path` (the format follows its suffix: .png,
    .svg, .pdf)."""
    figure = _figure()
    try:
        axes = figure.add_subplot(1, 1, 1)
        _draw(axes, result)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    except (OSError, ValueError) as e:  # an unwritable path, an unknown format
        raise TCError(f"cannot write the convergence plot to {path}: {e}") from None


def _figure() -> Any:
    """A figure detached from pyplot's state (no global figure list to leak into),
    drawn by the Agg canvas whatever backend the user's session has."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TCError("the convergence plot needs matplotlib: pip install tcpy[plot]") from None
    figure = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(figure)
    return figure


def _draw(axes: Any, result: Plotted) -> None:
    trials = [h["trials"] for h in result.history]
    best = [_ms(h.get("best_s")) for h in result.history]
    median = [_ms(h.get("median_s")) for h in result.history]
    axes.step(trials, best, where="post", marker="o", label="best so far")
    axes.plot(trials, median, linestyle="--", marker=".", alpha=0.7,
              label="generation median")  # fmt: skip
    start = _ms(result.baseline_s)
    if math.isfinite(start):
        axes.axhline(start, color="grey", linestyle=":", label="starting options")
    axes.set_xlim(left=0)
    axes.set_xlabel("candidates measured")
    axes.set_ylabel("time (ms)")
    axes.set_title(
        f"{result.entry} on {result.target} ({result.device}): "
        f"{_ms(result.time_s):.3f} ms, {result.speedup:.2f}x the start"
    )
    if _spread([*best, *median, start]) > 10:  # poor early candidates: a log scale
        axes.set_yscale("log")
    axes.grid(True, alpha=0.3)
    axes.legend()


def _ms(seconds: Any) -> float:
    """Seconds to milliseconds; a missing or failed time (None, inf) is nan, which
    matplotlib leaves as a gap instead of an axis stretched to infinity."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return math.nan
    return float(seconds) * 1e3


def _spread(values: list[float]) -> float:
    """The ratio of the largest plotted time to the smallest (1 when nothing to plot)."""
    shown = [v for v in values if math.isfinite(v) and v > 0]
    return max(shown) / min(shown) if shown else 1.0
