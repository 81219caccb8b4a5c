"""A contraction's point loops run by a block's warps on the tensor cores, as the
`MatrixTile` mark of the mapping says (`tcpy.mapping.gpu.matrix`).

Under the mark stand the loops of the block's tile (rows, columns, the reduction
tile) around the contraction's statement, its operands read from their tiles in
shared memory. Warp `w` of the block computes the outputs of rows `w / warps_c` and
columns `w % warps_c` of a grid of warp tiles, in `mma.sync` pieces (m16n8k16;
m16n8k8 for tf32): its accumulators (`tc_d[m][n][4]`, float32, the instruction's
layout: lane `L` holds rows `L/4` and `L/4 + 8`, columns `2(L%4)` and the one after)
start at zero for a `+=!` (else are loaded from the outputs) where the reduction
starts, are kept across the reduction's tiles (`print_held_matrix`, under the
`private` mark) and stored after them through the kernel's epilogue
(`stored_value`), each guarded by the loops' bounds. Each step along the reduction
loads the operands' fragments from shared memory with `ldmatrix` (`.trans` where
a tile's rows run along its row or column index; tf32: each lane its own elements,
rounded) and multiplies them. The operand tiles' rows are whole 16-byte pieces and a
skew (`tcpy.codegen.shared_copy`), and hold zeros outside the tensors, so a partial
tile along the reduction adds nothing.

The printer reads the iterators, bounds and operand reads from the isl AST under
the mark and the statement's own printing (an element's index is the read's index
with the iterators declared at that element), so what the warps compute is the
statement's instances the loops would have run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from tcpy.codegen.exprs import Read, StatementParts
from tcpy.codegen.loops import FOR, Header, walk
from tcpy.codegen.thread_tile import ThreadPrinter
from tcpy.errors import InternalError
from tcpy.mapping.gpu.device import WARP
from tcpy.mapping.gpu.matrix import along_reduction
from tcpy.mapping.marks import Mark, MatrixTile, of_ast
from tcpy.parser.contractions import classify

THREAD = "(int)(threadIdx.x + blockDim.x * threadIdx.y)"
MMA = {"f16": "TC_MMA_F16", "bf16": "TC_MMA_BF16", "tf32": "TC_MMA_TF32", "tf32x3": "TC_MMA_TF32"}
ROWS, COLUMNS = 16, 8  # an instruction's outputs
DEPTH = {"f16": 16, "bf16": 16, "tf32": 8, "tf32x3": 8}  # m16n8k16, m16n8k8


@dataclass(frozen=True)
class MatrixNest:
    """The loops under a `MatrixTile` mark and their statement: the rows' loop,
    the columns', the reduction's, the statement's parts and its two operand reads
    (from shared memory), with whether each operand's tile runs along the reduction
    in memory (`ldmatrix` without `.trans`)."""

    mark: MatrixTile
    rows: Header
    columns: Header
    reduction: Header
    parts: StatementParts
    left: Read
    right: Read
    left_along: bool
    right_along: bool
    initialised: bool  # a `+=!`: each output's reduction starts at the identity
    values: dict[str, str]  # each index of the statement's, as printed
    outputs: tuple[str, ...]  # the statement's output indices

    @property
    def fragments(self) -> tuple[int, int]:
        """The instruction tiles of a warp along the rows and the columns."""
        return fragments(self.mark)


def fragments(mark: MatrixTile) -> tuple[int, int]:
    """The instruction tiles of a warp of `mark`'s block along the rows and the columns."""
    rows, columns, _ = mark.tile
    return rows // mark.warps[0] // ROWS, columns // mark.warps[1] // COLUMNS


@dataclass
class HeldMatrix:
    """The accumulators of a warp held across the reduction's tile loops (under a
    `private` mark): its mark, and the nest once found."""

    mark: MatrixTile
    nest: MatrixNest | None = None


def matrix_below(node: isl.AstNode) -> MatrixTile | None:
    """The `MatrixTile` mark under `node`, if any."""
    return next((m for n, _ in walk(node) if isinstance(m := of_ast(n), MatrixTile)), None)


