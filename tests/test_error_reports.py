"""How errors and warnings report: the file name at call time, suggested fixes that
tcpy accepts when applied, did-you-mean on option names, warnings that render with a
caret and point at the user's line."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.cli import main
from tcpy.errors import Span, TCMappingError, TCRangeError, TCWarning
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source

REVERSE = "def reverse(float(I) B) -> (A) {\n  A(i) = B(10 - i)\n}"

CONV_GRAD = """def convolution_grad(float(N,C,H,W) I, float(M,C,KH,KW) W1, float(N,M,H,W) O_grad)
    -> (I_grad)
{
    I_grad(n, c, h, w) +=! O_grad(n, m, h - kh, w - kw) * W1(m, c, kh, kw)
}
"""


def _data(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _engine(source: str, filename: str | None = "prog.tc") -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine("reference")
    engine.define(source, filename)
    return engine


def _apply(source: str, message: str, statement: str, fixed: str) -> str:
    """`source` with `statement` replaced by `fixed`, which `message` must suggest."""
    assert fixed in message
    assert source.count(statement) == 1
    return source.replace(statement, fixed)


def _accepted(source: str) -> tcpy.ExecutionEngine:
    """The fixed program defines with no error and no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", TCWarning)
        return _engine(source)


# --- the file name of errors raised at call time ------------------------------------------


def test_a_start_check_at_call_time_names_the_file() -> None:
    engine = _engine(REVERSE, "rev.tc")
    with pytest.raises(TCRangeError) as info:
        engine.reverse(_data(12))
    err = info.value
    assert err.filename == "rev.tc"
    assert str(err).startswith("rev.tc:2:5: A would start at index -1, not 0")
    assert str(err).splitlines()[1:] == ["  A(i) = B(10 - i)", "    ^"]


def test_a_bounds_check_at_call_time_names_the_file() -> None:
    source = "def f(float(N) A, float(M) B) -> (O) {\n  O(i) = A(i) + B(i) where i in 0:N\n}"
    engine = _engine(source, "bounds.tc")
    engine.f(_data(4), _data(4))  # in bounds at these sizes
    with pytest.raises(TCRangeError) as info:
        engine.f(_data(5), _data(3))
    assert str(info.value).startswith("bounds.tc:2:19: this subscript of B reaches index 4")
    assert str(info.value).splitlines()[-1] == " " * 18 + "^"


def test_a_compiled_kernel_names_the_file_too() -> None:
    engine = _engine(REVERSE, "rev.tc")
    compiled = engine.compile("reverse", _data(11))
    assert compiled.cdef.filename == "rev.tc"
    with pytest.raises(TCRangeError, match=r"^rev\.tc:2:5: "):
        engine.reverse(_data(10))


def test_the_file_name_is_kept_by_the_checked_def() -> None:
    (cdef,) = check_source(REVERSE, "rev.tc").values()
    assert cdef.filename == "rev.tc"
    (unnamed,) = check_source(REVERSE).values()
    assert unnamed.filename is None
    assert pickle.loads(pickle.dumps(cdef)) == cdef


# --- suggested fixes are accepted when applied ------------------------------------------


@pytest.mark.parametrize(
    ("source", "statement", "fixed"),
    [
        # the start of O is not 0: the hint shifts the subscripts, not `where i in 0:N + 3`
        ("def f(float(N) X) -> (O) {\n  O(i) = X(i - 3)\n}", "O(i) = X(i - 3)", "O(i) = X(i)"),
        (
            "def f(float(N) X) -> (O) {\n  O(i) = X(i + 3) * i\n}",
            "O(i) = X(i + 3) * i",
            "O(i) = X(i) * (i - 3)",
        ),
        (
            "def f(float(N) X) -> (O) {\n  O(i) = X(i) where i in 2:N\n}",
            "O(i) = X(i) where i in 2:N",
            "O(i) = X(i + 2) where i in 0:N - 2",
        ),
        (
            "def f(float(N,M) X) -> (O) {\n  O(i, j) = X(i - 1, j + 2)\n}",
            "O(i, j) = X(i - 1, j + 2)",
            "O(i, j) = X(i, j)",
        ),
        (
            "def f(float(N) X) -> (O) {\n  O(i) = X(k) where k = i - 1\n}",
            "O(i) = X(k) where k = i - 1",
            "O(i) = X(k) where k = i",
        ),
        # no access bounds i: a where clause with a size of the def
        ("def f(float(N) X) -> (O) {\n  O(i) = 1.0\n}", "O(i) = 1.0", "O(i) = 1.0 where i in 0:N"),
        (
            "def f(float(N,M) X) -> (O) {\n  O(i) = X(i, j)\n}",
            "O(i) = X(i, j)",
            "O(i) +=! X(i, j)",
        ),
        (
            "def f(float(N) X) -> (int32(N) O) {\n  O(i) = X(i)\n}",
            "O(i) = X(i)",
            "O(i) = int32(X(i))",
        ),
        (
            "def f(float(N) X) -> (O) {\n  O(i) = X(i) % 2.0\n}",
            "O(i) = X(i) % 2.0",
            "O(i) = fmod(X(i), 2.0)",
        ),
        (
            "def f(float(N) X) -> (O) {\n  O(i) +=! X(i) > 0.0\n}",
            "O(i) +=! X(i) > 0.0",
            "O(i) +=! int32(X(i) > 0.0)",
        ),
    ],
)
def test_a_suggested_fix_is_accepted(source: str, statement: str, fixed: str) -> None:
    with pytest.raises(tcpy.TCError) as info:
        _engine(source)
    _accepted(_apply(source, info.value.message, statement, fixed))


