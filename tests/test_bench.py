"""Smoke tests of the benchmark scripts (bench/): each runs with `--smoke` (its kernels
once, at small sizes) on one or two kernels, in a process of its own as a user runs it,
and what it wrote is checked: one JSON file tagged `smoke` and marked `"smoke": true`,
the rows asked for, finite positive times, and results close to NumPy's or PyTorch's
where the script compares them. What is timed is not judged: these tests only see that
every benchmark still runs, so that none can stop working unseen.

Scripts that need a GPU run here on their CPU stand-ins (`gpu.py --emulate`,
`overhead.py --fake-gpu`); `gpu.py` and `gpu_variants.py` themselves run in the `gpu`
tests, and without a GPU their arguments are parsed and their kernels built (below).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import tcpy
from tcpy.mapping.gpu.device import named
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import nvrtc

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (the cuda extra)")

# every script with a `main`: each is run by a test below (overhead_gpu.py through
# overhead.py's --fake-gpu and --gpu)
SCRIPTS = {
    "autodiff.py", "bert.py", "cpu.py", "emu_profile.py", "gpu.py", "gpu_variants.py", "half.py",
    "online.py", "overhead.py", "overhead_gpu.py", "ptx_stats.py", "tune.py",
}  # fmt: skip


def smoke(tmp_path: Path, script: str, *args: str) -> dict[str, Any]:
    """Run `bench/<script> --smoke <args>` writing to a fresh folder, and the JSON it
    wrote there: its only one, tagged and marked as a smoke run's. Temporary files
    (the fresh kernel caches cpu.py and tune.py make) go under `tmp_path`."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", "--out", str(out), *args],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    (path,) = out.glob("*.json")
    assert path.stem.endswith("-smoke"), path.name
    assert all(p.stem.endswith("-smoke") for p in out.iterdir()), sorted(out.iterdir())
    result: dict[str, Any] = json.loads(path.read_text())
    assert result["smoke"] is True
    return result


def positive(*values: Any) -> bool:
    """Whether every value is a finite number above 0."""
    return all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values)


def times(row: dict[str, Any]) -> list[Any]:
    """The row's times (its `*_ms` and `*_us` fields)."""
    return [v for k, v in row.items() if k.endswith(("_ms", "_us"))]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`bench(name)`: the module `bench/<name>.py`, imported as the scripts import it."""
    monkeypatch.syspath_prepend(str(ROOT))

    def load(name: str) -> ModuleType:
        return importlib.import_module(f"bench.{name}")

    return load


def smoke_sized(bench: Any, name: str) -> Any:
    """The suite's kernel `name` at the smoke sizes."""
    suite = bench("suite")
    return suite.smoke_sized(next(k for k in suite.SUITE if k.name == name))


def smoke_sizes(bench: Any, name: str) -> dict[str, int]:
    return dict(smoke_sized(bench, name).sizes)


def test_every_script_has_a_smoke_test() -> None:
    """A new benchmark script comes with its smoke test (and a name in SCRIPTS)."""
    scripts = {p.name for p in BENCH.glob("*.py") if re.search(r"^def main\(", p.read_text(), re.M)}
    assert scripts == SCRIPTS


def test_cpu(tmp_path: Path, bench: Any) -> None:
    """A suite kernel and the matmul sweep's, with the size-generic kernel beside."""
    result = smoke(tmp_path, "cpu.py", "--only", "softmax,matmul_64", "--generic")
    assert positive(result["machine"]["fma_peak_gflops"], result["machine"]["copy_bandwidth_gbps"])
    assert result["runs"]["rounds"] == 1
    softmax, matmul = result["kernels"]
    assert (softmax["kernel"], matmul["kernel"]) == ("softmax", "matmul_64")
    assert softmax["sizes"] == smoke_sizes(bench, "softmax")
    assert matmul["sizes"] == {"M": 64, "K": 64, "N": 64}
    for row in result["kernels"]:
        assert positive(*times(row), row["compile_s"], row["ratio_vs_best"])
        assert {"tcpy_ms", "tcpy_kernel_ms", "numpy_ms", "tcpy_generic_ms"} <= set(row)
        assert row["max_rel_error"] < 1e-4
        assert row["generic"] is True and row["compiles_for_a_new_shape"] >= 0


