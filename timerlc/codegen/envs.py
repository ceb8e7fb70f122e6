"""The built-in environments as generated code: ``cartpole``, ``pendulum`` and ``trivial``
in the kernel IR, bit for bit the NumPy forms of ``timerlc/envs``.

In: a plan's environment (``plan.items.Env``: its name, plugin spec and number of
instances). Out: its ``Form`` when the spec names a built-in, else ``None`` (a plugin stays
a call back into Python). A form says which state arrays the environment keeps
(``state``: per instance, in arrays the runtime owns and zeroes before the run, at table
entries after the plan's buffers, see ``state_arrays``) and writes the body of the kernel
of an ``E.reset()`` or ``E.step(a)`` call: a loop over the instances that reads the
actions, updates the state and writes ``obs``, ``reward`` and ``done``.

Every float operation is the one, in the order and the dtype, that the NumPy form computes
(NumPy 2's promotion: a Python float meets a float32 array as a float32). Initial states
come from the Philox streams of ``envs.base.ResetStreams``: the runtime seeds an
environment at its first reset with ``seed32(seed) * 2**32 + site_id("env:E")``, so the key
is ``(site_id("env:E"), seed32(seed))``, known when the code is generated. A step before any
reset, or an action outside the action space, fails the kernel before any instance moves;
the runtime then says what the NumPy form would have raised (``runtime.envs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from timerlc import rng
from timerlc.codegen import kir
from timerlc.codegen.kir import (
    COMPARE,
    Bin,
    Cast,
    Const,
    Expr,
    Fail,
    For,
    If,
    Let,
    Load,
    Ref,
    Store,
)
from timerlc.envs import cartpole as np_cartpole
from timerlc.envs import pendulum as np_pendulum
from timerlc.envs.base import RESET_SITE_BITS

STARTED = "started"  # i32 [1]: 1 once the environment was reset


@dataclass(frozen=True)
class StateArray:
    """One array of an environment's state: ``size`` elements of ``dtype``, zero at the
    start of a run, at entry ``index`` of the runtime's table."""

    env: str
    name: str
    dtype: str
    size: int
    index: int

    @property
    def slot(self) -> str:
        return f"{self.env}_{self.name}"


@dataclass
class IO:
    """What a form's body reads and writes: ``action(k, j)`` the j-th number of instance
    ``k``'s action; ``obs``/``reward``/``done`` the output slots and the offset of this
    call's values in them; ``state[name]`` the slot of each state array."""

    n: int
    action: object
    obs: tuple[str, Expr]
    reward: tuple[str, Expr]
    done: tuple[str, Expr]
    state: dict[str, str]


# ----------------------------------------------------------------------------- scalars
class X:
    """A scalar expression with NumPy's operators (both operands of one dtype; a Python
    number takes the other operand's dtype, as NumPy 2's weak scalars do)."""

    __slots__ = ("e",)

    def __init__(self, e: Expr):
        self.e = e

    @property
    def dtype(self) -> str:
        return self.e.dtype

    def _other(self, o) -> Expr:
        if isinstance(o, X):
            if o.dtype != self.dtype:
                raise TypeError(f"{self.dtype} with {o.dtype}")
            return o.e
        return const(self.dtype, o)

    def _bin(self, op: str, o, swap: bool = False) -> X:
        a, b = self.e, self._other(o)
        if swap:
            a, b = b, a
        return X(Bin(op, a, b, "bool" if op in COMPARE else self.dtype))

    def __add__(self, o):
        return self._bin("add", o)

    def __radd__(self, o):
        return self._bin("add", o, True)

    def __sub__(self, o):
        return self._bin("sub", o)

    def __rsub__(self, o):
        return self._bin("sub", o, True)

    def __mul__(self, o):
        return self._bin("mul", o)

    def __rmul__(self, o):
        return self._bin("mul", o, True)

    def __truediv__(self, o):
        return self._bin("div", o)

    def __mod__(self, o):
        return self._bin("mod", o)

    def __neg__(self):
        return X(kir.Un("neg", self.e, self.dtype))

    def __lt__(self, o):
        return self._bin("lt", o)

    def __gt__(self, o):
        return self._bin("gt", o)

    def __ge__(self, o):
        return self._bin("ge", o)

    def __or__(self, o):
        return self._bin("or", o)

    def __and__(self, o):
        return self._bin("and", o)

    def eq(self, o) -> X:
        return self._bin("eq", o)

    def as_(self, dtype: str) -> X:
        return X(Cast(self.e, dtype))


def const(dtype: str, v) -> Const:
    if dtype == "f32":
        return Const(dtype, float(np.float32(v)))
    if dtype == "f64":
        return Const(dtype, float(v))
    if dtype == "bool":
        return Const(dtype, bool(v))
    return Const(dtype, int(v))


