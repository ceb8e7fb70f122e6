"""The values the elaborator passes around while it turns expressions into PDG nodes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from timerlc.diagnostics import ProgramError, Span
from timerlc.ir.pdg import Edge
from timerlc.types import TensorType


@dataclass(frozen=True)
class Val:
    """A tensor value: a compile-time constant, a node of the current equation, or a read.

    ``weak`` marks Python-like scalars (literals, configs and arithmetic on them): they take
    the dtype of the strong operand they meet, as JAX's weak types do.
    """

    type: TensorType
    weak: bool = False
    const: object = None  # a Python number (scalar or filled shape) known at compile time
    node: int | None = None
    edge: Edge | None = None
    span: Span | None = None

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def shape(self) -> tuple:
        return self.type.shape

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def at(self, span) -> "Val":
        return replace(self, span=span)


@dataclass(frozen=True)
class RecordVal:
    """A params-like record: field name -> Val, in declaration order."""

    fields: tuple[tuple[str, Val], ...]
    span: Span | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    def field(self, name: str) -> Val | None:
        for n, v in self.fields:
            if n == name:
                return v
        return None


@dataclass(frozen=True)
class TupleVal:
    items: tuple
    span: Span | None = None


@dataclass(frozen=True)
class RecordType:
    fields: tuple[tuple[str, TensorType], ...]

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{n}: {t}" for n, t in self.fields) + "}"


class UnknownType(Exception):
    """Raised while inferring types, when a read tensor has no type yet."""

    def __init__(self, tensor: str):
        super().__init__(tensor)
        self.tensor = tensor


def dynamic_slice_error(span) -> ProgramError:
    return ProgramError(
        "a dynamic slice (its length depends on a dim) is allowed only as the direct argument of "
        "sum, mean, max, min, logsumexp or discounted_sum",
        span,
    )
