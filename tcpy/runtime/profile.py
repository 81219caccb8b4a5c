"""Tables of the emulator's traffic counters (`Compiled.profile` on `cuda-emu`).

A profile is a list with one dict per kernel launch (`tcpy.runtime.emulator.COUNTERS`,
with `kernel`, `grid` and `block`). Its memory efficiency is the bytes the lanes asked
for over the bytes the sectors they touched move (`global_sectors` x 32): 1.0 when
coalesced, above 1 for broadcasts, 0.125 for a 4 KB stride. The minimum a definition
must move is reading each input and writing each output once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SECTOR_BYTES = 32


def minimum_bytes(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> int:
    """The bytes a definition must move: every input read and every output written once."""
    return sum(int(a.nbytes) for a in (*inputs, *outputs))


def moved_bytes(launch: dict[str, Any]) -> int:
    return int(launch["global_sectors"]) * SECTOR_BYTES


def efficiency(launch: dict[str, Any]) -> float | None:
    """Bytes requested over bytes moved; None without global traffic."""
    moved = moved_bytes(launch)
    requested = launch["global_load_bytes"] + launch["global_store_bytes"]
    return requested / moved if moved else None


_COLUMNS = (
    ("kernel", "kernel"),
    ("grid", "grid"),
    ("block", "block"),
    ("requested", "requested B"),
    ("moved", "moved B"),
    ("efficiency", "efficiency"),
    ("global_requests", "requests"),
    ("sectors_per_request", "sectors/req"),
    ("shared_bytes", "shared B"),
    ("bank_conflicts", "conflicts"),
    ("barriers", "barriers"),
    ("shuffles", "shuffles"),
    ("atomics", "atomics"),
)


def _row(launch: dict[str, Any]) -> dict[str, str]:
    eff = efficiency(launch)
    requests = launch["global_requests"]
    values = {
        **{k: str(v) for k, v in launch.items()},
        "grid": "x".join(map(str, launch["grid"])),
        "block": "x".join(map(str, launch["block"])),
        "requested": str(launch["global_load_bytes"] + launch["global_store_bytes"]),
        "moved": str(moved_bytes(launch)),
        "efficiency": "-" if eff is None else f"{eff:.3f}",
        "sectors_per_request": f"{launch['global_sectors'] / requests:.2f}" if requests else "-",
    }
    return {key: values[key] for key, _ in _COLUMNS}


def table(profile: Sequence[dict[str, Any]], minimum: int | None = None) -> str:
    """The profile as a text table, one row per launch, then the totals (against the
    minimum the definition must move, when given)."""
    rows = [_row(launch) for launch in profile]
    heads = {key: head for key, head in _COLUMNS}
    widths = {k: max(len(heads[k]), *(len(r[k]) for r in rows)) for k in heads}
    lines = ["  ".join(heads[k].rjust(widths[k]) for k in heads)]
    lines += ["  ".join(r[k].rjust(widths[k]) for k in heads) for r in rows]
    moved = sum(moved_bytes(launch) for launch in profile)
    total = f"total: {moved} bytes moved"
    if minimum:
        total += f", {minimum} the definition must move ({moved / minimum:.2f}x)"
    return "\n".join([*lines, total])