def fn(op: str, x: X) -> X:
    return X(kir.Un(op, x.e, x.dtype))


def minimum(a: X, b) -> X:
    return a._bin("minimum", b)


def maximum(a: X, b) -> X:
    return a._bin("maximum", b)


def clip(a: X, lo, hi) -> X:
    """``np.clip``: ``minimum(maximum(a, lo), hi)`` (a nan stays nan)."""
    return minimum(maximum(a, lo), hi)


def select(cond: X, a, b, dtype: str | None = None) -> X:
    """``np.where(cond, a, b)``; ``dtype`` where both are Python numbers."""
    dtype = a.dtype if isinstance(a, X) else b.dtype if isinstance(b, X) else dtype
    ea = a.e if isinstance(a, X) else const(dtype, a)
    eb = b.e if isinstance(b, X) else const(dtype, b)
    return X(kir.Sel(cond.e, ea, eb, dtype))


def load(buf: str, index: Expr, dtype: str) -> X:
    return X(Load(buf, index, dtype))


def at(k: Expr, size: int, e: int | Expr = 0) -> Expr:
    """Element ``e`` of instance ``k``'s row of ``size`` elements."""
    return kir.add(kir.mul(k, size), e if not isinstance(e, int) else kir.i64(e))


class Body:
    """Statements built in order; ``let`` names a value so it is computed once."""

    def __init__(self):
        self.stmts: list = []
        self.names = 0

    def let(self, x: X, stem: str = "v") -> X:
        self.names += 1
        name = f"{stem}{self.names}"
        self.stmts.append(Let(name, x.dtype, x.e))
        return X(Ref(name, x.dtype))

    def store(self, buf: str, index: Expr, x: X):
        self.stmts.append(Store(buf, index, x.e))


def instances(n: int, var: str, body: list) -> For:
    """``body`` for each instance ``var`` of the batch: each touches only its own state,
    observations and draws, so the loop is parallel."""
    return For(var, kir.i64(0), kir.i64(n), tuple(body), True)


def fail_unless(ok: X) -> If:
    return If(kir.Un("not", ok.e, "bool"), (Fail(1),))


# ----------------------------------------------------------------------------- forms
class Form:
    """A built-in's generated form; subclasses set ``state`` and write the bodies."""

    state: tuple[tuple[str, str, int], ...]  # (name, dtype, elements per instance)
    discrete = True
    actions = 0  # the number of discrete actions

    def __init__(self, env_name: str, seed: int, n: int):
        self.key = (rng.site_id(f"env:{env_name}"), rng.seed32(seed))
        self.n = n

    def reset(self, io: IO) -> list:
        k = Ref("k")
        body = Body()
        self.start(io, k, body)
        return [
            Store(io.state[STARTED], kir.i64(0), Const("i32", 1)),
            instances(self.n, "k", body.stmts),
        ]

    def step(self, io: IO) -> list:
        """Checks first (no instance moves when one of them fails), then the steps."""
        checks = [fail_unless(load(io.state[STARTED], kir.i64(0), "i32").eq(1))]
        if self.discrete:
            a = X(io.action(Ref("k"), 0))
            ok = (a >= 0) & (a < self.actions)
            checks.append(instances(self.n, "k", [fail_unless(ok)]))
        body = Body()
        self.advance(io, Ref("k"), body)
        return checks + [instances(self.n, "k", body.stmts)]

    def draw(self, io: IO, k: Expr, e: int, lo: float, hi: float) -> X:
        """Element ``e`` of instance ``k``'s next initial state: uniform in ``[lo, hi)``
        (``ResetStreams.uniform``)."""
        count = Load(io.state["resets"], k, "i64")
        p = kir.add(kir.mul(k, 1 << RESET_SITE_BITS), count)
        args = (const("i32", _i32(self.key[0])), const("i32", _i32(self.key[1])), p, kir.i64(e))
        return X(
            kir.Fn("tl_rng_uniform_range_f64", args + (const("f64", lo), const("f64", hi)), "f64")
        )

    def start(self, io: IO, k: Expr, body: Body):
        raise NotImplementedError

    def advance(self, io: IO, k: Expr, body: Body):
        raise NotImplementedError


def _i32(v: int) -> int:
    v %= 1 << 32
    return v - (1 << 32) if v >= 1 << 31 else v


