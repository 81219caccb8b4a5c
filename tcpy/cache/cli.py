"""`tcpy cache`: show, clear and prune the disk cache of `TCPY_CACHE_DIR`.

tcpy cache info
tcpy cache clear [--tuned] [--dry-run]
tcpy cache prune [--other-versions] [--older-than AGE] [--tuned] [--dry-run]

With the disk cache off (`TCPY_CACHE_DIR=off`) `info` says so and succeeds, while
`clear` and `prune` fail (exit status 1): a user who meant to clear a cache should
learn that nothing was cleared. A cache directory that does not exist yet is an empty
cache. Errors print `error: ...` on stderr with exit status 1, as the other commands do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tcpy import knobs
from tcpy.cache import admin
from tcpy.cache.admin import UNKNOWN, CacheAdminError, Removal
from tcpy.errors import TCError

_TUNED_HELP = (
    "also remove tuned options (`tcpy tune` results, kept in <cache dir>/tuned/), "
    "which are kept otherwise"
)
_DRY_RUN_HELP = "only say what would be removed"


def add_cache_commands(sub: Any, epilog: str) -> None:
    """Add `cache info|clear|prune` to the `tcpy` command's subparsers `sub`, with
    `epilog` (the examples) at the end of `tcpy cache --help`."""
    cache = sub.add_parser(
        "cache",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="show, clear or prune the disk cache (TCPY_CACHE_DIR)",
        description="The disk cache of compiled kernels and tuned options, in "
        "TCPY_CACHE_DIR (default $XDG_CACHE_HOME/tcpy, else ~/.cache/tcpy). "
        "TCPY_CACHE_MAX_MB caps the compiled kernels' size (least recently used removed "
        "first).",
    )
    commands = cache.add_subparsers(
        dest="cache_command", required=True, metavar="ACTION", help="info, clear or prune"
    )
    commands.add_parser(
        "info", help="where the cache is, its size, its entries by tcpy version, tuned options"
    )
    clear = commands.add_parser("clear", help="remove every compiled kernel")
    clear.add_argument("--tuned", action="store_true", help=_TUNED_HELP)
    clear.add_argument("--dry-run", action="store_true", help=_DRY_RUN_HELP)
    prune = commands.add_parser(
        "prune",
        help="remove compiled kernels of other tcpy versions, or not used for a while",
        description="Remove the compiled kernels that match --other-versions or "
        "--older-than (either is enough; at least one is needed).",
    )
    prune.add_argument("--other-versions", action="store_true",
                       help="remove what other tcpy versions wrote (and entries that do "
                       "not say which version wrote them)")  # fmt: skip
    prune.add_argument("--older-than", metavar="AGE",
                       help="remove what was last used more than AGE ago: a number and a "
                       "unit, s, m, h, d or w (30d, 12h)")  # fmt: skip
    prune.add_argument("--tuned", action="store_true", help=_TUNED_HELP)
    prune.add_argument("--dry-run", action="store_true", help=_DRY_RUN_HELP)


def cache_command(args: argparse.Namespace) -> int:
    """Run `tcpy cache ...`; returns the exit status."""
    try:
        for line in _lines(args):
            print(line)
    except TCError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _lines(args: argparse.Namespace) -> list[str]:
    root = knobs.cache_dir()
    cap = knobs.cache_max_bytes()
    if root is None:
        if args.cache_command == "info":
            return ["the disk cache is off (TCPY_CACHE_DIR=off)"]
        raise CacheAdminError(
            f"the disk cache is off (TCPY_CACHE_DIR=off): there is no cache to "
            f"{args.cache_command}; set TCPY_CACHE_DIR to the cache directory, or unset it "
            "for the default one"
        )
    if args.cache_command == "info":
        return _info(admin.info(root), cap)
    if args.cache_command == "clear":
        removal = admin.clear(root, tuned=args.tuned, dry_run=args.dry_run)
    else:
        older_than = None if args.older_than is None else admin.parse_age(args.older_than)
        removal = admin.prune(
            root, other_versions=args.other_versions, older_than=older_than,
            tuned=args.tuned, dry_run=args.dry_run,
        )  # fmt: skip
    return _removed(root, removal)


def _info(info: admin.Info, cap: int) -> list[str]:
    lines = [
        f"cache directory: {info.root}",
        f"compiled kernels: {_count(info.count, 'entry', 'entries')}, {_bytes(info.size)}",
    ]
    for group in info.groups:
        if group.version == info.version:
            name = f"this tcpy ({group.version})"
        elif group.version == UNKNOWN:
            name = "unknown version"
        else:
            name = f"tcpy {group.version}"
        lines.append(f"  {name}: {_count(group.count, 'entry', 'entries')}, {_bytes(group.size)}")
    lines.append(
        f"tuned options: {_count(info.tuned_count, 'record', 'records')}, {_bytes(info.tuned_size)}"
    )
    lines.append(f"size cap: {_bytes(cap)} (TCPY_CACHE_MAX_MB)" if cap else "size cap: none")
    return lines


def _removed(root: Path, removal: Removal) -> list[str]:
    verb = "would remove" if removal.dry_run else "removed"
    what = f"{_count(removal.entries, 'compiled entry', 'compiled entries')} " + (
        f"({_bytes(removal.entry_bytes)})"
    )
    if removal.tuned:
        what += (
            f" and {_count(removal.tuned, 'tuned record', 'tuned records')} "
            f"({_bytes(removal.tuned_bytes)})"
        )
    lines = [f"{verb} {what} from {root}"]
    if removal.kept_tuned:
        lines.append(
            f"kept {_count(removal.kept_tuned, 'tuned record', 'tuned records')}"
            + ("" if removal.tuned else " (--tuned removes them too)")
        )
    if removal.failed:
        lines.append(f"could not remove {removal.failed} (in use, or permissions)")
    return lines


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _bytes(n: int) -> str:
    """`n` bytes in decimal units, as `TCPY_CACHE_MAX_MB` counts them."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6)):
        if n < scale * 1000:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e9:.1f} GB"
