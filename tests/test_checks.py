"""The checks the stores decide (``timerlc/codegen/checks.py``): a check goes only where
every value it can see keeps its condition, from the intervals of what kernels store, the
loop variables' bounds and the calls' boxes; a value that depends on itself, or that no
kernel stores, keeps its check. Each program is run too: what it computes is the reference
interpreter's, and a check that stays still fails where it should."""

from __future__ import annotations

import numpy as np
import pytest
from rtl_helpers import NATIVE, TEST_BACKEND, reference_and_native, src

from timerlc.codegen import kir
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.runtime.cpu import CpuRuntime

pytestmark = pytest.mark.skipif(
    TEST_BACKEND != "cpu" or not NATIVE, reason="the backend under test runs no LLVM code"
)


def _gen(text: str):
    graph = check_source(Source("p.rtl", src(text)), overrides={})
    return graph, generate_code(compile_plan(run_passes(graph)))


def _checks(gen, name: str) -> int:
    """The ``fail`` statements of the kernel of the statement named ``name``."""
    (k,) = [k for k in gen.kernels if gen.plan.buffer(k.sid).name == name]
    return sum(isinstance(s, kir.Fail) for s in kir.walk_tree(k.body))


def _same_as_reference(graph, names):
    want, got, _ = reference_and_native(graph)
    for name in names:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _close_to_reference(graph, names):
    want, got, _ = reference_and_native(graph)
    for name in names:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_index_a_modulo_or_a_floor_division_bounds_needs_no_check():
    """``(t * 7 + i) % N`` lies in ``[0, N)`` and ``t // 2`` for ``t < T`` in ``[0, T/2)``
    (the loop values' boxes): both takes check nothing; an index made from a float keeps
    its check."""
    graph, gen = _gen(
        """
        config I = 3, T = 8, N = 5
        dim i < I
        dim t < T
        x[i] = f32(arange(N)) * f32(i + 1)
        q[i, t] = (t * 7 + i) % N
        y[i, t] = take(x[i], q[i, t])
        h[i, t] = take(x[i], t // 2)
        u[i, t] = i32(f32(t) * 0.5)
        z[i, t] = take(x[i], u[i, t])
        out y, h, z
        """
    )
    assert _checks(gen, "y") == 0 and _checks(gen, "h") == 0
    assert _checks(gen, "z") > 0
    _same_as_reference(graph, ["y", "h", "z"])


def test_a_value_that_depends_on_itself_keeps_its_check():
    """``k`` counts up along ``t``: its values are stores of loads of itself, whose range
    the intervals cannot close; its take keeps the check, which fails at ``t = 5``."""
    _, gen = _gen(
        """
        config T = 8, N = 5
        dim t < T
        x[t] = f32(t)
        k[0] = 0
        k[t] = k[t-1] + 1
        y[t] = take(x[0:N], k[t])
        out y
        """
    )
    assert _checks(gen, "y") > 0
    with pytest.raises(RunError, match=r"at t=5 .*index 5 is out of range"):
        CpuRuntime(gen.plan, native=gen.text).run()


SCATTER = """
config I = 3, B = 64, K = 3
dim i < I
dim b < B
params net[i] { w : f32[K] = zeros }
x[i, b] = net[i].w * f32(b % 5 + 1)
a[i, b] = ACTION
z[i, b] = log_softmax(x[i, b])[a]
loss[i] = -mean(z[i, 0:B])
net[i+1] = sgd(net[i], grad(loss[i], net[i]), 0.5)
out loss, net, a
"""


def _scatters(gen) -> tuple[int, int]:
    """(stores into a temporary at an index loaded at the point, at an index of ``_at_each``'s
    loops) over every kernel."""
    loaded = each = 0
    for k in gen.kernels:
        temps = {t.name for t in k.temps}
        for s in kir.walk_tree(k.body):
            if isinstance(s, kir.Store) and s.buf in temps:
                if any(isinstance(x, kir.Load) for x in kir.subexprs(s.index)):
                    loaded += 1
                if isinstance(s.index, kir.Ref) and s.index.name.startswith("j$"):
                    each += 1
    return loaded, each


def test_a_gather_s_gradient_into_its_few_actions_stores_at_each_of_them():
    """The gradient of ``log_softmax(x)[a]`` adds into a temporary of the ``K`` logits at
    ``a``: where ``a`` is drawn by ``categorical`` over those logits (0 ..< 3, the stores
    say), a store at each element (a select), every index a constant; with an action
    whose range the stores do not give (an ``i32`` of a float, as a check stays for it),
    the store at ``a`` stays. Both compute the reference's values (its sums' rounding)."""
    graph, gen = _gen(SCATTER.replace("ACTION", "categorical(x[i, b])"))
    assert _scatters(gen) == (0, 1)
    _close_to_reference(graph, ["loss", "net.w", "a"])
    graph, gen = _gen(SCATTER.replace("ACTION", "i32(f32(b % 3) * 0.9)"))
    assert _scatters(gen) == (1, 0)
    _close_to_reference(graph, ["loss", "net.w", "a"])
