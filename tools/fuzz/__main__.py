"""`python -m tools.fuzz`: differential fuzzing of tcpy against its reference target.

    python -m tools.fuzz --target cpu --n 10000            # (program, options) pairs
    python -m tools.fuzz --target cpu --gradient --n 2000  # backwards against finite differences
    python -m tools.fuzz --target cpu --online --n 500     # chains of exponentials only
    python -m tools.fuzz --mutate --n 20000                # mutated sources, front end only
    python -m tools.fuzz replay fuzz-failures/X.json       # re-run one failure in-process
    python -m tools.fuzz shrink fuzz-failures/X.json       # write X.min.json beside it

The exit status is 1 when any failure was found.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tcpy.fuzz_tasks import replay
from tcpy.sandbox import Replay
from tools.fuzz.run import RUN_TIMEOUT, WORKER_ENV, fuzz, fuzz_frontend, shrink_file


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:
        return _replay(Path(argv[1]))
    if argv[:1] == ["shrink"]:
        p = argparse.ArgumentParser(prog="python -m tools.fuzz shrink")
        p.add_argument("file", type=Path)
        p.add_argument("--seconds", type=float, default=300.0)
        p.add_argument("--timeout", type=float, default=120.0)
        a = p.parse_args(argv[1:])
        out = shrink_file(a.file, a.seconds, a.timeout)
        print(Replay.load(out).source)
        print(f"written {out}")
        return 0
    a = _parser().parse_args(argv)
    if a.mutate:
        summary = fuzz_frontend(a.n, a.seed, a.jobs, min(a.timeout, 20.0), a.out)
    else:
        summary = fuzz(a.target, a.n, a.seed, a.jobs, a.timeout, a.out, a.shrink_seconds,
                       run_timeout=a.run_timeout, gradient=a.gradient,
                       float_type=a.float_type, online=a.online)  # fmt: skip
    for path in summary.saved:
        print(f"saved {path}")
    print(summary.line())
    return 1 if sum(summary.failures.values()) else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--target", default="cpu", choices=("cpu", "cuda-emu", "cuda"))
    p.add_argument("--n", type=int, default=100, help="number of cases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPUs)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take")
    p.add_argument("--run-timeout", type=float, default=RUN_TIMEOUT,
                   help="seconds a pair's kernel may run once compiled")  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("fuzz-failures"))
    p.add_argument("--shrink-seconds", type=float, default=60.0,
                   help="time to shrink each new failure (0: do not shrink)")  # fmt: skip
    p.add_argument("--float-type", choices=("float", "float16", "bfloat16", "half"),
                   help="the programs' float type (default: float32 for half of them, "
                   "float16 or bfloat16 for the others; half: float16 or bfloat16)")  # fmt: skip
    p.add_argument("--online", action="store_true",
                   help="every program a chain of exponentials against a row's maximum, "
                   "as the online rewrite over tiles of a row takes (by default a tenth "
                   "of them)")  # fmt: skip
    p.add_argument("--mutate", action="store_true", help="mutated sources, front end only")
    p.add_argument("--gradient", action="store_true",
                   help="derive each program's backward, compile it for the target and check "
                   "it against the reference's and against finite differences")  # fmt: skip
    return p


def _replay(path: Path) -> int:
    os.environ.update(WORKER_ENV)  # as the fuzzer's workers ran it
    r = Replay.load(path)
    print(r.source)
    print(f"sizes={r.sizes} target={r.target} recorded={r.failure}")
    outcome = replay(path)
    status = outcome.failure.value if outcome.failure else ("invalid" if outcome.invalid else "ok")
    print(f"outcome: {status}")
    if outcome.detail:
        print(outcome.detail)
    return 1 if outcome.failure else 0


if __name__ == "__main__":
    sys.exit(main())
