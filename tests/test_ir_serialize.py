"""The PDG's text and JSON forms round-trip exactly; dot renders; the CLI reads and writes them.

Equality here is stricter than the dataclasses' ``==``: spans must survive, and attribute
values must keep their Python types (``1 == 1.0 == True == Integer(1)`` to Python).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import sympy
from click.testing import CliRunner

from timerlc.cli import cli
from timerlc.diagnostics import Source, Span
from timerlc.frontend.check import check_source
from timerlc.ir import index as ix
from timerlc.ir.pdg import (
    FORMAT_VERSION,
    SCALAR_DOMAIN,
    Dim,
    Domain,
    Edge,
    Graph,
    Node,
    Point,
    Range,
    Tensor,
)
from timerlc.ir.serialize import from_json, from_text, to_dot, to_json, to_text
from timerlc.types import TensorType

PROGRAMS_DIR = Path(__file__).resolve().parent.parent / "programs"

PROGRAMS = {
    "recurrence": """
config T = 10, gamma = 0.9
dim t < T
r[t] = f32(t) * 0.5
g[T-1] = r[T-1]
g[t] = r + gamma * g[t+1]
h[t] = discounted_sum(r[t:T], gamma)
c[0] = r[0]
c[t] = c[t-1] + r[t]
out g, h, c
""",
    "merge_conditions": """
config T = 12
dim i < 3
dim t < T
x[i, t] = f32(t) * 0.5 + f32(i)
m[i, t] = x when t % 2 == 0 and not t > 5
m[i, t] = -x when t == 7 or t >= 10
m[i, t] = x * 2.0
out m
""",
    "slices_and_indices": """
