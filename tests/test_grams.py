"""Gram chains on the cpu backend (``timerlc/codegen/grams.py``): a statement's rows, the
small grams and the column sums that read them, in one kernel that writes the rows
nowhere.

What is checked: which programs get a chain (REINFORCE's first layer; a program of its
shape) and which keep their kernels (the rows read by anything else, an output, a gram of
too many columns, too few rows); that a chain computes the gram and the sums (against
float64 NumPy), what the kernels it stands for compute (to float32 rounding: its gram's
terms are summed in float64), and the same bits on any number of threads; and which
launches, records and orders a chain may move its statements' launches over (kernels and a
plan made up for it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import NATIVE, TEST_BACKEND, src
from test_rows import run as rows_run

from timerlc.codegen import grams, kir
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.runtime.cpu import CpuRuntime

pytestmark = pytest.mark.skipif(
    TEST_BACKEND != "cpu" or not NATIVE, reason="the backend under test runs no LLVM code"
)

# z's rows (R of H floats), read by a gram with a (K columns) and a column sum, each
# iteration's from the last one's sums (so that all three run in the loop over i)
PROGRAM = """
config I = 3, R = 4096, K = 4, H = 16
dim i < I
dim r < R
w[0] = zeros([H])
u[0] = zeros([H])
a[i, r] = sin(f32(r) * 0.01 + arange(K) * 0.5)
z[i, r] = cos(f32(r) * 0.003 + arange(H) * 0.25 + w[i] + u[i]) * 0.5
g[i] = a[i, 0:R].T @ z[i, 0:R]
s[i] = sum(z[i, 0:R], 0)
w[i+1] = w[i] + 0.001 * s[i]
u[i+1] = u[i] + 0.0001 * sum(g[i], 0)
out g, s, w, u
"""


def gen_of(text: str, chains: bool = True, **sets):
    graph = check_source(
        Source("p.rtl", src(text)), overrides={k: str(v) for k, v in sets.items()}
    )
    plan = compile_plan(run_passes(graph))
    if chains:
        return generate_code(plan)
    keep = grams.gram_chains
    grams.gram_chains = lambda plan, trees, kernels: (trees, [])
    try:
        return generate_code(plan)
    finally:
        grams.gram_chains = keep


def run(gen, workers: int | None = None, monkeypatch=None) -> CpuRuntime:
    """A run of ``gen`` (on a pool of ``workers`` workers, where given: test_rows's)."""
    return rows_run(gen, workers, monkeypatch)[0]


def chains_of(gen) -> list[kir.Kernel]:
    return [k for k in gen.fused if k.name.startswith("g")]


def launched(gen) -> set[str]:
    return {
        s.kernel for t in gen.trees for s in kir.walk_tree(t.body) if isinstance(s, kir.Launch)
    }


def readers(gen, sid: int) -> set[int]:
    """The statements that read statement ``sid``'s buffer."""
    return {
        st.id
        for st in gen.plan.statements
        for node in st.nodes
        for r in node.inputs
        if r.stored and r.src == sid
    }


def test_a_statement_s_rows_gram_and_sums_are_one_kernel():
    gen = gen_of(PROGRAM)
    (chain,) = chains_of(gen)
    z = chain.parts[0]  # the rows', then the gram's and the sum's
    assert readers(gen, z) == set(chain.parts[1:3])
    ops = [gen.plan.statement(sid).node.op for sid in chain.parts[1:3]]
    assert ops == ["matmul", "sum"]
    assert chain.name in launched(gen)
    # z's rows are written by no launch, nor are they the chain's
    assert f"s{z}" not in launched(gen)
    assert all(slot.sid != z for slot in chain.slots)
    assert "reduce g$" in kir.text(chain)


@pytest.mark.parametrize("workers", [0, 3])
def test_a_gram_chain_computes_the_gram_and_the_sums(workers, monkeypatch):
    gen = gen_of(PROGRAM)
    rt = run(gen, workers, monkeypatch)
    # iteration 0 (w = u = 0) in float64
    r = np.arange(4096, dtype=np.float64)[:, None]
    a = np.sin(np.float32(r * np.float32(0.01)) + np.arange(4) * np.float32(0.5)).astype(
        np.float64
    )
    z = (
        np.cos(np.float32(r * np.float32(0.003)) + np.arange(16) * np.float32(0.25)) * 0.5
    ).astype(np.float64)
    np.testing.assert_allclose(rt.value("g")[0], a.T @ z, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(rt.value("s")[0], z.sum(0), rtol=1e-5, atol=1e-4)
    # every iteration as the kernels it stands for compute it, to float32's rounding
    want = run(gen_of(PROGRAM, chains=False))
    for name in "gswu":
        got, exp = rt.value(name), want.value(name)
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5 * np.abs(exp).max())


def test_a_gram_chain_s_values_do_not_depend_on_the_threads(monkeypatch):
    gen = gen_of(PROGRAM)
    one = run(gen)
    many = run(gen, 3, monkeypatch)
    for name in "gswu":
        np.testing.assert_array_equal(one.value(name), many.value(name))


@pytest.mark.parametrize(
    "change",
    [
        "out z\n",  # an output: its rows are kept
        "y[i] = sum(z[i, 0:R] * z[i, 0:R], 0)\nout y\n",  # read by another statement
    ],
)
def test_rows_something_else_reads_keep_their_kernels(change):
    gen = gen_of(PROGRAM + change)
    assert chains_of(gen) == []
    # (the gram is the BLAS's, as without chains)
    kernels = {k.name: k for k in gen.kernels}
    gemms = [
        s
        for name in launched(gen)
        if name in kernels
        for s in kir.walk_tree(kernels[name].body)
        if isinstance(s, kir.Gemm)
    ]
    assert [(g.m, g.k, g.n) for g in gemms] == [(4, 4096, 16)]


def test_a_gram_of_many_columns_or_few_rows_keeps_its_kernels():
    assert chains_of(gen_of(PROGRAM, K=grams.GRAM_M + 1)) == []
    assert chains_of(gen_of(PROGRAM, R=grams.MIN_ROWS - 1)) == []
    # (a layer of 8 inputs and 64 units: 16 chunks of 4.5 KiB of accumulators)
    assert len(chains_of(gen_of(PROGRAM, K=grams.GRAM_M, R=grams.MIN_ROWS, H=64))) == 1


@pytest.mark.parametrize(
    "program, chains, names",
    [
        ("reinforce", 1, ("graw.w1", "graw.b1", "net.w1", "net.b1", "loss", "ep_ret")),
        ("reinforce_td", 2, ("net.pi_w1", "net.pi_b1", "net.v_w1", "net.v_b1", "v_loss")),
    ],
)
def test_reinforce_s_first_layers_gradients_are_gram_chains(program, chains, names):
    """REINFORCE and REINFORCE-TD at 16 x 160 (2,560 rows): each first layer's gradient
    through tanh, its weight's gram over the observations and its bias's sum (with their
    Adam steps) are one kernel; the metrics, the gradient and the parameters as the
    kernels' (float32 rounding; the gradient recorded between the chain and the launches
    it moved over)."""
    path = Path(__file__).resolve().parent.parent / "programs" / f"{program}.rtl"
    text = path.read_text() + "out net\n"
    if program == "reinforce":
        text += "graw[i] = grad(loss[i], net[i])\nout graw\n"
    sets = {"I": 3, "B": 16, "T": 160}
    gen = gen_of(text, **sets)
    assert len(chains_of(gen)) == chains
    got, want = run(gen), run(gen_of(text, chains=False, **sets))
    for name in names:
        exp = want.value(name)
        np.testing.assert_allclose(
            got.value(name), exp, rtol=1e-5, atol=1e-5 * max(np.abs(exp).max(), 1.0)
        )


# ------------------------------------------------------------------ which launches move
# A plan of buffers by id (1: X, the rows; 2: A; 3: the gram's C; 4: the sums; 5: what
# the rows are made from; 6, 7: others), statements reading X (3 and 4), and kernels:
# ``P`` stores X, ``G`` the gram, ``S`` the sums, ``J`` a launch between them.
ROWS, N = 4096, 16


class _Buffer:
    def __init__(self, sid, donor=None):
        self.id, self.donor, self.home, self.outputs = sid, donor, None, (None,)


class _Plan:
    def __init__(self, donors=None):
        donors = donors or {}
        self.buffers = [_Buffer(sid, donors.get(sid)) for sid in range(1, 10)]
        self.outputs, self.metrics = [], []
        read = type("Read", (), {"src": 1, "stored": True})
        node = type("Node", (), {"inputs": (read,)})
        self.statements = [type("St", (), {"id": sid, "nodes": (node,)}) for sid in (3, 4)]

    def buffer(self, sid):
        return self.buffers[sid - 1]


def _slot(sid: int, write: bool = False) -> kir.Slot:
    return kir.Slot(f"b{sid}", "f32", sid, sid, 0, write)


def _nest(body, reduce=()) -> kir.For:
    i64 = kir.i64
    inner = kir.For("e", i64(0), i64(N), body, True)
    return kir.For("r", i64(0), i64(ROWS), (inner,), not reduce, reduce)


def _at():
    return kir.add(kir.mul(kir.Ref("r"), N), kir.Ref("e"))


def _kernels(j_slots=(), s_reads=()):
    i64, f32 = kir.i64, "f32"
    p = kir.Kernel(
        "s1",
        1,
        ("i",),
        (_slot(5), _slot(1, True)),
        (),
        (_nest((kir.Store("b1", _at(), kir.Load("b5", kir.Ref("e"), f32)),)),),
    )
    gemm = kir.Gemm(
        f32, True, False, 4, N, ROWS, "b2", i64(0), 4, "b1", i64(0), N, "b3", i64(0), N
    )
    g = kir.Kernel("s3", 3, ("i",), (_slot(1), _slot(2), _slot(3, True)), (), (gemm,))
    t = kir.Temp("t", "f64", 0, N)
    add = kir.Bin(
        "add",
        kir.Load("t", kir.Ref("e"), "f64"),
        kir.Cast(kir.Load("b1", _at(), f32), "f64"),
        "f64",
    )
    end = kir.Cast(kir.Load("t", kir.Ref("e"), "f64"), f32)
    for sid in s_reads:  # (what the sums' end reads besides)
        end = kir.Bin("add", end, kir.Load(f"b{sid}", kir.Ref("e"), f32), f32)
    s = kir.Kernel(
        "s4",
        4,
        ("i",),
        (_slot(1), _slot(4, True), *(_slot(sid) for sid in s_reads)),
        (t,),
        (
            kir.For(
                "e", i64(0), i64(N), (kir.Store("t", kir.Ref("e"), kir.Const("f64", 0.0)),), True
            ),
            _nest((kir.Store("t", kir.Ref("e"), add),), (("t", "add"),)),
            kir.For("e", i64(0), i64(N), (kir.Store("b4", kir.Ref("e"), end),), True),
        ),
    )
    j = kir.Kernel("s6", 6, ("i",), tuple(j_slots), (), ())
    return {k.name: k for k in (p, g, s, j)}


def _chained(order, plan=None, **kw) -> bool:
    """Whether the launches ``order`` (kernel names, or Host objects) made a chain."""
    kernels = _kernels(**kw)
    body = tuple(
        x if not isinstance(x, str) else kir.Launch(x, kernels[x].sid, (kir.Ref("c"),), (3,))
        for x in order
    )
    tree = kir.Tree("tree0", 0, ("c",), body, 0)
    trees, made = grams.gram_chains(plan or _Plan(), [tree], kernels)
    if made:
        (chain,) = made
        launches = [s.kernel for s in trees[0].body if isinstance(s, kir.Launch)]
        assert launches[0] == chain.name and "s3" not in launches and "s4" not in launches
        # (the grams' statements before the sums', whatever the tree's order)
        assert chain.parts == (1, 3, 4)
    return bool(made)


def test_a_gram_chain_moves_launches_only_over_what_they_do_not_meet():
    between = ["s1", "s3", "s6", "s4"]
    assert _chained(between, j_slots=(_slot(7, True), _slot(8)))
    # J writes what the sums' end reads, reads the sums, writes the gram's A: not moved over
    assert not _chained(between, j_slots=(_slot(7, True),), s_reads=(7,))
    assert not _chained(between, j_slots=(_slot(4),))
    assert not _chained(["s1", "s6", "s3", "s4"], j_slots=(_slot(2, True),))
    # ... nor memory a donation shares with what they touch (9's is 7's)
    assert _chained(between, j_slots=(_slot(9, True),), s_reads=(7,))
    assert not _chained(between, _Plan({9: 7}), j_slots=(_slot(9, True),), s_reads=(7,))


def test_a_gram_chain_keeps_the_order_of_a_sum_s_end_and_a_gram_s_result():
    # the sums' end reads the gram's C: after the gram in the tree, so in the chain
    assert _chained(["s1", "s3", "s4"], s_reads=(3,))
    # before it in the tree it read C's old value, which the chain has overwritten
    assert not _chained(["s1", "s4", "s3"], s_reads=(3,))
    assert _chained(["s1", "s4", "s3"])


def test_a_gram_chain_moves_launches_over_records_of_what_they_do_not_write():
    record_c, record_s = kir.Host(3, 1, ()), kir.Host(4, 1, ())
    assert _chained(["s1", "s3", record_c, "s4"])  # C recorded after the gram: as before
    assert not _chained(["s1", "s3", record_s, "s4"])  # the sums' old values recorded
    assert not _chained(["s1", "s3", kir.Host(6, 0, ()), "s4"])  # a statement the runtime runs


def test_a_gram_alone_is_a_chain_too():
    """Rows only a gram reads: the chain has no sums."""
    text = (
        PROGRAM.replace("s[i] = sum(z[i, 0:R], 0)\n", "")
        .replace("w[i+1] = w[i] + 0.001 * s[i]\n", "w[i+1] = w[i] * 0.5\n")
        .replace("out g, s, w, u", "out g, w, u")
    )
    gen = gen_of(text)
    (chain,) = chains_of(gen)
    assert len(chain.parts) == 2
    got, want = run(gen), run(gen_of(text, chains=False))
    for name in "gwu":
        exp = want.value(name)
        np.testing.assert_allclose(
            got.value(name), exp, rtol=1e-5, atol=1e-5 * max(np.abs(exp).max(), 1.0)
        )
