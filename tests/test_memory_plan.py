"""The memory plan (``timerlc/plan/memory.py``, ``docs/plan.md`` "Storage"): ring buffers
along the iteration loop, frees after the last use, donation of dying buffers; the cpu
runtime obeys it and still gives the reference's outputs and metrics.

The runtime runs in checking mode here (``check_windows``): it records which point each
slot of a ring buffer holds and fails any read that finds another one, so a window too
small for the schedule cannot pass unnoticed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import plan_run, src

from timerlc.codegen import kir
from timerlc.compiler import compile_plan, run_passes
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import items
from timerlc.plan.items import (
    Buffer,
    Call,
    Free,
    Home,
    Plan,
    Slice,
    SwapIn,
    SwapOut,
    Window,
)
from timerlc.reference.interpreter import run_graph
from timerlc.runtime.cpu import CpuRuntime
from timerlc.runtime.plan import PlanError, load_plan

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
REINFORCE = {"I": 3, "B": 4, "T": 20}
PPO = {"total_steps": 64, "B": 2, "T": 16}


def source_of(name: str) -> Source:
    path = PROGRAMS / f"{name}.rtl"
    return Source(str(path), path.read_text())


def graph_of(source: Source, sets: dict, optimize: bool = True):
    overrides = {k: str(v) for k, v in sets.items()}
    return run_passes(check_source(source, overrides), None, optimize)


def run_both(source: Source, sets: dict, plan: Plan | None = None):
    """The reference on the program as written; the cpu runtime (checking its windows) on
    the optimized program's plan (or on ``plan``). Both metric streams are returned."""
    written = graph_of(source, sets, optimize=False)
    ref_m, cpu_m = [], []
    ref = run_graph(written, lambda n, p, v: ref_m.append((n, tuple(sorted(p.items())), float(v))))
    plan = plan if plan is not None else compile_plan(graph_of(source, sets))
    rt = CpuRuntime(
        plan,
        lambda n, p, v: cpu_m.append((n, tuple(sorted(p.items())), float(v))),
        check_windows=True,
    )
    rt.run()
    rt.envs.close()
    return ref, ref_m, rt, cpu_m


def assert_same(written_graph, ref, ref_m, rt, cpu_m):
    for out in written_graph.outputs:
        want, got = ref.value(out), rt.value(out)
        assert got.dtype == want.dtype and got.shape == want.shape, out
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=out)
    assert len(cpu_m) == len(ref_m)
    for (n1, p1, v1), (n2, p2, v2) in zip(sorted(ref_m), sorted(cpu_m)):
        assert (n1, p1) == (n2, p2)
        assert np.isclose(v1, v2, rtol=1e-5, atol=1e-6, equal_nan=True), (n1, p1, v1, v2)


def buffer_named(plan: Plan, name: str) -> Buffer:
    (buf,) = [b for b in plan.buffers if b.name == name]
    return buf


def storage(plan: Plan, name: str) -> Window | None:
    """The window of the buffer of tensor ``name`` (None: a block)."""
    return buffer_named(plan, name).window


def frees(plan: Plan) -> list[int]:
    return [s for item in plan.tree if isinstance(item, Free) for s in item.buffers]


def donors(plan: Plan) -> dict[int, int]:
    return {b.id: b.donor for b in plan.buffers if b.donor is not None}


def block_bytes(plan: Plan) -> int:
    """What the plan's buffers would take as blocks over their boxes, all alive at once."""
    return sum(replace(b, window=None).nbytes for b in plan.buffers)


def check_decisions(plan: Plan):
    """What every plan must satisfy: windows shrink extents, frees and donors are safe."""
    kept = {sid for _, sid, _ in plan.outputs + plan.metrics}
    for b in plan.buffers:
        if b.window is not None:
            assert b.id not in kept
            for out in range(len(b.outputs)):
                wraps, ext = b.wraps(out), b.extents(out)
                assert len(wraps) == len(b.windows_of(out))  # (two dims apart)
                for k, size in wraps.items():
                    assert 1 <= size == ext[k] < b.box[k]
                assert all(ext[k] == b.box[k] for k in range(len(b.box)) if k not in wraps)
            if b.inner_outputs is not None:
                assert b.inner is not None and 0 < len(b.inner_outputs) < len(b.outputs)
        else:
            assert b.inner is None and b.inner_outputs is None and b.extents(0) == b.box
    freed = frees(plan)
    assert len(freed) == len(set(freed)) and not set(freed) & kept
    # no budget, no swaps (tests/test_memory_budget.py has the swaps)
    assert plan.memory_budget is None and plan.memory_budget_met is None
    assert not any(isinstance(item, (SwapOut, SwapIn)) for item in plan.tree)
    assert plan.memory_peak == plan.memory_peak_unswapped > 0
    for y, x in donors(plan).items():
        bx, by = plan.buffer(x), plan.buffer(y)
        assert bx.window is None and x not in kept
        assert [o.dtype for o in bx.outputs] == [o.dtype for o in by.outputs]
        assert bx.nbytes == by.nbytes > 0
        assert plan.statement(y).loops == ()
        # y is a top-level item of its own, and no later item uses x: its free (if the run
        # does not end there) comes right after y
        tree = plan.tree
        k = next(
            k for k, item in enumerate(tree) if isinstance(item, Call) and item.statement == y
        )
        assert k == len(tree) - 1 or x in tree[k + 1].buffers


