"""The printer both targets share: a walk over a kernel's isl AST with one method per
node kind, and what its loops, guards and statements print as in either dialect.

`Printer.node` dispatches on the node's kind; a mark node goes to `Printer.mark`,
which the target's printer overrides for the marks it prints (`tcpy.mapping.marks`).
A loop that only reduces into one element keeps its accumulator in a local across
the loop (register promotion); the TC statements each top-level nest computes are
printed as comments above it. `CPrinter` (`tcpy.codegen.c`) and `CudaPrinter`
(`tcpy.codegen.cuda`) add their dialect's pragmas, copies and launch structure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import islpy as isl

from tcpy.codegen.ast_build import Ast, UserStatement
from tcpy.codegen.dialect import C, Dialect
from tcpy.codegen.exprs import (
    BodyPrinter,
    CheckedLocal,
    Helpers,
    Read,
    StatementParts,
    checked_load,
    local_for,
)
from tcpy.codegen.isl_exprs import expr_ids, isl_expr
from tcpy.codegen.loops import (
    COUNT_LOOP,
    FOR,
    IF,
    Header,
    contains_for,
    loop_depth,
    user_statements,
)
from tcpy.errors import InternalError
from tcpy.mapping.marks import Collapse, Mark, loop_marks, of_ast
from tcpy.mapping.options import MappingOptions
from tcpy.naming import tensor_name
from tcpy.parser import ast as tc
from tcpy.parser.checked import CheckedDef, CheckedStatement
from tcpy.poly.isl_helpers import ast_children
from tcpy.poly.scop import Kind, Scop
from tcpy.types import ScalarType

_OPENMP_REDUCTION = {
    tc.Reduction.SUM: "+",
    tc.Reduction.PROD: "*",
    tc.Reduction.MIN: "min",
    tc.Reduction.MAX: "max",
}


@dataclass(frozen=True, eq=False)
class Instance:
    """A statement as a user node of the AST runs it: the TC statement, the value of
    each of its indices as an isl expression of the loop iterators (`exprs`) and as
    printed (`values`)."""

    source: CheckedStatement
    exprs: dict[str, isl.AstExpr]
    values: dict[str, str]
    user: UserStatement

    def uses(self, index: str, *ids: str) -> bool:
        """Whether the value of TC index `index` uses one of the isl ids `ids`."""
        return not expr_ids(self.exprs[index]).isdisjoint(ids)

    def ids(self) -> dict[str, frozenset[str]]:
        """The isl ids each TC index's value uses."""
        return {v: expr_ids(e) for v, e in self.exprs.items()}

    def element_uses(self, *ids: str) -> bool:
        """Whether the element the statement writes moves with one of the ids `ids` (a
        scatter-add's is taken to move with every loop)."""
        if self.source.scatter:
            return True
        return any(self.uses(v, *ids) for v in self.source.indices)

    def same(self, other: Instance) -> bool:
        """Whether `other` is the same statement at the same index values."""
        return self.source is other.source and self.values == other.values


def _statements(node: isl.AstNode, guarded: bool = False) -> Iterator[tuple[isl.AstNode, bool]]:
    """The statements (user nodes) below `node`, in order, each with whether a test
    below `node` guards it (`guarded`: one above does)."""
    kind = node.get_type()
    if kind == isl.ast_node_type.user:
        yield node, guarded
    elif kind == FOR:
        yield from _statements(node.for_get_body(), guarded)
    elif kind == IF:
        yield from _statements(node.if_get_then_node(), True)
        if node.if_has_else_node():
            yield from _statements(node.if_get_else_node(), True)
    elif kind == isl.ast_node_type.block:
        for child in ast_children(node):
            yield from _statements(child, guarded)
    elif kind == isl.ast_node_type.mark:
        yield from _statements(node.mark_get_node(), guarded)


