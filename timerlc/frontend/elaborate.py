"""Elaboration: RTL expressions -> PDG nodes of one equation, with types checked.

The elaborator walks the right side of an equation at the equation's iteration domain.
Each operation becomes a node over that domain; a read of a tensor becomes an input edge
whose access says which points it reads. Literals and configs stay Python numbers as long
as possible (weak scalars) and get the dtype of the value they meet. ``def`` calls are
inlined. Dtype promotion and broadcasting follow LANGUAGE.md section 5.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from timerlc.diagnostics import ProgramError, Span, did_you_mean
from timerlc.frontend import ast
from timerlc.frontend.builtins import BUILTINS, bind_arguments
from timerlc.frontend.declarations import ProgramInfo
from timerlc.frontend.envcalls import env_call
from timerlc.frontend.subscripts import Subscripts
from timerlc.frontend.values import (
    RecordVal,
    TupleVal,
    Val,
    dynamic_slice_error,
)
from timerlc import ops
from timerlc.ir.builder import NodeBuilder
from timerlc.ir.pdg import (
    SCALAR_DOMAIN,
    Domain,
    Edge,
    identity_access,
    make_attrs,
)
from timerlc.types import DTYPES, TensorType, is_float, promote

# reductions that may take a dynamic slice directly (LANGUAGE.md section 5)
DYNAMIC_OK = frozenset({"sum", "mean", "max", "min", "logsumexp", "discounted_sum"})

ARITH_OPS = {
    "+": "add",
    "-": "sub",
    "*": "mul",
    "/": "div",
    "//": "floordiv",
    "%": "mod",
    "**": "pow",
}
COMPARE_OPS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


Builder = NodeBuilder  # the front end builds with the IR builder


@dataclass
class Locals:
    """The names bound inside a def body (or nothing, at the top of an equation)."""

    values: dict = field(default_factory=dict)
    calls: tuple[str, ...] = ()  # the defs being inlined, outermost first

    def names(self) -> frozenset:
        return frozenset(self.values)


_INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}


def weak_dtype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "i32"
    return "f32"


class Elaborator(Subscripts):
    def __init__(
        self, info: ProgramInfo, types: dict, merge_ids: dict[str, int], builder: Builder
    ):
        self.info = info
        self.types = types  # tensor name -> TensorType | RecordType | None
        self.merge_ids = merge_ids  # tensor name or "rec.field" -> merge node id
        self.builder = builder
        self.domain: Domain = SCALAR_DOMAIN
        self.iterated: frozenset = frozenset()
        self._dimvals: dict[str, int] = {}
        self._window_casts: dict[tuple[int, str], int] = {}  # (tensor node, dtype) -> cast
        self.draw_key = None  # (seed, site) of every draw while set: an env's function

    # ------------------------------------------------------------------ context
    def enter(self, domain: Domain, first_lhs=None, site: str = ""):
        """Elaborate in ``domain``; ``first_lhs`` is (Lhs, tensor dims) of the equation's first
        left side, ``site`` names the equation for the random draws it makes."""
        self.domain = domain
        self.iterated = frozenset(domain.dims)
        self._dimvals = {}
        self.first_lhs = first_lhs
        self.site = site
        self.draws = 0
        self.env_calls: set[str] = set()

    def scope(self, env: Locals, allow_dims: bool = True):
        return self.info.scope(self.iterated if allow_dims else None, env.names())

    # ------------------------------------------------------------------ values -> nodes
    def const(
        self, value, dtype: str | None = None, shape=(), weak: bool | None = None, span=None
    ) -> Val:
        dtype = dtype or weak_dtype(value)
        if weak is None:
            weak = shape == ()
        return Val(TensorType(dtype, tuple(shape)), weak=weak, const=value, span=span)

    def materialize(self, v: Val) -> Val:
        if v.const is None:
            return v
        if v.dtype in _INT_RANGE and not isinstance(v.const, float):
            lo, hi = _INT_RANGE[v.dtype]
            if not lo <= int(v.const) <= hi:
                raise ProgramError(f"the value {v.const} does not fit in {v.dtype}", v.span)
        nid = self.builder.const(_cast_py(v.const, v.dtype), v.dtype, v.shape, v.span)
        return Val(v.type, weak=v.weak, node=nid, span=v.span)

    def edge(self, v: Val) -> Edge:
        v = self.materialize(v)
        if v.edge is not None:
            return v.edge
        node = self.builder.nodes[v.node]
        return Edge(v.node, identity_access(node.dims), span=v.span)

    def node_of(self, v: Val) -> Val:
        """``v`` as a node of this equation (reads are copied in)."""
        if v.edge is None:
            return self.materialize(v)
        return self.apply("copy", [v], v.span)

    def apply(self, op: str, args: list[Val], span, weak: bool = False, **attrs) -> Val:
        if op not in DYNAMIC_OK:
            for a in args:
                if not a.type.is_static:
                    raise dynamic_slice_error(a.span or span)
        try:
            t = ops.infer(op, dict(attrs, _name=op), [a.type for a in args])
        except ops.TypeRuleError as e:
            raise ProgramError(str(e), span) from None
        domain = self.domain
        edges = [self.edge(a) for a in args]
        nid = self.builder.add(op, domain, edges, t, make_attrs(**attrs), span=span)
        return Val(t, weak=weak, node=nid, span=span)

    def cast(self, v: Val, dtype: str) -> Val:
        if v.dtype == dtype:
            return v
        if v.const is not None:
            return Val(
                v.type.with_dtype(dtype), weak=v.weak, const=_cast_py(v.const, dtype), span=v.span
            )
        if v.edge is not None and not v.type.is_static:
            return self._cast_window(v, dtype)
        return self.apply("cast", [v], v.span, dtype=dtype)

    def _cast_window(self, v: Val, dtype: str) -> Val:
        """A dynamic slice of an int or bool tensor, cast for a reduction (``mean`` of ints,
        ``sum`` of bools): the cast is made where the tensor is defined, one node per tensor
        and dtype, and the window reads it, so the reduction still gets the slice itself."""
        src = v.edge.src
        if not self.merge_ids:  # inferring types: no nodes yet
            return Val(v.type.with_dtype(dtype), weak=v.weak, edge=v.edge, span=v.span)
        key = next((k for k, nid in self.merge_ids.items() if nid == src), None)
        if key is None:
            raise dynamic_slice_error(v.span)
        nid = self._window_casts.get((src, dtype))
        if nid is None:
            name, _, fname = key.partition(".")  # "rec.field" for a params record's field
            t, ty = self.info.tensors[name], self.types[name]
            if fname:
                ty = dict(ty.fields)[fname]
            nid = self.builder.add(
                "cast",
                Domain(t.dims, t.domain),
                (Edge(src, identity_access(t.dims), span=v.span),),
                ty.with_dtype(dtype),
                make_attrs(dtype=dtype),
                span=v.span,
            )
            self._window_casts[(src, dtype)] = nid
        edge = dataclasses.replace(v.edge, src=nid)
        return Val(v.type.with_dtype(dtype), weak=v.weak, edge=edge, span=v.span)

    def to_float(self, v: Val) -> Val:
        return v if is_float(v.dtype) else self.cast(v, "f32")

    def to_number(self, v: Val) -> Val:
        return self.cast(v, "i32") if v.dtype == "bool" else v

    def to_bool(self, v: Val) -> Val:
        if v.dtype == "bool":
            return v
        if v.const is not None:
            return self.const(bool(v.const), "bool", v.shape, v.weak, v.span)
        return self.apply(
            "ne", [v, self.materialize(self.const(0, v.dtype, (), span=v.span))], v.span
        )

    def common(self, vals: list[Val]) -> tuple[str, bool]:
        """The dtype values combine into, and whether the result is weak."""
        strong = [v.dtype for v in vals if not v.weak]
        weak = [v.dtype for v in vals if v.weak]
        if not strong:
            return promote(*weak), True
        s = promote(*strong)
        if weak:
            w = promote(*weak)
            if is_float(w) and not is_float(s):
                s = "f32"
            elif w == "i32" and s == "bool":
                s = "i32"
        return s, False

    def unify(self, vals: list[Val], minimum: str | None = None) -> tuple[list[Val], bool]:
        dtype, weak = self.common(vals)
        if minimum == "number" and dtype == "bool":
            dtype = "i32"
        elif minimum == "float" and not is_float(dtype):
            dtype = "f32"
        return [self.cast(v, dtype) for v in vals], weak

    # ------------------------------------------------------------------ expressions
    def value(self, expr: ast.Expr, env: Locals):
        method = getattr(self, "_" + type(expr).__name__)
        return method(expr, env)

    def tensor_value(self, expr: ast.Expr, env: Locals, what: str = "this") -> Val:
        v = self.value(expr, env)
        if isinstance(v, RecordVal):
            raise ProgramError(f"{what} needs a tensor, got a record", expr.span)
        if isinstance(v, TupleVal):
            raise ProgramError(f"{what} needs a tensor, got a tuple of {len(v.items)}", expr.span)
        return v

    def _Int(self, expr: ast.Int, env):
        # the range is checked when the literal gets its dtype (an i64 or float context is fine)
        return self.const(expr.value, span=expr.span)

    def _Float(self, expr: ast.Float, env):
        return self.const(expr.value, span=expr.span)

    def _Bool(self, expr: ast.Bool, env):
        return self.const(expr.value, span=expr.span)

    def _Str(self, expr: ast.Str, env):
        raise ProgramError("a string is not a value", expr.span)

    def _ListLit(self, expr: ast.ListLit, env):
        raise ProgramError(
            "a list is only an argument (a shape, axes, or arrays to concat)", expr.span
        )

    def _TupleLit(self, expr: ast.TupleLit, env):
        return TupleVal(tuple(self.value(e, env) for e in expr.items), expr.span)

    def _Slice(self, expr: ast.Slice, env):
        raise ProgramError("a slice is only allowed inside brackets", expr.span)

    def _Name(self, expr: ast.Name, env: Locals):
        name = expr.id
        if name in env.values:
            v = env.values[name]
            return v.at(expr.span) if isinstance(v, Val) else v
        info = self.info
        if name in info.tensors:
            t = info.tensors[name]
            missing = [d for d in t.dims if d not in self.iterated]
            if missing:
                raise ProgramError(
                    f"'{name}' stands for {name}[{', '.join(t.dims)}], but this equation does not "
                    f"iterate {', '.join(missing)}; index it explicitly",
                    expr.span,
                )
            access = identity_access(t.dims)
            return self.read(t, access, (), expr.span)
        if name in info.configs:
            v = info.configs[name].value
            return self.const(v, span=expr.span)
        if name in info.dims:
            if name not in self.iterated:
                raise ProgramError(
                    f"this equation does not iterate dim '{name}' "
                    f"(it iterates {', '.join(self.domain.dims) or 'no dims'})",
                    expr.span,
                )
            if name not in self._dimvals:
                self._dimvals[name] = self.apply("dimval", [], expr.span, dim=name).node
            return Val(TensorType("i32", ()), node=self._dimvals[name], span=expr.span)
        if name in info.envs:
            raise ProgramError(
                f"'{name}' is an environment; use {name}.reset(), {name}.step(a) or its attributes",
                expr.span,
            )
        if name in info.defs or name in BUILTINS:
            raise ProgramError(f"'{name}' is a function; call it with (...)", expr.span)
        if name in DTYPES:
            raise ProgramError(f"'{name}' is a dtype; use {name}(x) to cast", expr.span)
        raise ProgramError(
            f"unknown name '{name}'" + did_you_mean(name, self._visible_names(env)), expr.span
        )

    def _visible_names(self, env: Locals):
        info = self.info
        return (
            list(env.values)
            + list(info.tensors)
            + list(info.configs)
            + list(info.dims)
            + list(info.defs)
            + list(BUILTINS)
        )

    def _Unary(self, expr: ast.Unary, env: Locals):
        v = self.value(expr.operand, env)
        return self.map_fields(lambda a: self.unary(expr.op, a, expr.op_span), [v], expr.span)

    def unary(self, op: str, a: Val, span) -> Val:
        if op == "not":
            a = self.to_bool(a)
            if a.const is not None and a.shape == ():
                return self.const(not a.const, "bool", weak=a.weak, span=span)
            return self.apply("logical_not", [a], span, weak=a.weak)
        a = self.to_number(a)
        if op == "+":
            return a
        if a.const is not None and a.shape == ():
            return self.const(-a.const, a.dtype, weak=a.weak, span=span)
        return self.apply("neg", [a], span, weak=a.weak)

    def _Binary(self, expr: ast.Binary, env: Locals):
        a = self.value(expr.left, env)
        b = self.value(expr.right, env)
        return self.map_fields(
            lambda x, y: self.binary(expr.op, x, y, expr.op_span), [a, b], expr.span, expr.op_span
        )

    def binary(self, op: str, a: Val, b: Val, span) -> Val:
        if op in ("and", "or"):
            a, b = self.to_bool(a), self.to_bool(b)
            if a.const is not None and b.const is not None and a.shape == b.shape == ():
                v = (a.const and b.const) if op == "and" else (a.const or b.const)
                return self.const(bool(v), "bool", weak=a.weak and b.weak, span=span)
            return self.apply(
                "logical_and" if op == "and" else "logical_or",
                [a, b],
                span,
                weak=a.weak and b.weak,
            )
        if op == "@":
            (a, b), weak = self.unify([a, b], "number")
            return self.apply("matmul", [a, b], span)
        (a, b), weak = self.unify([a, b], "float" if op == "/" else "number")
        if a.const is not None and b.const is not None and a.shape == b.shape == ():
            r = _fold(op, a.const, b.const, a.dtype, span)
            if isinstance(r, float) and not is_float(a.dtype):
                return self.const(r, "f32", weak=weak, span=span)  # 2 ** -1 is 0.5, as in Python
            if not weak and a.dtype in _INT_RANGE:
                r = _wrap(int(r), a.dtype)  # a strong integer wraps around, as a tensor would
            return self.const(r, a.dtype, weak=weak, span=span)
        return self.apply(ARITH_OPS[op], [a, b], span, weak=weak)

    def compare(self, op: str, a: Val, b: Val, span) -> Val:
        (a, b), weak = self.unify([a, b])
        if a.const is not None and b.const is not None and a.shape == b.shape == ():
            v = {
                "<": a.const < b.const,
                "<=": a.const <= b.const,
                ">": a.const > b.const,
                ">=": a.const >= b.const,
                "==": a.const == b.const,
                "!=": a.const != b.const,
            }[op]
            return self.const(bool(v), "bool", weak=weak, span=span)
        return self.apply(COMPARE_OPS[op], [a, b], span, weak=weak)

    def _Compare(self, expr: ast.Compare, env: Locals):
        operands = [self.value(e, env) for e in expr.operands]
        result = None
        for k, op in enumerate(expr.ops):
            part = self.map_fields(
                lambda x, y, op=op, k=k: self.compare(op, x, y, expr.op_spans[k]),
                [operands[k], operands[k + 1]],
                expr.span,
            )
            result = (
                part
                if result is None
                else self.map_fields(
                    lambda x, y: self.binary("and", x, y, expr.span), [result, part], expr.span
                )
            )
        return result

    def map_fields(self, fn, vals: list, span, op_span=None):
        """Apply ``fn`` to tensors, or field by field when some operands are records."""
        for v in vals:
            if isinstance(v, TupleVal):
                raise ProgramError(
                    f"a tuple of {len(v.items)} values cannot be used here", v.span or span
                )
        records = [v for v in vals if isinstance(v, RecordVal)]
        if not records:
            return fn(*vals)
        names = records[0].names
        for r in records[1:]:
            if r.names != names:
                raise ProgramError(
                    f"records with different fields ({', '.join(names)}) and "
                    f"({', '.join(r.names)})",
                    op_span or span,
                )
        fields = []
        for n in names:
            args = [v.field(n) if isinstance(v, RecordVal) else v for v in vals]
            fields.append((n, fn(*args)))
        return RecordVal(tuple(fields), span)

    # ------------------------------------------------------------------ calls
    def _Call(self, expr: ast.Call, env: Locals):
        func = expr.func
        if isinstance(func, ast.Attribute):
            if (
                isinstance(func.value, ast.Name)
                and func.value.id in self.info.envs
                and func.value.id not in env.values
            ):
                return env_call(self, self.info.envs[func.value.id], func.name, expr, env)
            raise ProgramError("only functions and defs can be called", func.span)
        if not isinstance(func, ast.Name):
            raise ProgramError("only functions and defs can be called", func.span)
        name = func.id
        if name.startswith("@"):  # an environment written in RTL (frontend.envrtl.desugar)
            from timerlc.frontend import envrtl

            return envrtl.expand(self, expr, env)
        if name in env.values:
            raise ProgramError(f"'{name}' is a local value, not a function", func.span)
        if name in self.info.defs:
            return self.inline(self.info.defs[name], expr, env)
        if name in self.info.tensors or name in self.info.configs or name in self.info.dims:
            raise ProgramError(f"'{name}' is not a function", func.span)
        builtin = BUILTINS.get(name)
        if builtin is None:
            raise ProgramError(
                f"unknown function '{name}'"
                + did_you_mean(name, list(BUILTINS) + list(self.info.defs)),
                func.span,
            )
        return builtin.call(self, expr, env)

    def inline(self, d: ast.DefDecl, call: ast.Call, env: Locals):
        name = d.name.name
        if name in env.calls:
            chain = " -> ".join(env.calls[env.calls.index(name) :] + (name,))
            raise ProgramError(
                f"recursive call of def '{name}' ({chain}); defs cannot recurse", call.func.span
            )
        params = [p.name for p in d.params]
        exprs = bind_arguments(f"'{name}'", params, params, call)
        bound = {p: self.value(exprs[p], env) for p in params}
        return self.inline_values(d, bound, env.calls)

    def inline_values(self, d: ast.DefDecl, bound: dict, calls: tuple):
        """The value of ``d``'s body with its parameters bound to the values ``bound``;
        ``calls``: the defs it is inlined through."""
        name = d.name.name
        inner = Locals(dict(bound), calls + (name,))
        if not d.body or d.body[-1].targets is not None:
            raise ProgramError(
                f"the body of '{name}' must end with an expression (its value)", d.name.span
            )
        for item in d.body[:-1]:
            if item.targets is None:
                raise ProgramError(
                    "only the last line of a def body is its value; bind this with name = ...",
                    item.span,
                )
            value = self.tuple_value(item.value, inner)
            self.bind(item.targets, value, inner, item.span)
        result = self.tuple_value(d.body[-1].value, inner)
        return result

    def tuple_value(self, exprs: tuple, env: Locals):
        if len(exprs) == 1:
            return self.value(exprs[0], env)
        return TupleVal(
            tuple(self.value(e, env) for e in exprs), Span.join(exprs[0].span, exprs[-1].span)
        )

    def bind(self, targets: tuple, value, env: Locals, span):
        for t in targets:
            if not isinstance(t, ast.Name):
                raise ProgramError("a def binding must assign plain names", t.span)
        if len(targets) == 1:
            env.values[targets[0].id] = value
            return
        if not isinstance(value, TupleVal) or len(value.items) != len(targets):
            n = len(value.items) if isinstance(value, TupleVal) else 1
            raise ProgramError(
                f"cannot unpack {n} value{'s' if n != 1 else ''} into {len(targets)} names", span
            )
        for t, v in zip(targets, value.items):
            env.values[t.id] = v


def _fold(op: str, a, b, dtype: str, span):
    """Arithmetic on two compile-time scalars: Python numbers, except that a float division
    by zero gives IEEE inf or nan (as a tensor op would); an integer one is an error."""
    if op == "+":
        r = a + b
    elif op == "-":
        r = a - b
    elif op == "*":
        r = a * b
    elif op == "/":
        r = a / b if b != 0 else _ieee_div(a)
    elif op in ("//", "%") and b == 0 and dtype not in ("f32", "f64"):
        raise ProgramError("integer division by zero in a constant expression", span)
    elif op == "//":
        if b == 0:
            r = _ieee_div(a)
        else:
            r = a // b
            r = float(r) if isinstance(a, float) or isinstance(b, float) else r
    elif op == "%":
        r = math.nan if b == 0 else a % b
    elif op == "**":
        try:
            r = a**b
        except ZeroDivisionError:
            r = math.inf
        except OverflowError:
            raise ProgramError("overflow in a constant expression", span) from None
        if isinstance(r, complex):
            r = math.nan
    else:
        raise AssertionError(op)
    return r


def _ieee_div(a) -> float:
    if a == 0 or a != a:
        return math.nan
    return math.copysign(math.inf, a)


def _wrap(v: int, dtype: str) -> int:
    lo, hi = _INT_RANGE[dtype]
    return (v - lo) % (hi - lo + 1) + lo


def _cast_py(value, dtype: str):
    if dtype == "bool":
        return bool(value)
    if dtype in ("i32", "i64"):
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                return 0
            return int(value)
        return int(value)
    return float(value)