# ----------------------------------------------------------------------------- the programs
def test_reinforce_plan_windows_frees_and_donations():
    plan = compile_plan(graph_of(source_of("reinforce"), REINFORCE))
    check_decisions(plan)
    one = Window("i", 1)
    # the rollout, the returns, the loss terms and their gradients: this iteration only
    for name in ("o", "g", "run"):
        assert storage(plan, name) == one, name
    rollout = [b for b in plan.buffers if b.dims == ("i", "b", "t")]
    assert len(rollout) > 10 and all(b.window == one for b in rollout)
    # the parameters and the gradients (per iteration, of a parameter's shape)
    shapes = {b.outputs[0].shape for b in plan.buffers if b.name == "net.w1"}
    grads = [b for b in plan.buffers if b.dims == ("i",) and b.outputs[0].shape in shapes]
    assert len(grads) >= 4
    # (two iterations at most: a window, or a block of two where the domain has two points,
    # Adam's new values at I = 3: the last update's, which no one reads, not computed)
    assert all(b.extents(0)[0] <= 2 for b in grads), [(b.name, b.window, b.box) for b in grads]
    assert storage(plan, "net.w1") == one  # read only in its own iteration
    # (what used to be computed for all i ahead of the loop, and donated, now runs inside
    # it, one iteration at a time: the schedule joins such producers to their loop)
    assert frees(plan)


def test_ppo_plan_windows_frees_and_donations():
    plan = compile_plan(graph_of(source_of("ppo"), PPO))
    check_decisions(plan)
    one = Window("i", 1)
    for name in ("v", "adv", "run"):
        assert storage(plan, name) == one, name
    for name in ("net.pi_w1", "net.v_w3"):
        assert storage(plan, name) == Window("j", 1), name
    # last_clipfrac[i] = mean(clipfrac[i*K : i*K+K]): the K = 16 minibatch steps of i are
    # read at the end of iteration i, so clipfrac keeps a window of 16 along j
    assert Window("j", 16) in [b.window for b in plan.buffers]
    # perm[e], read as perm[j // MB] in the loop over j: one epoch's permutation at a time
    (perm,) = [s.id for s in plan.statements if s.node.op == "random_permutation"]
    assert plan.buffer(perm).window == Window("e", 1)
    assert frees(plan)
    # the observation of a step, read by the merge o at the next step and, at an
    # iteration's first step, at the last step of the iteration before (o[i, b, 0] =
    # o[i - 1, b, T]): that read comes before the iteration's first step writes, so one
    # iteration's slots (memory._reads_first), and one step's: the merge reads it before
    # the step writes the next
    (step,) = [s.id for s in plan.statements if s.node.op == "env_step"]
    buf = plan.buffer(step)
    assert (buf.window, buf.inner, buf.inner_outputs) == (Window("i", 1), Window("t", 1), (0,))


@pytest.mark.parametrize(
    "name, sets",
    [
        ("reinforce", REINFORCE),
        ("ppo", PPO),
        ("rnn_reinforce", {"I": 3, "B": 3, "T": 12}),
        ("reinforce_td", {"I": 3, "B": 3, "T": 12}),
    ],
)
def test_program_with_memory_plan_equals_reference(name, sets):
    source = source_of(name)
    ref, ref_m, rt, cpu_m = run_both(source, sets)
    assert_same(graph_of(source, sets, optimize=False), ref, ref_m, rt, cpu_m)
    assert ref_m
    assert len(rt.donated) == len(donors(rt.plan))  # the runtime took what the plan donates
    assert 0 < rt.live_bytes <= rt.peak_bytes < block_bytes(rt.plan) / 2
    assert rt.peak_bytes <= rt.plan.memory_peak  # the plan's own count bounds the run's


