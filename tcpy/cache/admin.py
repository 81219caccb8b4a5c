"""Administration of a cache root: what it holds, clearing, pruning, and the size cap.

The compiled entries are those of `DiskCache` (`<root>/v1/<shard>/<key>/`), the tuned
options those of `TunedStore` (`<root>/tuned/v1/<key>.json`). Both are read under the
trust rules of `tcpy.cache.trust`: `v1`, its shards, `tuned` and `tuned/v1` must be real
directories of ours that nobody else can write (anything else is a `CacheAdminError`
saying how to fix it, as the cache itself would refuse them); an entry that is a
symlink is never followed (removing it removes the link); nothing outside `v1/` and
`tuned/` is ever removed. An entry is removed by `DiskCache.remove` (renamed into
`v1/tmp/`, then deleted) and a tuned record by one unlink, so that a concurrent reader
never sees half of either; a process that had just found an entry and then cannot
load it rebuilds it (`tcpy.cache.kernels.compiled`).

An entry's last use is the modification time of its `meta.json`, which every lookup
that returns the entry sets; a tuned record's is its file's (when it was written).

The functions return data (frozen dataclasses); `tcpy.cache.cli` prints it. The size cap
(`enforce_cap`) is handed to `DiskCache.open` by whoever opens a capped cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tcpy.cache import tuned
from tcpy.cache.kernels import FORMAT, META, DiskCache, tcpy_version
from tcpy.cache.trust import Refused, check_private
from tcpy.errors import TCError

UNKNOWN = ""  # the version of an entry whose meta.json does not say (older, or damaged)


class CacheAdminError(TCError):
    """A cache that cannot be administered as asked: a bad age, a cache that is off, or a
    directory the trust rules refuse."""


@dataclass(frozen=True, slots=True)
class Item:
    """One compiled entry or tuned record as found on disk."""

    path: Path
    version: str  # the tcpy version that wrote it; UNKNOWN when it does not say
    size: int  # bytes in its files
    used: float  # last use (entries) or write (tuned records), seconds since the epoch


@dataclass(frozen=True, slots=True)
class Group:
    """The entries of one tcpy version."""

    version: str
    count: int
    size: int


@dataclass(frozen=True, slots=True)
class Info:
    """What a cache root holds. `groups` are the compiled entries by tcpy version: this
    tcpy's first, then the others by size, the unknown version last."""

    root: Path
    version: str  # this tcpy's
    groups: tuple[Group, ...]
    tuned_count: int
    tuned_size: int

    @property
    def count(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def size(self) -> int:
        return sum(g.size for g in self.groups)


@dataclass(frozen=True, slots=True)
class Removal:
    """What a clear, prune or the size cap removed (or, with `dry_run`, would remove)."""

    entries: int = 0
    entry_bytes: int = 0
    tuned: int = 0
    tuned_bytes: int = 0
    kept_tuned: int = 0  # tuned records left in place because they were not asked for
    failed: int = 0  # chosen, but could not be removed
    dry_run: bool = False


# --- reading ------------------------------------------------------------------------------


def _exists(check: Callable[[], None]) -> bool:
    """Whether the directory that `check` checks exists; raises CacheAdminError if it
    exists but the trust rules refuse it (as the cache itself would)."""
    try:
        check()
    except FileNotFoundError:
        return False
    except Refused as e:
        raise CacheAdminError(f"{e.what}; tcpy will not use it. Fix: {e.fix}") from None
    return True


def _trusted(path: Path) -> bool:
    """Whether `path` exists: a real directory of ours that nobody else can write."""
    return _exists(lambda: check_private(path))


def _check_home(root: Path) -> bool:
    """Whether the root exists: a directory of ours (a symlink to one is followed, as the
    cache allows)."""
    return _exists(DiskCache(root).check_root)


def _tree_size(path: Path) -> int:
    """The bytes of the files under the directory `path`, symlinks never followed."""
    total = 0
    with os.scandir(path) as children:
        for child in children:
            if child.is_dir(follow_symlinks=False):
                total += _tree_size(Path(child.path))
            else:
                total += child.stat(follow_symlinks=False).st_size
    return total


def _version(path: Path, field: str) -> str:
    """The `field` of the JSON object in the regular file `path`, if it is a string."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return UNKNOWN
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return UNKNOWN
    value = record.get(field) if isinstance(record, dict) else None
    return value if isinstance(value, str) and value else UNKNOWN


def _entry(path: Path, versions: bool) -> Item:
    """The entry at `path`: a directory, or whatever is in its place (a file or a
    symlink, which is counted but never followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return Item(path, UNKNOWN, st.st_size, st.st_mtime)
    meta = path / META
    try:
        meta_st = os.lstat(meta)
        used = meta_st.st_mtime if stat.S_ISREG(meta_st.st_mode) else st.st_mtime
    except OSError:  # no meta.json: a damaged entry, last touched when its files were
        used = st.st_mtime
    version = _version(meta, "tcpy") if versions else UNKNOWN
    return Item(path, version, _tree_size(path), used)


def entries(root: Path, versions: bool = True) -> list[Item]:
    """Every compiled entry under `root` (the cache root, as in `TCPY_CACHE_DIR`); their
    versions are read from `meta.json` when `versions` (the size cap does not need
    them). An entry that vanishes while it is read (another process removed it) is
    skipped."""
    try:
        return _entries(root, versions)
    except OSError as e:
        raise CacheAdminError(f"cannot read the cache {root}: {e}") from None


def _entries(root: Path, versions: bool) -> list[Item]:
    if not _check_home(root) or not _trusted(root / FORMAT):
        return []
    found = []
    for shard in sorted((root / FORMAT).iterdir()):
        if len(shard.name) != 2:  # `tmp/`, where entries are staged and discarded
            continue
        if not _trusted(shard):
            continue
        for path in sorted(shard.iterdir()):
            with contextlib.suppress(FileNotFoundError):
                found.append(_entry(path, versions))
    return found


def tuned_records(root: Path) -> list[Item]:
    """Every tuned record under `root` (not the temporary files of a write under way)."""
    try:
        return _tuned_records(root)
    except OSError as e:
        raise CacheAdminError(f"cannot read the tuned options of {root}: {e}") from None


def _tuned_records(root: Path) -> list[Item]:
    directory = root / "tuned" / tuned.FORMAT
    if not _check_home(root) or not _trusted(directory.parent) or not _trusted(directory):
        return []
    found = []
    for path in sorted(directory.glob("*.json")):
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            found.append(Item(path, _version(path, "tcpy"), st.st_size, st.st_mtime))
    return found


def info(root: Path) -> Info:
    """The entries of `root` by tcpy version, and its tuned records."""
    current = tcpy_version()
    by_version: dict[str, list[Item]] = {}
    for item in entries(root):
        by_version.setdefault(item.version, []).append(item)
    groups = [Group(v, len(items), sum(i.size for i in items)) for v, items in by_version.items()]
    groups.sort(key=lambda g: (g.version != current, g.version == UNKNOWN, -g.size, g.version))
    tuned = tuned_records(root)
    return Info(root, current, tuple(groups), len(tuned), sum(i.size for i in tuned))


# --- removing -----------------------------------------------------------------------------


def parse_age(text: str) -> float:
    """`--older-than`'s AGE in seconds: a number and a unit, `s`, `m`, `h`, `d` or `w`
    (`30d`, `12h`, `1.5w`)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*", text)
    if match is None:
        raise CacheAdminError(
            f"--older-than expects an age such as 30d, 12h or 90m (a number and one of "
            f"s, m, h, d, w for seconds, minutes, hours, days, weeks), got {text!r}"
        )
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[match.group(2)]
    return float(match.group(1)) * unit


def _remove_entries(root: Path, items: Iterable[Item], dry_run: bool) -> Removal:
    removed = failed = size = 0
    disk = DiskCache(root)
    for item in items:
        if dry_run or disk.remove(item.path):
            removed, size = removed + 1, size + item.size
        else:
            failed += 1
    return Removal(entries=removed, entry_bytes=size, failed=failed, dry_run=dry_run)


def _remove_tuned(root: Path, items: Iterable[Item], dry_run: bool) -> Removal:
    removed = failed = size = 0
    directory = root / "tuned" / tuned.FORMAT
    for item in items:
        assert item.path.parent == directory, item.path  # never anything else
        try:
            if not dry_run:
                os.unlink(item.path)  # one step: readers see the record or nothing
            removed, size = removed + 1, size + item.size
        except FileNotFoundError:
            pass  # removed by someone else meanwhile
        except OSError:
            failed += 1
    return Removal(tuned=removed, tuned_bytes=size, failed=failed, dry_run=dry_run)


def _removal(root: Path, chosen: Callable[[Item], bool], tuned: bool, dry_run: bool) -> Removal:
    """Remove the entries (and, with `tuned`, the tuned records) that `chosen` picks."""
    compiled = _remove_entries(root, filter(chosen, entries(root)), dry_run)
    records = tuned_records(root)
    if not tuned:
        return Removal(
            compiled.entries, compiled.entry_bytes, kept_tuned=len(records),
            failed=compiled.failed, dry_run=dry_run,
        )  # fmt: skip
    dropped = _remove_tuned(root, filter(chosen, records), dry_run)
    return Removal(
        compiled.entries, compiled.entry_bytes, dropped.tuned, dropped.tuned_bytes,
        kept_tuned=len(records) - dropped.tuned - dropped.failed,
        failed=compiled.failed + dropped.failed, dry_run=dry_run,
    )  # fmt: skip


def clear(root: Path, tuned: bool = False, dry_run: bool = False) -> Removal:
    """Remove every compiled entry of `root`, and with `tuned` every tuned record."""
    return _removal(root, lambda item: True, tuned, dry_run)


def prune(
    root: Path,
    other_versions: bool = False,
    older_than: float | None = None,
    tuned: bool = False,
    dry_run: bool = False,
    now: float | None = None,
) -> Removal:
    """Remove the entries (with `tuned`, the tuned records too) that another tcpy
    version wrote or whose version is unknown (`other_versions`), or that were last
    used more than `older_than` seconds before `now`: either reason is enough."""
    if not other_versions and older_than is None:
        raise CacheAdminError("prune needs --other-versions, --older-than AGE, or both")
    current = tcpy_version()
    cutoff = None if older_than is None else (time.time() if now is None else now) - older_than

    def chosen(item: Item) -> bool:
        return (other_versions and item.version != current) or (
            cutoff is not None and item.used < cutoff
        )

    return _removal(root, chosen, tuned, dry_run)


def enforce_cap(disk: DiskCache, keep: Path) -> Removal:
    """Bring the compiled entries of `disk` under its `max_bytes` by removing the least
    recently used first, never `keep` (the entry just stored) and never a tuned record.
    Called after every store to a capped cache (`DiskCache.open(root, max_bytes,
    enforce_cap)`): a walk of the tree (a few `stat` calls per entry) beside a compile.
    Failures leave the cache as it is; they are not errors."""
    try:
        items = entries(disk.home, versions=False)
    except CacheAdminError:  # a cache the trust rules refuse, or that cannot be read
        return Removal()
    excess = sum(item.size for item in items) - disk.max_bytes
    removed = failed = size = 0
    for item in sorted(items, key=lambda item: item.used):
        if excess <= 0:
            break
        if item.path == keep:
            continue
        if disk.remove(item.path):
            removed, size, excess = removed + 1, size + item.size, excess - item.size
        else:
            failed += 1
    return Removal(entries=removed, entry_bytes=size, failed=failed)
