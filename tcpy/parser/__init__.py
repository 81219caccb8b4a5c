"""The front end: TC text -> AST (parse) -> checked definitions (sema, range inference)."""

from __future__ import annotations

from tcpy.errors import Span, TCError, TCSyntaxError
from tcpy.parser.checked import CheckedDef
from tcpy.parser.parse import check_depth, parse
from tcpy.parser.sema import check_program


def check_source(source: str, filename: str | None = None) -> dict[str, CheckedDef]:
    """Parse and check TC source: one `CheckedDef` per def, or a `TCError` with a caret."""
    try:
        program = parse(source, filename)
        check_depth(program)
        return check_program(program, filename)
    except TCError as e:
        raise e.with_source(source, filename) from None
    except RecursionError:
        err = TCSyntaxError("the program nests too deeply to compile", Span(1, 1, 1, 2))
        raise err.with_source(source, filename) from None


__all__ = ["CheckedDef", "check_source"]
