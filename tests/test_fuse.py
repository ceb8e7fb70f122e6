"""Fused kernels (``timerlc/codegen/fuse.py``): statements over the same loops, called one
after another at the same loop values, run as one kernel whose vector loops are one loop;
what it refuses to fuse, and that a fused kernel computes what the reference does, fails
where it does and names the statement that failed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import src

from timerlc.codegen import kir
from timerlc.codegen.fuse import fuse
from timerlc.codegen.kir import (
    Bin,
    Const,
    Fail,
    For,
    If,
    Let,
    Load,
    Ref,
    Slot,
    Store,
    Temp,
)
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.reference.interpreter import outputs, run_graph
from timerlc.runtime.cpu import CpuRuntime

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"

# a step of a recurrence over t, over the points b: c is stored (read twice), then s, then x
STEP = """
config T = 6, B = 5
dim t < T
dim b < B
x[0, b] = f32(b) * 0.3
c[t, b] = cos(x[t, b])
s[t, b] = c[t, b] * c[t, b] + sin(x[t, b])
x[t+1, b] = x[t, b] + 0.1 * c[t, b] - 0.05 * s[t, b]
out x, s
"""


def generated(text: str, **sets):
    graph = check_source(
        Source("p.rtl", src(text)), overrides={k: str(v) for k, v in sets.items()}
    )
    return graph, generate_code(compile_plan(run_passes(graph)))


def launches(gen) -> list[kir.Launch]:
    return [s for t in gen.trees for s in kir.walk_tree(t.body) if isinstance(s, kir.Launch)]


def test_the_statements_of_a_step_run_as_one_kernel():
    graph, gen = generated(STEP)
    assert gen.fused, kir.text(gen.kernels[0])
    k = max(gen.fused, key=lambda k: len(k.parts))
    assert len(k.parts) >= 3
    loops = [s for s in k.body if isinstance(s, For)]
    assert len(loops) == 1  # one loop over b computes every statement's point
    assert any(s.kernel == k.name and s.sids == k.parts for s in launches(gen))
    assert [list(f) for f in gen.plan.kernels.fused] == [list(f.parts) for f in gen.fused]
    rt = CpuRuntime(gen.plan, native=gen.text)
    rt.run()
    want = outputs(run_graph(graph))
    for name in ("x", "s"):
        np.testing.assert_allclose(rt.value(name), want[name], rtol=1e-6, atol=1e-7)


def test_a_failure_in_a_fused_kernel_names_its_own_statement():
    # y's index check (on t only) runs before the fused loop: at t = 4 it fails, and the
    # runtime reports y's point (the kernel returns y's place among its statements, not
    # the first's: 3, after x's merge and c), as the reference does
    text = """
    config K = 5, T = 6
    dim t < T
    dim k < K
    v = f32(arange(5))
    x[0, k] = f32(k) * 0.3
    c[t, k] = cos(x[t, k])
    y[t, k] = c[t, k] * c[t, k] + take(v, 4 - 3 * t)
    x[t+1, k] = x[t, k] + 0.1 * c[t, k] - 0.05 * y[t, k]
    out y
    """
    graph, gen = generated(text)
    assert any(re.search(r"fail [2-9]", kir.text(k)) for k in gen.fused)  # (not first)
    with pytest.raises(RunError) as ref:
        run_graph(graph)
    with pytest.raises(RunError) as got:
        CpuRuntime(gen.plan, native=gen.text).run()
    assert str(got.value) == str(ref.value)
    assert "computing y at t=4" in str(got.value)


def test_the_step_of_an_rtl_environment_is_one_kernel():
    """CartPole written in RTL: its step is some fifteen statements (its stored values; 21
    before the reward's ``where(sutton_barto_reward, ...)`` over a config flag was folded),
    run as one fused kernel."""
    graph = check_source(
        Source(str(PROGRAMS / "ppo.rtl"), (PROGRAMS / "ppo.rtl").read_text()),
        overrides={"B": "4", "T": "8", "total_steps": "64"},
        envs={"E": "rtl:cartpole"},
    )
    gen = generate_code(compile_plan(run_passes(graph)))
    assert max(len(k.parts) for k in gen.fused) >= 14


# ----------------------------------------------------------------------------- fuse()
def _slot(name: str, index: int, write: bool = False) -> Slot:
    return Slot(name, "f32", index, index, 0, write)


def _kernel(sid: int, slots, body, temps=(), params=("t",)) -> kir.Kernel:
    return kir.Kernel(f"s{sid}", sid, params, tuple(slots), tuple(temps), tuple(body))


B = Ref("b")
T = Ref("t")


def _at(buf: str, index) -> Load:
    return Load(buf, index, "f32")


def _plus_t(e):
    return Bin("add", e, Bin("mul", T, Const("i64", 8), "i64"), "i64")


def _producer() -> kir.Kernel:
    # y[t*8 + b] = x[t*8 + b] * 2, for b < 8
    body = For(
        "b",
        Const("i64", 0),
        Const("i64", 8),
        (
            Store(
                "y",
                _plus_t(B),
                Bin("mul", _at("x", _plus_t(B)), Const("f32", 2.0), "f32"),
            ),
        ),
    )
    return _kernel(1, [_slot("x", 0), _slot("y", 1, True)], [body])


def _consumer(index, params=("u",), var="c", extra=(), write="z", hi=8) -> kir.Kernel:
    u = Ref(params[0])
    idx = index(Ref(var), u)
    body = For(
        var,
        Const("i64", 0),
        Const("i64", hi),
        tuple(extra) + (Store(write, idx, Bin("add", _at("y", idx), Const("f32", 1.0), "f32")),),
    )
    slots = [_slot("y", 1), _slot(write, 2 if write == "z" else 0, True)]
    temps = [Temp("t1", "f32", 0, 4)]
    pre = [Let("k", "i64", u), If(Bin("lt", u, Const("i64", 0), "bool"), (Fail(1),))]
    return _kernel(2, slots, pre + [body], temps, params)


def _same(c, u):  # y at the consumer's own point, in its own names
    return Bin("add", c, Bin("mul", u, Const("i64", 8), "i64"), "i64")


def test_fuse_makes_one_loop_in_the_first_kernels_names():
    a = _producer()
    b = _consumer(_same)
    k = fuse(a, b, "f1")
    assert k is not None and k.parts == (1, 2)
    (loop,) = [s for s in k.body if isinstance(s, For)]
    assert loop.var == "b" and len(loop.body) == 2
    text = kir.text(k)
    assert "z[(b + (t * 8))] = (y[(b + (t * 8))] + 1.0:f32)" in text  # b's names are a's
    assert "fail 2" in text  # a failure of the second statement returns 2
    assert "k.1: i64 = t" in text  # its locals are renamed
    (t,) = k.temps
    assert t.name == "t1.1"  # its temporaries too, after a's scratch
    assert [s.name for s in k.slots] == ["x", "y", "z"] and k.slots[1].write


@pytest.mark.parametrize(
    "b, why",
    [
        (
            lambda: _consumer(lambda c, u: Bin("add", _same(c, u), Const("i64", 1), "i64")),
            "reads what another iteration of the first writes",
        ),
        (lambda: _consumer(_same, write="x"), "writes what the first reads"),
        (lambda: _consumer(_same, hi=7), "another range"),
        (
            lambda: _consumer(_same, extra=[If(Const("bool", False), (Fail(1),))]),
            "its loop can fail",
        ),
    ],
    ids=["shifted", "anti", "range", "fails"],
)
def test_fuse_refuses_what_could_change_a_value(b, why):
    assert fuse(_producer(), b(), "f1") is None, why


def test_fuse_refuses_memory_shared_with_a_donor():
    a = _producer()
    a = kir.Kernel(a.name, a.sid, a.params, a.slots, a.temps, a.body, ("x", "y"))
    assert fuse(a, _consumer(_same), "f1") is None


def test_a_check_the_first_kernel_makes_is_made_once():
    """Joined kernels (``fuse``, ``concat``): a check of the second's (a loop that only
    fails) that the first makes already, but for its loop variable's name and its code, is
    left out: the second reads nothing the first writes, so it would pass or fail as the
    first's did, which comes first (PPO's minibatch step: five tensors gathered at the
    permutation's indices, five checks of the same 65,536 indices; one). A check of other
    values stays."""
    from timerlc.codegen.fuse import _checked_once

    def check(var: str, buf: str, code: int) -> For:
        at = kir.Cast(Load(buf, Ref(var), "f32"), "i64")
        bad = kir.Un("not", Bin("lt", at, Const("i64", 64), "bool"), "bool")
        return For(var, Const("i64", 0), Const("i64", 512), (If(bad, (Fail(code),)),), True)

    first = (check("e1", "idx", 1), Store("y", Const("i64", 0), Const("f32", 1.0)))
    then = (check("e1.1", "idx", 2), check("e2.1", "other", 3))
    assert _checked_once(first, then) == (then[1],)
    assert _checked_once((), then) == then
