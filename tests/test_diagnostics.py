"""Diagnostics of bad programs (LANGUAGE.md sections 11 and 12): syntax errors.

Every error in a program must be reported on stderr as

    FILE:LINE:COL: error: MESSAGE
    <the source line>
    <spaces>^~~~            (a caret under the offending token)

with exit status 1 and no traceback. The helpers here (``expect_error`` and friends) are
shared by the other ``test_diagnostics_*.py`` files, which cover the other error classes.

Tests of behaviour the implementation gets wrong today are marked
``xfail(strict=True, reason="BUG: ...")``: the assertion states what a user should see.
"""

from __future__ import annotations

import re
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from timerlc.cli import cli
from timerlc.diagnostics import SHOWN


# ----------------------------------------------------------------------------- helpers
def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:  # click >= 8.2 always keeps stderr apart
        return CliRunner()


@dataclass
class Outcome:
    status: int
    stdout: str
    stderr: str  # with the formatted traceback of an uncaught exception appended
    text: str  # the program text
    file: str  # the FILE the program was passed as

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def src(program: str) -> str:
    return textwrap.dedent(program).lstrip("\n")


def invoke(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; an uncaught exception shows up as a traceback on stderr."""
    result = _runner().invoke(cli, [str(a) for a in args])
    stderr = result.stderr
    if result.exc_info is not None and not isinstance(result.exc_info[1], SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return result.exit_code, result.stdout, stderr


def diagnose(
    tmp_path: Path, program: str, *args: str, cmd: str = "check", raw: bool = False
) -> Outcome:
    """Write ``program`` (dedented unless ``raw``) to bad.rtl and run ``timerlc CMD bad.rtl "
    "ARGS``."""
    text = program if raw else src(program)
    path = tmp_path / "bad.rtl"
    path.write_bytes(text.encode())
    status, out, err = invoke(cmd, str(path), *args)
    return Outcome(status, out, err, text, str(path))


def assert_no_traceback(out: Outcome):
    assert "Traceback" not in out.stderr, out.stderr
    assert "Traceback" not in out.stdout, out.stdout


def _has(message: str, word) -> bool:
    if isinstance(word, tuple):  # any of these
        return any(_has(message, w) for w in word)
    return word.lower() in message.lower()


def assert_diagnostic(out: Outcome, line: int, col: int, *words) -> str:
    """``out`` is one error at LINE:COL (1-based) whose message holds every word (a tuple: any
    of its words), shown as FILE:LINE:COL: error: MESSAGE, the source line, and a caret."""
    assert_no_traceback(out)
    assert out.status == 1, f"exit status {out.status}, expected 1; stderr:\n{out.stderr}"
    lines = out.lines
    assert lines, "nothing on stderr"
    head = re.match(re.escape(out.file) + r":(\d+):(\d+): error: (\S.*)$", lines[0])
    assert head, f"the first line is not 'FILE:LINE:COL: error: MESSAGE':\n{out.stderr}"
    where = (int(head[1]), int(head[2]))
    assert where == (line, col), (
        f"reported at {where[0]}:{where[1]}, expected {line}:{col}:\n{out.stderr}"
    )
    message = head[3]
    for w in words:
        assert _has(message, w), f"{w!r} not in the message:\n{out.stderr}"
    assert len(lines) >= 3, f"no source line and caret:\n{out.stderr}"
    source, shown, caret = out.text.splitlines()[line - 1], lines[1], lines[2]
    if len(source) > SHOWN:  # (a long line: the part around the caret, cut with ...)
        at = caret.index("^") if "^" in caret else -1
        start = col - 1 - at + (3 if shown.startswith("...") else 0)
        part = shown.removeprefix("...").removesuffix("...")
        assert len(part) <= SHOWN and source[start : start + len(part)] == part, (
            f"the second line is not a part of source line {line}:\n{out.stderr[:1000]}"
        )
        assert at >= 0 and caret[:at].strip() == "", f"no caret:\n{out.stderr[:1000]}"
        return message
    assert shown == source, f"the second line is not source line {line}:\n{out.stderr}"
    assert caret[col - 1 : col] == "^" and caret[: col - 1].strip() == "", (
        f"the third line has no caret under column {col}:\n{out.stderr}"
    )
    return message


def expect_error(
    tmp_path: Path, program: str, line: int, col: int, *words, args=(), cmd="check"
) -> str:
    """Check ``program``: it must fail with one diagnostic at LINE:COL holding ``words``."""
    return assert_diagnostic(diagnose(tmp_path, program, *args, cmd=cmd), line, col, *words)


def expect_format(out: Outcome, *words) -> tuple[int, int, str]:
    """An error in the section 11 format at a position this test does not pin down."""
    assert_no_traceback(out)
    assert out.status == 1, f"exit status {out.status}, expected 1; stderr:\n{out.stderr}"
    head = re.match(re.escape(out.file) + r":(\d+):(\d+): error: (\S.*)$", out.lines[0])
    assert head, f"the first line is not 'FILE:LINE:COL: error: MESSAGE':\n{out.stderr}"
    line, col = int(head[1]), int(head[2])
    assert_diagnostic(out, line, col, *words)
    return line, col, head[3]


def xfail_bug(reason: str):
    return pytest.mark.xfail(reason=f"BUG: {reason}", strict=True)


# ----------------------------------------------------------------------------- the format itself
def test_valid_program_checks_silently(tmp_path):
    out = diagnose(
        tmp_path,
        """
        config T = 4, gamma = 0.9
        dim t < T
        r[t] = f32(t)
        g[T-1] = r[T-1]
        g[t] = r + gamma * g[t+1]
        out g
    """,
    )
    assert (out.status, out.stdout, out.stderr) == (0, "", "")


def test_caret_spans_the_token_and_nothing_goes_to_stdout(tmp_path):
    out = diagnose(
        tmp_path,
        """
        config T = 4
        dim t < T
        reward[t] = f32(t)
        x[t] = rewrd[t] * 2.0
    """,
    )
    assert_diagnostic(out, 4, 8, "unknown", "'rewrd'")
    assert out.lines[2] == "       ^~~~~", out.stderr  # under the whole name, not further
    assert out.stdout == ""


def test_tab_before_the_error_is_kept_in_the_caret_line(tmp_path):
    out = diagnose(tmp_path, "config T = 4\ndim t < T\n\tx[t] = f32(t) + rwd\n", raw=True)
    assert_diagnostic(out, 3, 18, "unknown", "'rwd'")
    assert out.lines[2].startswith("\t") and out.lines[2].index("^") == 17


def test_crlf_line_endings(tmp_path):
    out = diagnose(tmp_path, "config T = 4\r\ndim t < T\r\nx[t] = f32(t) + rwd\r\n", raw=True)
    assert_diagnostic(out, 3, 17, "unknown", "'rwd'")


def test_error_on_a_last_line_without_newline(tmp_path):
    out = diagnose(tmp_path, "config T = 4\ndim t < T\nx[t] = f32(t) + rwd", raw=True)
    assert_diagnostic(out, 3, 17, "unknown", "'rwd'")


# ----------------------------------------------------------------------------- syntax errors
def test_unmatched_close_paren(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = f32(t) + 1)
        out x
    """,
        3,
        18,
        "')'",
    )


def test_unmatched_close_bracket(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t]] = f32(t)
    """,
        3,
        5,
        "']'",
    )