def test_peak_buffer_bytes_do_not_grow_with_the_iterations():
    peaks, ends, blocks = {}, {}, {}
    for n in (3, 12):
        plan = compile_plan(graph_of(source_of("reinforce"), {"I": n, "B": 2, "T": 8}))
        rt = CpuRuntime(plan)
        rt.run()
        rt.envs.close()
        peaks[n], ends[n], blocks[n] = rt.peak_bytes, rt.live_bytes, block_bytes(plan)
    # blocks grow by every iteration's rollout; the plan only by a few scalars per
    # iteration (the metrics, and what runs batched over i before the loop)
    assert blocks[12] - blocks[3] > 9 * 2 * 8 * 4 * 64
    assert peaks[12] - peaks[3] <= 9 * 64
    assert ends[12] - ends[3] <= 9 * 64
    assert peaks[12] < blocks[12] / 5


# ----------------------------------------------------------------------------- windows
LATER = """
    config I = 10, K = 3, N = 4
    dim i < I
    dim n < N
    s[0, n] = f32(n) + 1.0
    s[i+1, n] = 0.5 * s[i, n] + 0.25 * x[max(i - K, 0), n]
    x[i, n] = sin(s[i, n]) + f32(i)
    m[i] = sum(x[i, 0:N])
    fin = s[I, 0:N]
    out fin
    metric m
"""


def later_plan(k: int) -> tuple[Source, dict, Plan]:
    source = Source("later.rtl", src(LATER))
    plan = compile_plan(graph_of(source, {"K": k}))
    return source, {"K": k}, plan


def windowed(plan: Plan) -> dict[int, int]:
    return {b.id: b.window.size for b in plan.buffers if b.window is not None}


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_a_tensor_read_k_iterations_later_keeps_k_plus_one_slots(k):
    source, sets, plan = later_plan(k)
    check_decisions(plan)
    # x (whatever the passes call it) is read k iterations after it is written
    assert max(windowed(plan).values()) == k + 1
    ref, ref_m, rt, cpu_m = run_both(source, sets, plan)
    assert_same(graph_of(source, sets, optimize=False), ref, ref_m, rt, cpu_m)


def shrunk(plan: Plan, sid: int) -> Plan:
    """``plan`` with the window of ``sid`` one slot shorter, as an edited plan.json."""
    data = items.to_json(plan)
    (buf,) = [b for b in data["buffers"] if b["id"] == sid]
    buf["storage"]["size"] -= 1
    return items.from_json(data)


def test_a_window_one_slot_short_is_caught_and_would_be_wrong():
    source, sets, plan = later_plan(3)
    sid = max(windowed(plan), key=windowed(plan).get)
    bad = shrunk(plan, sid)
    with pytest.raises(RunError, match="window too small"):
        CpuRuntime(bad, check_windows=True).run()
    # without the check, the run silently reads the wrong iteration: the outputs differ
    rt = CpuRuntime(bad)
    rt.run()
    ref = run_graph(graph_of(source, sets, optimize=False))
    assert not np.allclose(rt.value("fin"), ref.value("fin"))


def test_slices_of_a_window_wrap_each_index():
    # flat[i] reads xs[i : i+3]: a slice along the windowed dim, three slots
    text = """
        config I = 8, N = 3
        dim i < I
        dim n < N
        s[0, n] = f32(n) * 0.5
        xs[0, n] = 0.0
        xs[1, n] = 1.0
        xs[i+2, n] = cos(s[i, n]) * f32(i + 1)
        flat[i] = reshape(xs[i : i+3, 0:N], [3 * N])
        s[i+1, n] = 0.9 * s[i, n] + 0.1 * sum(flat[i]) * f32(n + 1)
        m[i] = sum(flat[i])
        fin = s[I, 0:N]
        out fin
        metric m
    """
    source = Source("slice.rtl", src(text))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    assert storage(plan, "xs") == Window("i", 3)
    reads = [
        r
        for st in plan.statements
        for n in st.nodes
        for r in n.inputs
        if r.stored and plan.buffer(r.src).name == "xs"
    ]
    assert any(isinstance(r.access[0], Slice) for r in reads)
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)


def test_outputs_metrics_and_what_is_read_after_the_loop_stay_blocks():
    source, sets, plan = later_plan(2)
    assert storage(plan, "s") is None  # a block: fin reads s[I] after the loop
    assert storage(plan, "m") is None  # a metric
    assert storage(plan, "fin") is None


