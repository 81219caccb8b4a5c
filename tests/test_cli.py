"""The tcpy command, run as a newcomer would (a subprocess) and through main()."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tcpy import ExecutionEngine
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


@pytest.mark.parametrize(
    ("sizes", "fragment"),
    [
        ("M=x", "expected NAME=INTEGER pairs, got 'M=x'"),
        ("M", "expected NAME=INTEGER pairs, got 'M'"),
        ("M=1.5", "expected NAME=INTEGER pairs, got 'M=1.5'"),
        ("M=-3", "M=-3: a size must be a positive integer"),
        ("M=0", "M=0: a size must be a positive integer"),
        ("M=3,M=4", "M is given twice"),
    ],
)
def test_bad_sizes_are_usage_errors(
    sizes: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Malformed, negative or zero sizes stop at the argument parser: exit 2 with the
    usage line, no traceback, before the file is read."""
    with pytest.raises(SystemExit) as stop:
        main(["run", str(ROOT / "examples/matmul.tc"), "--sizes", sizes])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"tcpy run: error: argument --sizes: {fragment}" in err
    assert "Traceback" not in err


def test_unknown_size_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ROOT / "examples/matmul.tc"), "--sizes", "Q=3"]) == 1
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
    err = capsys.readouterr().err
    assert f"{f}:1:30: warning: B is not initialised" in err
    assert err.splitlines()[1:3] == [
        "def f(float(N,M) A) -> (B) { B(i) += A(i,j) }",
        " " * 29 + "^^^^",
    ]


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


# --- the command line as a whole ---------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import tcpy

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"tcpy {tcpy.__version__}\n"


def test_every_argument_has_help_and_help_ends_with_examples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tcpy.cli import parser
    from tcpy.mapping.options import PRESETS

    top = parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(commands.choices) == ["cache", "check", "compile", "grad", "run", "tune"]
    for name, sub in [("tcpy", top), *commands.choices.items()]:
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        assert sub.epilog and sub.epilog.startswith("examples:\n  tcpy "), name
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    examples = out[out.index("examples:") :]
    assert "tcpy run" in examples and "tcpy compile" in examples and "tcpy tune" in examples
    assert out.rstrip().endswith(f"presets for --options: {', '.join(PRESETS)}")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert all(p in out for p in PRESETS)  # in --options' help
    assert out.rstrip().splitlines()[-1].startswith("  tcpy run ")


def test_source_from_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f(float(N) X) -> (Y) { Y(i) = 2 * X(i) }"))
    assert main(["run", "-", "--sizes", "N=8", "--target", "reference"]) == 0
    assert "f on reference, sizes N=8\n  Y: float32[8]" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f(float(N) X) -> (Y) {\n Y(i) = Z(i)\n}"))
    assert main(["check", "-"]) == 1
    assert "<stdin>:2:" in capsys.readouterr().err  # errors name the stream


# --- tcpy compile --------------------------------------------------------------------------


def test_compile_header_names_the_kernel_it_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """The comment block above the code holds the effective options and the key of the
    kernel's cache entry: those of the kernel an engine compiles for these shapes, whose
    source is the code printed below the block."""
    assert main(["compile", str(ROOT / "examples/matmul.tc"), "--sizes", "M=48,N=40,K=8"]) == 0
    out = capsys.readouterr().out
    head, code = out.split("\n", 3)[:3], out.split("\n", 3)[3]
    assert head[0] == "// tcpy compile: matmul on cpu, sizes M=48, K=8, N=40"
    engine = ExecutionEngine("cpu")
    engine.define((ROOT / "examples/matmul.tc").read_text())
    a, b = np.zeros((48, 8), np.float32), np.zeros((8, 40), np.float32)
    compiled = engine.compile("matmul", a, b)
    assert head[1] == f"// options: {compiled.options.to_json()}"
    assert head[2] == f"// cache key: {compiled.cache_key}" and len(compiled.cache_key) == 64
    assert code == compiled.source + "\n"


