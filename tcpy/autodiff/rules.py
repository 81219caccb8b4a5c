"""The chain rule over a TC expression: the adjoint of each read of a float tensor,
given the adjoint of the expression (`read_adjoints`), with the derivative of every
float builtin (`partials`). Comparisons, logical operators and integer values carry
no gradient; `?:` routes it to the branch taken; `min`/`max`, `fmin`/`fmax` split it
evenly between equal operands, as PyTorch's `minimum` and `maximum` do."""

from __future__ import annotations

from collections.abc import Callable

from tcpy.autodiff import build as b
from tcpy.errors import TCGradientError
from tcpy.parser import ast
from tcpy.types import ScalarType

Ex = ast.Expr


def _pi(ty: ScalarType) -> Ex:
    return b.constant(ty, lambda one: b.call("acos", b.neg(one)), 1)


def _ln(ty: ScalarType, base: int) -> Ex:
    return b.constant(ty, lambda n: b.call("log", n), base)


def _ratio_or_half(x: Ex, value: Ex) -> Ex:
    """`value / x`, which is 1/2 in the limit at x = 0 for Bessel functions of the
    first kind of order one (`j1(x) / x`, `i1(x) / x`)."""
    zero = b.binary(ast.BinaryOp.EQ, x, b.num(0, x.span))
    return b.select(zero, b.num(0.5, x.span), b.div(value, x))


def _unary_rules(x: Ex, y: Ex, ty: ScalarType) -> dict[str, Callable[[], Ex]]:
    """d y / d x for the one-argument builtins, `y` the call itself."""
    one, two = b.num(1, x.span), b.num(2, x.span)
    sq = b.square(x)
    return {
        "acos": lambda: b.neg(b.call("rsqrt", b.sub(one, sq))),
        "acosh": lambda: b.call("rsqrt", b.sub(sq, one)),
        "asin": lambda: b.call("rsqrt", b.sub(one, sq)),
        "asinh": lambda: b.call("rsqrt", b.add(sq, one)),
        "atan": lambda: b.div(one, b.add(one, sq)),
        "atanh": lambda: b.div(one, b.sub(one, sq)),
        "cbrt": lambda: b.div(one, b.mul(b.num(3, x.span), b.square(y))),
        "cos": lambda: b.neg(b.call("sin", x)),
        "cosh": lambda: b.call("sinh", x),
        "cospi": lambda: b.neg(b.mul(_pi(ty), b.call("sinpi", x))),
        "cyl_bessel_i0": lambda: b.call("cyl_bessel_i1", x),
        "cyl_bessel_i1": lambda: b.sub(
            b.call("cyl_bessel_i0", x), _ratio_or_half(x, b.call("cyl_bessel_i1", x))
        ),
        "erf": lambda: b.div(b.mul(two, b.call("exp", b.neg(sq))), b.call("sqrt", _pi(ty))),
        "erfc": lambda: b.neg(b.div(b.mul(two, b.call("exp", b.neg(sq))), b.call("sqrt", _pi(ty)))),
        "erfcinv": lambda: b.neg(
            b.div(b.mul(b.call("sqrt", _pi(ty)), b.call("exp", b.square(y))), two)
        ),
        "erfcx": lambda: b.sub(b.mul(b.mul(two, x), y), b.div(two, b.call("sqrt", _pi(ty)))),
        "erfinv": lambda: b.div(b.mul(b.call("sqrt", _pi(ty)), b.call("exp", b.square(y))), two),
        "exp": lambda: y,
        "exp10": lambda: b.mul(_ln(ty, 10), y),
        "exp2": lambda: b.mul(_ln(ty, 2), y),
        "expm1": lambda: b.add(y, one),
        "fabs": lambda: b.select(
            b.binary(ast.BinaryOp.GT, x, b.num(0, x.span)),
            one,
            b.select(
                b.binary(ast.BinaryOp.LT, x, b.num(0, x.span)), b.num(-1, x.span), b.num(0, x.span)
            ),
        ),
        "j0": lambda: b.neg(b.call("j1", x)),
        "j1": lambda: b.sub(b.call("j0", x), _ratio_or_half(x, b.call("j1", x))),
        "log": lambda: b.div(one, x),
        "log10": lambda: b.div(one, b.mul(x, _ln(ty, 10))),
        "log1p": lambda: b.div(one, b.add(one, x)),
        "log2": lambda: b.div(one, b.mul(x, _ln(ty, 2))),
        "normcdf": lambda: b.div(
            b.call("exp", b.neg(b.div(sq, two))), b.call("sqrt", b.mul(two, _pi(ty)))
        ),
        "normcdfinv": lambda: b.mul(
            b.call("sqrt", b.mul(two, _pi(ty))), b.call("exp", b.div(b.square(y), two))
        ),
        "rcbrt": lambda: b.neg(b.div(y, b.mul(b.num(3, x.span), x))),
        "rsqrt": lambda: b.neg(b.div(y, b.mul(two, x))),
        "sin": lambda: b.call("cos", x),
        "sinh": lambda: b.call("cosh", x),
        "sinpi": lambda: b.mul(_pi(ty), b.call("cospi", x)),
        "sqrt": lambda: b.div(one, b.mul(two, y)),
        "tan": lambda: b.add(one, b.square(y)),
        "tanh": lambda: b.sub(one, b.square(y)),
        "y0": lambda: b.neg(b.call("y1", x)),
        "y1": lambda: b.sub(b.call("y0", x), b.div(b.call("y1", x), x)),
    }


