"""Random valid, type-correct TC programs with exact inputs.

`generate(rng)` draws sizes, inputs and statements one at a time; each candidate
statement is accepted only if `program.analyze` says the prefix still has non-empty
ranges, in-bounds subscripts and values below 2**24 (see program.py for why that makes
every correct implementation agree bit for bit). A statement that fails the analysis is
drawn again, so the programs that reach the front end are ones it must accept.

Covered on purpose: several statements writing one tensor (`+=!` then `+=`), plain `=`
reading its own tensor at the written indices, temporaries read later, every reduction
with and without `!`, reductions over 1-3 indices, `where` ranges, affine subscripts
(`i + k`, `2*h + kh`, `i + 1`), constant subscripts, gathers `T(I(b), d)`, int32 and
float tensors with casts and promotion, sizes near multiples of 16/32 and tiny ones,
fixed sizes in signatures, and names that are keywords or macros of C, C++, CUDA or of
the generated code (`and`, `nan`, `INFINITY`, `ceild`, `tc_status`, ...). A quarter
of the programs are row chains (`row_chain`): a row's elements, a reduction of each
row, statements over the elements reading it, another reduction, a product with an
operand the rows share, as attention and log-sum-exp are, which row fusion rewrites.
A tenth are chains of exponentials against a row's maximum (`online_chain`), which the
online rewrite over tiles of a row takes: their values are real, and such a pair is
compared with the reference within a tolerance (`Program.smooth`).
"""

from __future__ import annotations

import random
from typing import Any

from tcpy.parser.builtins import BUILTINS
from tools.fuzz.program import (
    FLOAT,
    FLOAT_TYPES,
    INT,
    Bin,
    Bound,
    Call,
    Cast,
    Cond,
    Decl,
    Expr,
    Gather,
    Info,
    Invalid,
    Lin,
    Neg,
    Num,
    Program,
    Read,
    Stmt,
    Sub,
    Var,
    analyze,
    subscript_vars,
)

SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 11, 13, 15, 16, 17, 31, 32, 33, 37)
PLAIN = {
    "size": ["N", "M", "K", "L", "P", "Q", "R", "S"],
    "tensor": ["A", "B", "C", "X", "Y", "Z", "T", "U", "V", "O", "LUT", "acc", "tmp"],
    "index": ["i", "j", "k", "l", "m", "n", "h", "w", "b", "d", "kh", "kw", "r", "s", "c"],
}
# Names that mean something to C, C++, CUDA, OpenMP, isl's AST or tcpy's generated code;
# a TC program may use any of them, and the compiler must rename them.
EXOTIC = [
    "and", "or", "not", "xor", "bitand", "compl", "int", "char", "long", "short", "void",
    "if", "else", "for", "while", "do", "return", "switch", "case", "default", "const",
    "static", "extern", "auto", "struct", "union", "enum", "typedef", "sizeof", "inline",
    "restrict", "class", "new", "delete", "this", "template", "namespace", "true", "false",
    "NULL", "nullptr", "INFINITY", "NAN", "HUGE_VALF", "nan", "inf", "ceild", "floord",
    "tc_status", "tc_kernel", "sizes", "buffers", "threadIdx", "blockIdx", "blockDim",
    "gridDim", "warpSize", "i0", "c0", "c1", "t0", "p0", "S0", "I0", "main", "abs", "errno",
    "size_t", "int32_t", "int64_t", "float4", "dim3", "std", "assert", "printf", "malloc",
    "fminf", "fmaxf", "sqrtf", "omp_get_thread_num",
]  # fmt: skip
KEYWORDS = {"def", "in", "where", "exists", "min", "max", "bool", "float", "double"}
KEYWORDS |= {f"{p}{w}" for p in ("int", "uint") for w in (8, 16, 32, 64)} | {"float16",
             "float32", "float64"}  # fmt: skip
REDUCTIONS = ("+=", "*=", "min=", "max=")


