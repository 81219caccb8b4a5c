"""The compile cache: what changes the key and what does not, reuse across engines
and processes, damaged entries, concurrent writers, private directories."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.cache import cache_key
from tcpy.errors import TCWarning
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source

from programs import MATMUL

SIG = [((4, 5), np.dtype(np.float32)), ((5, 6), np.dtype(np.float32))]


def _key(source: str = MATMUL, signature=SIG, options=None, target="cpu", device="d", tools="t"):  # type: ignore[no-untyped-def]
    (cdef,) = check_source(source).values()
    options = options or MappingOptions.cpu()
    return cache_key(cdef, signature, options.to_json(), target, device, tools)


def test_key_ignores_formatting_comments_and_the_def_name() -> None:
    same = (
        "# a comment\ndef other ( float(M,K) A , float(K,N) B )->(C){\n  C(m,n)+=!A(m,k)*B(k,n)\n}"
    )
    assert _key(same) == _key()


@pytest.mark.parametrize(
    "change",
    [
        {"source": MATMUL.replace("+=!", "max=!")},
        {"source": MATMUL.replace("float(K,N) B", "double(K,N) B")},
        {"source": MATMUL.replace("A(m,k) * B(k,n)", "A(m,k) + B(k,n)")},
        {"signature": [((4, 5), np.dtype(np.float32)), ((5, 7), np.dtype(np.float32))]},
        {"options": MappingOptions.cpu().replace(unroll=2)},
        {"target": "cuda-emu"},
        {"device": "another"},
        {"tools": "cc 99"},
    ],
)
def test_key_changes_with_what_the_kernel_depends_on(change: dict) -> None:  # type: ignore[type-arg]
    assert _key(**change) != _key()


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((4, 5), dtype=np.float32), rng.random((5, 6), dtype=np.float32)


def test_second_engine_loads_from_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    A, B = _inputs()
    first = tcpy.ExecutionEngine("cpu")
    first.define(MATMUL)
    first.mm(A, B)
    assert first.stats.compiles == 1
    second = tcpy.ExecutionEngine("cpu")
    second.define(MATMUL)
    np.testing.assert_allclose(second.mm(A, B), A @ B, rtol=1e-5)
    assert (second.stats.compiles, second.stats.disk_hits) == (0, 1)
    second.mm(A, B)
    assert second.stats.memory_hits == 1


def _entries(root: Path) -> list[Path]:
    return [p for p in (root / "v1").glob("??/*") if p.is_dir()]


def _rewrite_meta(entry: Path, **changes: object) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, **changes}))


def _damage(entry: Path, damage: str) -> None:
    library = entry / "kernel.so"
    meta = json.loads((entry / "meta.json").read_text())
    match damage:
        case "truncate":
            library.write_bytes(library.read_bytes()[:100])
        case "delete":
            library.unlink()
        case "meta":
            (entry / "meta.json").write_text("{ not json")
        case "meta-is-a-list":
            (entry / "meta.json").write_text("[]")
        case "files-is-a-list":
            _rewrite_meta(entry, files=[])
        case "files-empty-garbage-library":
            library.write_bytes(b"not a library")
            _rewrite_meta(entry, files={})
        case "library-not-listed":
            _rewrite_meta(entry, files={"kernel.c": meta["files"]["kernel.c"]})
        case "extra-file-listed":
            (entry / "other").write_text("x")
            digest = hashlib.sha256(b"x").hexdigest()
            _rewrite_meta(entry, files={**meta["files"], "other": digest})
        case "wrong-key":
            _rewrite_meta(entry, key="0" * 64)
        case "entry-is-a-file":
            shutil.rmtree(entry)
            entry.write_text("in the way")
        case "entry-is-a-symlink":
            intact = entry.parent.parent / "elsewhere"
            entry.rename(intact)
            entry.symlink_to(intact)
        case "entry-writable-by-others":
            entry.chmod(0o770)


DAMAGES = [
    "truncate", "delete", "meta", "meta-is-a-list", "files-is-a-list",
    "files-empty-garbage-library", "library-not-listed", "extra-file-listed", "wrong-key",
    "entry-is-a-file", "entry-is-a-symlink", "entry-writable-by-others",
]  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_entry_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    # The entry is built by another process: damaging a library that this process has
    # loaded would crash it, as for any program whose loaded code is overwritten.
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    A, B = _inputs()
    _finish(_process(tmp_path, shapes="4"))
    (entry,) = _entries(tmp_path)
    _damage(entry, damage)
    again = tcpy.ExecutionEngine("cpu")
    again.define(MATMUL)
    np.testing.assert_allclose(again.mm(A, B), A @ B, rtol=1e-5)
    assert (again.stats.compiles, again.stats.disk_hits) == (1, 0)
    assert not entry.is_symlink() and stat.S_IMODE(entry.stat().st_mode) == 0o700
    meta = json.loads((entry / "meta.json").read_text())
    assert set(meta["files"]) == {"kernel.c", "kernel.so", "built.json"}
    later = tcpy.ExecutionEngine("cpu")  # and the rebuilt entry serves the next engine
    later.define(MATMUL)
    later.compile("mm", A, B)
    assert (later.stats.compiles, later.stats.disk_hits) == (0, 1)


def test_library_that_does_not_load_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hashes match (the damage happened before the entry was sealed), ctypes refuses it.
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    A, B = _inputs()
    _finish(_process(tmp_path, shapes="4"))
    (entry,) = _entries(tmp_path)
    (entry / "kernel.so").write_bytes(b"not a library")
    meta = json.loads((entry / "meta.json").read_text())
    digest = hashlib.sha256(b"not a library").hexdigest()
    _rewrite_meta(entry, files={**meta["files"], "kernel.so": digest})
    again = tcpy.ExecutionEngine("cpu")
    again.define(MATMUL)
    np.testing.assert_allclose(again.mm(A, B), A @ B, rtol=1e-5)
    assert (again.stats.compiles, again.stats.disk_hits) == (1, 0)
    assert (entry / "kernel.so").read_bytes() != b"not a library"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_cache_directories_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    engine.mm(*_inputs())
    (entry,) = _entries(root)
    for path in (root, root / "v1", root / "v1" / "tmp", entry.parent, entry):
        assert _mode(path) == 0o700


def _compile_twice() -> tuple[tcpy.ExecutionEngine, list[str]]:
    """An engine with two kernels on the cpu target, checked, and the TCWarnings that
    opening its cache and compiling raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = tcpy.ExecutionEngine("cpu")
        engine.define(MATMUL)
        for n in (3, 5):  # the shapes of `_prefill`
            A, B = np.ones((n, 5), np.float32), np.full((5, n), 2, np.float32)
            np.testing.assert_allclose(engine.mm(A, B), A @ B)
    return engine, [str(w.message) for w in caught if issubclass(w.category, TCWarning)]


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_users_own_root_keeps_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    # The user's directory is left as it is; what tcpy reads lives in a private v1/,
    # which is enough even when others may write the root (they cannot replace v1's
    # contents, and a v1 of theirs is refused).
    root = tmp_path / "mine"
    root.mkdir()
    root.chmod(mode)
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    first, warned = _compile_twice()
    second, _ = _compile_twice()
    assert warned == [] and (first.stats.compiles, second.stats.disk_hits) == (2, 2)
    assert _mode(root) == mode and _mode(root / "v1") == 0o700


