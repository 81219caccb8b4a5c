"""The compile cache: keys, the on-disk store of compiled kernels, and the private
directories kernels are built in when there is no store.

A key hashes everything a compiled kernel depends on: tcpy's own sources, the
canonical text of the definition (its formatting and its def name normalised), the
input shapes and dtypes, the mapping options, the target and device, and the
compiler's identity and flags. Tensor, size and index names are kept: they appear in
the generated code and its comments.

Layout. An entry is a directory `<root>/v1/<key[:2]>/<key>/` holding exactly the files
its target loads (the caller names them: `required`) and `meta.json`, a JSON object
with the entry's `key`, `files` (a map from each file's name to its SHA-256) and
`tcpy` (the `tcpy_version` that built it, readable without loading the kernel, so that
`tcpy cache info` and `prune` can group entries by it), beside what the build adds:
the def's name (`def`), `target`, `device`, the `inputs` as `[shape, dtype]` pairs (a
size-generic kernel's shapes are `"*"` per dimension, as in its key), and the options
it was built with. Entries written before these fields existed still load; only `key`
and `files` are checked. An entry is built in a private staging directory under
`<root>/v1/tmp/`, sealed (files the target does not need are dropped, `meta.json` is
written last) and renamed into place, so that readers never see half an entry.

Last use. A lookup that returns an entry sets the modification time of its
`meta.json` to now (failures ignored): that is the entry's last use, by which the size
cap (`TCPY_CACHE_MAX_MB`) removes the least recently used entries after a store, and
`tcpy cache prune --older-than` chooses (both in `tcpy.cache.admin`, which builds on
this module: the cap's policy is handed to `DiskCache.open` by whoever opens a capped
cache). Tuned options
(`<root>/tuned/`) are a store of their own, which neither touches.

Validation. Every entry is checked before use: it must be a real directory that
passes the trust rules (`tcpy.cache.trust`), and `meta.json` must be an object with the right key
and a non-empty `files` listing exactly the required names, each a regular file whose
hash matches. Anything else (bad JSON, a list for `files`, a missing or extra name, a
changed file, a regular file or a symlink where the entry should be) is discarded and
rebuilt, never trusted, never an error. A library that passes its hashes but does not
load (`OSError`, `TCLaunchError`) is discarded and rebuilt too, once (`compiled`).
A discarded entry is first renamed into `tmp/`, so that a concurrent reader sees it
whole or not at all; two processes that discard and publish the same key at once may
cost each other a rebuild, never a wrong kernel.

Trust. Every directory is checked by the rules of `tcpy.cache.trust` before it is
read or written: a bad entry is discarded and rebuilt; any other bad directory makes
tcpy refuse the cache.

Unusable caches. A root that cannot be created or used (read-only home, a file in the
way, refused by the trust rules) gives one `TCWarning` per root and process, saying
what happened and how to fix it, and the engine runs without a disk cache. A store that
fails later (the directory became read-only, the disk is full) warns the same way, once,
and that kernel is built in a private temporary directory instead. Errors of the build
itself (`TCError`) pass through untouched; an `OSError` out of a build in the cache is
taken for a cache failure, and the build in a temporary directory then shows whether it
was one.

Temporary directories (`tcpy-<random>` under the system temp dir, mode 0700) hold
kernels built without a disk cache. Each is removed as soon as its kernel is loaded:
the target reads the source text into memory, and Linux keeps a loaded library mapped
after its file is removed (the CUDA driver copies a cubin when it loads it). A build
that must not be cached (its compiler fell back because the machine was slow) is
loaded from its staging directory and never published.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tcpy.cache.trust import Refused, check_owner, check_private, private_dir, warn_once
from tcpy.errors import InternalError, TCLaunchError
from tcpy.parser.checked import CheckedDef
from tcpy.parser.printer import canonical

_log = logging.getLogger("tcpy.cache")

FORMAT = "v1"
META = "meta.json"
K = TypeVar("K")

EnforceCap = Callable[["DiskCache", Path], object]
"""Keeps a capped `DiskCache` under its `max_bytes`, given the entry just stored (which
it keeps)."""


@functools.cache
def tcpy_version() -> str:
    """A hash of tcpy's own sources (Python modules, the grammar, and the emulator's
    C++ headers, which every emulated kernel is built with)."""
    root = Path(__file__).resolve().parent.parent  # tcpy/, two levels up from tcpy/cache/
    digest = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.lark"), *root.rglob("*.h")]):
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


def _explain(root: Path, error: Exception, instead: str) -> str:
    if isinstance(error, Refused):
        what, fix = error.what, error.fix
    else:
        what = f"the cache directory {root} cannot be used ({error})"
        fix = "make it a writable directory of yours"
    return (
        f"{what}; tcpy will not use it ({instead}). Fix: {fix}, or set TCPY_CACHE_DIR to "
        "another directory (TCPY_CACHE_DIR=off turns the disk cache off)"
    )


# --- the store --------------------------------------------------------------------------


class DiskCache:
    """Compiled kernels on disk, shared by every process of this user that uses the same
    root. Construct with `open`, which checks (or creates) the root.

    A cache capped at `max_bytes` is kept under its cap by `enforce_cap(cache, kept)`,
    called after each store with the entry just stored: `tcpy.cache.admin.enforce_cap`,
    passed in because that module builds on this one (it lists and removes entries
    through `DiskCache`)."""

    def __init__(
        self, root: Path, max_bytes: int = 0, enforce_cap: EnforceCap | None = None
    ) -> None:
        if max_bytes and enforce_cap is None:
            raise InternalError("a capped disk cache needs the policy that enforces its cap")
        self.home = root  # as the user gave it: what warnings name
        self.root = root / FORMAT
        self.max_bytes = max_bytes  # the size cap of the compiled entries (0: none)
        self.enforce_cap = enforce_cap

    @classmethod
    def open(
        cls, root: Path, max_bytes: int = 0, enforce_cap: EnforceCap | None = None
    ) -> DiskCache | None:
        """The cache at `root` (its entries capped at `max_bytes` in all by
        `enforce_cap`, 0 for no cap), or None (with a warning) if it cannot be used."""
        cache = cls(root, max_bytes, enforce_cap)
        try:
            cache.check_root(create=True)
            private_dir(cache.root)
        except (OSError, Refused) as e:
            warn_once(root, _explain(root, e, "compiled kernels are not cached on disk"))
            return None
        return cache

    def check_root(self, create: bool = False) -> None:
        """The root may be used: an absolute path to a directory of ours (a symlink to
        one is followed), made 0700 first with `create` when it is missing. Raises
        `Refused`, or `OSError` (`FileNotFoundError` when it is missing)."""
        home = self.home
        if not home.is_absolute():  # the home directory could not be found
            raise Refused(f"the cache directory {home} is not an absolute path", "set HOME")
        if create and not os.path.lexists(home):
            home.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(home, 0o700)  # only a root we create is made private
        # A symlinked root is followed: the user may keep the cache on another disk.
        check_owner(home, os.stat(home))

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _check_chain(self, key: str) -> None:
        """The root, `v1` and the key's shard may be trusted; FileNotFoundError if a
        directory is missing."""
        self.check_root()
        check_private(self.root)
        check_private(self._entry(key).parent)

    def lookup(self, key: str, required: Sequence[str]) -> Path | None:
        """The entry's directory if it is complete, intact and holds exactly the files
        `required`; a damaged one is discarded."""
        entry = self._entry(key)
        try:
            self._check_chain(key)
            if not os.path.lexists(entry):
                return None
        except FileNotFoundError:
            return None
        except (OSError, Refused) as e:
            warn_once(self.home, _explain(self.home, e, "compiled kernels are not cached"))
            return None
        if _damage(entry, key, required) is not None:
            self.remove(entry)
            return None
        with contextlib.suppress(OSError):  # the last use, for the size cap and prune
            os.utime(entry / META)
        return entry

    def discard(self, key: str) -> None:
        """Remove the entry of `key` (found intact, but its files do not load)."""
        self.remove(self._entry(key))

    def remove(self, entry: Path) -> bool:
        """Remove the entry directory `entry` (`<v1>/<shard>/<key>`, never followed if a
        symlink) whole: it is renamed into `tmp/` first, so that a concurrent reader
        sees it whole or not at all. Returns whether it is gone (filesystem errors are not
        raised: the entry is then left as it is)."""
        if entry.parent.parent != self.root:
            raise InternalError(f"{entry} is not an entry of the cache {self.root}")
        with contextlib.suppress(OSError, Refused):
            if not stat.S_ISDIR(os.lstat(entry).st_mode):
                os.unlink(entry)  # a file or a symlink in the entry's place
                return True
            trash = private_dir(self.root / "tmp") / f"discarded.{uuid.uuid4().hex}"
            try:
                os.rename(entry, trash)
            except (OSError, Refused):
                trash = entry
            shutil.rmtree(trash, ignore_errors=True)
        return not os.path.lexists(entry)

    def store(
        self,
        key: str,
        build: Callable[[Path], dict[str, Any]],
        required: Sequence[str],
        attempts: int = 3,
    ) -> Path | None:
        """Build an entry with `build(directory)` (which writes the files and returns
        extra metadata) and publish it atomically; returns the published entry, or None
        (with a warning) if the cache cannot be written."""
        try:
            stored = self._store(key, build, required, attempts)
        except (OSError, Refused) as e:
            instead = "this kernel is built in a temporary directory, not cached on disk"
            warn_once(self.home, _explain(self.home, e, instead))
            return None
        if self.max_bytes and self.enforce_cap is not None:
            # Only after a store can the cache have grown past its cap, so only then is
            # the tree walked.
            self.enforce_cap(self, stored)
        return stored

    def _store(
        self,
        key: str,
        build: Callable[[Path], dict[str, Any]],
        required: Sequence[str],
        attempts: int,
    ) -> Path:
        # Every directory is checked (and made) before the build, so that a cache that
        # cannot take the entry costs no build that is thrown away.
        self.check_root(create=True)  # the user may have removed it to clear the cache
        private_dir(self.root)
        entry = self._entry(key)
        private_dir(entry.parent)
        staging = private_dir(self.root / "tmp") / f"{key}.{os.getpid()}.{uuid.uuid4().hex}"
        os.mkdir(staging, 0o700)
        try:
            _seal(staging, key, required, build(staging))
            self._publish(staging, entry, key, required, attempts)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        found = self.lookup(key, required)
        if found is None:
            raise OSError(f"could not publish the cache entry {entry}")
        return found

    def _publish(
        self, staging: Path, entry: Path, key: str, required: Sequence[str], attempts: int
    ) -> None:
        error: OSError | None = None
        for _ in range(attempts):
            try:
                os.rename(staging, entry)
                return
            except OSError as e:
                error = e
            # Another process published the same entry first (keep it), or something
            # damaged is in the way (lookup discards it, and the rename is tried again).
            if self.lookup(key, required) is not None:
                return
        assert error is not None
        raise error


def _damage(entry: Path, key: str, required: Sequence[str]) -> str | None:
    """Why the entry at `entry` cannot be used, or None if it is intact."""
    try:
        check_private(entry)
        meta_path = entry / META
        if not stat.S_ISREG(os.lstat(meta_path).st_mode):
            return f"{META} is not a regular file"
        meta = json.loads(meta_path.read_bytes())
        if not isinstance(meta, dict) or meta.get("key") != key:
            return f"{META} is not the record of this key"
        files = meta.get("files")
        if not isinstance(files, dict) or not files or set(files) != set(required):
            return f"{META} does not list the files {sorted(required)}"
        for name, digest in files.items():
            path = entry / name
            if not stat.S_ISREG(os.lstat(path).st_mode) or _digest(path) != digest:
                return f"{name} does not match its hash"
    except (OSError, ValueError, Refused) as e:  # ValueError: bad JSON, bad UTF-8
        return str(e)
    return None


def _seal(staging: Path, key: str, required: Sequence[str], extra: dict[str, Any]) -> None:
    """Record the hashes of the required files in `meta.json` (written last, atomically);
    files the target does not load are not kept."""
    built = {p.name: p for p in staging.iterdir()}
    missing = sorted(set(required) - set(built))
    if missing:
        raise InternalError(f"the build did not write {missing} in {staging}")
    for name, path in built.items():
        if name not in required:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    files = {name: _digest(staging / name) for name in sorted(required)}
    meta = {**extra, "tcpy": tcpy_version(), "key": key, "files": files}
    tmp_meta = staging / f"{META}.tmp"
    tmp_meta.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp_meta, staging / META)


# --- private temporary directories --------------------------------------------------------


@contextlib.contextmanager
def scratch_directory() -> Iterator[Path]:
    """A private temporary directory (`tcpy-<random>`, 0700), removed when the block
    exits (a library loaded from it stays usable: Linux keeps an open file's data)."""
    path = Path(tempfile.mkdtemp(prefix="tcpy-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- found, or built and published --------------------------------------------------------


def compiled(
    disk: DiskCache | None,
    key: str,
    required: Sequence[str],
    build: Callable[[Path], dict[str, Any]],
    load: Callable[[Path], K],
) -> tuple[K, bool]:
    """What `load` makes of the entry of `key`, and whether it came from the disk: found
    there, or built by `build`, published, and loaded. A found entry whose files pass
    their hashes but do not load is damaged all the same: it is discarded and built
    again, once. Without a usable disk cache the files are built in a scratch directory
    that is removed as soon as `load` returns. A build whose metadata says
    `"cache": False` (a result that depends on how busy the machine was) is loaded
    from where it was built and never published."""
    if disk is not None:
        found = disk.lookup(key, required)
        if found is not None:
            try:
                loaded = load(found), True
                _log.debug("hit %s", found)
                return loaded
            except (OSError, TCLaunchError) as e:
                _log.info("discarded %s, which did not load (%s)", found, e)
                disk.discard(key)
        _log.debug("miss %s in %s", key, disk.root)
        unpublished: list[K] = []

        def build_unless_transient(staging: Path) -> dict[str, Any]:
            extra = build(staging)
            if extra.get("cache", True):
                return extra
            unpublished.append(load(staging))
            raise _Transient

        try:
            stored = disk.store(key, build_unless_transient, required)
        except _Transient:
            _log.debug("not stored %s: built with a fallback a quieter machine may avoid", key)
            return unpublished[0], False
        if stored is not None:
            _log.debug("stored %s", stored)
            return load(stored), False
    with scratch_directory() as directory:
        build(directory)
        return load(directory), False


class _Transient(Exception):
    """Raised through `DiskCache.store` by a build that must not be published (the
    store removes its staging directory on the way)."""