class Names:
    """Fresh names, one namespace (sizes, tensors and indices share it in TC)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.exotic = rng.random() < 0.3

    def fresh(self, kind: str) -> str:
        for _ in range(50):
            pool = EXOTIC if self.exotic and self.rng.random() < 0.3 else PLAIN[kind]
            name = self.rng.choice(pool)
            if name not in self.used and name not in BUILTINS and name not in KEYWORDS:
                self.used.add(name)
                return name
        name = f"{kind[0]}{len(self.used)}"
        self.used.add(name)
        return name


class Generator:
    """One program: the state shared by the statement draws."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.names = Names(rng)
        self.nan = rng.random() < 0.15
        self.sizes: dict[str, int] = {}
        self.inputs: list[Decl] = []
        self.stmts: list[Stmt] = []
        self.info: Info | None = None

    # --- signature ----------------------------------------------------------------
    def signature(self) -> None:
        for _ in range(self.rng.randint(1, 4)):
            self.sizes[self.names.fresh("size")] = self._size()
        for _ in range(self.rng.randint(1, 4)):
            self.inputs.append(self._input(self.rng.random() < 0.7))
        if self.rng.random() < 0.4:
            dims = tuple(self.rng.choice(list(self.sizes)) for _ in range(self.rng.randint(1, 2)))
            self.inputs.append(Decl(self.names.fresh("tensor"), INT, dims))
        # A size no input declares is not a size of the def: drop it.
        used = {x for d in self.inputs for x in d.dims if isinstance(x, str)}
        self.sizes = {n: v for n, v in self.sizes.items() if n in used}

    def _size(self) -> int:
        return self.rng.choice(SIZES) if self.rng.random() < 0.7 else self.rng.randint(1, 6)

    def _input(self, is_float: bool) -> Decl:
        dims: list[str | int] = []
        for _ in range(self.rng.choice((0, 1, 1, 2, 2, 2, 3))):
            if self.rng.random() < 0.12:
                dims.append(self.rng.randint(1, 5))
            else:
                dims.append(self.rng.choice(list(self.sizes)))
        return Decl(self.names.fresh("tensor"), FLOAT if is_float else INT, tuple(dims))

    # --- statements ---------------------------------------------------------------
    def statements(self) -> None:
        self.info = analyze(self._program(()))
        for _ in range(self.rng.randint(1, 5)):
            for _attempt in range(30):
                st = self._statement()
                try:
                    info = analyze(self._program((*self.stmts, st)))
                except Invalid:
                    continue
                self.stmts.append(st)
                self.info = info
                break

    def _program(self, stmts: tuple[Stmt, ...]) -> Program:
        written = list(dict.fromkeys(s.tensor for s in stmts))
        return Program("f", tuple(self.inputs), tuple(written), stmts, dict(self.sizes), self.nan)

    def _statement(self) -> Stmt:
        assert self.info is not None
        written = [s.tensor for s in self.stmts]
        rewrite = bool(written) and self.rng.random() < 0.35
        if rewrite:
            tensor = self.rng.choice(written)
            rank = len(self.info.shapes[tensor])
            ty = self.info.types[tensor]
        else:
            tensor, rank = self.names.fresh("tensor"), self.rng.choice((0, 1, 1, 2, 2, 2, 3))
            ty = FLOAT if self.rng.random() < 0.7 else INT
        indices = tuple(self.names.fresh("index") for _ in range(rank))
        op = self._op(rewrite)
        builder = _Rhs(self, tensor, indices, op)
        rhs = builder.expr(ty, depth=self.rng.randint(0, 3))
        if op in ("=", "+=!", "*=!", "min=!", "max=!", "+=", "*=", "min=", "max="):
            rhs = builder.clamp_for(op, rhs, ty)
        if rewrite and op == "=" and indices and self.rng.random() < 0.4:
            own = Read(tensor, tuple(Lin(((v, 1),)) for v in indices))
            rhs = Bin(self.rng.choice("+-"), own, rhs)
        where = builder.where_clauses(rewrite, subscript_vars(rhs))
        return Stmt(tensor, indices, op, rhs, where)

    def _op(self, rewrite: bool) -> str:
        if self.rng.random() < 0.3:
            return "="
        op = self.rng.choice(REDUCTIONS)
        return op if rewrite and self.rng.random() < 0.6 else op + "!"

    def program(self) -> Program:
        written = list(dict.fromkeys(s.tensor for s in self.stmts))
        outputs = [t for t in written if self.rng.random() < 0.6]
        if not outputs or written[-1] not in outputs:
            outputs.append(written[-1])
        # drawn last, so that a seed gives the program it gave before half types
        float_type = self.rng.choices(FLOAT_TYPES, weights=(2, 1, 1))[0]
        return Program("f", tuple(self.inputs), tuple(dict.fromkeys(outputs)),
                       tuple(self.stmts), dict(self.sizes), self.nan, float_type)  # fmt: skip


