"""Gradients derived from the math (`tcpy.gradient`): every differentiable corpus program's
backward against central finite differences in float64 (`tests/gradients.py`), the
rules one by one (ties, zeros, guards, gathers, strides, versions), the backward
compiled for `cpu` and `cuda-emu` against `reference`, its interface and its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.autodiff import derive, forward_saving
from tcpy.parser import check_source

import gradients
from corpus_cases import CASES, Case
from programs import FC_RELU64, LAYERNORM64

CORPUS = Path(__file__).parent / "corpus"

NO_RULE = gradients.NO_RULE
DIFFERENTIABLE = gradients.differentiable(CASES)
_case64 = gradients.case64


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_corpus_gradients_match_finite_differences(case: Case) -> None:
    source, inputs = _case64(case)
    if case.name in NO_RULE:
        with pytest.raises(tcpy.TCGradientError, match=f"{NO_RULE[case.name]} has no gradient"):
            tcpy.gradient(source, case.entry)
        return
    gradients.check(source, case.entry, inputs)


def test_enough_of_the_corpus_is_differentiated() -> None:
    assert len(DIFFERENTIABLE) >= 100


COMPILED = ["matmul", "conv2d", "softmax", "layernorm", "maxpool2x2", "embedding", "gelu",
            "cross_entropy", "conv2d_stride2", "row_prod_seeded", "min_with_seed"]  # fmt: skip


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
@pytest.mark.parametrize("name", COMPILED)
def test_compiled_backward_matches_reference(name: str, target: str) -> None:
    case = next(c for c in CASES if c.name == name)
    source, inputs = _case64(case)
    bw = gradients.backward(source, case.entry, inputs)
    gradients.compiled_matches(bw, target)


def _grad(source: str, name: str, inputs: list[np.ndarray], **kw: object) -> list[np.ndarray]:
    """The backward's gradients on `reference`, the seeds all ones."""
    bw = gradients.backward(source, name, inputs, **kw)  # type: ignore[arg-type]
    args = list(bw.args)
    ones = {f"d_{n}" for n in bw.seeds}
    names = [t.name for t in check_source(bw.text)[bw.name].inputs]
    args = [np.ones_like(a) if n in ones else a for n, a in zip(names, args, strict=True)]
    engine = tcpy.ExecutionEngine("reference")
    engine.define(bw.text)
    out = getattr(engine, bw.name)(*args)
    return list(out) if isinstance(out, tuple) else [out]


def test_max_splits_the_gradient_evenly_among_ties() -> None:
    """PyTorch's rule for `amax`: the elements equal to the maximum share its gradient."""
    source = "def rowmax(double(M, N) A) -> (O) { O(m) max=! A(m, n) }"
    a = np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [0.0, -1.0, 7.0, 1.0]])
    (d_a,) = _grad(source, "rowmax", [a])
    want = np.array([[0, 0.5, 0.5, 0], [0.25] * 4, [0, 0, 1, 0]])
    np.testing.assert_array_equal(d_a, want)


def test_maxpool_ties_and_strides() -> None:
    """A 2x2 window of equal values shares its output's gradient in four."""
    source = (CORPUS / "maxpool.tc").read_text().replace("float", "double")
    image = np.zeros((1, 1, 4, 4))
    image[0, 0, :2, 2:] = [[1.0, 2.0], [2.0, 0.0]]
    (d_i,) = _grad(source, "maxpool2x2", [image])
    want = np.full((4, 4), 0.25)
    want[:2, 2:] = [[0, 0.5], [0.5, 0]]
    np.testing.assert_array_equal(d_i[0, 0], want)


def test_fmax_and_max_split_ties_in_half() -> None:
    source = "def f(double(N) A, double(N) B) -> (O) { O(i) = fmax(A(i), B(i)) + max(A(i), 1.0) }"
    a, c = np.array([1.0, 2.0, 3.0, 1.0]), np.array([1.0, 5.0, 0.0, 1.0])
    d_a, d_b = _grad(source, "f", [a, c])
    np.testing.assert_array_equal(d_a, [0.5 + 0.5, 0 + 1, 1 + 1, 0.5 + 0.5])
    np.testing.assert_array_equal(d_b, [0.5, 1, 0, 0.5])