NO_DERIVATIVE = {
    "ceil": "it is piecewise constant",
    "floor": "it is piecewise constant",
    "round": "it is piecewise constant",
    "trunc": "it is piecewise constant",
    "logb": "it is piecewise constant",
    "nextafter": "it steps to the next representable value",
    "lgamma": "its derivative (digamma) is no TC builtin",
    "tgamma": "its derivative needs digamma, which is no TC builtin",
}
"""The float builtins that have no derivative tcpy can write, and why."""


def partials(call: ast.Call, ty: ScalarType, value: Ex | None = None) -> list[Ex]:
    """The partial derivatives of builtin `call` (computed in `ty`) by each argument;
    a `TCGradientError` naming the builtin where it has none. `value`: the call's
    value where it is at hand (a tensor the statement wrote), used where a derivative
    needs it (`exp`'s is its value) instead of calling it again."""
    if call.name in NO_DERIVATIVE:
        raise TCGradientError(
            f"{call.name} has no gradient ({NO_DERIVATIVE[call.name]}); the gradient of "
            "this expression is needed by an input it reads",
            call.span,
        )
    args = call.args
    if len(args) == 1:
        return [_unary_rules(args[0], value or call, ty)[call.name]()]
    return _nary(call, ty, value or call)


def _nary(call: ast.Call, ty: ScalarType, y: Ex) -> list[Ex]:
    args, s = call.args, call.span
    one, zero, half = b.num(1, s), b.num(0, s), b.num(0.5, s)
    x0, x1 = args[0], args[1]
    match call.name:
        case "atan2":  # atan2(y, x)
            r = b.add(b.square(x0), b.square(x1))
            return [b.div(x1, r), b.neg(b.div(x0, r))]
        case "copysign":
            ratio = b.select(b.binary(ast.BinaryOp.EQ, x0, zero), zero, b.div(y, x0))
            return [ratio, zero]
        case "fdim":
            above = b.binary(ast.BinaryOp.GT, x0, x1)
            return [b.select(above, one, zero), b.select(above, b.num(-1, s), zero)]
        case "fdivide":
            return [b.div(one, x1), b.neg(b.div(x0, b.square(x1)))]
        case "fma":
            return [args[1], args[0], one]
        case "fmax" | "fmin":
            return list(split_extremum(x0, x1, call.name == "fmax", one, half, zero))
        case "fmod":
            return [one, b.neg(b.call("trunc", b.div(x0, x1)))]
        case "remainder":
            return [one, b.neg(b.call("round", b.div(x0, x1)))]
        case "hypot":
            return [b.div(x0, y), b.div(x1, y)]
        case "rhypot":
            cube = b.mul(b.square(y), y)
            return [b.neg(b.mul(x0, cube)), b.neg(b.mul(x1, cube))]
        case "norm3d" | "norm4d":
            return [b.div(a, y) for a in args]
        case "rnorm3d" | "rnorm4d":
            cube = b.mul(b.square(y), y)
            return [b.neg(b.mul(a, cube)) for a in args]
        case "pow":
            dx = b.select(
                b.binary(ast.BinaryOp.EQ, x1, zero),
                zero,
                b.mul(x1, b.call("pow", x0, b.sub(x1, one))),
            )
            flat = b.both(b.binary(ast.BinaryOp.EQ, x0, zero), b.binary(ast.BinaryOp.GE, x1, zero))
            return [dx, b.select(flat, zero, b.mul(y, b.call("log", x0)))]
    raise TCGradientError(f"{call.name} has no gradient rule", call.span)


