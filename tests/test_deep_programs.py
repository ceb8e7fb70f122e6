"""Deeply nested and very long programs: accepted where valid, with the same values on both
backends, or refused with exit 1 at a position (never a RecursionError traceback).

The CLI runs every command on a deep stack (timerlc/deepstack.py); the parser refuses an
expression nested deeper than ``frontend.parser.MAX_NESTING`` levels.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_diagnostics import assert_diagnostic, diagnose, invoke


def _run_both(tmp_path, text: str) -> dict:
    path = tmp_path / "p.rtl"
    path.write_text(text)
    got = {}
    for backend in ("reference", "cpu"):
        out = tmp_path / f"{backend}.npz"
        code, _, err = invoke("run", str(path), "--backend", backend, "--outputs", str(out))
        assert code == 0 and "Traceback" not in err, err
        with np.load(out) as z:
            got[backend] = z["r"]
    np.testing.assert_allclose(got["cpu"], got["reference"], rtol=1e-5)
    return got["cpu"]


def test_a_sum_of_600_terms_runs_the_same_on_both_backends(tmp_path):
    terms = " + ".join(f"{k % 7}.5 * f32(t)" for k in range(600))
    r = _run_both(tmp_path, f"dim t < 4\nr[t] = f32(t) + {terms}\nout r\n")
    per_t = 1 + sum(k % 7 + 0.5 for k in range(600))
    np.testing.assert_allclose(r, per_t * np.arange(4), rtol=1e-5)


def test_a_config_of_1000_terms(tmp_path):
    r = _run_both(
        tmp_path, f"config N = {' + '.join(['1'] * 1000)}\ndim t < 3\nr[t] = f32(N + t)\nout r\n"
    )
    np.testing.assert_array_equal(r, [1000, 1001, 1002])


def test_1500_nested_nots(tmp_path):
    r = _run_both(tmp_path, f"dim t < 3\nr[t] = f32({'not ' * 1500}(t == 1))\nout r\n")
    np.testing.assert_array_equal(r, [0, 1, 0])


def test_a_when_chain_of_150_conditions(tmp_path):
    conds = " or ".join(f"t == {k}" for k in range(0, 300, 2))
    r = _run_both(tmp_path, f"dim t < 300\nr[t] = 1.0 when {conds}\nr[t] = 2.0\nout r\n")
    np.testing.assert_array_equal(r, np.where(np.arange(300) % 2 == 0, 1.0, 2.0))


def test_a_when_chain_past_the_comparison_limit_is_refused_at_once(tmp_path):
    """A ``when`` of 1,500 ``or``s (fuzz.py) took minutes to check: the points of each
    equation exclude every earlier one's, worked out in time that grows as the square of
    the comparisons. A tensor's conditions hold at most ``MAX_COMPARISONS`` (256)."""
    conds = " or ".join(f"t == {k}" for k in range(0, 3000, 2))
    text = f"dim t < 3000\nr[t] = 1.0 when {conds}\nr[t] = 2.0\nout r\n"
    out = diagnose(tmp_path, text, raw=True)
    assert_diagnostic(out, 2, 17, "1500 comparisons", "at most 256", "t % 3 == 0")


def test_a_tensor_of_more_than_64_equations_is_refused_at_the_65th(tmp_path):
    eqs = "".join(f"r[t] = {k}.0 when t == {k}\n" for k in range(64))
    out = diagnose(tmp_path, f"dim t < 100\n{eqs}r[t] = -1.0\nout r\n", raw=True)
    assert_diagnostic(out, 66, 1, "'r' has 65 equations", "at most 64", "where(")
    # 64 of them are taken (r is defined at t < 64)
    r = _run_both(tmp_path, f"dim t < 100\n{eqs}out r\n")
    np.testing.assert_array_equal(r, np.arange(64.0))


def test_a_line_of_100000_characters(tmp_path):
    terms = " + 0.25" * 1500
    text = f"dim t < 3\nr[t] = f32(t){terms}  # {'x' * 100_000}\nout r\n"
    r = _run_both(tmp_path, text)
    np.testing.assert_allclose(r, np.arange(3) + 375.0)


@pytest.mark.parametrize(
    "rhs, col",
    [
        ("-" * 2500 + "f32(t)", 508),  # the 2000th level from the inside
        ("(" * 3000 + "not " * 2500 + "true" + ")" * 3000, None),
        ("f32(t)" + " + 0.0" * 20000, None),
        ("exp(" * 2100 + "f32(t)" + ")" * 2100, None),
    ],
    ids=["neg", "parens-not", "sum", "calls"],
)
def test_an_expression_nested_too_deeply_is_an_error_at_a_position(tmp_path, rhs, col):
    out = diagnose(tmp_path, f"dim t < 3\nr[t] = {rhs}\nout r\n", raw=True)
    if col is None:  # somewhere on the line, where the limit is crossed
        col = int(out.stderr.split(":")[2]) if out.stderr.count(":") > 2 else -1
    assert_diagnostic(out, 2, col, "too deeply nested")


def test_a_program_past_the_token_limit_is_refused_at_once(tmp_path):
    """A program of millions of tokens (fuzz.py: a sum of 2.5 million terms, 10 MB on one
    line) took minutes to parse before the nesting limit refused it; the postlexer stops at
    ``MAX_TOKENS``, where the token is, and the diagnostic shows the long line only around
    the caret (``diagnostics.SHOWN`` characters, cut with ...)."""
    from timerlc.diagnostics import SHOWN
    from timerlc.frontend.parser import MAX_TOKENS

    terms = " + 0" * 1_000_000
    out = diagnose(tmp_path, f"dim t < 3\nr[t] = f32(t){terms}\nout r\n", raw=True)
    col = 15 + 4 * ((MAX_TOKENS - 13) // 2)  # (the 200,001st token: a + or a 0 of the sum)
    assert abs(int(out.stderr.split(":")[2]) - col) <= 4, out.stderr[:300]
    assert out.status == 1 and out.lines[0].endswith(
        "error: the program has more than 200,000 tokens, timerlc's limit"
    ), out.stderr[:300]
    shown, caret = out.stderr.splitlines()[1:3]
    assert shown.startswith("...") and shown.endswith("...") and len(shown) == SHOWN + 6
    assert caret.index("^") < len(shown) and shown[caret.index("^")] in "+0"


def test_a_long_lines_diagnostic_shows_the_part_around_the_caret(tmp_path):
    """An error at column 50,000 of a line of 100,000 characters: the line is shown from a
    third of ``SHOWN`` before the caret, the caret under the offending name."""
    from timerlc.diagnostics import SHOWN

    text = f"dim t < 3\nr[t] = {' ' * 50_000}f32(t) + nope  # {'x' * 50_000}\nout r\n"
    out = diagnose(tmp_path, text, raw=True)
    col = text.splitlines()[1].index("nope") + 1
    assert out.status == 1 and out.lines[0].startswith(f"{out.file}:2:{col}: error: "), out.lines
    assert "nope" in out.lines[0]
    shown, caret = out.stderr.splitlines()[1:3]
    assert len(shown) == SHOWN + 6 and shown.startswith("...") and shown.endswith("...")
    at = caret.index("^")
    assert shown[at : at + 4] == "nope" and caret[at:] == "^~~~"
