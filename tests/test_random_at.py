"""Draws at an explicit point, ``uniform(..., at=[k, c])`` and ``normal(..., at=[k, c])``
(docs/language.md "Draws at an explicit point"): the point index is data, ``P = k`` or
``P = k * 2**32 + c``, and the values are ``timerlc.rng``'s at the point ``(k, c)`` with
bounds ``(None, 2**32)``, bit for bit, on the reference interpreter, the NumPy plan
interpreter and generated native code; and the elaborator's ``draw_key`` hook, which gives
the draws of an environment's function their key."""

from __future__ import annotations

import numpy as np
import pytest
from rtl_helpers import error, src

from timerlc import rng
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import Source
from timerlc.envs.base import ResetStreams
from timerlc.frontend.check import check_source
from timerlc.frontend.elaborate import Elaborator
from timerlc.ops import run_op
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime.cpu import CpuRuntime

B, T, SEED = 3, 5, 11
BT = np.stack(np.meshgrid(np.arange(B), np.arange(T), indexing="ij"), axis=-1)  # [B, T, 2]
HEAD = f"""
config B = {B}, T = {T}, seed = {SEED}
dim b < B
dim t < T
"""


def site(tensor: str, kind: str, draw: int = 0) -> int:
    """The site of draw ``draw`` of the first equation of ``tensor`` (docs/language.md)."""
    return rng.site_id(f"{tensor}#0#{draw}#{kind}#")


def run_all(text: str) -> dict:
    """Outputs on the reference backend, checked bit for bit against the cpu backend run
    both by its NumPy plan interpreter and by its generated code, all of which runs
    natively."""
    graph = check_source(Source("p.rtl", src(text)))
    want = outputs(run_graph(graph))
    gen = generate_code(compile_plan(run_passes(graph)))
    assert not gen.interpreted, gen.interpreted  # every statement is generated code
    for native in (gen.text, None):
        rt = CpuRuntime(gen.plan, native=native)
        rt.run()
        for name, w in want.items():
            got = rt.value(name)
            what = f"{name} ({'native' if native else 'interpreted'})"
            assert got.dtype == w.dtype and got.shape == w.shape, what
            assert got.tobytes() == w.tobytes(), what
    return want


def same(got: np.ndarray, want: np.ndarray):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    assert got.tobytes() == want.tobytes()


# ----------------------------------------------------------------------------- values
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_uniform_and_normal_at_a_point_equal_rng(dtype):
    dt = np.float32 if dtype == "f32" else np.float64
    out = run_all(
        HEAD
        + f"""
        u[b, t] = uniform([3], lo=-1.0, hi=2.0, dtype={dtype}, at=[b, t])
        r[b, t] = uniform([2, 2], dtype={dtype}, at=[b, t])
        n[b, t] = normal([3], dtype={dtype}, at=[b, t])
        out u, r, n
        """
    )
    bounds = (None, 2**32)
    same(out["u"], rng.uniform(SEED, site("u", "uniform"), BT, bounds, (3,), dt, -1.0, 2.0))
    same(out["r"], rng.uniform(SEED, site("r", "uniform"), BT, bounds, (2, 2), dt))
    same(out["n"], rng.normal(SEED, site("n", "normal"), BT, bounds, (3,), dt))


def test_the_point_is_data_not_the_iteration_point():
    """``at=[k]`` is the point index k; the entries may be any i32/i64 values (reads,
    arithmetic, constants), and a draw at the same point repeats the same numbers."""
    out = run_all(
        HEAD
        + """
        k[b] = i64(7 * b + 1)
        one[b, t] = normal([2], dtype=f64, at=[k[b] * 4294967296 + i64(t)])
        two[b, t] = normal([2], dtype=f64, at=[k[b], t])
        c[b, t] = uniform([4], at=[3])
        d[b] = uniform([4], at=[i64(2), 9])
        s[t] = uniform([], dtype=f64, at=[T - 1 - t, 0])
        out one, two, c, d, s
        """
    )
    ks = 7 * np.arange(B) + 1
    pts = np.stack(np.broadcast_arrays(ks[:, None], np.arange(T)[None, :]), axis=-1)
    want = rng.normal(SEED, site("one", "normal"), pts, (None, 2**32), (2,), np.float64)
    same(out["one"], want)
    want = rng.normal(SEED, site("two", "normal"), pts, (None, 2**32), (2,), np.float64)
    same(out["two"], want)
    c = rng.uniform(SEED, site("c", "uniform"), (3,), (None,), (4,), np.float32)
    same(out["c"], np.broadcast_to(c, (B, T, 4)))
    d = rng.uniform(SEED, site("d", "uniform"), (2, 9), (None, 2**32), (4,), np.float32)
    same(out["d"], np.broadcast_to(d, (B, 4)))
    pts = np.stack([T - 1 - np.arange(T), np.zeros(T, int)], axis=-1)
    same(out["s"], rng.uniform(SEED, site("s", "uniform"), pts, (None, 2**32), (), np.float64))


