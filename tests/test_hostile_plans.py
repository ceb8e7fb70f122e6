"""Hostile and corrupted plans (docs/plan.md, "A plan is data"): `timerlc run BUILD_DIR` and
`timerlc inspect` refuse every one with exit status 2 and a one-line `timerlc: error:`
message: never a traceback, never a hang, and never any code run.

Each case starts from a plan the compiler wrote (programs/returns.rtl, and
programs/reinforce.rtl for an environment) and breaks one thing: code where a name, an
attribute, an access or an expression goes; numbers too big, negative, not finite or of the
wrong type; ids that do not exist; nesting far deeper than any plan; text that is not JSON or
not UTF-8; loops that would not end; reads outside a buffer. Every case runs the command line
in this process under a deadline, and a representative set runs it in a subprocess as a user
would. A seeded fuzzer then changes the compiled plans at random: each changed plan loads and
runs, or is refused with a PlanError (exit 2), or fails with a RunError (exit 3), and nothing
else. The fallback to program.pdg.json (a build folder without plan.json) is checked too.
"""

from __future__ import annotations

import copy
import json
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
from rtl_helpers import cli

from timerlc.diagnostics import RunError
from timerlc.runner import run_plan
from timerlc.runtime.plan import MAX_PLAN_BYTES, PlanError, load_plan

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
SOURCES = {"returns": {}, "reinforce": {"I": 2, "B": 2, "T": 8}}
DEADLINE = 20  # seconds for one case run in this process
TIMEOUT = 60  # seconds for one subprocess
MEMORY = 4 << 30  # bytes of address space a run may take (a corrupt size fails, not swaps)


# ----------------------------------------------------------------------------- builds
@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    """The build folder of each program of SOURCES, compiled once."""
    root = tmp_path_factory.mktemp("compiled")
    out = {}
    for name, sets in SOURCES.items():
        args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        r = cli("compile", PROGRAMS / f"{name}.rtl", *args, "-o", root / name)
        assert r.exit_code == 0, r.stderr
        out[name] = root / name
    return out


def plan_of(build: Path) -> dict:
    return json.loads((build / "plan.json").read_text())


def copy_build(build: Path, to: Path, plan) -> Path:
    """A copy of ``build`` whose plan.json is ``plan`` (a dict, text or bytes)."""
    shutil.copytree(build, to)
    if not isinstance(plan, (str, bytes)):
        plan = json.dumps(plan)
    if isinstance(plan, str):
        plan = plan.encode()
    (to / "plan.json").write_bytes(plan)
    return to


def code(marker: Path) -> str:
    """Python that, if anything ever evaluated it, would create ``marker``."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


class Hang(BaseException):
    """A run went past its deadline (a BaseException: nothing on the way may catch it)."""


@contextmanager
def deadline(seconds: int):
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def limit_memory():
    """In a subprocess: a size too big for the machine fails at once instead of swapping."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run_subprocess(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "timerlc.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        preexec_fn=limit_memory,
        check=False,
    )


def assert_refused(status: int, stderr: str, says: str = ""):
    """Exit 2 with one short line naming the problem, no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    assert status == 2, f"exit {status}: {stderr[-2000:]}"
    assert stderr.startswith("timerlc: error:"), stderr[-2000:]
    assert len(stderr.strip().splitlines()) == 1 and len(stderr) < 600, stderr[-2000:]
    assert says in stderr, f"{says!r} not in {stderr!r}"


# ----------------------------------------------------------------------------- finding things
def nodes(p: dict):
    for s in p["statements"]:
        yield from s["nodes"]


def node(p: dict, op: str) -> dict:
    return next(n for n in nodes(p) if n["op"] == op)


def stored_read(p: dict) -> dict:
    """The first read of a buffer at an index along its first dim."""
    reads = (r for n in nodes(p) for r in n["inputs"] if r["stored"])
    return next(r for r in reads if r["access"][:1] == [["at", "i"]])


def items(tree: list):
    for it in tree:
        yield it
        for key in ("body", "then", "else"):
            yield from items(it.get(key, []))


def loop(p: dict) -> dict:
    return next(it for it in items(p["tree"]) if "for" in it)


def call(p: dict) -> dict:
    """The first call with arguments (of a statement with loop dims)."""
    return next(it for it in items(p["tree"]) if it.get("args"))


def statement(p: dict, sid: int) -> dict:
    return next(s for s in p["statements"] if s["id"] == sid)


def buffer(p: dict, sid: int) -> dict:
    return next(b for b in p["buffers"] if b["id"] == sid)


def windowed(p: dict) -> dict:
    """The first buffer stored as a window, over a dim other than ``t``."""
    return next(
        b for b in p["buffers"] if b["storage"]["kind"] == "window" and "t" not in b["dims"]
    )


def renamed(x, old: str, new: str):
    """``x`` with every string ``old`` (a dim, say) replaced by ``new``, keys too."""
    if isinstance(x, str):
        return new if x == old else x
    if isinstance(x, list):
        return [renamed(v, old, new) for v in x]
    if isinstance(x, dict):
        return {renamed(k, old, new): renamed(v, old, new) for k, v in x.items()}
    return x


def nested(op: str, depth: int, leaf) -> list:
    e = leaf
    for _ in range(depth):
        e = [op, e]
    return e


def as_text(p: dict, old: str, new: str) -> str:
    """The plan's JSON with the first ``old`` replaced by ``new`` (literals JSON cannot make)."""
    text = json.dumps(p)
    assert old in text
    return text.replace(old, new, 1)