def test_mismatched_close_bracket_names_the_open_one(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(zeros([3)])
    """,
        3,
        20,
        "')'",
        "'['",
    )
    assert "3:18" in msg


def test_unclosed_paren_before_the_next_statement(tmp_path):
    # Detected at the next statement (as gcc does); a note must point back at the '('.
    out = diagnose(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = (1.0 + f32(t)
        y[t] = 2.0
    """,
    )
    assert_diagnostic(out, 4, 1, "unexpected")
    assert any("'('" in l and "3:8" in l for l in out.lines[3:]), out.stderr


def test_unclosed_paren_at_end_of_input(tmp_path):
    out = diagnose(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(f32(t)
    """,
    )
    assert_diagnostic(out, 3, 18, "end of input")
    assert any("'('" in l and "3:11" in l for l in out.lines[3:]), out.stderr


def test_unclosed_bracket_inside_an_index(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t = f32(t)
    """,
        3,
        5,
        "'='",
        "']'",
    )


def test_unclosed_brace_of_a_def(tmp_path):
    out = diagnose(
        tmp_path,
        """
        config T = 4
        dim t < T
        def f(v) { v + 1.0
        x[t] = f(1.0)
    """,
    )
    line, col, msg = expect_format(out)
    assert any("'{'" in l and "3:10" in l for l in [msg] + out.lines[3:]), out.stderr


def test_missing_operand_at_end_of_line(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = f32(t) +
        out x
    """,
        3,
        16,
        "end of line",
    )


def test_missing_right_side(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] =
    """,
        3,
        7,
        "end of line",
    )


def test_missing_operand_between_operators(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = f32(t) * * 2.0
    """,
        3,
        17,
        "unexpected '*'",
    )


def test_missing_left_operand(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = * 2.0
    """,
        3,
        8,
        "unexpected '*'",
    )


def test_unexpected_plus_names_the_token(tmp_path):
    msg = expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = f32(t)
        out x + y
    """,
        4,
        7,
        "unexpected '+'",
    )
    assert "'-'" not in msg


def test_unclosed_brace_of_params_at_end_of_input(tmp_path):
    out = diagnose(
        tmp_path, "config I = 3\ndim i < I\nparams net[i] { w : f32[3] = zeros", raw=True
    )
    expect_format(out, "end of input")


def test_two_expressions_side_by_side(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = 1.0 2.0
    """,
        3,
        12,
        "unexpected",
        "2.0",
    )


