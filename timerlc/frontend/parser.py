"""Parsing: RTL source text -> ``ast.Program`` (grammar in ``grammar/rtl.lark``).

Syntax errors become ``ProgramError``s pointing at the offending token. So does an
expression nested deeper than ``MAX_NESTING`` levels (``check_nesting``): the walks after
the parser recurse once per level, and this bound keeps them within the deep stack the
CLI gives them (``timerlc.deepstack``).
"""

from __future__ import annotations

import functools
import hashlib
import math
from importlib import resources
from pathlib import Path

import lark
from lark import Lark, Token, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from timerlc.diagnostics import ProgramError, Span
from timerlc.frontend import ast

KEYWORDS = frozenset(
    "config dim env batch params def when and or not out metric true false".split()
)

# The deepest expression accepted, in levels of its syntax tree: each operator, call,
# subscript, slice, field access and tuple or list literal is a level, and a chain
# ``a + b + c`` of n operands is n - 1 levels (it is ((a + b) + c)). Parentheses are free.
# docs/language.md documents it.
MAX_NESTING = 2000

_OPEN = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
_CLOSE = {"RPAR", "RSQB", "RBRACE"}


MAX_NAME = 100  # characters of a name (docs/language.md); a record field is NAME.FIELD
# tokens of a program (docs/language.md): the parser takes some 30 us a token, so that a
# program of millions (a generated sum of 2.5 million terms: fuzz.py) took minutes to reach
# its first error; PPO has some 1,700
MAX_TOKENS = 200_000


class BracketNewlines:
    """Post-lexer: drops the newlines that do not end a statement (inside () and [], but
    not inside the { } of params and def), pairs the brackets, and refuses keywords used
    as names (the contextual lexer gives a keyword in a name position as a NAME)."""

    always_accept = ("_NL",)

    def __init__(self):
        self.open: list[Token] = []  # brackets not closed yet, for error messages

    def process(self, stream):
        self.open = []
        for count, tok in enumerate(stream):
            if count == MAX_TOKENS:
                raise ProgramError(
                    f"the program has more than {MAX_TOKENS:,} tokens, timerlc's limit",
                    _token_span(tok),
                )
            if tok.type == "_NL":
                if not self.open or self.open[-1].type == "LBRACE":
                    yield tok
                continue
            if tok.type == "NAME" and str(tok) in KEYWORDS:
                raise ProgramError(
                    f"'{tok}' is a keyword and cannot be used as a name", _token_span(tok)
                )
            if tok.type == "NAME" and len(tok) > MAX_NAME:
                raise ProgramError(
                    f"a name of {len(tok)} characters; names have at most {MAX_NAME}",
                    _token_span(tok),
                )
            if tok.type in _OPEN:
                self.open.append(tok)
            elif tok.type in _CLOSE:
                if not self.open:
                    raise ProgramError(f"unmatched '{tok}'", _token_span(tok))
                opened = self.open.pop()
                if _OPEN[opened.type] != tok.type:
                    raise ProgramError(
                        f"'{tok}' does not match the '{opened}' at {opened.line}:{opened.column}",
                        _token_span(tok),
                    )
            yield tok