def split_extremum(a: Ex, c: Ex, largest: bool, one: Ex, half: Ex, zero: Ex) -> tuple[Ex, Ex]:
    """The derivatives of max(a, c) (or min) by a and c: 1 for the one taken, half each
    where they are equal."""
    wins = ast.BinaryOp.GT if largest else ast.BinaryOp.LT
    ties = b.binary(ast.BinaryOp.EQ, a, c)
    da = b.select(b.binary(wins, a, c), one, b.select(ties, half, zero))
    dc = b.select(b.binary(wins, c, a), one, b.select(ties, half, zero))
    return da, dc


def _is_float(e: Ex) -> bool:
    return e.ty is not None and e.ty.is_float


def read_adjoints(e: Ex, seed: Ex, value: Ex | None = None) -> list[tuple[ast.Access, Ex]]:
    """The adjoint of each read of a float tensor in typed expression `e` whose own
    adjoint is `seed`, in the order the reads stand, one entry per read. `value`: the
    value of `e` where it is at hand (what an assignment wrote)."""
    out: list[tuple[ast.Access, Ex]] = []
    _walk(e, seed, out, value)
    return out


def _walk(e: Ex, g: Ex, out: list[tuple[ast.Access, Ex]], value: Ex | None = None) -> None:
    if b.is_zero(g) or not _is_float(e):
        return
    assert e.ty is not None
    match e:
        case ast.Access():
            out.append((e, g))
        case ast.Cast(value=v):
            _walk(v, g, out)
        case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
            _walk(v, b.neg(g), out)
        case ast.Binary(op=op, lhs=x, rhs=y):
            for operand, adjoint in _binary(op, x, y, g, e.ty):
                _walk(operand, adjoint, out)
        case ast.Ternary(cond=c, then=t, orelse=o):
            # each branch's adjoints only where the forward took it: its reads stay
            # under the guard that kept them in range
            zero = b.num(0, g.span)
            for branch, taken in ((t, True), (o, False)):
                inner: list[tuple[ast.Access, Ex]] = []
                _walk(branch, g, inner)
                for read, adj in inner:
                    out.append((read, b.select(c, adj, zero) if taken else b.select(c, zero, adj)))
        case ast.Call(args=args):
            for arg, d in zip(args, partials(e, e.ty, value), strict=True):
                _walk(arg, b.mul(g, d), out)


def _binary(op: ast.BinaryOp, x: Ex, y: Ex, g: Ex, ty: ScalarType) -> list[tuple[Ex, Ex]]:
    s = g.span
    match op:
        case ast.BinaryOp.ADD:
            return [(x, g), (y, g)]
        case ast.BinaryOp.SUB:
            return [(x, g), (y, b.neg(g))]
        case ast.BinaryOp.MUL:
            return [(x, b.mul(g, y)), (y, b.mul(g, x))]
        case ast.BinaryOp.DIV:
            return [(x, b.div(g, y)), (y, b.neg(b.div(b.mul(g, x), b.square(y))))]
        case ast.BinaryOp.MIN | ast.BinaryOp.MAX:
            dx, dy = split_extremum(
                x, y, op is ast.BinaryOp.MAX, b.num(1, s), b.num(0.5, s), b.num(0, s)
            )
            return [(x, b.mul(g, dx)), (y, b.mul(g, dy))]
    return []