def test_cpu_users_interleaved(tmp_path: Path) -> None:
    """Kernels of bench/users.py, each also timed right after a NumPy call (and NumPy's
    right after tcpy's), at every thread count, each library's calls one at a time,
    and, with PyTorch, alternating with PyTorch's call."""
    result = smoke(tmp_path, "cpu.py", "--users", "--interleaved", "--only", "gemm,mvt")
    assert [row["kernel"] for row in result["kernels"]] == ["mvt", "gemm"]  # users.py's order
    for row in result["kernels"]:
        assert row["max_rel_error"] < 1e-4 and max(row["sizes"].values()) <= 48
        mixed = row["interleaved"]
        counts = {"chosen", *(str(t) for t in range(1, result["machine"]["cores"] + 1))}
        assert set(mixed["tcpy_after_numpy_ms"]) == counts
        assert positive(*mixed["tcpy_after_numpy_ms"].values(), mixed["numpy_after_tcpy_ms"])
        assert positive(mixed["tcpy_over_quiet"], mixed["numpy_over_quiet"])
        assert positive(mixed["tcpy_sporadic_ms"], mixed["numpy_sporadic_over_quiet"])
        if importlib.util.find_spec("torch") is not None:
            assert positive(mixed["tcpy_after_torch_ms"], mixed["torch_after_tcpy_ms"])
            assert positive(mixed["tcpy_over_quiet_beside_torch"], mixed["torch_over_quiet"])
    assert positive(result["summary"]["interleaved_numpy_over_quiet_worst"])


def test_cpu_convs(tmp_path: Path) -> None:
    """The convolution shapes (`bench.suite.conv_sweep`), strided and 1x1 among them, at
    smoke sizes, in a file of their own, checked against NumPy and timed beside PyTorch."""
    names = "conv3x3_56_64,conv3x3s2_28_128,conv1x1_28_64"
    result = smoke(tmp_path, "cpu.py", "--convs", "--only", names)
    assert [row["kernel"] for row in result["kernels"]] == names.split(",")
    (path,) = (tmp_path / "out").glob("*.json")
    assert path.name.startswith("cpu-") and "-convs" in path.name
    for row in result["kernels"]:
        assert row["max_rel_error"] < 1e-4 and positive(*times(row))
        assert row["sizes"]["C"] == 8 and row["sizes"]["H"] == 11
        if importlib.util.find_spec("torch") is not None:
            assert positive(row["torch_ms"], row["ratio_vs_torch"])


def test_tune(tmp_path: Path, bench: Any) -> None:
    """A tuning session, the default and tuned kernels side by side (checked against
    NumPy by the script), one seed of genetic against random search, and the plot."""
    pytest.importorskip("matplotlib")
    result = smoke(tmp_path, "tune.py", "--only", "softmax", "--versus", "softmax")
    (row,) = result["kernels"]
    assert row["kernel"] == "softmax" and row["sizes"] == smoke_sizes(bench, "softmax")
    assert positive(*times(row), row["speedup"], row["trials"])
    (versus,) = result["ga_vs_random"]
    assert len(versus["runs"]) == 1
    assert positive(versus["ga_median_ms"], versus["random_median_ms"])
    assert (tmp_path / "out" / "tune-softmax-smoke.png").stat().st_size > 0


def test_half(tmp_path: Path) -> None:
    """A memory-bound kernel in bfloat16 beside float32 (and PyTorch, when installed)."""
    result = smoke(tmp_path, "half.py", "--only", "gelu", "--types", "bfloat16")
    (row,) = result["rows"]
    assert (row["kernel"], row["type"]) == ("gelu", "bfloat16")
    assert positive(*times(row), row["half_over_float32_speed"], result["copy_bandwidth_gbps"])
    assert row["max_error_of_largest"] < 2e-2  # a few bfloat16 ulps