# ----------------------------------------------------------------------------- frees, donation
DONATE = """
    config N = 6
    dim n < N
    x[n] = f32(n) * 2.0 + 1.0
    y[n] = x[N - 1 - n] * 3.0
    z[n] = y[(n + 1) % N] - 1.0
    out z
"""


def vectors(plan: Plan) -> list[int]:
    """The statements over n (x, y, z: the passes rename them), in the order they run."""
    calls = [it.statement for it in plan.tree if isinstance(it, Call)]
    return [c for c in calls if plan.buffer(c).dims]


def test_a_one_batch_statement_takes_the_memory_of_its_dying_input():
    source = Source("donate.rtl", src(DONATE))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    x, y, z = vectors(plan)
    assert donors(plan) == {y: x, z: y}
    assert x in frees(plan) and z not in frees(plan)
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    assert rt.donated == {y: x, z: y}
    assert rt.peak_bytes < 2 * N_BYTES  # one f32[6] at a time (and a few scalars)
    want = [(2 * (5 - (n + 1) % 6) + 1) * 3 - 1 for n in range(6)]
    np.testing.assert_array_equal(rt.value("z"), want)


N_BYTES = 6 * 4


def test_no_donation_from_an_output_or_a_buffer_read_later():
    source = Source("keep.rtl", src(DONATE.replace("out z", "out x, z")))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    x = buffer_named(plan, "x").id
    assert x not in donors(plan).values() and x not in frees(plan)
    source = Source("later.rtl", src(DONATE.replace("- 1.0", "- x[n]")))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    x, y, z = vectors(plan)
    assert donors(plan).get(y) is None  # z reads x after y
    assert donors(plan).get(z) in (x, y)
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)


def test_freed_buffers_are_dropped_and_outputs_survive_the_run():
    source = Source("donate.rtl", src(DONATE))
    plan = compile_plan(graph_of(source, {}))
    rt = CpuRuntime(plan)
    rt.run()
    for sid in frees(plan):
        assert rt.buffers[sid] is None
    assert rt.value("z").shape == (6,)


def test_an_array_of_one_value_is_computed_where_it_is_read_not_stored():
    """Adam's moments start as ``zeros`` of each parameter's shape: each merge computes its
    zeros at its first step (docs/plan.md); no buffer holds them for the whole run."""
    plan = compile_plan(graph_of(source_of("ppo"), PPO))
    stored = [s.id for s in plan.statements if s.node.op == "const" and s.node.types[0].shape]
    assert not stored
    merges = [s for s in plan.statements if s.node.op == "merge"]
    inline = [s for s in merges if any(n.op == "const" and n.types[0].shape for n in s.nodes)]
    assert len(inline) >= 24  # the moments of PPO's 12 parameters, and its zero biases
    check_decisions(plan)


# an update read by the next iteration's merge (Adam's new moments: net[i+1] = adam(net[i]))
UPDATE = """
    config I = 6
    dim i < I
    x[0] = ones([3])
    x[i+1] = y[i]
    y[i] = 0.5 * x[i] + f32(i)
    total[i] = sum(x[i])
    metric total
"""


@pytest.mark.parametrize("later", [False, True])
def test_an_update_read_by_the_next_iteration_s_merge_keeps_one_slot(later):
    """``y[i]`` is read by ``x[i+1]``, which runs before ``y[i+1]`` takes its slot: one
    slot, where the distance alone (one iteration) asked for two. Read also by a statement
    after it, at ``i - 1``: two. Both runs (checking their windows) equal the reference."""
    text = UPDATE
    if later:
        text += "    z[i] = sum(y[i] + y[max(i - 1, 0)])\n    metric z\n"
    source = Source("update.rtl", src(text))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    (y,) = [
        b
        for b in plan.buffers
        if b.dims == ("i",) and b.outputs[0].shape == (3,) and b.name != "x"
    ]
    assert y.window == Window("i", 2 if later else 1)
    assert storage(plan, "x") == Window("i", 1)
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    assert len(ref_m) == 6 * (2 if later else 1)


# a rollout that goes on from one iteration to the next (PPO's environments): step t of
# iteration i reads the state of step t - 1, and step 0 the last step of iteration i - 1
CARRIED = """
    config I = 4, B = 3, T = 9
    dim i < I
    dim b < B
    dim t < T
    s[0, b, 0] = f32(b) + 0.5
    s[i, b, 0] = stepped[i - 1, b, T - 1]
    s[i, b, t+1] = stepped[i, b, t]
    stepped[i, b, t] = 0.9 * s + 0.1 * sin(f32(i * 10 + t))
    total[i] = sum(s[i, 0:B, 0:T])
    metric total
"""