@pytest.mark.parametrize(
    ("row", "want"),
    [([2.0, 3.0, 4.0], [12.0, 8.0, 6.0]), ([2.0, 0.0, 4.0], [0.0, 8.0, 0.0]),
     ([0.0, 3.0, 0.0], [0.0, 0.0, 0.0])],
)  # fmt: skip
def test_product_is_exact_with_zeros(row: list[float], want: list[float]) -> None:
    """No zero: the product of the others. One zero: only it gets a gradient. Two or
    more: none does."""
    source = "def prod(double(M, N) A) -> (O) { O(m) *=! A(m, n) }"
    (d_a,) = _grad(source, "prod", [np.array([row])])
    np.testing.assert_array_equal(d_a[0], want)


def test_gather_gradients_add_up_over_repeated_indices() -> None:
    """An index that appears twice gets both rows' gradients (np.add.at)."""
    source = (CORPUS / "embedding.tc").read_text().replace("float", "double")
    table = np.arange(12.0).reshape(4, 3)
    idx = np.array([2, 0, 2, 2], dtype=np.int32)
    d_o = np.random.default_rng(3).uniform(-1, 1, size=(4, 3))
    bw = gradients.backward(source, "embedding", [table, idx])
    engine = tcpy.ExecutionEngine("reference")
    engine.define(bw.text)
    d_e = engine.embedding_grad(table, idx, d_o)
    want = np.zeros_like(table)
    np.add.at(want, idx, d_o)
    np.testing.assert_allclose(d_e, want, rtol=1e-14)


def test_repeated_indices_take_the_diagonal() -> None:
    source = "def trace(double(N, N) A) -> (T) { T() +=! A(i, i) }"
    (d_a,) = _grad(source, "trace", [np.arange(9.0).reshape(3, 3)])
    np.testing.assert_array_equal(d_a, np.eye(3))


def test_a_gather_index_out_of_range_is_an_input_error_in_the_backward() -> None:
    """The adjoint of a gather is a scatter-add at the same subscripts, checked on the
    data as the forward's read is."""
    source = (CORPUS / "embedding.tc").read_text().replace("float", "double")
    table, idx = np.ones((4, 3)), np.array([1, 9], dtype=np.int32)
    text = tcpy.gradient(source, "embedding")
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(text)
    with pytest.raises(tcpy.TCInputError, match="idx"):
        engine.embedding_grad(table, idx, np.ones((2, 3)))


def test_versions_of_a_rewritten_output_and_what_the_backward_reads() -> None:
    """TC's idiom of writing one tensor three times is differentiated version by
    version; the backward recomputes the versions before the last and reads the last,
    the forward's output, as an input."""
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, (4, 5)), rng.uniform(-1, 1, 4)]
    bw = gradients.check(FC_RELU64, "fc_relu", inputs)
    names = [t.name for t in check_source(bw.text)["fc_relu_grad"].inputs]
    assert names == ["I", "W", "b", "d_O"]
    assert "O_2(i, j) = O_1(i, j) + b(j)" in bw.text


def test_the_interface_of_a_backward() -> None:
    """Inputs: the forward's inputs, the outputs it reads, `d_<output>` for each float
    output; outputs: `d_<input>` for each input differentiated, in the forward's order."""
    source = (CORPUS / "softmax.tc").read_text()
    bdef = check_source(tcpy.gradient(source, "softmax"))["softmax_grad"]
    inputs = [t.name for t in bdef.inputs]
    cdef = check_source(source)["softmax"]
    outs = [t.name for t in cdef.outputs]
    assert inputs[0] == cdef.inputs[0].name
    assert inputs[-len(outs) :] == [f"d_{o}" for o in outs]
    assert set(inputs[1 : -len(outs)]) <= set(outs)
    assert [t.name for t in bdef.outputs] == ["d_I"]


def test_wrt_chooses_the_inputs() -> None:
    source = "def mm(double(M, K) A, double(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    bdef = check_source(tcpy.gradient(source, "mm", wrt=["B"]))["mm_grad"]
    assert [t.name for t in bdef.outputs] == ["d_B"]


def test_an_input_that_no_output_depends_on_gets_zeros() -> None:
    source = "def f(double(N) A, double(N) B) -> (O) { O(i) = 2 * A(i) }"
    d_a, d_b = _grad(source, "f", [np.ones(3), np.ones(3)])
    np.testing.assert_array_equal(d_a, [2, 2, 2])
    np.testing.assert_array_equal(d_b, [0, 0, 0])


