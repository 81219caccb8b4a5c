"""The vectors a GPU thread of a register tile moves (`tcpy.codegen.thread_tile`): its run
of adjacent outputs (`MappedKernel.runs`: loaded, stored and read from shared memory as
one `float2`/`float4`), and the steps of its reduction taken several at a time
(`ThreadRegisters.steps`: an operand's values along them read as one vector, `A(m,k)`'s
row at k..k+3). Each is moved as a vector where, at run time, its elements are adjacent
and aligned, and element by element elsewhere."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tcpy.codegen.dialect import CUDA
from tcpy.codegen.exprs import Read
from tcpy.codegen.isl_exprs import expr_int
from tcpy.codegen.loops import Header
from tcpy.codegen.printer import Printer
from tcpy.naming import tensor_name


@dataclass(frozen=True)
class Strided:
    """A loop strided by the block: `first` (a thread index), then every `step`th value,
    `trips` values at most; `whole` when every thread of the block runs them all."""

    loop: Header
    first: str
    step: int
    trips: int
    whole: bool


VECTOR_ELEMENTS = ("float", "int")
"""The C types a run is moved as one vector of (`float2`, `float4`, `int2`, `int4`)."""

MACROS = {"load": "TC_LD", "readonly_load": "TC_LDG", "copy_load": "TC_SLD"}
"""The access macro of each form of load (`tcpy.codegen.cuda.ACCESS_MACROS`)."""

STEP = "tc_k"
"""The iterator of a reduction loop taken several steps at a time (`open_steps`)."""


def array_type(printer: Printer, array: str) -> str | None:
    """The C type of the elements of `array`: a tensor's, or that of a copy of one."""
    for t in printer.scop.cdef.tensors:
        copy = printer.bodies.copies.get(t.name)
        if array == tensor_name(t.name) or (copy is not None and copy.buffer == array):
            return CUDA.ctype(t.scalar)
    return None


def run_access(
    printer: Printer, run: Strided, macro: str, array: str, index: str, at: int
) -> tuple[str, str, str] | None:
    """For the access `macro` (a load, or `TC_ST`) of one element of `array` at
    `index` along a run (its index changing with `run`'s loop only), declares `tc_a`,
    the element's index at the run's first value, and `tc_b`, its last element's, and
    returns the vector type, the C condition under which the run's elements are
    adjacent from `tc_a` on and aligned to that vector (checked at run time: the
    tensor's address and row length are known only then), and the macro moving it.
    None when the array's elements have no vector type."""
    ctype = array_type(printer, array)
    if ctype not in VECTOR_ELEMENTS:
        return None
    vector = f"{ctype}{run.trips}"
    i = run.loop.iterator
    printer.emit(at, "int tc_a, tc_b;")
    printer.emit(at, f"{{ const int {i} = {run.first}; tc_a = {index}; }}")
    printer.emit(at, f"{{ const int {i} = {run.first} + {run.trips - 1}; tc_b = {index}; }}")
    adjacent = f"tc_b - tc_a == {run.trips - 1}"
    if macro == "TC_SLD":  # a shared array starts on 16 bytes (`__align__(16)`)
        aligned = f"(tc_a & {run.trips - 1}) == 0"
    else:
        aligned = f"((unsigned long long)&{array}[tc_a] & {run.trips * 4 - 1}) == 0"
    moved = {"TC_SLD": "TC_SLDV", "TC_ST": "TC_STV"}.get(macro, "TC_LDV")
    return vector, f"{adjacent} && {aligned}", f"{moved}({vector}, {array}, tc_a)"


def load_run(printer: Printer, run: Strided, read: Read, target: str, at: int) -> None:
    """`target[0]` to `target[trips - 1]`: `read`'s values at each value of `run`'s loop,
    as one vector load where they are adjacent and aligned, else one load each."""
    lanes = "xyzw"[: run.trips]
    printer.emit(at, "{")
    found = None
    if not read.gathers:
        found = run_access(printer, run, MACROS[read.form], read.array, read.index, at + 1)
    if found is not None:
        vector, condition, load = found
        printer.emit(at + 1, f"if ({condition}) {{")
        printer.emit(at + 2, f"const {vector} tc_v = {load};")
        printer.emit(at + 2, " ".join(f"{target}[{n}] = tc_v.{c};" for n, c in enumerate(lanes)))
        printer.emit(at + 1, "} else {")
    for n in range(run.trips):
        value = f"const int {run.loop.iterator} = {run.first} + {n};"
        printer.emit(at + 1 + (found is not None), f"{{ {value} {target}[{n}] = {read.text}; }}")
    if found is not None:
        printer.emit(at + 1, "}")
    printer.emit(at, "}")