def find_matrix_nest(p: ThreadPrinter, mark: MatrixTile, node: isl.AstNode) -> MatrixNest:
    """The nest under `mark`: three loops around the statement, told apart by the
    reads of the mark's operands (the rows' loop in the left operand's index, the
    columns' in the right's, the reduction's in both)."""
    loops: list[Header] = []
    while node.get_type() == FOR:
        loops.append(p.loop_header(node))
        node = node.for_get_body()
    instance = p.reduction_at(node)
    if len(loops) != 3 or instance is None:
        raise InternalError(f"a matrix tile's nest is not three loops around a reduction: {mark}")
    parts = p.bodies.parts(instance.source, instance.values, ids=instance.ids())
    reads = {}
    for name in mark.tensors:
        copy = p.bodies.copies.get(name)
        found = [r for r in parts.reads if copy is not None and r.array == copy.buffer]
        if len(found) != 1:
            raise InternalError(
                f"a matrix tile's operand {name} is not read once from shared memory"
            )
        reads[name] = found[0]
    left, right = reads[mark.tensors[0]], reads[mark.tensors[1]]
    by_role = {}
    for loop in loops:
        role = (loop.id in left.ids, loop.id in right.ids)
        by_role[role] = loop
    if set(by_role) != {(True, False), (False, True), (True, True)}:
        raise InternalError(
            f"a matrix tile's loops do not play rows, columns and reduction: {mark}"
        )
    st = instance.source
    c = classify(st, p.scop.cdef)
    if c is None or (c.left.tensor, c.right.tensor) != mark.tensors:
        raise InternalError(f"a matrix tile's statement is not its contraction: {mark}")
    along = [along_reduction(c, c.left), along_reduction(c, c.right)]
    initialised = st.op.value.endswith("!")
    return MatrixNest(
        mark, by_role[True, False], by_role[False, True], by_role[True, True],
        parts, left, right, along[0], along[1], initialised, instance.values, st.indices,
    )  # fmt: skip


def declare_accumulators(p: ThreadPrinter, mark: MatrixTile, depth: int) -> None:
    """`tc_d`, a warp's accumulators for `mark`'s tile, and `tc_held`, set once they
    are loaded."""
    m, n = fragments(mark)
    p.emit(depth, f"float tc_d[{m}][{n}][4];")
    p.emit(depth, "bool tc_held = false;")


def print_matrix_tile(p: ThreadPrinter, nest: MatrixNest, depth: int) -> None:
    """The warps' code for `nest` (the block's tile at one reduction tile), its
    accumulators declared above (`print_held_matrix`): loaded the first time, or set
    to 0 where the statement is a `+=!` (the kernel runs each output's whole
    reduction, which starts at the identity: the initialisation's kernel, where the
    mapping keeps one, wrote it, and none is read), then each step along the
    reduction."""
    p.emit(depth, "{")
    at = depth + 1
    warp_place(p, nest.mark, at)
    p.emit(at, "if (!tc_held) {")
    if nest.initialised:  # the reduction starts at the identity
        p.emit(at + 1, "#pragma unroll")
        p.emit(at + 1, f"for (int tc_j = 0; tc_j < {math.prod(nest.fragments) * 4}; tc_j++)")
        p.emit(at + 2, "(&tc_d[0][0][0])[tc_j] = 0.0f;")
    else:
        current = f"tc_d[tc_m][tc_n][tc_e] = (tc_in) ? {nest.parts.current} : 0.0f;"
        each_accumulator(p, nest, current, at + 1)
    p.emit(at + 1, "tc_held = true;")
    p.emit(at, "}")
    _steps(p, nest, at)
    p.emit(depth, "}")


def _steps(p: ThreadPrinter, nest: MatrixNest, depth: int) -> None:
    """Each step of the instruction's depth along the reduction tile: the operands'
    fragments (`_half_fragments`, `_tf32_fragments`), then every instruction of the
    warp's tile; tf32x3 makes three, the products of the rounded rests first."""
    m, n = nest.fragments
    kind = nest.mark.kind
    p.emit(depth, "#pragma unroll")
    p.emit(depth, f"for (int tc_k = 0; tc_k < {nest.mark.tile[2]}; tc_k += {DEPTH[kind]}) {{")
    at = depth + 1
    p.emit(at, f"unsigned tc_a[{m}][4], tc_b[{n}][2];")
    if kind == "tf32x3":
        p.emit(at, f"unsigned tc_as[{m}][4], tc_bs[{n}][2];")
    if kind in ("tf32", "tf32x3"):
        _tf32_fragments(p, nest, at, split=kind == "tf32x3")
    else:
        _half_fragments(p, nest, at)
    body = _unrolled(p, (("tc_m", m), ("tc_n", n)), at)
    products = [("tc_as", "tc_b"), ("tc_a", "tc_bs")] if kind == "tf32x3" else []
    for a, b in [*products, ("tc_a", "tc_b")]:
        p.emit(body, f"{MMA[kind]}(tc_d[tc_m][tc_n], {a}[tc_m], {b}[tc_n], tc_d[tc_m][tc_n]);")
    _close(p, body, at)
    p.emit(depth, "}")