def test_scalar_and_integer_inputs() -> None:
    """A 0-d input gets a 0-d gradient; an integer input none."""
    source = "def f(double(N) A, double s, int32(N) c) -> (O) { O(i) = s * A(i) + c(i) }"
    a = np.array([1.0, 2.0, 3.0])
    bw = gradients.check(source, "f", [a, np.array(2.0), np.arange(3, dtype=np.int32)])
    assert [t.name for t in check_source(bw.text)["f_grad"].outputs] == ["d_A", "d_s"]


@pytest.mark.parametrize(
    ("wrt", "message"),
    [(["c"], "wrt names c, a int32 input"), (["Z"], "wrt names 'Z', which is no input"),
     ([], "wrt names no input")],
)  # fmt: skip
def test_wrt_errors(wrt: list[str], message: str) -> None:
    source = "def f(double(N) A, int32(N) c) -> (O) { O(i) = A(i) + c(i) }"
    with pytest.raises(tcpy.TCGradientError, match=message) as info:
        tcpy.gradient(source, "f", wrt=wrt)
    assert "^" in str(info.value)


def test_a_def_with_nothing_to_differentiate() -> None:
    source = "def f(int32(N) A) -> (O) { O(i) = A(i) + 1 }"
    with pytest.raises(tcpy.TCGradientError, match="no float input") as info:
        tcpy.gradient(source, "f")
    assert "^" in str(info.value)


def test_a_builtin_without_a_derivative_is_named_with_a_caret() -> None:
    source = "def f(double(N) A) -> (O) {\n    O(i) = floor(A(i)) * A(i)\n}"
    with pytest.raises(tcpy.TCGradientError, match="floor has no gradient") as info:
        tcpy.gradient(source, "f")
    assert info.value.line == 2
    assert "^^^^^" in str(info.value)


def test_an_unknown_def() -> None:
    with pytest.raises(tcpy.TCGradientError, match="no def named 'g'"):
        tcpy.gradient("def f(double(N) A) -> (O) { O(i) = A(i) }", "g")


def test_the_backward_is_deterministic_across_thread_counts() -> None:
    """Bit-identical gradients run to run and whatever the thread count: the adjoints
    are gathers, each element summed in one thread in a fixed order."""
    case = next(c for c in CASES if c.name == "conv2d")
    source, inputs = _case64(case)
    bw = gradients.backward(source, case.entry, inputs)
    results = []
    for threads in (1, 2, 1):
        engine = tcpy.ExecutionEngine("cpu")
        engine.define(bw.text)
        compiled = engine.compile(bw.name, *bw.args, options={"threads": threads})
        results.append(compiled(*bw.args))
    for got in results[1:]:
        for a, b in zip(got, results[0], strict=True):
            assert a.tobytes() == b.tobytes()