def _prefill(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process: a subprocess would key by the tcpy sources as they are now, and
    # this process by the sources it hashed first.
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    engine, _ = _compile_twice()
    assert engine.stats.compiles + engine.stats.disk_hits == 2


def _refuse(root: Path, where: str, how: str) -> list[Path]:
    """Make others control the root, v1, or every shard; returns those directories."""
    paths = {"root": [root], "v1": [root / "v1"], "shard": [e.parent for e in _entries(root)]}
    for path in paths[where]:
        if how == "writable":
            path.chmod(0o777 if where != "shard" else 0o770)
        else:
            os.chown(path, NOBODY, -1)
    return paths[where]


NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")


@pytest.mark.parametrize(
    ("where", "how"),
    [
        ("v1", "writable"),
        ("shard", "writable"),
        pytest.param("root", "writable", marks=as_root),  # and owned by someone else
        pytest.param("root", "owned", marks=as_root),
        pytest.param("v1", "owned", marks=as_root),
        pytest.param("shard", "owned", marks=as_root),
    ],
)
def test_directory_others_control_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, how: str
) -> None:
    root = tmp_path / "cache"
    _prefill(root, monkeypatch)
    if where == "root" and how == "writable":
        os.chown(root, NOBODY, -1)
    paths = _refuse(root, where, how)
    before = sorted(p.name for p in root.rglob("*"))
    engine, warned = _compile_twice()
    # Nothing was read from it (the kernels were built again), nothing written to it.
    assert (engine.stats.compiles, engine.stats.disk_hits) == (2, 0)
    assert sorted(p.name for p in root.rglob("*")) == before
    (message,) = warned
    assert any(str(p) in message for p in paths) and "will not use it" in message
    fragment = "writable by other users" if how == "writable" else "owned by another user"
    if where == "root" and how == "writable":
        fragment = "owned by another user"
    assert fragment in message


