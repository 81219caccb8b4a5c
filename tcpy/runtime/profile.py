"""Tables of the emulator's traffic counters (`Compiled.profile` on `cuda-emu`).

A profile is a list with one dict per kernel launch (`tcpy.runtime.emulator.COUNTERS`,
with `kernel`, `grid` and `block`). Its memory efficiency is the bytes the lanes asked
for over the bytes the sectors they touched move (`global_sectors` x 32): 1.0 when
coalesced, above 1 for broadcasts, 0.125 for a 4 KB stride. The minimum a definition
must move is reading each input and writing each output once.

Two figures of a launch's traffic: `moved_bytes`, every sector each warp request
touches, as if nothing were cached (a vector every block reads is moved once per
block); and `dram_bytes`, what reaches DRAM when the L2 cache keeps what the launch
touched: the distinct sectors it loads plus the distinct sectors it stores, where its
footprint (the distinct sectors it touches, x 32) fits the device's L2
(`DeviceProfile.l2_bytes`), else the moved bytes (no reuse assumed). Each launch
starts cold: what one launch stores and the next loads counts in both. Atomics are
in neither requests nor `moved_bytes`; the footprint counts an atomic's sector as
loaded and stored.
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


def dram_bytes(launch: dict[str, Any], l2_bytes: int) -> int:
    """The bytes `launch` moves to and from DRAM behind an L2 of `l2_bytes` (the module)."""
    footprint = int(launch["distinct_sectors"]) * SECTOR_BYTES
    if footprint > l2_bytes:
        return moved_bytes(launch)
    return (int(launch["distinct_load_sectors"]) + int(launch["distinct_store_sectors"])) * (
        SECTOR_BYTES
    )


def default_l2_bytes() -> int:
    """The L2 of the device profile `cuda-emu` maps for by default."""
    from tcpy.mapping.gpu.device import default_profile

    return default_profile().l2_bytes


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
    ("dram", "dram B"),
    ("efficiency", "efficiency"),
    ("global_requests", "requests"),
    ("sectors_per_request", "sectors/req"),
    ("shared_bytes", "shared B"),
    ("bank_conflicts", "conflicts"),
    ("barriers", "barriers"),
    ("shuffles", "shuffles"),
    ("atomics", "atomics"),
    ("async_groups", "cp.async groups"),
    ("mmas", "mma"),
)


def _row(launch: dict[str, Any], l2_bytes: int) -> dict[str, str]:
    eff = efficiency(launch)
    requests = launch["global_requests"]
    values = {
        **{k: str(v) for k, v in launch.items()},
        "grid": "x".join(map(str, launch["grid"])),
        "block": "x".join(map(str, launch["block"])),
        "requested": str(launch["global_load_bytes"] + launch["global_store_bytes"]),
        "moved": str(moved_bytes(launch)),
        "dram": str(dram_bytes(launch, l2_bytes)),
        "efficiency": "-" if eff is None else f"{eff:.3f}",
        "sectors_per_request": f"{launch['global_sectors'] / requests:.2f}" if requests else "-",
    }
    return {
        key: values.get(key, "-") for key, _ in _COLUMNS
    }  # "-": a profile from before the counter


def table(
    profile: Sequence[dict[str, Any]], minimum: int | None = None, l2_bytes: int | None = None
) -> str:
    """The profile as a text table, one row per launch, then the totals of moved and
    DRAM bytes (`l2_bytes`: the L2's size, by default `default_l2_bytes()`), against
    the minimum the definition must move, when given."""
    l2 = default_l2_bytes() if l2_bytes is None else l2_bytes
    rows = [_row(launch, l2) for launch in profile]
    heads = {key: head for key, head in _COLUMNS}
    widths = {k: max(len(heads[k]), *(len(r[k]) for r in rows)) for k in heads}
    lines = ["  ".join(heads[k].rjust(widths[k]) for k in heads)]
    lines += ["  ".join(r[k].rjust(widths[k]) for k in heads) for r in rows]
    moved = sum(moved_bytes(launch) for launch in profile)
    dram = sum(dram_bytes(launch, l2) for launch in profile)
    total = f"total: {moved} bytes moved, {dram} DRAM bytes"
    if minimum:
        total += (
            f", {minimum} the definition must move "
            f"(moved {moved / minimum:.2f}x, DRAM {dram / minimum:.2f}x)"
        )
    return "\n".join([*lines, total])