def with_text(p: dict, target, key, text: str) -> str:
    """The plan's JSON with ``target[key]`` (in ``p``) written as ``text`` (JSON nested
    deeper than ``json.dumps`` goes)."""
    target[key] = "@HOLE@"
    return json.dumps(p).replace('"@HOLE@"', text)


def set_in(target, key, value) -> None:
    """``target[key] = value`` as an expression (the case changes the plan in place)."""
    target[key] = value


# ----------------------------------------------------------------------------- the cases
BIG = ["mul", 1 << 40, 1 << 40]  # 2^80: a valid expression, too big for NumPy's int64
ENV = "reinforce"  # the program with an environment


class Case(NamedTuple):
    id: str
    # (plan, code) -> None (it changed the plan in place) or a new plan: a dict, text or bytes
    mutate: Callable
    says: str = ""  # what the message must contain
    program: str = "returns"


def first_dim(p: dict, name, bound) -> None:
    p["dims"][0] = [name, bound]


def read_at(p: dict, index) -> None:
    """The first read of a buffer along dim i reads ``index`` there instead."""
    r = stored_read(p)
    r["access"] = [["at", index]] + r["access"][1:]


def attr(p: dict, op: str, name: str, value) -> None:
    node(p, op)["attrs"][name] = value


def output_shape(p: dict, shape) -> None:
    p["buffers"][0]["outputs"][0]["shape"] = shape


def _deep_loops(p: dict, c: str):
    body: list = []
    for k in range(40):
        body = [{"for": f"v{k}", "init": 0, "cond": ["lt", f"v{k}", 1], "inc": 1, "body": body}]
    p["tree"] = body + p["tree"]


def _wrong_arity(p: dict, c: str):
    n = node(p, "add")
    n["inputs"] = n["inputs"][:1]


def _never_ends(p: dict, c: str):
    """The first loop's condition holds for ever; its body is skipped (no read outside)."""
    lp = loop(p)
    lp["cond"] = ["ge", lp["for"], lp["init"]] if lp["inc"] > 0 else ["le", lp["for"], 0]
    lp["body"] = [{"if": False, "then": lp["body"], "else": []}]


def _loop_var(p: dict, c: str):
    lp = loop(p)
    body = renamed(lp["body"], lp["for"], c)
    lp.update({"for": c, "cond": renamed(lp["cond"], lp["for"], c), "body": body})


