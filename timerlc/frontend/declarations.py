"""Declarations and equation structure: what each name is, the dims of each tensor, and
the points each equation defines (LANGUAGE.md sections 3-4).

In: a parsed program and its configs. Out: a ``ProgramInfo`` with, for every tensor, its
dims and, for every equation, its iteration domain and the points it defines after
"first match wins". Domains are sympy conditions; emptiness and examples come from isl.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from timerlc.diagnostics import ProgramError, Span, did_you_mean
from timerlc.frontend import ast
from timerlc.frontend.configs import Config
from timerlc.frontend.indexing import (
    IndexScope,
    NotIndex,
    shape_entries,
    to_condition,
    to_constant,
    to_index,
)
from timerlc.ir import index as ix
from timerlc.plan.items import MAX_EXTENT
from timerlc.poly import isl as pisl
from timerlc.types import DTYPES, TensorType

# A tensor's equations and the comparisons of their ``when`` conditions
# (docs/language.md): each equation's points exclude every earlier one's, which the checks
# work out in time that grows as the square of the equations and the comparisons (200
# equations of one tensor took a minute to check; a fuzzed ``when`` of 1,500 ``or``s, more)
MAX_EQUATIONS = 64
MAX_COMPARISONS = 256


@dataclass(frozen=True)
class DimInfo:
    name: str
    bound: int
    order: int
    span: Span | None


@dataclass(frozen=True)
class LhsEntry:
    dim: str | None  # None for a constant index
    offset: int  # the offset of dim, or the constant
    span: Span | None


@dataclass
class Lhs:
    tensor: str
    entries: tuple[LhsEntry, ...]
    span: Span | None  # the tensor name

    def tensor_expr(self, dims: tuple[str, ...]) -> dict[str, sympy.Expr]:
        """Tensor dim -> its value at an iteration point (in the iteration dims)."""
        out = {}
        for d, e in zip(dims, self.entries):
            out[d] = ix.sym(d) + e.offset if e.dim is not None else sympy.Integer(e.offset)
        return out


@dataclass
class EquationInfo:
    ordinal: int
    stmt: ast.Equation | None  # None: the initializers of a params declaration
    lhs: list[Lhs]
    iter_dims: tuple[str, ...] = ()
    iter_cond: object = sympy.true  # box and when
    eff_cond: object = sympy.true  # where at least one of its left sides is in effect
    params: ast.ParamsDecl | None = None
    comparisons: int = 0  # in its ``when`` condition

    @property
    def span(self) -> Span | None:
        return self.lhs[0].span if self.lhs else None

    @property
    def line(self) -> int:
        return self.span.line if self.span else 0


@dataclass
class TensorInfo:
    name: str
    span: Span | None
    dims: tuple[str, ...] = ()
    params: ast.ParamsDecl | None = None
    definitions: list[tuple[EquationInfo, int]] = field(default_factory=list)
    defined: list = field(default_factory=list)  # per definition, in tensor dims
    effective: list = field(default_factory=list)  # after first match wins
    domain: object = sympy.false
    extents: tuple[int, ...] = ()
    branch_conds: list = field(default_factory=list)  # effective, relative to domain
    shadowed: set = field(default_factory=set)  # definitions left with no point


@dataclass
class EnvInfo:
    decl: ast.EnvDecl
    spec: str  # the plugin spec, after --env
    attrs: object  # timerlc.envs.EnvSpec: spaces and attributes
    batch: str

    @property
    def name(self) -> str:
        return self.decl.name.name


@dataclass
class ProgramInfo:
    configs: dict[str, Config]
    dims: dict[str, DimInfo]
    envs: dict[str, EnvInfo]
    params: dict[str, ast.ParamsDecl]
    defs: dict[str, ast.DefDecl]
    tensors: dict[str, TensorInfo]
    equations: list[EquationInfo]
    outputs: list[ast.Ident]
    metrics: list[ast.Ident]
    names: frozenset = frozenset()  # every name the program declares, and the built-ins

    def scope(self, iterated=None, shadowed=frozenset()) -> IndexScope:
        dims = {d: i.bound for d, i in self.dims.items()}
        envs = {n: e.attrs for n, e in self.envs.items()}
        return IndexScope(self.configs, dims, iterated, shadowed, self.names | shadowed, envs)

    def canonical(self, dims) -> tuple[str, ...]:
        return tuple(sorted(dims, key=lambda d: self.dims[d].order))

    def box(self, dims) -> object:
        return ix.box((d, self.dims[d].bound) for d in dims)


def declared_names(program: ast.Program) -> frozenset:
    """Every name a statement declares (before they are checked), and the built-ins."""
    from timerlc.frontend.builtins import BUILTINS

    names = set(BUILTINS) | set(DTYPES)
    for stmt in program.statements:
        if isinstance(stmt, ast.ConfigDecl):
            names.update(i.name for i, _ in stmt.items)
        elif isinstance(stmt, (ast.DimDecl, ast.EnvDecl, ast.ParamsDecl, ast.DefDecl)):
            names.add(stmt.name.name)
        elif isinstance(stmt, ast.Equation):
            for e in stmt.lhs:
                head = e.value if isinstance(e, ast.Subscript) else e
                if isinstance(head, ast.Name):
                    names.add(head.id)
    return frozenset(names)


def collect(
    program: ast.Program,
    configs: dict[str, Config],
    env_overrides: dict[str, str] | None = None,
    base=None,
) -> ProgramInfo:
    """``base``: the program's folder (environment files are looked for there too)."""
    info = ProgramInfo(configs, {}, {}, {}, {}, {}, [], [], [])
    info.names = declared_names(program) | frozenset(configs)
    taken: dict[str, str] = {c: "config" for c in configs}

    def claim(ident: ast.Ident, kind: str):
        if ident.name in taken:
            raise ProgramError(
                f"'{ident.name}' is already declared as a {taken[ident.name]}", ident.span
            )
        taken[ident.name] = kind

    for stmt in program.statements:
        if isinstance(stmt, ast.DimDecl):
            claim(stmt.name, "dim")
            bound = to_constant(stmt.bound, info.scope(), "a dim bound")
            if bound < 1:
                raise ProgramError(
                    f"dim '{stmt.name.name}' has bound {bound}; it must be at least 1",
                    stmt.bound.span,
                )
            if bound > MAX_EXTENT:  # (a plan's limit, known here: `check` says it too)
                raise ProgramError(
                    f"dim '{stmt.name.name}' has bound {bound}; timerlc's limit is "
                    f"{MAX_EXTENT} (2^31) points per dim",
                    stmt.bound.span,
                )
            info.dims[stmt.name.name] = DimInfo(
                stmt.name.name, bound, len(info.dims), stmt.name.span
            )
        elif isinstance(stmt, ast.EnvDecl):
            claim(stmt.name, "env")
            info.envs[stmt.name.name] = _env(
                info, stmt, (env_overrides or {}).get(stmt.name.name), base
            )
        elif isinstance(stmt, (ast.EnvStateDecl, ast.EnvAttrDecl)):
            raise ProgramError(
                f"'env {stmt.name.name}' declares part of an environment written in RTL; it "
                "belongs in an environment file (docs/envs.md)",
                stmt.name.span,
            )
        elif isinstance(stmt, ast.ParamsDecl):
            claim(stmt.name, "params record")
            info.params[stmt.name.name] = stmt
        elif isinstance(stmt, ast.DefDecl):
            claim(stmt.name, "def")
            seen = set()
            for p in stmt.params:
                if p.name in seen:
                    raise ProgramError(f"parameter '{p.name}' repeated", p.span)
                seen.add(p.name)
            info.defs[stmt.name.name] = stmt
        elif isinstance(stmt, ast.OutDecl):
            info.outputs.extend(stmt.names)
        elif isinstance(stmt, ast.MetricDecl):
            info.metrics.extend(stmt.names)

    for name, spec in (env_overrides or {}).items():
        if name not in info.envs:
            first = next((e.decl.name.span for e in info.envs.values()), None)
            raise ProgramError(
                f"--env {name}={spec}: the program has no env '{name}'"
                + did_you_mean(name, info.envs),
                first,
            )

    for p in info.params.values():
        _collect_params(info, p)

    for stmt in program.statements:
        if isinstance(stmt, ast.Equation):
            eq = EquationInfo(len(info.equations), stmt, [_lhs(info, e) for e in stmt.lhs])
            for lhs in eq.lhs:
                if lhs.tensor not in info.tensors:
                    if lhs.tensor in taken:
                        raise ProgramError(
                            f"'{lhs.tensor}' is a {taken[lhs.tensor]}; only tensors and params "
                            "are defined by equations",
                            lhs.span,
                        )
                    info.tensors[lhs.tensor] = TensorInfo(lhs.tensor, lhs.span)
                info.tensors[lhs.tensor].definitions.append((eq, eq.lhs.index(lhs)))
            names = [l.tensor for l in eq.lhs]
            for k, n in enumerate(names):
                if n in names[:k]:
                    raise ProgramError(
                        f"'{n}' appears twice on the left of one equation", eq.lhs[k].span
                    )
            info.equations.append(eq)

    for t in info.tensors.values():
        if len(t.definitions) > MAX_EQUATIONS:
            eq, pos = t.definitions[MAX_EQUATIONS]
            raise ProgramError(
                f"'{t.name}' has {len(t.definitions)} equations; timerlc takes at most "
                f"{MAX_EQUATIONS} for one tensor (the points of each exclude those of every "
                "earlier one): fold the cases into fewer equations with where(...)",
                eq.lhs[pos].span,
            )
        _assign_dims(info, t)
    for eq in info.equations:
        _iteration_domain(info, eq)
    for t in info.tensors.values():
        _count_comparisons(t)
    for t in info.tensors.values():
        _defined_points(info, t)
    _check_tuple_equations(info)
    for eq in info.equations:
        _effective_iteration_domain(info, eq)

    for ident in info.outputs + info.metrics:
        if ident.name not in info.tensors:
            what = taken.get(ident.name)
            raise ProgramError(
                f"'{ident.name}' is {'a ' + what if what else 'not defined'}; out and metric name "
                "tensors" + ("" if what else did_you_mean(ident.name, info.tensors)),
                ident.span,
            )
    return info


