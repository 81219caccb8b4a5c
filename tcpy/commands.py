"""What the `tcpy` commands do, given the parsed arguments (`tcpy.cli` parses them).

Every command takes the TC source, the name it is reported under (a path, or
`<stdin>`) and the arguments; it prints its report on stdout and returns the exit
status. User errors are raised as `TCError`s, which `tcpy.cli.main` prints.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tcpy import targets
from tcpy.autodiff import derive
from tcpy.engine import ExecutionEngine
from tcpy.errors import TCCompileError, TCError, TCMappingError, TCWarning, located
from tcpy.inputs import random_inputs, resolve_sizes
from tcpy.mapping.options import PRESETS, MappingOptions
from tcpy.naming import user_text
from tcpy.parser import CheckedDef, check_source

if TYPE_CHECKING:
    from tcpy.genetic.tuner import TuneResult

# `run --check`: the largest error allowed, relative to the largest magnitude of the
# reference output (reductions may be reassociated, so an element's own magnitude is no
# measure: a sum that cancels to near zero carries the rounding of its large terms).
# Integers are exact.
CHECK_RTOL = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-10}


def check(source: str, filename: str, args: argparse.Namespace) -> int:
    engine = ExecutionEngine("reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = engine.define(source, filename)
    for w in caught:
        m = w.message
        if isinstance(m, TCWarning) and m.span is not None:  # file:line:col: warning: ...
            print(located(f"warning: {m.message}", m.span, m.source, m.filename), file=sys.stderr)
        else:
            print(f"{filename}: warning: {m}", file=sys.stderr)
    for name in names:
        cdef = engine.checked(name)
        shapes = ", ".join(
            f"{t.name}: {t.scalar.value}[{', '.join(map(str, t.shape))}]" for t in cdef.outputs
        )
        print(f"{name}: ok -> {shapes}")
    return 0


# --- tcpy compile --------------------------------------------------------------------------


def compile_(source: str, filename: str, args: argparse.Namespace) -> int:
    """Print the generated code, the schedule tree or isl's AST, under a comment block
    naming the def, target, sizes, effective options and cache key. The block is a
    comment of the printed language (`//`, or `#` for the schedule tree), so that the
    output redirected to a file still compiles, and the file says what made it."""
    target, emit = _compile_target(args)
    engine = ExecutionEngine(target)
    entry = _entry(engine.define(source, filename), args.entry, filename)
    cdef = engine.checked(entry)
    sizes = resolve_sizes(cdef, args.sizes)
    # inputs of these shapes select the kernel; their values are never read
    inputs = random_inputs(cdef, sizes, np.random.default_rng(0))
    options = options_from(args.options, engine.default_options(entry, *inputs))
    code = None
    try:
        compiled = engine.compile(entry, *inputs, options=options)
        options, key, code = compiled.options, compiled.cache_key, compiled.source
    except TCCompileError as e:  # no toolchain here (cc, NVRTC, g++): still show the code
        print(f"{filename}: warning: the kernel did not build, so it has no cache key: {e}",
              file=sys.stderr)  # fmt: skip
        options = (
            options
            or engine.tuned_options(entry, *inputs)
            or engine.default_options(entry, *inputs)
        )
        key = "none (not built)"
    if code is None or emit in ("schedule", "ast"):
        code = _lowered(cdef, sizes, options, target, emit)
    comment = "#" if emit == "schedule" else "//"
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "none"
    for line in (
        f"tcpy compile: {entry} on {target}, sizes {shown}",
        f"options: {options.to_json()}",
        f"cache key: {key}",
    ):
        print(f"{comment} {line}")
    print(code)
    return 0


def _compile_target(args: argparse.Namespace) -> tuple[str, str]:
    """The target whose mapping `compile` prints, and what it prints. The default is
    the cpu target's C whatever the machine (`--emit cuda` implies the cuda target), so
    that the output does not depend on where it is asked for."""
    target = args.target
    if args.gpu:
        print("tcpy: --gpu is deprecated: use --target cuda", file=sys.stderr)
        if target not in (None, "cuda"):
            raise TCError(f"--gpu means --target cuda, not {target}")
        target = "cuda"
    if target is None:
        target = "cuda" if args.emit == "cuda" else "cpu"
    emit = args.emit or ("c" if target == "cpu" else "cuda")
    if (emit == "c") != (target == "cpu") and emit in ("c", "cuda"):
        raise TCError(
            f"--emit {emit} is the code of the "
            + ("cpu target" if emit == "c" else "cuda targets")
            + f", and the target is {target}: "
            + ("--emit cuda" if emit == "c" else "--target cuda or cuda-emu")
            + " shows it"
        )
    return target, emit


def _lowered(
    cdef: CheckedDef, sizes: dict[str, int], options: MappingOptions, target: str, emit: str
) -> str:
    from tcpy.pipeline import lower_to_c, lower_to_cuda

    if target == "cpu":
        cpu = lower_to_c(cdef, sizes, options)
        code, schedule, asts = cpu.source, cpu.schedule, [cpu.ast.root]
    else:
        kind = targets.get(target)
        device = (
            kind.profile()[0] if isinstance(kind, targets.Cuda)
            else kind.profile() if isinstance(kind, targets.CudaEmu)
            else None
        )  # fmt: skip
        gpu = lower_to_cuda(cdef, sizes, options, device=device)
        code, schedule, asts = gpu.source, gpu.mapping.schedule, [a.root for a in gpu.asts]
    if emit == "schedule":
        # isl's own notation under the user's names, less the "YOU ARE HERE" line isl
        # prints above the node a printed schedule tree was taken from
        text = schedule.get_root().to_str()
        return user_text("\n".join(ln for ln in text.splitlines() if ln != "# YOU ARE HERE"))
    if emit == "ast":
        return user_text("\n".join(root.to_C_str() for root in asts))
    return code


# --- tcpy run ------------------------------------------------------------------------------


def run(source: str, filename: str, args: argparse.Namespace) -> int:
    engine = ExecutionEngine(args.target)
    target = engine.target
    if args.profile and target != "cuda-emu":
        raise TCError("--profile counts traffic in the emulator: use it with --target cuda-emu")
    if args.check and target == "reference":
        raise TCError("--check compares with the reference target: choose another --target")
    t0 = time.perf_counter()
    names = engine.define(source, filename)
    t_define = time.perf_counter() - t0
    entry = _entry(names, args.entry, filename)
    cdef = engine.checked(entry)
    sizes = resolve_sizes(cdef, args.sizes)
    inputs = random_inputs(cdef, sizes, np.random.default_rng(args.seed))
    options = options_from(args.options, engine.default_options(entry, *inputs))
    t0 = time.perf_counter()
    result = engine.run(entry, *inputs, options=options)
    t_first = time.perf_counter() - t0
    compiled = engine.compile(entry, *inputs, options=options)  # the kernel that just ran
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        compiled(*inputs)
        times.append(time.perf_counter() - t0)
    outputs = [np.asarray(o) for o in (result if isinstance(result, tuple) else (result,))]
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "none"
    print(f"{entry} on {target}, sizes {shown}")
    for info, out in zip(cdef.outputs, outputs, strict=True):
        checksum = float(np.sum(out, dtype=np.float64))
        print(f"  {info.name}: {out.dtype}{list(out.shape)}  checksum {checksum:.6e}")
    print(f"  time: define {t_define * 1e3:.1f} ms, first call {t_first * 1e3:.1f} ms, "
          + _spread(times))  # fmt: skip
    if target == "reference":
        print("  options, cache key: none (the reference target interprets the def)")
    else:
        print(f"  options: {compiled.options.to_json()}")
        print(f"  cache key: {compiled.cache_key}")
    if args.profile:
        from tcpy.runtime import profile

        minimum = profile.minimum_bytes(inputs, tuple(outputs))
        print(profile.table(compiled.profile(*inputs), minimum))
    if args.check:
        return _check_against_reference(source, filename, cdef, inputs, outputs)
    return 0


def _spread(times: list[float]) -> str:
    """The calls after the first: one time, or the median and the spread of several
    (min, max, and the interquartile range, which one slow call does not move)."""
    ms = [t * 1e3 for t in times]
    if len(ms) == 1:
        return f"second call {ms[0]:.3f} ms"
    q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive")
    return (
        f"{len(ms)} more calls: median {statistics.median(ms):.3f} ms "
        f"(min {min(ms):.3f}, max {max(ms):.3f}, IQR {q3 - q1:.3f})"
    )


def _check_against_reference(
    source: str, filename: str, cdef: CheckedDef, inputs: Any, outputs: list[np.ndarray]
) -> int:
    """Run the same inputs on the reference target; print each output's largest error
    and return 1 when one is above its dtype's tolerance (`CHECK_RTOL`)."""
    reference = ExecutionEngine("reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run has shown the def's warnings already
        reference.define(source, filename)
    want = reference.run(cdef.name, *inputs)
    wants = want if isinstance(want, tuple) else (want,)
    failed = []
    for info, got, expected in zip(cdef.outputs, outputs, wants, strict=True):
        rtol = CHECK_RTOL.get(expected.dtype.name, 0.0)
        abs_err, rel_err, worst = _errors(got, expected)
        ok = rel_err <= rtol
        print(f"  check {info.name}: max abs error {abs_err:.3g}, relative {rel_err:.3g} "
              f"(tolerance {rtol:g}): {'ok' if ok else 'MISMATCH'}")  # fmt: skip
        if not ok:
            failed.append(
                f"{info.name}{list(worst)} is {got[worst]!r}, the reference's {expected[worst]!r}"
            )
    if failed:
        print(f"error: {cdef.name} differs from the reference target: {'; '.join(failed)}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float, tuple[int, ...]]:
    """The largest absolute error, that error relative to the largest finite magnitude
    of `want`, and where it is. NaN against NaN, and equal infinities, count as equal;
    any other disagreement about a non-finite value is an infinite error."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(g - w))
    diff = np.where(np.isnan(diff), np.inf, diff)
    if diff.size == 0:
        return 0.0, 0.0, ()
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    finite = np.abs(w[np.isfinite(w)])
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    abs_err = float(diff[worst])
    return abs_err, abs_err / scale, worst


# --- shared by the commands ----------------------------------------------------------------


def options_from(text: str | None, defaults: MappingOptions) -> MappingOptions | None:
    """`--options`: a preset name; a JSON object of the fields to change on `defaults`
    (the target's default options for the def); or a JSON file holding such an object,
    or a result saved by `tcpy tune --save` (its options). None when not given."""
    if text is None:
        return None
    if text in PRESETS:
        return MappingOptions.preset(text)
    if text.lstrip().startswith("{"):
        fields = _json_object(text, "--options")
    elif text.endswith(".json") or Path(text).is_file():
        try:
            fields = _json_object(Path(text).read_text(), text)
        except OSError as e:
            raise TCError(f"--options: cannot read {text}: {e.strerror}") from None
        if isinstance(fields.get("options"), dict):  # written by `tcpy tune --save`
            fields = fields["options"]
    else:
        raise TCMappingError(
            f"--options {text!r} is not a preset ({', '.join(PRESETS)}), a JSON object "
            "or a JSON file"
        )
    MappingOptions.from_dict(fields)  # the names and values, checked alone
    return defaults.layered(fields)


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TCMappingError(f"{where}: mapping options are not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TCMappingError(f"{where}: mapping options must be a JSON object")
    return data


def _entry(names: tuple[str, ...], entry: str | None, filename: str) -> str:
    if entry is not None:
        return entry
    if len(names) != 1:
        raise TCError(f"{filename} defines {', '.join(names)}: choose one with --entry")
    return names[0]


# --- tcpy grad -----------------------------------------------------------------------------


def grad(source: str, filename: str, args: argparse.Namespace) -> int:
    """Print the backward of a def (`tcpy.autodiff.gradient`), after the forward that
    saves values for it where `--save` saves any."""
    names = tuple(check_source(source, filename))
    entry = _entry(names, args.entry, filename)
    derived = derive(source, entry, args.wrt, filename, args.save)
    if derived.forward is not None:
        print(derived.forward)
    print(derived.backward, end="")
    return 0


# --- tcpy tune -----------------------------------------------------------------------------


def tune(source: str, filename: str, args: argparse.Namespace) -> int:
    """Tune on random inputs of the given sizes: progress on stderr, a summary on
    stdout; the best options are stored for later calls with these shapes either way."""
    import importlib.util

    from tcpy.genetic.tuner import TunerConfig

    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # fail before a long session rather than after it
        raise TCError("--plot needs matplotlib: pip install tcpy[plot]")
    engine = ExecutionEngine(args.target)
    entry = _entry(engine.define(source, filename), args.entry, filename)
    cdef = engine.checked(entry)
    sizes = resolve_sizes(cdef, args.sizes)
    inputs = random_inputs(cdef, sizes, np.random.default_rng(args.seed))
    config = TunerConfig(
        generations=args.generations, population=args.population, workers=args.workers,
        runs=args.runs, seed=args.seed,
    )  # fmt: skip
    from_default = not engine.tuned_starting_points(entry, *inputs)
    result = engine.tune(entry, *inputs, config=config)
    if args.save is not None:  # before the plot: a result is never lost to a plot error
        result.save(args.save)
    if args.plot is not None:
        result.plot(args.plot)
    for line in summary(result, sizes, from_default, args):
        print(line)
    return 0


def summary(
    result: TuneResult, sizes: dict[str, int], from_default: bool, args: argparse.Namespace
) -> list[str]:
    """The table printed when a session ends. The start is the target's default
    options unless earlier sessions had tuned these or nearby shapes (then the best
    of those): the row says which, as the speedup is relative to it."""
    from tcpy.sandbox import Failure

    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "none"
    failed = sum(result.failures.values())
    # every class, zeros included: a reader sees what could have gone wrong and did not
    classes = ", ".join(f"{f.value} {result.failures.get(f.value, 0)}" for f in Failure)
    rows = [
        ("default time" if from_default else "start time",
         _ms(result.baseline_s)
         + ("" if from_default else "  (best of the default and earlier tuned options)")),
        ("best time", _ms(result.time_s)),
        ("speedup", f"{result.speedup:.2f}x"),
        ("trials", f"{result.trials} in {len(result.history)} generations, "
                   f"{result.wall_s:.1f} s"),
        ("failures", f"{failed} ({classes})"),
    ]  # fmt: skip
    rows += [(name, str(p)) for name, p in (("saved", args.save), ("plot", args.plot)) if p]
    width = max(len(name) for name, _ in rows)
    return [
        f"tuned {result.entry} on {result.target} ({result.device}), sizes {shown}",
        *(f"  {name:<{width}}  {value}" for name, value in rows),
        f"  best options: {result.options.to_json()}",
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if math.isfinite(seconds) else "failed"