@pytest.mark.parametrize("layout", ["root-is-a-file", "root-under-a-file"])
def test_unusable_root_means_no_disk_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    (tmp_path / "file").write_text("in the way")
    root = tmp_path / "file" if layout == "root-is-a-file" else tmp_path / "file" / "cache"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    engine, warned = _compile_twice()
    assert engine.stats.compiles == 2
    (message,) = warned
    assert str(root) in message and "not cached on disk" in message


def _reachable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


@pytest.fixture
def unprivileged(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory of the test's user, with file modes in force: root ignores them, so
    as root the test body runs with the effective uid of nobody. The system temp dir is
    redirected there too (kernels built without a cache go to it)."""
    root = os.geteuid() == 0
    parent = Path(tempfile.gettempdir())
    if root and not _reachable_by_others(parent):  # a private TMPDIR
        parent = Path("/tmp")
        if not _reachable_by_others(parent):
            pytest.skip("no directory that nobody can reach")
    # Import what compiling imports while its files are readable (and what the tests'
    # inputs do: numpy.random imports on first use), and let the process make its own
    # files (tcpy's OpenMP runtime, removed at exit) before the temporary directory
    # moves, whichever test of this worker ran first.
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    _compile_twice()
    _inputs()
    base = Path(tempfile.mkdtemp(prefix="cache-test-", dir=parent))
    scratch = base / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("TMPDIR", str(scratch))
    if root:
        for path in (base, scratch):
            os.chown(path, NOBODY, NOBODY)
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
    try:
        yield base
    finally:
        if root:
            os.seteuid(0)
            os.setegid(0)
        shutil.rmtree(base, ignore_errors=True)


def _tcpy_temporaries() -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob("tcpy-*"))


@pytest.mark.parametrize("variable", ["HOME", "XDG_CACHE_HOME", "TCPY_CACHE_DIR"])
def test_read_only_location_means_no_disk_cache(
    unprivileged: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    read_only = unprivileged / "read-only"
    read_only.mkdir(mode=0o555)
    for name in ("TCPY_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(read_only))
    engine, warned = _compile_twice()
    assert engine.stats.compiles == 2
    (message,) = warned
    assert str(read_only) in message and "not cached on disk" in message
    assert _tcpy_temporaries() == []


def test_cache_that_turns_read_only_builds_in_temporary_directories(
    unprivileged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = unprivileged / "cache"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    A, B = _inputs()
    engine.mm(A, B)  # cached
    for path in (root / "v1" / "tmp", root / "v1"):
        path.chmod(0o500)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 5, 8):
            A, B = np.ones((n, 5), np.float32), np.ones((5, 6), np.float32)
            np.testing.assert_allclose(engine.mm(A, B), A @ B)
    (message,) = [str(w.message) for w in caught if issubclass(w.category, TCWarning)]
    assert str(root) in message and "temporary directory" in message
    assert engine.stats.compiles == 4
    assert _tcpy_temporaries() == []


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_cache_off_leaves_no_temporary_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    # The process's own files (tcpy's copy of the OpenMP runtime, the emulator's
    # precompiled header) are made once, in directories removed at its exit
    # (`test_process_without_cache_leaves_no_temporary_directories`): made before the
    # temporary directory moves, whichever test of this worker ran first.
    warm = tcpy.ExecutionEngine(target)
    warm.define(MATMUL)
    warm.mm(np.ones((2, 5), np.float32), np.ones((5, 6), np.float32))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = tcpy.ExecutionEngine(target)
    engine.define(MATMUL)
    kernels = []
    for n in (3, 5, 8):
        A, B = np.ones((n, 5), np.float32), np.ones((5, 6), np.float32)
        kernels.append((engine.compile("mm", A, B), A, B))
    assert _tcpy_temporaries() == []
    for kernel, A, B in kernels:  # the loaded kernels outlive their files
        np.testing.assert_allclose(kernel(A, B), A @ B)
        assert "mm" in kernel.source or "C[" in kernel.source


def test_process_without_cache_leaves_no_temporary_directories(tmp_path: Path) -> None:
    # The cuda target reads its files after compiling: they go at interpreter exit.
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import tcpy
        for target in ("cpu", "cuda-emu", "cuda"):
            engine = tcpy.ExecutionEngine(target)
            engine.define(sys.argv[1])
            engine.compile("mm", np.ones((3, 5), np.float32), np.ones((5, 6), np.float32))
        """
    )
    env = {**os.environ, "TCPY_CACHE_DIR": "off", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script, MATMUL], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.glob("tcpy-*")) == []