def test_no_hint_offers_the_range_that_reads_out_of_bounds() -> None:
    for shift in ("- 1", "+ 1"):
        with pytest.raises(TCRangeError) as info:
            _engine(f"def f(float(N) X) -> (O) {{ O(i) = X(i {shift}) }}")
        assert "where i in 0:N" not in info.value.message


def test_a_suggested_name_is_accepted() -> None:
    source = "def f(float(N) X, float(N) Y) -> (O) {\n  O(i) = exq(X(i)) + Yy(i)\n}"
    with pytest.raises(tcpy.TCSemanticError, match=r"exq; did you mean exp\?\n"):
        _engine(source)
    with pytest.raises(tcpy.TCSemanticError, match=r"Yy; did you mean Y\?\n"):
        _engine(source.replace("exq", "exp"))
    _accepted(source.replace("exq", "exp").replace("Yy", "Y"))


def test_a_name_of_another_rank_is_not_suggested() -> None:
    source = "def f(float(N) B, float(N,M) C) -> (O) {\n  O(i) = Bb(i, 0)\n}"
    with pytest.raises(tcpy.TCSemanticError) as info:
        _engine(source)
    assert info.value.message == "unknown tensor or function Bb"


def test_the_fix_of_a_start_checked_at_call_time_runs() -> None:
    engine = _engine(REVERSE)
    with pytest.raises(TCRangeError) as info:
        engine.reverse(_data(12))
    fixed = _accepted(
        _apply(REVERSE, info.value.message, "A(i) = B(10 - i)", "A(i) = B(I - 1 - i)")
    )
    b = _data(12)
    np.testing.assert_array_equal(fixed.reverse(b), b[::-1])


def test_the_fix_of_a_convolution_gradient_runs_at_the_sizes_it_failed_at() -> None:
    engine = _engine(CONV_GRAD)
    inputs = _data(2, 3, 5, 6), _data(4, 3, 3, 3), _data(2, 4, 5, 6)
    with pytest.raises(TCRangeError) as info:
        engine.convolution_grad(*inputs)
    statement = "I_grad(n, c, h, w) +=! O_grad(n, m, h - kh, w - kw) * W1(m, c, kh, kw)"
    fixed = (
        "I_grad(n, c, h, w) +=! O_grad(n, m, h - kh + KH - 1, w - kw + KW - 1) * W1(m, c, kh, kw)"
    )
    result = _accepted(_apply(CONV_GRAD, info.value.message, statement, fixed))
    assert result.convolution_grad(*inputs).shape == (2, 3, 3, 4)


def test_the_fix_of_an_uninitialised_reduction_is_accepted() -> None:
    source = "def f(float(N,M) X) -> (O) {\n  O(i) += X(i, j)\n}"
    with pytest.warns(TCWarning) as record:
        _engine(source)
    message = str(record[0].message)
    _accepted(_apply(source, message, "O(i) += X(i, j)", "O(i) +=! X(i, j)"))


def test_the_fix_of_a_guard_that_narrows_a_reduction_is_accepted() -> None:
    source = (
        "def pad(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
        "  O(n,f,h,w) +=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)"
        " ? I(n,c,h+kh-1,w+kw-1) * W1(f,c,kh,kw) : 0.0 where h in 0:H, w in 0:W\n}"
    )
    with pytest.warns(TCWarning) as record:
        _engine(source)
    message = str(record[0].message)
    clauses = "where h in 0:H, w in 0:W"
    _accepted(_apply(source, message, clauses, clauses + ", kh in 0:KH, kw in 0:KW"))