class _Rhs:
    """Draws the right-hand side of one statement and the where clauses it needs."""

    def __init__(self, g: Generator, tensor: str, indices: tuple[str, ...], op: str) -> None:
        assert g.info is not None
        self.g, self.rng, self.info = g, g.rng, g.info
        self.tensor, self.indices, self.op = tensor, indices, op
        self.reduction = op != "="
        self.rvars: list[str] = []  # reduction indices drawn so far
        self.ranged: dict[str, Bound] = {}  # reduction indices with where k in 0:K

    def expr(self, ty: str, depth: int) -> Expr:
        if depth <= 0 or self.rng.random() < 0.25:
            return self.leaf(ty)
        kind = self.rng.choices(("bin", "minmax", "neg", "cond", "builtin", "cast", "intdiv"),
                                (6, 2, 1, 1, 1, 1, 1))[0]  # fmt: skip
        sub = depth - 1
        match kind:
            case "bin":
                return Bin(self.rng.choice("+-*"), self.expr(ty, sub), self.expr(ty, sub))
            case "minmax":
                return Call(
                    self.rng.choice(("min", "max")), (self.expr(ty, sub), self.expr(ty, sub))
                )
            case "neg":
                return Neg(self.expr(ty, sub))
            case "cond":
                cmp_ty = self.rng.choice((ty, FLOAT, INT))
                return Cond(self.rng.choice(("<", "<=", ">", ">=", "==", "!=")),
                            self.expr(cmp_ty, sub), self.expr(cmp_ty, sub),
                            self.expr(ty, sub), self.expr(ty, sub))  # fmt: skip
            case "builtin" if ty == FLOAT:
                return self.builtin(sub)
            case "cast" if ty == INT and not self.g.nan:
                return Cast(INT, self.expr(FLOAT, sub))
            case "cast" if ty == FLOAT:
                return Cast(FLOAT, self.expr(INT, sub))
            case "intdiv" if ty == INT:
                return Bin(
                    self.rng.choice("/%"), self.expr(INT, sub), Num(self.rng.randint(1, 4), INT)
                )
        return self.leaf(ty)

    def builtin(self, depth: int) -> Expr:
        fn = self.rng.choice(("fabs", "floor", "ceil", "trunc", "round", "fmin", "fmax", "fma",
                              "pow", "copysign", "fdim"))  # fmt: skip
        if fn == "pow":
            return Call(fn, (self.clamp(self.expr(FLOAT, depth), FLOAT, 64), Num(2, FLOAT)))
        arity = {"fma": 3, "fmin": 2, "fmax": 2, "copysign": 2, "fdim": 2}.get(fn, 1)
        return Call(fn, tuple(self.expr(FLOAT, depth) for _ in range(arity)))

    def leaf(self, ty: str) -> Expr:
        roll = self.rng.random()
        if roll < 0.12:
            value = self.rng.randint(-3, 3)
            return Num(value, ty if ty == INT or self.rng.random() < 0.8 else INT)
        if roll < 0.2 and self.indices:
            return Var(self.rng.choice(self.indices))
        if roll < 0.23 and self.g.sizes:
            return Var(self.rng.choice(list(self.g.sizes)))
        return self.read(ty)

    def read(self, ty: str) -> Expr:
        candidates = [t for t in self.info.shapes if t != self.tensor]
        if ty == INT or self.g.nan:
            same = [t for t in candidates if self.info.types[t] == ty]
            candidates = same if ty == INT else candidates
        if not candidates:
            return Num(self.rng.randint(-3, 3), ty)
        t = self.rng.choice(candidates)
        e: Expr = Read(t, tuple(self.subscript(extent) for extent in self.info.shapes[t]))
        if self.info.bounds.get(t, 3) > 64:
            e = self.clamp(e, self.info.types[t], 8)
        return e

    def subscript(self, extent: int) -> Sub:
        roll = self.rng.random()
        gathers = [d.name for d in self.g.inputs if d.ty == INT and d.dims]
        if roll < 0.08:
            return Lin(
                (), self.rng.randint(0, max(extent - 1, 0)) if self.rng.random() < 0.5 else 0
            )
        if roll < 0.16 and gathers:
            idx = self.rng.choice(gathers)
            shape = self.info.shapes[idx]
            return Gather(idx, tuple(self.simple_index() for _ in shape))
        if roll < 0.3 and self.indices:
            return self.affine()
        return self.simple_index()

    def simple_index(self) -> Lin:
        """An LHS index, or a reduction index (new or reused) under a reduction."""
        if self.reduction and (not self.indices or self.rng.random() < 0.4) and len(self.rvars) < 3:
            if not self.rvars or self.rng.random() < 0.5:
                self.rvars.append(self.g.names.fresh("index"))
            return Lin(((self.rng.choice(self.rvars), 1),))
        if not self.indices:
            return Lin((), 0)
        return Lin(((self.rng.choice(self.indices), 1),))

    def affine(self) -> Lin:
        """`i + k` / `2*h + kh` with k ranged by a where clause, or `i + c`."""
        v = self.rng.choice(self.indices)
        coeff = self.rng.choice((1, 1, 2, 3))
        if self.reduction and self.rng.random() < 0.7:
            k = self.g.names.fresh("index")
            self.ranged[k] = Bound(None, self.rng.randint(1, 4))
            self.rvars.append(k)
            return Lin(((v, coeff), (k, 1)))
        return Lin(((v, coeff),), self.rng.randint(0, 2))

    def clamp(self, e: Expr, ty: str, c: int) -> Expr:
        return Call("min", (Call("max", (e, Num(-c, ty))), Num(c, ty)))

    def clamp_for(self, op: str, rhs: Expr, ty: str) -> Expr:
        """Keep a reduction's result exact: small operands for long sums and products."""
        if op.startswith("*="):
            return self.clamp(rhs, ty, self.rng.choice((1, 2)))
        if self.rng.random() < 0.5:
            return self.clamp(rhs, ty, self.rng.choice((3, 9, 100)))
        return rhs

    def where_clauses(
        self, rewrite: bool, bounded: set[str]
    ) -> tuple[tuple[str, Bound, Bound], ...]:
        """`where k in 0:K` for ranged reduction indices; ranges for unbound LHS indices."""
        out = [(k, Bound(None, 0), hi) for k, hi in self.ranged.items()]
        sizes = list(self.g.sizes) or [None]
        for v in self.indices:
            if self.rng.random() < 0.15 or (not rewrite and v not in bounded):
                sym = self.rng.choice(sizes)
                hi = Bound(sym, -self.rng.randint(0, 1) if sym else self.rng.randint(1, 5))
                lo = Bound(None, self.rng.randint(0, 1) if rewrite else 0)
                out.append((v, lo, hi))
        return tuple(out)


