"""The compile cache: what changes the key and what does not, reuse across engines
and processes, damaged entries, concurrent writers, private directories."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.cache import cache_key
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SIG = [((4, 5), np.dtype(np.float32)), ((5, 6), np.dtype(np.float32))]


def _key(source: str = MM, signature=SIG, options=None, target="cpu", device="d", tools="t"):  # type: ignore[no-untyped-def]
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
        {"source": MM.replace("+=!", "max=!")},
        {"source": MM.replace("float(K,N) B", "double(K,N) B")},
        {"source": MM.replace("A(m,k) * B(k,n)", "A(m,k) + B(k,n)")},
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
    first.define(MM)
    first.mm(A, B)
    assert first.stats.compiles == 1
    second = tcpy.ExecutionEngine("cpu")
    second.define(MM)
    np.testing.assert_allclose(second.mm(A, B), A @ B, rtol=1e-5)
    assert (second.stats.compiles, second.stats.disk_hits) == (0, 1)
    second.mm(A, B)
    assert second.stats.memory_hits == 1


def _entries(root: Path) -> list[Path]:
    return [p for p in (root / "v1").glob("??/*") if p.is_dir()]


@pytest.mark.parametrize("damage", ["truncate", "delete", "meta"])
def test_damaged_entry_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    # The entry is built by another process: damaging a library that this process has
    # loaded would crash it, as for any program whose loaded code is overwritten.
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    A, B = _inputs()
    _finish(_process(tmp_path, shapes="4"))
    (entry,) = _entries(tmp_path)
    library = entry / "kernel.so"
    if damage == "truncate":
        library.write_bytes(library.read_bytes()[:100])
    elif damage == "delete":
        library.unlink()
    else:
        (entry / "meta.json").write_text("{ not json")
    again = tcpy.ExecutionEngine("cpu")
    again.define(MM)
    np.testing.assert_allclose(again.mm(A, B), A @ B, rtol=1e-5)
    assert again.stats.compiles == 1
    meta = json.loads((_entries(tmp_path)[0] / "meta.json").read_text())
    assert set(meta["files"]) == {"kernel.c", "kernel.so"}


def test_cache_directories_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MM)
    engine.mm(*_inputs())
    for path in (root, root / "v1"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_disk_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MM)
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
        [sys.executable, "-c", SCRIPT, MM, shapes], env=env, stdout=subprocess.PIPE,
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
