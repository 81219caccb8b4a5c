"""NumPy implementations of the TC builtins, with C's meaning where NumPy differs
(`round` rounds half away from zero, `remainder` is IEEE's, `logb` is the exponent)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Fn = Callable[..., np.ndarray]


def _special(name: str) -> Fn:
    """`scipy.special.<name>`, imported at the first call: SciPy is needed only by the
    few builtins below that NumPy lacks, so `import tcpy` does not load it."""

    def call(*xs: np.ndarray) -> np.ndarray:
        from scipy import special

        return getattr(special, name)(*xs)

    call.__name__ = name
    return call


def _round_half_away(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _remainder(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x - y * np.rint(x / y)


def _logb(x: np.ndarray) -> np.ndarray:
    _, e = np.frexp(x)
    out = (e - 1).astype(x.dtype)
    return np.where(x == 0, -np.inf, np.where(np.isfinite(x), out, np.abs(x)))


def _fdim(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(x > y, x - y, np.zeros_like(x)) + (x + y) * 0  # NaN propagates


def _norm(*xs: np.ndarray) -> np.ndarray:
    return np.sqrt(sum(x * x for x in xs))


IMPLEMENTATIONS: dict[str, Fn] = {
    "acos": np.arccos,
    "acosh": np.arccosh,
    "asin": np.arcsin,
    "asinh": np.arcsinh,
    "atan": np.arctan,
    "atan2": np.arctan2,
    "atanh": np.arctanh,
    "cbrt": np.cbrt,
    "ceil": np.ceil,
    "copysign": np.copysign,
    "cos": np.cos,
    "cosh": np.cosh,
    "cospi": lambda x: np.cos(np.pi * x),
    "cyl_bessel_i0": _special("i0"),
    "cyl_bessel_i1": _special("i1"),
    "erf": _special("erf"),
    "erfc": _special("erfc"),
    "erfcinv": _special("erfcinv"),
    "erfcx": _special("erfcx"),
    "erfinv": _special("erfinv"),
    "exp": np.exp,
    "exp10": lambda x: np.power(x.dtype.type(10), x),
    "exp2": np.exp2,
    "expm1": np.expm1,
    "fabs": np.fabs,
    "fdim": _fdim,
    "fdivide": np.divide,
    "floor": np.floor,
    "fma": lambda x, y, z: x * y + z,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "fmod": np.fmod,
    "hypot": np.hypot,
    "j0": _special("j0"),
    "j1": _special("j1"),
    "lgamma": _special("gammaln"),
    "log": np.log,
    "log10": np.log10,
    "log1p": np.log1p,
    "log2": np.log2,
    "logb": _logb,
    "nextafter": np.nextafter,
    "norm3d": _norm,
    "norm4d": _norm,
    "normcdf": _special("ndtr"),
    "normcdfinv": _special("ndtri"),
    "pow": np.power,
    "rcbrt": lambda x: 1 / np.cbrt(x),
    "remainder": _remainder,
    "rhypot": lambda x, y: 1 / np.hypot(x, y),
    "rnorm3d": lambda *xs: 1 / _norm(*xs),
    "rnorm4d": lambda *xs: 1 / _norm(*xs),
    "round": _round_half_away,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin,
    "sinh": np.sinh,
    "sinpi": lambda x: np.sin(np.pi * x),
    "sqrt": np.sqrt,
    "tan": np.tan,
    "tanh": np.tanh,
    "tgamma": _special("gamma"),
    "trunc": np.trunc,
    "y0": _special("y0"),
    "y1": _special("y1"),
}