@dataclass
class Printer:
    """The walk over a kernel's isl AST that both targets share: one method per node
    kind (`node` dispatches), a hook per mark (`mark`), and the loop, guard and
    statement forms both dialects write. A target's printer overrides what its
    dialect prints differently (`CPrinter`, `CudaPrinter`)."""

    scop: Scop
    ast: Ast
    options: MappingOptions
    dialect: Dialect = C
    helpers: Helpers = field(default_factory=Helpers)
    lines: list[str] = field(default_factory=list)
    count_loops: bool = False  # a counting build: a counter per loop (`COUNT_LOOP`)
    counted: int = 0  # the loops counted so far, across the kernels of a source

    def __post_init__(self) -> None:
        self.bodies = BodyPrinter(self.scop.cdef, self.dialect, self.helpers, sizes=self.scop.sizes)
        # isl's parameters already carry the C names of the sizes; CUDA adds the block
        # and thread parameters' spellings
        self.names: dict[str, str] = {}
        self.locals = 0  # hoisted reads so far: tc_h0, tc_h1, ...
        self.substitute: dict[str, str] = {}  # reads loaded into locals (`invariant_reads`)
        self.copies = 0  # packed tiles so far: tc_pack0, tc_pack1, ...
        self.arena_at = 0  # bytes of the thread's buffers the copy sites outside hold
        self.shared_starts: dict[str, int] = {"": 0}  # the copies made once (`pack.shared_starts`)

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def open_loop(self, depth: int, header: str) -> None:
        """A loop's header (`for (...) {`) and, in a counting build, the count of its
        iterations as the first statement of its body."""
        self.emit(depth, header)
        if self.count_loops:
            self.emit(depth + 1, f"{COUNT_LOOP}({self.counted});")
            self.counted += 1

    # --- nodes ------------------------------------------------------------------
    def node(self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...] = ()) -> None:
        kind = node.get_type()
        if kind == FOR:
            self.for_(node, depth, marks)
        elif kind == IF:
            self.if_(node, depth, marks)
        elif kind == isl.ast_node_type.block:
            for child in ast_children(node):
                self.node(child, depth, marks)
        elif kind == isl.ast_node_type.mark:
            mark = of_ast(node)
            if mark is None:
                raise InternalError(f"an isl mark that is no tcpy mark: {node.mark_get_id()}")
            self.mark(mark, node, depth, marks)
        elif kind == isl.ast_node_type.user:
            self.user(node, depth)
        else:
            raise InternalError(f"unexpected isl AST node {kind}")

    def mark(self, mark: Mark, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        """The code under mark node `node` (`mark`, from `tcpy.mapping.marks`): by
        default the code below it, with the mark among those that apply there."""
        self.node(node.mark_get_node(), depth, (*marks, mark))

    def for_(
        self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...], shared: str | None = None
    ) -> None:
        """A loop; with `shared` (its clauses), the worksharing loop of a nest inside the
        kernel's parallel region (`#pragma omp for`), else a loop of its own."""
        loop = self.loop_header(node)
        iterator, header = loop.iterator, loop.text
        body = node.for_get_body()
        here = loop_marks(marks, loop_depth(node))
        accumulator = None if here else self.accumulator(body, loop)
        if accumulator is not None:
            self.promoted(accumulator, loop, depth)
            return
        start = len(self.lines)
        innermost = not contains_for(body)
        hoisted = self.invariant_reads(body, loop) if innermost and self.hoists else []
        inner = self.collapsed(body, iterator, marks) if shared is not None else None
        if inner is not None:  # the two loops share out as one: nothing between them
            self.emit(depth, header)
            self.open_loop(depth, inner.text)
            self.node(body.for_get_body(), depth + 1, marks)
            self.emit(depth, "}")
            shared = f" collapse(2){shared}"
        else:
            self.open_loop(depth, header)
            loaded = {read.text: local for read, local in hoisted}
            saved, self.substitute = self.substitute, {**self.substitute, **loaded}
            self.node(body, depth + 1, marks)
            self.substitute = saved
        self.emit(depth, "}")
        unroll = unroll_factor(self.options.unroll, self.lines[start + 1 : -1])
        pragmas = self.pragmas(here, innermost=innermost, unroll=unroll, shared=shared)
        declared = self.hoisted(hoisted, loop)
        indent = "  " * depth
        self.lines[start:start] = [indent + line for line in (*declared, *pragmas)]

    def collapsed(self, body: isl.AstNode, outer: str, marks: tuple[Mark, ...]) -> Header | None:
        """The header of the loop that the worksharing loop of `outer` shares out with
        it (`collapse(2)`): its body, when that is a loop marked `omp_collapse`, of no
        other pragma, whose bounds do not use `outer` (OpenMP wants the two
        rectangular)."""
        if body.get_type() != FOR:
            return None
        loop = self.loop_header(body)
        if loop_marks(marks, loop_depth(body)) != (Collapse(loop_depth(body)),):
            return None
        return None if loop.uses(outer) else loop

    hoists = False  # whether invariant reads are hoisted out of innermost loops (C)

    def invariant_reads(self, body: isl.AstNode, loop: Header) -> list[tuple[Read, str]]:
        """The reads of the statements of an innermost loop's `body` that the loop
        does not change (their subscripts do not use the loop's index, and the body
        writes no element of their tensor), each with the local it is loaded into
        before the loop (`hoisted`): a fused nest reading `maxVal[i]` beside the
        `expDist[i][j]` it computes then vectorises. A read whose subscripts are
        checked at run time (`tc_index`: an access proven only under a condition, a
        `?:` guard or a gather) stays in place, as the loop may not evaluate it, and so
        does every read of a statement that a test inside the loop guards; a gather's
        index loaded before the loop is checked there (`CheckedLocal`)."""
        written: set[str] = set()
        reads: list[Read] = []  # every statement's
        always: list[Read] = []  # those of the statements no test guards
        for node, guarded in _statements(body):
            user = self.ast.user(node)
            instance = self.instance(user)
            init = self.scop.statement(user.statement).kind is Kind.INIT
            parts = self.bodies.parts(instance.source, instance.values, init, instance.ids())
            written.add(parts.array)
            reads += parts.reads
            always += [] if guarded else parts.reads
        chosen: dict[str, tuple[Read, str]] = {}
        for r in always:
            if r.array in written or loop.id in r.ids or r.checked:
                continue
            if r.text not in chosen:
                chosen[r.text] = (r, local_for(r, reads, f"tc_h{self.locals}"))
                self.locals += 1
        return list(chosen.values())

    def hoisted(self, reads: list[tuple[Read, str]], loop: Header) -> list[str]:
        """The declarations of the locals `reads` are loaded into, each guarded by
        the loop's first test, so that a loop that runs no iteration reads nothing it
        would not have read."""
        first = loop.first()
        declarations = []
        for read, local in reads:
            ctype, value = self.local_type(read, local), self.local_value(read, local)
            zero = self.dialect.zero.format(ctype=ctype)
            value = value if first is None else f"({first}) ? {value} : {zero}"
            declarations.append(f"const {ctype} {local} = {value};")
        return declarations

    def local_type(self, read: Read, local: str) -> str:
        """The C type of the local `read` is loaded into: a checked index's is 64-bit."""
        checked = isinstance(local, CheckedLocal)
        return self.dialect.ctype(ScalarType.INT64 if checked else self.read_type(read))

    @staticmethod
    def local_value(read: Read, local: str) -> str:
        """What the local `read` is loaded into holds: its value, checked where the
        local is a `CheckedLocal`."""
        return checked_load(read) if isinstance(local, CheckedLocal) else read.text

    def read_type(self, read: Read) -> ScalarType:
        """The scalar type of the tensor (or copy of one) that `read` loads from."""
        for info in self.scop.cdef.tensors:
            if tensor_name(info.name) == read.array:
                return info.scalar
        for name, copy in self.bodies.copies.items():
            if copy.buffer == read.array:
                return self.scop.cdef.tensor(name).scalar
        raise InternalError(f"a read of {read.array}, which is no tensor or copy")

    def accumulator(self, body: isl.AstNode, loop: Header) -> Instance | None:
        """The statement of a loop that only reduces into one element (the loop's
        index is not among the element's), whose accumulator can then live in a
        register across the loop."""
        found = self.reduction_at(body)
        if found is None or found.element_uses(loop.id):
            return None
        return found

    def reduction_at(self, node: isl.AstNode) -> Instance | None:
        """The reduction statement a user node computes, with its index values; None
        for another node or statement."""
        if node.get_type() != isl.ast_node_type.user:
            return None
        user = self.ast.user(node)
        stmt = self.scop.statement(user.statement)
        source = stmt.source(self.scop.cdef)
        if stmt.kind is Kind.INIT or source.op.reduction is None or source.scatter:
            return None  # a scatter-add's element moves: no accumulator, lane or block
        return self.instance(user)

    def instance(self, user: UserStatement, names: Mapping[str, str] | None = None) -> Instance:
        """The statement a user node runs, its index values printed with the printer's
        names (and `names`, which win)."""
        stmt = self.scop.statement(user.statement)
        exprs = dict(zip(stmt.dims, user.indices, strict=True))
        shown = {**self.names, **(names or {})}
        values = {v: isl_expr(e, shown, top=True) for v, e in exprs.items()}
        return Instance(stmt.source(self.scop.cdef), exprs, values, user)

    def loop_header(self, node: isl.AstNode) -> Header:
        return Header.of(node, self.names, self.dialect.index_type)

    def reduction_pragmas(self, clause: str) -> list[str]:
        """Pragmas of a loop whose accumulator lives in a register (`clause`: the
        OpenMP reduction operator): none here."""
        return []

    def promoted(self, instance: Instance, loop: Header, depth: int) -> None:
        """A loop that only reduces `instance` into one element, its accumulator in a
        register across the loop (`tc_acc`), loaded and stored where the loop runs."""
        parts = self.bodies.parts(instance.source, instance.values)
        assert parts.reduction is not None
        clause = _OPENMP_REDUCTION[parts.reduction]
        pragmas = self.reduction_pragmas(clause)
        # OpenMP combines the vector lanes of a min/max reduction with instructions
        # that drop NaN; a flag, or-reduced beside it, remembers that a lane saw one.
        flag = bool(pragmas) and parts.floating and clause in ("min", "max")
        result = "tc_acc"
        lanes = self.reduction_lanes(parts, loop) if pragmas else 0
        first = loop.first()
        self.emit(depth, "{" if first is None else f"if ({first}) {{")
        self.emit(depth + 1, f"{parts.compute} tc_acc = {parts.current};")
        header = loop.text
        if lanes:
            self.partial_results(instance, loop, lanes, depth + 1)
            it = loop.iterator
            header = f"for ({self.dialect.index_type} {it} = tc_r; {loop.cond}; {it}++) {{"
        if flag:
            self.emit(depth + 1, "int tc_nan = tc_acc != tc_acc;")
            pragmas = [f"{p} reduction(|:tc_nan)" for p in pragmas]
            result = f"(tc_nan ? ({parts.compute})NAN : tc_acc)"
        for pragma in pragmas:
            self.emit(depth + 1, pragma)
        self.open_loop(depth + 1, header)
        self.emit(depth + 2, parts.wrap(f"tc_acc = {parts.combine('tc_acc')};"))
        if flag:
            self.emit(depth + 2, "tc_nan |= tc_acc != tc_acc;")
        self.emit(depth + 1, "}")
        if lanes:
            result = parts.merge(result, "tc_lane[0]")
        self.emit(depth + 1, f"{parts.target} = {parts.store(result)};")
        self.emit(depth, "}")

    vector_bytes = 16  # the width of the machine's vectors (`print_c`)

    def reduction_lanes(self, parts: StatementParts, loop: Header) -> int:
        """How many partial results a vectorised reduction loop keeps: four vectors'
        worth, so that four independent chains of additions hide the latency of each
        (one vector accumulator waits 4 cycles per step: a row sum ran at a quarter of
        the speed of the loads); 0 for one accumulator, where the loop is known to be
        short or does not step by one."""
        if loop.step != 1:
            return 0
        lanes = 4 * max(1, self.vector_bytes // parts.itemsize)
        start, last = loop.start, loop.last()
        if start is not None and last is not None and last - start + 1 < 2 * lanes:
            return 0
        return lanes

    def partial_results(self, instance: Instance, loop: Header, lanes: int, depth: int) -> None:
        """The first iterations of a reduction loop, `lanes` at a time, each into its own
        partial result (`tc_lane`), which are then merged into `tc_lane[0]` in a tree;
        the loop that follows runs the rest from `tc_r`. The order of the combination
        changes as a vector reduction's does (`vectorize=False` keeps the sequential
        one); NaN propagates through `merge` as through the statement."""
        parts = self.bodies.parts(instance.source, instance.values)
        ctype, index = parts.compute, self.dialect.index_type
        self.emit(depth, f"{ctype} tc_lane[{lanes}];")
        identity = f"({ctype})({parts.identity})"
        self.emit(depth, f"for (int tc_l = 0; tc_l < {lanes}; tc_l++) tc_lane[tc_l] = {identity};")
        last = loop.cond_at(f"(tc_r + {lanes - 1})")
        self.emit(depth, f"{index} tc_r = {loop.init};")
        self.open_loop(depth, f"for (; {last}; tc_r += {lanes}) {{")
        self.emit(depth + 1, "#pragma omp simd")
        self.emit(depth + 1, f"for (int tc_l = 0; tc_l < {lanes}; tc_l++) {{")
        lane = self.instance(instance.user, {loop.id: "(tc_r + tc_l)"})
        at_lane = self.bodies.parts(lane.source, lane.values)
        self.emit(depth + 2, at_lane.wrap(f"tc_lane[tc_l] = {at_lane.combine('tc_lane[tc_l]')};"))
        self.emit(depth + 1, "}")
        self.emit(depth, "}")
        half = lanes // 2
        while half > 1:
            merged = parts.merge("tc_lane[tc_l]", f"tc_lane[tc_l + {half}]")
            self.emit(depth, f"for (int tc_l = 0; tc_l < {half}; tc_l++) tc_lane[tc_l] = {merged};")
            half //= 2
        self.emit(depth, f"tc_lane[0] = {parts.merge('tc_lane[0]', 'tc_lane[1]')};")

    def pragmas(
        self, marks: tuple[Mark, ...], innermost: bool, unroll: int, shared: str | None = None
    ) -> list[str]:
        """A loop's pragmas, from the loop marks that apply to it, whether it is
        innermost, its unroll factor and (C) its worksharing clauses: none here."""
        return []

    def if_(self, node: isl.AstNode, depth: int, marks: tuple[Mark, ...]) -> None:
        self.emit(depth, f"if ({isl_expr(node.if_get_cond(), self.names, top=True)}) {{")
        self.node(node.if_get_then_node(), depth + 1, marks)
        if node.if_has_else_node():
            self.emit(depth, "} else {")
            self.node(node.if_get_else_node(), depth + 1, marks)
        self.emit(depth, "}")

    def user(self, node: isl.AstNode, depth: int) -> None:
        user = self.ast.user(node)
        stmt = self.scop.statement(user.statement)
        source = stmt.source(self.scop.cdef)
        init = stmt.kind is Kind.INIT
        values = self.instance(user).values
        self.emit(depth, self.bodies.statement(source, init, values, self.substitute))

    # --- the kernel -------------------------------------------------------------
    def top_level(self, depth: int) -> None:
        for nest in self.nests():
            for comment in self.comments(nest):
                self.emit(depth, comment)
            self.node(nest, depth)

    def nests(self) -> list[isl.AstNode]:
        root = self.ast.root
        return list(ast_children(root)) if root.get_type() == isl.ast_node_type.block else [root]

    def comments(self, nest: isl.AstNode) -> list[str]:
        seen: list[tuple[int, bool]] = []
        for name in user_statements(nest, self.ast):
            stmt = self.scop.statement(name)
            key = (stmt.index, stmt.kind is Kind.INIT)
            if key not in seen:
                seen.append(key)
        out = []
        for index, init in sorted(seen, key=lambda t: (t[0], not t[1])):
            text = self.scop.cdef.statements[index].text.replace("*/", "* /")
            out.append(f"/* {text}{'  [initialisation]' if init else ''} */")
        return out


UNROLL_BUDGET = 512  # tokens of C an unrolled loop body may grow to


def unroll_factor(asked: int, body: list[str]) -> int:
    """The unroll factor of a loop whose body prints as `body`: the options' factor,
    lowered to a power of two at which the unrolled body stays within `UNROLL_BUDGET`
    tokens. A heavy body unrolled 64 times costs the C compiler tens of seconds and
    gains nothing once the body no longer fits the instruction cache."""
    size = max(1, sum(_tokens(line) for line in body))
    factor = 1
    while factor * 2 <= asked and factor * 2 * size <= UNROLL_BUDGET:
        factor *= 2
    return factor


def _tokens(text: str) -> int:
    """How many tokens of C `text` holds (a name, a number, or one other character
    that is not a space): the size of a loop's body, which `unroll_factor` weighs."""
    count, k = 0, 0
    while k < len(text):
        c = text[k]
        k += 1
        if c.isspace():
            continue
        count += 1
        if c.isalpha() or c == "_":
            while k < len(text) and (text[k].isalnum() or text[k] == "_"):
                k += 1
        elif c.isdigit():
            while k < len(text) and text[k].isdigit():
                k += 1
            if k < len(text) and text[k] == ".":
                k += 1
                while k < len(text) and text[k].isdigit():
                    k += 1
    return count


def buffer_order(cdef: CheckedDef) -> list[str]:
    """The tensors in the order of the kernel's buffers: inputs, outputs, temporaries."""
    return [t.name for t in (*cdef.inputs, *cdef.outputs, *cdef.temporaries)]


def def_text(cdef: CheckedDef) -> str:
    lines = cdef.source.splitlines()
    return "\n".join(lines[cdef.span.line - 1 : cdef.span.end_line])