@pytest.mark.parametrize(
    ("flags", "target", "fragment"),
    [
        (["--emit", "cuda"], "cuda", "__global__ void"),  # --emit cuda implies the target
        (["--target", "cuda"], "cuda", "__global__ void"),
        (["--target", "cuda-emu", "--emit", "cuda"], "cuda-emu", "__global__ void"),
        (["--target", "cuda", "--emit", "ast"], "cuda", "S0(32 * b1 + c3, 32 * b0 + t0, c5)"),
    ],
)
def test_compile_target_and_emit_cuda(
    flags: list[str], target: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["compile", str(ROOT / "examples/matmul.tc"), "--sizes", "M=64,N=64,K=64", *flags]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"// tcpy compile: matmul on {target}, sizes M=64, K=64, N=64\n")
    assert fragment in out and "#include" not in out  # not the C


def test_compile_without_a_toolchain_prints_the_code_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tcpy.errors import TCCompileError
    from tcpy.runtime import cpu

    def no_compiler(source: Path, library: Path) -> None:
        raise TCCompileError("cc: not found")

    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "cache"))  # no entry to find
    monkeypatch.setattr(cpu, "build", no_compiler)
    assert main(["compile", str(ROOT / "examples/matmul.tc")]) == 0
    captured = capsys.readouterr()
    assert "// cache key: none (not built)\n" in captured.out
    assert "int tc_kernel(" in captured.out  # the code, lowered without the build
    assert "warning: the kernel did not build, so it has no cache key: cc: not found" in (
        captured.err
    )


def test_compile_gpu_flag_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(ROOT / "examples/matmul.tc"), "--gpu"]) == 0
    captured = capsys.readouterr()
    assert "matmul on cuda" in captured.out and "__global__" in captured.out
    assert "--gpu is deprecated: use --target cuda" in captured.err


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--target", "cuda", "--emit", "c"], "--emit c is the code of the cpu target"),
        (["--target", "cpu", "--emit", "cuda"], "--emit cuda is the code of the cuda targets"),
        (["--gpu", "--target", "cpu"], "--gpu means --target cuda, not cpu"),
    ],
)
def test_compile_contradictions(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compile", str(ROOT / "examples/matmul.tc"), *flags]) == 1
    assert fragment in capsys.readouterr().err


def test_schedule_has_no_isl_debugging_marker(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in ([], ["--target", "cuda"]):
        assert (
            main(["compile", str(ROOT / "examples/matmul.tc"), "--emit", "schedule", *flags]) == 0
        )
        out = capsys.readouterr().out
        assert "YOU ARE HERE" not in out
        lines = out.splitlines()
        assert lines[0].startswith("# tcpy compile: matmul")  # the header, as YAML comments
        assert lines[3].startswith('domain: "[M, K, N] -> {') and lines[4] == "child:"


# --- tcpy run ------------------------------------------------------------------------------


def test_run_prints_options_and_cache_key(capsys: pytest.CaptureFixture[str]) -> None:
    f = str(ROOT / "examples/matmul.tc")
    assert main(["run", f, "--target", "cpu", "--options", '{"unroll": 2}']) == 0
    out = capsys.readouterr().out
    options = re.search(r"^  options: (\{.*\})$", out, re.M)
    key = re.search(r"^  cache key: ([0-9a-f]{64})$", out, re.M)
    assert options and key
    assert json.loads(options.group(1))["unroll"] == 2
    engine = ExecutionEngine("cpu")
    engine.define((ROOT / "examples/matmul.tc").read_text())
    a = np.zeros((32, 32), np.float32)
    mine = engine.compile(
        "matmul", a, a, options=engine.default_options("matmul", a, a).replace(unroll=2)
    )
    assert key.group(1) == mine.cache_key
    assert main(["run", f, "--target", "reference"]) == 0
    assert "options, cache key: none" in capsys.readouterr().out


def test_run_repeat_reports_median_and_spread(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ROOT / "examples/matmul.tc"), "--target", "cpu", "--repeat", "7"]) == 0
    out = capsys.readouterr().out
    found = re.search(
        r"7 more calls: median ([\d.]+) ms \(min ([\d.]+), max ([\d.]+), IQR ([\d.]+)\)", out
    )
    assert found, out
    median, low, high, iqr = map(float, found.groups())
    assert 0 < low <= median <= high and 0 <= iqr <= high - low


@pytest.mark.parametrize("repeat", ["0", "-2", "x"])
def test_run_repeat_must_be_positive(repeat: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["run", str(ROOT / "examples/matmul.tc"), "--repeat", repeat])
    assert stop.value.code == 2
    assert "argument --repeat: expected a positive integer" in capsys.readouterr().err


