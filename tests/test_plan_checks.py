"""What loading a plan checks beyond its structure (``runtime.plan.check_runnable``): each
node typed as its op's record says for the types of its reads, and each environment still
what the plan was compiled for. (``test_hostile_plans.py`` has the corrupted files.)"""

from __future__ import annotations

import copy

import pytest
from rtl_helpers import src

from timerlc import compiler
from timerlc.diagnostics import Source
from timerlc.plan import expr as px
from timerlc.plan import items
from timerlc.runtime.plan import PlanError, check_runnable

TEXT = """
    config T = 6, N = 3, W = 2
    dim t < T
    x[t] = f32(arange(N)) * f32(t) + 1.0
    m[t] = mean(x[max(0, t-W):t+1], 0)
    s[t] = sum(x[0:T], 0)[1] * f32(t)
    y[t] = m[t][0] + s[t]
    out y
"""


@pytest.fixture(scope="module")
def data():
    _, plan, _ = compiler.compile_source(Source("p.rtl", src(TEXT)))
    return items.to_json(plan)


def load(data):
    plan = items.from_json(data)
    check_runnable(plan)
    return plan


def nodes(data):
    for k, s in enumerate(data["statements"]):
        for j, n in enumerate(s["nodes"]):
            yield k, j, n


def test_the_compiled_plan_loads(data):
    load(copy.deepcopy(data))


def test_a_node_typed_against_its_op_is_refused(data):
    bad = copy.deepcopy(data)
    k, j, n = next(
        (k, j, n)
        for k, j, n in nodes(bad)
        if n["op"] == "mul" and j < len(bad["statements"][k]["nodes"]) - 1
    )
    n["types"][0]["dtype"] = "f64"
    with pytest.raises(PlanError, match=rf"statements\[{k}\]\.nodes\[{j}\]: mul gives f32"):
        load(bad)


def test_an_attribute_that_disagrees_with_the_type_is_refused(data):
    bad = copy.deepcopy(data)
    _, _, n = next(x for x in nodes(bad) if x[2]["op"] == "arange")
    n["attrs"]["stop"] = 10**9  # a kernel that would make a billion values
    with pytest.raises(PlanError, match="arange gives i32\\[1000000000\\]"):
        load(bad)


def test_a_slice_past_its_buffer_stops_the_run_as_a_bad_plan(data):
    # x[0:T] made one longer still types (the sum reduces the axis), but reads past x's
    # buffer: the run stops with a PlanError (exit 2), not an IndexError or a wrong value
    from timerlc.runtime.cpu import CpuRuntime

    bad = copy.deepcopy(data)
    for _, _, n in nodes(bad):
        for r in n["inputs"]:
            for a in r["access"]:
                if a[0] == "slice" and a[1] == 0 and isinstance(a[2], int):
                    a[2] += 1
    with pytest.raises(PlanError, match="reads or writes outside its buffers"):
        CpuRuntime(load(bad)).run()


def test_a_window_that_depends_on_the_point_keeps_a_dynamic_length(data):
    # m reads x[max(0, t-W):t+1]: its length depends on t, an axis the mean must reduce
    assert any(
        a[0] == "slice" and px.difference(px.check(a[2], "t"), px.check(a[1], "t")) is None
        for _, _, n in nodes(data)
        for r in n["inputs"]
        for a in r["access"]
    )


@pytest.mark.parametrize(
    "a, b, diff",
    [
        (("add", ("mul", 16, "j"), 16), ("mul", 16, "j"), 16),
        (("add", "t", 3), "t", 3),
        (("add", ("fdiv_q", "t", 2), 1), ("fdiv_q", "t", 2), 1),
        (("add", "t", 1), 0, None),
        (("min", ("add", "t", 3), 15), "t", None),
        (("sub", 7, ("neg", "t")), "t", 7),
        (("sub", 7, ("neg", "t")), ("mul", -1, "t"), None),  # 7 + 2t
    ],
)
def test_difference_of_expressions(a, b, diff):
    assert px.difference(a, b) == diff


def test_an_environment_that_changed_since_the_compile_is_refused():
    text = """
        config B = 2, T = 3
        dim b < B
        dim t < T
        env E = "trivial?obs=4" batch b
        o[b, 0] = E.reset()
        o[b, t+1], r[b, t], d[b, t] = E.step(0)
        out r
    """
    _, plan, _ = compiler.compile_source(Source("p.rtl", src(text)))
    data = items.to_json(plan)
    data["envs"][0]["spec"] = "trivial?obs=3"
    with pytest.raises(PlanError, match=r"gives observations of shape \[2, 3\], the plan was"):
        load(data)
    data["envs"][0]["spec"] = "no_such_plugin"
    with pytest.raises(PlanError, match=r"envs\[0\]: environment 'E' \(no_such_plugin\)"):
        load(data)
