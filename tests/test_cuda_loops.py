"""Loop kernels (``timerlc/cuda/loops.py``): a loop of the tree whose rows never meet runs as
one CUDA kernel, each block running the whole loop for its rows. On the emulated device the
blocks run one after another (block 0's whole loop before block 1 starts), the schedule
most unlike a GPU's and the one that shows a row reading another's values: wrong values,
not a race that may not happen. What is checked: which loops the proof accepts and which
it refuses, that a loop kernel computes what the launches compute (PPO's rollout: the
policy's products computed inline, so to rounding), a failure inside one explained as on
the cpu, a call the kernel would make outside its box refused, and the plan's rows."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
from rtl_helpers import compiled_run, refuses_changed_plans, src

from timerlc.codegen import kir
from timerlc.compiler import compile_plan, generate_code, run_passes
from timerlc.cuda import loops, shapes
from timerlc.cuda.emu import compiler
from timerlc.cuda.render import Unsupported
from timerlc.diagnostics import RunError, Source
from timerlc.frontend.check import check_source
from timerlc.plan import items
from timerlc.runtime.cuda import LOOP, DeviceRuntime, EmuDevice

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
needs_cxx = pytest.mark.skipif(compiler() is None, reason="no host C++ compiler")

# s runs over t, a row per b: each row reads only its own row of s (and c, which the loop
# does not write); the take fails at t = 6 where FAR > 0
OWN = """
config T = 12, B = 16, FAR = 0
dim t < T
dim b < B
c[b] = f32(b) * 0.5
s[0, b] = c[b]
s[t, b] = s[t-1, b] * 0.5 + take(c[0:B], b + (t // 6) * FAR)
last[b] = s[T-1, b] + 0.0
out last
"""

# each row reads the next row's value of the step before: the rows meet
MEET = """
config T = 12, B = 16
dim t < T
dim b < B
c[b] = f32(b) * 0.5
s[0, b] = c[b]
s[t, b] = take(s[t-1, 0:B], (b + 1) % B) * 0.5 + 1.0
last[b] = s[T-1, b] + 0.0
out last
"""


def cuda_gen(text: str, path: str = "p.rtl", **sets):
    graph = check_source(Source(path, text), overrides={k: str(v) for k, v in sets.items()})
    return graph, generate_code(compile_plan(run_passes(graph)), target="cuda")


def _program(name: str, **sets):
    path = PROGRAMS / f"{name}.rtl"
    return cuda_gen(path.read_text(), str(path), **sets)


def _run(gen, loops_on: bool):
    got: list = []
    rt = DeviceRuntime(
        gen.plan,
        lambda *m: got.append(m),
        text=gen.text,
        device=EmuDevice(),
        loops=loops_on,
    )
    rt.run()
    rt.envs.close()
    return rt, got


def _refusals(gen) -> dict[str, str]:
    plan = dataclasses.replace(gen.plan, kernels=None)
    kernels = {k.sid: k for k in gen.kernels}
    from timerlc.cuda.render import render_kernels

    _, _, launches = render_kernels(list(kernels.values()))
    recorded = {sid for _, sid, _ in plan.outputs + plan.metrics}
    _, refused = loops.render_loops(plan, kernels, launches, recorded)
    return refused


def test_a_loop_whose_rows_keep_to_themselves_is_one_kernel():
    _, gen = cuda_gen(src(OWN))
    (row,) = gen.plan.kernels.loops
    names = {gen.plan.buffer(sid).name for sid in row[0]}
    assert "s" in names
    assert "__global__ void tl_loop_" in gen.text


def test_a_loop_whose_rows_meet_runs_as_launches():
    _, gen = cuda_gen(src(MEET))
    assert gen.plan.kernels.loops == ()
    (why,) = _refusals(gen).values()
    assert "two rows may meet" in why


@needs_cxx
@pytest.mark.parametrize("text", [OWN, MEET])
def test_loop_kernels_compute_the_cpu_backend_s_values(text):
    graph, gen = cuda_gen(src(text))
    cpu, _ = compiled_run(graph, backend="cpu")
    for on in (True, False):
        rt, _ = _run(gen, on)
        np.testing.assert_array_equal(rt.value("last"), cpu.value("last"))
        assert bool(rt._loop_parts) == (on and bool(gen.plan.kernels.loops))


@needs_cxx
def test_a_loop_kernel_is_one_launch_for_the_whole_loop():
    _, gen = cuda_gen(src(OWN))
    with_loops, _ = _run(gen, True)
    without, _ = _run(gen, False)
    # (the loop's 12 iterations of two statements' kernels: now one launch)
    assert without.launches - with_loops.launches >= 12
    assert with_loops._loop_parts


@needs_cxx
def test_a_failure_inside_a_loop_kernel_is_explained_as_on_the_cpu():
    """The take fails at t = 6 in every row: the failing block records the call, and the
    interpreter computes it again (its inputs, c and the loop values, are unchanged)."""
    graph, gen = cuda_gen(src(OWN), FAR=100)
    assert gen.plan.kernels.loops
    with pytest.raises(RunError) as want:
        compiled_run(graph, backend="cpu")
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice())
    with pytest.raises(RunError) as got:
        rt.run()
    assert rt._loop_parts
    assert str(got.value) == str(want.value)
    assert "at t=6, b=0" in str(got.value)


@needs_cxx
def test_a_loop_kernel_refuses_a_call_outside_its_statement_s_box():
    """The kernel checks each call's loop values against its statement's box (a graph's
    replay shifts the values of the loops around): here a call of the rollout's loop kernel
    for an iteration i the buffers do not have."""
    _, gen = _program("ppo", B=16, T=8, total_steps=256)
    rt = DeviceRuntime(gen.plan, text=gen.text, device=EmuDevice())
    rt.run()
    rollout = next(
        lid for lid, parts in rt._loop_parts.items() if len(parts) > 3
    )  # (the rollout's: the policy, the draw, the step, ...)
    with pytest.raises(items.PlanError, match="outside"):
        rt.statements[rollout].run((10_000,))
        rt._settle(final=True)


@functools.lru_cache(maxsize=2)
def _ppo():
    _, gen = _program("ppo", B=16, T=16, total_steps=768)
    return gen


@needs_cxx
def test_ppo_s_rollout_is_one_kernel_computing_what_the_launches_compute():
    """The rollout's loop (observation, policy, draw, step, next observation) is one launch
    an iteration; its products are computed inline in order, their weights (the loop never
    writes them) read from a copy in the block's shared memory made once before the loop
    (``_LoopText.stage``), the launches' by the BLAS (NumPy on the emulation): the metrics
    agree to rounding."""
    gen = _ppo()
    assert "__shared__ float m_tl_w0[4096];" in gen.text  # (the 64 x 64 layer's weight)
    assert "const float *B = m_tl_w0 + ((0LL));" in gen.text
    rows = {tuple(r[0]) for r in gen.plan.kernels.loops}
    ops = {
        sid: {n.op for n in gen.plan.statement(sid).nodes}
        for r in gen.plan.kernels.loops
        for sid in r[0]
    }
    rollout = next(r for r in rows if any("env_step" in ops[s] for s in r))
    assert len(rollout) == 4
    # (the policy's activations, a row of 64 floats an environment: in the block's shared
    # memory, _shared_temps)
    assert re.search(
        r"float \*m_t\d+ = \(float \*\)\(\(char \*\)tl_st\d+_v_t\d+ - tl_rb \* 256LL\);", gen.text
    )
    rt, got = _run(gen, True)
    plain, want = _run(gen, False)
    assert [(m[0], m[1]) for m in got] == [(m[0], m[1]) for m in want]
    a = np.array([float(np.asarray(m[2]).ravel()[0]) for m in got])
    b = np.array([float(np.asarray(m[2]).ravel()[0]) for m in want])
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # 17 iterations of the rollout's 6 or more launches and products (11 before its
    # policy's layers ran as chains, render._Kernel._chains; 7 before the gathers of the
    # environments' observations made no check, lower._Lowering.dim_ranges, and fused with
    # the launches beside them), 3 times: one launch each
    saved = plain.launches + plain.blas_calls - rt.launches - rt.blas_calls
    assert saved >= 3 * 17 * 5


def test_a_loop_kernel_whose_temporaries_are_all_in_shared_memory_takes_no_scratch():
    """A loop kernel whose temporaries are each in a block's shared memory
    (``_shared_temps``) or a thread's own takes no scratch memory (its plan row's 0): the
    graph's launches that use the scratch memory need not wait for it, nor it for them (the
    rollout beside the permutation of the epoch's minibatches). Where a temporary does not
    fit (PPO's rollout at 1,024 hidden units: three of 8 KiB a block), the kernel takes its
    bytes, as its function's pointers into the scratch memory say."""
    for hidden, scratch in ((64, False), (1024, True)):
        _, gen = _program("ppo", B=16, T=16, total_steps=768, H=hidden)
        ops = {s.id: {n.op for n in s.nodes} for s in gen.plan.statements}
        (rollout,) = [r for r in gen.plan.kernels.loops if any("env_step" in ops[s] for s in r[0])]
        bodies = [  # (the loop kernels' functions: the rollout's steps the environments)
            gen.text[k : gen.text.index("\n}\n", k)]
            for k in (m.start() for m in re.finditer(r"void tl_loop_\w+\(", gen.text))
        ]
        (text,) = [b for b in bodies if "m_E_state" in b]
        assert (rollout[2] > 0) == ("(scratch + " in text) == scratch, hidden


def test_a_block_keeps_the_temporaries_whose_accesses_stay_in_their_row_in_shared_memory():
    """``_shared_temps``: a temporary each of whose accesses is at byte ``C * row + f``,
    ``f`` within the row's ``C`` bytes, is the block's rows in its shared memory; not one
    an access reaches past its row with, nor one a run on one thread touches, nor past
    ``TEMP_BYTES``, nor where the rows do not start at 0."""

    def case(forms, per_block=2, rows=(0, 8)):
        facts = loops._Facts("t", (), (0, 15), {})
        facts.rows = rows
        temp = kir.Temp("t1", "f32", 512, 128)
        for form, ranges in forms:
            facts.accesses.append(loops._Access(("s", 7, "t1"), form, 4, True, ranges, "w"))
        rk = types.SimpleNamespace(k=types.SimpleNamespace(temps=(temp,)), in_shared={})
        loops._shared_temps(facts, {7: rk}, per_block)
        return rk.in_shared

    row = ({"R": 64, "v1": 4, "": 512}, {"v1": (0, 15)})  # (16 floats a row)
    assert case([row]) == {"t1": ("tl_st7_v_t1", 64, 128)}
    assert case([row, ({"R": 64, "v2": 4, "": 516}, {"v2": (0, 15)})]) == {}  # (one past)
    assert case([row, ({"R": 64, "v2": 4, "": 508}, {"v2": (0, 15)})]) == {}  # (one before)
    assert case([row, ({"v1": 4, "?": 1, "": 512}, {"v1": (0, 15)})]) == {}  # (one thread)
    assert case([row, ({"R": 32, "v1": 4, "": 512}, {"v1": (0, 7)})]) == {}  # (another C)
    assert case([row], per_block=loops.TEMP_BYTES // 64 + 1) == {}
    assert case([row], rows=(1, 8)) == {}


def test_the_proof_is_on_the_kernels_indices():
    """Unit checks of the rows' proof: rows C bytes apart whose accesses stay within a row
    are apart; a write another row's access reaches, or one the row does not index, is not."""
    facts = loops._Facts("t", ("i",), (0, 15), {"i": (0, 3)})
    facts.rows = (0, 16)
    w = loops._Access(("t", 1), {"R": 64, "L": 4}, 4, True, {"L": (0, 15)}, "w")
    same = loops._Access(("t", 1), {"R": 64, "L": 4, "": -4}, 4, False, {"L": (1, 15)}, "a")
    assert facts._apart(w, same)
    spill = loops._Access(("t", 1), {"R": 64, "L": 4, "": -4}, 4, False, {"L": (0, 15)}, "a")
    assert not facts._apart(w, spill)  # (t - 1 at t = 0: the row before's last element)
    other = loops._Access(("t", 1), {"R": 64, "L": 4, "": 64}, 4, False, {"L": (0, 15)}, "a")
    assert not facts._apart(w, other)
    shared = loops._Access(("t", 1), {"L": 4}, 4, False, {"L": (0, 15)}, "a")
    assert not facts._apart(w, shared)
    # [t, b] row-major per step: rows 4 bytes apart, steps a whole 16 rows apart
    step = loops._Access(("t", 2), {"R": 4, "L": 64}, 4, True, {"L": (0, 15)}, "w")
    back = loops._Access(("t", 2), {"R": 4, "L": 64, "": -64}, 4, False, {"L": (1, 15)}, "a")
    assert facts._apart(step, step) and facts._apart(step, back)
    assert not loops._rows_apart({"x": 1}, {}, 4, 16, 4, 4)  # (a variable of no range)


def test_a_loop_kernel_needs_kernels_the_renderer_can_run_on_rows():
    plan = _ppo().plan
    around, loop = next(
        (a, it) for a, it in loops.loops_of_tree(plan.tree) if a and loops.body_calls(it)
    )
    with pytest.raises(Unsupported, match="no CUDA kernel"):
        loops.render_loop(plan, around, loop, {}, {}, set(), "f")
    assert kir.SIZES["f32"] == 4


def test_plans_loops_are_checked():
    gen = _ppo()
    data = items.to_json(gen.plan)
    assert data["kernels"]["loops"]
    assert items.from_json(json.loads(json.dumps(data)), "p") == gen.plan
    no_kernel = next(
        s.id
        for s in gen.plan.statements
        if s.id not in {r[0] for r in gen.plan.kernels.statements}
    )
    cases = [
        (lambda k: k["loops"].append([[], 1, 8]), "expected"),
        (lambda k: k["loops"][0].__setitem__(1, 0), "out of range"),
        (lambda k: k["loops"][0].__setitem__(2, -1), "out of range"),
        (lambda k: k["loops"][0][0].append(no_kernel), "without a kernel"),
        (lambda k: k["loops"].append("x"), "expected"),
    ]
    refuses_changed_plans(data, cases)


@needs_cxx
def test_a_loop_row_that_matches_no_loop_is_refused():
    gen = _ppo()
    first = gen.plan.kernels.loops[0]
    bad = ((first[0][:1] + first[0][:1], first[1], first[2]),) + gen.plan.kernels.loops[1:]
    plan = dataclasses.replace(gen.plan, kernels=dataclasses.replace(gen.plan.kernels, loops=bad))
    with pytest.raises(items.PlanError, match="matches no loop"):
        DeviceRuntime(plan, text=gen.text, device=EmuDevice())
    assert LOOP > (1 << 40)


def test_a_row_s_elements_are_spread_over_the_block_s_threads():
    """A parallel loop over the rows whose body is a loop over a row's elements that only
    stores, each iteration its own element (the policy's layers: 64 units a row): one loop
    over the block's points, a thread per (row, unit), not a thread per row; a loop whose
    iterations meet (a store read back, a sum, a draw) stays on the row's thread."""
    gen = _ppo()
    text = gen.text
    lk = next(lk for lk in gen.plan.kernels.loops if len(lk[0]) == 4)
    assert lk and "tl_g = tl_rb * 64LL + threadIdx.x; tl_g < tl_re * 64LL" in text
    x = kir.Load("x", kir.Ref("e"), "f32")
    own = kir.Store("y", kir.Ref("e"), kir.Un("tanh", x, "f32"))
    assert shapes._independent_elements(kir.For("e", kir.i64(0), kir.i64(64), (own,)))
    back = kir.Store("y", kir.i64(0), kir.Load("y", kir.Ref("e"), "f32"))
    same = kir.Store("y", kir.i64(0), x)
    acc = kir.Let("a", "f32", x)
    for body in ((back,), (same,), (acc,), (own, back)):
        assert not shapes._independent_elements(kir.For("e", kir.i64(0), kir.i64(64), body))
