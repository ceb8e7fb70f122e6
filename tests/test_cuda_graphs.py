"""CUDA graphs in the device runtime (``timerlc/runtime/graphs.py``), on the emulated device:
a run of the loop tree that only launches is captured (its launches kept, not run) the second
time its key comes and replayed after, each launch taking the outer loops' change since the
capture from its call site's shifts. What the emulation checks: which runs are captured and
what their key holds, the shifts (a replay at other outer loop values computes what the
launches compute), the failures read after a replay, and that nothing but launches and
products reaches the device while a graph is captured (a GPU's capture fails on a copy). On a
GPU, CuPy's stream capture does the capturing (``scripts/cuda_gpu_check.py``)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
import re
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import compiled_run, refuses_changed_plans, src

from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.cuda.emu import compiler
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import expr as px
from timerlc.plan import items
from timerlc.plan.items import Call, If, Loop
from timerlc.runtime import graphs
from timerlc.runtime.cuda import DeviceRuntime, EmuDevice

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")

# s runs over i and t; y's take fails first at i = 4, t = 6 (the index leaves its axis)
NESTED = """
config I = 6, T = 8, K = 4, FAR = 100
dim i < I
dim t < T
dim k < K
s[0, 0, k] = f32(k)
s[i, 0, k] = s[i-1, T-1, k] + 1.0
s[i, t, k] = s[i, t-1, k] + 1.0 + y[i, t-1, k] * 0.0
y[i, t, k] = take(s[i, t, 0:K], k + i // 4 * (t // 6) * FAR)
out y
"""


def cuda_gen(text: str, **sets):
    graph = check_source(
        Source("p.rtl", src(text)), overrides={k: str(v) for k, v in sets.items()}
    )
    return graph, generate_code(compile_plan(run_passes(graph)), target="cuda")


def test_split_gives_the_outer_part_and_the_rest():
    outer = frozenset({"i", "j"})
    cases = [
        "i",
        "t",
        ("add", "i", "t", 3),
        ("sub", ("mul", 16, "i"), ("neg", "t")),
        ("add", ("fdiv_q", "i", 16), ("mod", "t", 4)),
        ("mul", 2, 3, ("add", "j", "t")),
        ("fdiv_q", ("sub", "i", 15), 16),
    ]
    rng = random.Random(0)
    for e in cases:
        g, h = graphs.split(e, outer)
        assert px.names(g) <= outer and not px.names(h) & outer, e
        for _ in range(20):
            v = {n: rng.randrange(-50, 50) for n in ("i", "j", "t")}
            at = ("i", "j", "t")
            values = tuple(v[n] for n in at)
            total = px.compile_packed(e, at)(values)
            parts = px.compile_packed(g, at)(values) + px.compile_packed(h, at)(values)
            assert total == parts, (e, v)
    for mixed in [("fdiv_q", ("add", "i", "t"), 2), ("mul", "i", "t"), ("max", "i", "t")]:
        assert graphs.split(mixed, outer) is None


def test_whether_an_item_can_be_captured_is_its_own_answer_not_a_freed_one_s():
    """``capturable_fn`` remembers its answers by the items' ids, each item kept with its
    answer: an item built for one question and freed (the runtime's ``_fuse_calls`` builds
    loops anew) left its id to the next, which got its answer: a loop holding a metric's
    call was captured, once in a few runs of PPO on cuda-emu."""
    ok = graphs.capturable_fn({1})
    for _ in range(200):
        assert ok(Loop("t", 0, True, 1, (Call(1, ("t",)),)))
        assert not ok(Loop("t", 0, True, 1, (Call(2, ("t",)),)))


def test_a_run_s_key_holds_what_the_host_computes_from_the_outer_loops():
    class _Plan:  # (statements 1 and 2, over (i, t) and (i,))
        @staticmethod
        def statement(sid):
            return dataclasses.make_dataclass("S", ["loops"])(("i", "t") if sid == 1 else ("i",))

    run = [
        If(("eq", ("mod", "c1", 16), 0), (Call(2, (("fdiv_q", "c1", 16),)),)),
        Loop(
            "c3",
            0,
            ("le", "c3", ("add", "c1", 5)),  # (bounds that mix: the outer value itself)
            1,
            (
                If(("ge", "c3", 1), (Call(1, ("c1", "c3")),)),
                Call(1, (("fdiv_q", "c1", 16), ("fdiv_q", ("add", "c1", "c3"), 2))),
            ),
        ),
    ]
    shape = graphs.analyze(run, ("c1",), lambda sid: _Plan.statement(sid).loops, {}, set())
    assert shape.key == (("eq", ("mod", "c1", 16), 0), "c1")
    assert shape.parts == (("fdiv_q", "c1", 16), "c1")
    # per site: the part each value takes its shift from (0: none; the mixed one is keyed)
    assert shape.sites == [(2, (1,)), (1, (2, 0)), (1, (1, 0))]
    # at most 8 outer parts (what tl_set_shift takes by value): the others key the graph
    many = [Call(2, (("add", "c1", k),)) for k in range(10)]
    many += [Call(2, (("mul", k, "c1"),)) for k in range(2, 12)]
    shape = graphs.analyze(many, ("c1",), lambda sid: _Plan.statement(sid).loops, {}, set())
    assert len(shape.parts) == graphs.ARGS and shape.parts[0] == "c1"
    assert shape.sites[:10] == [(2, (1,))] * 10  # (c1 + k: the part c1)
    assert [s for _, (s,) in shape.sites[10:]] == [2, 3, 4, 5, 6, 7, 8, 0, 0, 0]
    assert shape.key == (("mul", 9, "c1"), ("mul", 10, "c1"), ("mul", 11, "c1"))
    # runs: consecutive items that only launch, if more than one launch
    free = items.Free((3,))
    launches = lambda it: not isinstance(it, items.Free)
    assert graphs.runs(run + [free] + run[:1], launches) == [run, free, run[0]]
    assert graphs.runs([free, run[0], run[0]], launches) == [free, [run[0], run[0]]]


@functools.lru_cache(maxsize=4)
def _plain(program: str, sets: tuple):
    """(the generated code, the metrics of its run as launches: no graph)"""
    gen = _program(program, dict(sets))
    return gen, _run(gen, False)


def _run(gen, graphs_on: bool, device=None):
    got: list = []
    rt = DeviceRuntime(
        gen.plan,
        lambda *m: got.append(m),
        text=gen.text,
        device=device or EmuDevice(),
        graphs=graphs_on,
    )
    rt.run()
    rt.envs.close()
    return rt, got


def _program(name: str, sets: dict):
    path = PROGRAMS / f"{name}.rtl"
    graph = check_source(
        Source(str(path), path.read_text()), overrides={k: str(v) for k, v in sets.items()}
    )
    return generate_code(compile_plan(run_passes(graph)), target="cuda")


@needs_cxx
@pytest.mark.parametrize(
    ("program", "sets"),
    [
        ("ppo", {"B": 4, "T": 16, "total_steps": 256}),
        ("reinforce", {"I": 8, "B": 4, "T": 16}),
        ("rnn_reinforce", {"I": 8, "B": 4, "T": 16}),
    ],
)
def test_replayed_graphs_compute_what_the_launches_compute(program, sets):
    """The same kernels in the same order, most of them replayed from graphs: the metrics
    and the values are the same bits as the launches'."""
    gen, (plain, want) = _plain(program, tuple(sorted(sets.items())))
    rt, got = _run(gen, True)
    assert got == want
    assert rt.graphs_made >= 1 and rt.graph_replays > rt.graphs_made
    assert rt.launches == plain.launches and rt.blas_calls == plain.blas_calls
    # most of the work was replayed (the first calls of each run are launches)
    assert rt.graph_launches > 0.5 * (rt.launches + rt.blas_calls)


@needs_cxx
def test_a_failure_in_a_replayed_graph_is_explained_with_the_values_it_saw():
    """The loop over i's body is a run: captured at i = 2 and replayed after, its launches
    taking i from their shifts. The take fails at i = 4 in a replay: the failure record holds
    the values the kernel computed (i = 4, not the capture's 2), and the interpreter explains
    that call, as on the cpu backend."""
    graph, gen = cuda_gen(NESTED, FAR=100)
    with pytest.raises(RunError) as want:
        compiled_run(graph, backend="cpu")
    device = EmuDevice()
    rt = DeviceRuntime(gen.plan, text=gen.text, device=device)
    with pytest.raises(RunError) as got:
        rt.run()
    assert str(got.value) == str(want.value)
    assert "at i=4, t=6, k=0" in str(got.value) and "index 100 is out of range" in str(got.value)
    assert rt.graphs_made >= 1 and rt.graph_replays >= 3
    # and without the failure, the values are the cpu backend's
    graph, gen = cuda_gen(NESTED, FAR=0)
    cpu, _ = compiled_run(graph, backend="cpu")
    rt, _ = _run(gen, True)
    np.testing.assert_array_equal(rt.value("y"), cpu.value("y"))
    assert rt.graph_replays >= 3


def _crafted(gen, tree):
    """``gen``'s plan with the loop tree ``tree`` and its kernel file made to match it (as
    a crafted build would be: the digests are no secret)."""
    plan = dataclasses.replace(gen.plan, tree=tree)
    _, rest = gen.text.split("\n", 1)
    text = items.CUDA_KERNELS_HEADER + items.digest(plan) + "\n" + rest
    kernels = dataclasses.replace(plan.kernels, sha256=hashlib.sha256(text.encode()).hexdigest())
    return dataclasses.replace(plan, kernels=kernels), text


@needs_cxx
def test_a_replay_that_would_call_outside_a_box_runs_as_launches_which_refuse_it():
    """A crafted plan whose loop over i runs one step past the box: the replay at i = 6
    would shift the calls outside their statements' boxes (the kernels index buffers by
    them); the host checks the shifted ranges first and runs the launches instead, which
    refuse the call as without graphs."""
    _, gen = cuda_gen(NESTED, FAR=0)
    loop = next(it for it in gen.plan.tree if isinstance(it, Loop))
    assert loop.cond == ("le", "c1", 5)
    tree = tuple(
        dataclasses.replace(it, cond=("le", "c1", 6)) if it is loop else it for it in gen.plan.tree
    )
    plan, text = _crafted(gen, tree)
    messages = []
    for on in (False, True):
        rt = DeviceRuntime(plan, text=text, device=EmuDevice(), graphs=on)
        with pytest.raises(items.PlanError, match="outside") as e:
            rt.run()
        messages.append(str(e.value))
        assert rt.graph_replays >= (3 if on else 0)
    assert messages[0] == messages[1] and "i=6" in messages[1]


@needs_cxx
def test_nothing_but_launches_reaches_the_device_while_a_graph_is_captured():
    """A GPU's capture fails on a copy or a wait (the runtime makes them before): the
    emulation refuses them too, and keeps the launches and products for the replays."""
    device = EmuDevice()
    ptr = device.alloc(64)
    host = np.arange(8, dtype=np.float64)
    device.begin_capture()
    for what, call in [
        ("a copy to the device", lambda: device.upload(ptr, host)),
        ("a copy from the device", lambda: device.download(ptr, host)),
        ("a zeroing", lambda: device.zero(ptr, 64)),
        ("a read of the failure record", device.failure),
    ]:
        with pytest.raises(RunError, match=f"internal error: {what} while a CUDA graph"):
            call()
    a, c = device.alloc(4 * 8), device.alloc(4 * 8)
    device.gemm("f64", 2, 2, 2, a, 2, False, a, 2, False, c, 2)  # (kept, not run)
    graph = device.end_capture()
    assert len(graph) == 1
    device.upload(a, np.array([1.0, 2.0, 3.0, 4.0]))
    device.zero(c, 32)
    out = np.zeros(4)
    device.download(c, out)
    assert (out == 0).all()
    device.replay(graph)
    device.download(c, out)
    assert out.tolist() == [7.0, 10.0, 15.0, 22.0]


@needs_cxx
def test_a_replay_runs_the_calls_in_any_order_their_waits_allow(monkeypatch):
    """A graph's calls wait only for the calls that wrote what they read or write, or read
    what they write (``graphs.Order``; the arena's shared bytes count): the emulation replays
    them as far from the capture's order as that allows, so a wait left out gives other
    values (broken on purpose here: the values differ, or a take reads garbage)."""
    gen, (_, want) = _plain("ppo", tuple(sorted({"B": 4, "T": 16, "total_steps": 256}.items())))
    real = graphs.Order.call

    def no_waits(self, reads, writes, weight=1):
        real(self, reads, writes, weight)
        return set()

    monkeypatch.setattr(graphs.Order, "call", no_waits)
    try:
        _, got = _run(gen, True)
    except RunError:  # (or a call read garbage that a take refused)
        got = None
    assert got != want


def test_a_replay_s_box_check_is_each_part_s_range_of_changes():
    """``graphs.part_bounds``: a replay checks each outer part's change since the capture
    against a range worked out once; the range lets through exactly the changes at which
    every call site's shifted loop values stay inside its box (as checking every site and
    value would), sites and values never launched (``_FAR``) aside; a value no part
    shifts that is outside its box refuses every change."""
    far = graphs._FAR
    rng = random.Random(7)
    for case in range(300):
        sites, parts = rng.randint(1, 4), rng.randint(0, 3)
        index = np.array(
            [[rng.randint(0, parts) for _ in range(graphs.ARGS)] for _ in range(sites)], np.int64
        )
        lo = np.full((sites, graphs.ARGS), far, np.int64)
        hi = np.full((sites, graphs.ARGS), -far, np.int64)
        box = np.full((sites, graphs.ARGS), far, np.int64)
        for k in range(sites):
            n = rng.randint(0, graphs.ARGS)  # (the site's loop values; the rest unused)
            box[k, :n] = [rng.randint(1, 12) for _ in range(n)]
            if rng.random() < 0.8:  # (else a site the capture never launched)
                for j in range(n):
                    a = rng.randint(-1 if case % 10 == 0 else 0, box[k, j] - 1)
                    lo[k, j], hi[k, j] = a, rng.randint(a, box[k, j])
        bounds = graphs.part_bounds(index, lo, hi, box, parts)
        for _ in range(20):
            deltas = [rng.randint(-12, 12) for _ in range(parts)]
            shifts = np.array([0, *deltas], np.int64)[index]
            inside = not (np.any(lo + shifts < 0) or np.any(hi + shifts >= box))
            got = bounds is not None and all(a <= d <= b for d, (a, b) in zip(deltas, bounds))
            assert got == inside, (case, deltas)


def test_the_waits_of_a_call_are_those_that_touch_its_bytes():
    order = graphs.Order({"a": ["a", "b"], "b": ["b", "a"]})  # (a and b share bytes)
    assert order.call((), ("a",)) == set()  # 0 writes a
    assert order.call(("a",), ("c",)) == {0}  # 1 reads a
    assert order.call(("a",), ("d",)) == {0}  # 2 reads a: no wait for 1
    assert order.call((), ("b",)) == {0, 1, 2}  # 3 writes b, a's bytes: after a's uses
    assert order.call(("c",), ("e",)) == {1}
    assert order.call((), ("c",)) == {1, 4}  # 5 writes c: after its writer and readers


def test_calls_take_halves_of_the_scratch_memory_in_turn():
    """``DeviceRuntime._scratch_for``: a call that fits in half of the scratch memory takes
    the half the last such call did not (its bytes at the start, or ending at the end,
    256-byte aligned), and that half is its resource in the graph (``"scratch"``,
    ``"scratch-top"``): two such calls one after the other wait for nothing of each
    other's; a larger call takes both, after both; a call of none takes none."""
    gen = _program("ppo", {"B": 4, "T": 16, "total_steps": 256})
    rt = DeviceRuntime(gen.plan, lambda *m: None, text=gen.text, device=EmuDevice())
    total, base = rt._scratch_bytes, rt._scratch
    rt._statement_scratch.update({-1: 0, -2: 1000, -3: total})
    assert total >= 4 * 1000 and total % 256 == 0
    assert rt._scratch_for(-1) == (base, ())
    first, second, third = (rt._scratch_for(-2) for _ in range(3))
    assert first == third and {first[1], second[1]} == {("scratch",), ("scratch-top",)}
    bottom, top = sorted((first, second))
    assert bottom == (base, ("scratch",)) and top[1] == ("scratch-top",)
    assert (top[0] - base) % 256 == 0 and base + total // 2 <= top[0] <= base + total - 1000
    assert rt._scratch_for(-3) == (base, ("scratch", "scratch-top"))
    order = graphs.Order({})
    order.call((), first[1])
    assert order.call((), second[1]) == set()
    assert order.call((), ("scratch", "scratch-top")) == {0, 1}


def test_a_graph_s_longest_chain_counts_the_launches_that_wait_for_each_other():
    """``graphs.Order.chain``: the launches and products a GPU runs one after another (a
    call's own in a row, then the longest chain of the calls it waits for); calls beside it
    add nothing (``DeviceRuntime.chained``, a replay's share); a call's launches counted
    once made (``weigh``: a product's functions)."""
    order = graphs.Order({})
    order.call((), ("a",), 2)  # 0: two launches
    order.call(("a",), ("b",), 3)  # 1 waits for 0: 5
    order.call((), ("c",), 4)  # 2 beside them: 4
    assert order.chain == 5
    order.call(("b", "c"), ("d",), 1)  # 3 waits for 1 and 2: 6
    assert order.chain == 6 and order.depth == [2, 5, 4, 6]
    # a product's launches are known once it ran (``weigh``): ours, a part and a sum
    order.call(("d",), ("e",), 1)  # 4 waits for 3
    order.weigh(2)
    assert order.chain == 8 and order.depth == [2, 5, 4, 6, 8]
    order.weigh(0)  # (one that did not run at the call)
    assert order.chain == 6 and order.depth[-1] == 6


def test_cupy_device_s_capture_puts_calls_on_streams_and_waits_for_events():
    """``CupyDevice.depend`` while capturing: a call goes to the stream whose last call it
    waits for, or to the next stream in turn, waiting for the events of the calls it needs
    on other streams (a side stream joins the capture through the event recorded when it
    began); the launches' stream waits for the side streams' last calls at the end."""
    from types import SimpleNamespace

    from timerlc.runtime import cuda

    log = []

    class _Event:
        def record(self, stream):
            self.stream = stream
            log.append(("record", stream.name))

    class _Stream:
        def __init__(self, name):
            self.name, self.ptr = name, hash(name)

        def wait_event(self, event):
            log.append(("wait", self.name, event.stream.name))

        def begin_capture(self):
            log.append(("begin", self.name))

        def end_capture(self):
            log.append(("end", self.name))
            return "graph"

    dev = object.__new__(cuda.CupyDevice)
    dev.cp = SimpleNamespace(cuda=SimpleNamespace(Event=lambda disable_timing: _Event()))
    dev._streams = [_Stream("main"), _Stream("s1"), _Stream("s2"), _Stream("s3")]
    dev._stream_obj = dev._streams[0]
    dev.begin_capture()
    assert log == [("begin", "main"), ("record", "main")]
    log.clear()
    dev.depend(set())  # call 0: stream 0 % 4 (main)
    dev.depend({0})  # call 1: after 0, on its stream
    assert dev._stream == dev._streams[0].ptr
    dev.depend(set())  # call 2: stream 2, which joins the capture
    assert dev._stream == dev._streams[2].ptr
    dev.depend({1, 2})  # call 3: on s2 (after 2), waiting for 1's event on main
    dev.depend({0})  # call 4: main is 1's now: the next stream in turn (s4 % 4 = main)
    assert dev.end_capture() == "graph" and dev._stream == dev._streams[0].ptr
    assert log == [
        ("record", "main"),  # (after call 0)
        ("record", "main"),  # (after 1)
        ("wait", "s2", "main"),  # 2 joins through the capture's first event
        ("record", "s2"),
        ("wait", "s2", "main"),  # 3 waits for 1
        ("record", "s2"),
        ("record", "main"),  # (after 4, on main: 0 was there before it)
        ("wait", "main", "s2"),  # the end: main waits for s2's last call
        ("end", "main"),
    ]


@needs_cxx
def test_a_capture_the_device_refuses_leaves_the_run_to_its_launches(capsys):
    """A GPU may refuse a capture (a CUDA error at its start, a launch or its end): the run
    then goes as launches, the same values, and stderr says so once; a run's own error (a
    plan's) is not a refusal."""
    gen, (plain, want) = _plain("reinforce", tuple(sorted({"I": 4, "B": 4, "T": 16}.items())))

    class Refusing(EmuDevice):
        def end_capture(self):
            super().end_capture()
            raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted")

    rt, got = _run(gen, True, Refusing())
    assert got == want and rt.graphs_made == 0 and rt.graph_refusals
    err = capsys.readouterr().err
    assert err.count("could not capture a CUDA graph (RuntimeError: cudaError") == 1
    # (each refused capture's counts undone: the launches are the plain run's)
    assert rt.launches == plain.launches and rt.graph_replays == 0


@needs_cxx
def test_replays_can_be_timed_per_run():
    """``time_graphs``: the device's seconds of each run's replays, between two marks
    around each (CUDA events on a GPU; the host's clock here), by the run's description."""
    gen, _ = _plain("reinforce", tuple(sorted({"I": 4, "B": 4, "T": 16}.items())))
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice(), time_graphs=True)
    rt.run()
    assert rt.graph_seconds and sum(n for _, n in rt.graph_seconds.values()) == rt.graph_replays
    assert all(s > 0 for s, _ in rt.graph_seconds.values())
    assert all(re.fullmatch(r"\d+ calls from \S+ \(depth \d+\)", run) for run in rt.graph_seconds)