def _tf32_fragments(p: ThreadPrinter, nest: MatrixNest, depth: int, split: bool) -> None:
    """The float32 operands' fragments of a step (m16n8k8), each lane loading its own
    elements (left: rows `L/4` and `L/4 + 8`, reduction `L%4` and `L%4 + 4`; right:
    column `L/4`, the same reduction) and rounding them to tf32 (`cvt.rna`); with
    `split`, also the tf32 rounding of each element's rest (`tc_as`, `tc_bs`)."""
    m, n = nest.fragments
    rows, columns, k = nest.rows.iterator, nest.columns.iterator, nest.reduction.iterator
    left = {
        rows: "tc_wr + tc_m * 16 + (tc_lane >> 2) + (tc_r & 1) * 8",
        k: "tc_k + (tc_lane & 3) + (tc_r >> 1) * 4",
    }
    right = {columns: "tc_wc + tc_n * 8 + (tc_lane >> 2)", k: "tc_k + (tc_lane & 3) + tc_r * 4"}
    for counter, count, registers, place, read, name in (
        ("tc_m", m, 4, left, nest.left, "tc_a"),
        ("tc_n", n, 2, right, nest.right, "tc_b"),
    ):
        body = _unrolled(p, ((counter, count), ("tc_r", registers)), depth)
        values = " ".join(f"const int {it} = {v};" for it, v in place.items())
        p.emit(body, f"{values} const float tc_x = {read.text};")
        p.emit(body, f"{name}[{counter}][tc_r] = TC_TO_TF32(tc_x);")
        if split:
            rest = f"tc_x - __uint_as_float({name}[{counter}][tc_r])"
            p.emit(body, f"{name}s[{counter}][tc_r] = TC_TO_TF32({rest});")
        _close(p, body, depth)


def _half_fragments(p: ThreadPrinter, nest: MatrixNest, at: int) -> None:
    """The half-precision operands' fragments of a step (m16n8k16) from shared memory,
    lane L giving the address of a row of 8 elements of matrix L / 8: the left
    operand's 16x16 piece by `ldmatrix.x4`, matrices (r, k), (r+8, k), (r, k+8),
    (r+8, k+8); the right's two 16x8 pieces at once by `.x4`, (k, c), (k+8, c),
    (k, c+8), (k+8, c+8) (one by `.x2` where the warp has one column of pieces);
    `.trans` where the tile's rows run along the reduction index."""
    m, n = nest.fragments
    rows, columns, k = nest.rows.iterator, nest.columns.iterator, nest.reduction.iterator
    if nest.left_along:
        left = {rows: "tc_wr + tc_m * 16 + (tc_lane & 15)", k: "tc_k + (tc_lane >> 4) * 8"}
    else:
        left = {
            rows: "tc_wr + tc_m * 16 + (tc_lane >> 3 & 1) * 8",
            k: "tc_k + (tc_lane >> 4) * 8 + (tc_lane & 7)",
        }
    pairs = n % 2 == 0  # lanes 16..31 address the next piece's matrices
    piece = "(tc_n + (tc_lane >> 4)) * 8" if pairs else "tc_n * 8"
    if nest.right_along:
        right = {columns: f"tc_wc + {piece} + (tc_lane & 7)", k: "tc_k + (tc_lane >> 3 & 1) * 8"}
    else:
        right = {columns: f"tc_wc + {piece}", k: "tc_k + (tc_lane & 15)"}
    load_a = f"TC_LDMATRIX(4, {_trans(nest.left_along)}, tc_a[tc_m]"
    _fragments(p, "tc_m", m, left, nest.left, load_a, at)
    # two pieces' registers from the whole array (a row of it holds one piece's)
    b = "&tc_b[0][0] + tc_n * 2" if pairs else "tc_b[tc_n]"
    load_b = f"TC_LDMATRIX({4 if pairs else 2}, {_trans(nest.right_along)}, {b}"
    _fragments(p, "tc_n", n, right, nest.right, load_b, at, step=2 if pairs else 1)