NOT_A_NAME = "is not a name"
CASES = [
    # code where a name, an attribute, an access or an expression goes
    Case("code-dim-name", lambda p, c: renamed(p, "t", c), NOT_A_NAME),
    Case("code-first-dim-name", lambda p, c: first_dim(p, c, 3), NOT_A_NAME),
    Case("code-loop-var", _loop_var, NOT_A_NAME),
    Case("code-buffer-name", lambda p, c: set_in(p["buffers"][0], "name", c + "\n"), "control"),
    Case("code-op", lambda p, c: set_in(node(p, "cos"), "op", c), NOT_A_NAME),
    Case("code-attr-value", lambda p, c: attr(p, "dimval", "dim", c), "not a dim"),
    Case("code-attr-ix", lambda p, c: attr(p, "dimval", "dim", {"ix": c}), "unknown name"),
    Case("code-attr-key", lambda p, c: attr(p, "cos", c, 1), NOT_A_NAME),
    Case("code-attr-dtype", lambda p, c: attr(p, "cast", "dtype", c), "not a dtype"),
    Case("code-attr-float", lambda p, c: attr(p, "const", "value", {"float": c}), "not a value"),
    Case(
        "code-attr-items",
        lambda p, c: attr(p, "index", "items", [["int", {"ix": c}]]),
        "unknown name",
        ENV,
    ),
    Case("code-access", lambda p, c: read_at(p, c), "unknown name"),
    Case("code-access-call", lambda p, c: read_at(p, ["__import__", "os"]), "unknown operator"),
    Case(
        "code-access-kind", lambda p, c: set_in(stored_read(p)["access"], 0, [c, "i"]), "expected"
    ),
    Case("code-domain", lambda p, c: set_in(p["statements"][0], "domain", c), "condition"),
    Case("code-loop-cond", lambda p, c: set_in(loop(p), "cond", c), "condition"),
    Case("code-call-arg", lambda p, c: set_in(call(p), "args", [c]), "unknown name"),
    Case("code-tensor-name", lambda p, c: set_in(p["outputs"][0], 0, c), "not a tensor name"),
    Case("code-env-name", lambda p, c: set_in(p["envs"][0], "name", c), NOT_A_NAME, ENV),
    Case(
        "code-env-spec", lambda p, c: set_in(p["envs"][0], "spec", c), "unknown environment", ENV
    ),
    Case("code-config-value", lambda p, c: set_in(p["configs"][0], 1, c), "config value"),
    Case("code-where", lambda p, c: set_in(node(p, "cos"), "where", [c, {"x": c}]), "where"),
    Case("code-unknown-field", lambda p, c: set_in(p, "__init__", c), "unknown field"),
    # numbers: exponent bombs, not finite, too big, negative, of the wrong type
    Case("exponent-bound", lambda p, c: as_text(p, '["i", 3]', '["i", 1e999999]'), "Infinity"),
    Case(
        "exponent-literal-digits",
        lambda p, c: as_text(p, '"seed": 0', '"seed": 1' + "0" * 5000),
        "not JSON",
    ),
    Case("exponent-seed", lambda p, c: set_in(p, "seed", 10**4000), "out of range"),
    Case(
        "exponent-mul-arg",
        lambda p, c: set_in(call(p), "args", [["mul"] + [1 << 40] * 100]),
        "outside",
    ),
    Case(
        "exponent-nested-mul",
        lambda p, c: set_in(call(p), "args", [nested("neg", 30, ["mul"] + [1 << 40] * 60)]),
        "outside",
    ),
    Case(
        "exponent-loop-init",
        lambda p, c: set_in(loop(p), "init", ["neg", ["mul"] + [1 << 40] * 100]),
        "outside",
    ),
    Case("nan-bound", lambda p, c: as_text(p, '["i", 3]', '["i", NaN]'), "NaN"),
    Case("infinity-box", lambda p, c: as_text(p, '"box": [3', '"box": [Infinity'), "Infinity"),
    Case(
        "minus-infinity-seed",
        lambda p, c: as_text(p, '"seed": 0', '"seed": -Infinity'),
        "Infinity",
    ),
    Case("nan-inc", lambda p, c: as_text(p, '"inc": 1', '"inc": NaN'), "NaN"),
    Case("huge-shape-axis", lambda p, c: output_shape(p, [(1 << 31) + 1]), "out of range"),
    Case("huge-shape-product", lambda p, c: output_shape(p, [1 << 30] * 3), "elements"),
    Case("huge-shape-rank", lambda p, c: output_shape(p, [1] * 17), "17 entries"),
    Case("huge-box", lambda p, c: set_in(buffer(p, 24), "box", [10**30, 4, 16]), "out of range"),
    Case("huge-bound", lambda p, c: first_dim(p, "i", 1 << 63), "out of range"),
    Case("huge-const-shape", lambda p, c: attr(p, "const", "shape", [1 << 20] * 3), "not a shape"),
    Case(
        "huge-ints-list",
        lambda p, c: attr(p, "mean", "axes", list(range(100_000))),
        "100000 entries",
    ),
    Case("negative-shape", lambda p, c: output_shape(p, [-1]), "out of range"),
    Case("negative-box", lambda p, c: set_in(buffer(p, 24), "box", [-3, 4, 16]), "out of range"),
    Case("negative-bound", lambda p, c: first_dim(p, "i", -1), "out of range"),
    Case("negative-out", lambda p, c: set_in(stored_read(p), "out", -1), "out of range"),
    Case(
        "negative-num-envs", lambda p, c: set_in(p["envs"][0], "num_envs", -2), "out of range", ENV
    ),
    Case("wrong-type-dims", lambda p, c: set_in(p, "dims", "i, b, t"), "expected a list"),
    Case("wrong-type-bound", lambda p, c: first_dim(p, "i", "3"), "expected an integer"),
    Case("wrong-type-float-bound", lambda p, c: first_dim(p, "i", 3.0), "expected an integer"),
    Case(
        "wrong-type-bool-id",
        lambda p, c: set_in(p["statements"][0], "id", True),
        "expected an integer",
    ),
    Case(
        "wrong-type-stored",
        lambda p, c: set_in(stored_read(p), "stored", "yes"),
        "expected true or false",
    ),
    Case("wrong-type-inc", lambda p, c: set_in(loop(p), "inc", 1.0), "expected an integer"),
    Case("wrong-type-tree", lambda p, c: set_in(p, "tree", {"call": 14}), "expected a list"),
    Case(
        "wrong-type-attrs", lambda p, c: set_in(node(p, "cos"), "attrs", []), "expected an object"
    ),
    Case("wrong-type-memory", lambda p, c: set_in(p, "memory", None), "expected an object"),
    Case("wrong-type-plan", lambda p, c: [p], "not a timerlc plan"),
    Case(
        "tree-item-string",
        lambda p, c: set_in(p, "tree", ["call 14"] + p["tree"]),
        "expected a loop tree item",
    ),
    Case("format-version-old", lambda p, c: set_in(p, "format_version", 2), "format 2"),
    Case("format-version-new", lambda p, c: set_in(p, "format_version", 4), "format 4"),
    Case("format-version-text", lambda p, c: set_in(p, "format_version", "3"), "format '3'"),
    Case("format-version-float", lambda p, c: set_in(p, "format_version", 3.0), "format 3.0"),
    Case(
        "format-version-missing",
        lambda p, c: p.pop("format_version") and None,
        "no format_version",
    ),
    # ids that do not exist
    Case(
        "call-unknown-statement",
        lambda p, c: set_in(p, "tree", [{"call": 999, "args": []}]),
        "does not exist",
    ),
    Case("call-wrong-args", lambda p, c: set_in(call(p), "args", [0, 0]), "gives 2 values"),
    Case("call-no-args", lambda p, c: set_in(call(p), "args", []), "gives 0 values"),
    Case("read-unknown-buffer", lambda p, c: set_in(stored_read(p), "src", 999), "does not exist"),
    Case(
        "read-later-node",
        lambda p, c: set_in(node(p, "cast")["inputs"][0], "src", p["statements"][2]["id"]),
        "not an earlier node",
    ),
    Case(
        "free-unknown",
        lambda p, c: set_in(p, "tree", p["tree"] + [{"free": [999]}]),
        "does not exist",
    ),
    Case(
        "swap-out-unknown", lambda p, c: set_in(p, "tree", [{"swap_out": [999]}]), "does not exist"
    ),
    Case("swap-in-unknown", lambda p, c: set_in(p, "tree", [{"swap_in": [-1]}]), "out of range"),
    Case(
        "free-inside-loop",
        lambda p, c: set_in(loop(p), "body", [{"free": [14]}]),
        "only at the top level",
    ),
    Case(
        "donor-unknown",
        lambda p, c: set_in(p["buffers"][0], "donor", 999),
        "takes the memory of 999",
    ),
    Case(
        "donor-itself",
        lambda p, c: set_in(p["buffers"][0], "donor", p["buffers"][0]["id"]),
        "not another buffer",
    ),
    Case("output-unknown", lambda p, c: set_in(p, "outputs", [["r", 999, 0]]), "does not exist"),
    Case("metric-unknown-output", lambda p, c: set_in(p["metrics"][0], 2, 5), "does not exist"),
    Case(
        "attr-unknown-env",
        lambda p, c: attr(p, "env_reset", "env", "F"),
        "not an environment",
        ENV,
    ),
    Case(
        "ix-not-a-dim",
        lambda p, c: attr(p, "index", "items", [["int", {"ix": "zz"}]]),
        "unknown name 'zz'",
        ENV,
    ),
    Case(
        "ix-loop-var",
        lambda p, c: attr(p, "index", "items", [["int", {"ix": "c1"}]]),
        "unknown name 'c1'",
        ENV,
    ),
    # nesting
    Case("deep-json-lists", lambda p, c: "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    Case(
        "deep-json-objects",
        lambda p, c: '{"a":' * 100_000 + "1" + "}" * 100_000,
        "nested too deeply",
    ),
    Case(
        "deep-json-in-plan",
        lambda p, c: as_text(p, '"seed": 0', '"seed": ' + "[" * 100_000 + "]" * 100_000),
        "nested too deeply",
    ),
    Case(
        "deep-expression",
        lambda p, c: with_text(p, call(p), "args", "[" + '["neg",' * 10_000 + "0" + "]" * 10_001),
        "nested more than 64 deep",  # the CLI reads JSON on a deep stack: the plan check says it
    ),
    Case(
        "deep-expression-65",
        lambda p, c: set_in(call(p), "args", [nested("neg", 65, 0)]),
        "nested more than 64 deep",
    ),
    Case(
        "big-expression",
        lambda p, c: set_in(call(p), "args", [["add"] + [0] * 5000]),
        "more than 4096 terms",
    ),
    Case(
        "deep-attr", lambda p, c: attr(p, "mean", "axes", nested("x", 10, 0)), "nested too deeply"
    ),
    Case("deep-loops", _deep_loops, "nested more than 32 deep"),
    # ops, attributes, the loop tree, expressions
    Case("unknown-op", lambda p, c: set_in(node(p, "cos"), "op", "system"), "unknown op"),
    Case(
        "unknown-op-dunder", lambda p, c: set_in(node(p, "cos"), "op", "__import__"), "unknown op"
    ),
    Case("wrong-arity", _wrong_arity, "takes 2 inputs"),
    Case(
        "wrong-outputs",
        lambda p, c: node(p, "cos")["types"].extend(node(p, "cos")["types"]),
        "declares 2",
    ),
    Case("attr-wrong-kind", lambda p, c: attr(p, "cast", "dtype", 5), "not a dtype"),
    Case("attr-wrong-dtype", lambda p, c: attr(p, "cast", "dtype", "f16"), "not a dtype"),
    Case("attr-wrong-axes", lambda p, c: attr(p, "mean", "axes", "0"), "not an axis"),
    Case("attr-missing", lambda p, c: set_in(node(p, "cast"), "attrs", {}), "needs attribute"),
    Case("attr-unknown", lambda p, c: attr(p, "cos", "evil", 1), "no attribute 'evil'"),
    Case("loop-inc-0", lambda p, c: set_in(loop(p), "inc", 0), "inc 0"),
    Case("loop-never-ends", _never_ends, "far more steps"),
    Case("expr-pow", lambda p, c: set_in(call(p), "args", [["pow", 2, 3]]), "'pow'"),
    Case(
        "expr-import", lambda p, c: set_in(call(p), "args", [["__import__", "os"]]), "'__import__'"
    ),
    Case(
        "expr-div-zero",
        lambda p, c: set_in(call(p), "args", [["fdiv_q", "c1", 0]]),
        "positive integer divisor",
    ),
    Case(
        "expr-mod-zero",
        lambda p, c: set_in(call(p), "args", [["mod", "c1", 0]]),
        "positive integer divisor",
    ),
    Case(
        "expr-div-by-name",
        lambda p, c: set_in(call(p), "args", [["pdiv_q", 1, "c1"]]),
        "positive integer divisor",
    ),
    Case(
        "expr-div-negative",
        lambda p, c: set_in(call(p), "args", [["zdiv_r", "c1", -2]]),
        "positive integer divisor",
    ),
    Case(
        "expr-condition-as-int",
        lambda p, c: set_in(call(p), "args", [["lt", "c1", 2]]),
        "gives a condition",
    ),
    Case(
        "expr-int-as-condition",
        lambda p, c: set_in(loop(p), "cond", 1),
        "where a condition belongs",
    ),
    Case("expr-empty", lambda p, c: set_in(call(p), "args", [[]]), "not an expression"),
    Case("expr-float", lambda p, c: set_in(call(p), "args", [0.5]), "not an expression"),
    Case("expr-null", lambda p, c: set_in(call(p), "args", [None]), "not an expression"),
    Case("expr-dict", lambda p, c: set_in(call(p), "args", [{"ix": "c1"}]), "not an expression"),
    # ints beyond int64 where NumPy evaluates an expression over a batch's points
    Case(
        "overflow-domain",
        lambda p, c: set_in(statement(p, 24), "domain", ["ge", ["add", "t", BIG], 0]),
        "cannot be found",
    ),
    Case(
        "overflow-merge-condition",
        lambda p, c: set_in(node(p, "merge")["inputs"][0], "cond", ["ge", ["add", "t", BIG], 0]),
        "not valid",
    ),
    Case("overflow-read", lambda p, c: read_at(p, ["add", "i", BIG]), "outside"),
    # reads, calls and storage
    Case("read-out-of-bounds", lambda p, c: read_at(p, 1_000_000), "outside"),
    Case("read-negative-index", lambda p, c: read_at(p, -1), "below 0"),
    Case("read-before-the-start", lambda p, c: read_at(p, ["sub", "i", 1]), "below 0"),
    Case("call-out-of-bounds", lambda p, c: set_in(call(p), "args", [1 << 40]), "outside"),
    Case("call-negative", lambda p, c: set_in(call(p), "args", [-3]), "outside"),
    Case(
        "window-size-0",
        lambda p, c: set_in(windowed(p)["storage"], "size", 0),
        "out of range",
        ENV,
    ),
    Case(
        "window-size-negative",
        lambda p, c: set_in(windowed(p)["storage"], "size", -1),
        "out of range",
        ENV,
    ),
    Case(
        "window-unknown-dim",
        lambda p, c: set_in(windowed(p)["storage"], "dim", "t"),
        "not a dim of the buffer",
        ENV,
    ),
    Case(
        "storage-unknown",
        lambda p, c: set_in(buffer(p, 24), "storage", {"kind": "mmap"}),
        "unknown storage",
    ),
    # text that is not a plan
    Case("truncated-half", lambda p, c: json.dumps(p)[: len(json.dumps(p)) // 2], "not JSON"),
    Case("truncated-brace", lambda p, c: "{", "not JSON"),
    Case("empty-file", lambda p, c: "", "not JSON"),
    Case("not-utf8", lambda p, c: b"\xff\xfe" + json.dumps(p).encode(), "UTF-8"),
    Case(
        "not-utf8-inside",
        lambda p, c: as_text(p, '"seed": 0', '"seed": "\udcff"').encode(errors="surrogateescape"),
        "UTF-8",
    ),
    Case("long-text", lambda p, c: set_in(p, "source", "x" * 1_000_000), "characters"),
    Case("long-attr-key", lambda p, c: attr(p, "cos", "k" * 100_000, 1), "characters"),
    Case("control-characters", lambda p, c: set_in(p, "source", "a\x00b\x1b[2J"), "control"),
    # environments
    Case(
        "env-unknown-plugin",
        lambda p, c: set_in(p["envs"][0], "spec", "no_such_plugin"),
        "unknown environment 'no_such_plugin'",
        ENV,
    ),
    Case(
        "env-missing-module",
        lambda p, c: set_in(p["envs"][0], "spec", "no_such_module_xyz:make"),
        "cannot import module 'no_such_module_xyz'",
        ENV,
    ),
    Case(
        "env-missing-factory",
        lambda p, c: set_in(p["envs"][0], "spec", "timerlc.envs.cartpole:no_such_factory"),
        "has no 'no_such_factory'",
        ENV,
    ),
    Case(
        "env-not-a-factory",
        lambda p, c: set_in(p["envs"][0], "spec", "os:getcwd"),
        "os:getcwd",
        ENV,
    ),
    Case(
        "env-bad-option",
        lambda p, c: set_in(p["envs"][0], "spec", "cartpole?evil=" + c),
        "no option 'evil'",
        ENV,
    ),
    Case(
        "env-batch-unknown",
        lambda p, c: set_in(p["envs"][0], "batch", "zz"),
        "not a dim of the plan",
        ENV,
    ),
]
CASE_BY_ID = {case.id: case for case in CASES}


def broken_build(
    case: Case, builds: dict, tmp_path: Path, kernels: bool = False
) -> tuple[Path, Path]:
    """The build folder of ``case`` and the marker its code would create. Its plan has no
    kernels (unless ``kernels``), so that the runtime's own checks of what the plan does
    are what refuses it: with its kernels, any change of the plan is refused before that
    (its kernel file was generated for another plan)."""
    marker = tmp_path / "MARKER"
    plan = copy.deepcopy(plan_of(builds[case.program]))
    if not kernels:
        del plan["kernels"]
    changed = case.mutate(plan, code(marker))
    plan = plan if changed is None else changed
    return copy_build(builds[case.program], tmp_path / "build", plan), marker


def test_case_ids_are_unique():
    assert len(CASE_BY_ID) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_broken_plan_is_refused(case, builds, tmp_path):
    build, marker = broken_build(case, builds, tmp_path)
    with deadline(DEADLINE):
        r = cli("run", build, "--no-progress")
    assert not marker.exists(), "the plan ran code"
    assert_refused(r.exit_code, r.stderr, case.says)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_broken_plan_with_its_kernels_is_refused(case, builds, tmp_path):
    build, marker = broken_build(case, builds, tmp_path, kernels=True)
    with deadline(DEADLINE):
        r = cli("run", build, "--no-progress")
    assert not marker.exists(), "the plan ran code"
    assert_refused(r.exit_code, r.stderr)
    assert case.says in r.stderr or "was generated for another plan" in r.stderr, r.stderr


# a representative set, run as a user runs it: a process of its own, with a timeout
SUBPROCESS_CASES = [
    "code-dim-name",
    "code-attr-value",
    "code-access",
    "code-env-spec",
    "exponent-literal-digits",
    "deep-json-lists",
    "deep-expression",
    "loop-never-ends",
    "read-out-of-bounds",
    "huge-box",
    "env-missing-factory",
]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_a_broken_plan_is_refused_in_a_subprocess(case_id, builds, tmp_path):
    case = CASE_BY_ID[case_id]
    build, marker = broken_build(case, builds, tmp_path)
    r = run_subprocess("run", build, "--no-progress", cwd=tmp_path)
    assert not marker.exists(), "the plan ran code"
    assert_refused(r.returncode, r.stderr, case.says)


@pytest.mark.parametrize(
    "case_id", ["code-dim-name", "code-attr-ix", "deep-json-lists", "truncated", "huge-box"]
)
def test_inspect_refuses_a_broken_plan(case_id, builds, tmp_path):
    if case_id == "truncated":
        case = Case("truncated", lambda p, c: json.dumps(p)[:5000])
    else:
        case = CASE_BY_ID[case_id]
    build, marker = broken_build(case, builds, tmp_path)
    r = run_subprocess("inspect", build / "plan.json", cwd=tmp_path)
    assert not marker.exists(), "the plan ran code"
    assert_refused(r.returncode, r.stderr)


def test_a_huge_plan_file_is_refused_unread(builds, tmp_path):
    build = copy_build(builds["returns"], tmp_path / "build", "{}")
    with open(build / "plan.json", "r+b") as f:  # sparse: it takes no room on the disk
        f.truncate(MAX_PLAN_BYTES + 1)
    started = time.perf_counter()
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, "bytes")
    r = run_subprocess("inspect", build / "plan.json", cwd=tmp_path)
    assert_refused(r.returncode, r.stderr, "too large")
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize("where", ["source", "buffer-name", "where"])
def test_code_in_free_text_is_only_data(where, builds, tmp_path):
    """Text a plan keeps for messages may hold anything printable: it runs, and runs nothing."""
    marker = tmp_path / "MARKER"
    p = plan_of(builds["returns"])
    del p["kernels"]  # else refused: the kernel file was generated for the plan as it was
    if where == "source":
        p["source"] = code(marker)
    elif where == "buffer-name":
        p["buffers"][0]["name"] = code(marker)
    else:
        node(p, "cos")["where"][0] = code(marker)
    build = copy_build(builds["returns"], tmp_path / "build", p)
    with deadline(DEADLINE):
        r = cli("run", build, "--no-progress")
    assert r.exit_code == 0, r.stderr
    assert not marker.exists(), "the plan ran code"


HUGE = ["mul"] + [1 << 40] * 30  # 2^1200, more than a float holds


@pytest.mark.parametrize(
    "arg",
    [
        ["sub", ["add", "X", HUGE], HUGE],
        ["sub", ["add", "X", ["zdiv_r", HUGE, 7]], 1],  # 2^1200 = 1 (mod 7)
        ["add", "X", ["mod", ["neg", HUGE], 1 << 40], ["fdiv_q", 5, 1 << 40]],
    ],
    ids=["sum", "remainder", "floor"],
)
def test_huge_ints_in_loop_expressions_are_exact(arg, builds, tmp_path):
    """A plan's loop expressions are Python ints: a huge term that cancels runs as the plan
    without it (the remainder of a huge int once went through a float and overflowed)."""
    p = plan_of(builds["returns"])
    del p["kernels"]
    (was,) = call(p)["args"]
    call(p)["args"] = [renamed(arg, "X", was)]  # the same value as ``was``
    build = copy_build(builds["returns"], tmp_path / "build", p)
    with deadline(DEADLINE):
        r = cli("run", build, "--no-progress")
    assert r.exit_code == 0, r.stderr


def test_a_kernel_that_fails_on_a_corrupt_attribute_fails_the_run(builds, tmp_path):
    """An attribute of the right kind with a value that makes its kernel fail is a failure
    while running (exit 3), with a message and no traceback."""
    p = plan_of(builds["reinforce"])
    del p["kernels"]
    node(p, "index")["attrs"]["items"] = [["int", 1000]]
    build = copy_build(builds["reinforce"], tmp_path / "build", p)
    with deadline(DEADLINE):
        r = cli("run", build, "--no-progress")
    assert r.exit_code == 3, r.stderr
    assert r.stderr.startswith("timerlc: run failed:") and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- program.pdg.json
# A build folder without plan.json runs its checked program (program.pdg.json) on the
# reference interpreter, which compiles index expressions into Python over dim names.
def _rename_dim(g: dict, old: str, new: str):
    g["dims"] = renamed(g["dims"], old, new)
    for dom in g["domains"]:
        dom[0] = renamed(dom[0], old, new)


PDG_CASES = {
    "code-dim-name": lambda g, c: _rename_dim(g, "t", f"t={c}"),
    "keyword-dim-name": lambda g, c: _rename_dim(g, "t", "lambda"),
    "code-domain": lambda g, c: set_in(g["domains"][0], 1, c),
    "code-access": lambda g, c: set_in(g["nodes"][0]["inputs"][0], "access", f"[{c}]"),
    "code-op": lambda g, c: set_in(g["nodes"][0], "op", c),
    "domain-names-no-dim": lambda g, c: set_in(g["domains"][0], 1, "zz >= 0"),
    "truncated": lambda g, c: json.dumps(g)[:3000],
    "deep-json": lambda g, c: '{"a":' * 100_000 + "1" + "}" * 100_000,
    "deep-condition": lambda g, c: set_in(g["domains"][0], 1, "(" * 5000 + "true" + ")" * 5000),
    "nodes-not-objects": lambda g, c: set_in(g, "nodes", ["x"]),
}


@pytest.mark.parametrize("case_id", PDG_CASES)
def test_a_broken_program_file_is_refused(case_id, builds, tmp_path):
    marker = tmp_path / "MARKER"
    build = copy_build(builds["returns"], tmp_path / "build", "")
    (build / "plan.json").unlink()
    g = json.loads((build / "program.pdg.json").read_text())
    changed = PDG_CASES[case_id](g, code(marker))
    (build / "program.pdg.json").write_text(json.dumps(g) if changed is None else changed)
    with deadline(DEADLINE):
        r = cli("run", build, "--no-progress")
    assert not marker.exists(), "the program file ran code"
    assert_refused(r.exit_code, r.stderr, "cannot load")


@pytest.mark.parametrize(
    "manifest", ["[]", '{"format_version": 1, "program": 5}', "{" * 100_000, "\xff"]
)
def test_a_broken_manifest_is_refused(manifest, builds, tmp_path):
    build = copy_build(builds["returns"], tmp_path / "build", "")
    (build / "plan.json").unlink()
    (build / "build.json").write_text(manifest, encoding="latin-1")
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, "not a timerlc build folder")