def _env(info: ProgramInfo, decl: ast.EnvDecl, override: str | None, base=None) -> EnvInfo:
    from timerlc.envs import EnvError, describe
    from timerlc.frontend import envrtl

    if decl.batch.name not in info.dims:
        raise ProgramError(
            f"unknown dim '{decl.batch.name}'" + did_you_mean(decl.batch.name, info.dims),
            decl.batch.span,
        )
    spec = override if override is not None else decl.plugin
    try:
        attrs = envrtl.load(spec, base) if envrtl.is_rtl(spec) else describe(spec)
    except EnvError as e:
        where = f"--env {decl.name.name}={spec}" if override is not None else f'"{spec}"'
        raise ProgramError(
            f"environment '{decl.name.name}' ({where}): {e.message}", decl.name.span
        ) from None
    return EnvInfo(decl, spec, attrs, decl.batch.name)


def _collect_params(info: ProgramInfo, p: ast.ParamsDecl):
    dims = []
    for d in p.dims:
        if d.name not in info.dims:
            raise ProgramError(f"unknown dim '{d.name}'" + did_you_mean(d.name, info.dims), d.span)
        if dims and info.dims[d.name].order <= info.dims[dims[-1]].order:
            raise ProgramError(
                f"the dims of '{p.name.name}' must follow the declaration order "
                f"({', '.join(info.dims)})",
                d.span,
            )
        dims.append(d.name)
    names = set()
    for f in p.fields:
        if f.name.name in names:
            raise ProgramError(f"field '{f.name.name}' repeated", f.name.span)
        names.add(f.name.name)
        field_type(info, f.type)
    if not p.fields:
        raise ProgramError(f"params '{p.name.name}' has no fields", p.name.span)
    t = TensorInfo(p.name.name, p.name.span, tuple(dims), params=p)
    init = EquationInfo(
        -1,
        None,
        [Lhs(p.name.name, tuple(LhsEntry(None, 0, d.span) for d in p.dims), p.name.span)],
        params=p,
    )
    t.definitions.append((init, 0))
    info.tensors[p.name.name] = t