def test_the_command_prints_the_backward(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tcpy.cli import main

    path = tmp_path / "mm.tc"
    path.write_text("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    assert main(["grad", str(path), "--wrt", "A"]) == 0
    printed = capsys.readouterr().out
    assert check_source(printed)["mm_grad"].outputs[0].name == "d_A"
    assert printed == tcpy.gradient(path.read_text(), "mm", ["A"])
    ln = Path(__file__).parent.parent / "examples" / "layernorm.tc"
    assert main(["grad", str(ln), "--save", "auto"]) == 0
    defs = check_source(capsys.readouterr().out)
    assert [t.name for t in defs["layernorm_saving"].outputs] == ["Y", "mean", "var"]
    assert "mean" in [t.name for t in defs["layernorm_grad"].inputs]
    assert main(["grad", str(ln), "--save", "X"]) == 1
    assert "save names 'X'" in capsys.readouterr().err


def test_the_documented_example_prints_what_the_document_shows(
    capsys: pytest.CaptureFixture,
) -> None:
    """Each ```python block of docs/autodiff.md prints the ```text block after it."""
    doc = (Path(__file__).parent.parent / "docs" / "autodiff.md").read_text()
    blocks = doc.split("```python\n")[1:]
    assert len(blocks) >= 2
    for block in blocks:
        code = block.split("```")[0]
        shown = block.split("```text\n")[1].split("```")[0]
        exec(compile(code, "autodiff.md", "exec"), {})
        assert capsys.readouterr().out.rstrip("\n") == shown.rstrip("\n")


PADDED = [
    # a convolution's input gradient: one factor reads at the solved indices
    ("def f(double(N, C, H, W) I, double(F, C, KH, KW) Wt) -> (O) {"
     " O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * Wt(f, c, kh, kw) }",
     [(2, 3, 7, 6), (4, 3, 3, 2)], "d_O_padded"),
    # a one-dimensional one, with the window's own gradient beside it
    ("def f(double(N) X, double(K) W) -> (O) { O(h) +=! X(h + k) * W(k) }",
     [(9,), (3,)], "d_O_padded"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "shapes", "padded"), PADDED)
def test_a_window_gradient_reads_a_padded_copy_and_sums_without_a_condition(
    source: str, shapes: list[tuple[int, ...]], padded: str
) -> None:
    """The sum of the input's gradient has no `?:` (which compilers neither vectorise
    nor bound): the gradient it reads is a copy padded with zeros, whose own statement
    alone has the condition. Checked against finite differences and compiled."""
    rng = np.random.default_rng(3)
    inputs = [rng.uniform(-1, 1, s) for s in shapes]
    bw = gradients.check(source, "f", inputs)
    lines = [line.strip() for line in bw.text.splitlines()]
    pad = next(line for line in lines if line.startswith(f"{padded}("))
    assert "?" in pad
    summed = next(line for line in lines if line.startswith(("d_I(", "d_X(")))
    assert "?" not in summed and f"{padded}(" in summed
    gradients.compiled_matches(bw, "cpu")


def test_two_factors_at_the_solved_indices_keep_the_condition() -> None:
    source = (
        "def f(double(N) X, double(K) W, double(M) Y) -> (O) { O(h) +=! X(h + k) * W(k) * Y(h) }"
    )
    rng = np.random.default_rng(4)
    inputs = [rng.uniform(-1, 1, 9), rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 7)]
    bw = gradients.check(source, "f", inputs, wrt=["X"])
    assert "padded" not in bw.text
    assert "? d_O(y - k) * Y(y - k) * W(k) : 0" in bw.text, bw.text


def test_ties_compare_with_the_maximum_the_backward_recomputes_anyway() -> None:
    """A temporary maximum (a shifted softmax's `mx`) is recomputed by the backward, by the same
    statement: its ties compare with it, not with a second copy. A maximum that is an
    output comes from the forward's kernel and is recomputed beside the comparisons."""
    shifted = (
        "def f(double(N, D) X) -> (Y) { mx(n) max=! X(n, d)\n"
        " e(n, d) = exp(X(n, d) - mx(n))\n s(n) +=! e(n, d)\n Y(n, d) = e(n, d) / (s(n) + 1) }"
    )
    rng = np.random.default_rng(5)
    bw = gradients.check(shifted, "f", [rng.uniform(-1, 1, (3, 5))])
    assert "mx_max" not in bw.text and "X(n, d) == mx(n) ?" in bw.text
    pooled = "def f(double(N, D) X) -> (O) { O(n) max=! X(n, d) }"
    assert "O_max(n) max=! X(n, d)" in tcpy.gradient(pooled, "f")


def test_a_value_read_twice_has_its_adjoint_computed_once() -> None:
    """`(X - m) * (X - m)` reads `X` and `m` twice with the same adjoint: the backward
    doubles it (exact) rather than computing it twice."""
    source = (
        "def f(double(N, D) X) -> (V) { m(n) +=! X(n, d) / D\n"
        " V(n) +=! (X(n, d) - m(n)) * (X(n, d) - m(n)) }"
    )
    rng = np.random.default_rng(6)
    bw = gradients.check(source, "f", [rng.uniform(-1, 1, (3, 4))])
    assert "d_X(n, d) = 2 * (" in bw.text and "-(2 * (" in bw.text, bw.text


def test_a_condition_on_an_index_no_factor_reads_is_kept() -> None:
    """`X(h, 3*h + i)` solves `i = y - 3*h`, which must stay in `0:2`: no factor of the
    adjoint reads at `i`, so no padding can stand for that condition (the gradient
    fuzzer's cpu pair 9331028000 lost it)."""
    source = "def f(double(H, P) X) -> (O) { O(h) +=! X(h, 3*h + i) where i in 0:2 }"
    rng = np.random.default_rng(7)
    bw = gradients.check(source, "f", [rng.uniform(-1, 1, (4, 9))])
    assert "padded" not in bw.text


# --- saved values (`save`) -----------------------------------------------------------


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_a_backward_that_saves_gives_the_recomputing_backwards_gradients(case: Case) -> None:
    """With `save="auto"`, the backward takes what the forward computed by a reduction
    from the forward that returns it (`forward_saving`), and gives the gradients of the
    backward that recomputes everything (checked against finite differences above)."""
    if case.name in NO_RULE:
        return
    source, inputs = _case64(case)
    saving = gradients.backward(source, case.entry, inputs, save="auto")
    if saving.text == tcpy.gradient(source, case.entry):
        assert forward_saving(source, case.entry) is None
        return
    recomputing = gradients.backward(source, case.entry, inputs)
    for got, want in zip(_run(saving), _run(recomputing), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def _run(bw: gradients.Backward) -> tuple[np.ndarray, ...]:
    """A backward's gradients on `reference`."""
    engine = tcpy.ExecutionEngine("reference")
    engine.define(bw.text)
    out = getattr(engine, bw.name)(*bw.args)
    return out if isinstance(out, tuple) else (out,)


def test_enough_of_the_corpus_saves_values() -> None:
    """The reductions a backward reads are common: norms, softmaxes, layers with a
    product before their activation."""
    saving = [
        c
        for c in DIFFERENTIABLE
        if c.name not in NO_RULE and forward_saving(*_case64(c)[:1], c.entry) is not None
    ]
    assert len(saving) >= 10


def test_the_interface_of_a_backward_that_saves() -> None:
    """The saved values come after the forward's inputs and the outputs it reads,
    before the gradients given, in the forward's order; the saving forward returns
    them after its outputs, in the same order, and recomputes nothing it saves."""
    derived = derive(LAYERNORM64, "ln", save="auto")
    assert derived.saved == ("mean", "var")
    bdef = check_source(derived.backward)["ln_grad"]
    assert [t.name for t in bdef.inputs] == ["X", "g", "mean", "var", "d_Y"]
    for saved in ("\n    mean(n) +=!", "\n    var(n) +=!"):
        assert saved not in derived.backward
    assert derived.forward is not None
    fdef = check_source(derived.forward)["ln_saving"]
    assert [t.name for t in fdef.outputs] == ["Y", "mean", "var"]
    assert [str(t.scalar.value) for t in fdef.outputs] == ["float64"] * 3
    rng = np.random.default_rng(8)
    gradients.check(LAYERNORM64, "ln", [rng.uniform(-1, 1, (3, 6)), rng.uniform(-1, 1, 6)])


def test_auto_saves_reductions_and_recomputes_point_wise_values() -> None:
    """A point-wise temporary is recomputed from its operands (the backward reads them
    anyway); a maximum is saved where it reduces a plain read, recomputed where it
    reduces a computed value (its ties compare for equality: both sides must round
    alike); a version of a rewritten tensor is saved like a temporary."""
    softmax = (CORPUS / "softmax.tc").read_text()
    assert derive(softmax, "softmax", save="auto").saved == ("maxVal", "expSum")
    computed = """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! 2 * X(n, d)
        Y(n, d) = exp(X(n, d) - mx(n))
    }"""
    derived = derive(computed, "f", save="auto")
    assert derived.saved == () and derived.forward is None
    assert derive(FC_RELU64, "fc_relu", save="auto").saved == ("O_1",)


def test_a_maximum_saved_by_name_of_a_computed_value_is_recomputed_for_its_ties() -> None:
    """Saved by name, a maximum of computed values is still recomputed beside the
    values its ties compare with it (`mx_max`), and the gradients stay right."""
    source = """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d) * X(n, d)
        Y(n, d) = exp(X(n, d) - mx(n))
    }"""
    bw = gradients.backward(source, "f", [np.zeros((1, 1))], save=["mx"])
    assert "mx_max(n) max=!" in bw.text, bw.text
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (3, 5))
    x[1, 2] = -x[1, 4]  # a tie: two elements of equal square
    got, want = (_run(gradients.backward(source, "f", [x], save=save)) for save in (["mx"], None))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


@pytest.mark.parametrize(
    ("save", "message"),
    [(["X"], "save names 'X', not a value"), (["Y"], "save names 'Y', an output"),
     (["nope"], "save names 'nope', not a value"), ("some", 'save is "auto", "all", "none"')],
)  # fmt: skip
def test_save_errors(save: object, message: str) -> None:
    with pytest.raises(tcpy.TCGradientError, match=message) as info:
        tcpy.gradient(LAYERNORM64, "ln", save=save)  # type: ignore[arg-type]
    assert "^" in str(info.value)


def test_save_none_recomputes_as_the_default_does() -> None:
    assert tcpy.gradient(LAYERNORM64, "ln", save="none") == tcpy.gradient(LAYERNORM64, "ln")
    assert forward_saving(LAYERNORM64, "ln", save="none") is None


def test_save_all_recomputes_nothing() -> None:
    """`save="all"`: every value the backward reads comes from the forward, point-wise
    ones too, and the gradients are the recomputing backward's."""
    source = """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d)
        e(n, d) = exp(X(n, d) - mx(n))
        s(n) +=! e(n, d)
        Y(n, d) = e(n, d) / s(n)
    }"""
    # `e` read back from the output, `Y(n, d) * s(n)`: `mx` is not read
    assert derive(source, "f", save="auto").saved == ("s",)
    derived = derive(source, "f", save="all")
    assert derived.saved == ("e", "s")  # `mx` no output depends on: nothing reads it
    body = derived.backward.split("{", 1)[1]
    assert not any(f"\n    {n}(" in body for n in derived.saved), derived.backward
    x = [np.random.default_rng(10).uniform(-1, 1, (3, 5))]
    saving, recomputing = (gradients.backward(source, "f", x, save=s) for s in ("all", None))
    for got, want in zip(_run(saving), _run(recomputing), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_a_recomputed_version_keeps_its_tensors_type() -> None:
    """A temporary accumulated with `+=` (from zeros) and a version first written with
    a float32 literal are recomputed in the tensor's own type: the backward (and the
    saving forward) start them at `float64(0)` and cast the literal, where `T(i) = 0`
    made `T` an int32 tensor and the backward failed to type-check."""
    source = """
    def f(double(N) A) -> (O, Z) {
        T(i) += A(i) * A(i)
        O(i) = T(i) * A(i)
        Z +=! A(i)
        Z = 0.0
    }"""
    rng = np.random.default_rng(11)
    text = gradients.check(source, "f", [rng.uniform(-1, 1, 5)]).text
    assert "T(i) = float64(0)" in text, text
    forward = forward_saving(source, "f", save="all")
    assert forward is not None and "Z = float64(0.0)" in forward, forward
    outputs = check_source(forward)["f_saving"].outputs
    assert [(t.name, t.scalar.value) for t in outputs] == [
        ("O", "float64"),
        ("Z", "float64"),
        ("T", "float64"),
    ]


INVARIANT = {
    "softmax": """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d)
        e(n, d) = exp(X(n, d) - mx(n))
        s(n) +=! e(n, d)
        Y(n, d) = e(n, d) / s(n)
    }""",
    "log-sum-exp": """
    def f(double(N, D) X) -> (L) {
        mx(n) max=! X(n, d)
        s(n) +=! exp(X(n, d) - mx(n))
        L(n) = log(s(n)) + mx(n)
    }""",
    "log-softmax, the maximum read in place": """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d)
        s(n) +=! exp(X(n, d) - mx(n))
        Y(n, d) = X(n, d) - mx(n) - log(s(n))
    }""",
    "cross-entropy": """
    def f(double(B, K) X, int32(B) label) -> (loss) {
        mx(b) max=! X(b, k)
        s(b) +=! exp(X(b, k) - mx(b))
        loss() +=! (log(s(b)) + mx(b) - X(b, label(b))) / B
    }""",
    "a shift that cancels, no exp": """
    def f(double(N, D) X) -> (Y) {
        lo(n) min=! X(n, d)
        Y(n, d) = (X(n, d) - lo(n)) - (X(n, 0) - lo(n))
    }""",
    "a scale that cancels": """
    def f(double(N, D) X) -> (Y) {
        t(n) +=! X(n, d) * X(n, d)
        u(n, d) = X(n, d) * t(n)
        Y(n, d) = u(n, d) / t(n)
    }""",
}

DEPENDENT = {
    "no normalisation": """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d)
        Y(n, d) = exp(X(n, d) - mx(n))
    }""",
    "a sum across the rows": """
    def f(double(N, D) X) -> (S) {
        mx(n) max=! X(n, d)
        e(n, d) = exp(X(n, d) - mx(n))
        t() +=! e(n, d)
        S(n, d) = e(n, d) / t()
    }""",
    "a shift summed": """
    def f(double(N, D) X) -> (S) {
        mx(n) max=! X(n, d)
        S(n) +=! X(n, d) - mx(n)
    }""",
    "a layer norm's mean": """
    def f(double(N, D) X) -> (Y) {
        m(n) +=! X(n, d) / D
        v(n) +=! (X(n, d) - m(n)) * (X(n, d) - m(n)) / D
        Y(n, d) = (X(n, d) - m(n)) / sqrt(v(n) + 1)
    }""",
    "a partial write, whose other rows hold ones": """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d)
        T(n, d) = X(n, d) * 0 + 1 where n in 0:N, d in 0:D
        T(n, d) = exp(X(n, d) - mx(n)) where n in 0:2, d in 0:D
        S(n) +=! exp(X(n, d) - mx(n))
        Y(n, d) = T(n, d) / S(n)
    }""",
    "the maximum's row read at another row": """
    def f(double(N, D) X) -> (Y) {
        mx(n) max=! X(n, d)
        e(n, d) = exp(X(n, d) - mx(n))
        s(n) +=! e(n, d)
        Y(n, d) = e(n, d) / s(N - 1 - n)
    }""",
}


@pytest.mark.parametrize("name", INVARIANT)
def test_a_value_no_output_depends_on_gets_no_adjoint(name: str) -> None:
    """Softmax's row maximum, and the same cancellation in programs that are not a
    softmax (`tcpy.autodiff.invariance`): its adjoint is zero, so the backward has none
    (no ties to count), and the gradients still match finite differences."""
    source = INVARIANT[name]
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (3, 5))
    x[1, 2] = x[1, 4] = x[1].max() + 0.5  # a tie at the maximum of a row
    inputs = [x] if "label" not in source else [x, np.array([0, 4, 2], np.int32)]
    bw = gradients.check(source, "f", inputs, wrt=["X"])
    assert "_ties" not in bw.text and "d_mx(" not in bw.text and "d_lo(" not in bw.text, bw.text
    assert "d_t(" not in bw.text, bw.text


@pytest.mark.parametrize("name", DEPENDENT)
def test_a_value_an_output_depends_on_keeps_its_adjoint(name: str) -> None:
    """Where the output does depend on the value (no division cancels the shift, a
    sum runs across the rows the value was taken along, a row read at another row), its
    adjoint is computed and the gradients match finite differences."""
    source = DEPENDENT[name]
    x = np.random.default_rng(12).uniform(-1, 1, (3, 5))
    bw = gradients.check(source, "f", [x])
    assert "d_mx(" in bw.text or "d_m(" in bw.text, bw.text


def test_additions_to_an_adjoint_fold_into_its_first_write() -> None:
    """A layer norm's `d_X` is written once and added to twice, its `d_mean` summed twice
    over the same rows: each becomes one statement, at the last one's place (one pass
    over `d_X` instead of three). A scatter-add into zeros stays two statements (other
    subscripts), and the gradients match finite differences."""
    rng = np.random.default_rng(13)
    bw = gradients.check(LAYERNORM64, "ln", [rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, 5)])
    lines = bw.text.splitlines()
    assert len([ln for ln in lines if ln.strip().startswith("d_X(")]) == 1, bw.text
    assert len([ln for ln in lines if ln.strip().startswith("d_mean(")]) == 1, bw.text
    embedding = "def f(double(V, D) E, int32(B) idx) -> (O) { O(b, d) = E(idx(b), d) }"
    inputs = [rng.uniform(-1, 1, (6, 3)), np.array([1, 4, 1, 0], np.int32)]
    bw = gradients.check(embedding, "f", inputs, wrt=["E"])
    assert len([ln for ln in bw.text.splitlines() if ln.strip().startswith("d_E(")]) == 2