def test_the_program_file_of_a_build_still_runs(builds, tmp_path):
    build = copy_build(builds["reinforce"], tmp_path / "build", "")
    (build / "plan.json").unlink()
    r = cli("run", build, "--no-progress")
    assert r.exit_code == 0, r.stderr


# ----------------------------------------------------------------------------- the fuzzer
FUZZ_MUTATIONS = 200  # per program


def hostile_values(marker: Path) -> list:
    return [
        0, 1, 2, 7, -1, -7, 1 << 31, (1 << 31) + 1, 1 << 40, 1 << 63, 10**30,
        0.5, -1e308, float("nan"), True, False, None,
        "", "t", "i", "c1", "f32", "merge", "__import__", "x" * 300, code(marker),
        [], [0], [[0]], ["add", "t", 1], ["neg", ["neg", 1 << 40]], nested("neg", 70, 0),
        {}, {"ix": "t"}, {"float": "nan"}, {"kind": "window", "dim": "t", "size": 1},
    ]  # fmt: skip


def containers(x, out: list) -> list:
    """Every dict and list inside ``x`` (``x`` first)."""
    out.append(x)
    for v in x.values() if isinstance(x, dict) else x:
        if isinstance(v, (dict, list)):
            containers(v, out)
    return out


def mutate(p: dict, rng: random.Random, pool: list) -> str:
    """Change ``p`` in place at random: an entry replaced by a hostile value, a field
    deleted or a list cut short; returns what it did."""
    where = [c for c in containers(p, []) if c]
    kind = rng.random()
    if kind < 0.4:  # an int stays an int: these reach the runtime more often
        c, key = rng.choice([(c, k) for c in where for k in _keys(c) if _is_int(c[k])])
        c[key] = rng.choice([-1, 0, 1, c[key] - 1, c[key] + 1, 2 * c[key], 1000, 1 << 31])
        return f"[{key!r}] = {c[key]}"
    if kind < 0.7:
        c = rng.choice(where)
        key = rng.choice(list(c)) if isinstance(c, dict) else rng.randrange(len(c))
        c[key] = copy.deepcopy(rng.choice(pool))
        return f"[{key!r}] = {json.dumps(c[key])[:80]}"
    if kind < 0.85:
        c = rng.choice([c for c in where if isinstance(c, dict)])
        key = rng.choice(list(c))
        del c[key]
        return f"del [{key!r}]"
    c = rng.choice([c for c in where if isinstance(c, list)])
    n = rng.randrange(len(c))
    length = len(c)
    del c[n:]
    return f"a list of {length} cut to {n}"


