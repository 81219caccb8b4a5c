"""Tuned options, kept per (canonical def, input shapes and dtypes, target, device).

The store lives beside the kernel cache, in `<cache root>/tuned/`, one JSON file per
key, written atomically (a temporary file renamed into place) in private directories
checked like the kernel cache's. It is separate from the kernel cache so that clearing
or pruning compiled kernels never loses a tuning session's result. Each record holds
the best options, the top few with their times, the device, tcpy's version and the
date. Records are also kept in memory for the process, which is all there is when the
disk cache is off. Options that no longer validate (after an upgrade that changed a
field) are skipped with a warning, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from tcpy.cache import DiskCache, Refused, _private_dir
from tcpy.errors import TCError, TCWarning
from tcpy.mapping.options import MappingOptions

FORMAT = "v1"
_memory: dict[str, dict[str, Any]] = {}  # every record read or written in this process


def tuned_key(canonical_def: str, signature: list[list[Any]], target: str, device: str) -> str:
    fields = {"def": canonical_def, "inputs": signature, "target": target, "device": device}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class TunedStore:
    """The tuned options of one cache root (or of this process only, without one)."""

    def __init__(self, disk: DiskCache | None) -> None:
        self.root = disk.home / "tuned" / FORMAT if disk is not None else None

    def _path(self, key: str) -> Path | None:
        return self.root / f"{key}.json" if self.root is not None else None

    def record(self, key: str) -> dict[str, Any] | None:
        if key in _memory:
            return _memory[key]
        path = self._path(key)
        if path is None:
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if isinstance(record, dict):
            _memory[key] = record
            return record
        return None

    def get(self, key: str) -> MappingOptions | None:
        """The best options stored under `key`, if they still validate."""
        record = self.record(key)
        if record is None:
            return None
        try:
            return MappingOptions.from_dict(record["options"])
        except (TCError, KeyError, TypeError) as e:
            warnings.warn(
                TCWarning(
                    f"tuned options for {record.get('entry', '?')} no longer validate ({e}); "
                    "they are ignored: tune again"
                ),
                stacklevel=3,
            )
            return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        _memory[key] = record
        path = self._path(key)
        if path is None:
            return
        try:
            _private_dir(path.parent.parent)
            _private_dir(path.parent)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=_plain) + "\n")
            os.replace(tmp, path)
        except (OSError, Refused) as e:
            warnings.warn(
                TCWarning(f"could not store tuned options in {path.parent} ({e}); "
                          "they last for this process only"),
                stacklevel=3,
            )  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        """Every record on disk (and in memory), for nearby-shape look-ups."""
        found = dict(_memory)
        if self.root is not None and self.root.is_dir():
            for path in self.root.glob("*.json"):
                with contextlib.suppress(OSError, ValueError):
                    record = json.loads(path.read_text())
                    if isinstance(record, dict):
                        found.setdefault(path.stem, record)
        return list(found.values())

    def nearest(
        self, canonical_def: str, signature: list[list[Any]], target: str, device: str
    ) -> MappingOptions | None:
        """The tuned options of the same def, target and device at the nearest other
        shapes (same ranks and dtypes; distance in log-sizes), as a starting point."""
        best: tuple[float, MappingOptions] | None = None
        for record in self.records():
            if (record.get("def"), record.get("target"), record.get("device")) != (
                canonical_def, target, device,
            ):  # fmt: skip
                continue
            other = record.get("inputs")
            distance = _distance(signature, other)
            if distance is None or distance == 0:
                continue
            try:
                options = MappingOptions.from_dict(record["options"])
            except (TCError, KeyError, TypeError):
                continue
            if best is None or distance < best[0]:
                best = (distance, options)
        return best[1] if best else None


def _distance(a: list[list[Any]], b: Any) -> float | None:
    if not isinstance(b, list) or len(a) != len(b):
        return None
    total = 0.0
    for (shape_a, dtype_a), item in zip(a, b, strict=True):
        shape_b, dtype_b = item
        if dtype_a != dtype_b or len(shape_a) != len(shape_b):
            return None
        total += sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1)))
                     for x, y in zip(shape_a, shape_b, strict=True))  # fmt: skip
    return total


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