def grammar_text() -> str:
    """The grammar: ``grammar/rtl.lark`` of a source checkout, or the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "grammar" / "rtl.lark"
    if checkout.is_file():
        return checkout.read_text()
    return resources.files("timerlc.grammar").joinpath("rtl.lark").read_text()


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    """The LALR parser, its tables kept in the user's cache folder (lark's ``cache``: some
    0.3 s a start saved). Lark's own ``cache=True`` keeps them in the shared temporary
    folder under a name anyone can work out, and loads them with pickle: a file another
    user put there first would run as code in ours. Where the user's folder cannot be
    used, no cache."""
    from timerlc.files import user_cache

    text = grammar_text()
    folder = user_cache("lark")
    cache: str | bool = False
    if folder is not None:
        key = hashlib.sha256(f"{text}\0{lark.__version__}".encode()).hexdigest()[:24]
        cache = str(folder / f"rtl-{key}.lark")
    return Lark(
        text,
        parser="lalr",
        lexer="contextual",
        postlex=BracketNewlines(),
        propagate_positions=True,
        maybe_placeholders=True,
        cache=cache,
    )


def parse(text: str) -> ast.Program:
    """Parse a whole program. Raises ``ProgramError`` on a syntax error."""
    parser = _parser()
    try:
        tree = parser.parse(text + "\n")
    except UnexpectedInput as e:
        err = _syntax_error(e, text)
        unclosed = parser.options.postlex.open
        if unclosed and not isinstance(e, UnexpectedCharacters):
            tok = unclosed[-1]
            err = ProgramError(
                err.message, err.span, (f"the '{tok}' at {tok.line}:{tok.column} is not closed",)
            )
        raise err from None
    check_nesting(tree)
    try:
        return _ToAst().transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, ProgramError):
            raise e.orig_exc from None
        raise


def parse_expression(text: str) -> ast.Expr:
    """Parse a single expression (used for ``--set`` values and IR index expressions)."""
    program = parse(f"__x = {text}")
    (stmt,) = program.statements
    assert isinstance(stmt, ast.Equation) and len(stmt.rhs) == 1
    return stmt.rhs[0]


# ----------------------------------------------------------------------------- nesting
# parse-tree rules folded to the left into a chain of binary nodes (``_fold_left``; a
# comparison chain becomes ``and``s of its comparisons)
_CHAINS = frozenset({"or_expr", "and_expr", "comparison", "arith", "term"})
# the other rules that are a level of an expression; the rest (statements, argument and
# subscript lists, keywords) add none
_LEVELS = frozenset(
    {"not_op", "unary_op", "power", "subscript", "call", "attribute", "slice"}
    | {"tuple_lit", "list_lit"}
)


def check_nesting(tree: Tree) -> None:
    """Raise a ``ProgramError`` when an expression of ``tree`` nests deeper than
    ``MAX_NESTING`` levels, at the operator (or first token) of the smallest sub-expression
    that does. Iterative: the tree may be as deep as the source is long."""
    height: dict[int, int] = {}  # id(node) -> levels of the expression it is
    todo: list[tuple[Tree, bool]] = [(tree, False)]
    while todo:
        node, children_done = todo.pop()
        if not children_done:
            todo.append((node, True))
            todo.extend((c, False) for c in reversed(node.children) if isinstance(c, Tree))
            continue
        heights = [height.pop(id(c), 0) if isinstance(c, Tree) else 0 for c in node.children]
        if node.data in _CHAINS:
            level = heights[0]
            for k in range(1, len(node.children), 2):
                level = 1 + max(level, heights[k + 1])
                if level > MAX_NESTING:
                    _too_deep(_token_span(node.children[k]))
        else:
            level = max(heights, default=0) + (node.data in _LEVELS)
            if level > MAX_NESTING:
                _too_deep(_operator_span(node))
        height[id(node)] = level


def _operator_span(node: Tree) -> Span | None:
    """Where to point for a too-deep ``node``: its operator, else its first token."""
    if node.data in ("not_op", "unary_op"):
        return _token_span(node.children[0])
    if node.data == "power":
        return _token_span(node.children[1])
    if node.data == "slice":
        return _token_span(node.children[1])
    first = node
    while isinstance(first, Tree):
        first = next((c for c in first.children if c is not None), None)
    return _token_span(first) if isinstance(first, Token) else _meta_span(node.meta)


def _too_deep(span: Span | None):
    raise ProgramError(
        f"expression too deeply nested (more than {MAX_NESTING} levels); split it into "
        "several equations or def bindings",
        span,
    )


# ----------------------------------------------------------------------------- errors
_TOKEN_WORDS = {
    "_NL": "end of line",
    "$END": "end of input",
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "COMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "an operator",
    "NEG_OP": "'-'",
    "POW_OP": "'**'",
}


def _describe(tok_type: str, value: str | None = None) -> str:
    if tok_type in ("_NL", "$END"):
        return _TOKEN_WORDS[tok_type]
    if value is not None and value.strip():
        return f"'{value}'"
    return _TOKEN_WORDS.get(tok_type, tok_type.lower())


def _expected(names) -> str:
    words = []
    for n in sorted(names):
        if n in ("$END",):
            continue
        term = _parser().get_terminal(n) if n in _terminal_names() else None
        pattern = getattr(term, "pattern", None)
        if n in _TOKEN_WORDS:
            words.append(_TOKEN_WORDS[n])
        elif pattern is not None and pattern.type == "str":
            words.append(f"'{pattern.value}'")
    words = sorted(set(words))
    if not words:
        return ""
    if len(words) > 6:
        return ""
    return "; expected " + ", ".join(words[:-1]) + (" or " if len(words) > 1 else "") + words[-1]


@functools.lru_cache(maxsize=1)
def _terminal_names():
    return frozenset(t.name for t in _parser().terminals)


def _syntax_error(e: UnexpectedInput, text: str) -> ProgramError:
    if isinstance(e, ProgramError):
        return e
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else "end of input"
        span = Span(e.line, e.column, e.line, e.column + 1)
        if ch == '"':
            return ProgramError("unterminated string", span)
        return ProgramError(f"unexpected character '{ch}'", span)
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END" or tok.line is None:
            return ProgramError("unexpected end of input", _end_span(text))
        what = _describe(tok.type, str(tok))
        if tok.type == "_NL":
            line, col = tok.line, tok.column
            if "EQUAL" in e.expected:
                source_line = text.splitlines()[line - 1] if line <= len(text.splitlines()) else ""
                at = source_line.find("==")
                if at >= 0:
                    return ProgramError(
                        "an equation defines a tensor with '=', not '=='",
                        Span(line, at + 1, line, at + 3),
                    )
            return ProgramError(
                f"unexpected end of line{_expected(e.expected)}", Span(line, col, line, col + 1)
            )
        return ProgramError(f"unexpected {what}{_expected(e.expected)}", _token_span(tok))
    if isinstance(e, UnexpectedEOF):
        return ProgramError("unexpected end of input", _end_span(text))
    return ProgramError(str(e), None)


def _end_span(text: str) -> Span:
    """Just after the last character that is not blank or part of a comment."""
    lines = text.splitlines()
    while lines and not lines[-1].split("#", 1)[0].strip():
        lines.pop()
    if not lines:
        return Span(1, 1, 1, 2)
    last = lines[-1].split("#", 1)[0].rstrip()
    return Span(len(lines), len(last) + 1, len(lines), len(last) + 2)


# ----------------------------------------------------------------------------- tree -> ast
def _token_span(tok: Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + 1)


def _meta_span(meta) -> Span | None:
    if getattr(meta, "empty", True):
        return None
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _ident(tok: Token) -> ast.Ident:
    return ast.Ident(str(tok), _token_span(tok))


def _fold_left(items, make):
    """Items alternate operand, operator token, operand, ... ; fold to the left."""
    result = items[0]
    for i in range(1, len(items), 2):
        result = make(str(items[i]), result, items[i + 1], _token_span(items[i]))
    return result


def _binary(op, left, right, op_span):
    return ast.Binary(op, left, right, Span.join(left.span, right.span), op_span)


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    # -- statements
    def start(self, meta, children):
        return ast.Program(tuple(c for c in children if c is not None))

    def config_decl(self, meta, items):
        return ast.ConfigDecl(tuple(items), _meta_span(meta))

    def config_item(self, meta, children):
        name, value = children
        return (_ident(name), value)

    def dim_decl(self, meta, children):
        name, bound = children
        return ast.DimDecl(_ident(name), bound, _meta_span(meta))

    def env_decl(self, meta, children):
        name, plugin, batch = children
        return ast.EnvDecl(_ident(name), str(plugin)[1:-1], _ident(batch), _meta_span(meta))

    def env_state_decl(self, meta, children):
        name, *fields = children
        return ast.EnvStateDecl(
            _ident(name), tuple(f for f in fields if f is not None), _meta_span(meta)
        )

    def state_field(self, meta, children):
        name, type_ = children
        return ast.StateField(_ident(name), type_, _meta_span(meta))

    def env_attr_decl(self, meta, children):
        name, value = children
        return ast.EnvAttrDecl(_ident(name), value, _meta_span(meta))

    def out_decl(self, meta, names):
        return ast.OutDecl(tuple(_ident(n) for n in names), _meta_span(meta))

    def metric_decl(self, meta, names):
        return ast.MetricDecl(tuple(_ident(n) for n in names), _meta_span(meta))

    def params_decl(self, meta, children):
        name, dims, *fields = children
        return ast.ParamsDecl(_ident(name), dims or (), tuple(fields), _meta_span(meta))

    def param_dims(self, meta, names):
        return tuple(_ident(n) for n in names if n is not None)

    def param_field(self, meta, children):
        name, type_, init = children
        return ast.ParamField(_ident(name), type_, init, _meta_span(meta))

    def type(self, meta, children):
        dtype, *shape = children
        return ast.TypeExpr(
            _ident(dtype), tuple(s for s in shape if s is not None), _meta_span(meta)
        )

    def def_decl(self, meta, children):
        name = children[0]
        params, body = [], []
        for c in children[1:]:
            if isinstance(c, ast.DefItem):
                body.append(c)
            elif c is not None:
                params.append(_ident(c))
        return ast.DefDecl(_ident(name), tuple(params), tuple(body), _meta_span(meta))

    def def_item(self, meta, children):
        first, second = children
        if second is None:
            return ast.DefItem(None, first, _meta_span(meta))
        return ast.DefItem(first, second, _meta_span(meta))

    def equation(self, meta, children):
        lhs, rhs, when = children
        return ast.Equation(lhs, rhs, when, _meta_span(meta))

    def tuple_expr(self, meta, items):
        return tuple(items)

    # -- operators
    def or_expr(self, meta, items):
        return _fold_left(items, _binary)

    and_expr = or_expr
    arith = or_expr
    term = or_expr

    def power(self, meta, children):
        base, op, exponent = children
        return _binary("**", base, exponent, _token_span(op))

    def not_op(self, meta, children):
        op, operand = children
        return ast.Unary("not", operand, _meta_span(meta), _token_span(op))

    def unary_op(self, meta, children):
        op, operand = children
        return ast.Unary(str(op), operand, _meta_span(meta), _token_span(op))

    def comparison(self, meta, items):
        operands = tuple(items[0::2])
        ops = tuple(str(t) for t in items[1::2])
        spans = tuple(_token_span(t) for t in items[1::2])
        return ast.Compare(ops, operands, _meta_span(meta), spans)

    # -- postfix
    def subscript(self, meta, children):
        value, items = children
        return ast.Subscript(value, items, _meta_span(meta))

    def subscripts(self, meta, items):
        return tuple(i for i in items if i is not None)

    def slice(self, meta, children):
        lo, colon, hi = children
        span = _meta_span(meta) or _token_span(colon)
        return ast.Slice(lo, hi, span)

    def call(self, meta, children):
        func, args = children
        pos, kws = [], []
        for a in args or ():
            if isinstance(a, ast.Keyword):
                kws.append(a)
            elif kws:
                raise ProgramError("positional argument after a keyword argument", a.span)
            else:
                pos.append(a)
        seen = set()
        for k in kws:
            if k.name in seen:
                raise ProgramError(f"keyword argument '{k.name}' repeated", k.span)
            seen.add(k.name)
        return ast.Call(func, tuple(pos), tuple(kws), _meta_span(meta))

    def args(self, meta, items):
        return tuple(i for i in items if i is not None)

    def keyword(self, meta, children):
        name, value = children
        ident = _ident(name)
        return ast.Keyword(ident.name, value, Span.join(ident.span, value.span))

    def attribute(self, meta, children):
        value, name = children
        return ast.Attribute(value, str(name), _meta_span(meta), _token_span(name))

    # -- atoms
    def name(self, meta, children):
        (tok,) = children
        ident = _ident(tok)
        return ast.Name(ident.name, ident.span)

    def int_lit(self, meta, children):
        (tok,) = children
        return ast.Int(int(tok), _token_span(tok))

    def float_lit(self, meta, children):
        (tok,) = children
        value = float(tok)
        if not math.isfinite(value):  # 1e99999 overflows to inf
            raise ProgramError(
                f"'{_clip_literal(str(tok))}' is not a finite number (the largest f64 is about "
                "1.8e308)",
                _token_span(tok),
            )
        return ast.Float(value, _token_span(tok))

    def string_lit(self, meta, children):
        (tok,) = children
        return ast.Str(str(tok)[1:-1], _token_span(tok))

    def true_lit(self, meta, children):
        return ast.Bool(True, _token_span(children[0]))

    def false_lit(self, meta, children):
        return ast.Bool(False, _token_span(children[0]))

    def tuple_lit(self, meta, items):
        return ast.TupleLit(tuple(i for i in items if i is not None), _meta_span(meta))

    def list_lit(self, meta, items):
        return ast.ListLit(tuple(i for i in items if i is not None), _meta_span(meta))


def _clip_literal(text: str) -> str:
    """A literal for a message: at most 40 characters."""
    return text if len(text) <= 40 else text[:37] + "..."