def field_type(info: ProgramInfo, t: ast.TypeExpr) -> TensorType:
    if t.dtype.name not in DTYPES:
        raise ProgramError(
            f"unknown dtype '{t.dtype.name}' (dtypes: {', '.join(DTYPES)})"
            + did_you_mean(t.dtype.name, DTYPES),
            t.dtype.span,
        )
    shape = shape_entries(t.shape, info.scope(), "a shape entry")
    for n, s in zip(shape, t.shape):
        if n < 0:
            raise ProgramError(f"a shape entry must not be negative, got {n}", s.span)
    return TensorType(t.dtype.name, tuple(shape))


def _lhs(info: ProgramInfo, expr: ast.Expr) -> Lhs:
    if isinstance(expr, ast.Name):
        return Lhs(expr.id, (), expr.span)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
        entries = []
        for item in expr.items:
            entry = _lhs_entry(info, item)
            if entry.dim is not None and any(e.dim == entry.dim for e in entries):
                raise ProgramError(
                    f"dim '{entry.dim}' is used twice on the left side of '{expr.value.id}'",
                    item.span,
                )
            entries.append(entry)
        return Lhs(expr.value.id, tuple(entries), expr.value.span)
    raise ProgramError(
        "the left side of an equation must be a tensor name, optionally indexed like x[i, t+1]",
        expr.span,
    )


