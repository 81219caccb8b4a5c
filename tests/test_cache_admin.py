"""Managing the disk cache: what `meta.json` records, `tcpy cache info|clear|prune`, the
last-use stamp and the size cap (`TCPY_CACHE_MAX_MB`). Every test fills a cache of its
own with real `cpu` compiles and checks what is on disk afterwards."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.cache import DiskCache, TunedStore, admin, tcpy_version
from tcpy.cli import main
from tcpy.errors import TCError
from tcpy.mapping.options import MappingOptions

ADD = "def add(float(N) A) -> (B) { B(i) = A(i) + 1 }"
DAY = 86400.0


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TCPY_CACHE_DIR", str(root))
    monkeypatch.delenv("TCPY_CACHE_MAX_MB", raising=False)
    return root


def _compile(*sizes: int, options: MappingOptions | None = None) -> tcpy.ExecutionEngine:
    """An engine on the `cpu` target that ran `add` on inputs of each size."""
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(ADD)
    for n in sizes:
        A = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(engine.run("add", A, options=options), A + 1)
    return engine


def _entries(root: Path) -> dict[int, Path]:
    """The entries on disk, by the size of their input (as their meta.json says)."""
    found = {}
    for meta in (root / "v1").glob("??/*/meta.json"):
        (((n,), _),) = json.loads(meta.read_text())["inputs"]
        found[n] = meta.parent
    return found


def _all_entries(root: Path) -> list[Path]:
    return list((root / "v1").glob("??/*"))


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _rewrite_meta(entry: Path, drop: tuple[str, ...] = (), **changes: object) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    meta = {k: v for k, v in {**meta, **changes}.items() if k not in drop}
    (entry / "meta.json").write_text(json.dumps(meta))


def _used(entry: Path, seconds_ago: float) -> None:
    stamp = time.time() - seconds_ago
    os.utime(entry / "meta.json", (stamp, stamp))


def _tuned(root: Path, key: str, version: str) -> Path:
    """A tuned record as `engine.store_tuned` writes it (through the tuned store)."""
    record = {"options": MappingOptions.cpu().to_dict(), "tcpy": version, "entry": "add"}
    TunedStore(DiskCache(root)).put(key, record)
    path = root / "tuned" / "v1" / f"{key}.json"
    assert path.is_file()
    return path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["cache", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# --- meta.json ----------------------------------------------------------------------------


def test_meta_records_version_def_target_and_inputs(root: Path) -> None:
    _compile(3)
    _compile(4, options=MappingOptions.cpu().replace(fix_parameters_before_scheduling=False))
    metas = [json.loads((e / "meta.json").read_text()) for e in _all_entries(root)]
    by_inputs = {json.dumps(m["inputs"]): m for m in metas}
    assert set(by_inputs) == {'[[[3], "float32"]]', '[[["*"], "float32"]]'}
    for meta in metas:
        assert (meta["tcpy"], meta["def"], meta["target"]) == (tcpy_version(), "add", "cpu")


def test_entry_without_the_new_fields_still_loads(root: Path) -> None:
    _compile(3)
    (entry,) = _all_entries(root)
    _rewrite_meta(entry, drop=("tcpy", "def", "target", "device", "inputs"))
    engine = _compile(3)
    assert (engine.stats.compiles, engine.stats.disk_hits) == (0, 1)
    info = admin.info(root)
    assert [(g.version, g.count) for g in info.groups] == [(admin.UNKNOWN, 1)]


# --- info ---------------------------------------------------------------------------------


def test_info_counts_entries_and_bytes_by_version(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _compile(3, 4, 5)
    entries = _entries(root)
    _rewrite_meta(entries[4], tcpy="0ld0ld0ld0ld0ld0")
    _rewrite_meta(entries[5], drop=("tcpy",))
    tuned = _tuned(root, "k" * 64, tcpy_version())
    sizes = {n: _du(e) for n, e in entries.items()}

    info = admin.info(root)
    assert (info.root, info.count, info.size) == (root, 3, sum(sizes.values()))
    assert [(g.version, g.count, g.size) for g in info.groups] == [
        (tcpy_version(), 1, sizes[3]),
        ("0ld0ld0ld0ld0ld0", 1, sizes[4]),
        (admin.UNKNOWN, 1, sizes[5]),
    ]
    assert (info.tuned_count, info.tuned_size) == (1, tuned.stat().st_size)

    status, out, _ = _cli(capsys, "info")
    assert status == 0
    assert f"cache directory: {root}" in out
    assert "compiled kernels: 3 entries" in out
    assert f"this tcpy ({tcpy_version()}): 1 entry" in out
    assert "tcpy 0ld0ld0ld0ld0ld0: 1 entry" in out
    assert "unknown version: 1 entry" in out
    assert "tuned options: 1 record" in out


def test_info_of_a_missing_cache_creates_nothing(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _cli(capsys, "info")
    assert status == 0
    assert "compiled kernels: 0 entries, 0 B" in out
    assert not root.exists()


def test_cache_off_info_says_so_and_clear_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    status, out, _ = _cli(capsys, "info")
    assert (status, out.strip()) == (0, "the disk cache is off (TCPY_CACHE_DIR=off)")
    for command in (["clear"], ["prune", "--other-versions"]):
        status, _, err = _cli(capsys, *command)
        assert status == 1
        assert "error: the disk cache is off" in err


# --- clear --------------------------------------------------------------------------------


def test_clear_removes_entries_and_keeps_tuned_options_unless_asked(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _compile(3, 4)
    tuned = _tuned(root, "k" * 64, tcpy_version())
    size = sum(_du(e) for e in _all_entries(root))

    status, out, _ = _cli(capsys, "clear", "--dry-run")
    assert status == 0
    assert out.startswith("would remove 2 compiled entries")
    assert len(_all_entries(root)) == 2

    status, out, _ = _cli(capsys, "clear")
    assert status == 0
    assert f"removed 2 compiled entries ({size / 1000:.1f} kB)" in out
    assert "kept 1 tuned record (--tuned removes them too)" in out
    assert _all_entries(root) == []
    assert tuned.is_file()
    assert list((root / "v1" / "tmp").iterdir()) == []  # removed, not left in the trash

    status, out, _ = _cli(capsys, "clear", "--tuned")
    assert status == 0
    assert "and 1 tuned record" in out
    assert not tuned.exists()
    # the cache still works after a clear
    assert _compile(3).stats.compiles == 1
    assert len(_all_entries(root)) == 1


def test_clear_never_follows_a_symlinked_entry(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _compile(3)
    (entry,) = _all_entries(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    link = entry.parent / ("f" * 64)
    link.symlink_to(outside, target_is_directory=True)
    status, out, _ = _cli(capsys, "clear")
    assert status == 0
    assert "removed 2 compiled entries" in out
    assert not os.path.lexists(link)
    assert (outside / "precious").read_text() == "keep me"


def test_a_symlinked_shard_is_refused_and_left_alone(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _compile(3)
    outside = tmp_path / "outside"
    (outside / ("e" * 64)).mkdir(parents=True)
    (root / "v1" / "ee").symlink_to(outside, target_is_directory=True)
    status, _, err = _cli(capsys, "clear")
    assert status == 1
    assert "is a symbolic link" in err
    assert (outside / ("e" * 64)).is_dir()


# --- prune --------------------------------------------------------------------------------


def test_prune_other_versions(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _compile(3, 4, 5)
    entries = _entries(root)
    _rewrite_meta(entries[4], tcpy="0ld0ld0ld0ld0ld0")
    _rewrite_meta(entries[5], drop=("tcpy",))
    current = _tuned(root, "a" * 64, tcpy_version())
    old = _tuned(root, "b" * 64, "0ld0ld0ld0ld0ld0")

    status, out, _ = _cli(capsys, "prune", "--other-versions")
    assert status == 0
    assert "removed 2 compiled entries" in out
    assert set(_entries(root)) == {3}
    assert current.is_file() and old.is_file()

    status, out, _ = _cli(capsys, "prune", "--other-versions", "--tuned")
    assert status == 0
    assert "removed 0 compiled entries (0 B) and 1 tuned record" in out
    assert current.is_file() and not old.exists()
    assert set(_entries(root)) == {3}


def test_prune_older_than(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _compile(3, 4, 5)
    entries = _entries(root)
    _used(entries[3], 40 * DAY)
    _used(entries[4], 2 * DAY)
    tuned = _tuned(root, "a" * 64, tcpy_version())
    stamp = time.time() - 40 * DAY
    os.utime(tuned, (stamp, stamp))

    status, out, _ = _cli(capsys, "prune", "--older-than", "30d", "--dry-run")
    size = _du(entries[3]) / 1000
    assert status == 0
    assert out.splitlines()[0] == f"would remove 1 compiled entry ({size:.1f} kB) from {root}"
    assert set(_entries(root)) == {3, 4, 5}

    status, out, _ = _cli(capsys, "prune", "--older-than", "30d")
    assert status == 0
    assert set(_entries(root)) == {4, 5}
    assert tuned.is_file()

    status, out, _ = _cli(capsys, "prune", "--older-than", "36h", "--tuned")
    assert status == 0
    assert "removed 1 compiled entry" in out and "and 1 tuned record" in out
    assert set(_entries(root)) == {5}
    assert not tuned.exists()


def test_a_lookup_stamps_the_entrys_last_use(root: Path) -> None:
    _compile(3)
    (entry,) = _all_entries(root)
    _used(entry, 40 * DAY)
    assert _compile(3).stats.disk_hits == 1
    assert (entry / "meta.json").stat().st_mtime > time.time() - 3600
    admin.prune(root, older_than=30 * DAY)
    assert _all_entries(root) == [entry]


@pytest.mark.parametrize("age", ["soon", "30", "d", "-1d", "3 days", "1y"])
def test_a_bad_age_is_a_clear_error(
    root: Path, capsys: pytest.CaptureFixture[str], age: str
) -> None:
    _compile(3)
    status, _, err = _cli(capsys, "prune", f"--older-than={age}")
    assert status == 1
    assert "error: --older-than expects an age such as 30d, 12h or 90m" in err
    assert repr(age) in err
    assert len(_all_entries(root)) == 1


def test_ages() -> None:
    assert admin.parse_age("30d") == 30 * DAY
    assert admin.parse_age("12h") == 12 * 3600
    assert admin.parse_age("1.5w") == 10.5 * DAY
    assert admin.parse_age("90m") == 90 * 60


def test_prune_needs_a_reason(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _compile(3)
    status, _, err = _cli(capsys, "prune")
    assert status == 1
    assert "prune needs --other-versions, --older-than AGE, or both" in err
    assert len(_all_entries(root)) == 1


# --- the size cap -------------------------------------------------------------------------


def test_the_cap_removes_the_least_recently_used_first(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _compile(3, 4, 5)
    entries = _entries(root)
    _used(entries[3], 300)
    _used(entries[4], 200)
    _used(entries[5], 100)
    assert _compile(3).stats.disk_hits == 1  # 3 is now the most recently used: 4 the least
    tuned = _tuned(root, "a" * 64, "0ld0ld0ld0ld0ld0")
    sizes = {n: _du(e) for n, e in entries.items()}
    # room for three entries of about this size, not four
    cap = sizes[3] + sizes[5] + 1.5 * max(sizes.values())
    monkeypatch.setenv("TCPY_CACHE_MAX_MB", repr(cap / 1e6))
    _compile(6)
    assert set(_entries(root)) == {3, 5, 6}
    assert tuned.is_file()
    assert sum(_du(e) for e in _all_entries(root)) <= cap

    # a cap smaller than one entry keeps only the entry just stored
    monkeypatch.setenv("TCPY_CACHE_MAX_MB", "0.000001")
    engine = _compile(7)
    assert set(_entries(root)) == {7}
    assert tuned.is_file()
    assert engine.stats.compiles == 1


def test_no_cap_keeps_everything(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCPY_CACHE_MAX_MB", "0")
    _compile(3, 4)
    assert set(_entries(root)) == {3, 4}


@pytest.mark.parametrize("value", ["lots", "-1", "nan", "inf", "1e"])
def test_a_bad_cap_is_a_clear_error(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    monkeypatch.setenv("TCPY_CACHE_MAX_MB", value)
    with pytest.raises(TCError, match=f"TCPY_CACHE_MAX_MB={value!r}: the cache size cap must"):
        tcpy.ExecutionEngine("cpu")
    status, _, err = _cli(capsys, "info")
    assert status == 1
    assert "TCPY_CACHE_MAX_MB" in err
