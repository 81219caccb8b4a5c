"""Semantic analysis: names, types, reductions, and the statement-order rules of TC.

`check_program` takes a parsed `Program` and returns one `CheckedDef` per definition,
or raises a `TCSemanticError` / `TCTypeError` / `TCRangeError` pointing at the
offending source. Statements are checked in source order, because a tensor's type and
shape come from its first definition and later statements may read it.

Rules beyond the language summary, decided here for safety:
- an undeclared output or temporary may not be read before a statement writes it;
- a reduction's right-hand side may not read the tensor it reduces into, and a plain
  `=` may read its own tensor only at exactly the indices it writes (otherwise the
  result would depend on the order of the loops, which TC leaves unspecified);
- keyword-like misuse of names (a builtin as a tensor, a size as an index) is an error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from tcpy.errors import Span, TCSemanticError, TCTypeError, TCWarning, warn
from tcpy.parser import ast, fixes
from tcpy.parser.builtins import BUILTINS
from tcpy.parser.checked import CheckedDef, CheckedStatement, Role, TensorInfo
from tcpy.parser.parse import check_depth, parse
from tcpy.parser.ranges import StatementShape, infer_ranges, sym_of_bound
from tcpy.parser.symbolic import Sym
from tcpy.types import ScalarType, assignable, builtin_result, promote

INT32 = ScalarType.INT32
BOOL = ScalarType.BOOL


def check_program(program: ast.Program, filename: str | None = None) -> dict[str, CheckedDef]:
    """Check every definition of a program; names must be unique across it. `filename`
    names the source in warnings and in errors raised at call time."""
    checked: dict[str, CheckedDef] = {}
    for d in program.defs:
        if d.name in checked:
            raise TCSemanticError(f"def {d.name} is defined twice in this source", d.name_span)
        checked[d.name] = _DefChecker(d, program.source, filename).run()
    return checked


@dataclass
class _Tensor:
    name: str
    role: Role
    span: Span
    scalar: ScalarType | None = None
    shape: tuple[Sym, ...] | None = None
    written: bool = False

    def info(self) -> TensorInfo:
        assert self.scalar is not None and self.shape is not None
        return TensorInfo(self.name, self.role, self.scalar, self.shape, self.span)


@dataclass
class _DefChecker:
    d: ast.Def
    source: str
    filename: str | None
    tensors: dict[str, _Tensor] = field(default_factory=dict)
    sizes: dict[str, Span] = field(default_factory=dict)
    here: fixes.StatementSource = field(init=False)  # the statement being checked

    def run(self) -> CheckedDef:
        self.declare_inputs()
        self.declare_outputs()
        statements = tuple(self.statement(st) for st in self.d.statements)
        for out in self.d.outputs:
            if not self.tensors[out.name].written:
                raise TCSemanticError(
                    f"output {out.name} is never written by def {self.d.name}", out.span
                )
        by_role = {
            role: tuple(t.info() for t in self.tensors.values() if t.role is role) for role in Role
        }
        outputs = tuple(self.tensors[o.name].info() for o in self.d.outputs)
        return CheckedDef(
            name=self.d.name,
            inputs=by_role[Role.INPUT],
            outputs=outputs,
            temporaries=by_role[Role.TEMPORARY],
            statements=statements,
            size_symbols=tuple(self.sizes),
            span=self.d.span,
            source=self.source,
            filename=self.filename,
        )

    def warn(self, message: str, span: Span) -> None:
        warn(TCWarning(message, span, self.source, self.filename))

    # --- declarations -------------------------------------------------------------

    def declare_inputs(self) -> None:
        for p in self.d.params:
            if p.type is None:
                raise TCSemanticError(
                    f"input {p.name} has no type: declare it like float(N) {p.name}, "
                    f"or float {p.name} for a scalar",
                    p.span,
                )
            self.check_new_name(p.name, p.span, "input")
            shape = self.declared_shape(p.type, defining=True)
            self.tensors[p.name] = _Tensor(p.name, Role.INPUT, p.span, p.type.scalar, shape, True)
        for name, span in self.sizes.items():
            if name in self.tensors:
                raise TCSemanticError(
                    f"{name} names both a size and a tensor; sizes and tensors share one "
                    "namespace (scalar inputs are values, not sizes)",
                    span,
                )

    def declare_outputs(self) -> None:
        if not self.d.outputs:
            raise TCSemanticError(f"def {self.d.name} has no outputs", self.d.name_span)
        for o in self.d.outputs:
            if o.name in self.tensors and self.tensors[o.name].role is Role.INPUT:
                raise TCSemanticError(
                    f"{o.name} is both an input and an output; inputs are read-only, "
                    "give the output another name",
                    o.span,
                )
            self.check_new_name(o.name, o.span, "output")
            if o.name in self.sizes:
                raise TCSemanticError(f"{o.name} names both a size and an output", o.span)
            t = _Tensor(o.name, Role.OUTPUT, o.span)
            if o.type is not None:
                t.scalar = o.type.scalar
                t.shape = self.declared_shape(o.type, defining=False)
            self.tensors[o.name] = t

    def check_new_name(self, name: str, span: Span, what: str) -> None:
        if name in self.tensors:
            raise TCSemanticError(f"{what} {name} is declared twice", span)
        if name in BUILTINS:
            raise TCSemanticError(f"{name} is a builtin function and cannot name a tensor", span)

    def declared_shape(self, ty: ast.TensorType, defining: bool) -> tuple[Sym, ...]:
        shape = []
        for dim in ty.dims:
            match dim:
                case ast.ConstDim(value=v, span=span):
                    if v < 1:
                        raise TCSemanticError(f"a fixed size must be at least 1, not {v}", span)
                    shape.append(Sym.of(v))
                case ast.SizeDim(name=n, span=span):
                    if n in BUILTINS:
                        raise TCSemanticError(f"{n} is a builtin function, not a size", span)
                    if n not in self.sizes:
                        if not defining:
                            raise TCSemanticError(
                                f"size {n} of this output is not a size of any input",
                                span,
                            )
                        self.sizes[n] = span
                    shape.append(Sym.of(n))
        return tuple(shape)

    # --- statements ---------------------------------------------------------------

    def statement(self, st: ast.Statement) -> CheckedStatement:
        self.here = fixes.StatementSource(self.source, self.d.span, st, _recheck, tuple(self.sizes))
        lhs = self.lhs_tensor(st)
        st = self.scatter_form(st, lhs)
        if st.scatter is None:
            self.check_lhs_indices(st, lhs)
        fixed, lets, exists = self.where_clauses(st)
        resolver = _Resolver(self, st, lets)
        rhs = resolver.expr(st.rhs)
        if lhs.scalar is not None and lhs.scalar.is_float and weakly_typed(rhs):
            rhs = _retyped(rhs, lhs.scalar)  # `Y(i) = 0.1`: the literal takes Y's type
        target = resolver.target(lhs, st.scatter, st.lhs_span) if st.scatter else None
        exists_exprs = tuple(resolver.expr(e) for e in exists)
        self.here = replace(self.here, resolved=(rhs, *exists_exprs))
        if st.equivalent is not None:
            self.check_equivalent(st, resolver.indices)
        reduction = tuple(
            v for v in dict.fromkeys([*resolver.indices, *fixed]) if v not in st.indices
        )
        self.check_reduction(st, reduction, lhs)
        self.check_self_reads(st, rhs)
        self.check_store_type(st, rhs, lhs)

        shape = infer_ranges(
            StatementShape(
                tensor=st.tensor,
                indices=st.indices,
                index_spans=st.index_spans,
                reduction_indices=reduction,
                rhs=rhs,
                exists=exists_exprs,
                fixed=fixed,
                span=st.span,
                lhs_span=st.lhs_span,
                fixes=self.here,
                filename=self.filename,
                scatter=target,
            ),
            {n: t.shape for n, t in self.tensors.items() if t.shape is not None},
        )
        if lhs.shape is None:
            lhs.shape = shape.lhs_shape
        lhs.written = True
        return CheckedStatement(
            tensor=st.tensor,
            indices=st.indices,
            reduction_indices=reduction,
            op=st.op,
            rhs=rhs,
            ranges=shape.ranges,
            checks=shape.checks,
            span=st.span,
            text=_statement_text(self.source, st.span),
            starts=shape.starts,
            scatter=target.args if target is not None else (),
        )

    def scatter_form(self, st: ast.Statement, lhs: _Tensor) -> ast.Statement:
        """`st`, its left-hand side read as a scatter-add's (`scatter` set) when it is
        one: a subscript that is more than an index alone, or an index repeated under
        `+=` (`D(i, i) += ...`). A scatter adds into elements its right-hand side
        computes the place of, so it is a `+=` into a tensor whose shape is known."""
        repeated = len(set(st.indices)) < len(st.indices)
        if st.scatter is None and not (repeated and st.op is ast.AssignOp.SUM):
            return st
        if st.scatter is None:
            subscripts = tuple(
                ast.Ident(n, span) for n, span in zip(st.indices, st.index_spans, strict=True)
            )
            st = replace(st, indices=(), index_spans=(), scatter=subscripts)
        if st.op is not ast.AssignOp.SUM:
            fixed = self.here.with_op("+=")
            raise TCSemanticError(
                f"a left-hand subscript that is not an index alone makes a scatter-add, "
                f"which adds with +=, not {st.op.value}"
                + (f": {fixed}" if fixed else "")
                + "; or index the left-hand side with distinct indices alone",
                st.lhs_span,
            )
        if lhs.shape is None:
            raise TCSemanticError(
                f"a scatter-add into {st.tensor} needs its shape before: write {st.tensor} "
                f"whole first (e.g. with = 0 and a where range per index), or declare it "
                "with its sizes among the outputs",
                st.lhs_span,
            )
        return st

    def lhs_tensor(self, st: ast.Statement) -> _Tensor:
        name = st.tensor
        if name in self.sizes:
            raise TCSemanticError(f"{name} is a size and cannot be written", st.lhs_span)
        if name in BUILTINS:
            raise TCSemanticError(
                f"{name} is a builtin function and cannot be written", st.lhs_span
            )
        t = self.tensors.get(name)
        if t is None:
            t = self.tensors[name] = _Tensor(name, Role.TEMPORARY, st.lhs_span)
        elif t.role is Role.INPUT:
            raise TCSemanticError(
                f"input {name} is read-only; write the result into an output or a temporary",
                st.lhs_span,
            )
        plain = st.scatter is None and len(set(st.indices)) == len(st.indices)
        if not t.written and st.op.is_reduction and not st.op.initializes and plain:
            fixed = self.here.with_op(st.op.value + "!")
            self.warn(
                f"{name} is not initialised before this {st.op.value} reduction, so it "
                f"starts from zero; write {st.op.value}! to say so"
                + (f": {fixed}" if fixed else ""),
                st.lhs_span,
            )
        return t

    def check_lhs_indices(self, st: ast.Statement, lhs: _Tensor) -> None:
        seen: set[str] = set()
        for name, span in zip(st.indices, st.index_spans, strict=True):
            if name in seen:
                raise TCSemanticError(
                    f"index {name} appears twice on the left-hand side; each dimension of "
                    f"{st.tensor} needs its own index (a scatter-add, +=, may repeat one to "
                    "add into a diagonal)",
                    span,
                )
            seen.add(name)
            self.check_index_name(name, span)
        if lhs.shape is not None and len(lhs.shape) != len(st.indices):
            raise TCSemanticError(
                f"{st.tensor} has {len(lhs.shape)} dimension(s) but is written with "
                f"{len(st.indices)} index(es)",
                st.lhs_span,
            )

    def check_index_name(self, name: str, span: Span) -> None:
        if name in self.tensors:
            raise TCSemanticError(f"{name} names a tensor and cannot be used as an index", span)
        if name in self.sizes:
            raise TCSemanticError(f"{name} names a size and cannot be used as an index", span)
        if name in BUILTINS:
            raise TCSemanticError(f"{name} is a builtin function, not an index", span)

    def where_clauses(
        self, st: ast.Statement
    ) -> tuple[dict[str, tuple[Sym, Sym]], dict[str, ast.LetClause], list[ast.Expr]]:
        fixed: dict[str, tuple[Sym, Sym]] = {}
        lets: dict[str, ast.LetClause] = {}
        exists: list[ast.Expr] = []
        for c in st.where:
            match c:
                case ast.RangeClause(var=v, lo=lo, hi=hi, span=span):
                    self.check_index_name(v, span)
                    if v in fixed or v in lets:
                        raise TCSemanticError(f"{v} has two where clauses", span)
                    fixed[v] = (self.bound(lo), self.bound(hi))
                case ast.LetClause(var=v, span=span):
                    self.check_index_name(v, span)
                    if v in fixed or v in lets:
                        raise TCSemanticError(f"{v} has two where clauses", span)
                    if v in st.indices:
                        raise TCSemanticError(
                            f"{v} is an index of the left-hand side and cannot be a let", span
                        )
                    lets[v] = c
                case ast.ExistsClause(expr=e):
                    exists.append(e)
        return fixed, lets, exists

    def bound(self, e: ast.Expr) -> Sym:
        return sym_of_bound(e, self.sizes, self.tensors)

    def check_reduction(self, st: ast.Statement, reduction: tuple[str, ...], lhs: _Tensor) -> None:
        if reduction and not st.op.is_reduction:
            names = ", ".join(reduction)
            fixed = self.here.with_op("+=!")
            hint = f"a reduction such as {fixed}" if fixed else "a reduction"
            raise TCSemanticError(
                f"index {names} appears only on the right-hand side, which makes it a "
                f"reduction index: use {hint} (or index {st.tensor} with it)",
                st.span,
            )
        if (
            st.op.is_reduction
            and lhs.scalar is BOOL
            and st.op.reduction
            in (
                ast.Reduction.SUM,
                ast.Reduction.PROD,
            )
        ):
            raise TCTypeError(
                f"{st.op.value} needs a numeric tensor, and {st.tensor} is bool", st.lhs_span
            )

    def check_self_reads(self, st: ast.Statement, rhs: ast.Expr) -> None:
        for acc in _accesses(rhs):
            if acc.tensor != st.tensor:
                continue
            if st.op.is_reduction:
                raise TCSemanticError(
                    f"this reduction reads {st.tensor}, the tensor it reduces into; compute "
                    "the reduction into a temporary first",
                    acc.span,
                )
            same = len(acc.args) == len(st.indices) and all(
                isinstance(a, ast.Index) and a.name == i
                for a, i in zip(acc.args, st.indices, strict=True)
            )
            if not same:
                raise TCSemanticError(
                    f"{st.tensor} is read at other indices than it is written "
                    f"({st.tensor}({', '.join(st.indices)})), so the result would depend on "
                    "the loop order; write into another tensor",
                    acc.span,
                )

    def check_store_type(self, st: ast.Statement, rhs: ast.Expr, lhs: _Tensor) -> None:
        assert rhs.ty is not None
        if lhs.scalar is None:
            if (
                st.op.is_reduction
                and rhs.ty is BOOL
                and st.op.reduction
                in (
                    ast.Reduction.SUM,
                    ast.Reduction.PROD,
                )
            ):
                fixed = self.here.fixed({rhs.span: f"int32({fixes.text(self.source, rhs.span)})"})
                raise TCTypeError(
                    f"{st.op.value} needs numbers, and the right-hand side is bool; "
                    "cast it" + (f": {fixed}" if fixed else ""),
                    rhs.span,
                )
            lhs.scalar = rhs.ty
        elif not assignable(rhs.ty, lhs.scalar):
            cast = f"{lhs.scalar.value}({fixes.text(self.source, rhs.span)})"
            fixed = self.here.fixed({rhs.span: cast})
            raise TCTypeError(
                f"cannot store a {rhs.ty.value} value into {lhs.scalar.value} tensor "
                f"{st.tensor} without a cast"
                + (f"; write {fixed}" if fixed else f"; write {lhs.scalar.value}(...)"),
                rhs.span,
            )

    def check_equivalent(self, st: ast.Statement, indices: list[str]) -> None:
        assert st.equivalent is not None
        known = set(self.tensors) | set(self.sizes) | set(st.indices) | set(indices)
        for e in st.equivalent.args:
            for name, span in _names(e):
                if name not in known:
                    raise TCSemanticError(
                        f"the <=> annotation names {name}, which is not a tensor, size or "
                        "index of this statement",
                        span,
                    )


class _Resolver:
    """Resolves and types the expressions of one statement."""

    def __init__(self, checker: _DefChecker, st: ast.Statement, lets: dict[str, ast.LetClause]):
        self.c = checker
        self.st = st
        self.lets = lets
        self.expanding: list[str] = []
        self.indices: list[str] = []  # index variables met, in order

    def expr(self, e: ast.Expr) -> ast.Expr:
        match e:
            case ast.IntLit():
                return ast.IntLit(e.value, e.span, INT32)
            case ast.FloatLit():
                return ast.FloatLit(e.value, e.span, ScalarType.FLOAT32)
            case ast.Ident(name=name, span=span):
                return self.ident(name, span)
            case ast.Apply():
                return self.apply(e)
            case ast.Cast(to=to, value=v, span=span):
                return ast.Cast(to, self.expr(v), span, to)
            case ast.Unary(op=op, operand=v, span=span):
                return self.unary(op, self.expr(v), span)
            case ast.Binary(op=op, lhs=a, rhs=b, span=span):
                return self.binary(op, self.expr(a), self.expr(b), span)
            case ast.Ternary(cond=c, then=t, orelse=o, span=span):
                cond = self.expr(c)
                _require(cond, BOOL, "the condition of ?:")
                then, orelse = _met(self.expr(t), self.expr(o))
                return ast.Ternary(cond, then, orelse, span, promote(_ty(then), _ty(orelse)))
        raise TypeError(f"unexpected node {type(e).__name__}")

    def ident(self, name: str, span: Span) -> ast.Expr:
        if name in self.lets:
            if name in self.expanding:
                raise TCSemanticError(f"let {name} is defined in terms of itself", span)
            self.expanding.append(name)
            value = self.expr(self.lets[name].value)
            self.expanding.pop()
            return value
        if name in self.c.sizes:
            return ast.SizeRef(name, span, INT32)
        t = self.c.tensors.get(name)
        if t is not None:
            return self.access(t, (), span, parenthesised=False)
        if name in BUILTINS:
            raise TCSemanticError(f"{name} is a builtin function; call it as {name}(...)", span)
        if name not in self.indices:
            self.indices.append(name)
        return ast.Index(name, span, INT32)

    def apply(self, e: ast.Apply) -> ast.Expr:
        name = e.name
        t = self.c.tensors.get(name)
        if t is not None:
            args = tuple(self.expr(a) for a in e.args)
            return self.access(t, args, e.span)
        if name in BUILTINS:
            arity = BUILTINS[name]
            if len(e.args) != arity:
                raise TCSemanticError(
                    f"{name} takes {arity} argument(s), not {len(e.args)}", e.span
                )
            args = tuple(self.expr(a) for a in e.args)
            for a in args:
                _require_number(a, f"an argument of {name}")
            strong = [_ty(a) for a in args if _ty(a).is_float and not weakly_typed(a)]
            if strong:  # literals take the type of the float arguments they meet
                met = builtin_result(tuple(strong))
                args = tuple(_retyped(a, met) if weakly_typed(a) else a for a in args)
            return ast.Call(name, args, e.span, builtin_result(tuple(_ty(a) for a in args)))
        if name in self.c.sizes:
            raise TCSemanticError(f"{name} is a size, not a tensor or function", e.name_span)
        if name in self.lets or name in self.st.indices:
            raise TCSemanticError(f"{name} is an index, not a tensor or function", e.name_span)
        candidates = [*self.c.tensors, *BUILTINS]
        close = difflib.get_close_matches(name, candidates, n=3)
        # only a name the statement is accepted with: a tensor of another rank is no fix
        fits = [c for c in close if self.c.here.renamed(e.name_span, c)]
        hint = f"; did you mean {fits[0]}?" if fits else ""
        raise TCSemanticError(f"unknown tensor or function {name}{hint}", e.name_span)

    def target(self, t: _Tensor, subscripts: tuple[ast.Expr, ...], span: Span) -> ast.Access:
        """The element a scatter-add writes: `t` at `subscripts`, resolved as a read's
        (their indices are the statement's, like those of the right-hand side)."""
        assert t.shape is not None
        args = tuple(self.expr(a) for a in subscripts)
        self.check_subscripts(t.name, t.shape, args, span, parenthesised=True)
        return ast.Access(t.name, args, span, t.scalar)

    def access(
        self, t: _Tensor, args: tuple[ast.Expr, ...], span: Span, parenthesised: bool = True
    ) -> ast.Access:
        """A read of `t`; `T()` and the bare `T` both read a 0-d tensor."""
        if t.scalar is None or t.shape is None:
            raise TCSemanticError(f"{t.name} is read before any statement writes it", span)
        self.check_subscripts(t.name, t.shape, args, span, parenthesised)
        if not t.written:
            self.c.warn(f"{t.name} is read before any statement writes it; it reads zeros", span)
        return ast.Access(t.name, args, span, t.scalar)

    @staticmethod
    def check_subscripts(
        name: str,
        shape: tuple[Sym, ...],
        args: tuple[ast.Expr, ...],
        span: Span,
        parenthesised: bool,
    ) -> None:
        """One integer subscript per dimension of tensor `name`."""
        if len(args) != len(shape):
            if not parenthesised:
                raise TCSemanticError(
                    f"{name} has {len(shape)} dimension(s); index it as {name}(...)",
                    span,
                )
            raise TCSemanticError(
                f"{name} has {len(shape)} dimension(s) but is accessed with "
                f"{len(args)} subscript(s)",
                span,
            )
        for a in args:
            if _ty(a).is_float or _ty(a).is_bool:
                raise TCTypeError(
                    f"a subscript of {name} must be an integer, not {_ty(a).value}", a.span
                )

    def unary(self, op: ast.UnaryOp, v: ast.Expr, span: Span) -> ast.Expr:
        if op is ast.UnaryOp.NOT:
            _require(v, BOOL, "the operand of !")
            return ast.Unary(op, v, span, BOOL)
        _require_number(v, "the operand of -")
        return ast.Unary(op, v, span, _ty(v))

    def binary(self, op: ast.BinaryOp, a: ast.Expr, b: ast.Expr, span: Span) -> ast.Expr:
        if op.is_logical:
            _require(a, BOOL, f"the operands of {op.value}")
            _require(b, BOOL, f"the operands of {op.value}")
            return ast.Binary(op, a, b, span, BOOL)
        a, b = _met(a, b)
        if op.is_comparison:
            if op in (ast.BinaryOp.EQ, ast.BinaryOp.NE) and _ty(a).is_bool and _ty(b).is_bool:
                return ast.Binary(op, a, b, span, BOOL)
            _require_number(a, f"the operands of {op.value}")
            _require_number(b, f"the operands of {op.value}")
            return ast.Binary(op, a, b, span, BOOL)
        _require_number(a, f"the operands of {op.value}")
        _require_number(b, f"the operands of {op.value}")
        ty = promote(_ty(a), _ty(b))
        if op is ast.BinaryOp.MOD and ty.is_float:
            src = self.c.source
            call = f"fmod({fixes.text(src, a.span)}, {fixes.text(src, b.span)})"
            fixed = self.c.here.fixed({span: call})
            raise TCTypeError(
                "% needs integer operands; for floats "
                + (f"use fmod: {fixed}" if fixed else "use fmod(a, b)"),
                span,
            )
        return ast.Binary(op, a, b, span, ty)


def weakly_typed(e: ast.Expr) -> bool:
    """Whether `e` is a float value made of literals only (with integers: `0.5 * i`),
    whose type is that of the float it meets (docs/language.md, "Literals")."""
    match e:
        case ast.FloatLit():
            return True
        case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
            return weakly_typed(v)
        case ast.Binary(op=op, lhs=a, rhs=b) if not (op.is_comparison or op.is_logical):
            return _literals_and_integers((a, b))
        case ast.Ternary(then=t, orelse=o):
            return _literals_and_integers((t, o))
        case ast.Call(args=args):
            return _literals_and_integers(args)
    return False


def _literals_and_integers(parts: tuple[ast.Expr, ...]) -> bool:
    """Some of `parts` are literal floats (`weakly_typed`), and the others integers."""
    weak = [weakly_typed(p) for p in parts]
    floats = [p.ty is not None and p.ty.is_float for p in parts]
    return any(weak) and all(w or not f for w, f in zip(weak, floats, strict=True))


def _met(a: ast.Expr, b: ast.Expr) -> tuple[ast.Expr, ast.Expr]:
    """`a` and `b` with a literal operand given the type of the other, where that one
    is a float of its own (a tensor's value, a cast)."""
    if weakly_typed(a) and not weakly_typed(b) and _ty(b).is_float:
        return _retyped(a, _ty(b)), b
    if weakly_typed(b) and not weakly_typed(a) and _ty(a).is_float:
        return a, _retyped(b, _ty(a))
    return a, b


def _retyped(e: ast.Expr, ty: ScalarType) -> ast.Expr:
    """The literal expression `e` (`weakly_typed`) computed in float type `ty`: its literals
    keep their exact values (a half type computes them in float32)."""

    def inner(x: ast.Expr) -> ast.Expr:
        return _retyped(x, ty) if weakly_typed(x) else x

    match e:
        case ast.FloatLit():
            return replace(e, ty=ty)
        case ast.Unary(operand=v):
            return replace(e, operand=inner(v), ty=ty)
        case ast.Binary(lhs=a, rhs=b):
            return replace(e, lhs=inner(a), rhs=inner(b), ty=ty)
        case ast.Ternary(then=t, orelse=o):
            return replace(e, then=inner(t), orelse=inner(o), ty=ty)
        case ast.Call(args=args):
            return replace(e, args=tuple(inner(a) for a in args), ty=ty)
    return e


def _ty(e: ast.Expr) -> ScalarType:
    assert e.ty is not None
    return e.ty


def _require(e: ast.Expr, ty: ScalarType, what: str) -> None:
    if _ty(e) is not ty:
        raise TCTypeError(f"{what} must be {ty.value}, not {_ty(e).value}", e.span)


def _require_number(e: ast.Expr, what: str) -> None:
    if _ty(e).is_bool:
        raise TCTypeError(
            f"{what} must be a number, not bool; cast with int32(...) or use ?:", e.span
        )


def _accesses(e: ast.Expr) -> Iterator[ast.Access]:
    return (n for n in ast.walk(e) if isinstance(n, ast.Access))


def _recheck(source: str) -> object:
    """The front end on `source`, as `check_source` runs it: a suggested fix is given
    only when the fixed def passes it."""
    program = parse(source)
    check_depth(program)
    return check_program(program)


def _names(e: ast.Expr) -> Iterator[tuple[str, Span]]:
    for n in ast.walk(e):
        match n:
            case ast.Ident(name=name, span=span):
                yield name, span
            case ast.Apply(name=name, name_span=span) if name not in BUILTINS:
                yield name, span


def _statement_text(source: str, span: Span) -> str:
    """The statement's text on one line."""
    text = source[fixes.offset(source, span.line, span.column) : fixes.offset(
        source, span.end_line, span.end_column
    )]  # fmt: skip
    return " ".join(line.strip() for line in text.splitlines())
