"""The RTL syntax tree: frozen nodes built by the parser, each with its source span.

Spans are carried for diagnostics and excluded from equality, so two programs that differ
only in layout have equal trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timerlc.diagnostics import Span


def _span():
    return field(default=None, compare=False, repr=False)


# ----------------------------------------------------------------------------- expressions
@dataclass(frozen=True, slots=True)
class Expr:
    pass


@dataclass(frozen=True, slots=True)
class Name(Expr):
    id: str
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Int(Expr):
    value: int
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Float(Expr):
    value: float
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Str(Expr):
    value: str
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Bool(Expr):
    value: bool
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    """``-x``, ``+x`` or ``not x``; ``op_span`` is the operator's."""

    op: str
    operand: Expr
    span: Span | None = _span()
    op_span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    """Arithmetic, matmul, power and logical ``and``/``or``."""

    op: str
    left: Expr
    right: Expr
    span: Span | None = _span()
    op_span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    """A comparison chain ``a < b <= c`` (Python's meaning: ``a < b and b <= c``)."""

    ops: tuple[str, ...]
    operands: tuple[Expr, ...]
    span: Span | None = _span()
    op_spans: tuple = _span()


@dataclass(frozen=True, slots=True)
class Slice(Expr):
    """``lo:hi`` inside brackets; either bound may be omitted."""

    lo: Expr | None
    hi: Expr | None
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Subscript(Expr):
    value: Expr
    items: tuple[Expr, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Keyword:
    name: str
    value: Expr
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Call(Expr):
    func: Expr
    args: tuple[Expr, ...]
    kwargs: tuple[Keyword, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Attribute(Expr):
    value: Expr
    name: str
    span: Span | None = _span()
    name_span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class TupleLit(Expr):
    items: tuple[Expr, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class ListLit(Expr):
    items: tuple[Expr, ...]
    span: Span | None = _span()


# ----------------------------------------------------------------------------- statements
@dataclass(frozen=True, slots=True)
class Ident:
    """A declared name with its own span."""

    name: str
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Stmt:
    pass


@dataclass(frozen=True, slots=True)
class ConfigDecl(Stmt):
    items: tuple[tuple[Ident, Expr], ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class DimDecl(Stmt):
    name: Ident
    bound: Expr
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class EnvDecl(Stmt):
    name: Ident
    plugin: str
    batch: Ident
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class StateField:
    name: Ident
    type: "TypeExpr"
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class EnvStateDecl(Stmt):
    """``env state { field : TYPE ... }`` in an environment written in RTL."""

    name: Ident
    fields: tuple[StateField, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class EnvAttrDecl(Stmt):
    """``env observation f32[4]``, ``env actions 2`` in an environment written in RTL."""

    name: Ident
    value: Expr
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class TypeExpr:
    dtype: Ident
    shape: tuple[Expr, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class ParamField:
    name: Ident
    type: TypeExpr
    init: Expr
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class ParamsDecl(Stmt):
    name: Ident
    dims: tuple[Ident, ...]
    fields: tuple[ParamField, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class DefItem:
    """A line of a def body: ``targets = value``, or the final ``value``."""

    targets: tuple[Expr, ...] | None
    value: tuple[Expr, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class DefDecl(Stmt):
    name: Ident
    params: tuple[Ident, ...]
    body: tuple[DefItem, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class OutDecl(Stmt):
    names: tuple[Ident, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class MetricDecl(Stmt):
    names: tuple[Ident, ...]
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Equation(Stmt):
    lhs: tuple[Expr, ...]
    rhs: tuple[Expr, ...]
    when: Expr | None
    span: Span | None = _span()


@dataclass(frozen=True, slots=True)
class Program:
    statements: tuple[Stmt, ...]