def carried_plan() -> tuple[Source, Plan]:
    source = Source("carried.rtl", src(CARRIED))
    return source, compile_plan(graph_of(source, {}))


def test_a_rollout_carried_across_iterations_keeps_one_slot_along_its_steps():
    """The step's value, read at the next step and by the next iteration's first step (at
    ``t = T - 1``), gets a second ring buffer along ``t`` (docs/plan.md, Storage): one slot,
    where there were ``T``, since each read comes before the write that takes the slot (the
    next step's); and one iteration's, since the next iteration's first step reads it
    before that iteration's first write (``memory._reads_first``). The run (checking its
    windows) equals the reference."""
    source, plan = carried_plan()
    check_decisions(plan)
    inner = {b.name or b.id: (b.window, b.inner) for b in plan.buffers if b.inner is not None}
    assert (Window("i", 1), Window("t", 1)) in inner.values(), inner
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    assert ref_m


def test_a_step_read_after_the_next_step_s_write_keeps_two_slots():
    """A statement of the step loop after the step's that reads the step's value and the
    one before (the next step reads it): at each step it reads after the write that would
    take the earlier value's slot, so two slots along ``t`` (``_inner_window``: a read one
    step back before the step's write needs one, after it two); with one, checking mode
    fails."""
    text = CARRIED.replace(
        "s[i, b, t+1] = stepped[i, b, t]",
        "s[i, b, t+1] = stepped[i, b, t] + 0.1 * lag[i, b, t]\n"
        "lag[i, b, t] = stepped[i, b, t] - stepped[i, b, max(t - 1, 0)]",
    )
    source = Source("carried_lag.rtl", src(text))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    inner = {b.id: b.inner for b in plan.buffers if b.inner is not None}
    assert Window("t", 2) in inner.values(), inner
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    data = items.to_json(plan)
    (buf,) = [b for b in data["buffers"] if b["storage"].get("inner", {}).get("size") == 2]
    buf["storage"]["inner"]["size"] = 1
    with pytest.raises(RunError, match="window too small"):
        CpuRuntime(items.from_json(data), check_windows=True).run()


def test_a_step_read_by_every_step_of_the_next_iteration_keeps_two_iterations():
    """The last step's value read at every step of the next iteration, after that
    iteration's first write: the iteration's writes would take its slot, so two
    iterations' slots (``memory._reads_first`` says no); with one, checking mode fails."""
    text = CARRIED.replace(
        "total[i] = sum(s[i, 0:B, 0:T])",
        "late[0, b, t] = s[0, b, t]\n"
        "late[i, b, t] = s[i, b, t] + stepped[i - 1, b, T - 1]\n"
        "total[i] = sum(late[i, 0:B, 0:T])",
    )
    source = Source("carried_late.rtl", src(text))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    inner = {b.id: (b.window, b.inner) for b in plan.buffers if b.inner is not None}
    assert list(inner.values()) == [(Window("i", 2), Window("t", 1))], inner
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    data = items.to_json(plan)
    (buf,) = [b for b in data["buffers"] if "inner" in b["storage"]]
    buf["storage"]["size"] = 1
    with pytest.raises(RunError, match="window too small"):
        CpuRuntime(items.from_json(data), check_windows=True).run()


def test_an_inner_window_too_small_is_caught_and_would_be_wrong():
    """A step that also reads the step three before it: four slots along ``t``; with one,
    the checking run fails and the plain run's metric differs from the reference's."""
    text = CARRIED.replace(
        "s[i, b, t+1] = stepped[i, b, t]",
        "s[i, b, t+1] = stepped[i, b, t] + 0.5 * stepped[i, b, max(t - 3, 0)]",
    )
    source = Source("carried3.rtl", src(text))
    plan = compile_plan(graph_of(source, {}))
    data = items.to_json(plan)
    (buf,) = [b for b in data["buffers"] if b["storage"].get("inner", {}).get("size") == 4]
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    buf["storage"]["inner"]["size"] = 1
    with pytest.raises(RunError, match="window too small"):
        CpuRuntime(items.from_json(data), check_windows=True).run()
    got = []
    CpuRuntime(items.from_json(data), lambda n, p, v: got.append(float(v))).run()
    assert not np.allclose(got, [v for _, _, v in sorted(ref_m, key=lambda m: m[1])])