config T = 12, K = 3
dim i < 3
dim t < T
x[i, t] = f32(t) * 0.5 + f32(i)
s[i] = sum(x[i, 0:T])
a[i] = x[i, 0:T]
d[i, t] = sum(x[i, t:T])
w[i, t] = mean(x[i, max(0, t-2):t+1])
q[i, t] = x[i, min(t // 2, T - 1)] + x[i, (t + 1) % T] + x[i, max(t - K, 0)]
out s, a, d, w, q
""",
    "spatial": """
config K = 4
dim k < K
perm = arange(8)
chunk[k] = perm[(k % 2) * 2 : (k % 2 + 1) * 2]
row[k] = ones([3, 5])[1:3, k]
m = ones([4, 5])
col[k] = m[k, 2] + m[-1][k] + sum(m[0:2, 1]) + sum(m[:, k])
pick[k] = m[k][perm[k]]
out chunk, row, col, pick
""",
    "records_and_tuples": """
config N = 4
dim i < N
params net[i] {
  w : f32[2, 3] = zeros
  b : f32[3] = 0.5
}
net[i+1] = net[i]
v[i] = net[i].w[1, 2] + net[i].b[i % 3]
def f(x) { (x, x + 1) }
p[i], r[i] = f(f32(i))
out v, p, r, net
""",
    "dtypes": """
config N = 3, lr = 0.001, big = 1e20, on = true
dim i < N
a[i] = f64(i) * 2.0 + 1e-8
b[i] = i64(i) + i64(3)
c[i] = i > 1 or false
d[i] = where(c[i], 1, 0)
e = zeros([2], dtype=f64) + lr + big
f = i32(-7) // 2
g[i] = on and c[i]
out a, b, c, d, e, f, g
""",
}


def _program_graphs():
    out = [pytest.param(src, id=name) for name, src in PROGRAMS.items()]
    for p in sorted(PROGRAMS_DIR.glob("*.rtl")):
        out.append(pytest.param(p.read_text(), id=p.name))
    return out


def _check(text: str) -> Graph:
    return check_source(Source("test.rtl", text))


def assert_same(a, b, path="graph"):
    """Deep equality that also compares spans and the exact types of leaf values."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{k}]")
    elif isinstance(a, sympy.Basic):
        same = isinstance(b, sympy.Basic) and sympy.srepr(a) == sympy.srepr(b)
        assert same, f"{path}: {a} != {b}"
    elif isinstance(a, float):
        assert type(b) is float, f"{path}: {a!r} != {b!r}"
        if math.isnan(a):
            assert math.isnan(b), f"{path}: {a!r} != {b!r}"
        else:
            assert a == b and math.copysign(1, a) == math.copysign(1, b), f"{path}: {a!r} != {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} != {b!r}"


def assert_round_trips(g: Graph):
    text = to_text(g)
    assert text.endswith("\n")
    back = from_text(text)
    assert_same(g, back)
    assert to_text(back) == text
    js = to_json(g)
    back = from_json(js)
    assert_same(g, back)
    assert to_json(back) == js
    assert json.loads(js)["format_version"] == FORMAT_VERSION


@pytest.mark.parametrize("src", _program_graphs())
def test_programs_round_trip(src):
    g = _check(src)
    if not any(n.op == "merge" for n in g.nodes):
        pytest.fail("expected a merge node")
    assert_round_trips(g)
    assert g == from_text(to_text(g)) == from_json(to_json(g))


def test_dump_is_readable():
    text = to_text(_check(PROGRAMS["recurrence"]))
    lines = text.splitlines()
    assert lines[0] == f"pdg format {FORMAT_VERSION}"
    assert "config T = 10, gamma = 0.9, seed = 0" in lines
    assert "dim t < 10" in lines
    assert any(line.startswith("domain D") and "[t] :" in line for line in lines)
    g_line = next(line for line in lines if line.lstrip().startswith("g = %"))
    assert "merge(%" in g_line and " if t == 9" in g_line
    assert any("discounted_sum(%0[t:10], %" in line for line in lines)
    assert "tensor g = %1" in lines and "out g, h, c" in lines
    assert all(len(line) < 200 for line in lines)
    node_lines = [line for line in lines if "%" in line and " = " in line and "over" in line]
    assert len({line.index("%") for line in node_lines}) == 1  # ids are aligned
    assert len({line.index(" = ", line.index("%")) for line in node_lines}) == 1


def test_spatial_items_keep_their_types():
    g = _check(PROGRAMS["spatial"])
    items = [n.attr("items") for n in from_text(to_text(g)).nodes if n.op == "index"]
    kinds = {it[0] for its in items for it in its}
    assert kinds == {"int", "slice", "full", "gather"}
    for its in items:
        for it in its:
            if it[0] in ("int", "slice"):
                assert isinstance(it[1], sympy.Expr)
            if it[0] == "slice":
                assert type(it[2]) is int
    assert any(it[0] == "slice" and not it[1].is_Integer for its in items for it in its)


# ----------------------------------------------------------------------------- hand-made graphs
T, I = ix.sym("t"), ix.sym("i")
BOX = Domain(("i", "t"), ix.box([("i", 3), ("t", 10)]))

EXPRS = [
    T + 1,
    T - 1,
    -T + 10,
    2 * T - 3 * I,
    ix.floordiv(T + 1, 2),
    ix.floordiv(-T, 3),
    ix.mod(2 * T + 3, 4),
    3 * ix.floordiv(T, 2) - ix.mod(I, 3),
    sympy.Min(T, I + 1, 5),
    sympy.Max(0, T - 2),
    sympy.Max(0, sympy.Min(T, 9) - ix.floordiv(I, 2)),
    sympy.Integer(-4),
    ix.floordiv(ix.mod(T, 4), 2),
    T - ix.mod(T, 2),
    ix.mod(T + I, 2) * 5,
]
CONDS = [
    sympy.true,
    sympy.false,
    sympy.Eq(T, 9),
    sympy.Ne(T, 0),
    sympy.Lt(-1, T),
    sympy.And(T >= 0, T < 10, sympy.Eq(ix.mod(T, 2), 0)),
    sympy.Or(sympy.Eq(T, 0), sympy.And(I > 1, T <= 5)),
    sympy.Not(sympy.And(sympy.Eq(T, 0), I >= 0)),
    sympy.And(T >= 0, sympy.Not(sympy.Or(sympy.Eq(T, 3), I > T + 1))),
    sympy.Eq(sympy.Max(0, T - 2), ix.floordiv(I, 3)),
]


def _tricky_graph() -> Graph:
    attrs = (
        ("none", None),
        ("bools", (True, False)),
        ("ints", (0, -3, 2**70)),
        ("floats", (0.1, -0.0, 1e-8, 1e300, float("inf"), float("-inf"), 1.0, 5e-324)),
        ("text", 'he said "hi"\\n \u00e9 # not a comment'),
        ("empty", ()),
        ("one", ((),)),
        ("nested", (("int", sympy.Integer(3)), ("slice", T + 1, 4), ("full",), ("gather",))),
        ("exprs", tuple(EXPRS)),
        ("conds", tuple(CONDS)),
        ("out", "keyword as a key"),
    )
    n0 = Node(
        0,
        "const",
        SCALAR_DOMAIN,
        (),
        (TensorType("f64", (2, 3)),),
        (("dtype", "f64"), ("shape", (2, 3)), ("value", ((1.5, -2.0, 3.0), (0.0, 1e-3, 7.0)))),
        name="out",
        span=Span(1, 1, 2, 4),
    )
    n1 = Node(
        1,
        "pair",
        BOX,
        (Edge(0, ()),),
        (TensorType("i64", ()), TensorType("bool", (4,))),
        attrs,
        name='weird name "x"',
    )
    edges = tuple(Edge(1, (Point(e), Point(T)), out=1, span=Span(3, 4, 3, 9)) for e in EXPRS)
    n2 = Node(
        2,
        "concat",
        BOX,
        edges,
        (TensorType("bool", (4 * len(EXPRS),)),),
        (("axis", 0),),
        span=Span(3, 1, 3, 30),
    )
    ranged = (
        Edge(1, (Point(I), Range(T, sympy.Integer(10))), out=0),
        Edge(1, (Point(I), Range(sympy.Max(0, T - 2), T + 1))),
    )
    n3 = Node(3, "sum", BOX, ranged[:1], (TensorType("i64", (10 - T,)),), (("axes", (0,)),))
    n4 = Node(4, "mean", BOX, ranged[1:], (TensorType("f32", (sympy.Min(T, 2) + 1,)),), ())
    branches = tuple(
        Edge(
            k % 4 + 1,
            (Point(I), Point(T)),
            cond=c,
            span=None if k % 2 else Span(9, k + 1, 9, k + 2),
        )
        for k, c in enumerate(CONDS)
    )
    n5 = Node(
        5,
        "merge",
        Domain(("i", "t"), sympy.Or(*CONDS[2:5])),
        branches,
        (TensorType("f32", ()),),
        name="m.field",
    )
    n6 = Node(
        6, "dimval", Domain(("t",), T < 10), (), (TensorType("i32", ()),), (("dim", "t"),), "t"
    )
    n7 = Node(7, "nothing", SCALAR_DOMAIN, (), (), ())
    return Graph(
        dims=(Dim("i", 3), Dim("t", 10)),
        nodes=(n0, n1, n2, n3, n4, n5, n6, n7),
        tensors=(Tensor("out", 0), Tensor('weird name "x"', 1, 1), Tensor("m.field", 5)),
        outputs=("out", "m.field"),
        metrics=('weird name "x"',),
        configs=(("T", 10), ("lr", 3e-4), ("on", True), ("off", False), ("neg", -2.5), ("dim", 1)),
    )


def test_tricky_graph_round_trips():
    assert_round_trips(_tricky_graph())


def test_nan_round_trips():
    nan = Node(0, "const", SCALAR_DOMAIN, (), (TensorType("f32", ()),), (("value", math.nan),))
    g = Graph((), (nan,))
    for back in (from_text(to_text(g)), from_json(to_json(g))):
        assert math.isnan(back.nodes[0].attr("value"))


def test_empty_graph_round_trips():
    assert_round_trips(Graph((), ()))


def _random_expr(r: random.Random, depth: int = 0):
    k = r.randrange(9 if depth < 3 else 3)
    if k < 3:
        return (T, I, sympy.Integer(r.randint(-5, 9)))[k]
    a, b = _random_expr(r, depth + 1), _random_expr(r, depth + 1)
    return (
        a + b,
        a - b,
        r.randint(-3, 4) * a,
        ix.floordiv(a, r.randint(1, 5)),
        ix.mod(a, r.randint(1, 5)),
        sympy.Min(a, b),
    )[k - 3]


def _random_cond(r: random.Random, depth: int = 0):
    k = r.randrange(4 if depth < 2 else 1)
    if k == 0:
        rel = r.choice([sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge, sympy.Eq, sympy.Ne])
        return rel(_random_expr(r, 1), _random_expr(r, 1))
    a, b = _random_cond(r, depth + 1), _random_cond(r, depth + 1)
    return (sympy.And(a, b), sympy.Or(a, sympy.Not(b)), sympy.Not(sympy.Or(a, b)))[k - 1]


def test_random_index_expressions_round_trip():
    """sympy re-canonicalizes what the parser builds; it must land on the very same tree."""
    r = random.Random(0)
    values = tuple(_random_expr(r) for _ in range(80)) + tuple(_random_cond(r) for _ in range(80))
    node = Node(0, "f", SCALAR_DOMAIN, (), (TensorType("f32", ()),), (("values", values),))
    g = Graph((Dim("i", 3), Dim("t", 10)), (node,))
    assert_round_trips(g)


@pytest.mark.parametrize("form", ["text", "json"])
def test_damaged_input_raises_only_value_errors(form):
    dump, load = (to_text, from_text) if form == "text" else (to_json, from_json)
    base = dump(_check(PROGRAMS["records_and_tuples"]))
    r = random.Random(1)
    for _ in range(500):
        s = list(base)
        for _ in range(r.randint(1, 3)):
            k = r.randrange(len(s))
            s[k : k + r.randint(0, 1)] = r.choice(["", *'%@()[]{},:=-+*/ 09abt".#', "\n"])
        try:
            load("".join(s))
        except ValueError:
            pass


def test_text_form_ignores_comments_and_blank_lines():
    text = to_text(_check(PROGRAMS["recurrence"]))
    noisy = "# a dump\n\n" + text.replace("\ndim", "\n# dims\n\ndim").replace("\n", "   # c\n", 3)
    assert_same(from_text(text), from_text(noisy))


# ----------------------------------------------------------------------------- bad input
GOOD = to_text(_check(PROGRAMS["recurrence"]))


def _replace_line(text: str, start: str, new: str) -> tuple[str, int]:
    lines = text.splitlines()
    k = next(k for k, line in enumerate(lines) if line.lstrip().startswith(start))
    lines[k] = new
    return "\n".join(lines) + "\n", k + 1


@pytest.mark.parametrize(
    "start, new, message",
    [
        ("pdg", "pdg format 99", "format 99"),
        ("pdg", "hello", "header"),
        ("dim", "dim t < ten", "expected a dim bound"),
        ("domain D0", "domain D0 = [t] : t + 1", "expected a condition"),
        ("r = %0", "r = %0 = merge(%7[t] if t >= 0) : f32[] over D77", "unknown domain D77"),
        ("r = %0", "r = %1 = merge(%7[t]) : f32[] over D0", "expected node %0"),
        ("r = %0", "r = %0 = merge(%700[t]) : f32[] over D0", "%700 is not a node"),
        (
            "r = %0",
            "r = %0 = merge(%7[t] if t >=) : f32[] over D0",
            "expected an index expression",
        ),
        ("r = %0", "r = %0 = merge(%7[t]) : f33[] over D0", "unknown dtype 'f33'"),
        ("r = %0", "r = %0 = merge(%7[t]) {a=} : f32[] over D0", "expected a value"),
        ("r = %0", "r = %0 = merge(%7[t]) : f32[] over D0 $", "unexpected character '$'"),
        ("r = %0", "r = %0 = merge(%7[t]) : f32[] over D0 @3:1-2 [@_ @_]", "2 input spans"),
        ("tensor r", "tensor r = %99", "%99 is not a node"),
    ],
)
def test_text_errors_name_the_line(start, new, message):
    bad, line = _replace_line(GOOD, start, new)
    with pytest.raises(ValueError) as e:
        from_text(bad)
    assert str(e.value).startswith(f"line {line}: ")
    assert message in str(e.value)


def test_empty_text_is_an_error():
    with pytest.raises(ValueError, match="header"):
        from_text("# nothing\n")


GOOD_JSON = to_json(_check(PROGRAMS["recurrence"]))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(format_version=0), "format 0"),
        (lambda d: d.pop("format_version"), "no format_version"),
        (lambda d: d.pop("nodes"), "malformed"),
        (
            lambda d: d["nodes"][3].update(types=["f32[t +]"]),
            "nodes[3].types[0]: expected an index",
        ),
        (lambda d: d["nodes"][3].update(id=4), "nodes[3]: has id 4"),
        (lambda d: d["nodes"][2]["inputs"][0].update(src=1000), "%1000 is not a node"),
        (lambda d: d["nodes"][2]["inputs"][0].update(access="[t"), "nodes[2].inputs[0].access"),
        (lambda d: d["nodes"][2].update(span=[1, 2]), "nodes[2]: expected a span"),
        (lambda d: d["dims"].append(["x"]), "dims: expected rows of 2"),
        (lambda d: d["domains"][0].__setitem__(1, "t <"), "domains[0]"),
        (lambda d: d["nodes"][6].update(attrs=[["value", {"what": 1}]]), "unknown tagged value"),
    ],
)
def test_json_errors_are_value_errors(edit, message):
    data = json.loads(GOOD_JSON)
    edit(data)
    with pytest.raises(ValueError) as e:
        from_json(json.dumps(data))
    assert message in str(e.value)


