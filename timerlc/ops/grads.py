"""Vector-Jacobian products: what the autodiff pass asks of an op's record, and the helpers
the records' ``vjp`` rules share.

``vjp(em, node, k, g)`` returns the node (in ``em``'s domain, the forward node's) holding
the contribution of the adjoint ``g`` of ``node``'s output to its input ``k``, with the
type that input edge delivers. Forward inputs are read through the forward node's own
edges (``em.fwd(k)``), its output through ``em.out()``; ``em.op(name, *inputs, **attrs)``
adds a node, ``em.const(value, dtype)`` a constant, ``em.in_type(k)`` is input ``k``'s
type, ``em.shape(x)`` a node's shape. Reductions over a slice whose length depends on a dim
return a ``Window`` instead: the pass sums a weight over the inverse window (see autodiff).
"""

from __future__ import annotations

from dataclasses import dataclass

from timerlc.diagnostics import ProgramError
from timerlc.ops.core import NO_GRAD, REGISTRY
from timerlc.types import is_float


@dataclass(frozen=True)
class Window:
    """A reduction over a dynamic window: the input's adjoint at point s is the sum over the
    consumer points c whose window holds s of ``weight[c]`` (kind "sum"), or of
    ``weight[c] * gamma ** (s - lo(c))`` (kind "discounted", gamma from input 1)."""

    weight: int
    kind: str


def flows(node, k: int, in_type) -> bool:
    """Whether a gradient can flow from ``node``'s output into its input ``k``."""
    op = REGISTRY[node.op]
    if op.vjp is NO_GRAD or not is_float(in_type.dtype) or not is_float(node.type.dtype):
        return False
    return op.grad_inputs is None or k in op.grad_inputs


def vjp(em, node, k: int, g: int):
    rule = REGISTRY[node.op].vjp
    if rule is None or rule is NO_GRAD:
        raise ProgramError(f"the gradient of '{node.op}' is not supported yet", node.span)
    return rule(em, node, k, g)


def unbroadcast(em, x: int, shape: tuple) -> int:
    """Sum ``x`` down to ``shape`` (undo NumPy broadcasting)."""
    xs = em.shape(x)
    if xs == tuple(shape):
        return x
    lead = len(xs) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + j for j, s in enumerate(shape) if s == 1 and xs[lead + j] != 1
    )
    if axes:
        x = em.op("sum", x, axes=axes, keepdims=True)
    if em.shape(x) != tuple(shape):
        x = em.op("reshape", x, shape=tuple(shape))
    return x


def like(em, x: int, k: int) -> int:
    """``x`` summed down to the shape of input ``k``."""
    return unbroadcast(em, x, em.in_type(k).shape)


def expand_reduced(em, node, x: int) -> int:
    """A reduction's output (or adjoint) with the reduced axes back, as length 1."""
    if node.attr("keepdims"):
        return x
    for a in sorted(node.attr("axes")):
        x = em.op("expand_dims", x, axis=a)
    return x


def dynamic(em, k: int) -> bool:
    """Whether input ``k`` is a slice whose length depends on a dim."""
    return not em.in_type(k).is_static


def identity(em, node, k, g):
    """The adjoint passes through unchanged (copies, merges)."""
    return g