# ----------------------------------------------------------------------------- fused kernels
# y's take fails at t = 4; what z and w read of y is computed in the kernel after y's, at the
# same points: one fused kernel of the two (the loop over t: s reads z)
FUSED_FAILS = """
config T = 6, K = 300, FAR = 1000
dim t < T
dim k < K
s[0, k] = f32(k)
s[t, k] = s[t-1, k] + 1.0 + z[t-1, k] * 0.0
y[t, k] = take(s[t, 0:K], i32(s[t, k]) - t + t // 4 * FAR)
z[t, k] = y[t, k] * 2.0 + 1.0
w[t, k] = y[t, k] - 3.0
out z, w
"""


@needs_cxx
def test_fused_kernels_compute_what_their_statements_kernels_compute():
    """``codegen.fuse`` makes one kernel of calls one after another at the same loop values
    (plan.kernels.fused, their launches in fused_launches): the device runtime makes one
    call of it where the tree calls them. PPO: the same values as each statement's own
    kernel, in fewer launches."""
    gen, (plain, want) = _plain(
        "ppo", tuple(sorted({"B": 4, "T": 16, "total_steps": 256}.items()))
    )
    assert len(gen.plan.kernels.fused) >= 10
    apart = dataclasses.replace(
        gen.plan, kernels=dataclasses.replace(gen.plan.kernels, fused=(), fused_launches=())
    )
    gen_apart = dataclasses.replace(gen, plan=apart)
    rt, got = _run(gen_apart, False)
    assert got == want and rt.launches > plain.launches * 1.1


