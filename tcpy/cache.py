"""The compile cache: keys, and the on-disk store.

A key hashes everything a compiled kernel depends on: tcpy's own sources, the
canonical text of the definition (its formatting and its def name normalised), the
input shapes and dtypes, the mapping options, the target and device, and the
compiler's identity and flags. Tensor, size and index names are kept: they appear in
the generated code and its comments.

On disk, an entry is a directory `<root>/v1/<key[:2]>/<key>/` holding the files of the
kernel and `meta.json` with their SHA-256. An entry is built in a private temporary
directory and renamed into place, so that readers never see half an entry; an entry
whose files do not match their recorded hashes is removed and rebuilt, never trusted.
Directories are created private (0700).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tcpy.parser.checked import CheckedDef
from tcpy.parser.printer import canonical

FORMAT = "v1"


@functools.cache
def tcpy_version() -> str:
    """A hash of tcpy's own sources (Python modules and the grammar)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.lark")]):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(
    cdef: CheckedDef,
    signature: Any,
    options_json: str,
    target: str,
    device: str,
    toolchain: str,
) -> str:
    fields = {
        "tcpy": tcpy_version(),
        "tc": canonical(cdef),
        "inputs": [[list(shape), str(dtype)] for shape, dtype in signature],
        "options": options_json,
        "target": target,
        "device": device,
        "toolchain": toolchain,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class DiskCache:
    """Compiled kernels on disk, shared by every process that uses the same root."""

    def __init__(self, root: Path) -> None:
        self.root = root / FORMAT

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> Path | None:
        """The entry's directory if it is complete and intact; a damaged one is removed."""
        entry = self._entry(key)
        meta_path = entry / "meta.json"
        if not meta_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            for name, digest in meta["files"].items():
                if _digest(entry / name) != digest:
                    raise ValueError(name)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
            shutil.rmtree(entry, ignore_errors=True)
            return None
        return entry

    def store(self, key: str, build: Callable[[Path], dict[str, Any]], attempts: int = 3) -> Path:
        """Build an entry with `build(directory)` (which writes the files and returns
        extra metadata) and publish it atomically; returns the published entry."""
        staging = self.root / "tmp" / f"{key}.{os.getpid()}.{uuid.uuid4().hex}"
        staging.mkdir(parents=True, mode=0o700)
        self._make_private()
        try:
            extra = build(staging)
            files = {p.name: _digest(p) for p in sorted(staging.iterdir()) if p.is_file()}
            meta = {"key": key, "files": files, **extra}
            tmp_meta = staging / "meta.json.tmp"
            tmp_meta.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(tmp_meta, staging / "meta.json")
            entry = self._entry(key)
            entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                os.rename(staging, entry)
            except OSError:
                # Another process published the same entry first, or a damaged one is
                # in the way: keep an intact one, replace a damaged one.
                if self.lookup(key) is None:
                    shutil.rmtree(entry, ignore_errors=True)
                    with contextlib.suppress(OSError):
                        os.rename(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        found = self.lookup(key)
        if found is None:  # lost a race with a concurrent removal: build once more
            if attempts <= 1:
                raise OSError(f"could not publish the cache entry {self._entry(key)}")
            return self.store(key, build, attempts - 1)
        return found

    def _make_private(self) -> None:
        for path in (self.root.parent, self.root):
            with contextlib.suppress(OSError):
                path.chmod(0o700)