def read_runs(printer: Printer, run: Strided, reads: list[Read], at: int) -> None:
    """Declares `tc_r<k>`, the values of each read of `reads` along the thread's run."""
    for k, read in enumerate(reads):
        printer.emit(at, f"{array_type(printer, read.array)} tc_r{k}[{run.trips}];")
        load_run(printer, run, read, f"tc_r{k}", at)


def loop_steps(loop: Header, asked: int) -> int:
    """The steps of `loop` taken at a time: `asked` (`ThreadRegisters.steps`) where the
    loop steps by 1 between constant bounds over a multiple of them, else 1."""
    found, first = loop.bound(), loop.start
    if asked < 2 or loop.step != 1 or first is None or found is None:
        return 1
    inclusive, bound = found
    last = expr_int(bound)
    trips = None if last is None else last - first + inclusive
    return asked if trips is not None and trips > 0 and trips % asked == 0 else 1


def steps_run(loop: Header, steps: int) -> Strided:
    """The `steps` values of `loop` from `STEP` on, as a run (`load_run`)."""
    return Strided(loop, STEP, 1, steps, True)


def open_steps(printer: Printer, loop: Header, steps: int, at: int) -> None:
    """`loop`, `steps` values at a time from `STEP` (its iterator declared inside,
    `step_value`, after the loads of `read_steps`)."""
    found = loop.bound()
    assert found is not None
    inclusive, bound = found
    last = expr_int(bound)
    cond = f"{STEP} {'<=' if inclusive else '<'} {last}"
    printer.emit(at, f"for (int {STEP} = {loop.start}; {cond}; {STEP} += {steps}) {{")


def step_value(printer: Printer, loop: Header, steps: int, at: int) -> None:
    """The unrolled loop over the `steps` values from `STEP`, `loop`'s iterator declared
    at each (`tc_u`: the value's position, which `read_steps`'s locals are read at)."""
    printer.emit(at, "#pragma unroll")
    printer.emit(at, f"for (int tc_u = 0; tc_u < {steps}; tc_u++) {{")
    printer.emit(at + 1, f"const int {loop.iterator} = {STEP} + tc_u;")


def read_steps(
    printer: Printer, run: Strided, reads: list[tuple[Read, tuple[Strided, ...]]], at: int
) -> None:
    """Declares `tc_k<k>[...][steps]`: each read of `reads` at the `steps` values from
    `STEP` on (`run`, `steps_run`), for each combination of the values of the thread's
    strided loops it uses (given with it, outermost first)."""
    for k, (read, loops) in enumerate(reads):
        count = math.prod(s.trips for s in loops)
        printer.emit(at, f"{array_type(printer, read.array)} tc_k{k}[{count}][{run.trips}];")
        printer.emit(at, "#pragma unroll")
        printer.emit(at, f"for (int tc_p = 0; tc_p < {count}; tc_p++) {{")
        declare_indices(printer, loops, "tc_p", 1, at + 1)
        load_run(printer, run, read, f"tc_k{k}[tc_p]", at + 1)
        printer.emit(at, "}")


def declare_indices(
    printer: Printer, strided: tuple[Strided, ...], j: str, inner: int, at: int
) -> None:
    """The indices of `strided` loops at output `j` of a tile (the last varying
    fastest, after `inner` outputs of loops inside them)."""
    for s in reversed(strided):
        at_j = j if len(strided) == 1 and inner == 1 else _position(j, inner, s.trips)
        index = f"{s.first} + ({at_j}) * {s.step}"
        printer.emit(at, f"const {printer.dialect.index_type} {s.loop.iterator} = {index};")
        inner *= s.trips


def combination(strided: tuple[Strided, ...], used: tuple[Strided, ...], j: str) -> str:
    """The C expression of the combination of `used` loops' values (`read_steps`'s
    `tc_p`, the last varying fastest) at output `j` of a tile over `strided` loops."""
    terms = []
    inner, inner_used = 1, 1
    for s in reversed(strided):
        if s in used:
            position = _position(j, inner, s.trips)
            terms.append(f"({position}) * {inner_used}" if inner_used > 1 else f"({position})")
            inner_used *= s.trips
        inner *= s.trips
    return " + ".join(reversed(terms)) or "0"


def _position(j: str, inner: int, trips: int) -> str:
    """The C expression of a loop's position at output `j` of a tile, `inner` outputs of
    the loops inside it apart, over `trips` values."""
    return f"{j} / {inner} % {trips}" if inner > 1 else f"{j} % {trips}"