def test_draws_at_points_in_a_recurrence():
    """A draw whose point comes from the state of a recurrence over t, with b vectorized."""
    out = run_all(
        HEAD
        + """
        n[b, 0] = i64(b)
        n[b, t+1] = n[b, t] + 2
        x[b, t] = uniform([2], lo=-0.5, hi=0.5, dtype=f64, at=[n[b, t], t + 1])
        out x
        """
    )
    pts = np.stack(
        np.broadcast_arrays(np.arange(B)[:, None] + 2 * np.arange(T), np.arange(T) + 1), -1
    )
    want = rng.uniform(SEED, site("x", "uniform"), pts, (None, 2**32), (2,), np.float64, -0.5, 0.5)
    same(out["x"], want)


@pytest.mark.parametrize(
    "name,fn", [("random_uniform_at", rng.uniform), ("random_normal_at", rng.normal)]
)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_the_ops_over_a_batch_of_points(name, fn, dtype):
    """The kernels: one i64 point index per batch point (a shared one stays shared); a
    negative index is its two's complement word, as native code reads it."""
    attrs = {"seed": -3, "site": 2**32 - 5, "shape": (2, 3), "dtype": dtype}
    dt = np.dtype(np.float32 if dtype == "f32" else np.float64)
    p = np.array([[0, 1, 2**40 + 7], [5, -1, 2**63 - 1]], np.int64)
    got = run_op(name, attrs, [p], (2, 3), {}, dtype, (2, 3))
    words = p.view(np.uint64)[..., None]
    same(got, fn(-3, 2**32 - 5, words, (None,), (2, 3), dt))
    for (i, j), v in np.ndenumerate(p):
        one = run_op(name, attrs, [p[i, j]], (), {}, dtype, (2, 3))
        same(one, fn(-3, 2**32 - 5, (int(v) % 2**64,), (None,), (2, 3), dt))
    shared = run_op(name, attrs, [p[:1, :1]], (2, 3), {}, dtype, (2, 3))
    same(shared, np.broadcast_to(fn(-3, 2**32 - 5, (0,), (None,), (2, 3), dt), (2, 3, 2, 3)))


# ----------------------------------------------------------------------------- diagnostics
@pytest.mark.parametrize("at", ["[]", "[b, t, 0]", "b"])
def test_at_must_be_a_list_of_one_or_two(at):
    text = HEAD + f"u[b, t] = uniform([2], at={at})\nout u\n"
    err = error(text)
    assert "'at' of uniform" in err.message and "[k, c]" in err.message
    col = src(text).splitlines()[3].index("at=") + 4
    assert (err.span.line, err.span.col) == (4, col)


@pytest.mark.parametrize(
    "entry,got", [("1.5", "f32"), ("f64(t)", "f64"), ("b > 0", "bool"), ("true", "bool")]
)
def test_an_entry_of_at_must_be_an_integer(entry, got):
    text = HEAD + f"u[b, t] = normal([2], at=[b, {entry}])\nout u\n"
    err = error(text)
    assert "'at' of normal" in err.message and "integer scalar" in err.message
    assert got in err.message
    col = src(text).splitlines()[3].index(entry) + 1
    assert (err.span.line, err.span.col) == (4, col)


def test_an_entry_of_at_must_be_a_scalar():
    text = HEAD + "v[b] = arange(4)\nu[b, t] = uniform([2], at=[v[b], t])\nout u\n"
    err = error(text)
    assert "'at' of uniform" in err.message and "i32[4]" in err.message
    col = src(text).splitlines()[4].index("v[b], t") + 1
    assert (err.span.line, err.span.col) == (5, col)


