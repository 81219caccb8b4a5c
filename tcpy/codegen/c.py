"""isl AST -> C with OpenMP: one method per AST node kind.

The kernel is `int tc_kernel(const int64_t *sizes, void *const *buffers, int threads)`:
sizes in the order of the definition's size symbols, buffers in the order inputs,
outputs, temporaries, and the number of OpenMP threads to run on (chosen at each call,
so no kernel is built for a thread count); it returns 0, or a status code when the data
made the computation undefined (an integer division by zero, an index out of range).

Marks in the schedule tree become pragmas on the loop the marked band generates (the
mark `omp_parallel@3` belongs to the loop of schedule depth 3, which isl names `c3`,
and to no loop if isl dropped that loop as a single iteration):
`omp_parallel` -> `#pragma omp for`, `omp_simd` -> `#pragma omp simd`; the
innermost loops get `#pragma GCC unroll` when the options ask for unrolling. A loop
that only reduces into one element keeps its accumulator in a local (register
promotion) under `#pragma omp simd reduction`, which reassociates the reduction as TC
allows. Under a `register_tile:RxV` mark (`tcpy.mapping.registers`) the block of
outputs lives in a local array `tc_reg[R][V]` across the reduction loops. The TC
statements computed by each top-level loop nest are printed as comments above it.

A kernel with parallel loops runs its nests in one `#pragma omp parallel` region
(`_Printer.region`): threads are started once per call, not once per nest, and wait
for each other only where a nest needs what an earlier one wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import islpy as isl

from tcpy.codegen.ast_build import Ast, UserStatement
from tcpy.codegen.c_helpers import helper_source, vector_math_declarations
from tcpy.codegen.dialect import C, Dialect
from tcpy.codegen.exprs import (
    BodyPrinter,
    Helpers,
    StatementParts,
    isl_expr,
    sym_expr,
)
from tcpy.codegen.naming import extent_name, size_name, tensor_name
from tcpy.errors import InternalError
from tcpy.mapping.options import MappingOptions
from tcpy.parser import ast as tc
from tcpy.parser.checked import CheckedDef, CheckedStatement, Role
from tcpy.poly.isl_helpers import ast_children
from tcpy.poly.scop import Kind, Scop

KERNEL_SYMBOL = "tc_kernel"
CONSERVATIVE_MACRO = "TC_CONSERVATIVE"  # defined by a build that retries with safe flags
_FOR = isl.ast_node_type.for_  # type: ignore[attr-defined]
_IF = isl.ast_node_type.if_  # type: ignore[attr-defined]
_OPENMP_REDUCTION = {
    tc.Reduction.SUM: "+",
    tc.Reduction.PROD: "*",
    tc.Reduction.MIN: "min",
    tc.Reduction.MAX: "max",
}
PARALLEL_MARK = "omp_parallel"
REGISTER_MARK = "register_tile"
SIMD_MARK = "omp_simd"


@dataclass
class _Printer:
    scop: Scop
    ast: Ast
    options: MappingOptions
    dialect: Dialect = C
    helpers: Helpers = field(default_factory=Helpers)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.bodies = BodyPrinter(self.scop.cdef, self.dialect, self.helpers)
        # isl's parameters already carry the C names of the sizes; CUDA adds the block
        # and thread parameters' spellings
        self.names: dict[str, str] = {}
        self.locals = 0  # hoisted reads so far: tc_h0, tc_h1, ...

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    # --- nodes ------------------------------------------------------------------
    def node(self, node: isl.AstNode, depth: int, marks: tuple[str, ...] = ()) -> None:
        kind = node.get_type()
        if kind == _FOR:
            self.for_(node, depth, marks)
        elif kind == _IF:
            self.if_(node, depth, marks)
        elif kind == isl.ast_node_type.block:
            for child in ast_children(node):
                self.node(child, depth, marks)
        elif kind == isl.ast_node_type.mark:
            name = node.mark_get_id().get_name()
            block = _register_sizes(name)
            if block is None or not self.register_block(node.mark_get_node(), depth, marks, block):
                self.node(node.mark_get_node(), depth, (*marks, name))
        elif kind == isl.ast_node_type.user:
            self.user(node, depth)
        else:
            raise InternalError(f"unexpected isl AST node {kind}")

    def for_(
        self, node: isl.AstNode, depth: int, marks: tuple[str, ...], shared: str | None = None
    ) -> None:
        """A loop; with `shared` (its clauses), the worksharing loop of a nest inside the
        kernel's parallel region (`#pragma omp for`), else a loop of its own."""
        loop = self.loop_header(node)
        iterator, header = loop.iterator, loop.text
        body = node.for_get_body()
        here = _loop_marks(marks, iterator)
        accumulator = None if here else self.accumulator(body, iterator)
        if accumulator is not None:
            self.promoted(accumulator, header, depth)
            return
        start = len(self.lines)
        self.emit(depth, header)
        self.node(body, depth + 1, marks)
        self.emit(depth, "}")
        innermost = not _contains_for(body)
        hoisted = self.hoist_invariant_reads(loop, start) if innermost else []
        unroll = unroll_factor(self.options.unroll, self.lines[start + 1 : -1])
        pragmas = self.pragmas(here, innermost=innermost, unroll=unroll, shared=shared)
        indent = "  " * depth
        self.lines[start:start] = [indent + line for line in (*hoisted, *pragmas)]

    hoists = True  # the CUDA printer leaves its loops as they are

    def hoist_invariant_reads(self, loop: _Header, start: int) -> list[str]:
        """Replace, in the body of the innermost loop printed from line `start`, each
        read of a tensor element that the loop does not change (its subscript does not
        use the loop's index, and the body writes no element of that tensor) by a local
        loaded before the loop; returns the locals' declarations. A fused nest reading
        `maxVal[i]` beside the `expDist[i][j]` it computes then vectorises. The load is
        guarded by the loop's first test, so a loop that runs no iteration reads
        nothing it would not have read. A subscript that calls a function is left in
        place: `tc_index` checks an access proven only under a condition (a `?:` guard,
        a gather), which the loop may not evaluate."""
        if not self.hoists:
            return []
        body = self.lines[start + 1 : -1]
        text = "\n".join(body)
        written = set(re.findall(r"^\s*(t_\w+)\[", text, flags=re.M))
        index = re.compile(rf"\b{loop.iterator}\b")
        reads: dict[str, str] = {}
        for match in re.finditer(r"\b(t_\w+)\[", text):
            name = match.group(1)
            end = _closing_bracket(text, match.end())
            read = text[match.start() : end + 1]
            if name in written or index.search(read) or _CALL.search(read) or read in reads:
                continue
            reads[read] = f"tc_h{self.locals}"
            self.locals += 1
        if not reads:
            return []
        types = {tensor_name(t.name): self.dialect.ctype(t.scalar) for t in self.scop.cdef.tensors}
        first = index.sub(f"({loop.init})", loop.cond)
        declarations = []
        for read, local in reads.items():
            ctype = types[read[: read.index("[")]]
            declarations.append(f"const {ctype} {local} = ({first}) ? {read} : ({ctype})0;")
        for k in range(start + 1, len(self.lines) - 1):
            for read, local in reads.items():
                self.lines[k] = self.lines[k].replace(read, local)
        return declarations

    def accumulator(self, body: isl.AstNode, iterator: str) -> StatementParts | None:
        """The parts of the statement of a loop that only reduces into one element (the
        loop's index is not among the element's), whose accumulator can then live in a
        register across the loop."""
        found = self.reduction_at(body)
        if found is None:
            return None
        source, values = found
        word = re.compile(rf"\b{iterator}\b")
        if any(word.search(values[v]) for v in source.indices):
            return None
        return self.bodies.parts(source, values)

    def reduction_at(self, node: isl.AstNode) -> tuple[CheckedStatement, dict[str, str]] | None:
        """The reduction statement a user node computes, with its index values; None
        for another node or statement."""
        if node.get_type() != isl.ast_node_type.user:
            return None
        user = self.ast.user(node)
        stmt = self.scop.statement(user.statement)
        source = stmt.source(self.scop.cdef)
        if stmt.kind is Kind.INIT or source.op.reduction is None:
            return None
        return source, self.index_values(user)

    def register_block(
        self, node: isl.AstNode, depth: int, marks: tuple[str, ...], sizes: list[int]
    ) -> bool:
        """Print a register-blocked reduction (`tcpy.mapping.registers`): the loops
        under the mark are the reduction loops, then one loop per blocked member, then
        (when the vector loop is a reduction) a lane loop, around one statement. The
        block of outputs lives in a local array across the reduction loops: loaded
        before them and stored after them, or, with lanes, a partial sum per lane
        started at the identity and added into the output at the end (TC lets a
        reduction be reassociated). Returns False, printing nothing, when the AST does
        not have that shape."""
        loops: list[tuple[isl.AstNode, tuple[str, ...]]] = []
        while node.get_type() in (_FOR, isl.ast_node_type.mark):
            if node.get_type() == _FOR:
                loops.append((node, marks))
                node = node.for_get_body()
            else:
                marks = (*marks, node.mark_get_id().get_name())
                node = node.mark_get_node()
        found = self.reduction_at(node)
        if found is None:
            return False
        source, values = found
        add = _BLOCK_COMBINE.get(source.op.reduction) if source.op.reduction else None
        if add is None:
            return False
        headers = [self.loop_header(loop) for loop, _ in loops]
        iterators = [h.iterator for h in headers]
        target = " ".join(values[v] for v in source.indices)
        written = [bool(re.search(rf"\b{i}\b", target)) for i in iterators]
        lane = headers[-1] if any(written) and not written[-1] else None
        body = headers[:-1] if lane else headers
        reductions = written.index(True) if True in written else len(body)
        block = body[reductions:]
        if not (
            block
            and all(written[reductions : len(body)])
            and len(block) + (lane is not None) == len(sizes)
            and (reductions > 0 or lane is not None)
            and all(h.inc == "1" for h in headers[reductions:])
        ):
            return False
        outer = re.compile("|".join(rf"\b{i}\b" for i in iterators[:reductions]) or "$^")
        if any(outer.search(f"{h.init} {h.cond}") for h in block):
            return False
        parts = self.bodies.parts(source, values)
        index = "".join(_offset(h) for h in block)
        dims = "".join(f"[{size}]" for size in sizes)
        vector = ["#pragma omp simd"] if self.options.vectorize else []
        unrolled = [[f"#pragma GCC unroll {size}"] for size in sizes[: len(block)]]
        if lane is None:  # the last block loop is the vector loop
            here = _loop_marks(loops[-1][1], block[-1].iterator)
            unrolled[-1] = self.pragmas(here, innermost=True, unroll=1)

        def emit_block(depth: int, block: list[_Header], lane: _Header | None) -> None:
            levels = [(p, h.text) for p, h in zip(unrolled, block, strict=True)]

            def nest(base: int, levels: list[tuple[list[str], str]], statements: list[str]) -> None:
                for k, (pragmas, text) in enumerate(levels):
                    for pragma in pragmas:
                        self.emit(base + k, pragma)
                    self.emit(base + k, text)
                for statement in statements:
                    self.emit(base + len(levels), statement)
                for k in reversed(range(len(levels))):
                    self.emit(base + k, "}")

            self.emit(depth, "{")
            self.emit(depth + 1, f"{parts.compute} tc_reg{dims};")
            if lane is None:
                element = f"tc_reg{index}"
                start, finish = (
                    [f"{element} = {parts.current};"],
                    [f"{parts.target} = {parts.store(element)};"],
                )
                inner = levels
            else:
                element = f"tc_reg{index}{_offset(lane)}"
                lanes = f"for (int tc_l = 0; tc_l < {sizes[-1]}; tc_l++) {{"
                start = [lanes, f"  tc_reg{index}[tc_l] = {parts.identity};", "}"]
                finish = [
                    f"{parts.compute} tc_sum = {parts.current};",
                    lanes,
                    f"  tc_sum = tc_sum {add} tc_reg{index}[tc_l];",
                    "}",
                    f"{parts.target} = {parts.store('tc_sum')};",
                ]
                inner = [*levels, (vector, lane.text)]
            nest(depth + 1, levels, start)
            for k, h in enumerate(headers[:reductions]):
                for pragma in self.pragmas(_loop_marks(loops[k][1], h.iterator), False, 1):
                    self.emit(depth + 1 + k, pragma)
                self.emit(depth + 1 + k, h.text)
            nest(depth + 1 + reductions, inner, [f"{element} = {parts.combine(element)};"])
            for k in reversed(range(reductions)):
                self.emit(depth + 1 + k, "}")
            nest(depth + 1, levels, finish)
            self.emit(depth, "}")

        blocked = [*block, *([lane] if lane else [])]
        full = [_full_tile(h, size) for h, size in zip(blocked, sizes, strict=True)]
        if lane is not None and full[-1] is not None and outer.search(full[-1][1]):
            full[-1] = (lane, "")  # bounded by a reduction loop: tested where it runs
        tests = [f[1] for f in full if f is not None and f[1]]
        if tests and all(f is not None for f in full):
            # a block inside the iteration domain (the common case) gets constant
            # bounds, which the compiler unrolls with the block in registers; a partial
            # block at an edge keeps the bounds isl gave (sizes read at each call)
            headers_full = [f[0] for f in full if f is not None]
            self.emit(depth, f"if ({' && '.join(tests)}) {{")
            emit_block(depth + 1, headers_full[: len(block)], headers_full[-1] if lane else None)
            self.emit(depth, "} else {")
            emit_block(depth + 1, block, lane)
            self.emit(depth, "}")
        else:
            emit_block(depth, block, lane)
        return True

    def loop_header(self, node: isl.AstNode) -> _Header:
        iterator = isl_expr(node.for_get_iterator(), self.names)
        init = isl_expr(node.for_get_init(), self.names, top=True)
        cond = isl_expr(node.for_get_cond(), self.names, top=True)
        inc = isl_expr(node.for_get_inc(), self.names, top=True)
        step = f"{iterator}++" if inc == "1" else f"{iterator} += {inc}"
        text = f"for ({self.dialect.index_type} {iterator} = {init}; {cond}; {step}) {{"
        return _Header(iterator, init, cond, inc, text)

    def reduction_pragmas(self, clause: str) -> list[str]:
        """Pragmas of a loop whose accumulator lives in a register (vectorised as a
        reduction when the options allow vectorising)."""
        if not self.options.vectorize:
            return []
        return [f"#pragma omp simd reduction({clause}:tc_acc)"]

    def promoted(self, parts: StatementParts, header: str, depth: int) -> None:
        assert parts.reduction is not None
        clause = _OPENMP_REDUCTION[parts.reduction]
        pragmas = self.reduction_pragmas(clause)
        # OpenMP combines the vector lanes of a min/max reduction with instructions
        # that drop NaN; a flag, or-reduced beside it, remembers that a lane saw one.
        flag = bool(pragmas) and parts.floating and clause in ("min", "max")
        result = "tc_acc"
        self.emit(depth, "{")
        self.emit(depth + 1, f"{parts.compute} tc_acc = {parts.current};")
        if flag:
            self.emit(depth + 1, "int tc_nan = tc_acc != tc_acc;")
            pragmas = [f"{p} reduction(|:tc_nan)" for p in pragmas]
            result = f"(tc_nan ? ({parts.compute})NAN : tc_acc)"
        for pragma in pragmas:
            self.emit(depth + 1, pragma)
        self.emit(depth + 1, header)
        self.emit(depth + 2, f"tc_acc = {parts.combine('tc_acc')};")
        if flag:
            self.emit(depth + 2, "tc_nan |= tc_acc != tc_acc;")
        self.emit(depth + 1, "}")
        self.emit(depth + 1, f"{parts.target} = {parts.store(result)};")
        self.emit(depth, "}")

    def pragmas(
        self, marks: tuple[str, ...], innermost: bool, unroll: int, shared: str | None = None
    ) -> list[str]:
        """A loop's pragmas: `omp for` with the clauses `shared` for the worksharing
        loop of the kernel's parallel region; a parallel loop met anywhere else (never,
        as mapped) opens a region of its own, which OpenMP runs on one thread when it is
        nested."""
        out = []
        parallel, simd = PARALLEL_MARK in marks, SIMD_MARK in marks
        work = f"for{' simd' if simd else ''}"
        if parallel and shared is not None:
            out.append(f"#pragma omp {work}{shared}")
        elif parallel:
            out.append(f"#pragma omp parallel {work}")
        elif simd:
            out.append("#pragma omp simd")
        if innermost and unroll > 1 and not out:  # OpenMP loops take no other pragma
            out.append(f"#pragma GCC unroll {unroll}")
        return out

    def if_(self, node: isl.AstNode, depth: int, marks: tuple[str, ...]) -> None:
        self.emit(depth, f"if ({isl_expr(node.if_get_cond(), self.names, top=True)}) {{")
        self.node(node.if_get_then_node(), depth + 1, marks)
        if node.if_has_else_node():
            self.emit(depth, "} else {")
            self.node(node.if_get_else_node(), depth + 1, marks)
        self.emit(depth, "}")

    def index_values(self, user: UserStatement) -> dict[str, str]:
        stmt = self.scop.statement(user.statement)
        return {
            var: isl_expr(e, self.names, top=True)
            for var, e in zip(stmt.dims, user.indices, strict=True)
        }

    def user(self, node: isl.AstNode, depth: int) -> None:
        user = self.ast.user(node)
        stmt = self.scop.statement(user.statement)
        source = stmt.source(self.scop.cdef)
        init = stmt.kind is Kind.INIT
        self.emit(depth, self.bodies.statement(source, init, self.index_values(user)))

    # --- the kernel -------------------------------------------------------------
    def top_level(self, depth: int) -> None:
        for nest in self.nests():
            for comment in self.comments(nest):
                self.emit(depth, comment)
            self.node(nest, depth)

    def region(self, depth: int) -> None:
        """The nests inside one `omp parallel` region of `tc_threads` threads (read at
        call time): a nest's parallel loop is a worksharing loop, the loops around it
        run in every thread (their bounds depend only on the sizes and on outer loops),
        and code outside any parallel loop runs in one thread (`omp single`). Inside a
        nest every construct ends at a barrier; between nests there is one only where
        a nest touches a tensor that an earlier nest since the last barrier writes, or
        writes one that it reads."""
        self.emit(depth, "#pragma omp parallel num_threads(tc_threads)")
        self.emit(depth, "{")
        unordered: list[_Touches] = []
        for nest in self.nests():
            touches = self.touches(nest)
            if any(touches.conflicts(t) for t in unordered):
                self.emit(depth + 1, "#pragma omp barrier")
                unordered = []
            unordered.append(touches)
            for comment in self.comments(nest):
                self.emit(depth + 1, comment)
            self.replicated(nest, depth + 1, (), " nowait")
        self.emit(depth, "}")

    def replicated(self, node: isl.AstNode, depth: int, marks: tuple[str, ...], end: str) -> None:
        """`node`, run by every thread of the region: its parallel loop shared among
        them, the rest of its code in one of them. `end` is the clause of the last
        construct (`" nowait"` at the end of a nest, else nothing: a barrier)."""
        kind = node.get_type()
        if not self.has_parallel_loop(node, marks):
            self.emit(depth, f"#pragma omp single{end}")
            self.emit(depth, "{")
            self.node(node, depth + 1, marks)
            self.emit(depth, "}")
        elif kind == _FOR:
            iterator = isl_expr(node.for_get_iterator(), self.names)
            if PARALLEL_MARK in _loop_marks(marks, iterator):
                self.for_(node, depth, marks, shared=end)
                return
            self.emit(depth, self.loop_header(node).text)
            self.replicated(node.for_get_body(), depth + 1, marks, "")
            self.emit(depth, "}")
        elif kind == isl.ast_node_type.block:
            children = list(ast_children(node))
            for k, child in enumerate(children):
                self.replicated(child, depth, marks, end if k == len(children) - 1 else "")
        elif kind == _IF:
            self.emit(depth, f"if ({isl_expr(node.if_get_cond(), self.names, top=True)}) {{")
            self.replicated(node.if_get_then_node(), depth + 1, marks, end)
            if node.if_has_else_node():
                self.emit(depth, "} else {")
                self.replicated(node.if_get_else_node(), depth + 1, marks, end)
            self.emit(depth, "}")
        else:  # a mark (a register block with a parallel loop inside is not blocked)
            name = node.mark_get_id().get_name()
            self.replicated(node.mark_get_node(), depth, (*marks, name), end)

    def has_parallel_loop(self, node: isl.AstNode, marks: tuple[str, ...]) -> bool:
        """Whether `node` has a loop that the marks above it make parallel."""
        kind = node.get_type()
        if kind == _FOR:
            iterator = isl_expr(node.for_get_iterator(), self.names)
            return PARALLEL_MARK in _loop_marks(marks, iterator) or self.has_parallel_loop(
                node.for_get_body(), marks
            )
        if kind == isl.ast_node_type.mark:
            name = node.mark_get_id().get_name()
            return self.has_parallel_loop(node.mark_get_node(), (*marks, name))
        if kind == _IF:
            branches = [node.if_get_then_node()]
            if node.if_has_else_node():
                branches.append(node.if_get_else_node())
            return any(self.has_parallel_loop(b, marks) for b in branches)
        if kind == isl.ast_node_type.block:
            return any(self.has_parallel_loop(c, marks) for c in ast_children(node))
        return False

    def nests(self) -> list[isl.AstNode]:
        root = self.ast.root
        return list(ast_children(root)) if root.get_type() == isl.ast_node_type.block else [root]

    def touches(self, nest: isl.AstNode) -> _Touches:
        """The tensors the statements of `nest` read and write."""
        reads: set[str] = set()
        writes: set[str] = set()
        for name in _user_statements(nest, self.ast):
            source = self.scop.statement(name).source(self.scop.cdef)
            writes.add(source.tensor)
            reads.add(source.tensor)  # a reduction reads what it updates
            reads.update(n.tensor for n in tc.walk(source.rhs) if isinstance(n, tc.Access))
        return _Touches(frozenset(reads), frozenset(writes))

    def comments(self, nest: isl.AstNode) -> list[str]:
        seen: list[tuple[int, bool]] = []
        for name in _user_statements(nest, self.ast):
            stmt = self.scop.statement(name)
            key = (stmt.index, stmt.kind is Kind.INIT)
            if key not in seen:
                seen.append(key)
        out = []
        for index, init in sorted(seen, key=lambda t: (t[0], not t[1])):
            text = self.scop.cdef.statements[index].text.replace("*/", "* /")
            out.append(f"/* {text}{'  [initialisation]' if init else ''} */")
        return out