def test_an_inner_window_along_its_window_s_dim_is_refused():
    _, plan = carried_plan()
    data = items.to_json(plan)
    (k, buf) = next((k, b) for k, b in enumerate(data["buffers"]) if "inner" in b["storage"])
    buf["storage"]["inner"]["dim"] = buf["storage"]["dim"]
    with pytest.raises(PlanError, match=rf"buffers\[{k}\]\.storage\.inner\.dim: "):
        items.from_json(data)
    buf["storage"] = {"kind": "block", "inner": {"dim": "t", "size": 2}}
    with pytest.raises(PlanError, match="unknown storage"):
        items.from_json(data)


def test_an_environment_step_keeps_one_observation_and_every_reward_of_its_rollout():
    """REINFORCE's step returns (observation, reward, done): the observation is read at
    the next step (by the merge ``o``, which takes each environment's row of it:
    ``simplify._forward_env_rows``), the rewards and ``done``s after the rollout. A window
    per output: the observations keep one slot along ``t`` (the merge reads it before the
    step writes the next), the others every step (docs/plan.md, Storage). No buffer holds
    a copy of the rows. The run (checking its windows) equals the reference; the same ring
    buffer given to the rewards too is caught in checking mode."""
    source = source_of("reinforce")
    plan = compile_plan(graph_of(source, REINFORCE))
    check_decisions(plan)
    (step,) = [s.id for s in plan.statements if s.node.op == "env_step"]
    buf = plan.buffer(step)
    assert (buf.window, buf.inner, buf.inner_outputs) == (Window("i", 1), Window("t", 1), (0,))
    assert buf.extents(0) == (1, 1) and buf.extents(1) == buf.extents(2) == (1, REINFORCE["T"])
    rows = [
        s
        for s in plan.statements
        if s.node.op == "index" and (s.node.inputs[0].src, s.node.inputs[0].out) == (step, 0)
    ]
    assert not rows
    # (the rewards' and dones' rows are also read over the rollout, through ranges: stored)
    assert {
        s.node.inputs[0].out
        for s in plan.statements
        if s.node.op == "index" and s.node.inputs[0].src == step
    } == {1, 2}
    ref, ref_m, rt, cpu_m = run_both(source, REINFORCE, plan)
    assert_same(graph_of(source, REINFORCE, optimize=False), ref, ref_m, rt, cpu_m)
    data = items.to_json(plan)
    (k,) = [k for k, b in enumerate(data["buffers"]) if b["id"] == step]
    assert data["buffers"][k]["storage"]["inner"]["outputs"] == [0]
    data["buffers"][k]["storage"]["inner"]["outputs"] = [0, 1]
    rt = CpuRuntime(items.from_json(data), check_windows=True)
    with pytest.raises(RunError, match="window too small"):
        rt.run()
    rt.envs.close()


@pytest.mark.parametrize(
    "outputs, message",
    [
        ([], "not increasing"),
        ([1, 0], "not increasing"),
        ([0, 0], "not increasing"),
        ([3], "output 3 of 3 outputs"),
        ("0", "expected a list"),
    ],
)
def test_an_inner_window_s_bad_outputs_are_refused(outputs, message):
    plan = compile_plan(graph_of(source_of("reinforce"), REINFORCE))
    data = items.to_json(plan)
    (k, buf) = next(
        (k, b) for k, b in enumerate(data["buffers"]) if "outputs" in b["storage"].get("inner", {})
    )
    buf["storage"]["inner"]["outputs"] = outputs
    with pytest.raises(PlanError, match=rf"buffers\[{k}\]\.storage\.inner.*{message}"):
        items.from_json(data)


# ----------------------------------------------------------------------------- in place
# ``x[i+1] = y[i]`` with ``y[i]`` an elementwise update of ``x[i]``, which ``g`` reads first
IN_PLACE = """
    config I = 6
    dim i < I
    x[0] = ones([3])
    x[i+1] = y[i]
    g[i] = sum(x[i]) * 0.25 + f32(i)
    y[i] = 0.5 * x[i] + g[i]
    metric g
"""


def homes(plan: Plan) -> dict[int, Home]:
    return {b.id: b.home for b in plan.buffers if b.home is not None}