def test_json_syntax_error_names_the_line():
    with pytest.raises(ValueError, match=r"^line 3: not valid JSON"):
        from_json('{\n  "format_version": 1,\n  "dims": [,]\n}')


# ----------------------------------------------------------------------------- dot
def test_dot():
    g = _check(PROGRAMS["recurrence"])
    dot = to_dot(g)
    assert dot.startswith("digraph")
    assert dot.rstrip().endswith("}")
    for n in g.nodes:
        assert f'  n{n.id} [label="%{n.id} {n.op}' in dot
    assert 'n1 -> n10 [label="[t + 1]"]' in dot
    assert 'n8 -> n1 [label="[]\\nif t == 9"]' in dot
    dot = to_dot(_tricky_graph())
    assert '\\"x\\"' in dot  # quotes in names are escaped


# ----------------------------------------------------------------------------- command line
def _compile(tmp_path: Path, src: str):
    prog = tmp_path / "prog.rtl"
    prog.write_text(src)
    build = tmp_path / "build"
    result = CliRunner().invoke(cli, ["compile", str(prog), "-o", str(build), "--dump-ir"])
    assert result.exit_code == 0, result.output
    return prog, build


def test_cli_dump_and_inspect(tmp_path):
    prog, build = _compile(tmp_path, PROGRAMS["recurrence"])
    dump = build / "ir" / "00-frontend.pdg"
    graph = _check(PROGRAMS["recurrence"])
    assert dump.read_text() == to_text(graph)
    # the build's program is the graph after the last pass
    last = sorted((build / "ir").glob("*.pdg"))[-1]
    assert last.name == "06-narrow.pdg"
    assert to_text(from_json((build / "program.pdg.json").read_text())) == last.read_text()
    runner = CliRunner()
    result = runner.invoke(cli, ["inspect", str(dump)])
    assert result.exit_code == 0 and result.output == to_text(graph)
    result = runner.invoke(cli, ["inspect", str(dump), "--format", "json"])
    assert result.exit_code == 0
    assert_same(from_json(result.output), graph)
    result = runner.invoke(cli, ["inspect", str(build / "program.pdg.json"), "--format", "dot"])
    assert result.exit_code == 0 and result.output.startswith("digraph")


