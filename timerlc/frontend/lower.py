"""Lowering: a checked ``ProgramInfo`` -> the PDG (``timerlc.ir.pdg.Graph``).

First the types of tensors are inferred: a recurrence takes its type from its base
equations, so equations are elaborated repeatedly until every tensor's type is fixed
(weak scalars such as ``x[0] = 0`` adapt to the other equations). Then each equation is
elaborated once more into nodes over its iteration domain, and each tensor becomes a
``merge`` node whose branches read those nodes under the first-match conditions.
"""

from __future__ import annotations

import numpy as np

from timerlc import rng
from timerlc.diagnostics import ProgramError
from timerlc.frontend import ast
from timerlc.frontend.declarations import EquationInfo, Lhs, ProgramInfo, TensorInfo, field_type
from timerlc.frontend.elaborate import Builder, Elaborator, Locals
from timerlc.frontend.values import RecordType, RecordVal, TupleVal, UnknownType, Val
from timerlc.ir import index as ix
from timerlc.ir.pdg import SCALAR_DOMAIN, Dim, Domain, Edge, Env, Graph, Node, Point, Tensor
from timerlc.types import TensorType, is_float, numpy_dtype, promote


def lower(info: ProgramInfo) -> Graph:
    types = infer_types(info)
    return _build(info, types)


# ----------------------------------------------------------------------------- typing
class _TypeState:
    def __init__(self, info: ProgramInfo):
        self.info = info
        self.types: dict = {}
        self.weak: dict[str, bool] = {}
        self.origin: dict[str, int] = {}
        for name, t in info.tensors.items():
            if t.params is not None:
                self.types[name] = RecordType(
                    tuple((f.name.name, field_type(info, f.type)) for f in t.params.fields)
                )

    def join(self, t: TensorInfo, v, eq: EquationInfo, span) -> bool:
        name = t.name
        old = self.types.get(name)
        if t.params is not None:
            _check_params_value(t, old, v, span)
            return False
        if isinstance(v, RecordVal):
            new = RecordType(tuple((n, f.type) for n, f in v.fields))
            if old is None:
                self.types[name], self.origin[name] = new, eq.line
                return True
            if not isinstance(old, RecordType) or old.names() != new.names():
                raise ProgramError(
                    f"'{name}' is {_describe(old)} (line {self.origin[name]}) but this equation "
                    f"gives {_describe(new)}",
                    span,
                )
            fields = []
            for (n, a), (_, b) in zip(old.fields, new.fields):
                if a.shape != b.shape:
                    raise ProgramError(
                        f"field '{n}' of '{name}' is {a} (line {self.origin[name]}) but this "
                        f"equation gives {b}",
                        span,
                    )
                fields.append((n, a.with_dtype(promote(a.dtype, b.dtype))))
            joined = RecordType(tuple(fields))
        else:
            weak = v.weak and v.shape == ()
            if old is None:
                self.types[name], self.weak[name] = v.type, weak
                self.origin[name] = eq.line
                return True
            if isinstance(old, RecordType):
                raise ProgramError(
                    f"'{name}' is {_describe(old)} (line {self.origin[name]}) but this equation "
                    f"gives {v.type}",
                    span,
                )
            old_weak = self.weak[name]
            if old_weak and weak:
                joined, jweak = TensorType(promote(old.dtype, v.dtype), ()), True
            elif old_weak:
                joined, jweak = v.type.with_dtype(_weak_join(old.dtype, v.dtype)), False
                self.origin[name] = eq.line
            elif weak:
                joined, jweak = old.with_dtype(_weak_join(v.dtype, old.dtype)), False
            else:
                if old.shape != v.shape:
                    raise ProgramError(
                        f"shape mismatch: '{name}' is {old} (line {self.origin[name]}) but this "
                        f"equation gives {v.type}",
                        span,
                    )
                joined, jweak = old.with_dtype(promote(old.dtype, v.dtype)), False
            if jweak != old_weak:
                self.weak[name] = jweak
                self.types[name] = joined
                return True
        if joined != old:
            self.types[name] = joined
            return True
        return False