@dataclass(frozen=True)
class _Header:
    """A printed `for` loop: its parts and its header line."""

    iterator: str
    init: str
    cond: str
    inc: str
    text: str


@dataclass(frozen=True)
class _Touches:
    """The tensors a nest reads and writes."""

    reads: frozenset[str]
    writes: frozenset[str]

    def conflicts(self, earlier: _Touches) -> bool:
        """Whether this nest must wait for `earlier` to finish."""
        return bool(earlier.writes & (self.reads | self.writes) or earlier.reads & self.writes)


_BLOCK_COMBINE = {tc.Reduction.SUM: "+", tc.Reduction.PROD: "*"}
"""How two partial results of a blocked reduction combine."""


_CALL = re.compile(r"[A-Za-z_]\w*\s*\(")
"""A function call in printed C (a cast such as `(int64_t)(c0)` is not one)."""


def _closing_bracket(text: str, position: int) -> int:
    """The index of the `]` that closes the `[` just before `position`."""
    depth = 1
    for k in range(position, len(text)):
        if text[k] == "[":
            depth += 1
        elif text[k] == "]":
            depth -= 1
            if depth == 0:
                return k
    raise InternalError("unbalanced brackets in generated code")


def _full_tile(loop: _Header, size: int) -> tuple[_Header, str] | None:
    """A block loop of `size` iterations with a constant bound, and the test under
    which its iterations are all in the domain ("" when isl's bound is constant
    already); None when its bound is of another form."""
    if loop.init != "0":
        return None
    last = size - 1
    if loop.cond == f"{loop.iterator} <= {last}":
        return loop, ""
    edge = re.fullmatch(rf"{loop.iterator} <= tc_min\({last}, (.+)\)", loop.cond)
    if edge is None:
        return None
    cond = f"{loop.iterator} <= {last}"
    full = _Header(loop.iterator, loop.init, cond, loop.inc, loop.text.replace(loop.cond, cond))
    return full, f"{edge.group(1)} >= {last}"