# --- did you mean, for option names -------------------------------------------------------


def test_an_options_dict_with_a_misspelt_name_suggests_the_field() -> None:
    engine = _engine(REVERSE)
    with pytest.raises(
        TCMappingError, match=r"unknown mapping option\(s\): 'tiel' \(did you mean 'tile'\?\)"
    ):
        engine.run("reverse", _data(11), options={"tiel": [16]})


def test_options_json_text_with_a_misspelt_name_suggests_the_field() -> None:
    with pytest.raises(TCMappingError, match=r"did you mean 'unroll'\?"):
        MappingOptions.resolve('{"unrol": 2}', MappingOptions)


def test_replace_with_a_misspelt_name_suggests_the_field() -> None:
    with pytest.raises(TCMappingError, match=r"did you mean 'map_to_threads'\?"):
        MappingOptions().replace(map_to_thread=(32,))


def test_a_name_close_to_no_field_lists_the_fields() -> None:
    with pytest.raises(TCMappingError) as info:
        MappingOptions.from_dict({"xyzzy": 1})
    assert "did you mean" not in info.value.message
    assert "the options are outer_schedule_fusion, " in info.value.message


def test_the_cli_options_suggest_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "rev.tc"
    f.write_text(REVERSE)
    args = ["run", str(f), "--sizes", "I=11", "--target", "reference"]
    assert main([*args, "--options", '{"tiel": [8]}']) == 1
    assert "did you mean 'tile'?" in capsys.readouterr().err


# --- a def named like an attribute of the engine ----------------------------------------


@pytest.mark.parametrize("name", ["compile", "run", "define", "tune", "stats", "target"])
def test_a_def_named_like_an_engine_attribute_warns(name: str) -> None:
    engine = tcpy.ExecutionEngine("reference")
    with pytest.warns(TCWarning) as record:
        engine.define(f"def {name}(float(N) X) -> (O) {{ O(i) = X(i) + 1.0 }}", "att.tc")
    (w,) = record
    assert w.filename == __file__
    assert f"cannot be called as engine.{name}(...)" in str(w.message)
    assert f"engine.run({name!r}, ...)" in str(w.message)
    assert str(w.message).startswith("att.tc:1:1: ")
    x = _data(3)
    np.testing.assert_array_equal(engine.run(name, x), x + 1)


def test_a_def_with_an_ordinary_name_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TCWarning)
        _engine("def runner(float(N) X) -> (O) { O(i) = X(i) }")


# --- warnings render like errors and point at the user's code ----------------------------


def test_a_sema_warning_has_a_caret_and_the_callers_line() -> None:
    source = "def f(float(N,M) A) -> (B) {\n  B(i) += A(i, j)\n}"
    engine = tcpy.ExecutionEngine("reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        engine.define(source, "warn.tc")
    (w,) = caught
    assert (w.filename, w.lineno) == (__file__, line)
    text = str(w.message).splitlines()
    assert text[0].startswith("warn.tc:2:3: B is not initialised before this += reduction")
    assert text[1:] == ["  B(i) += A(i, j)", "  ^^^^"]
    assert isinstance(w.message, TCWarning) and w.message.span == Span(2, 3, 2, 7)


def test_a_read_before_write_warning_has_a_caret() -> None:
    source = "def f(float(N) A) -> (float(N) B, C) {\n  C(i) = B(i) + A(i)\n  B(i) = A(i)\n}"
    with pytest.warns(TCWarning, match=r"^warn\.tc:2:10: B is read before") as record:
        _engine(source, "warn.tc")
    assert record[0].filename == __file__
    assert str(record[0].message).splitlines()[-1] == " " * 9 + "^^^^"


def test_a_range_warning_points_at_the_caller() -> None:
    source = (
        "def pad(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
        "  O(n,f,h,w) +=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)\n"
        "      ? I(n,c,h+kh-1,w+kw-1) * W1(f,c,kh,kw) : 0.0 where h in 0:H, w in 0:W\n}"
    )
    with pytest.warns(TCWarning, match=r"^pad\.tc:3:15: a read of I") as record:
        check_source(source, "pad.tc")
    assert record[0].filename == __file__
    assert str(record[0].message).splitlines()[-1].strip() == "^^^^^^"


def test_warnings_pickle() -> None:
    w = TCWarning("probably wrong", Span(1, 1, 1, 4), "def", "a.tc")
    again = pickle.loads(pickle.dumps(w))
    assert str(again) == str(w) == "a.tc:1:1: probably wrong\ndef\n^^^"


def _line() -> int:
    import inspect

    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno
