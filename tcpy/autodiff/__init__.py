"""Reverse-mode differentiation of TC defs: the backward of a def, as TC text
(`gradient`). It sits beside the front end: it reads checked defs and writes TC that
the front end checks again, like any def a user writes."""

from tcpy.autodiff.derive import gradient

__all__ = ["gradient"]