def _fails_as_on_cpu(graph, gen, **options) -> str:
    """The cpu backend's error for ``graph``, which the device runtime (with and without
    graphs) gives word for word too."""
    with pytest.raises(RunError) as want:
        compiled_run(graph, backend="cpu")
    for on in (False, True):
        rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice(), graphs=on, **options)
        with pytest.raises(RunError) as got:
            rt.run()
        assert str(got.value) == str(want.value)
    return str(want.value)


@needs_cxx
def test_a_failure_in_a_fused_kernel_names_its_statement():
    """A fused kernel's failure records its first statement and, as its code, the failing
    statement's place in it: the interpreter explains that statement's call, as on the
    cpu; with and without graphs."""
    graph, gen = cuda_gen(FUSED_FAILS)
    ((first, second),) = gen.plan.kernels.fused
    unfailing = set(gen.plan.kernels.unfailing)
    assert first not in unfailing and second in unfailing  # (the take: the first)
    want = _fails_as_on_cpu(graph, gen)
    assert "at t=4, k=0 (line 6): take: index 1000 is out of range" in want
    graph, gen = cuda_gen(FUSED_FAILS, FAR=0)
    cpu, _ = compiled_run(graph, backend="cpu")
    rt, _ = _run(gen, True)
    np.testing.assert_array_equal(rt.value("z"), cpu.value("z"))