def test_online(tmp_path: Path) -> None:
    """The online rewrite's defs at tiny sizes, each off and tiled (and PyTorch's when
    installed), the tiled results close to the untiled ones."""
    result = smoke(tmp_path, "online.py", "--only", "lse,attention")
    rows = {row["def"]: row for row in result["rows"]}
    assert set(rows) == {"lse", "attention"}
    for row in rows.values():
        assert positive(*times(row)) and len(times(row)) >= 2
        errors = [v for k, v in row.items() if k.endswith("_error_of_largest")]
        assert errors and all(0 <= e < 1e-5 for e in errors), row


def test_bert(tmp_path: Path) -> None:
    """The whole layer as one def and the attention block, in float32 and bfloat16 at
    a tiny size, each against PyTorch eager (and SDPA for the attention)."""
    pytest.importorskip("torch")
    result = smoke(tmp_path, "bert.py", "--only", "attention,layer", "--batches", "2")
    rows = {(row["block"], row["type"]): row for row in result["rows"]}
    assert set(rows) == {(b, t) for b in ("attention", "layer") for t in ("float32", "bfloat16")}
    for (block, ty), row in rows.items():
        assert positive(row["tcpy_ms"], row["eager_ms"], row["compile_ms"], row["least_bytes"])
        assert row["max_error_of_largest"] < (1e-5 if ty == "float32" else 3e-2), (block, ty)
    assert positive(rows["attention", "float32"]["sdpa_ms"])
    emulated = result["attention_on_emulator"]
    assert emulated["launches"] >= 1 and emulated["global_bytes"] >= emulated["least_bytes"]


@pytest.mark.parametrize(
    "script",
    [["emu_profile.py"], ["gpu.py", "--emulate"]],
    ids=["emu_profile.py", "gpu.py-emulate"],
)
def test_emulator_profile(tmp_path: Path, script: list[str]) -> None:
    """The emulator's profile (checked against NumPy by the script), alone or as
    `gpu.py --emulate`, the CPU stand-in for the GPU benchmark."""
    result = smoke(tmp_path, *script, "--only", "softmax,matmul")
    assert [row["kernel"] for row in result["kernels"]] == ["matmul", "softmax"]
    for row in result["kernels"]:
        assert row["launches"] and row["gpu_size_grids"]
        assert positive(row["minimum_bytes"], row["moved_x"], row["dram_x"])
        assert row["moved_bytes"] >= row["minimum_bytes"]
        assert all(positive(g["blocks"]) for g in row["gpu_size_grids"])


def test_overhead(tmp_path: Path) -> None:
    """The call paths of a 16-element kernel on the CPU, and the import times."""
    result = smoke(tmp_path, "overhead.py")
    assert result["rounds"] == 1
    assert result["paths"]
    assert positive(result["direct_call_us"], *(row["call_us"] for row in result["paths"]))
    assert positive(result["import_tcpy_s"], result["import_engine_define_s"])


@needs_nvrtc
def test_overhead_fake_gpu(tmp_path: Path) -> None:
    """Steady GPU calls on the tests' fake driver (`tests/fake_gpu.py`), the stand-in
    for `overhead.py --gpu`: the CUDA is compiled by NVRTC, the kernels do nothing."""
    result = smoke(tmp_path, "overhead.py", "--fake-gpu")
    assert [row["call"] for row in result["paths"]] == ["add: 1 kernel", "norm: 3 kernels"]
    for row in result["paths"]:
        assert positive(row["python_us"], row["driver_calls_per_call"]["launch"])
    assert positive(result["cpu_numpy_add_us"])


@needs_nvrtc
def test_ptx_stats(tmp_path: Path, bench: Any) -> None:
    """A contraction's PTX counted and ptxas's report read (NVRTC, no GPU)."""
    result = smoke(tmp_path, "ptx_stats.py", "--only", "matmul")
    (row,) = result["results"]
    assert row["kernel"] == "matmul" and row["sizes"] == smoke_sizes(bench, "matmul")
    assert row["kernels"]
    for counts in row["kernels"].values():
        assert positive(counts["registers"])
        assert all(v >= 0 for k, v in counts.items() if k != "matrix")