@pytest.mark.parametrize("ch", ["$", "?", "×", "`"])
def test_bad_character(tmp_path, ch):
    expect_error(
        tmp_path,
        f"""
        config T = 4
        dim t < T
        x[t] = f32(t) {ch} 2.0
    """,
        3,
        15,
        "unexpected character",
        ch,
    )


def test_unterminated_string(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = "abc
    """,
        3,
        8,
        "unterminated string",
    )


def test_unterminated_string_in_an_env_declaration(tmp_path):
    expect_error(
        tmp_path,
        """
        config B = 2
        dim b < B
        env E = "cartpole batch b
    """,
        3,
        9,
        "unterminated string",
    )


@pytest.mark.parametrize(
    "program, line, col, word",
    [
        ("config T = 4\ndim t < T\nwhen[t] = f32(t)\n", 3, 1, "when"),
        ("config T = 4, out = 3\n", 1, 15, "out"),
        ("config T = 4\ndim batch < T\n", 2, 5, "batch"),
        ("config T = 4\ndim t < T\nx[t] = f32(t) + metric\n", 3, 17, "metric"),
        pytest.param(
            "config T = 4\ndim t < T\ndef f(dim) { dim }\nx[t] = f(1.0)\n",
            3,
            7,
            "dim",
        ),
        ("config T = 4\ndim t < T\nparams p { config : f32[] = zeros }\n", 3, 12, "config"),
    ],
    ids=["lhs", "config", "dim", "rhs", "def-param", "params-field"],
)
def test_keyword_as_a_name(tmp_path, program, line, col, word):
    expect_error(tmp_path, program, line, col, f"'{word}'", "keyword")


def test_newline_inside_an_expression_outside_brackets(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = f32(t) +
          1.0
        out x
    """,
        3,
        16,
        "end of line",
    )


def test_newline_inside_brackets_is_fine_but_the_error_after_it_is_located(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = (f32(t) +
                rwd)
    """,
        4,
        9,
        "unknown",
        "'rwd'",
    )


def test_comment_after_a_dangling_operator(tmp_path):
    expect_error(
        tmp_path,
        """
        # a comment line
        config T = 4   # sizes
        dim t < T
        x[t] = f32(t) +   # trailing
    """,
        4,
        19,
        "end of line",
    )


def test_double_equals_instead_of_equals(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] == 1.0
    """,
        3,
        6,
        "'='",
    )


def test_positional_argument_after_keyword(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(zeros([3, 2]), axis=0, 1)
    """,
        3,
        35,
        "positional",
        "keyword",
    )


def test_repeated_keyword_argument(tmp_path):
    expect_error(
        tmp_path,
        """
        config T = 4
        dim t < T
        x[t] = sum(zeros([3, 2]), axis=0, axis=1)
    """,
        3,
        35,
        "'axis'",
        "repeated",
    )