_LHS_FORM = "a left-hand index must be a dim with a constant offset (t, t+1, t-2) or a constant"


def _lhs_entry(info: ProgramInfo, item: ast.Expr) -> LhsEntry:
    if isinstance(item, ast.Slice):
        raise ProgramError("a slice cannot appear on the left of an equation", item.span)
    try:
        e = to_index(item, info.scope(iterated=frozenset(info.dims)))
    except NotIndex as err:
        raise ProgramError(f"{_LHS_FORM} ({err.reason})", err.span) from None
    if e.is_Integer:
        if int(e) < 0:
            raise ProgramError(f"a left-hand index must not be negative, got {int(e)}", item.span)
        return LhsEntry(None, int(e), item.span)
    syms = list(e.free_symbols)
    if len(syms) == 1:
        off = ix.affine_offset(e, syms[0].name)
        if off is not None:
            return LhsEntry(syms[0].name, off, item.span)
    raise ProgramError(_LHS_FORM, item.span)


def _assign_dims(info: ProgramInfo, t: TensorInfo):
    """Position k of a tensor stands for the dim named there by any of its equations."""
    first_eq, first_pos = t.definitions[0]
    first = first_eq.lhs[first_pos]
    arity = len(first.entries)
    named: list[tuple[str, LhsEntry] | None] = [None] * arity
    if t.params is not None:
        named = [(d.name, LhsEntry(d.name, 0, d.span)) for d in t.params.dims]
    for eq, pos in t.definitions:
        lhs = eq.lhs[pos]
        if len(lhs.entries) != arity:
            where = "its params declaration" if t.params is not None else f"line {first.span.line}"
            raise ProgramError(
                f"'{t.name}' has {arity} {'dim' if arity == 1 else 'dims'} ({where}) "
                f"but is indexed with {len(lhs.entries)} here",
                lhs.span,
            )
        for k, e in enumerate(lhs.entries):
            if e.dim is None:
                continue
            if named[k] is None:
                named[k] = (e.dim, e)
            elif named[k][0] != e.dim:
                other = named[k][1]
                where = f" (line {other.span.line})" if other.span else ""
                raise ProgramError(
                    f"position {k + 1} of '{t.name}' is dim '{named[k][0]}'{where}, not '{e.dim}'",
                    e.span,
                )
    for k, n in enumerate(named):
        if n is None:
            raise ProgramError(
                f"position {k + 1} of '{t.name}' is never named by a dim in any of its equations",
                first.entries[k].span or first.span,
            )
    dims = tuple(n[0] for n in named)
    for k in range(1, len(dims)):
        if info.dims[dims[k]].order <= info.dims[dims[k - 1]].order:
            # point at an equation that writes them in this order
            span = named[k][1].span
            for eq, pos in t.definitions:
                lhs = eq.lhs[pos]
                if lhs.entries[k].dim is not None:
                    span = lhs.entries[k].span
                    break
            raise ProgramError(
                f"dims out of canonical order: '{t.name}' has '{dims[k]}' after '{dims[k - 1]}', "
                f"but the dims are declared in the order {', '.join(info.dims)}",
                span,
            )
    t.dims = dims


def _iteration_domain(info: ProgramInfo, eq: EquationInfo):
    used = [frozenset(e.dim for e in l.entries if e.dim is not None) for l in eq.lhs]
    for k, u in enumerate(used[1:], 1):
        if u != used[0]:
            raise ProgramError(
                "all left sides of a tuple equation must use the same dims "
                f"({', '.join(info.canonical(used[0])) or 'none'} vs "
                f"{', '.join(info.canonical(u)) or 'none'})",
                eq.lhs[k].span,
            )
    eq.iter_dims = info.canonical(used[0])
    cond = info.box(eq.iter_dims)
    eq.comparisons = 0
    if eq.stmt is not None and eq.stmt.when is not None:
        when = to_condition(eq.stmt.when, info.scope(iterated=frozenset(eq.iter_dims)))
        eq.comparisons = sum(1 for x in sympy.preorder_traversal(when) if x.is_Relational)
        cond = sympy.And(cond, when)
    eq.iter_cond = cond


def _count_comparisons(t: TensorInfo):
    """At most ``MAX_COMPARISONS`` comparisons in the ``when`` conditions of ``t``'s
    equations, all together (a tuple equation's count for each of its tensors)."""
    total = 0
    for eq, _ in t.definitions:
        total += eq.comparisons
        if total > MAX_COMPARISONS:
            raise ProgramError(
                f"the 'when' conditions of '{t.name}' hold {total} comparisons up to this "
                f"one; timerlc takes at most {MAX_COMPARISONS} for one tensor: a set of points "
                "is often one comparison (t % 3 == 0 for t == 0 or t == 3 or ...)",
                eq.stmt.when.span,
            )