def test_autodiff(tmp_path: Path) -> None:
    """A layer's forward and backward against PyTorch eager, the operator's overhead,
    and both models trained a few steps; `torch.compile` is left out (its first compile
    takes tens of seconds)."""
    pytest.importorskip("torch")
    result = smoke(tmp_path, "autodiff.py", "--only", "softmax", "--no-compile")
    (row,) = result["layers"]
    assert row["layer"] == "softmax"
    assert positive(*times(row), row["ratio_vs_eager"], row["backward_instances_over_forward"])
    assert row["max_rel_error"] < 1e-4
    over = result["overhead_us"]
    assert positive(*(v for k, v in over.items() if k != "torch_op_over_kernel"))
    trained = {(t["model"], t["dtype"]): t for t in result["training"]}
    assert set(trained) == {(m, d) for m in ("mlp", "convnet") for d in ("float64", "float32")}
    for (_, dtype), t in trained.items():
        assert positive(t["tcpy_ms_per_step"], t["torch_ms_per_step"], t["loss_last"])
        assert t["max_rel_loss_difference"] < (1e-5 if dtype == "float64" else 1e-3)


# --- the scripts that need a GPU ------------------------------------------------------------


# (ids that are not "gpu": conftest skips the tests with that keyword where there is no GPU)
@pytest.mark.parametrize("script", ["gpu", "gpu_variants"], ids=["gpu.py", "gpu_variants.py"])
def test_gpu_without_a_gpu(
    tmp_path: Path, bench: Any, capsys: pytest.CaptureFixture[str], script: str
) -> None:
    """Without a GPU, `gpu.py --smoke` and `gpu_variants.py --smoke` parse their
    arguments, say that they measured nothing and write nothing (with one, `test_gpu`
    runs them)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: test_gpu runs the script")
    out = tmp_path / "out"
    assert bench(script).main(["--smoke", "--only", "softmax", "--out", str(out)]) == 1
    assert "no CUDA device" in capsys.readouterr().err
    assert not out.exists()


@needs_nvrtc
def test_gpu_variants_build(bench: Any) -> None:
    """Every option variant `gpu_variants.py` times is a valid change of the CUDA
    defaults, and its kernel at the smoke sizes lowers to CUDA that NVRTC compiles:
    all of that script which runs without a GPU."""
    for name, changes in bench("gpu_variants").VARIANTS.items():
        kernel = smoke_sized(bench, name)
        engine = tcpy.ExecutionEngine("cuda")
        engine.define(kernel.tc)
        for change in changes:
            options = engine.default_options(kernel.entry).replace(**change)
            lowered = lower_to_cuda(
                engine.checked(kernel.entry), kernel.sizes, options, device=named("h100")
            )
            assert ".entry" in nvrtc.compile_ptx(lowered.source, "compute_90", exact=lowered.exact)


GPU_RUNS = {
    "gpu.py": ("--only", "softmax", "--no-torch-compile"),
    "gpu_variants.py": ("--only", "softmax"),
    "overhead.py": ("--gpu",),
    "autodiff.py": ("--only", "softmax", "--device", "cuda", "--no-compile", "--no-train"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("script", sorted(GPU_RUNS))
def test_gpu(tmp_path: Path, script: str) -> None:
    """The scripts on a real GPU, at the smoke sizes: each wrote its rows, timed."""
    pytest.importorskip("torch")
    result = smoke(tmp_path, script, *GPU_RUNS[script])
    if script == "gpu.py":
        (row,) = result["kernels"]
        assert positive(row["torch_eager_ms"], row["cuda"]["ms"], row["cuda"]["device_ms"])
        assert row["cuda"]["max_rel_error"] < 1e-4
    elif script == "gpu_variants.py":
        assert all(positive(row["device_ms"]) for row in result["variants"])
        assert all(row["max_rel_error"] < 1e-4 for row in result["variants"])
    elif script == "overhead.py":
        assert all(positive(row["host_us"]) for row in result["paths"])
        assert positive(result["graph"]["replay_us"])
    else:
        (row,) = result["layers"]
        assert positive(row["tcpy_ms"], row["eager_ms"]) and row["max_rel_error"] < 1e-4
