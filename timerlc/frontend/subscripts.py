"""Subscripts and attributes: temporal reads of tensors, NumPy-style spatial indexing,
record fields and ``.T`` (LANGUAGE.md section 5). A mixin of ``Elaborator``.

A temporal read becomes an input edge whose access says which points it reads; a spatial
index becomes an ``index`` node whose items may depend on dims (checked later by
``timerlc.poly.checks``) or gather with an integer tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from timerlc.diagnostics import ProgramError, did_you_mean
from timerlc.frontend import ast
from timerlc.frontend.declarations import TensorInfo
from timerlc.frontend.indexing import NotIndex, env_attribute, to_index
from timerlc.frontend.values import (
    RecordType,
    RecordVal,
    TupleVal,
    UnknownType,
    Val,
    dynamic_slice_error,
)
from timerlc.ir import index as ix
from timerlc.ir.pdg import Edge, Point, Range

if TYPE_CHECKING:
    from timerlc.frontend.elaborate import Locals


class Subscripts:
    """Methods of ``Elaborator`` for ``x[...]`` and ``x.name``."""

    def read(self, t: TensorInfo, access: tuple, lengths: tuple, span) -> Val | RecordVal:
        ty = self.types.get(t.name)
        if ty is None:
            raise UnknownType(t.name)
        if isinstance(ty, RecordType):
            fields = []
            for fname, ftype in ty.fields:
                src = self.merge_ids.get(f"{t.name}.{fname}", -1)
                fields.append(
                    (
                        fname,
                        Val(
                            ftype.with_shape(lengths + ftype.shape),
                            edge=Edge(src, access, span=span),
                            span=span,
                        ),
                    )
                )
            return RecordVal(tuple(fields), span)
        src = self.merge_ids.get(t.name, -1)
        return Val(ty.with_shape(lengths + ty.shape), edge=Edge(src, access, span=span), span=span)

    def _Attribute(self, expr: ast.Attribute, env: Locals):
        attr = env_attribute(expr, self.scope(env))
        if isinstance(attr, int):
            return self.const(attr, span=expr.span)
        if attr is not None:
            raise ProgramError(
                f"{expr.value.id}.{expr.name} is a shape; use it in a shape list like "
                f"zeros([{expr.value.id}.{expr.name}])",
                expr.span,
            )
        base = self.value(expr.value, env)
        if isinstance(base, RecordVal):
            v = base.field(expr.name)
            if v is None:
                raise ProgramError(
                    f"the record has no field '{expr.name}' (fields: {', '.join(base.names)})"
                    + did_you_mean(expr.name, base.names),
                    expr.name_span,
                )
            return v.at(expr.span)
        if isinstance(base, TupleVal):
            raise ProgramError(f"a tuple has no attribute '{expr.name}'", expr.name_span)
        if expr.name == "T":
            return self.apply(
                "transpose", [base], expr.span, perm=tuple(reversed(range(base.type.rank)))
            )
        raise ProgramError(f"a tensor has no attribute '{expr.name}' (only .T)", expr.name_span)

    def _Subscript(self, expr: ast.Subscript, env: Locals):
        if isinstance(expr.value, ast.Name) and expr.value.id not in env.values:
            t = self.info.tensors.get(expr.value.id)
            if t is not None and t.dims:
                return self.temporal(t, expr.items, expr.span, env)
        base = self.value(expr.value, env)
        if isinstance(base, RecordVal):
            raise ProgramError("a record cannot be indexed; use .field", expr.span)
        if isinstance(base, TupleVal):
            raise ProgramError("a tuple cannot be indexed", expr.span)
        return self.spatial(base, expr.items, expr.span, env)

    def temporal(self, t: TensorInfo, items, span, env: Locals):
        if len(items) != len(t.dims):
            raise ProgramError(
                f"'{t.name}' has {len(t.dims)} {'dim' if len(t.dims) == 1 else 'dims'} "
                f"({', '.join(t.dims)}) but is indexed with {len(items)}",
                span,
            )
        scope = self.scope(env)
        access, lengths = [], []
        for k, (item, d) in enumerate(zip(items, t.dims)):
            if isinstance(item, ast.Slice):
                lo = (
                    self._temporal_index(item.lo, scope)
                    if item.lo is not None
                    else sympy.Integer(0)
                )
                hi = (
                    self._temporal_index(item.hi, scope)
                    if item.hi is not None
                    else sympy.Integer(t.extents[k])
                )
                length = sympy.simplify(hi - lo)
                if length.is_Integer and int(length) < 0:
                    raise ProgramError(
                        f"slice {ix.to_text(lo)}:{ix.to_text(hi)} has negative length", item.span
                    )
                access.append(Range(lo, hi))
                lengths.append(int(length) if length.is_Integer else length)
            else:
                access.append(Point(self._temporal_index(item, scope)))
        v = self.read(t, tuple(access), tuple(lengths), span)
        return v

    def _temporal_index(self, expr, scope):
        try:
            return to_index(expr, scope)
        except NotIndex as e:
            raise ProgramError(
                "a temporal index must be an index expression of dims and int configs "
                f"({e.reason})",
                e.span,
            ) from None

    def spatial(self, x: Val, items, span, env: Locals) -> Val:
        if not x.type.is_static:
            raise dynamic_slice_error(x.span or span)
        if len(items) > x.type.rank:
            raise ProgramError(
                f"too many indices ({len(items)}) for a value of type {x.type}", span
            )
        scope = self.scope(env)
        out, gather = [], None
        for k, item in enumerate(items):
            n = x.shape[k]
            if isinstance(item, ast.Slice):
                out.append(self._spatial_slice(item, n, k, scope))
                continue
            try:
                e = to_index(item, scope)
            except NotIndex:
                e = None
            if n == 0 and e is not None:  # (NumPy's x[i] raises on an empty axis too)
                raise ProgramError(
                    f"an index into axis {k} of {x.type}, which is empty", item.span
                )
            if e is not None:
                if e.is_Integer:
                    v = int(e)
                    if not -n <= v < n:
                        raise ProgramError(
                            f"index {v} is out of range for axis {k} of length {n}", item.span
                        )
                    out.append(("int", sympy.Integer(v % n)))
                else:
                    out.append(("int", e))
                continue
            g = self.tensor_value(item, env, "an index")
            if g.dtype == "bool":
                raise ProgramError(
                    f"boolean mask indexing is not supported; index with integers, got {g.type}",
                    item.span,
                )
            if not g.dtype.startswith("i"):
                raise ProgramError(f"an index must be an integer, got {g.type}", item.span)
            if gather is not None:
                raise ProgramError("only one tensor index is allowed in one subscript", item.span)
            if n == 0 and 0 not in g.type.shape:
                raise ProgramError(
                    f"an index {g.type} into axis {k} of {x.type}, which is empty: no index is "
                    "in range",
                    item.span,
                )
            gather = g
            out.append(("gather",))
        args = [x] + ([gather] if gather is not None else [])
        return self.apply("index", args, span, items=tuple(out))

    def _spatial_slice(self, item: ast.Slice, n: int, axis: int, scope):
        def bound(e):
            if e is None:
                return None
            try:
                return to_index(e, scope)
            except NotIndex as err:
                raise ProgramError(
                    "a slice bound must be an index expression of dims and int configs "
                    f"({err.reason})",
                    err.span,
                ) from None

        lo, hi = bound(item.lo), bound(item.hi)
        if (lo is None or lo.is_Integer) and (hi is None or hi.is_Integer):
            start, stop, _ = slice(
                None if lo is None else int(lo), None if hi is None else int(hi)
            ).indices(n)
            length = max(0, stop - start)
            if start == 0 and length == n:
                return ("full",)
            return ("slice", sympy.Integer(start), length)
        if lo is None or hi is None:
            raise ProgramError(
                "a spatial slice with a dim-dependent bound needs both bounds", item.span
            )
        length = sympy.simplify(hi - lo)
        if not length.is_Integer:
            raise ProgramError(
                f"the length of a spatial slice must be constant, here it is {ix.to_text(length)}",
                item.span,
            )
        if not 0 <= int(length) <= n:
            raise ProgramError(
                f"a slice of length {int(length)} does not fit axis {axis} of length {n}",
                item.span,
            )
        return ("slice", lo, int(length))

    # ------------------------------------------------------------------ operators