# --- row chains --------------------------------------------------------------------------


class _Chain:
    """What a chain over shared rows draws first (`row_chain`, `online_chain`), in this
    order: its names, sizes, one or two row indices, and the indices along a row (`j`),
    of a contraction (`k`) and of an operand the rows share (`e`); then the inputs and
    statements it adds."""

    def __init__(self, rng: random.Random) -> None:
        self.names = Names(rng)
        self.size = {k: self.names.fresh("size") for k in ("row", "outer", "col", "red", "out")}
        self.sizes = {self.size[k]: rng.choice(SIZES) for k in self.size}
        two = rng.random() < 0.4
        self.rows = [self.names.fresh("index") for _ in range(2 if two else 1)]
        self.j, self.k, self.e = (self.names.fresh("index") for _ in range(3))
        self.row_dims = [self.size["outer"], self.size["row"]] if two else [self.size["row"]]
        self.inputs: list[Decl] = []
        self.stmts: list[Stmt] = []

    def tensor(self, dims: list[str]) -> str:
        """A new float input of extents `dims`."""
        decl = Decl(self.names.fresh("tensor"), FLOAT, tuple(dims))
        self.inputs.append(decl)
        return decl.name

    @staticmethod
    def at(name: str, *vs: str) -> Read:
        return Read(name, tuple(Lin(((v, 1),)) for v in vs))

    def program(self, outputs: list[str], **kinds: Any) -> Program:
        """The chain as a program of `outputs`, the sizes its inputs use; analysed."""
        used = {x for d in self.inputs for x in d.dims}
        sizes = {n: v for n, v in self.sizes.items() if n in used}
        program = Program("f", tuple(self.inputs), tuple(outputs), tuple(self.stmts), sizes,
                          **kinds)  # fmt: skip
        analyze(program)
        return program