def _trans(along: bool) -> str:
    return "false" if along else "true"


def _fragments(
    p: ThreadPrinter,
    counter: str,
    count: int,
    at: dict[str, str],
    read: Read,
    load: str,
    depth: int,
    step: int = 1,
) -> None:
    """The `ldmatrix` of each of `count` fragments (`counter`, `step` at a time), the
    lane's row address the read's index with the iterators at `at`."""
    p.emit(depth, "#pragma unroll")
    p.emit(depth, f"for (int {counter} = 0; {counter} < {count}; {counter} += {step}) {{")
    values = " ".join(f"const int {it} = {v};" for it, v in at.items())
    p.emit(depth + 1, f"{values} {load}, {read.array}, {read.index});")
    p.emit(depth, "}")


def each_accumulator(p: ThreadPrinter, nest: MatrixNest, line: str, depth: int) -> None:
    """`line` for each accumulator of the lane (`tc_m`, `tc_n`, `tc_e`), the rows' and
    columns' iterators declared at its element and `tc_in` whether the loops reach
    it."""
    m, n = nest.fragments
    at = _unrolled(p, (("tc_m", m), ("tc_n", n), ("tc_e", 4)), depth)
    p.emit(at, _element_at(nest, "tc_e", "(tc_e & 1)"))
    p.emit(at, line)
    _close(p, at, depth)


def _unrolled(p: ThreadPrinter, loops: tuple[tuple[str, int], ...], depth: int) -> int:
    """Opens a nest of unrolled loops, each counter from 0 to its count; returns the
    depth of its body (`_close` closes it)."""
    for k, (counter, count) in enumerate(loops):
        p.emit(depth + k, "#pragma unroll")
        p.emit(depth + k, f"for (int {counter} = 0; {counter} < {count}; {counter}++) {{")
    return depth + len(loops)


def _close(p: ThreadPrinter, body: int, depth: int) -> None:
    """Closes the loops opened from `depth` down to the body at `body`."""
    for k in reversed(range(depth, body)):
        p.emit(k, "}")


def warp_place(p: ThreadPrinter, mark: MatrixTile, depth: int) -> None:
    """Declares the lane, the warp, and the first row and column of the warp's tile."""
    rows, columns = mark.tile[0] // mark.warps[0], mark.tile[1] // mark.warps[1]
    p.emit(depth, f"const int tc_lane = {THREAD} % {WARP}, tc_warp = {THREAD} / {WARP};")
    p.emit(depth, f"const int tc_wr = tc_warp / {mark.warps[1]} * {rows};")
    p.emit(depth, f"const int tc_wc = tc_warp % {mark.warps[1]} * {columns};")


def store_accumulators(p: ThreadPrinter, nest: MatrixNest, depth: int) -> None:
    """The lane's accumulators stored into the outputs the loops reach, each through
    the kernel's epilogue (`stored_value`): each pair of adjacent columns as one
    `float2` where the outputs are float32 in a tensor and, at run time, the pair's
    elements are adjacent and on 8 bytes; else one by one."""
    warp_place(p, nest.mark, depth)
    parts = nest.parts
    if parts.in_copy or parts.compute != "float" or parts.storage != "float":
        value = stored_value(p, nest, "tc_d[tc_m][tc_n][tc_e]", "tc_r")
        each_accumulator(p, nest, f"if (tc_in) {{ {value} {parts.target} = tc_r; }}", depth)
        return
    m, n = nest.fragments
    at = _unrolled(p, (("tc_m", m), ("tc_n", n), ("tc_h", 2)), depth)
    p.emit(at, "int tc_i[2]; bool tc_ok[2]; float tc_s[2];")
    for e in range(2):
        place = _element_at(nest, "tc_h * 2", e)
        value = stored_value(p, nest, f"tc_d[tc_m][tc_n][tc_h * 2 + {e}]", "tc_r")
        p.emit(at, f"{{ {place} tc_i[{e}] = {parts.element}; tc_ok[{e}] = tc_in;")
        p.emit(at + 1, f"if (tc_in) {{ {value} tc_s[{e}] = tc_r; }} }}")
    aligned = f"((unsigned long long)&{parts.array}[tc_i[0]] & 7) == 0"
    p.emit(at, f"if (tc_ok[0] && tc_ok[1] && tc_i[1] - tc_i[0] == 1 && {aligned}) {{")
    p.emit(at + 1, f"TC_STV(float2, {parts.array}, tc_i[0]) = make_float2(tc_s[0], tc_s[1]);")
    p.emit(at, "} else {")
    for e in range(2):
        p.emit(at + 1, f"if (tc_ok[{e}]) TC_ST({parts.array}, tc_i[{e}]) = tc_s[{e}];")
    p.emit(at, "}")
    _close(p, at, depth)