def _defined_points(info: ProgramInfo, t: TensorInfo):
    earlier = []
    for eq, pos in t.definitions:
        lhs = eq.lhs[pos]
        if eq.stmt is None:  # params initializers: every dim at 0
            defined = sympy.And(*[sympy.Eq(ix.sym(d), 0) for d in t.dims])
        else:
            shift = {e.dim: ix.sym(e.dim) - e.offset for e in lhs.entries if e.dim is not None}
            consts = [
                sympy.Eq(ix.sym(d), e.offset) for d, e in zip(t.dims, lhs.entries) if e.dim is None
            ]
            defined = sympy.And(ix.substitute(eq.iter_cond, shift), *consts)
            if pisl.is_empty(t.dims, defined):
                raise ProgramError(
                    f"this equation defines no point of '{t.name}': its domain is empty"
                    f"{_at_sizes(info, t)}",
                    lhs.span,
                )
            for d, e in zip(t.dims, lhs.entries):
                if e.dim is None:
                    continue
                neg = sympy.And(defined, ix.sym(d) < 0)
                if not pisl.is_empty(t.dims, neg):
                    p = pisl.sample(pisl.cond_set(t.dims, neg), t.dims)
                    at = {k: v for k, v in p.items()}
                    at[d] = p[d] - e.offset
                    raise ProgramError(
                        f"'{t.name}' would be defined at {d}={p[d]} (from {d}={p[d] - e.offset}); "
                        "defined points must not be negative",
                        e.span,
                    )
        effective = sympy.And(defined, *[sympy.Not(c) for c in earlier]) if earlier else defined
        if eq.stmt is not None and pisl.is_empty(t.dims, effective):
            t.shadowed.add(len(earlier))
            if len(eq.lhs) == 1:
                raise _shadowed_error(t, len(earlier), info)
        t.defined.append(defined)
        t.effective.append(effective)
        earlier.append(defined)
    t.domain = pisl.simplify(t.dims, sympy.Or(*t.defined))
    t.extents = pisl.extents(t.dims, t.domain)
    # a merge evaluates branch conditions only inside its domain: state them relative to it
    t.branch_conds = [pisl.simplify(t.dims, c, t.domain) for c in t.effective]


def _at_sizes(info: ProgramInfo, t: TensorInfo) -> str:
    """The bounds of ``t``'s dims, for an error that a config's value may have caused (PPO
    with ``total_steps`` of one iteration: ``dim i < 1``, where ``run[i, b, 0]`` for i >= 1
    defines nothing)."""
    if not t.dims:
        return ""
    bounds = ", ".join(f"{d} < {info.dims[d].bound}" for d in t.dims)
    return f", with dim{'s' if len(t.dims) > 1 else ''} {bounds}"


def _shadowed_error(t: TensorInfo, k: int, info: ProgramInfo) -> ProgramError:
    lines = sorted({e.line for e, _ in t.definitions[:k] if e.stmt is not None})
    where = (
        f" (line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})"
        if lines
        else " (its initializers)"
    )
    eq, pos = t.definitions[k]
    return ProgramError(
        f"this equation defines no point of '{t.name}': every point it would define "
        f"is defined by an earlier equation{where}{_at_sizes(info, t)}",
        eq.lhs[pos].span,
    )


def _check_tuple_equations(info: ProgramInfo):
    """A tuple equation shadowed for some of its tensors still defines the others."""
    for eq in info.equations:
        if len(eq.lhs) < 2:
            continue
        ks = []
        for lhs in eq.lhs:
            t = info.tensors[lhs.tensor]
            k = next(i for i, (e, _) in enumerate(t.definitions) if e is eq)
            if k not in t.shadowed:
                break
            ks.append((t, k))
        else:
            raise _shadowed_error(*ks[0], info)


def _effective_iteration_domain(info: ProgramInfo, eq: EquationInfo):
    parts = []
    for lhs in eq.lhs:
        t = info.tensors[lhs.tensor]
        k = next(i for i, (e, _) in enumerate(t.definitions) if e is eq)
        at = lhs.tensor_expr(t.dims)
        earlier = [ix.substitute(c, at) for c in t.defined[:k]]
        parts.append(sympy.And(eq.iter_cond, *[sympy.Not(c) for c in earlier]))
    eq.eff_cond = pisl.simplify(eq.iter_dims, sympy.Or(*parts))