@pytest.fixture
def draw_key(monkeypatch):
    """Every elaborator draws with the key (5, 7), as while inlining an environment's
    function."""
    init = Elaborator.__init__

    def patched(self, *args, **kw):
        init(self, *args, **kw)
        self.draw_key = (5, 7)

    monkeypatch.setattr(Elaborator, "__init__", patched)
    return (5, 7)


@pytest.mark.parametrize(
    "call",
    [
        "uniform([2])",
        "normal([2], dtype=f64)",
        "bernoulli(0.5)",
        "categorical(zeros([3]))",
        "f32(permutation(3)[0])",
    ],
)
def test_a_draw_under_a_draw_key_needs_at(draw_key, call):
    text = HEAD + f"u[b, t] = {call}\nout u\n"
    err = error(text)
    assert err.message == (
        "a draw in an environment's function needs at=[...]: its point is the environment's "
        "data, not the program's (docs/envs.md)"
    )
    name = call.removeprefix("f32(").split("(")[0]
    col = src(text).splitlines()[3].index(name) + 1
    assert (err.span.line, err.span.col) == (4, col)


# ----------------------------------------------------------------------------- draw_key
def test_a_draw_key_replaces_the_seed_and_site(draw_key):
    out = run_all(
        HEAD
        + """
        u[b, t] = uniform([3], lo=-1.0, hi=2.0, dtype=f64, at=[b, t])
        n[b, t] = normal([2], at=[b, t])
        m[b, t] = normal([2], at=[b, t])
        out u, n, m
        """
    )
    seed, site_ = draw_key
    bounds = (None, 2**32)
    same(out["u"], rng.uniform(seed, site_, BT, bounds, (3,), np.float64, -1.0, 2.0))
    same(out["n"], rng.normal(seed, site_, BT, bounds, (2,), np.float32))
    same(out["m"], out["n"])  # one key: the same point draws the same numbers


def test_a_draw_key_draws_what_reset_streams_draw(monkeypatch):
    """The feature's purpose: an environment written in RTL draws the initial states the
    built-in environments draw (``ResetStreams.uniform``): the c-th reset of instance k at
    ``at=[k, c]`` under the streams' key."""
    streams = ResetStreams(2**32 * 9 + 123, B)
    init = Elaborator.__init__

    def patched(self, *args, **kw):
        init(self, *args, **kw)
        self.draw_key = streams.key

    monkeypatch.setattr(Elaborator, "__init__", patched)
    out = run_all(
        HEAD
        + """
        s[b, t] = uniform([4], lo=-0.05, hi=0.05, dtype=f64, at=[b, t])
        out s
        """
    )
    for c in range(T):
        same(out["s"][:, c], streams.uniform(np.arange(B), -0.05, 0.05, 4))


# ----------------------------------------------------------------------------- plans
def _at_plan_json() -> dict:
    from timerlc.plan import items

    text = HEAD + "u[b, t] = normal([3], dtype=f64, at=[b, t])\nout u\n"
    graph = check_source(Source("p.rtl", src(text)))
    return items.to_json(compile_plan(run_passes(graph)))


def _at_nodes(data: dict) -> list:
    """The plan's random_normal_at nodes (dicts of ``data``, to change in place)."""
    found = []

    def walk(v):
        if isinstance(v, dict):
            if v.get("op") == "random_normal_at":
                found.append(v)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(data)
    return found


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda n: n["attrs"].update(space=[["b", 3]]), "no attribute 'space'"),
        (lambda n: n["attrs"].update(site="x"), "attribute 'site'"),
        (lambda n: n["attrs"].pop("seed"), "needs attribute 'seed'"),
        (lambda n: n["attrs"].update(dtype="i32"), "random floats are f32 or f64"),
        (lambda n: n["attrs"].update(shape=[4]), "declares"),
    ],
)
def test_a_plan_checks_the_attributes_of_a_draw_at_a_point(change, words):
    """A plan's draws at a point are checked against the ops' declared attributes and type
    rules, as every node (docs/plan.md, "A plan is data")."""
    from timerlc.plan import items
    from timerlc.runtime.plan import PlanError, check_runnable

    data = _at_plan_json()
    check_runnable(items.from_json(data))  # as compiled, it runs
    (node,) = _at_nodes(data)
    change(node)
    with pytest.raises(PlanError, match=words):
        check_runnable(items.from_json(data))