class CartPole(Form):
    """``envs.cartpole.CartPole``, operation for operation."""

    state = (("state", "f64", 4), ("steps", "i64", 1), ("resets", "i64", 1), (STARTED, "i32", 0))
    actions = 2

    def __init__(self, env_name, seed, n, max_episode_steps=500, sutton_barto_reward=False):
        super().__init__(env_name, seed, n)
        self.max_steps = max_episode_steps
        self.sutton_barto = sutton_barto_reward

    def _new_state(self, io, k, body) -> list[X]:
        """Draw instance ``k``'s initial state into its state row; its values."""
        s = io.state["state"]
        lo, hi = np_cartpole.RESET_LOW, np_cartpole.RESET_HIGH
        xs = [body.let(self.draw(io, k, e, lo, hi), "s") for e in range(4)]
        for e, x in enumerate(xs):
            body.store(s, at(k, 4, e), x)
        resets = load(io.state["resets"], k, "i64")
        body.store(io.state["resets"], k, resets + 1)
        body.store(io.state["steps"], k, X(kir.i64(0)))
        return xs

    def start(self, io, k, body):
        for e, x in enumerate(self._new_state(io, k, body)):
            body.store(io.obs[0], kir.add(io.obs[1], at(k, 4, e)), x.as_("f32"))

    def advance(self, io, k, body):
        c = np_cartpole
        s = io.state["state"]
        a = X(io.action(k, 0))
        x, x_dot, theta, theta_dot = (load(s, at(k, 4, e), "f64") for e in range(4))
        force = body.let(select(a.eq(1), c.FORCE_MAG, -c.FORCE_MAG, "f64"), "force")
        costheta = body.let(fn("cos", theta), "cos")
        sintheta = body.let(fn("sin", theta), "sin")
        temp = body.let(
            (force + c.POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / c.TOTAL_MASS, "temp"
        )
        thetaacc = body.let(
            (c.GRAVITY * sintheta - costheta * temp)
            / (c.LENGTH * (4.0 / 3.0 - c.MASSPOLE * (costheta * costheta) / c.TOTAL_MASS)),
            "thetaacc",
        )
        xacc = temp - c.POLEMASS_LENGTH * thetaacc * costheta / c.TOTAL_MASS
        new = [
            body.let(x + c.TAU * x_dot, "x"),
            body.let(x_dot + c.TAU * xacc, "x_dot"),
            body.let(theta + c.TAU * theta_dot, "theta"),
            body.let(theta_dot + c.TAU * thetaacc, "theta_dot"),
        ]
        for e, v in enumerate(new):
            body.store(s, at(k, 4, e), v)
        nx, nth = new[0], new[2]
        terminated = body.let(
            (nx < -c.X_THRESHOLD)
            | (nx > c.X_THRESHOLD)
            | (nth < -c.THETA_THRESHOLD)
            | (nth > c.THETA_THRESHOLD),
            "terminated",
        )
        steps = body.let(load(io.state["steps"], k, "i64") + 1, "steps")
        body.store(io.state["steps"], k, steps)
        done = body.let(terminated | (steps >= self.max_steps), "done")
        if self.sutton_barto:
            reward = select(terminated, -1.0, 0.0, "f64").as_("f32")
        else:
            reward = X(const("f32", 1.0))
        body.store(io.reward[0], kir.add(io.reward[1], k), reward)
        body.store(io.done[0], kir.add(io.done[1], k), done)
        # same-step auto-reset: a finished instance observes its next episode's start
        then = Body()
        fresh = self._new_state(io, k, then)
        for e in range(4):
            then.store(io.obs[0], kir.add(io.obs[1], at(k, 4, e)), fresh[e].as_("f32"))
        orelse = Body()
        for e in range(4):
            orelse.store(io.obs[0], kir.add(io.obs[1], at(k, 4, e)), new[e].as_("f32"))
        body.stmts.append(If(done.e, tuple(then.stmts), tuple(orelse.stmts)))


class Pendulum(Form):
    """``envs.pendulum.Pendulum``, operation for operation."""

    state = (("state", "f64", 2), ("steps", "i64", 1), ("resets", "i64", 1), (STARTED, "i32", 0))
    discrete = False

    def __init__(self, env_name, seed, n, g=10.0, max_episode_steps=200):
        super().__init__(env_name, seed, n)
        self.g = float(g)
        self.max_steps = max_episode_steps

    def _observe(self, io, k, th: X, thdot: X, body: Body):
        for e, v in enumerate((fn("cos", th), fn("sin", th), thdot)):
            body.store(io.obs[0], kir.add(io.obs[1], at(k, 3, e)), v.as_("f32"))

    def _new_state(self, io, k, body) -> tuple[X, X]:
        s = io.state["state"]
        high = np_pendulum.RESET_HIGH
        th, thdot = (body.let(self.draw(io, k, e, -high[e], high[e]), "s") for e in range(2))
        body.store(s, at(k, 2, 0), th)
        body.store(s, at(k, 2, 1), thdot)
        body.store(io.state["resets"], k, load(io.state["resets"], k, "i64") + 1)
        body.store(io.state["steps"], k, X(kir.i64(0)))
        return th, thdot

    def start(self, io, k, body):
        self._observe(io, k, *self._new_state(io, k, body), body)

    def advance(self, io, k, body):
        p = np_pendulum
        s = io.state["state"]
        th = load(s, at(k, 2, 0), "f64")
        thdot = load(s, at(k, 2, 1), "f64")
        g, m, ell, dt = self.g, p.M, p.L, p.DT
        u = body.let(clip(X(io.action(k, 0)), -p.MAX_TORQUE, p.MAX_TORQUE), "u")
        norm = body.let(((th + np.pi) % (2 * np.pi)) - np.pi, "norm")
        costs = body.let(
            norm * norm + 0.1 * (thdot * thdot) + (0.001 * (u * u)).as_("f64"), "costs"
        )
        newthdot = (
            thdot + (3 * g / (2 * ell) * fn("sin", th) + (3.0 / (m * ell**2) * u).as_("f64")) * dt
        )
        newthdot = body.let(clip(newthdot, -p.MAX_SPEED, p.MAX_SPEED), "thdot")
        newth = body.let(th + newthdot * dt, "th")
        body.store(s, at(k, 2, 0), newth)
        body.store(s, at(k, 2, 1), newthdot)
        body.store(io.reward[0], kir.add(io.reward[1], k), (-costs).as_("f32"))
        steps = body.let(load(io.state["steps"], k, "i64") + 1, "steps")
        body.store(io.state["steps"], k, steps)
        done = body.let(steps >= self.max_steps, "done")
        body.store(io.done[0], kir.add(io.done[1], k), done)
        then = Body()
        self._observe(io, k, *self._new_state(io, k, then), then)
        orelse = Body()
        self._observe(io, k, newth, newthdot, orelse)
        body.stmts.append(If(done.e, tuple(then.stmts), tuple(orelse.stmts)))


class Trivial(Form):
    """``envs.trivial.Trivial``: a step counter per instance, observations ``value + ramp``."""

    state = (("t", "i64", 1), (STARTED, "i32", 0))

    def __init__(self, env_name, seed, n, obs=4, actions=2, length=10):
        super().__init__(env_name, seed, n)
        from timerlc.envs.trivial import parse_shape

        self.size = math.prod(parse_shape(obs))
        self.actions = actions
        self.length = length

    def _observe(self, io, k, value: X, body: Body):
        """``obs[k, e] = value + ramp[e]``, ``ramp[e] = f32(e / size)``."""
        e = Ref("e")
        ramp = (X(Cast(e, "f64")) / float(self.size)).as_("f32")
        index = kir.add(io.obs[1], at(k, self.size, e))
        body.stmts.append(
            For("e", kir.i64(0), kir.i64(self.size), (Store(io.obs[0], index, (value + ramp).e),))
        )

    def start(self, io, k, body):
        body.store(io.state["t"], k, X(kir.i64(0)))
        self._observe(io, k, X(const("f32", 0.0)), body)

    def advance(self, io, k, body):
        t = body.let(load(io.state["t"], k, "i64"), "t")
        a = body.let(X(io.action(k, 0)).as_("i64"), "a")
        reward = a.eq(t % self.actions).as_("f32")
        body.store(io.reward[0], kir.add(io.reward[1], k), reward)
        t1 = body.let(t + 1, "t")
        done = body.let(t1 >= self.length, "done")
        body.store(io.done[0], kir.add(io.done[1], k), done)
        value = (t1.as_("f64") + a.as_("f64") / float(self.actions)).as_("f32")
        value = body.let(select(done, 0.0, value), "value")
        body.store(io.state["t"], k, select(done, 0, t1))
        self._observe(io, k, value, body)


FORMS = {"cartpole": CartPole, "pendulum": Pendulum, "trivial": Trivial}


def form_of(env, seed: int) -> Form | None:
    """The generated form of a plan's environment (``plan.items.Env``), or ``None`` for a
    plugin that is not a built-in."""
    from timerlc.envs.registry import BUILTINS, parse_spec, resolve

    name, _ = parse_spec(env.spec)
    if name not in FORMS or name not in BUILTINS:
        return None
    plugin = resolve(env.spec)  # checks the options as the NumPy form's factory does
    plugin(1)
    return FORMS[name](env.name, seed, env.num_envs, **plugin.options)


def state_arrays(plan) -> list[StateArray]:
    """The state arrays of every environment of ``plan`` that has a generated form, at the
    table entries after the plan's buffers (``Plan.slots``)."""
    first = len(plan.slots())
    out: list[StateArray] = []
    for env in plan.envs:
        form = form_of(env, plan.seed)
        if form is None:
            continue
        for name, dtype, per in form.state:
            size = max(per * env.num_envs, 1)
            out.append(StateArray(env.name, name, dtype, size, first + len(out)))
    return out
