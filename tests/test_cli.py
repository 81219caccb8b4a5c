"""The tcpy command, run as a newcomer would (a subprocess) and through main()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tcpy.cli import main

ROOT = Path(__file__).parent.parent


def test_run_example_as_in_the_readme() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tcpy.cli", "run", "examples/matmul.tc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    from tcpy.targets import default_target

    assert f"matmul on {default_target()}, sizes M=32, K=32, N=32" in done.stdout
    assert "C: float32[32, 32]  checksum" in done.stdout


def test_run_with_sizes_and_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "two.tc"
    f.write_text(
        "def a(float(N) X) -> (Y) { Y(i) = X(i) }\n"
        "def g(float(E,D) T, int32(B) I) -> (O) { O(b,d) = T(I(b), d) }\n"
    )
    assert main(["run", str(f), "--entry", "g", "--sizes", "E=5,D=3,B=7"]) == 0
    out = capsys.readouterr().out
    assert "O: float32[7, 3]" in out  # gather indices drawn inside 0:E


def test_run_needs_entry_when_ambiguous(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "two.tc"
    f.write_text(
        "def a(float(N) X) -> (Y) { Y(i) = X(i) }\ndef b(float(N) X) -> (Y) { Y(i) = X(i) }"
    )
    assert main(["run", str(f)]) == 1
    assert "choose one with --entry" in capsys.readouterr().err


@pytest.mark.parametrize("sizes", ["M=x", "M", "Q=3"])
def test_bad_sizes(sizes: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ROOT / "examples/matmul.tc"), "--sizes", sizes]) == 1
    assert "error" in capsys.readouterr().err


def test_check_ok_and_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(ROOT / "examples/matmul.tc")]) == 0
    assert "matmul: ok -> C: float32[M, N]" in capsys.readouterr().out
    bad = tmp_path / "bad.tc"
    bad.write_text("def f(float(N) A) -> (B) {\n  B(i) = X(i)\n}\n")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:2:10: unknown tensor or function X" in err
    assert "  B(i) = X(i)\n         ^" in err


def test_check_prints_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "w.tc"
    f.write_text("def f(float(N,M) A) -> (B) { B(i) += A(i,j) }")
    assert main(["check", str(f)]) == 0
    assert "warning: line 1: B is not initialised" in capsys.readouterr().err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "/nonexistent.tc"]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "fragment"), [
    ([], "int tc_kernel("),
    (["--emit", "schedule"], "omp_parallel@"),
    (["--emit", "ast"], "for (int c0"),
    (["--gpu"], '__global__ void __launch_bounds__'),
    (["--gpu", "--emit", "ast"], "S0(32 * b1 + c3, 32 * b0 + t0, c5)"),
])  # fmt: skip
def test_compile_emits(flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["compile", str(ROOT / "examples/matmul.tc"), "--sizes", "M=64,N=64,K=64", *flags])
        == 0
    )
    assert fragment in capsys.readouterr().out


def test_json_options_change_only_their_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`{"unroll": 2}` keeps the rest of the target's defaults for the def: the softmax
    stays fused into one CUDA kernel (the default's `Max` fusion), with the unroll asked
    for; a preset name still replaces everything (`naive`: no row kernel)."""
    f = tmp_path / "softmax.tc"
    f.write_text(
        "def softmax(float(N, D) I) -> (O) {\n"
        "    maxVal(n) max=! I(n, d)\n"
        "    expSum(n) +=! exp(I(n, d) - maxVal(n))\n"
        "    O(n, d) = exp(I(n, d) - maxVal(n)) / expSum(n)\n"
        "}\n"
    )
    args = ["compile", str(f), "--gpu", "--sizes", "N=64,D=128", "--options"]
    assert main([*args, '{"unroll": 2}']) == 0
    out = capsys.readouterr().out
    assert out.count("__global__") == 1 and "__syncwarp" in out and "#pragma unroll 2" in out
    assert main([*args, "naive"]) == 0
    assert "__syncwarp" not in capsys.readouterr().out
    assert main([*args, '{"unrol": 2}']) == 1
    assert "unrol" in capsys.readouterr().err