# x (over k) and y (over j) at the same t, neither reading the other: one kernel, one after
# the other (y's take fails at t = 4 where FAR > 0)
CONCAT_FAILS = """
config T = 6, K = 300, J = 200, FAR = 1000
dim t < T
dim k < K
dim j < J
c[k] = f32(k) * 0.5
s[0, k] = c[k]
s[t, k] = s[t-1, k] + x[t-1, k] + sum(y[t-1, 0:J]) * 0.001
x[t, k] = take(s[t, 0:K], (k + 2) % K) * 0.5
y[t, j] = take(s[t, 0:K], j + t // 4 * FAR) * 0.25
last[k] = s[T-1, k] + 0.0
out last
"""


def test_independent_kernels_are_one_kernel_and_one_launch():
    """``fuse.concat``: a kernel's statements then another's where they touch nothing of
    each other's (x's loop over k, y's over j: no loop to fuse them into); the renderer runs
    their parallel loops in one function."""
    from timerlc.codegen import fuse
    from timerlc.cuda import render

    _, gen = cuda_gen(CONCAT_FAILS, FAR=0)
    ks = {k.sid: k for k in gen.kernels}
    ((x, y),) = gen.plan.kernels.fused
    assert fuse.fuse(ks[x], ks[y], "v") is None
    both = fuse.concat(ks[x], ks[y], "xy")
    assert both is not None and both.parts == (x, y)
    assert [kind for kind, _ in render.steps(both)] == ["either"]
    s = next(b.id for b in gen.plan.buffers if b.name == "s")
    assert fuse.concat(ks[s], ks[x], "sx") is None  # (x reads what s writes)
    (row,) = gen.plan.kernels.fused_launches
    assert len(row[1]) == 1  # (one launch)


