"""The op record and the registry; the shape rules the type rules share.

An ``Op`` holds everything about one primitive op of the PDG, in one place:

- ``infer(attrs, input types) -> type``: its type rule. Ops are strict: their inputs
  already have the dtypes the rule asks for (the front end inserts casts for promotion); a
  rule raises ``TypeRuleError`` with a message that names the offending types, to which
  the front end attaches the source span.
- ``kernel(ctx, attrs, args) -> array``: its NumPy semantics over a batch of points
  (``ops.kernel``), which the reference interpreter runs at one point and the cpu runtime
  over many; None for the ops the runtimes run themselves (merges, environment calls).
- ``vjp(em, node, k, g)``: its vector-Jacobian product for the autodiff pass
  (``ops.grads``); ``NO_GRAD`` when no gradient flows through it (comparisons, sampling,
  environments), None when its gradient is not supported (an error at the program's span).
- ``attrs``: the attributes its kernel reads, name -> kind (``runtime.plan`` checks a
  plan's against them; a kind ending in ``?`` may be absent).
- ``cheap``: computing it again is as cheap as storing it and reading it back (the
  schedule inlines a cheap node into every statement that reads it).
- ``outputs``: how many values it gives.

This package is shared by the compiler, the reference interpreter and the runtime: it
imports NumPy, the standard library, ``timerlc.rng``, ``timerlc.types`` and the plan's
data modules, never the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from timerlc.types import TensorType, format_shape


class TypeRuleError(Exception):
    """An op applied to types it does not accept."""


class _NoGrad:
    def __repr__(self) -> str:
        return "NO_GRAD"


NO_GRAD = _NoGrad()  # an op through which no gradient flows


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # elementwise | reduce | shape | index | source | random | control | env | other
    arity: int | None  # inputs; None: any number
    infer: Callable[[dict, list[TensorType]], TensorType]
    kernel: Callable | None = None
    vjp: Any = None  # (em, node, k, g) -> node | Window, or NO_GRAD, or None
    grad_inputs: tuple[int, ...] | None = None  # the inputs a gradient reaches (None: all)
    attrs: dict[str, str] = field(default_factory=dict)
    cheap: bool = False
    outputs: int = 1
    doc: str = ""


REGISTRY: dict[str, Op] = {}


def define(name: str, kind: str, arity: int | None, infer, kernel=None, **rest) -> Op:
    """Declare op ``name`` (once)."""
    assert name not in REGISTRY, f"op {name} declared twice"
    op = Op(name, kind, arity, infer, kernel, **rest)
    REGISTRY[name] = op
    return op


def get(name: str) -> Op:
    return REGISTRY[name]


def is_env(name: str) -> bool:
    """Whether op ``name`` calls an environment (by its kind, not its spelling)."""
    op = REGISTRY.get(name)
    return op is not None and op.kind == "env"


def infer(name: str, attrs: dict, types: list[TensorType]) -> TensorType:
    d = REGISTRY[name]
    if d.arity is not None and len(types) != d.arity:
        raise TypeRuleError(f"{name} takes {d.arity} inputs, got {len(types)}")
    return d.infer(attrs, types)


# ----------------------------------------------------------------------------- shape rules
def broadcast_shapes(*shapes) -> tuple:
    """NumPy broadcasting of static shapes (dynamic extents must match exactly)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        extent = 1
        for s in shapes:
            j = k - (rank - len(s))
            if j < 0:
                continue
            e = s[j]
            if e == 1:
                continue
            if extent == 1:
                extent = e
            elif e != extent:
                raise TypeRuleError(
                    "shapes " + " and ".join(format_shape(s) for s in shapes) + " do not broadcast"
                )
        out.append(extent)
    return tuple(out)


def same_dtype(types, what):
    dts = {t.dtype for t in types}
    if len(dts) > 1:
        raise TypeRuleError(f"{what}: dtypes {' and '.join(t.dtype for t in types)} differ")
    return types[0].dtype


def need(pred, t: TensorType, what: str, words: str):
    if not pred(t.dtype):
        raise TypeRuleError(f"{what} needs {words}, got {t}")


def static(t: TensorType, what: str):
    if not t.is_static:
        raise TypeRuleError(f"{what} cannot take a value of dynamic shape {format_shape(t.shape)}")


def axis_of(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1) or (rank == 0 and axis not in (0, -1)):
        raise TypeRuleError(f"{what}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(axes, rank: int, what: str) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise TypeRuleError(f"{what}: axis {a} is out of range for rank {rank}")
        a %= rank
        if a in out:
            raise TypeRuleError(f"{what}: axis {a} repeated")
        out.append(a)
    return tuple(sorted(out))


def no_bool(t):
    if t.dtype == "bool":
        raise TypeRuleError(f"arithmetic needs numbers, got {t}")