ROW_CHAIN_SHARE = 0.25
"""The share of programs drawn as row chains (`row_chain`)."""


def row_chain(rng: random.Random) -> Program:
    """A chain of statements over shared rows that a row reduction needs whole, as
    attention, softmax, log-sum-exp and layer norm are (what row fusion rewrites):
    a row's elements, from an input or a contraction with an operand the rows share,
    maybe rewritten in place; a reduction of each row; statements over the row's
    elements reading it; another reduction; a product with an operand the rows share
    or a statement over the elements, maybe rewritten in place. Which of each, the
    reductions' operators, the number of row indices, the order of the operands and
    the sizes are drawn; values stay exact (inputs of at most 3, clamped sums)."""
    c = _Chain(rng)
    names, size, rows, row_dims = c.names, c.size, c.rows, c.row_dims
    j, k, e = c.j, c.k, c.e
    stmts, tensor, at = c.stmts, c.tensor, c.at

    def clamp(x: Expr, c: int) -> Expr:
        return Call("min", (Call("max", (x, Num(-c, FLOAT))), Num(c, FLOAT)))

    elements = names.fresh("tensor")
    if rng.random() < 0.6:  # a contraction inside the rows
        q = tensor([*row_dims, size["red"]])
        shared = tensor([size["col"], size["red"]])
        product = Bin("*", at(q, *rows, k), at(shared, j, k))
        stmts.append(Stmt(elements, (*rows, j), "+=!", clamp(product, 9)))
    else:
        x = tensor([*row_dims, size["col"]])
        stmts.append(Stmt(elements, (*rows, j), "=", at(x, *rows, j)))
    if rng.random() < 0.5:  # rewritten in place, as a scale and a mask
        mask = tensor([size["col"]])
        own = at(elements, *rows, j)
        stmts.append(Stmt(elements, (*rows, j), "=", Bin(rng.choice("+-"), own, at(mask, j))))
    first = names.fresh("tensor")
    stmts.append(Stmt(first, tuple(rows), rng.choice(("max=!", "min=!", "+=!")),
                      clamp(at(elements, *rows, j), 100)))  # fmt: skip
    centred = names.fresh("tensor")
    stmts.append(Stmt(centred, (*rows, j), "=",
                      clamp(Bin("-", at(elements, *rows, j), at(first, *rows)), 50)))  # fmt: skip
    second = names.fresh("tensor")
    stmts.append(Stmt(second, tuple(rows), rng.choice(("+=!", "max=!")),
                      at(centred, *rows, j)))  # fmt: skip
    out = names.fresh("tensor")
    if rng.random() < 0.6:  # a product with an operand the rows share
        v = tensor([size["col"], size["out"]])
        product = Bin("*", clamp(at(centred, *rows, j), 9), at(v, j, e))
        stmts.append(Stmt(out, (*rows, e), "+=!", product))
        last = (*rows, e)
    else:
        stmts.append(Stmt(out, (*rows, j), "=", at(centred, *rows, j)))
        last = (*rows, j)
    if rng.random() < 0.6:
        own, row = clamp(at(out, *last), 10000), clamp(at(second, *rows), 10000)
        stmts.append(Stmt(out, last, "=", Bin(rng.choice("+-"), own, row)))
    outputs = [out] + [t for t in (first, second, centred) if rng.random() < 0.2]
    float_type = rng.choices(FLOAT_TYPES, weights=(2, 1, 1))[0]
    return c.program(outputs, float_type=float_type)


# --- chains of exponentials against a row's maximum ------------------------------------

ONLINE_CHAIN_SHARE = 0.1
"""The share of programs drawn as chains of exponentials (`online_chain`)."""


