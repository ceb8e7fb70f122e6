"""`timerlc inspect` of a plan (LANGUAGE.md section 12: "a dumped IR file or a plan")."""

from __future__ import annotations

import json
from pathlib import Path

from rtl_helpers import cli

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"


def _plan(tmp_path) -> Path:
    build = tmp_path / "build"
    r = cli(
        "compile",
        PROGRAMS / "reinforce.rtl",
        "--set",
        "I=3",
        "--set",
        "B=2",
        "--set",
        "T=5",
        "-o",
        build,
    )
    assert r.exit_code == 0, r.output
    return build / "plan.json"


def test_inspect_shows_a_plan_as_text(tmp_path):
    plan = _plan(tmp_path)
    r = cli("inspect", plan)
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.startswith("plan format ")
    for section in ("buffers:", "statements:", "loop tree:", "metrics: ep_ret"):
        assert section in out
    assert "for c1 = 0;" in out  # the iteration loop
    assert "o[c1, c3]" in out  # the acting step, one call per (i, t)
    data = json.loads(plan.read_text())
    for name in ("o", "logits", "loss"):
        if any(b["name"] == name for b in data["buffers"]):
            assert f" {name} " in out


def test_inspect_shows_a_plan_as_json(tmp_path):
    plan = _plan(tmp_path)
    r = cli("inspect", plan, "--format", "json")
    assert r.exit_code == 0
    assert json.loads(r.output) == json.loads(plan.read_text())


def test_inspect_refuses_dot_for_a_plan(tmp_path):
    r = cli("inspect", _plan(tmp_path), "--format", "dot")
    assert r.exit_code == 2 and "no dot form" in r.stderr


def test_dump_ir_writes_each_pass_and_the_plan(tmp_path):
    build = tmp_path / "b"
    r = cli("compile", PROGRAMS / "returns.rtl", "-o", build, "--dump-ir")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (build / "ir").iterdir())
    assert names[:7] == [
        "00-frontend.pdg",
        "01-autodiff.pdg",
        "02-forward.pdg",
        "03-incremental.pdg",
        "04-noise.pdg",
        "05-simplify.pdg",
        "06-narrow.pdg",
    ]
    plan = (build / "ir" / names[-2]).read_text()
    assert names[-2] == "07-plan.txt" and plan.startswith("plan format ")
    shown = cli("inspect", build / "ir" / names[-2])  # a dump inspect shows as it is
    assert shown.exit_code == 0 and shown.stdout == plan
    assert cli("inspect", build / "ir" / names[-2], "--format", "json").exit_code == 2
    # the kernel IR, and the LLVM IR rendered from it in the build's kernels/
    kernels = (build / "ir" / names[-1]).read_text()
    assert names[-1] == "08-kernels.txt" and kernels.startswith("kernel IR: ")
    assert "\ntree tree" in kernels and "launch s" in kernels
    assert cli("inspect", build / "ir" / names[-1]).stdout == kernels
    ll = (build / "kernels" / "cpu.ll").read_text()
    assert ll.startswith("; timerlc kernels for the plan of sha256 ")
    assert "define i32 @s" in ll and "define i32 @tree" in ll
    # discounted_sum(r[i, b, t:T]) runs as a recurrence: a loop over t, i and b vectorized
    assert any(
        line.split()[1] == "g_ds" and "loops [t] vector [i, b]" in line
        for line in plan.splitlines()
        if len(line.split()) > 1
    )