def in_place_run(text: str):
    """The plan of ``text``, checked against the reference in checking mode and by the
    kernels of the backend under test; the kernels' listing."""
    source = Source("inplace.rtl", src(text))
    plan = compile_plan(graph_of(source, {}))
    check_decisions(plan)
    ref, ref_m, rt, cpu_m = run_both(source, {}, plan)
    assert_same(graph_of(source, {}, optimize=False), ref, ref_m, rt, cpu_m)
    got = []
    runtime, gen = plan_run(plan, lambda n, p, v: got.append((n, tuple(p.items()), float(v))))
    runtime.envs.close()
    assert len(got) == len(ref_m)
    for (n1, p1, v1), (n2, p2, v2) in zip(sorted(ref_m), sorted(got)):
        assert (n1, p1) == (n2, p2) and np.isclose(v1, v2, rtol=1e-5, atol=1e-6), (n1, p1)
    return plan, {k.sid: kir.text(k) for k in gen.kernels}


def test_an_update_is_written_in_place_of_the_value_it_updates():
    """``y[i]`` is stored where ``x[i+1]`` is (``Buffer.home``): it is written over
    ``x[i]`` once ``g[i]`` has read it, and the merge ``x[i+1] = y[i]`` copies nothing (its
    kernel stores only at ``i = 0``). The plan's peak is ``y``'s slot less."""
    plan, kernels = in_place_run(IN_PLACE)
    x = buffer_named(plan, "x")
    ((y, home),) = homes(plan).items()
    assert home == Home(x.id, (("add", "i", 1),)) and plan.buffer(y).window == x.window == Window(
        "i", 1
    )
    assert f"(buffer {x.id}.0, rw)" in kernels[y] and f"b{y}_0" not in kernels[y]
    assert f"b{y}_0" not in kernels[x.id] and kernels[x.id].count("] = ") == 1
    no_home = replace(plan, buffers=tuple(replace(b, home=None) for b in plan.buffers))
    assert plan.storage_of(y) == x.id and no_home.storage_of(y) == y
    assert (
        sum(b.nbytes for b in plan.buffers if b.home is None)
        == sum(b.nbytes for b in no_home.buffers) - plan.buffer(y).nbytes
    )


def test_a_metric_of_the_old_value_runs_before_the_update():
    """``total[i] = sum(x[i])``, a metric, joins the loop after it was built, where it went
    at the end of the body, after ``y[i]``, the update of ``x[i]``: then ``y`` could not be
    written over ``x[i]``. A joined item that reads a merge and not its update goes before
    the update: ``total`` runs first and ``y`` lives in ``x``'s memory."""
    plan, _ = in_place_run(UPDATE)
    x, total = buffer_named(plan, "x"), buffer_named(plan, "total")
    ((y, home),) = homes(plan).items()
    assert home.buffer == x.id
    (loop,) = [it for it in plan.tree if isinstance(it, items.Loop)]
    order = [c.statement for c in items.walk(loop.body) if isinstance(c, Call)]
    assert order.index(total.id) < order.index(y)


def calls_of(plan: Plan, sid: int) -> int:
    return sum(1 for it in items.walk(plan.tree) if isinstance(it, Call) and it.statement == sid)


def test_an_initial_value_is_written_where_the_merge_s_first_point_is():
    """``x[0] = normal([3])``: the draw is stored where ``x[0]`` is, so that it does not
    live through the loop; with ``y[i]`` where ``x[i+1]`` is, every value of ``x`` is in its
    memory already, and the plan calls ``x`` no more."""
    plan, _ = in_place_run(IN_PLACE.replace("ones([3])", "normal([3])"))
    x = buffer_named(plan, "x")
    got = homes(plan)
    (w,) = [sid for sid, h in got.items() if h.at == (0,)]
    assert got[w] == Home(x.id, (0,)) and plan.buffer(w).window is None
    assert len(got) == 2 and calls_of(plan, x.id) == 0 and calls_of(plan, w) == 1


def test_no_initial_value_in_place_where_another_statement_reads_it():
    text = IN_PLACE.replace("x[0] = ones([3])", "w = normal([3])\n    x[0] = w")
    plan, _ = in_place_run(text + "    h[i] = sum(w) * f32(i)\n    metric h\n")
    x = buffer_named(plan, "x")
    assert [h.at for h in homes(plan).values()] == [(("add", "i", 1),)]
    assert calls_of(plan, x.id) == 1  # (its call in the loop)


