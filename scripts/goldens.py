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
    # 256 environments: the rollout and the returns by chunks of rows (docs/codegen.md)
    ("reinforce_256", "programs/reinforce.rtl", {"B": "256", "T": "128", "I": "4"}, None),
]


def dumps(program: str, overrides: dict[str, str] | None = None, budget=None) -> dict[str, str]:
    """File name -> text of every golden dump of the program file ``program`` (relative to
    the repository's root)."""
    from timerlc.compiler import compile_source
    from timerlc.diagnostics import Source
    from timerlc.ir import serialize
    from timerlc.codegen.generate import listing
    from timerlc.plan import text as plan_text

    source = Source(program, (ROOT / program).read_text())
    stages: list[tuple[str, object]] = []
    _, plan, _ = compile_source(
        source,
        overrides or {},
        memory_budget=budget,
        on_stage=lambda name, x: stages.append((name, x)),
    )
    graphs = [(name, g) for name, g in stages if name not in ("schedule", "plan", "kernels")]
    out = {f"{k:02d}-{name}.pdg": serialize.to_text(g) for k, (name, g) in enumerate(graphs)}
    out["plan.txt"] = plan_text.render(plan) + "\n" + nodes_text(plan)
    out["kernels.txt"] = listing(dict(stages)["kernels"])
    return out


def all_dumps() -> dict[str, dict[str, str]]:
    """Golden folder -> its dumps, for every program and variant."""
    out = {p.stem: dumps(f"programs/{p.name}") for p in sorted(PROGRAMS.glob("*.rtl"))}
    for folder, program, overrides, budget in VARIANTS:
        out[folder] = dumps(program, overrides, budget)
    return out


# ----------------------------------------------------------------------------- plan nodes
def nodes_text(plan) -> str:
    """Every node of every statement: its op and attributes, and per input the statement or
    node it reads, at which index, under which condition."""
    from timerlc.plan import expr as px
    from timerlc.plan.items import At

    lines = ["nodes:"]
    for st in plan.statements:
        lines.append(f"  statement {st.id} over {px.text(st.domain)}")
        for n in st.nodes:
            attrs = ", ".join(f"{k}={_attr(v)}" for k, v in sorted(n.attrs))
            types = ", ".join(f"{t.dtype}{list(t.shape)}" for t in n.types)
            lines.append(
                f"    %{n.id} = {n.op}[{','.join(st.dims)}]({attrs}) : {types}"
                f"  ({n.where[0]}, line {n.where[1]})"
            )
            for r in n.inputs:
                kind = "buffer" if r.stored else "node"
                parts = [
                    px.text(a.index) if isinstance(a, At) else f"{px.text(a.lo)}:{px.text(a.hi)}"
                    for a in r.access
                ]
                cond = "" if r.cond is None else f" if {px.text(r.cond)}"
                lines.append(f"      <- {kind} %{r.src}.{r.out}[{', '.join(parts)}]{cond}")
    return "\n".join(lines) + "\n"


def _attr(v) -> str:
    from timerlc.plan import expr as px
    from timerlc.plan.items import Ix

    if isinstance(v, tuple):
        return "(" + ", ".join(_attr(x) for x in v) + ")"
    if isinstance(v, Ix):
        return "ix " + px.text(v.expr)
    return repr(v)


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
