"""Loading a plan: the ``plan.json`` that ``timerlc compile`` writes (``docs/plan.md``).

``timerlc.plan.items`` reads the file and checks its structure (types, ranges, sizes, ids,
names, expressions); this module then checks that this runtime can run it: every op is one
it has a kernel for (or a merge, or an environment call), with the number of inputs and
outputs the op takes and the attributes its kernel reads, of the kinds it expects (the op's
record in ``timerlc.ops``); every environment is found by the same plugin rules, with the
same errors, as the program's ``env`` lines. A plan that fails is refused with a
``PlanError`` naming the field. Nothing in a plan is evaluated: expressions are data
(``timerlc.plan.expr``), and no name in it reaches Python but the environment plugins it
names (a build folder is as trusted as its program for those, and for nothing else).
"""

from __future__ import annotations

import math
from pathlib import Path

from timerlc import ops
from timerlc.ops.random import INITS
from timerlc.plan import expr as px
from timerlc.plan.items import (
    DTYPES,
    MAX_ELEMENTS,
    MAX_EXTENT,
    MAX_RANK,
    Ix,
    Plan,
    PlanError,
    Slice,
    Statement,
    loads,
)
from timerlc.types import TensorType

__all__ = ["PlanError", "load_plan", "load_kernels", "check_runnable"]

MAX_PLAN_BYTES = 1 << 30  # a plan.json larger than this is refused unread


def load_plan(path) -> Plan:
    """The plan at ``path`` (a build folder or its ``plan.json``), checked."""
    path = Path(path)
    if path.is_dir():
        path = path / "plan.json"
    missing = f"no plan at {path} (run `timerlc compile` first)"
    text = _read_text(path, MAX_PLAN_BYTES, "plan", missing)
    plan = loads(text, str(path))
    check_runnable(plan, str(path))
    return plan


MAX_KERNEL_BYTES = 1 << 28  # a kernel file larger than this is refused unread


def load_kernels(folder, plan: Plan) -> str | None:
    """The text of the plan's kernel file in the build ``folder`` (None if the plan has no
    kernels), checked to be the file the plan was compiled with (``PlanError`` if not)."""
    from timerlc.runtime.native import check_kernels

    if plan.kernels is None:
        return None
    path = Path(folder) / plan.kernels.file
    missing = f"{path} is missing: compile the program again"
    text = _read_text(path, MAX_KERNEL_BYTES, "kernel file", missing)
    check_kernels(plan, text, str(Path(folder)))
    return text


def _read_text(path: Path, limit: int, what: str, missing: str) -> str:
    """A file of the build as text (``PlanError``: missing, unreadable, larger than
    ``limit`` bytes, which is refused unread, or not UTF-8)."""
    try:
        size = path.stat().st_size
        if size > limit:
            raise PlanError(f"{path} is not a valid {what}: {size} bytes (at most {limit})")
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise PlanError(missing) from None
    except OSError as e:
        raise PlanError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path} is not a valid {what}: not UTF-8 text") from None


def check_runnable(plan: Plan, where: str = "plan") -> None:
    """``PlanError`` unless this runtime can run every node and environment of ``plan``."""
    env_names = {e.name for e in plan.envs}
    for k, s in enumerate(plan.statements):
        earlier: dict = {}
        for j, n in enumerate(s.nodes):
            field = f"statements[{k}].nodes[{j}]"
            try:
                _check_node(plan, s, n, env_names)
                _check_type(plan, s, n, earlier)
            except ValueError as e:
                raise PlanError(f"{where} is not a valid plan at {field}: {e}") from None
            earlier[n.id] = n
    _check_envs(plan, where)
    from timerlc.codegen.envs import FORMS
    from timerlc.envs.registry import parse_spec

    generated = {e.name for e in plan.envs if parse_spec(e.spec)[0] in FORMS}
    for k, (sid, _, _) in enumerate(plan.kernels.statements if plan.kernels else ()):
        node = plan.statement(sid).node
        if ops.is_env(node.op) and node.attr_dict().get("env") not in generated:
            raise PlanError(
                f"{where} is not a valid plan at kernels.statements[{k}]: statement {sid} "
                "calls an environment that is a plugin, which no kernel does"
            )


