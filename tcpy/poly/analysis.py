"""The stages every target shares, in bounded time: the scop, its dependences and
its schedule, with a fallback for each way isl can fail.

A program that `reference` can run must compile under every valid option set, and
no compile may keep a user waiting. So each isl analysis runs under a wall-clock
limit (`tcpy.poly.bounded`) as well as isl's operation budget, and when one fails:

1. Dependence analysis over parametric sizes (it can exhaust the budget on strided
   and gathered accesses) is done again at the call's sizes, which is far cheaper:
   the kernel is then specialised to those sizes (`fix_parameters_before_scheduling`).
   If that fails too, the dependences are over-approximated without dataflow analysis
   (`conservative_dependences`) and the statements run in source order with
   sequential loops: slow, but right.
2. isl's scheduler under a fusing strategy (`Max`, `Preserve3Coincident`) can run for
   minutes or give up ("unable to carry dependences"): it is tried again under `Min`
   fusion, and if that fails too, the statements run in source order, each with its
   own loop nest, which always respects a TC program's dependences.

Each fallback gives a `TCWarning` that says what was given up. The options that
describe what ran are returned with the result; `clock_forced` says whether a
fallback depended on the machine's speed (a wall-clock stop), since such a result
must not be cached on disk: a quieter run can do better.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy import knobs
from tcpy.errors import TCWarning, warn
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser.checked import CheckedDef
from tcpy.poly.bounded import DeadlineExceeded, run_bounded
from tcpy.poly.dependences import Dependences, compute_dependences, conservative_dependences
from tcpy.poly.schedule import acceptable, isl_schedule, original_order
from tcpy.poly.scop import Scop, build_scop

TOTAL_LIMITS = 2.5
"""A compile's isl analyses together stop after this many times the per-analysis limit
(5 s by default: a user waits seconds, not minutes, for a kernel of a few statements);
what is left then runs the fallback that needs no isl scheduler."""


@dataclass(frozen=True, eq=False, slots=True)
class Analysis:
    scop: Scop
    deps: Dependences
    schedule: isl.Schedule
    options: MappingOptions  # what ran: the given options, changed by any fallback
    fallbacks: tuple[str, ...]  # what was given up, in words
    clock_forced: bool  # a fallback came from a wall-clock stop


@dataclass
class _Run:
    """The state of one analysis: its clock and what it gave up so far."""

    cdef: CheckedDef
    seconds: float
    deadline: float
    fallbacks: list[str] = dataclasses.field(default_factory=list)
    clock_forced: bool = False

    def limit(self) -> float:
        return max(0.0, min(self.seconds, self.deadline - time.monotonic()))

    def give_up(self, what: str, why: Exception) -> None:
        self.clock_forced |= isinstance(why, DeadlineExceeded)
        note = f"{what}: isl {_reason(why)}"
        self.fallbacks.append(note)
        cdef = self.cdef
        warn(TCWarning(f"{cdef.name}: {note}", cdef.span, cdef.source, cdef.filename))


def analyse(cdef: CheckedDef, sizes: Mapping[str, int], options: MappingOptions) -> Analysis:
    """The scop of `cdef`, its dependences and a schedule under `options`, falling back
    as the module says when isl fails or runs too long."""
    seconds = knobs.isl_seconds()
    run = _Run(cdef, seconds, time.monotonic() + TOTAL_LIMITS * seconds)
    scop, deps, options = _exact_dependences(cdef, sizes, options, run)
    if deps is None:  # not even at the call's sizes: over-approximate, source order
        deps = conservative_dependences(scop)
        schedule = original_order(scop, deps)
        return Analysis(scop, deps, schedule, options, tuple(run.fallbacks), True)
    if cdef.together:  # statements run together keep their order (`tcpy.poly.online`)
        return Analysis(scop, deps, original_order(scop, deps), options, tuple(run.fallbacks),
                        run.clock_forced)  # fmt: skip
    schedule, options = _schedule(scop, deps, options, run)
    return Analysis(scop, deps, schedule, options, tuple(run.fallbacks), run.clock_forced)


def _exact_dependences(
    cdef: CheckedDef, sizes: Mapping[str, int], options: MappingOptions, run: _Run
) -> tuple[Scop, Dependences | None, MappingOptions]:
    """isl's dataflow analysis, for every size when the options ask for it and else (or
    when that fails) at the call's sizes; None when it fails there too."""
    fixed = sizes if options.fix_parameters_before_scheduling else None
    scop = build_scop(cdef, fixed)
    try:
        return scop, _dependences(scop, run.limit()), options
    except (DeadlineExceeded, isl.Error) as e:
        failure: Exception = e
    if fixed is None:
        run.give_up("dependences analysed at the call's sizes, not for every size", failure)
        options = dataclasses.replace(options, fix_parameters_before_scheduling=True)
        scop = build_scop(cdef, sizes)
        try:
            return scop, _dependences(scop, max(run.limit(), 0.5 * run.seconds)), options
        except (DeadlineExceeded, isl.Error) as e:
            failure = e
    run.give_up("dependences over-approximated, statements in source order, loops "
                "sequential", failure)  # fmt: skip
    return scop, None, options


def _schedule(
    scop: Scop, deps: Dependences, options: MappingOptions, run: _Run
) -> tuple[isl.Schedule, MappingOptions]:
    """isl's schedule under the options' fusion, else under `Min`, else source order.
    A schedule that breaks the skewing or orthant rule falls back the same way,
    silently: that is what those options mean."""
    for fusion in dict.fromkeys((options.outer_schedule_fusion, Fusion.MIN)):
        limit = run.limit()
        if limit <= 0:
            break
        try:
            schedule = _isl_schedule(scop, deps, fusion, limit)
        except (DeadlineExceeded, isl.Error) as e:
            run.give_up(f"{fusion.value} fusion abandoned", e)
            continue
        if acceptable(schedule, options):
            return schedule, dataclasses.replace(options, outer_schedule_fusion=fusion)
    if run.limit() <= 0 and not run.fallbacks:
        run.give_up("statements scheduled in source order", DeadlineExceeded(run.seconds))
    return original_order(scop, deps), options


# --- the isl computations, each in a child process ---------------------------------------

_SEPARATOR = "\n;;\n"


def _dependences(scop: Scop, seconds: float) -> Dependences:
    def compute() -> str:
        d = compute_dependences(scop)
        return _SEPARATOR.join(m.to_str() for m in (d.raw, d.war, d.waw, d.reductions))

    raw, war, waw, reductions = (
        isl.UnionMap(text, context=scop.ctx)
        for text in run_bounded(compute, seconds).split(_SEPARATOR)
    )
    return Dependences(raw, war, waw, reductions)


def _isl_schedule(scop: Scop, deps: Dependences, fusion: Fusion, seconds: float) -> isl.Schedule:
    def compute() -> str:
        return str(isl_schedule(scop, deps, fusion).to_str())

    text = run_bounded(compute, seconds)
    return isl.Schedule.read_from_str(scop.ctx, text)


def _reason(e: Exception) -> str:
    """Why isl stopped, in words that finish "isl ..."."""
    if isinstance(e, DeadlineExceeded):
        return f"ran past {e.seconds:g} s"
    text = str(e).strip()
    if "operations exceeded" in text:
        return "exceeded its operation budget"
    line = text.splitlines()[0] if text else "an unknown error"
    line = line.split(" in /")[0].split(" failed: ")[-1]  # drop isl's call and location
    return f"failed ({line})"
