"""Environments written in RTL (LANGUAGE.md section 10; docs/envs.md).

An environment file holds configs, defs and three ``env`` declarations::

    env state { x : f64[4]; steps : i32[]; resets : i64[] }   # one instance's state
    env observation f32[4]                                     # E.obs_shape
    env actions 2                                              # or: env actions f32[1]
    def reset(s, k) { ... }        # the state after a reset of instance k
    def step(s, a, k) { ... }      # (state, reward, terminated, truncated)
    def observe(s) { ... }         # the observation of a state

A program binds one with ``env E = "path/to/env.rtl" batch b`` or ``"rtl:cartpole"``
(the built-ins' RTL forms, ``timerlc/envs/rtl``); ``?key=value`` options override the
file's configs.

Loading (``load``): parse the file, evaluate its configs with the options, check its defs
and declarations; the result is an ``RtlEnvSpec`` (the spaces the program's ``E.obs_dim``
and friends read, and the module).

Desugaring (``desugar``): the calls ``o[..] = E.reset()`` and
``o[..], r[..], done[..] = E.step(a)`` become equations of hidden tensors ``E.<field>``,
one per state field, over the dims of the calls' first output: the state after each
call. A call reads the state after the call before it in the environment's call order (the
points of the first outputs without the batch dim, lexicographically; LANGUAGE.md
section 10), found by isl as the lexicographic maximum of the earlier call points; each
piece of that predecessor map becomes one equation with its own ``when``. The first call
starts from the zero state; it must be a reset. The right side of each equation is an
internal call ``@E.reset``/``@E.step`` that the elaborator expands (``expand``) by inlining
the file's defs with the environment's own names: a step, then a reset of the instances
whose episode ended (``where``), then ``observe``. Outputs pass no gradient.

Random draws in the file's functions take their point from data (``uniform(...,
at=[k, c])``) and their key from the environment's stream: ``(site_id("env:E"),
seed32(seed))``, the key the Python built-ins' ``ResetStreams`` use, so that the RTL forms
draw the same initial states.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import islpy as isl
from gymnasium import spaces

from timerlc import rng
from timerlc.diagnostics import ProgramError, Source, Span, did_you_mean
from timerlc.envs.base import EnvError, EnvSpec
from timerlc.files import env_file
from timerlc.frontend import ast
from timerlc.frontend.envcalls import call_key, check_call
from timerlc.ir import index as ix
from timerlc.poly import isl as pisl
from timerlc.types import TensorType

RTL_PREFIX = "rtl:"
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "envs" / "rtl"
FUNCTIONS = {"reset": ("s", "k"), "step": ("s", "a", "k"), "observe": ("s",)}


@dataclass(frozen=True)
class RtlEnv:
    """A loaded environment file."""

    info: object  # a ProgramInfo: the file's configs and defs, nothing else
    state: tuple[tuple[str, TensorType], ...]  # (field, type), in declaration order

    @property
    def defs(self) -> dict:
        return self.info.defs


@dataclass(frozen=True)
class RtlEnvSpec(EnvSpec):
    """An ``EnvSpec`` whose environment is written in RTL."""

    rtl: RtlEnv | None = None


def is_rtl(spec: str) -> bool:
    name = spec.strip().partition("?")[0].strip()
    return name.startswith(RTL_PREFIX) or name.endswith(".rtl")


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.rtl"))


def _path(name: str, base: Path | None) -> Path:
    if name.startswith(RTL_PREFIX):
        short = name[len(RTL_PREFIX) :].strip()
        path = BUILTIN_DIR / f"{short}.rtl"
        if not short or not path.is_file():
            raise EnvError(
                f"there is no built-in environment in RTL named '{short}' (there are "
                f"{', '.join(builtin_names())})" + did_you_mean(short, builtin_names())
            )
        return path
    path = env_file(name, base)
    if not path.is_file():
        raise EnvError(f"environment file '{name}' not found")
    return path


def load(spec: str, base: Path | None = None) -> RtlEnvSpec:
    """The environment file a spec names; ``base``: the folder relative paths are tried in
    after the current directory (the program's). An unknown file or option is an
    ``EnvError``; an error in the file a ``ProgramError`` with a span in it."""
    from timerlc.envs.registry import parse_spec

    name, options = parse_spec(spec)
    path = _path(name, base)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise EnvError(f"cannot read environment file '{name}': {e}") from None
    source = Source(str(path), text)
    return _load(name, source, options)


def _load(name: str, source: Source, options: dict) -> RtlEnvSpec:
    from timerlc.frontend.configs import evaluate_configs
    from timerlc.frontend.declarations import ProgramInfo, declared_names, field_type
    from timerlc.frontend.defs import check_defs
    from timerlc.frontend.indexing import to_constant
    from timerlc.frontend.parser import parse

    try:
        program = with_source(parse(source.text), source)
    except ProgramError as e:
        raise _in(e, source) from None
    allowed = (ast.ConfigDecl, ast.DefDecl, ast.EnvStateDecl, ast.EnvAttrDecl)
    for stmt in program.statements:
        if not isinstance(stmt, allowed):
            raise ProgramError(
                "an environment file has configs, defs and env declarations only (docs/envs.md)",
                stmt.span or getattr(getattr(stmt, "name", None), "span", None),
            )
    overrides = {k: _option_text(v) for k, v in options.items()}
    try:
        configs = evaluate_configs(program, overrides)
    except ProgramError as e:
        if e.message.startswith("--set "):  # an option: report it as an --env problem
            raise EnvError(f"environment '{name}': option {e.message[6:]}") from None
        raise
    info = ProgramInfo(configs, {}, {}, {}, {}, {}, [], [], [])
    info.names = declared_names(program) | frozenset(configs)
    state, obs, act = None, None, None
    for stmt in program.statements:
        if isinstance(stmt, ast.DefDecl):
            if stmt.name.name in info.defs:
                raise ProgramError(f"def '{stmt.name.name}' is declared twice", stmt.name.span)
            info.defs[stmt.name.name] = stmt
        elif isinstance(stmt, ast.EnvStateDecl):
            if stmt.name.name != "state":
                raise ProgramError(
                    f"'env {stmt.name.name} {{...}}': the state is declared as 'env state {{...}}'",
                    stmt.name.span,
                )
            if state is not None:
                raise ProgramError("the state is declared twice", stmt.name.span)
            if not stmt.fields:
                raise ProgramError("the state has no fields", stmt.name.span)
            fields, seen = [], set()
            for f in stmt.fields:
                if f.name.name in seen:
                    raise ProgramError(f"state field '{f.name.name}' repeated", f.name.span)
                seen.add(f.name.name)
                fields.append((f.name.name, field_type(info, f.type)))
            state = tuple(fields)
        elif isinstance(stmt, ast.EnvAttrDecl):
            what = stmt.name.name
            if what == "observation":
                if obs is not None:
                    raise ProgramError("the observation is declared twice", stmt.name.span)
                dtype, shape = _type_of(info, stmt.value)
                if dtype != "f32":
                    raise ProgramError(
                        f"observations are f32 (LANGUAGE.md section 10), got {dtype}",
                        stmt.value.span,
                    )
                obs = spaces.Box(-float("inf"), float("inf"), shape, dtype="float32")
            elif what == "actions":
                if act is not None:
                    raise ProgramError("the actions are declared twice", stmt.name.span)
                if isinstance(stmt.value, ast.Subscript):
                    dtype, shape = _type_of(info, stmt.value)
                    if dtype != "f32":
                        raise ProgramError(
                            f"continuous actions are f32, got {dtype}", stmt.value.span
                        )
                    act = spaces.Box(-float("inf"), float("inf"), shape, dtype="float32")
                else:
                    n = to_constant(stmt.value, info.scope(), "a number of actions")
                    if n < 1:
                        raise ProgramError(
                            f"an environment needs at least 1 action, got {n}", stmt.value.span
                        )
                    act = spaces.Discrete(n)
            else:
                raise ProgramError(
                    f"unknown environment declaration 'env {what}' (there are env state, "
                    "env observation, env actions)"
                    + did_you_mean(what, ("observation", "actions")),
                    stmt.name.span,
                )
    end = _end(source)
    for what, value in (
        ("env state {...}", state),
        ("env observation", obs),
        ("env actions", act),
    ):
        if value is None:
            raise ProgramError(f"the environment file declares no '{what}'", end)
    for fn, params in FUNCTIONS.items():
        d = info.defs.get(fn)
        if d is None:
            raise ProgramError(f"the environment file has no 'def {fn}({', '.join(params)})'", end)
        if len(d.params) != len(params):
            raise ProgramError(
                f"'{fn}' takes {len(params)} parameters ({', '.join(params)}), got "
                f"{len(d.params)}",
                d.name.span,
            )
    check_defs(info)
    env = RtlEnv(info, state)
    return RtlEnvSpec(name, obs, act, env)


def _option_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _type_of(info, expr) -> tuple[str, tuple[int, ...]]:
    from timerlc.frontend.indexing import shape_entries
    from timerlc.types import DTYPES

    if not (isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name)):
        raise ProgramError("expected a type such as f32[4]", expr.span)
    dtype = expr.value.id
    if dtype not in DTYPES:
        raise ProgramError(f"unknown dtype '{dtype}'" + did_you_mean(dtype, DTYPES), expr.span)
    shape = shape_entries(expr.items, info.scope(), "a shape entry")
    if any(n < 1 for n in shape):
        raise ProgramError("a shape entry must be positive", expr.span)
    return dtype, tuple(shape)


def _end(source: Source) -> Span:
    from timerlc.frontend.parser import _end_span

    return dataclasses.replace(_end_span(source.text), source=source)


def _in(e: ProgramError, source: Source) -> ProgramError:
    span = e.span or Span(1, 1, 1, 2)
    if span.source is None:
        span = dataclasses.replace(span, source=source)
    return ProgramError(e.message, span, e.notes)


def with_source(node, source: Source):
    """``node`` (an AST) with every span marked as lying in ``source``."""
    if isinstance(node, Span):
        return dataclasses.replace(node, source=source)
    if isinstance(node, tuple):
        return tuple(with_source(x, source) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {}
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            w = with_source(v, source)
            if w is not v:
                changes[f.name] = w
        return dataclasses.replace(node, **changes) if changes else node
    return node


# ----------------------------------------------------------------------------- checking
PROBE = """config B = 2, T = 2
dim b < B
dim t < T
env E = "{plugin}" batch b
o[b, 0] = E.reset()
o[b, t+1], r[b, t], d[b, t] = E.step({action})
out o, r, d
"""


def is_env_file(text: str) -> bool:
    """Whether a source is an environment file (it has an ``env state`` or an ``env``
    attribute declaration); raises ``ProgramError`` on a syntax error."""
    from timerlc.frontend.parser import parse

    return any(isinstance(s, (ast.EnvStateDecl, ast.EnvAttrDecl)) for s in parse(text).statements)


def check_file(source: Source, overrides: dict[str, str]):
    """Check an environment file on its own (``timerlc check walk.rtl``; ``--set`` sets its
    configs): its declarations, then its functions inlined into a probe program of 2
    instances and 2 steps (a reset, then a step with the zero action), so that an error
    inside a function is found too. Returns the probe's checked graph."""
    from timerlc.envs.registry import parse_value
    from timerlc.frontend.check import check_source

    options = {k: parse_value(v) for k, v in overrides.items()}
    try:
        spec = _load(source.name, source, options)
    except EnvError as e:
        raise ProgramError(e.message, None) from None
    if isinstance(spec.action_space, spaces.Discrete):
        action = "0"
    else:
        action = f"zeros([{', '.join(str(n) for n in spec.act_shape)}])"
    query = "&".join(f"{k}={_option_text(v)}" for k, v in options.items())
    plugin = str(Path(source.name).resolve()) + (f"?{query}" if query else "")
    return check_source(
        Source(f"<check of {source.name}>", PROBE.format(plugin=plugin, action=action))
    )


# ----------------------------------------------------------------------------- desugaring
def _calls_in(e, out: list):
    """Every ``E.method(...)`` call in an expression."""
    if isinstance(e, ast.Call):
        f = e.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            out.append(e)
        for a in (e.func, *e.args, *(k.value for k in e.kwargs)):
            _calls_in(a, out)
        return
    if dataclasses.is_dataclass(e) and not isinstance(e, type):
        for f in dataclasses.fields(e):
            v = getattr(e, f.name)
            if isinstance(v, tuple):
                for x in v:
                    if isinstance(x, (ast.Expr, ast.DefItem)):
                        _calls_in(x, out)
            elif isinstance(v, ast.Expr):
                _calls_in(v, out)


def desugar(program: ast.Program, info) -> ast.Program:
    """The program with each call of an environment written in RTL replaced by the
    equations of its state (module docstring); ``info``: the program's ``collect``."""
    rtl = {n: e for n, e in info.envs.items() if getattr(e.attrs, "rtl", None) is not None}
    if not rtl:
        return program
    for stmt in program.statements:  # calls anywhere else than a whole right side
        if isinstance(stmt, ast.DefDecl):
            for item in stmt.body:
                found: list = []
                _calls_in(item, found)
                for c in found:
                    if c.func.value.id in rtl:
                        raise ProgramError(
                            f"'{c.func.value.id}' is written in RTL: call it as the whole right "
                            "side of an equation, not inside a def",
                            c.func.span,
                        )
    eq_of = {id(eq.stmt): eq for eq in info.equations}
    calls: dict[str, list] = {n: [] for n in rtl}
    for stmt in program.statements:
        if not isinstance(stmt, ast.Equation):
            continue
        found = []
        for e in (*stmt.rhs, stmt.when):
            if e is not None:
                _calls_in(e, found)
        found = [c for c in found if c.func.value.id in rtl]
        if not found:
            continue
        c = found[0]
        whole = len(stmt.rhs) == 1 and stmt.rhs[0] is c and len(found) == 1
        if not whole:
            raise ProgramError(
                f"'{c.func.value.id}' is written in RTL: its call must be the whole right side "
                "of its equation",
                c.func.span,
            )
        calls[c.func.value.id].append((stmt, eq_of[id(stmt)], c))
    replaced: dict[int, list] = {}
    for name, env in rtl.items():
        for stmt, new in _env_equations(info, env, calls[name]).items():
            replaced[stmt] = new
    out = []
    for stmt in program.statements:
        out.extend(replaced.get(id(stmt), [stmt]))
    return ast.Program(tuple(out))


def _env_equations(info, env, calls) -> dict[int, list]:
    name, b = env.name, env.batch
    r: RtlEnv = env.attrs.rtl
    keyed = []
    for stmt, eq, call in calls:
        method = call.func.name
        check_call(env, method, call, eq.iter_dims)
        outs = 1 if method == "reset" else 3
        if len(stmt.lhs) != outs:
            raise ProgramError(
                f"{name}.{method}() gives {outs} value{'s' if outs != 1 else ''}, the equation "
                f"has {len(stmt.lhs)} left side{'s' if len(stmt.lhs) != 1 else ''}",
                stmt.lhs[0].span,
            )
        lhs = eq.lhs[0]
        tdims = info.tensors[lhs.tensor].dims
        _, key = call_key(lhs, tdims, b, call.func.span)
        keyed.append((stmt, eq, call, method, tdims, key))
    if not keyed:  # declared, never called
        return {}
    dims0 = keyed[0][4]
    for stmt, eq, call, *_rest in keyed:
        if _rest[1] != dims0:
            raise ProgramError(
                f"the calls of environment '{name}' written in RTL must define tensors over the "
                f"same dims (its state is a tensor over them): [{', '.join(dims0)}] and "
                f"[{', '.join(_rest[1])}]",
                call.func.span,
            )
    # the call points (first output, batch dim removed) and each call's predecessor
    m = len(dims0) - 1
    kn = [f"k_{j}" for j in range(m)]
    maps = []
    for stmt, eq, call, method, tdims, key in keyed:
        dims = eq.iter_dims
        cond = ix.conj(eq.iter_cond, eq.eff_cond)
        parts = [ix.cond_to_isl(cond)] + [f"{k} = {ix.to_isl(v)}" for k, v in zip(kn, key)]
        text = (
            f"{{ [{', '.join(ix.isl_name(d) for d in dims)}] -> [{', '.join(kn)}] : "
            + " and ".join(f"({p})" for p in parts)
            + " }"
        )
        maps.append(isl.Map(text))
    points = [mp.range() for mp in maps]
    for j in range(len(points)):
        for k in range(j + 1, len(points)):
            both = points[j].intersect(points[k])
            if not both.is_empty():
                p = both.lexmin().sample_point()
                where = pisl.format_point(pisl.point_of(p, tuple(x for x in dims0 if x != b)))
                raise ProgramError(
                    f"two calls of environment '{name}' would define the same point of their "
                    f"first output (at {where}); each call must come at its own point",
                    keyed[k][2].func.span,
                )
    union = points[0]
    for p in points[1:]:
        union = union.union(p)
    pred = union.lex_gt_set(union).lexmax()  # p -> the last call point before p
    out: dict[int, list] = {}
    fields = r.state
    for (stmt, eq, call, method, tdims, key), mp in zip(keyed, maps):
        dims = eq.iter_dims
        domain = mp.domain()
        composed = mp.apply_range(pred)
        first = domain.subtract(composed.domain())
        if method == "step" and not first.is_empty():
            where = pisl.format_point(pisl.point_of(first.lexmin().sample_point(), dims))
            raise ProgramError(
                f"environment '{name}' is stepped before its first reset (at {where}); call "
                f"{name}.reset() first",
                call.func.span,
            )
        span = call.span
        lhs_items = stmt.lhs[0].items if isinstance(stmt.lhs[0], ast.Subscript) else ()
        hidden = tuple(
            ast.Subscript(ast.Name(f"{name}.{f}", span), lhs_items, span) for f, _ in fields
        )
        func = ast.Name(f"@{name}.{method}", call.func.span)
        pieces: list = []
        if not first.is_empty():
            pieces.append((_cond_ast(first, dims, domain, span), None))
        if not composed.is_empty():
            raw: list = []
            composed.as_pw_multi_aff().foreach_piece(lambda s, ma, raw=raw: raw.append((s, ma)))
            for s, ma in raw:
                pieces.append((_cond_ast(s, dims, domain, span), _aff_asts(ma, dims, span)))
        # the state before the call: a copy of the state after the call before it, one
        # equation per piece of the call order (the step's body is elaborated once)
        before = tuple(
            ast.Subscript(ast.Name(f"{name}.before.{f}", span), lhs_items, span) for f, _ in fields
        )
        new = []
        for cond, pred_keys in pieces:
            if pred_keys is None:
                zero = ast.Name(f"@{name}.zero", span)
                rhs = tuple(ast.Call(zero, (ast.Str(f, span),), (), span) for f, _ in fields)
            else:
                index, q = [], 0
                for d in tdims:
                    if d == b:
                        index.append(ast.Name(b, span))
                    else:
                        index.append(pred_keys[q])
                        q += 1
                rhs = tuple(
                    ast.Subscript(ast.Name(f"{name}.{f}", span), tuple(index), span)
                    for f, _ in fields
                )
            when = stmt.when
            if cond is not None:
                when = cond if when is None else ast.Binary("and", when, cond, span, span)
            value = rhs[0] if len(rhs) == 1 else ast.TupleLit(rhs, span)
            new.append(ast.Equation(before, (value,), when, stmt.span))
        args = before + tuple(call.args) + (ast.Name(b, span),)
        rhs = ast.Call(func, args, (), span)
        # the call happens only where its outputs are not defined by earlier equations
        # (first match wins): its state outputs, which nothing else defines, must not either
        shadow = _cond_ast(domain, dims, pisl.cond_set(dims, eq.iter_cond), span)
        when = stmt.when
        if shadow is not None:
            when = shadow if when is None else ast.Binary("and", when, shadow, span, span)
        new.append(ast.Equation(hidden + tuple(stmt.lhs), (rhs,), when, stmt.span))
        out[id(stmt)] = new
    return out


def _int_ast(v: int, span) -> ast.Expr:
    return ast.Int(v, span) if v >= 0 else ast.Unary("-", ast.Int(-v, span), span, span)


def _sum_ast(terms: list[tuple[ast.Expr, int]], const: int, span) -> ast.Expr:
    """``sum(c * e for e, c in terms) + const`` as an RTL expression."""
    e = None
    for term, c in terms:
        if c == 0:
            continue
        if abs(c) != 1:
            term = ast.Binary("*", ast.Int(abs(c), span), term, span, span)
        if e is None:
            e = term if c > 0 else ast.Unary("-", term, span, span)
        else:
            e = ast.Binary("+" if c > 0 else "-", e, term, span, span)
    if e is None:
        return _int_ast(const, span)
    if const:
        e = ast.Binary("+" if const > 0 else "-", e, ast.Int(abs(const), span), span, span)
    return e


def _frac(v: isl.Val) -> Fraction:
    return Fraction(str(v))


def _aff_ast(aff: isl.Aff, dims, span) -> ast.Expr:
    """An isl quasi-affine expression over ``dims`` as an RTL index expression: its
    integer divisions (``floor(e / d)``, from ``%`` and ``//`` in the program's conditions)
    become ``(e) // d``."""
    den = _frac(aff.get_denominator_val())
    terms = [
        (ast.Name(d, span), _frac(aff.get_coefficient_val(isl.dim_type.in_, q)) * den)
        for q, d in enumerate(dims)
    ]
    for j in range(aff.dim(isl.dim_type.div)):
        c = _frac(aff.get_coefficient_val(isl.dim_type.div, j)) * den
        if c:  # (a div's own aff lists the divs of its local space, with zero coefficients)
            # the div is floor(e / d) for its aff e / d, which this writes as (e) // d
            terms.append((_aff_ast(aff.get_div(j), dims, span), c))
    const = _frac(aff.get_constant_val()) * den
    if any(c.denominator != 1 for _, c in terms) or const.denominator != 1:
        raise ValueError("a non-integral affine expression")  # pragma: no cover
    e = _sum_ast([(t, int(c)) for t, c in terms], int(const), span)
    return e if den == 1 else ast.Binary("//", e, ast.Int(int(den), span), span, span)


def _cond_ast(s: isl.Set, dims, domain: isl.Set, span):
    """``s`` as an RTL condition over ``dims`` (None: all of ``domain``)."""
    s = s.gist(domain).coalesce()
    if s.plain_is_universe():
        return None
    disj = []
    for bs in s.get_basic_sets():
        # each div is floor(e / d) for its aff e / d, which _aff_ast writes as (e) // d
        divs = [_aff_ast(bs.get_div(j), dims, span) for j in range(bs.dim(isl.dim_type.div))]
        conj = []
        for c in bs.get_constraints():
            terms = [
                (ast.Name(d, span), _frac(c.get_coefficient_val(isl.dim_type.set, q)))
                for q, d in enumerate(dims)
            ]
            terms += [
                (dv, _frac(c.get_coefficient_val(isl.dim_type.div, j)))
                for j, dv in enumerate(divs)
            ]
            if any(k.denominator != 1 for _, k in terms):
                raise ValueError("a constraint with rational coefficients")  # pragma: no cover
            terms = [(t, int(k)) for t, k in terms]
            lhs = _sum_ast(terms, int(_frac(c.get_constant_val())), span)
            op = "==" if c.is_equality() else ">="
            conj.append(ast.Compare((op,), (lhs, ast.Int(0, span)), span, (span,)))
        if not conj:
            return None
        e = conj[0]
        for c in conj[1:]:
            e = ast.Binary("and", e, c, span, span)
        disj.append(e)
    e = disj[0]
    for d in disj[1:]:
        e = ast.Binary("or", e, d, span, span)
    return e


def _aff_asts(ma: isl.MultiAff, dims, span) -> list:
    return [_aff_ast(ma.get_aff(j), dims, span) for j in range(ma.dim(isl.dim_type.out))]


# ----------------------------------------------------------------------------- elaboration
@contextlib.contextmanager
def _inside(el, env):
    """Elaborate in the environment file's names, with its draws on its stream."""
    r: RtlEnv = env.attrs.rtl
    info, key = el.info, getattr(el, "draw_key", None)
    inner = dataclasses.replace(r.info, dims=info.dims)
    seed = info.configs["seed"].value
    el.info = inner
    el.draw_key = (rng.site_id(f"env:{env.name}"), rng.seed32(seed))
    try:
        yield
    finally:
        el.info, el.draw_key = info, key


def expand(el, expr: ast.Call, locals_):
    """The value of an internal call ``@E.reset(state..., k)`` / ``@E.step(state..., a,
    k)``: the state after the call (field by field), then the observation, and for a step
    the reward and done; or ``@E.zero("field")``: that field of the state before the first
    call."""
    from timerlc.frontend.builtins import _where
    from timerlc.frontend.envcalls import _action
    from timerlc.frontend.values import RecordVal, TupleVal, Val

    env_name, method = expr.func.id[1:].rsplit(".", 1)
    env = el.info.envs[env_name]
    r: RtlEnv = env.attrs.rtl
    span = expr.span
    if method == "zero":  # a field of the state before the first call
        (t,) = [t for f, t in r.state if f == expr.args[0].value]
        return el.materialize(el.const(0, t.dtype, t.shape, weak=False, span=span))
    args = list(expr.args)
    state = [(f, el.value(args[j], locals_)) for j, (f, _) in enumerate(r.state)]
    args = args[len(r.state) :]
    s = RecordVal(tuple(state), span)
    action = None
    if method == "step":
        action = _action(el, env, el.value(args[0], locals_), args[0].span)
    k = el.value(args[-1], locals_)
    with _inside(el, env):
        if method == "reset":
            s2 = _state(el, r, _inline(el, r, "reset", [s, k]), "reset")
        else:
            got = _inline(el, r, "step", [s, action, k])
            d = r.defs["step"]
            if not isinstance(got, TupleVal) or len(got.items) != 4:
                raise ProgramError(
                    "'step' must give (state, reward, terminated, truncated)",
                    d.body[-1].span,
                )
            s1 = _state(el, r, got.items[0], "step")
            reward = _scalar(el, got.items[1], "f32", "the reward", d)
            term = _scalar(el, got.items[2], "bool", "terminated", d)
            trunc = _scalar(el, got.items[3], "bool", "truncated", d)
            done = el.binary("or", term, trunc, span)
            again = _state(el, r, _inline(el, r, "reset", [s1, k]), "reset")
            s2 = RecordVal(
                tuple(
                    (f, _where(el, done, again.field(f), s1.field(f), span)) for f, _ in r.state
                ),
                span,
            )
        obs = _inline(el, r, "observe", [s2])
        want = TensorType("f32", tuple(env.attrs.obs_shape))
        if not isinstance(obs, Val) or obs.type != want:
            got_t = obs.type if isinstance(obs, Val) else "a tuple or record"
            raise ProgramError(
                f"'observe' must give the declared observation {want}, got {got_t}",
                r.defs["observe"].body[-1].span,
            )
    values = [el.node_of(v) for _, v in s2.fields]
    values.append(el.apply("stop_grad", [el.node_of(obs)], span))
    if method == "step":
        values.append(el.apply("stop_grad", [el.node_of(reward)], span))
        values.append(el.node_of(done))
    return TupleVal(tuple(values), span)


def _inline(el, r: RtlEnv, fn: str, values: list):
    d = r.defs[fn]
    return el.inline_values(d, dict(zip((p.name for p in d.params), values)), ())


def _scalar(el, v, dtype: str, what: str, d):
    from timerlc.frontend.values import Val

    if not isinstance(v, Val) or v.shape != ():
        raise ProgramError(f"{what} of 'step' must be a {dtype} scalar", d.body[-1].span)
    if v.dtype != dtype:
        if v.weak or (dtype == "f32" and v.dtype in ("f64", "i32", "i64")):
            return el.cast(v, dtype)
        raise ProgramError(
            f"{what} of 'step' must be a {dtype} scalar, got {v.type}", v.span or d.body[-1].span
        )
    return v


def _state(el, r: RtlEnv, v, fn: str):
    """The state a function gave (a tuple in field order, or a record with the fields),
    each field checked against its declared type (weak constants take it)."""
    from timerlc.frontend.values import RecordVal, TupleVal, Val

    names = [f for f, _ in r.state]
    d = r.defs[fn]
    where = d.body[-1].span
    if isinstance(v, RecordVal) and v.names == tuple(names):
        items = [v.field(f) for f in names]
    elif isinstance(v, TupleVal) and len(v.items) == len(names):
        items = list(v.items)
    elif isinstance(v, Val) and len(names) == 1:  # a state of one field, bare
        items = [v]
    else:
        raise ProgramError(
            f"'{fn}' must give the state: a tuple ({', '.join(names)}) in that order", where
        )
    out = []
    for (f, t), x in zip(r.state, items):
        if not isinstance(x, Val):
            raise ProgramError(f"state field '{f}' must be a tensor", where)
        if x.type != t:
            kinds = {"bool": 0, "i32": 1, "i64": 1, "f32": 2, "f64": 2}
            widens = kinds[x.dtype] <= kinds[t.dtype]  # a constant 0.5 is no i32
            if (x.weak or (x.is_const and x.shape == ())) and widens:
                x = el.cast(x, t.dtype)
                if t.shape:
                    x = el.apply("broadcast_to", [el.materialize(x)], where, shape=t.shape)
            if x.type != t:
                raise ProgramError(
                    f"state field '{f}' is {t}, '{fn}' gives {x.type}", x.span or where
                )
        out.append((f, x))
    return RecordVal(tuple(out), where)