@needs_cxx
def test_a_failure_in_one_of_independent_kernels_names_its_statement():
    graph, gen = cuda_gen(CONCAT_FAILS)
    want = _fails_as_on_cpu(graph, gen, loops=False)
    assert "at t=4, j=0 (line 9): take: index 1000 is out of range" in want
    graph, gen = cuda_gen(CONCAT_FAILS, FAR=0)
    cpu, _ = compiled_run(graph, backend="cpu")
    rt, _ = _run(gen, True)
    np.testing.assert_allclose(rt.value("last"), cpu.value("last"), rtol=1e-6)


def test_plans_fused_launches_are_checked():
    import json

    _, gen = cuda_gen(FUSED_FAILS)
    data = items.to_json(gen.plan)
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    first_function = data["kernels"]["launches"][0][1][0][0]
    cases = [
        (lambda k: k.pop("fused_launches"), "has no 'fused_launches'"),
        (lambda k: k["fused_launches"].append(k["fused_launches"][0]), "one entry per fused"),
        (lambda k: k["fused_launches"][0].__setitem__(1, []), "1 to 64 launches"),
        (lambda k: k["fused_launches"][0].__setitem__(0, -1), "out of range"),
        (lambda k: k["fused_launches"][0][1][0].__setitem__(0, first_function), "named twice"),
        (lambda k: k.__setitem__("fused", []), "only a CUDA kernel file's plan with fused"),
        (lambda k: k["fused"][0].append(k["launches"][0][0]), "numbers of loop dims"),
    ]
    refuses_changed_plans(data, cases)
