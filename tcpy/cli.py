"""The `tcpy` command: check, compile, run and tune Tensor Comprehensions.

tcpy check FILE.tc
tcpy compile FILE.tc [--entry NAME] [--sizes M=64] [--target T] [--emit c|cuda|schedule|ast]
tcpy grad FILE.tc [--entry NAME] [--wrt X,Y] [--save auto|all|none|NAME,...]
tcpy run FILE.tc [--entry NAME] [--sizes M=64,N=32] [--target T] [--repeat N] [--check]
tcpy tune FILE.tc [--entry NAME] [--sizes M=512,N=512] [--generations G] [--population P]
                  [--workers W] [--seed S] [--plot OUT.png] [--save BEST.json]

FILE is `-` for standard input. This module is the parser and the entry point; what
each command does is in `tcpy.commands`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tcpy import __version__, commands, targets
from tcpy.cache.cli import add_cache_commands, cache_command
from tcpy.errors import TCError
from tcpy.mapping.options import PRESETS

EXAMPLES = {
    "check": ["tcpy check examples/matmul.tc"],
    "compile": [
        "tcpy compile examples/matmul.tc --sizes M=64,N=64,K=64 > matmul.c",
        "tcpy compile examples/matmul.tc --sizes M=64,N=64,K=64 --target cuda --emit cuda",
        "tcpy compile examples/matmul.tc --emit schedule",
    ],
    "grad": [
        "tcpy grad examples/matmul.tc",
        "tcpy grad examples/matmul.tc --wrt A > matmul_grad.tc",
        "tcpy grad examples/layernorm.tc --save auto",
    ],
    "run": [
        "tcpy run examples/matmul.tc --sizes M=256,N=256,K=256 --repeat 20 --check",
        "tcpy run examples/matmul.tc --options mlp",
        "tcpy run examples/matmul.tc --options '{\"unroll\": 2}'",
        "tcpy run examples/matmul.tc --options best.json",
        "echo 'def f(float(N) X) -> (Y) { Y(i) = 2 * X(i) }' | tcpy run - --sizes N=8",
        "tcpy run examples/matmul.tc --target cuda-emu --profile",
    ],
    "tune": [
        "tcpy tune examples/matmul.tc --sizes M=512,N=512,K=512 --save best.json --plot tune.png"
    ],
    "cache": [
        "tcpy cache info",
        "tcpy cache prune --other-versions --older-than 30d",
        "tcpy cache clear --dry-run",
    ],
}

OPTIONS_HELP = (
    f"mapping options: a preset ({', '.join(PRESETS)}); a JSON object of the fields to "
    "change on the target's defaults for the def, e.g. '{\"unroll\": 2}'; or a JSON file "
    "holding such an object (or a result of tcpy tune --save)"
)
FILE_HELP = "the TC source file, or - to read it from standard input"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "cache":
        return cache_command(args)
    try:
        if args.file == "-":
            source, filename = sys.stdin.read(), "<stdin>"
        else:
            with open(args.file) as f:
                source, filename = f.read(), args.file
    except OSError as e:
        print(f"tcpy: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    run: Callable[[str, str, argparse.Namespace], int] = {
        "check": commands.check,
        "compile": commands.compile_,
        "grad": commands.grad,
        "run": commands.run,
        "tune": commands.tune,
    }[args.command]
    try:
        return run(source, filename, args)
    except TCError as e:
        print(f"error: {e}" if e.span is None else str(e), file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`tcpy compile ... | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="tcpy",
        description=__doc__.splitlines()[0],
        epilog=_epilog(*EXAMPLES.values(), presets=True),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"tcpy {__version__}")
    sub = top.add_subparsers(
        dest="command", required=True, metavar="COMMAND",
        help="what to do; tcpy COMMAND --help for its arguments",
    )  # fmt: skip

    check = _command(sub, "check", "parse and check a TC file: each def's outputs and shapes")
    check.add_argument("file", metavar="FILE", help=FILE_HELP)

    comp = _command(sub, "compile", "print the generated C or CUDA, the schedule tree or isl AST")
    _def_arguments(comp, "compile", "M=64,N=32")
    comp.add_argument("--target", choices=("cpu", "cuda", "cuda-emu"),
                      help="whose mapping: the CPU's (the default, wherever tcpy runs) or "
                      "the GPU's (cuda; cuda-emu maps for the device TCPY_CUDA_DEVICE "
                      "names)")  # fmt: skip
    comp.add_argument("--emit", choices=("c", "cuda", "schedule", "ast"),
                      help="the target's code (the default: C on cpu, CUDA on the cuda "
                      "targets; --emit cuda alone implies --target cuda), the schedule tree "
                      "after mapping, or isl's AST")  # fmt: skip
    comp.add_argument("--gpu", action="store_true", help="deprecated: --target cuda")
    comp.add_argument("--options", metavar="OPTIONS", help=OPTIONS_HELP)

    grad = _command(sub, "grad", "print a def's backward as TC: the gradients of its inputs")
    grad.add_argument("file", metavar="FILE", help=FILE_HELP)
    grad.add_argument("--entry", help="the def to differentiate (default: the only one)")
    grad.add_argument("--wrt", type=_names, metavar="NAME,...",
                      help="the inputs to differentiate (default: every float input)")  # fmt: skip
    grad.add_argument("--save", type=_save, metavar="auto|all|none|NAME,...",
                      help="the forward's values the backward takes rather than recompute "
                      "(auto: those computed by a reduction; all: every one); prints the "
                      "forward that returns them first (default none)")  # fmt: skip

    run = _command(sub, "run", "run a def on random inputs: shapes, checksums, times")
    _def_arguments(run, "run", "M=64,N=32")
    run.add_argument("--target", choices=sorted(targets.TARGETS),
                     help="where to run (default: cuda with a GPU, else cpu)")  # fmt: skip
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    run.add_argument("--options", metavar="OPTIONS", help=OPTIONS_HELP)
    run.add_argument("--repeat", type=_count, default=1, metavar="N",
                     help="time N calls of the kernel after the first (compiling) one: their "
                     "median, min, max and interquartile range in ms (default 1)")  # fmt: skip
    run.add_argument("--check", action="store_true",
                     help="compare the outputs with the reference target's on the same "
                     "inputs: the largest absolute and relative error; exit 1 above the "
                     "dtype's tolerance (1e-4 of the largest value for float32, 1e-2 "
                     "float16, 5e-2 bfloat16, 1e-10 float64; integers exact)")  # fmt: skip
    run.add_argument("--profile", action="store_true",
                     help="count each launch's memory traffic (cuda-emu): a table against "
                     "the bytes the def must move")  # fmt: skip

    _add_tune(sub)
    add_cache_commands(sub, _epilog(EXAMPLES["cache"]))
    return top


def _command(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    made: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=help_text, epilog=_epilog(EXAMPLES[name]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    return made


def _def_arguments(cmd: argparse.ArgumentParser, verb: str, sizes_example: str) -> None:
    cmd.add_argument("file", metavar="FILE", help=FILE_HELP)
    cmd.add_argument("--entry", help=f"the def to {verb} (default: the only one)")
    cmd.add_argument("--sizes", type=_sizes, default={}, metavar="NAME=N,...",
                     help=f"size values, e.g. {sizes_example} (default 32 each)")  # fmt: skip


def _epilog(*groups: list[str], presets: bool = False) -> str:
    lines = ["examples:", *(f"  {e}" for g in groups for e in g)]
    if presets:
        lines += ["", f"presets for --options: {', '.join(PRESETS)}"]
    return "\n".join(lines)


def _sizes(text: str) -> dict[str, int]:
    """`--sizes M=64,N=32`: each a positive integer, each name once."""
    sizes: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not name or not value.lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"expected NAME=INTEGER pairs, got {item!r}")
        if int(value) < 1:
            raise argparse.ArgumentTypeError(f"{item}: a size must be a positive integer")
        if name in sizes:
            raise argparse.ArgumentTypeError(f"{name} is given twice")
        sizes[name] = int(value)
    return sizes


def _save(text: str) -> str | list[str]:
    """`--save`: auto, all, none, or names."""
    return text if text in ("auto", "all", "none") else _names(text)


def _names(text: str) -> list[str]:
    """`--wrt A,B`: names, each once."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct names separated by commas, got {text!r}"
        )
    return names


def _count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _add_tune(sub: Any) -> None:
    from tcpy.genetic.tuner import TUNABLE_TARGETS, TunerConfig

    tune = _command(sub, "tune", "search a def's mapping options on random inputs, store the best")
    _def_arguments(tune, "tune", "M=512,N=512")
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


if __name__ == "__main__":
    sys.exit(main())