def _offset(loop: _Header) -> str:
    """A loop's position in a block array: its iterator less its start."""
    return f"[{loop.iterator}]" if loop.init == "0" else f"[{loop.iterator} - ({loop.init})]"


def _loop_marks(marks: tuple[str, ...], iterator: str) -> tuple[str, ...]:
    """The marks that belong to the loop of `iterator` (`omp_simd@3` to `c3`)."""
    return tuple(m.split("@")[0] for m in marks if m.endswith(f"@{iterator.lstrip('c')}"))


def _register_sizes(mark: str) -> list[int] | None:
    """The block sizes a register-block mark carries (`register_tile:4x16`)."""
    name, _, sizes = mark.partition(":")
    if name != REGISTER_MARK or not sizes:
        return None
    return [int(s) for s in sizes.split("x")]


UNROLL_BUDGET = 512  # tokens of C an unrolled loop body may grow to
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?|[^\s\w]")


def unroll_factor(asked: int, body: list[str]) -> int:
    """The unroll factor of a loop whose body prints as `body`: the options' factor,
    lowered to a power of two at which the unrolled body stays within `UNROLL_BUDGET`
    tokens. A heavy body unrolled 64 times costs the C compiler tens of seconds and
    gains nothing once the body no longer fits the instruction cache."""
    size = max(1, sum(len(_TOKEN.findall(line)) for line in body))
    factor = 1
    while factor * 2 <= asked and factor * 2 * size <= UNROLL_BUDGET:
        factor *= 2
    return factor


