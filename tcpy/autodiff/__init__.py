"""Reverse-mode differentiation of TC defs: the backward of a def, as TC text
(`gradient`), and the forward that saves values for it (`forward_saving`, `derive`).
It sits beside the front end: it reads checked defs and writes TC that the front end
checks again, like any def a user writes."""

from tcpy.autodiff.derive import Derived, derive, forward_saving, gradient
from tcpy.autodiff.saving import Save

__all__ = ["Derived", "Save", "derive", "forward_saving", "gradient"]