def online_chain(rng: random.Random) -> Program:
    """A chain that the online rewrite over tiles of a row (`tcpy.poly.online`) takes,
    or a near miss it must refuse: a row's elements (an input, or a contraction with an
    operand the rows share), maybe scaled and masked in place; their maximum over the
    row; exponentials of the elements less it, maybe times an operand of the row's
    positions; sums of those alone, times the elements, or in a product with an
    operand the rows share; then what a softmax, a log-sum-exp or an attention makes
    of them. The near misses read the maximum outside an exponential, square the
    exponential, or leave a sum without its `!`. Values are real (`Program.smooth`):
    such a pair is checked against the reference within a tolerance."""
    c = _Chain(rng)
    names, size, rows, row_dims = c.names, c.size, c.rows, c.row_dims
    j, k, e = c.j, c.k, c.e
    stmts, tensor, at = c.stmts, c.tensor, c.at

    def write(op: str, indices: tuple[str, ...], rhs: Expr) -> str:
        name = names.fresh("tensor")
        stmts.append(Stmt(name, indices, op, rhs))
        return name

    row, elem = tuple(rows), (*rows, j)
    if rng.random() < 0.6:  # a contraction inside the rows: an attention's scores
        q, keys = tensor([*row_dims, size["red"]]), tensor([size["col"], size["red"]])
        scores = write("+=!", elem, Bin("*", at(q, *rows, k), at(keys, j, k)))
    else:
        scores = write("=", elem, at(tensor([*row_dims, size["col"]]), *rows, j))
    if rng.random() < 0.4:  # scaled in place
        stmts.append(Stmt(scores, elem, "=", Bin("*", at(scores, *elem), Num(2, FLOAT))))
    if rng.random() < 0.4:  # masked in place
        mask = tensor([size["col"]])
        stmts.append(Stmt(scores, elem, "=", Bin("+", at(scores, *elem), at(mask, j))))
    top = write("max=!", row, at(scores, *elem))
    power: Expr = Call("exp", (Bin("-", at(scores, *elem), at(top, *rows)),))
    miss = rng.random() < 0.15  # a shape the rule must refuse
    if miss:
        power = rng.choice((
            Bin("+", power, at(top, *rows)),  # the maximum read outside the exponential
            Bin("*", power, power),  # a square of it
        ))  # fmt: skip
    elif rng.random() < 0.3:  # times an operand of the row's positions
        power = Bin("*", power, at(tensor([size["col"]]), j))
    weights = write("=", elem, power)
    sum_op = "+=" if miss and rng.random() < 0.3 else "+=!"
    if sum_op == "+=":  # a sum without `!` starts from its own zeros
        total = names.fresh("tensor")
        stmts.append(Stmt(total, row, "=", Num(0, FLOAT)))
        stmts.append(Stmt(total, row, "+=", at(weights, *elem)))
    else:
        total = write("+=!", row, at(weights, *elem))
    outputs: list[str] = []
    kind = rng.choice(("attention", "softmax", "logsumexp", "mean"))
    if kind == "attention":  # a product with an operand the rows share
        values = tensor([size["col"], size["out"]])
        acc = write("+=!", (*rows, e), Bin("*", at(weights, *elem), at(values, j, e)))
        outputs.append(write("=", (*rows, e), Bin("/", at(acc, *rows, e), at(total, *rows))))
    elif kind == "softmax":  # the exponentials read again after the chain
        outputs.append(write("=", elem, Bin("/", at(weights, *elem), at(total, *rows))))
    elif kind == "logsumexp":
        log = Call("log", (at(total, *rows),))
        outputs.append(write("=", row, Bin("+", at(top, *rows), log)))
    else:  # a softmax-weighted mean of the elements
        acc = write("+=!", row, Bin("*", at(weights, *elem), at(scores, *elem)))
        outputs.append(write("=", row, Bin("/", at(acc, *rows), at(total, *rows))))
    outputs += [t for t in (top, total) if rng.random() < 0.2]
    return c.program(outputs, smooth=True)


def generate(rng: random.Random, online: bool = False) -> Program:
    """A random program that `program.analyze` accepts at its own sizes: a row chain
    (`row_chain`) for a `ROW_CHAIN_SHARE` of them, a chain of exponentials
    (`online_chain`) for an `ONLINE_CHAIN_SHARE` (all of them with `online`), else
    statements drawn one by one."""
    # drawn from the generator's state without advancing it, so that a seed that
    # draws no chain gives the program it gave before chains were drawn; from
    # the state's integers alone: the whole state holds a None, whose hash in Python
    # 3.11 is its address, and a seed then gave another program in another process
    draw = random.Random(hash(rng.getstate()[1])).random()
    chain = row_chain if draw < ROW_CHAIN_SHARE else None
    if online or ROW_CHAIN_SHARE <= draw < ROW_CHAIN_SHARE + ONLINE_CHAIN_SHARE:
        chain = online_chain
    if chain is not None:
        while True:
            try:
                return chain(rng)
            except Invalid:
                continue
    while True:
        g = Generator(rng)
        g.signature()
        g.statements()
        if g.stmts:
            return g.program()
