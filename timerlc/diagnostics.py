"""Diagnostics: source spans and the errors timerlc reports about user programs.

Every error in a user program is a ``ProgramError`` value carrying a ``Span``; the CLI
renders it once, as ``FILE:LINE:COL: error: MESSAGE`` followed by the source line and a
caret under the offending token (LANGUAGE.md section 11). Errors met while running a
program are ``RunError``s. Anything else is an internal bug and may show a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Span:
    """A region of the source, 1-based lines and columns, end exclusive; ``source``: the
    ``Source`` it lies in when that is not the program's own (an environment written in
    RTL, docs/envs.md), else None."""

    line: int
    col: int
    end_line: int
    end_col: int
    source: Source | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"

    @staticmethod
    def join(a: Span | None, b: Span | None) -> Span | None:
        if a is None or b is None:
            return a or b
        if a.source is not b.source:
            return a
        return Span(a.line, a.col, b.end_line, b.end_col, a.source)


@dataclass(frozen=True, slots=True)
class Source:
    """A program text and the name it is reported under."""

    name: str
    text: str

    def line(self, n: int) -> str:
        lines = self.text.splitlines()
        return lines[n - 1] if 0 < n <= len(lines) else ""


class TimerlcError(Exception):
    """Base of the errors timerlc reports to users (never a bug)."""


SHOWN = 200  # characters of a source line a diagnostic shows (a longer one: around the caret)


class ProgramError(TimerlcError):
    """An error in a user program, pointing at the source."""

    def __init__(self, message: str, span: Span | None, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = tuple(notes)

    def render(self, source: Source) -> str:
        span = self.span or Span(1, 1, 1, 2)
        if span.source is not None:  # in another file than the program's (an RTL environment)
            source = span.source
        out = [f"{source.name}:{span.line}:{span.col}: error: {self.message}"]
        text = source.line(span.line)
        if text:
            width = span.end_col - span.col if span.end_line == span.line else 1
            width = max(1, min(width, len(text) - span.col + 1))
            col = span.col
            if len(text) > SHOWN:  # (a long line: the part around the caret, cut with ...)
                start = max(0, min(col - 1 - SHOWN // 3, len(text) - SHOWN))
                end = start + SHOWN
                text = (
                    ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")
                )
                col += (3 if start else 0) - start
                width = max(1, min(width, end - span.col + 1))
            out.append(text)
            prefix = "".join(c if c == "\t" else " " for c in text[: col - 1])
            out.append(prefix + "^" + "~" * (width - 1))
        out.extend(f"note: {n}" for n in self.notes)
        return "\n".join(out)


class UsageError(TimerlcError):
    """A bad command line that is not about the program text (exit status 2)."""


class RunError(TimerlcError):
    """A failure while running a compiled or interpreted program (exit status 3)."""


class UnsupportedError(ProgramError):
    """A construct the language has but this version of timerlc does not run yet."""


def did_you_mean(name: str, candidates) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""
