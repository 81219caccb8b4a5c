"""The `tcpy` command: check TC files, run and tune their definitions on random inputs.

tcpy check FILE.tc
tcpy run FILE.tc [--entry NAME] [--sizes M=64,N=32] [--target T] [--seed S]
tcpy tune FILE.tc [--entry NAME] [--sizes M=512,N=512] [--generations G] [--population P]
                  [--workers W] [--seed S] [--plot OUT.png] [--save BEST.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tcpy import targets
from tcpy.cache_cli import add_cache_commands, cache_command
from tcpy.codegen.naming import user_text
from tcpy.engine import ExecutionEngine
from tcpy.errors import TCError
from tcpy.genetic.tuner import TUNABLE_TARGETS, TunerConfig, TuneResult
from tcpy.inputs import random_inputs, resolve_sizes
from tcpy.mapping.options import MappingOptions
from tcpy.runtime import profile
from tcpy.sandbox import Failure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tcpy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="parse and check a TC file")
    check.add_argument("file", type=Path)
    run = sub.add_parser("run", help="run a def on random inputs")
    run.add_argument("file", type=Path)
    run.add_argument("--entry", help="the def to run (default: the only one)")
    run.add_argument("--sizes", default="", help="size values, e.g. M=64,N=32 (default 32)")
    run.add_argument("--target", choices=sorted(targets.TARGETS),
                     help="where to run (default: cuda with a GPU, else cpu)")  # fmt: skip
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--options", help=OPTIONS_HELP)
    run.add_argument("--profile", action="store_true",
                     help="count each launch's memory traffic (cuda-emu): a table against "
                     "the bytes the def must move")  # fmt: skip
    comp = sub.add_parser("compile", help="print the generated C, schedule tree or isl AST")
    comp.add_argument("file", type=Path)
    comp.add_argument("--entry", help="the def to compile (default: the only one)")
    comp.add_argument("--sizes", default="", help="size values, e.g. M=64,N=32 (default 32)")
    comp.add_argument("--emit", choices=("c", "schedule", "ast"), default="c",
                      help="the generated code (C, or CUDA with --gpu), the schedule tree, "
                      "or the isl AST")  # fmt: skip
    comp.add_argument("--gpu", action="store_true", help="the CUDA mapping instead of the CPU one")
    comp.add_argument("--options", help=OPTIONS_HELP)
    _add_tune(sub)
    add_cache_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "cache":
        return cache_command(args)
    try:
        source = args.file.read_text()
    except OSError as e:
        print(f"tcpy: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        if args.command == "check":
            return _check(source, str(args.file))
        if args.command == "compile":
            return _compile(source, args)
        if args.command == "tune":
            return _tune(source, args)
        return _run(source, args)
    except TCError as e:
        print(f"error: {e}" if e.span is None else str(e), file=sys.stderr)
        return 1


def _check(source: str, filename: str) -> int:
    engine = ExecutionEngine("reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = engine.define(source, filename)
    for w in caught:
        print(f"{filename}: warning: {w.message}", file=sys.stderr)
    for name in names:
        cdef = engine.checked(name)
        shapes = ", ".join(
            f"{t.name}: {t.scalar.value}[{', '.join(map(str, t.shape))}]" for t in cdef.outputs
        )
        print(f"{name}: ok -> {shapes}")
    return 0


def _parse_sizes(text: str) -> dict[str, int]:
    sizes = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise TCError(f"--sizes expects NAME=INTEGER pairs, got {item!r}")
        sizes[name.strip()] = int(value)
    return sizes


OPTIONS_HELP = (
    "mapping options: a preset name, or a JSON object of the fields to change on the "
    "target's defaults for the def"
)


def _options(text: str | None, defaults: MappingOptions) -> MappingOptions | None:
    """`--options`: a preset name, or a JSON object of the fields to change on
    `defaults` (the target's default options for the def); None when not given."""
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        MappingOptions.from_json(text)  # the names and values, checked alone
        return MappingOptions.from_dict({**defaults.to_dict(), **json.loads(text)})
    return MappingOptions.preset(text)


def _entry(names: tuple[str, ...], entry: str | None, file: Path) -> str:
    if entry is not None:
        return entry
    if len(names) != 1:
        raise TCError(f"{file} defines {', '.join(names)}: choose one with --entry")
    return names[0]


def _compile(source: str, args: argparse.Namespace) -> int:
    from tcpy.mapping.cpu import cpu_defaults
    from tcpy.mapping.gpu import cuda_defaults
    from tcpy.pipeline import lower_to_c, lower_to_cuda

    engine = ExecutionEngine("reference")
    names = engine.define(source, str(args.file))
    cdef = engine.checked(_entry(names, args.entry, args.file))
    sizes = resolve_sizes(cdef, _parse_sizes(args.sizes))
    if args.gpu:
        defaults = cuda_defaults(cdef)
        gpu = lower_to_cuda(cdef, sizes, _options(args.options, defaults) or defaults)
        source, schedule, asts = gpu.source, gpu.mapping.schedule, [a.root for a in gpu.asts]
    else:
        defaults = cpu_defaults(cdef)
        cpu = lower_to_c(cdef, sizes, _options(args.options, defaults) or defaults)
        source, schedule, asts = cpu.source, cpu.schedule, [cpu.ast.root]
    if args.emit == "c":
        print(source)
    elif args.emit == "schedule":  # isl's own notation, under the user's names
        print(user_text(schedule.get_root().to_str()))
    else:
        print(user_text("\n".join(root.to_C_str() for root in asts)))
    return 0


def _run(source: str, args: argparse.Namespace) -> int:
    engine = ExecutionEngine(args.target)
    args.target = engine.target
    if args.profile and args.target != "cuda-emu":
        raise TCError("--profile counts traffic in the emulator: use it with --target cuda-emu")
    t0 = time.perf_counter()
    names = engine.define(source, str(args.file))
    t_define = time.perf_counter() - t0
    entry = _entry(names, args.entry, args.file)
    cdef = engine.checked(entry)
    sizes = resolve_sizes(cdef, _parse_sizes(args.sizes))
    inputs = random_inputs(cdef, sizes, np.random.default_rng(args.seed))
    options = _options(args.options, engine.default_options(entry, *inputs))
    t0 = time.perf_counter()
    result = engine.run(entry, *inputs, options=options)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.run(entry, *inputs, options=options)
    t_second = time.perf_counter() - t0
    outputs = result if isinstance(result, tuple) else (result,)
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "none"
    print(f"{entry} on {args.target}, sizes {shown}")
    for info, out in zip(cdef.outputs, outputs, strict=True):
        checksum = float(np.sum(out, dtype=np.float64))
        print(f"  {info.name}: {out.dtype}{list(out.shape)}  checksum {checksum:.6e}")
    print(
        f"  time: define {t_define * 1e3:.1f} ms, first call {t_first * 1e3:.1f} ms, "
        f"second call {t_second * 1e3:.1f} ms"
    )
    if args.profile:
        compiled = engine.compile(entry, *inputs, options=options)
        minimum = profile.minimum_bytes(inputs, outputs)
        print(profile.table(compiled.profile(*inputs), minimum))
    return 0


# --- tcpy tune ---------------------------------------------------------------------------


def _add_tune(sub: Any) -> None:
    tune = sub.add_parser(
        "tune", help="search a def's mapping options on random inputs and store the best"
    )
    tune.add_argument("file", type=Path)
    tune.add_argument("--entry", help="the def to tune (default: the only one)")
    tune.add_argument("--sizes", default="", help="size values, e.g. M=512,N=512 (default 32)")
    # every target is accepted here, so that cuda-emu and reference get tune's reason
    tune.add_argument("--target", choices=sorted(targets.TARGETS),
                      help=f"what to tune for: {' or '.join(TUNABLE_TARGETS)} "
                      "(default: cuda with a GPU, else cpu)")  # fmt: skip
    defaults = TunerConfig()
    for name, help_text in (
        ("generations", "generations of the genetic search"),
        ("population", "candidates per generation"),
        ("workers", "processes compiling candidates in parallel"),
        ("runs", "timed runs per candidate (their median counts)"),
    ):
        tune.add_argument(f"--{name}", type=int, default=getattr(defaults, name),
                          help=f"{help_text} (default {getattr(defaults, name)})")  # fmt: skip
    tune.add_argument("--seed", type=int, default=0, help="inputs and search (default 0)")
    tune.add_argument("--plot", type=Path, help="write the convergence plot here (.png, .svg)")
    tune.add_argument("--save", type=Path, help="write the result as JSON here (for load_tuned)")


def _tune(source: str, args: argparse.Namespace) -> int:
    """Tune on random inputs of the given sizes: progress on stderr, a summary on
    stdout; the best options are stored for later calls with these shapes either way."""
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # fail before a long session rather than after it
        raise TCError("--plot needs matplotlib: pip install tcpy[plot]")
    engine = ExecutionEngine(args.target)
    entry = _entry(engine.define(source, str(args.file)), args.entry, args.file)
    cdef = engine.checked(entry)
    sizes = resolve_sizes(cdef, _parse_sizes(args.sizes))
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
    for line in _summary(result, sizes, from_default, args):
        print(line)
    return 0


def _summary(
    result: TuneResult, sizes: dict[str, int], from_default: bool, args: argparse.Namespace
) -> list[str]:
    """The table printed when a session ends. The start is the target's default
    options unless earlier sessions had tuned these or nearby shapes (then the best
    of those): the row says which, as the speedup is relative to it."""
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


if __name__ == "__main__":
    sys.exit(main())