def _weak_join(weak: str, strong: str) -> str:
    if is_float(weak) and not is_float(strong):
        return "f32"
    if weak == "i32" and strong == "bool":
        return "i32"
    return strong


def _describe(t) -> str:
    return f"a record {t}" if isinstance(t, RecordType) else f"a tensor {t}"


def _check_params_value(t: TensorInfo, declared: RecordType, v, span):
    if not isinstance(v, RecordVal):
        what = f"a tuple of {len(v.items)}" if isinstance(v, TupleVal) else f"a tensor {v.type}"
        raise ProgramError(
            f"'{t.name}' is a params record {declared}; this equation gives {what}", span
        )
    if v.names != declared.names():
        raise ProgramError(
            f"'{t.name}' has fields ({', '.join(declared.names())}) but this equation gives "
            f"({', '.join(v.names)})",
            span,
        )
    for (n, want), (_, got) in zip(declared.fields, v.fields):
        _fits(f"{t.name}.{n}", want, got, span)


def _fits(name: str, want: TensorType, got: Val, span):
    if got.weak and got.shape == ():
        return
    if got.shape != want.shape or got.dtype != want.dtype:
        raise ProgramError(f"'{name}' is {want} but this equation gives {got.type}", span)


def _split(eq: EquationInfo, value) -> list:
    n = len(eq.lhs)
    span = eq.stmt.rhs[0].span if eq.stmt.rhs else eq.span
    if n == 1:
        if isinstance(value, TupleVal):
            raise ProgramError(
                f"the right side gives {len(value.items)} values but the left side defines 1 "
                "tensor",
                span,
            )
        return [value]
    if not isinstance(value, TupleVal) or len(value.items) != n:
        got = len(value.items) if isinstance(value, TupleVal) else 1
        raise ProgramError(
            f"the right side gives {got} value{'s' if got != 1 else ''} but the left side defines "
            f"{n} tensors",
            span,
        )
    return list(value.items)


def _rhs_span(eq: EquationInfo):
    from timerlc.diagnostics import Span

    return Span.join(eq.stmt.rhs[0].span, eq.stmt.rhs[-1].span)


def infer_types(info: ProgramInfo) -> dict:
    """Types of all tensors: a fixpoint over the equations.

    When no equation can make progress because each reads a tensor of unknown type (a
    recurrence without a base case, or a cycle), the unknown tensors are assumed to be weak
    scalars, so that lowering can go on and the domain checks can name the real mistake;
    if that assumption itself leads to a type error, the error says the type is unknown.
    """
    state = _TypeState(info)
    assumed: list[str] = []
    while True:
        try:
            _fixpoint(info, state)
        except ProgramError:
            if assumed:
                raise _cannot_infer(info, assumed[0]) from None
            raise
        unknown = [n for n in info.tensors if state.types.get(n) is None]
        if not unknown:
            return state.types
        if assumed:
            raise _cannot_infer(info, unknown[0])
        for n in unknown:
            state.types[n], state.weak[n], state.origin[n] = TensorType("f32", ()), True, 0
        assumed = unknown


def _cannot_infer(info: ProgramInfo, name: str) -> ProgramError:
    return ProgramError(
        f"cannot infer the type of '{name}': each of its equations reads a tensor whose type "
        "depends on it (a recurrence needs a base equation that does not)",
        info.tensors[name].span,
    )


def _context(info: ProgramInfo, eq: EquationInfo):
    """The elaboration context of an equation: its domain, its first left side (the order of
    environment calls) and its name for random sites: the tensor it defines (its first) and
    its ordinal among that tensor's definitions, so that unrelated edits keep the draws."""
    lhs = eq.lhs[0]
    t = info.tensors[lhs.tensor]
    ordinal = next(k for k, (e, _) in enumerate(t.definitions) if e is eq)
    site = f"{lhs.tensor}#{ordinal}"
    return Domain(eq.iter_dims, eq.eff_cond), (lhs, info.tensors[lhs.tensor].dims), site


