"""The one exception tree of tcpy, and source spans.

Every error a user can cause is a `TCError`. Compile-time errors carry a `Span` and
render the offending source line with a caret under it; call-time errors name the
input, the dimension and the values involved. A broken internal invariant is an
`InternalError`, which is deliberately *not* a `TCError`: it is a bug in tcpy, not
in the user's program.

All exceptions pickle (`__reduce__`), so worker processes can send them back.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Span:
    """A region of TC source: 1-based line and column of the first character,
    and of the character just past the end (as lark reports them)."""

    line: int
    column: int
    end_line: int
    end_column: int

    def merge(self, other: Span) -> Span:
        start = min((self.line, self.column), (other.line, other.column))
        end = max((self.end_line, self.end_column), (other.end_line, other.end_column))
        return Span(start[0], start[1], end[0], end[1])


def render_caret(source: str, span: Span) -> str:
    """The source line of `span` with carets under the spanned columns."""
    lines = source.splitlines()
    if not 1 <= span.line <= len(lines):
        return ""
    text = lines[span.line - 1].expandtabs(1)
    width = span.end_column - span.column if span.end_line == span.line else 1
    width = max(1, min(width, len(text) - span.column + 2))
    column = span.column
    if len(text) > CARET_LINE:  # a window of a long line around the caret
        start = max(0, column - 1 - CARET_LINE // 2)
        end = start + CARET_LINE
        text = ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")
        column -= start - (3 if start else 0)
        width = min(width, CARET_LINE)
    return f"{text}\n{' ' * (column - 1)}{'^' * width}"


CARET_LINE = 2000
"""The most of a source line an error shows: a longer one is cut around the caret."""


def located(message: str, span: Span | None, source: str | None, filename: str | None) -> str:
    """`file:line:col: message`, then the source line with a caret: how errors and
    warnings with a span render."""
    if span is None:
        return message
    text = f"{filename or '<tc>'}:{span.line}:{span.column}: {message}"
    if source is not None:
        caret = render_caret(source, span)
        if caret:
            text += "\n" + caret
    return text


class TCError(Exception):
    """Root of every error a user of tcpy can cause."""

    def __init__(
        self,
        message: str,
        span: Span | None = None,
        source: str | None = None,
        filename: str | None = None,
    ) -> None:
        self.message = message
        self.span = span
        self.source = source
        self.filename = filename
        super().__init__(message)

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span else None

    def with_source(self, source: str, filename: str | None = None) -> TCError:
        """Attach the program text (if not attached yet) so `str()` can show the line."""
        if self.source is None:
            self.source = source
        if self.filename is None:
            self.filename = filename
        return self

    def __str__(self) -> str:
        return located(self.message, self.span, self.source, self.filename)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.span, self.source, self.filename))


def _rebuild(
    cls: type[TCError], message: str, span: Span | None, source: str | None, filename: str | None
) -> TCError:
    return cls(message, span, source, filename)


class TCSyntaxError(TCError):
    """The text is not a TC program (lexing or parsing failed)."""


class TCSemanticError(TCError):
    """Names, types or statements break a rule of the language."""


class TCTypeError(TCSemanticError):
    """An expression's types do not fit (promotion, casts, subscripts, operators)."""


class TCGradientError(TCSemanticError):
    """A def, or a part of one, that tcpy cannot differentiate: a builtin without a
    derivative, a reduction it has no rule for, a `wrt` that names no float input."""


class TCRangeError(TCError):
    """Range inference could not give every index a range, or gave an unsafe one."""


class TCMappingError(TCError):
    """Mapping options that are invalid or cannot be applied to this kernel."""


class TCCompileError(TCError):
    """The generated code did not build, or isl gave up within its budget."""


class TCLaunchError(TCError):
    """A compiled kernel failed to load or run."""


class TCEmulationError(TCLaunchError):
    """The CUDA emulator found a defect while running a kernel: an out-of-bounds
    access, a shared-memory race, a divergent barrier or an incomplete warp operation."""


class TCInputError(TCError, ValueError):
    """The inputs of a call do not fit the definition (count, rank, dtype, sizes),
    or their values make the computation undefined (an index out of range). Also a
    `ValueError`, so that generic handlers of bad arguments catch it."""


class TCWarning(UserWarning):
    """A program that is legal but probably not what was meant; rendered like a
    `TCError`, with the line and a caret when it has a span."""

    def __init__(
        self,
        message: str,
        span: Span | None = None,
        source: str | None = None,
        filename: str | None = None,
    ) -> None:
        self.message = message
        self.span = span
        self.source = source
        self.filename = filename
        super().__init__(message)

    def __str__(self) -> str:
        return located(self.message, self.span, self.source, self.filename)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.span, self.source, self.filename))


_PACKAGE = os.path.dirname(__file__) + os.sep


def warn(warning: TCWarning) -> None:
    """Emit `warning` attributed to the first caller outside tcpy: the user's line
    that called `define` or `run`, not the pass that noticed."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(warning, stacklevel=level)


class InternalError(Exception):
    """A broken invariant inside tcpy: a bug to report, not a user error."""