def _contains_for(node: isl.AstNode) -> bool:
    kind = node.get_type()
    if kind == _FOR:
        return True
    if kind == isl.ast_node_type.block:
        return any(_contains_for(c) for c in ast_children(node))
    if kind == _IF:
        return _contains_for(node.if_get_then_node()) or (
            node.if_has_else_node() and _contains_for(node.if_get_else_node())
        )
    if kind == isl.ast_node_type.mark:
        return _contains_for(node.mark_get_node())
    return False


def _user_statements(node: isl.AstNode, ast: Ast) -> list[str]:
    kind = node.get_type()
    if kind == isl.ast_node_type.user:
        return [ast.user(node).statement]
    if kind == _FOR:
        return _user_statements(node.for_get_body(), ast)
    if kind == isl.ast_node_type.block:
        return [s for c in ast_children(node) for s in _user_statements(c, ast)]
    if kind == _IF:
        out = _user_statements(node.if_get_then_node(), ast)
        if node.if_has_else_node():
            out += _user_statements(node.if_get_else_node(), ast)
        return out
    if kind == isl.ast_node_type.mark:
        return _user_statements(node.mark_get_node(), ast)
    return []


def buffer_order(scop: Scop) -> list[str]:
    """The tensors in the order of the kernel's buffers: inputs, outputs, temporaries."""
    cdef = scop.cdef
    return [t.name for t in (*cdef.inputs, *cdef.outputs, *cdef.temporaries)]


