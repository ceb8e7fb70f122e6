"""Golden dumps of ``programs/*.rtl``: the IR after every pass and the plan, as text.

The files under ``tests/goldens/<program>/`` record every decision the compiler makes for
the programs we ship: the PDG after each pass (``NN-pass.pdg``, the ``--dump-ir`` text) and
the plan (``plan.txt``: ``timerlc inspect``'s view of sizes, buffers and their storage,
statements with their loops and vector dims, the loop tree with its frees and swaps, then
every node of every statement with its attributes, its reads and their conditions).

``tests/test_goldens.py`` compiles the programs again and fails on any difference. A change
that should change a decision regenerates them with this script, and the diff is reviewed in
the commit; a refactor that must change no decision leaves them as they are.

    python scripts/goldens.py           # rewrite tests/goldens/
    python scripts/goldens.py --check   # exit 1 and show the first differences, if any
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "programs"
GOLDENS = ROOT / "tests" / "goldens"

# more: (golden folder, program file, config overrides, memory budget in bytes)
VARIANTS = [
    # four blocks swapped to host memory and back under a 2.5 MiB budget (docs/plan.md, Swaps)
    ("swaps", "tests/programs/swaps.rtl", {}, 5 * (1 << 19)),
]


def dumps(program: str, overrides: dict[str, str] | None = None, budget=None) -> dict[str, str]:
    """File name -> text of every golden dump of the program file ``program`` (relative to
    the repository's root)."""
    from timerlc.diagnostics import Source
    from timerlc.frontend.check import check_source
    from timerlc.ir import serialize
    from timerlc.passes.pipeline import run_pipeline
    from timerlc.plan import text as plan_text
    from timerlc.runner import compile_plan

    source = Source(program, (ROOT / program).read_text())
    stages: list[tuple[str, object]] = []
    graph = run_pipeline(
        check_source(source, overrides or {}), lambda name, g: stages.append((name, g))
    )
    out = {f"{k:02d}-{name}.pdg": serialize.to_text(g) for k, (name, g) in enumerate(stages)}
    plan = compile_plan(graph, program, memory_budget=budget)
    out["plan.txt"] = plan_text.render(plan) + "\n" + nodes_text(plan)
    return out


def all_dumps() -> dict[str, dict[str, str]]:
    """Golden folder -> its dumps, for every program and variant."""
    out = {p.stem: dumps(f"programs/{p.name}") for p in sorted(PROGRAMS.glob("*.rtl"))}
    for folder, program, overrides, budget in VARIANTS:
        out[folder] = dumps(program, overrides, budget)
    return out


# ----------------------------------------------------------------------------- plan nodes
def nodes_text(plan: dict) -> str:
    """Every node of every statement: its op and attributes, and per input the statement or
    node it reads, at which index, under which condition."""
    from timerlc.plan import text as plan_text

    lines = ["nodes:"]
    for sid, st in plan["statements"].items():
        lines.append(f"  statement {sid} over {cond_text(st['domain'])}")
        for n in st["nodes"]:
            attrs = ", ".join(f"{k}={_attr(v)}" for k, v in sorted(n["attrs"].items()))
            types = ", ".join(f"{t['dtype']}{t['shape']}" for t in n["types"])
            where = n["where"]
            lines.append(
                f"    %{n['id']} = {n['op']}[{','.join(n['dims'])}]({attrs}) : {types}"
                f"  ({where[0]}, line {where[1]})"
            )
            for e in n["inputs"]:
                kind = "buffer" if e["stored"] else "node"
                parts = []
                for a in e["access"]:
                    if a[0] == "pt":
                        parts.append(plan_text.expr(_expr(a[1])))
                    else:
                        parts.append(f"{plan_text.expr(_expr(a[1]))}:{plan_text.expr(_expr(a[2]))}")
                cond = "" if e["cond"] is None else f" if {cond_text(e['cond'])}"
                lines.append(f"      <- {kind} %{e['src']}.{e['out']}[{', '.join(parts)}]{cond}")
    return "\n".join(lines) + "\n"


def cond_text(c) -> str:
    from timerlc.plan import text as plan_text

    return plan_text.expr(_expr(c))


def _attr(v) -> str:
    from timerlc.plan import text as plan_text

    if isinstance(v, list):
        return "(" + ", ".join(_attr(x) for x in v) + ")"
    if isinstance(v, dict) and "sympy" in v:
        return "ix " + plan_text.expr(_sympy_expr(v["sympy"]))
    if isinstance(v, dict) and "float" in v:
        return v["float"]
    if isinstance(v, dict) and "dict" in v:
        return "{" + ", ".join(f"{_attr(k)}: {_attr(x)}" for k, x in v["dict"]) + "}"
    return repr(v)


# Plan format 2 writes index expressions as NumPy-Python text and index-valued attributes
# as sympy srepr; both are read here into the structured form ``[op, E...]`` that
# ``timerlc.plan.text.expr`` prints.
_BINOPS = {"Add": "add", "Sub": "sub", "Mult": "mul", "FloorDiv": "fdiv_q", "Mod": "mod"}
_CMP = {"Lt": "lt", "LtE": "le", "Gt": "gt", "GtE": "ge", "Eq": "eq", "NotEq": "ne"}
_CALLS = {
    "_np.minimum": "min",
    "_np.maximum": "max",
    "_np.logical_and": "and",
    "_np.logical_or": "or",
    "_np.logical_not": "not",
}


def _expr(text: str):
    import ast

    def walk(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            return n.id
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return ["neg", walk(n.operand)]
        if isinstance(n, ast.BinOp):
            return [_BINOPS[type(n.op).__name__], walk(n.left), walk(n.right)]
        if isinstance(n, ast.Compare) and len(n.ops) == 1:
            return [_CMP[type(n.ops[0]).__name__], walk(n.left), walk(n.comparators[0])]
        if isinstance(n, ast.Call):
            return [_CALLS[ast.unparse(n.func)]] + [walk(a) for a in n.args]
        raise ValueError(f"not a plan expression: {ast.unparse(n)}")

    return walk(ast.parse(text, mode="eval").body)


def _sympy_expr(text: str):
    import sympy

    from timerlc.ir import index as ix

    return _expr(ix._PY.expr(sympy.sympify(text)))


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    found = all_dumps()
    if args.check:
        bad = differences(found)
        for line in bad[:200]:
            print(line)
        return 1 if bad else 0
    for folder, files in found.items():
        d = GOLDENS / folder
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            if old.name not in files:
                old.unlink()
        for name, text in files.items():
            (d / name).write_text(text)
    print(f"wrote {sum(len(f) for f in found.values())} files under {GOLDENS}")
    return 0


def differences(found: dict[str, dict[str, str]], only=None) -> list[str]:
    """A unified diff of the golden files against ``found`` (empty: all equal); ``only``:
    the golden folders to compare (default: every folder there is)."""
    out: list[str] = []
    folders = {d.name for d in GOLDENS.iterdir() if d.is_dir()} if GOLDENS.is_dir() else set()
    for folder in sorted(folders | set(found) if only is None else only):
        have = {}
        if (GOLDENS / folder).is_dir():
            have = {f.name: f.read_text() for f in (GOLDENS / folder).iterdir()}
        want = found.get(folder, {})
        for name in sorted(set(have) | set(want)):
            a, b = have.get(name, ""), want.get(name, "")
            if a != b:
                out.extend(
                    difflib.unified_diff(
                        a.splitlines(),
                        b.splitlines(),
                        f"golden/{folder}/{name}",
                        f"now/{folder}/{name}",
                        lineterm="",
                        n=1,
                    )
                )
    return out


if __name__ == "__main__":
    sys.exit(main())