def stored_value(p: ThreadPrinter, nest: MatrixNest, accumulator: str, name: str) -> str:
    """Statements declaring `name`, the value an output of the contraction is stored
    with: the accumulator as the tensor stores it, then each statement of the
    kernel's epilogue (`MappedKernel.epilogue`) in turn, computed from the values of
    this output kept in locals (its reads of the tensors the kernel writes read those
    locals, each value rounded as its tensor stores it); a statement writing another
    tensor stores its value there. The rows' and columns' iterators are declared at
    the output's element."""
    parts = nest.parts
    lines = [f"{parts.storage} {name} = {parts.store(accumulator)};"]
    mine = _load(p, parts)
    local = {mine: name}  # a load of a written tensor at the element -> its local
    assert p.kernel is not None
    for k, statement in enumerate(p.kernel.epilogue):
        st = p.scop.statement(statement).source(p.scop.cdef)
        values = dict(zip(st.indices, (nest.values[i] for i in nest.outputs), strict=True))
        step = p.bodies.parts(st, values, substitute=local)
        if any(load in step.value or any(load in d for d in step.prelude) for load in local):
            raise InternalError(f"an epilogue reads an output off its element: {st.text}")
        load = _load(p, step)
        own = local.get(load, f"{name}_{k}")
        if load not in local:
            lines.append(f"{step.storage} {own};")
        lines.append(step.wrap(f"{own} = {step.store(step.value)};"))
        if load != mine:
            lines.append(f"{step.target} = {own};")
        local[load] = own
    return " ".join(lines)


def _load(p: ThreadPrinter, parts: StatementParts) -> str:
    """The text of a read of the element `parts` writes, as a statement prints it
    (`Read.text`: the load, before any conversion to the compute type)."""
    return p.dialect.load.format(array=parts.array, index=parts.element)


def _element_at(nest: MatrixNest, register: str, column: int | str) -> str:
    """Declarations of the rows' and columns' iterators at the element of the lane's
    accumulator `register` of fragment (`tc_m`, `tc_n`) in column `column` of its
    pair, and of `tc_in`, whether the loops reach it."""
    rows, columns = nest.rows, nest.columns
    row = f"tc_wr + tc_m * 16 + (tc_lane >> 2) + (({register}) >> 1) * 8"
    col = f"tc_wc + tc_n * 8 + (tc_lane & 3) * 2 + {column}"
    reached = f"{rows.iterator} >= {rows.init} && {rows.cond} && "
    reached += f"{columns.iterator} >= {columns.init} && {columns.cond}"
    return (
        f"const int {rows.iterator} = {row}; const int {columns.iterator} = {col}; "
        f"const bool tc_in = {reached};"
    )


def print_held_matrix(
    p: ThreadPrinter,
    mark: MatrixTile,
    inner: isl.AstNode,
    depth: int,
    marks: tuple[Mark, ...],
    held: HeldMatrix,
) -> None:
    """The code under a `private` mark above a matrix tile: the warp's accumulators
    declared, `inner` (the reduction's tile loops, whose matrix tile loads them the
    first time, `held`), and stored after them."""
    p.emit(depth, "{")
    declare_accumulators(p, mark, depth + 1)
    p.node(inner, depth + 1, marks)
    if held.nest is not None:
        p.emit(depth + 1, "if (tc_held) {")
        store_accumulators(p, held.nest, depth + 2)
        p.emit(depth + 1, "}")
    p.emit(depth, "}")