def _keys(c) -> list:
    return list(c) if isinstance(c, dict) else list(range(len(c)))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def outcome(path: Path) -> str:
    """How a plan file fares: refused (exit 2), failed while running (exit 3), or ran."""
    try:
        plan = load_plan(path)
    except PlanError:
        return "refused"
    try:
        run_plan(plan)
    except PlanError:
        return "refused while running"
    except RunError:
        return "failed"
    return "ran"


@contextmanager
def address_space(extra: int):
    """This process may map at most ``extra`` more bytes (a corrupt size fails at once)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    limit = used + extra if hard == resource.RLIM_INFINITY else min(used + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("program", list(SOURCES))
def test_random_changes_are_refused_or_run(program, builds, tmp_path):
    rng = random.Random(0)
    marker = tmp_path / "MARKER"
    pool = hostile_values(marker)
    original = plan_of(builds[program])
    seen: dict[str, int] = {}
    wrong = []
    with address_space(MEMORY):
        for k in range(FUZZ_MUTATIONS):
            p = copy.deepcopy(original)
            what = "; ".join(mutate(p, rng, pool) for _ in range(rng.randint(1, 3)))
            path = tmp_path / f"plan{k}.json"
            path.write_text(json.dumps(p))
            started = time.perf_counter()
            try:
                with deadline(DEADLINE):
                    got = outcome(path)
            except (Exception, Hang) as e:  # noqa: BLE001 - any other outcome is the finding
                wrong.append(f"{k} ({what}): {type(e).__name__}: {str(e)[:300]}")
                continue
            seen[got] = seen.get(got, 0) + 1
            if time.perf_counter() - started > 5:
                wrong.append(f"{k} ({what}): {got} after {time.perf_counter() - started:.1f} s")
            path.unlink()
    assert not marker.exists(), "a plan ran code"
    assert not wrong, "\n".join(wrong[:20])
    # the changes reach both the checks and the runtime
    assert seen.get("refused", 0) > FUZZ_MUTATIONS // 4 and seen.get("ran", 0) > 0, seen


# ----------------------------------------------------------------------------- kernel files
def test_a_corrupt_kernel_file_is_refused(builds, tmp_path):
    build = copy_build(builds["returns"], tmp_path / "build", plan_of(builds["returns"]))
    ll = build / "kernels" / "cpu.ll"
    ll.write_text(ll.read_text().replace("fadd", "fsub", 1))
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, "does not match the plan's hash of it")


def test_a_missing_kernel_file_is_refused(builds, tmp_path):
    build = copy_build(builds["returns"], tmp_path / "build", plan_of(builds["returns"]))
    (build / "kernels" / "cpu.ll").unlink()
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, "cpu.ll is missing")


def test_a_kernel_file_of_another_plan_is_refused(builds, tmp_path):
    """A kernel file with the hash the plan records, made for another plan (an edited plan
    given the hash of its old kernel file, a file copied from another build)."""
    p = plan_of(builds["returns"])
    other = (builds["reinforce"] / "kernels" / "cpu.ll").read_text()
    p["kernels"]["sha256"] = plan_of(builds["reinforce"])["kernels"]["sha256"]
    build = copy_build(builds["returns"], tmp_path / "build", p)
    (build / "kernels" / "cpu.ll").write_text(other)
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, "was generated for another plan")


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda k: k.update(file="../../etc/passwd"), "is not a file kernels/NAME.ll"),
        (lambda k: k.update(sha256="00"), "is not a SHA-256 in hex"),
        (lambda k: k["statements"].append(k["statements"][0]), "named twice"),
        (lambda k: k["statements"][0].__setitem__(0, 10**6), "does not exist"),
        (lambda k: k["statements"][0].__setitem__(1, "os.system"), "is not a name"),
        (lambda k: k["trees"][0].__setitem__(0, 10**6), "out of range"),
        (lambda k: k.update(extra=1), "unknown field"),
        (lambda k: k.update(fused=[[0]]), "at least 2 statements"),
        (lambda k: k.update(fused=[[0, 10**6]]), "does not exist"),
        (lambda k: k.update(fused=[[0, 0]]), "named twice"),
        (lambda k: k.update(fused=[[0, "os.system"]]), "expected an integer"),
        (lambda k: k.update(row_loops=[[]]), "expected a list of statements"),
        (lambda k: k.update(row_loops=[[10**6]]), "has no kernel"),
        (lambda k: k.update(row_loops=[[k["statements"][0][0]] * 2]), "named twice"),
        (lambda k: k.update(row_loops=[["os.system"]]), "expected an integer"),
    ],
    ids=[
        "path",
        "sha",
        "twice",
        "statement",
        "function",
        "tree-item",
        "field",
        "fused-one",
        "fused-statement",
        "fused-twice",
        "fused-code",
        "rows-empty",
        "rows-statement",
        "rows-twice",
        "rows-code",
    ],
)
def test_a_broken_kernels_field_is_refused(change, says, builds, tmp_path):
    p = plan_of(builds["returns"])
    change(p["kernels"])
    build = copy_build(builds["returns"], tmp_path / "build", p)
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, says)


def test_a_kernel_for_a_plugin_environment_call_is_refused(builds, tmp_path):
    # reinforce's cartpole is a built-in: its calls have kernels (codegen.envs); a plugin's
    # calls cannot
    p = plan_of(builds["reinforce"])
    env = next(s["id"] for s in p["statements"] if s["nodes"][-1]["op"] == "env_step")
    assert env in [sid for sid, _, _ in p["kernels"]["statements"]]
    p["envs"][0]["spec"] = "gym:CartPole-v1"
    build = copy_build(builds["reinforce"], tmp_path / "build", p)
    r = cli("run", build, "--no-progress")
    assert_refused(r.exit_code, r.stderr, "calls an environment that is a plugin")