def _check_node(plan: Plan, s: Statement, n, env_names: set[str]):
    op = ops.REGISTRY.get(n.op)
    if op is None or (op.kernel is None and op.name != "merge" and op.kind != "env"):
        raise ValueError(f"unknown op {n.op!r}")
    if op.arity is not None and len(n.inputs) != op.arity:
        raise ValueError(f"{n.op} takes {op.arity} inputs, this node has {len(n.inputs)}")
    if len(n.types) != op.outputs:
        raise ValueError(f"{n.op} has {op.outputs} outputs, this node declares {len(n.types)}")
    if op.kernel is None and n.id != s.id:  # the runtime runs these as whole statements
        raise ValueError(f"a {n.op} is the statement's own node")
    if n.op == "merge":
        if not n.inputs:
            raise ValueError("a merge has at least one input")
    elif any(r.cond is not None for r in n.inputs):
        raise ValueError("only a merge's inputs have conditions")
    _check_attrs(n.op, dict(n.attrs), op.attrs, s, env_names)


def _check_type(plan: Plan, s: Statement, n, earlier: dict):
    """The node's types are what its op's type rule gives for the types of its reads (so a
    kernel makes exactly what the plan's sizes allow); ``earlier``: the statement's nodes so
    far. Environment calls are typed by the front end: their records have no rule."""
    if ops.get(n.op).kind == "env":
        return
    ins = [_read_type(plan, r, earlier) for r in n.inputs]
    try:
        t = ops.infer(n.op, dict(n.attrs, _name=n.op), ins)
    except (ops.TypeRuleError, ValueError, TypeError, IndexError, KeyError, MemoryError) as e:
        raise ValueError(f"its inputs do not fit {n.op}: {e}") from None
    declared = tuple(TensorType(o.dtype, o.shape) for o in n.types)
    if (t,) != declared:
        raise ValueError(f"{n.op} gives {t}, the node declares {', '.join(map(str, declared))}")


def _read_type(plan: Plan, r, earlier: dict) -> TensorType:
    """The type a read delivers: one leading axis per slice (its length, or its text where
    it depends on the point), then the source's."""
    if not r.stored:
        o = earlier[r.src].types[r.out]
        return TensorType(o.dtype, o.shape)
    o = plan.buffer(r.src).outputs[r.out]
    lengths = []
    for a in r.access:
        if isinstance(a, Slice):
            n = px.difference(a.hi, a.lo)
            lengths.append(px.text(("sub", a.hi, a.lo)) if n is None else n)
    return TensorType(o.dtype, tuple(lengths) + o.shape)


def _check_attrs(op: str, attrs: dict, kinds: dict[str, str], s: Statement, envs: set[str]):
    unknown = sorted(set(attrs) - set(kinds))
    if unknown:
        raise ValueError(f"{op} has no attribute {unknown[0]!r}")
    for name, kind in kinds.items():
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if name not in attrs:
            if optional:
                continue
            raise ValueError(f"{op} needs attribute {name!r}")
        v = attrs[name]
        if optional and v is None:
            continue
        if not _CHECKS[kind](v, s, envs):
            raise ValueError(f"attribute {name!r} of {op} is not {_WHAT[kind]}: {_short(v)}")


def _short(v) -> str:
    return px.clip(repr(v), 60)


def _is_int(v, lo: int = -MAX_EXTENT, hi: int = MAX_EXTENT) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _ints(v) -> bool:
    return isinstance(v, tuple) and len(v) <= MAX_RANK and all(_is_int(x) for x in v)


def _shape(v) -> bool:
    return (
        isinstance(v, tuple)
        and len(v) <= MAX_RANK
        and all(_is_int(x, 0) for x in v)
        and math.prod(v) <= MAX_ELEMENTS
    )