def _fixpoint(info: ProgramInfo, state: _TypeState):
    for _ in range(4 * len(info.equations) + 4):
        changed = False
        for eq in info.equations:
            el = Elaborator(info, state.types, {}, Builder())
            el.enter(*_context(info, eq))
            try:
                value = el.tuple_value(eq.stmt.rhs, Locals())
            except UnknownType:
                continue
            for lhs, v in zip(eq.lhs, _split(eq, value)):
                changed |= state.join(info.tensors[lhs.tensor], v, eq, _rhs_span(eq))
        if not changed:
            return


# ----------------------------------------------------------------------------- building
def _build(info: ProgramInfo, types: dict) -> Graph:
    builder = Builder()
    keys: dict[str, tuple[TensorInfo, TensorType]] = {}
    merge_ids: dict[str, int] = {}
    for name, t in info.tensors.items():
        ty = types[name]
        if isinstance(ty, RecordType):
            for fname, ftype in ty.fields:
                key = f"{name}.{fname}"
                keys[key] = (t, ftype)
                merge_ids[key] = builder.reserve()
        else:
            keys[name] = (t, ty)
            merge_ids[name] = builder.reserve()
    branches: dict[str, list[Edge]] = {k: [] for k in keys}
    el = Elaborator(info, types, merge_ids, builder)

    for name, t in info.tensors.items():
        if t.params is not None:
            _params_init(el, t, types[name], branches)

    for eq in info.equations:
        el.enter(*_context(info, eq))
        value = el.tuple_value(eq.stmt.rhs, Locals())
        for lhs, v in zip(eq.lhs, _split(eq, value)):
            t = info.tensors[lhs.tensor]
            k = next(i for i, (e, _) in enumerate(t.definitions) if e is eq)
            if k in t.shadowed:
                continue
            ty = types[lhs.tensor]
            if isinstance(ty, RecordType):
                for fname, ftype in ty.fields:
                    fv = v.field(fname)
                    _branch(el, lhs, t, k, f"{lhs.tensor}.{fname}", ftype, fv, branches)
            else:
                _branch(el, lhs, t, k, lhs.tensor, ty, v, branches)

    for key, (t, ty) in keys.items():
        node = Node(
            merge_ids[key],
            "merge",
            Domain(t.dims, t.domain),
            tuple(branches[key]),
            (ty,),
            (),
            key,
            t.span,
        )
        builder.fill(merge_ids[key], node)

    outputs = []
    for ident in info.outputs:
        outputs += [k for k in keys if k == ident.name or k.startswith(ident.name + ".")]
    metrics = []
    for ident in info.metrics:
        ty = types[ident.name]
        if isinstance(ty, RecordType) or ty.shape != ():
            raise ProgramError(
                f"a metric must be a scalar (shape []), but '{ident.name}' is {_describe(ty)}",
                ident.span,
            )
        metrics.append(ident.name)
    return Graph(
        dims=tuple(Dim(d.name, d.bound) for d in info.dims.values()),
        nodes=tuple(builder.nodes),
        tensors=tuple(Tensor(k, merge_ids[k]) for k in keys),
        outputs=tuple(dict.fromkeys(outputs)),
        metrics=tuple(dict.fromkeys(metrics)),
        configs=tuple((c.name, c.value) for c in info.configs.values()),
        envs=tuple(  # an environment written in RTL is equations (frontend.envrtl)
            Env(e.name, e.spec, e.batch)
            for e in info.envs.values()
            if getattr(e.attrs, "rtl", None) is None
        ),
    )


def _coerce(el: Elaborator, v: Val, ty: TensorType, span) -> Val:
    v = el.cast(v, ty.dtype)
    if v.shape != ty.shape:
        if v.shape != ():
            raise ProgramError(f"expected {ty}, got {v.type}", span)
        if v.const is not None:
            v = el.const(v.const, ty.dtype, ty.shape, weak=False, span=v.span)
        else:
            v = el.apply("broadcast_to", [v], span, shape=ty.shape)
    return el.node_of(v)