def test_cli_run_from_build_folder(tmp_path):
    prog, build = _compile(tmp_path, PROGRAMS["recurrence"])
    runner = CliRunner()
    from_build, from_source = tmp_path / "a.npz", tmp_path / "b.npz"
    for target, npz in ((build, from_build), (prog, from_source)):
        args = ["run", str(target), "--backend", "reference", "--outputs", str(npz)]
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
    a, b = np.load(from_build), np.load(from_source)
    assert sorted(a.files) == ["c", "g", "h"]
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k])


def test_cli_rejects_corrupt_and_old_files(tmp_path):
    prog, build = _compile(tmp_path, PROGRAMS["recurrence"])
    runner = CliRunner()
    dump = build / "ir" / "00-frontend.pdg"
    dump.write_text(dump.read_text().replace("over D0", "over D99", 1))
    result = runner.invoke(cli, ["inspect", str(dump)])
    assert result.exit_code == 2
    assert "is not a timerlc IR dump" in result.output and "unknown domain D99" in result.output

    program = build / "program.pdg.json"
    data = json.loads(program.read_text())
    data["format_version"] = FORMAT_VERSION + 1
    program.write_text(json.dumps(data))
    result = runner.invoke(cli, ["run", str(build), "--backend", "reference"])
    assert result.exit_code == 2
    assert f"format {FORMAT_VERSION + 1}" in result.output and "cannot load" in result.output
    result = runner.invoke(cli, ["inspect", str(program)])
    assert result.exit_code == 2

    program.write_text(GOOD_JSON[: len(GOOD_JSON) // 2])
    result = runner.invoke(cli, ["run", str(build), "--backend", "reference"])
    assert result.exit_code == 2 and "not valid JSON" in result.output
