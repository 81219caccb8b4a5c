"""Tuned options, kept per (canonical def, input shapes and dtypes, target, device).

The store lives beside the kernel cache, in `<cache root>/tuned/`, one JSON file per
key, written atomically (a temporary file renamed into place) in private directories
checked like the kernel cache's (`tcpy.cache.trust`). It is separate from the kernel
cache so that clearing or pruning compiled kernels never loses a tuning session's
result. Each record holds the best options, the top few with their times, the device,
tcpy's version and the date. Records are also kept in memory for the process, which is
all there is when the disk cache is off. Options that no longer validate (after an
upgrade that changed a field) are skipped with a warning, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tcpy.cache.kernels import DiskCache
from tcpy.cache.trust import Refused, check_private, private_dir, warn_once
from tcpy.errors import TCError, TCWarning
from tcpy.mapping.options import MappingOptions

FORMAT = "v1"
Stamp = tuple[int, int, int]  # a file's mtime, size and inode: which version of it was read


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A record as read (or written) in this process. `stamp` is the file's identity
    when it was read (None: known only in memory); `options` its parsed best options, or
    None when they no longer validate (then `problem` says why)."""

    stamp: Stamp | None
    record: dict[str, Any]
    options: MappingOptions | None
    problem: str = ""


# Every record read or written in this process, per (store root, key): the root is part
# of the key so that engines on different cache directories never see each other's
# results through memory. A file is read again only when its stamp changed, so the
# lookup on each call of an engine costs a stat, and an edit on disk is noticed (the
# size and inode too, as mtimes can be as coarse as a clock tick).
_memory: dict[tuple[Path | None, str], _Loaded] = {}
_warned: set[tuple[Path | None, str, Stamp | None]] = set()


def tuned_key(canonical_def: str, signature: list[list[Any]], target: str, device: str) -> str:
    fields = {"def": canonical_def, "inputs": signature, "target": target, "device": device}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class TunedStore:
    """The tuned options of one cache root (or of this process only, without one)."""

    def __init__(self, disk: DiskCache | None) -> None:
        self.root = disk.home / "tuned" / FORMAT if disk is not None else None

    def _path(self, key: str) -> Path | None:
        return self.root / f"{key}.json" if self.root is not None else None

    def _load(self, key: str) -> _Loaded | None:
        """The record under `key`: from memory while its file is unchanged, else read."""
        cached = _memory.get((self.root, key))
        path = self._path(key)
        if path is None:
            return cached
        try:
            stamp = _stamp(path)
        except OSError:  # not on disk (or unreadable): what this process stored, if any
            return cached
        if cached is not None and cached.stamp == stamp:
            return cached
        try:
            # as with compiled kernels, only what a directory of ours holds is trusted
            check_private(path.parent.parent)
            check_private(path.parent)
            record = json.loads(path.read_text())
        except Refused as e:
            warn_once(path.parent, f"tuned options in {path.parent} are not used: {e.what}")
            return cached
        except (OSError, ValueError):
            return cached
        if not isinstance(record, dict):
            return cached
        loaded = _parse(stamp, record)
        _memory[(self.root, key)] = loaded
        return loaded

    def record(self, key: str) -> dict[str, Any] | None:
        """The whole record under `key` (options, top, device, version, date)."""
        loaded = self._load(key)
        return loaded.record if loaded is not None else None

    def get(self, key: str) -> MappingOptions | None:
        """The best options stored under `key`, if they still validate; a record whose
        options do not is skipped with one warning (per record and version of its file)."""
        loaded = self._load(key)
        if loaded is None:
            return None
        if loaded.options is None and (self.root, key, loaded.stamp) not in _warned:
            _warned.add((self.root, key, loaded.stamp))
            entry = loaded.record.get("entry", "?")
            warnings.warn(
                TCWarning(
                    f"tuned options for {entry} no longer validate ({loaded.problem}); "
                    f"they are ignored (the target's options are used): tune {entry} again"
                ),
                stacklevel=3,
            )
        return loaded.options

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Keep `record` under `key`, in memory and (atomically) on disk."""
        record = _plain(record)
        path = self._path(key)
        stamp = None
        if path is not None:
            try:
                stamp = _write(path, record)
            except (OSError, Refused) as e:
                warnings.warn(
                    TCWarning(f"could not store tuned options in {path.parent} ({e}); "
                              "they last for this process only"),
                    stacklevel=3,
                )  # fmt: skip
        _memory[(self.root, key)] = _parse(stamp, record)

    def records(self) -> list[dict[str, Any]]:
        """Every record of this root, on disk and in memory, for nearby-shape look-ups."""
        found = {key: loaded.record for (root, key), loaded in _memory.items() if root == self.root}
        if self.root is not None and self.root.is_dir():
            for path in self.root.glob("*.json"):
                loaded = self._load(path.stem)
                if loaded is not None:
                    found[path.stem] = loaded.record
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
            distance = _distance(signature, record.get("inputs"))
            if distance is None or distance == 0:
                continue
            options = _parse(None, record).options  # a stale record is no starting point
            if options is not None and (best is None or distance < best[0]):
                best = (distance, options)
        return best[1] if best else None


def _stamp(path: Path) -> Stamp:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _parse(stamp: Stamp | None, record: dict[str, Any]) -> _Loaded:
    try:
        return _Loaded(stamp, record, MappingOptions.from_dict(record["options"]))
    except (TCError, KeyError, TypeError, ValueError) as e:
        return _Loaded(stamp, record, None, str(e) or type(e).__name__)


def _write(path: Path, record: dict[str, Any]) -> Stamp:
    """Write `record` to `path` atomically: readers see the old file or the whole new
    one, never a part (two processes may tune the same kernel). Returns its stamp."""
    private_dir(path.parent.parent)
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return _stamp(path)


def _distance(a: list[list[Any]], b: Any) -> float | None:
    """How far two input signatures are apart (None: not comparable)."""
    if not isinstance(b, list) or len(a) != len(b):
        return None
    total = 0.0
    for (shape_a, dtype_a), item in zip(a, b, strict=True):
        if not isinstance(item, list) or len(item) != 2:
            return None
        shape_b, dtype_b = item
        if dtype_a != dtype_b or not isinstance(shape_b, list) or len(shape_a) != len(shape_b):
            return None
        total += sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1)))
                     for x, y in zip(shape_a, shape_b, strict=True))  # fmt: skip
    return total


def _plain(value: Any) -> Any:
    """`value` as strict JSON: non-finite times (a generation with no valid candidate)
    become null, anything else JSON has no type for becomes its text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
