"""PDG domains, conditions and accesses as isl objects.

Everything is built from isl's text syntax, which reads the quasi-affine index expressions
of ``timerlc.ir.index`` directly. Dims are renamed ``d_<dim>`` (see ``index.isl_name``) so
that user names never clash with isl keywords; producer dims in maps are ``s_<k>``.
"""

from __future__ import annotations

import functools

import islpy as isl
import sympy

from timerlc.ir import index as ix
from timerlc.ir.pdg import Domain, Point


def _tuple(dims, tag: str = "") -> str:
    return f"{tag}[{', '.join(ix.isl_name(d) for d in dims)}]"


@functools.lru_cache(maxsize=16384)  # isl sets are values: operations return new ones
def cond_set(dims: tuple[str, ...], cond, tag: str = "") -> isl.Set:
    return isl.Set(f"{{ {_tuple(dims, tag)} : {ix.cond_to_isl(cond)} }}")


def domain_set(domain: Domain, tag: str = "") -> isl.Set:
    return cond_set(domain.dims, domain.cond, tag)


@functools.lru_cache(maxsize=16384)  # the checks and the schedule build the same maps
def access_map(
    consumer: Domain, access, n_src: int, src_tag: str = "", dst_tag: str = ""
) -> isl.Map:
    """``{ consumer point -> producer points it reads }`` over the consumer's domain."""
    m = _access_map(consumer, access, n_src)
    if dst_tag:
        m = m.set_tuple_name(isl.dim_type.in_, dst_tag)
    if src_tag:
        m = m.set_tuple_name(isl.dim_type.out, src_tag)
    return m


# PPO's checks and schedule ask for 1751 tagged maps of 49 accesses: each is parsed once
@functools.lru_cache(maxsize=16384)
def _access_map(consumer: Domain, access, n_src: int) -> isl.Map:
    src_names = [f"s_{k}" for k in range(n_src)]
    parts = [ix.cond_to_isl(consumer.cond)]
    for name, a in zip(src_names, access):
        if isinstance(a, Point):
            parts.append(f"{name} = {ix.to_isl(a.expr)}")
        else:
            parts.append(f"{ix.to_isl(a.lo)} <= {name} < {ix.to_isl(a.hi)}")
    text = (
        f"{{ {_tuple(consumer.dims)} -> [{', '.join(src_names)}] : "
        + " and ".join(f"({p})" for p in parts)
        + " }"
    )
    return isl.Map(text)


def producer_side(s: isl.Set, n: int) -> isl.Set:
    """The same set with its dims named s_0..s_{n-1} (the producer side of access maps)."""
    for k in range(n):
        s = s.set_dim_name(isl.dim_type.set, k, f"s_{k}")
    return s.reset_tuple_id()


def point_of(point: isl.Point, dims: tuple[str, ...]) -> dict[str, int]:
    return {
        d: point.get_coordinate_val(isl.dim_type.set, k).to_python() for k, d in enumerate(dims)
    }


def sample(s: isl.Set, dims: tuple[str, ...]) -> dict[str, int] | None:
    """The lexicographically smallest point of ``s`` (a readable example), or None."""
    if s.is_empty():
        return None
    return point_of(s.lexmin().sample_point(), dims)


def is_empty(dims: tuple[str, ...], cond) -> bool:
    return cond_set(dims, cond).is_empty()


def extents(dims: tuple[str, ...], cond) -> tuple[int, ...]:
    """1 + the largest value of each dim over the set (0 where the set is empty)."""
    s = cond_set(dims, cond)
    if s.is_empty():
        return tuple(0 for _ in dims)
    return tuple(s.dim_max_val(k).to_python() + 1 for k in range(len(dims)))


def minimum(dims: tuple[str, ...], cond, k: int) -> int | None:
    s = cond_set(dims, cond)
    if s.is_empty():
        return None
    return s.dim_min_val(k).to_python()


def format_point(point: dict[str, int]) -> str:
    return ", ".join(f"{d}={v}" for d, v in point.items()) if point else "(no dims)"


SIMPLIFY_PARTS = 64


def simplify(dims: tuple[str, ...], cond, context=sympy.true):
    """``cond`` without the conjuncts (or disjuncts) that the rest and ``context`` imply.

    The result is equivalent to ``cond`` on the points of ``context``; IR dumps stay short.
    A condition of more than ``SIMPLIFY_PARTS`` conjuncts or disjuncts is kept as it is
    (each is one isl check on the whole condition: a ``when`` chain of 1,500 ``or``s would
    take minutes).
    """

    # the checks in isl's set algebra: "context and rest imply c" is "the points of
    # context and rest lie in c's" (no sympy formula is built per check)
    ctx = cond_set(dims, context)
    if ctx.is_subset(cond_set(dims, cond)):
        return sympy.true
    if len(cond.args) > SIMPLIFY_PARTS:
        return cond
    if isinstance(cond, sympy.And):
        parts = list(cond.args)
        sets = [cond_set(dims, c) for c in parts]
        keep = list(range(len(parts)))
        for k in range(len(parts)):
            rest = ctx
            for j in keep:
                if j != k:
                    rest = rest.intersect(sets[j])
            if rest.is_subset(sets[k]):
                keep.remove(k)
        return sympy.And(*(parts[j] for j in keep))
    if isinstance(cond, sympy.Or):
        parts = list(cond.args)
        sets = [cond_set(dims, c) for c in parts]
        keep = list(range(len(parts)))
        for k in range(len(parts)):
            others = [j for j in keep if j != k]
            if not others:
                continue
            rest = sets[others[0]]
            for j in others[1:]:
                rest = rest.union(sets[j])
            if ctx.intersect(sets[k]).is_subset(rest):
                keep.remove(k)
        return sympy.Or(*(parts[j] for j in keep))
    return cond