def print_c(
    scop: Scop,
    ast: Ast,
    options: MappingOptions,
    sizes: Mapping[str, int] | None,
    vector_math: bool = False,
) -> str:
    """The C translation unit of a kernel; with `sizes`, the sizes are constants; with
    `vector_math`, the math functions libmvec vectorises are declared `simd`."""
    printer = _Printer(scop, ast, options)
    cdef = scop.cdef
    body: list[str] = []
    printer.lines = body
    for k, p in enumerate(scop.params):
        value = str(sizes[p]) if sizes is not None else f"tc_sizes[{k}]"
        printer.emit(1, f"const int64_t {size_name(p)} = {value};")
    for k, name in enumerate(buffer_order(scop)):
        info = cdef.tensor(name)
        ctype = printer.dialect.ctype(info.scalar)
        const = "const " if info.role is Role.INPUT else ""
        printer.emit(
            1, f"{const}{ctype} *restrict {tensor_name(name)} = ({const}{ctype} *)tc_buffers[{k}];"
        )
        for d, extent in enumerate(info.shape):
            printer.emit(1, f"const int64_t {extent_name(name, d)} = {sym_expr(extent)};")
    printer.emit(1, "int tc_status_value = 0;")
    printer.emit(1, "int *tc_status = &tc_status_value;")
    region = any(printer.has_parallel_loop(nest, ()) for nest in printer.nests())
    if region:
        printer.region(1)
    else:
        printer.top_level(1)
    printer.emit(1, "return tc_status_value;")

    header = [
        f"/* {cdef.name}: generated by tcpy from */",
        *(f"/*   {line.replace('*/', '* /')} */" for line in _def_text(cdef).splitlines()),
        "#include <stdint.h>",
        "#include <stdbool.h>",
        "#include <math.h>",
        _guarded(vector_math_declarations(printer.helpers.builtins)) if vector_math else "",
        "",
        helper_source(printer.helpers),
        "",
        f"int {KERNEL_SYMBOL}(const int64_t *restrict tc_sizes,",
        "              void *const *restrict tc_buffers, int tc_threads) {",
    ]
    tail = ["}", ""]
    unused = [] if region else ["(void)tc_threads;"]
    if sizes is not None or not scop.params:
        unused.append("(void)tc_sizes;")
    return "\n".join([*header, *(f"  {u}" for u in unused), *body, *tail])


def _guarded(declarations: str) -> str:
    """Vector math declarations, left out of a conservative build (a compiler once
    crashed on a `simd` clone of powf)."""
    if not declarations:
        return ""
    return f"#ifndef {CONSERVATIVE_MACRO}\n{declarations}\n#endif"


def _def_text(cdef: CheckedDef) -> str:
    lines = cdef.source.splitlines()
    return "\n".join(lines[cdef.span.line - 1 : cdef.span.end_line])