def _const(v, depth: int = 0) -> bool:
    if isinstance(v, tuple):
        return depth < 4 and all(_const(x, depth + 1) for x in v)
    return isinstance(v, (bool, int, float))


def _ix(v, s: Statement) -> bool:
    # an Ix's names were checked against the statement's dims when the plan was read
    return _is_int(v, -(1 << 40), 1 << 40) or isinstance(v, Ix)


def _items(v, s: Statement) -> bool:
    if not isinstance(v, tuple) or len(v) > MAX_RANK:
        return False
    for it in v:
        if not isinstance(it, tuple) or not it:
            return False
        if it == ("full",) or it == ("gather",):
            continue
        if it[0] == "int" and len(it) == 2 and _ix(it[1], s):
            continue
        if it[0] == "slice" and len(it) == 3 and _ix(it[1], s) and _is_int(it[2], 0):
            continue
        return False
    return True


def _space(v, s: Statement) -> bool:
    return (
        isinstance(v, tuple)
        and len(v) <= MAX_RANK
        and all(
            isinstance(p, tuple) and len(p) == 2 and p[0] in s.dims and _is_int(p[1], 0) for p in v
        )
    )


_CHECKS = {
    "dtype": lambda v, s, e: isinstance(v, str) and v in DTYPES,
    "shape": lambda v, s, e: _shape(v),
    "int": lambda v, s, e: _is_int(v, -(1 << 63), (1 << 64) - 1),
    "ints": lambda v, s, e: _ints(v),
    "axes": lambda v, s, e: v is None or _is_int(v) or _ints(v),
    "bool": lambda v, s, e: isinstance(v, bool),
    "float": lambda v, s, e: isinstance(v, (int, float)) and not isinstance(v, bool),
    "const": lambda v, s, e: _const(v),
    "dim": lambda v, s, e: isinstance(v, str) and v in s.dims,
    "ix": lambda v, s, e: _ix(v, s),
    "items": lambda v, s, e: _items(v, s),
    "space": lambda v, s, e: _space(v, s),
    "init": lambda v, s, e: v in INITS,
    "env": lambda v, s, e: isinstance(v, str) and v in e,
    "key": lambda v, s, e: isinstance(v, tuple) and all(_ix(x, s) for x in v),
    "names": lambda v, s, e: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
}
_WHAT = {
    "dtype": f"a dtype ({', '.join(DTYPES)})",
    "shape": "a shape",
    "int": "an integer",
    "ints": "a list of integers",
    "axes": "an axis or a list of axes",
    "bool": "true or false",
    "float": "a number",
    "const": "a number, a bool or lists of them",
    "dim": "a dim of the statement",
    "ix": "an index expression over the statement's dims",
    "items": "a list of index items",
    "space": "a list of [dim, bound] pairs over the statement's dims",
    "init": f"an initializer ({', '.join(INITS)})",
    "env": "an environment of the plan",
    "key": "a list of index expressions",
    "names": "a list of names",
}


def _check_envs(plan: Plan, where: str):
    """Each environment's plugin is found, and describes itself, as the program's ``env``
    line would (the same rules and errors), and still gives observations of the shape the
    plan was compiled for."""
    from timerlc.envs import EnvError, describe

    for k, e in enumerate(plan.envs):
        at = f"{where} is not a valid plan at envs[{k}]: environment '{e.name}' ({e.spec})"
        try:
            spec = describe(e.spec)
        except EnvError as err:
            raise PlanError(f"{at}: {err.message}") from None
        obs = (e.num_envs,) + tuple(spec.obs_shape)
        for s in plan.statements:
            n = s.node
            if ops.is_env(n.op) and dict(n.attrs).get("env") == e.name and n.types[0].shape != obs:
                raise PlanError(
                    f"{at} gives observations of shape {list(obs)}, the plan was compiled for "
                    f"{list(n.types[0].shape)}: compile the program again"
                )