EXP_TC = "def e(float(N, D) X) -> (Y) { Y(n, d) = exp(X(n, d)) }\n"


@pytest.mark.parametrize(("skew", "verdict"), [(0.0, "ok"), (1e-6, "ok"), (1e-3, "MISMATCH")])
def test_run_check_against_reference(
    skew: float,
    verdict: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The reference's `exp` is made wrong by a relative `skew` (the C kernel calls its
    own libm, which no Python change reaches): within float32's tolerance (1e-4) the
    check passes, beyond it the command reports the mismatch and exits 1."""
    from tcpy.reference.builtins import IMPLEMENTATIONS

    exact = IMPLEMENTATIONS["exp"]
    monkeypatch.setitem(IMPLEMENTATIONS, "exp", lambda x: exact(x) * x.dtype.type(1 + skew))
    f = tmp_path / "e.tc"
    f.write_text(EXP_TC)
    status = main(["run", str(f), "--target", "cpu", "--sizes", "N=16,D=40", "--check"])
    captured = capsys.readouterr()
    found = re.search(r"check Y: max abs error (\S+), relative (\S+) \(tolerance 0.0001\): (\w+)",
                      captured.out)  # fmt: skip
    assert found, captured.out
    assert found.group(3) == verdict
    rel = float(found.group(2))
    if skew:  # the measured error is the skew (over inputs in [-1, 1), exp is within e)
        assert skew / 4 < rel < skew * 1.1
    if verdict == "ok":
        assert status == 0 and captured.err == ""
    else:
        assert status == 1
        assert "error: e differs from the reference target: Y[" in captured.err


def test_run_check_integers_exact_and_reference_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "g.tc"
    f.write_text("def g(float(E,D) T, int32(B) I) -> (O) { O(b,d) = T(I(b), d) }\n")
    assert main(["run", str(f), "--target", "cpu", "--check", "--sizes", "E=5,D=3,B=7"]) == 0
    assert "check O: max abs error 0, relative 0 (tolerance 0.0001): ok" in capsys.readouterr().out
    assert main(["run", str(f), "--target", "reference", "--check"]) == 1
    assert "--check compares with the reference target" in capsys.readouterr().err


def test_check_errors_count_nan_and_infinity() -> None:
    from tcpy.commands import _errors

    want = np.array([1.0, np.nan, np.inf, -2.0], np.float32)
    assert _errors(want.copy(), want) == (0.0, 0.0, (0,))
    got = want.copy()
    got[1] = 0.0
    assert _errors(got, want)[0] == np.inf and _errors(got, want)[2] == (1,)
    got = want.copy()
    got[3] = -1.5
    assert _errors(got, want) == (0.5, 0.25, (3,))  # relative to the largest finite |value|


# --- --options -----------------------------------------------------------------------------


def test_options_from_a_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file of fields changes those on the defaults; a `tune --save` record gives its
    options; what is neither a preset nor JSON nor a file says what it may be."""
    f = str(ROOT / "examples/matmul.tc")
    fields = tmp_path / "fields.json"
    fields.write_text('{"unroll": 3}')
    assert main(["run", f, "--target", "cpu", "--options", str(fields)]) == 0
    shown = json.loads(re.search(r"options: (\{.*\})", capsys.readouterr().out).group(1))
    assert shown["unroll"] == 3 and shown["vectorize"] is True  # the rest: cpu defaults
    saved = tmp_path / "best.json"
    saved.write_text(json.dumps({"def": "...", "options": {"unroll": 5, "vectorize": False}}))
    assert main(["run", f, "--target", "cpu", "--options", str(saved)]) == 0
    shown = json.loads(re.search(r"options: (\{.*\})", capsys.readouterr().out).group(1))
    assert shown["unroll"] == 5 and shown["vectorize"] is False
    assert main(["run", f, "--options", "fast"]) == 1
    assert "'fast' is not a preset (naive, pointwise" in capsys.readouterr().err
    assert main(["run", f, "--options", str(tmp_path / "missing.json")]) == 1
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1]")
    assert main(["run", f, "--options", str(tmp_path / "bad.json")]) == 1
    assert "must be a JSON object" in capsys.readouterr().err