SOFTMAX64 = """
def f(double(N, D) X) -> (Y) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    Y(n, d) = e(n, d) / {divisor}
}"""

RECOVERED = {  # (divisor, save, whether `e` is read back as `Y(n, d) * divisor`)
    "softmax": ("s(n)", "auto", True),
    "a_divisor_of_saved_values": ("(s(n) + 1)", "auto", True),
    "a_divisor_recomputed_from_e_itself": ("(s(n) + 1)", None, False),
    "a_product": ("s(n)", "auto", False),
}


@pytest.mark.parametrize("name", RECOVERED)
def test_a_value_divided_into_an_output_is_read_back_from_it(name: str) -> None:
    """A softmax's backward reads `e` back as `Y(n, d) * s(n)` rather than recompute
    its `exp`, each read of `e` taking that product in its place (no `e`), where the
    divisor reads only what the backward has at hand (`s` saved; not where `s` would
    be recomputed from `e` itself), and not from a product (`e` would be `Y / s`,
    wrong where `s` is 0); the gradients are the recomputing backward's, which finite
    differences check."""
    divisor, save, back = RECOVERED[name]
    source = SOFTMAX64.replace("{divisor}", divisor)
    if name == "a_product":
        source = source.replace("e(n, d) / s(n)", "e(n, d) * s(n)")
    x = [np.random.default_rng(14).uniform(-2, 2, (3, 5))]
    bw = gradients.backward(source, "f", x, save=save)
    body = bw.text.split("{", 1)[1]
    assert (f"(Y(n, d) * {divisor})" in body) is back, bw.text
    assert ("exp(" in body) is not back and ("\n    e(n, d) = " in body) is not back, bw.text
    recomputing = gradients.check(source, "f", x)
    for got, want in zip(_run(bw), _run(recomputing), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_an_adjoint_read_once_point_wise_is_substituted_where_it_is_read() -> None:
    """A softmax's `d_e(n, d) = d_Y(n, d) / s(n) + d_s(n)`, read only by `d_X(n, d) =
    d_e(n, d) * e(n, d)`, becomes part of `d_X`'s statement (no `d_e`, a pass less);
    an adjoint two statements read (`d_t` of `t = A * B`) stays a tensor; the
    gradients match finite differences."""
    x = [np.random.default_rng(15).uniform(-2, 2, (3, 5))]
    bw = gradients.check(SOFTMAX64.replace("{divisor}", "s(n)"), "f", x)
    assert "d_e(" not in bw.text and "d_X(n, d) = (d_Y(n, d) / s(n) + d_s(n))" in bw.text, bw.text
    two = "def f(double(N) A, double(N) B) -> (O) { t(i) = A(i) * B(i)\n O(i) = sin(t(i)) }"
    rng = np.random.default_rng(16)
    bw = gradients.check(two, "f", [rng.uniform(-1, 1, 4), rng.uniform(-1, 1, 4)])
    assert "d_t(i) = " in bw.text, bw.text


def test_an_addition_past_a_scatter_folds_into_the_first_write() -> None:
    """A cross-entropy's `d_X` is zeros, then its labels' term scattered, then its
    point-wise term added: the point-wise term becomes the first write, under that
    write's index names (one pass over `d_X` instead of two), the scatter after it
    (additions commute); the gradients match finite differences."""
    source = """
    def ce(double(B, K) X, int32(B) label) -> (loss) {
        mx(b) max=! X(b, k)
        s(b) +=! exp(X(b, k) - mx(b))
        loss +=! (log(s(b)) + mx(b) - X(b, label(b))) / B
    }"""
    rng = np.random.default_rng(17)
    x = [rng.uniform(-2, 2, (4, 6)), np.array([5, 0, 5, 2], np.int32)]
    bw = gradients.check(source, "ce", x, wrt=["X"])
    lines = [ln.strip() for ln in bw.text.splitlines() if ln.strip().startswith("d_X(")]
    assert len(lines) == 2 and "exp(" in lines[0] and "label(" in lines[1], bw.text


def test_a_value_computed_twice_is_read_from_where_it_was_stored() -> None:
    """A bias's gradient is the same partial of `Z(n, o) + b(o)` as `Z`'s, summed
    over the rows: it reads `d_Z(n, o)` instead of computing the GELU's derivative
    (an `erf` and an `exp` an element) again; the gradients match finite
    differences."""
    source = """
    def f(double(B, I) X, double(O, I) W, double(O) b) -> (Y) {
        Z(n, o) +=! X(n, i) * W(o, i)
        Y(n, o) = 0.5 * (Z(n, o) + b(o)) * (1 + erf((Z(n, o) + b(o)) * 0.70710678))
    }"""
    rng = np.random.default_rng(18)
    x = [rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, 5)]
    bw = gradients.check(source, "f", x)
    (bias,) = [ln.strip() for ln in bw.text.splitlines() if ln.strip().startswith("d_b(")]
    assert bias.startswith("d_b(o) +=! d_Z(n, o) where"), bw.text