def _branch(
    el: Elaborator, lhs: Lhs, t: TensorInfo, k: int, key: str, ty: TensorType, v: Val, branches
):
    v = _coerce(el, v, ty, v.span or lhs.span)
    node = el.builder.nodes[v.node]
    offsets = {e.dim: e.offset for e in lhs.entries if e.dim is not None}
    access = tuple(Point(ix.sym(d) - offsets[d]) for d in node.dims)
    branches[key].append(Edge(v.node, access, cond=t.branch_conds[k], span=lhs.span))


# a params initializer: its arguments (name, default) besides the field's shape and dtype
RANDOM_INITS = {
    "glorot": (),
    "orthogonal": (("gain", 1.0),),
    "normal": (("std", 1.0),),
    "uniform": (("lo", 0.0), ("hi", 1.0)),
}


def _random_init(el: Elaborator, t: TensorInfo, f, ftype: TensorType, init, head) -> Val:
    """``glorot``, ``orthogonal(gain)``, ``normal(std)``, ``uniform(lo, hi)``: one site per "
    "field."""
    from timerlc.frontend.builtins import bind_arguments

    if not is_float(ftype.dtype):
        raise ProgramError(
            f"a random initializer needs a float field, '{f.name.name}' is {ftype}", head.span
        )
    spec = RANDOM_INITS[head.id]
    attrs = {}
    if isinstance(init, ast.Call):
        names = [n for n, _ in spec]
        exprs = bind_arguments(head.id, names, [], init)
        for n, default in spec:
            if n in exprs:
                v = el.tensor_value(exprs[n], Locals(), f"'{n}' of {head.id}")
                if v.const is None or v.shape != ():
                    raise ProgramError(
                        f"'{n}' of {head.id} must be a constant number", exprs[n].span
                    )
                attrs[n] = float(v.const)
            else:
                attrs[n] = default
    else:
        attrs = dict(spec)
    if head.id == "orthogonal" and len(ftype.shape) < 2:
        raise ProgramError(
            f"orthogonal needs a field with 2 or more dims, '{f.name.name}' is {ftype}", head.span
        )
    seed = int(el.info.configs["seed"].value)
    site = rng.site_id(f"{t.name}.{f.name.name}#init")
    return el.apply(
        "random_init",
        [],
        head.span,
        kind=head.id,
        shape=ftype.shape,
        dtype=ftype.dtype,
        seed=seed,
        site=site,
        space=(),
        **attrs,
    )


def _params_init(el: Elaborator, t: TensorInfo, ty: RecordType, branches):
    el.enter(SCALAR_DOMAIN)
    for f in t.params.fields:
        ftype = dict(ty.fields)[f.name.name]
        init = f.init
        head = init.func if isinstance(init, ast.Call) else init
        if (
            isinstance(head, ast.Name)
            and head.id in RANDOM_INITS
            and head.id not in el.info.tensors
        ):
            v = _random_init(el, t, f, ftype, init, head)
        elif (
            isinstance(init, ast.Name)
            and init.id in ("zeros", "ones")
            and init.id not in el.info.tensors
        ):
            v = el.const(
                0 if init.id == "zeros" else 1,
                ftype.dtype,
                ftype.shape,
                weak=False,
                span=init.span,
            )
        else:
            v = el.tensor_value(init, Locals(), "an initializer")
            castable = np.can_cast(numpy_dtype(v.dtype), numpy_dtype(ftype.dtype), "same_kind")
            if not (v.shape == () or v.shape == ftype.shape) or not (v.weak or castable):
                raise ProgramError(
                    f"the initializer of '{t.name}.{f.name.name}' is {v.type} but the field is "
                    f"{ftype}",
                    init.span,
                )
        v = _coerce(el, v, ftype, init.span)
        node = el.builder.nodes[v.node]
        assert node.dims == ()
        branches[f"{t.name}.{f.name.name}"].append(
            Edge(v.node, (), cond=t.branch_conds[0], span=f.name.span)
        )