def test_disk_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    A, B = _inputs()
    np.testing.assert_allclose(engine.mm(A, B), A @ B, rtol=1e-5)
    assert engine.stats.compiles == 1


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tcpy
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(sys.argv[1])
    results = []
    for n in map(int, sys.argv[2].split(",")):
        A = np.full((n, 5), 1, np.float32)
        B = np.full((5, 6 if n == 4 else n), 2, np.float32)
        results.append(float(engine.mm(A, B).sum()))
    print(json.dumps({"compiles": engine.stats.compiles, "disk": engine.stats.disk_hits,
                      "results": results}))
    """
)


def _process(cache: Path, shapes: str = "3,5,8") -> subprocess.Popen[str]:
    env = {**os.environ, "TCPY_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, MATMUL, shapes], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> dict:  # type: ignore[type-arg]
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out)


EXPECTED = [float(n * n * 10) for n in (3, 5, 8)]


def test_second_process_compiles_nothing(tmp_path: Path) -> None:
    first = _finish(_process(tmp_path))
    assert first["compiles"] == 3 and first["results"] == EXPECTED
    second = _finish(_process(tmp_path))
    assert (second["compiles"], second["disk"]) == (0, 3)
    assert second["results"] == EXPECTED


def test_concurrent_processes_share_one_cache(tmp_path: Path) -> None:
    procs = [_process(tmp_path) for _ in range(4)]
    reports = [_finish(p) for p in procs]
    assert all(r["results"] == EXPECTED for r in reports)
    assert len(_entries(tmp_path)) == 3  # one entry per shape, whoever built it
    assert not list((tmp_path / "v1" / "tmp").iterdir())  # no staging left behind
    late = _finish(_process(tmp_path))
    assert late["compiles"] == 0