@pytest.mark.parametrize(
    "old, new",
    [
        # x[i] is read after y[i] is written: d reads both
        ("    metric g\n", "    metric g\n    d[i] = sum(y[i] - x[i])\n    metric d\n"),
        # y[i] reads x[i] at other elements (its transpose)
        ("ones([3])", "ones([2, 2])"),
        # x[i+1] is not y[i] at i = 3
        ("x[i+1] = y[i]", "x[4] = zeros([3])\n    x[i+1] = y[i]"),
    ],
)
def test_no_update_in_place_where_the_old_value_is_still_wanted(old, new):
    text = IN_PLACE.replace(old, new)
    if "2, 2" in new:
        text = text.replace("0.5 * x[i] + g[i]", "0.5 * transpose(x[i], [1, 0]) + g[i]")
    plan, _ = in_place_run(text)
    assert homes(plan) == {}


def test_an_update_in_place_where_the_old_value_is_still_read_is_caught():
    """A plan.json that gives ``y`` the memory of ``x`` where ``d`` reads ``x[i]`` after
    ``y[i]``: checking mode finds the slot holding ``x[i+1]``."""
    text = IN_PLACE + "    d[i] = sum(y[i] - x[i])\n    metric d\n"
    plan = compile_plan(graph_of(Source("inplace.rtl", src(text)), {}))
    x = buffer_named(plan, "x")
    data = items.to_json(plan)
    # (y: what the merge x reads, a ring buffer)
    (ysid,) = {
        r.src
        for n in plan.statement(x.id).nodes
        for r in n.inputs
        if r.stored and plan.buffer(r.src).window is not None
    }
    (y,) = [b for b in data["buffers"] if b["id"] == ysid]
    y["storage"]["home"] = {"buffer": x.id, "at": [["add", "i", 1]]}
    bad = items.from_json(data)
    with pytest.raises(RunError, match="found the slot holding index"):
        CpuRuntime(bad, check_windows=True).run()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda y, x: {"buffer": y["id"], "at": ["i"]}, "not another buffer"),
        (lambda y, x: {"buffer": 10**6, "at": ["i"]}, "not another buffer"),
        (lambda y, x: {"buffer": x["id"]}, "missing"),
        (lambda y, x: {"buffer": x["id"], "at": ["i"], "shift": 1}, "unknown field"),
        (lambda y, x: {"buffer": x["id"], "at": [2**62]}, "out of range"),
        (lambda y, x: {"buffer": x["id"], "at": ["t"]}, "unknown name"),
        (lambda y, x: {"buffer": x["id"], "at": []}, "one index"),
        (lambda y, x: {"buffer": x["id"], "at": ["i", "i"]}, "at most 1"),
        (
            lambda y, x: {"buffer": (x.update(storage={"kind": "block"}), x["id"])[1], "at": [0]},
            "not a ring buffer of one slot",
        ),
        (
            lambda y, x: {"buffer": (x["outputs"][0].update(dtype="f64"), x["id"])[1], "at": [0]},
            "other outputs",
        ),
    ],
)
def test_a_bad_home_is_refused(edit, message):
    plan = compile_plan(graph_of(Source("inplace.rtl", src(IN_PLACE)), {}))
    data = items.to_json(plan)
    ((ysid, home),) = homes(plan).items()
    (y,) = [b for b in data["buffers"] if b["id"] == ysid]
    (x,) = [b for b in data["buffers"] if b["id"] == home.buffer]
    y["storage"]["home"] = edit(y, x)
    with pytest.raises(PlanError, match=message):
        items.from_json(data)


def test_a_buffer_in_another_s_memory_is_never_freed_on_its_own():
    plan = compile_plan(graph_of(Source("inplace.rtl", src(IN_PLACE)), {}))
    ((ysid, _),) = homes(plan).items()
    assert ysid not in frees(plan)
    data = items.to_json(plan)
    data["tree"].append({"free": [ysid]})
    with pytest.raises(PlanError, match=f"buffer {ysid} lives in the memory of buffer"):
        items.from_json(data)


# ----------------------------------------------------------------------------- the format
@pytest.mark.parametrize("version", [1, 2])
def test_a_plan_of_an_older_format_is_refused(tmp_path, version):
    (tmp_path / "plan.json").write_text(f'{{"format_version": {version}}}')
    with pytest.raises(PlanError, match="compile the program again"):
        load_plan(tmp_path)


def test_an_unknown_storage_is_refused():
    data = items.to_json(compile_plan(graph_of(Source("donate.rtl", src(DONATE)), {})))
    data["buffers"][0]["storage"] = {"kind": "swap"}
    with pytest.raises(PlanError, match=r"buffers\[0\]\.storage: unknown storage"):
        items.from_json(data)
