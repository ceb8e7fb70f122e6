"""A plan in readable form (``timerlc inspect build/plan.json``): the sizes, every buffer
with its storage decision, every statement with its loops and vectorized dims and the ops
it runs, and the loop tree as indented code.

In: a plan dict (docs/plan.md). Out: text. Fields this renderer does not know are shown
as JSON, so that a newer plan still prints.
"""

from __future__ import annotations

import json

from timerlc.runner import format_bytes

_BIN = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "fdiv_q": "//",
    "pdiv_q": "//",
    "pdiv_r": "%",
    "zdiv_r": "%",
    "eq": "==",
    "le": "<=",
    "lt": "<",
    "ge": ">=",
    "gt": ">",
    "and": "and",
    "or": "or",
}


def expr(e) -> str:
    """A loop-tree expression (an int, a name, or ``[op, args...]``) as text."""
    if isinstance(e, (int, str)):
        return str(e)
    op, *args = e
    if op in _BIN and len(args) == 2:
        return f"({expr(args[0])} {_BIN[op]} {expr(args[1])})"
    if op == "neg":
        return f"-{expr(args[0])}"
    if op == "select":
        return f"({expr(args[1])} if {expr(args[0])} else {expr(args[2])})"
    return f"{op}({', '.join(expr(a) for a in args)})"


def _name(plan: dict, sid) -> str:
    buf = plan["buffers"].get(str(sid), {})
    return buf.get("name") or f"%{sid}"


def _storage(buf: dict) -> str:
    st = buf.get("storage")
    if st is None:
        return "block"
    kind = st.get("kind", "?")
    rest = {k: v for k, v in st.items() if k != "kind"}
    text = kind + (" " + " ".join(f"{k}={v}" for k, v in rest.items()) if rest else "")
    if "donor" in buf:
        text += f", donated by {buf['donor']}"
    return text


HEAD = "plan format "  # how the text form starts (``timerlc inspect`` knows it by this)


def render(plan: dict) -> str:
    out = [f"{HEAD}{plan.get('format_version')}  source {plan.get('source') or '-'}"]
    out.append("dims: " + ", ".join(f"{d} < {n}" for d, n in plan.get("dims", {}).items()))
    if plan.get("memory_peak") is not None:
        line = f"memory: peak {format_bytes(plan['memory_peak'])} of buffers"
        if plan.get("memory_budget") is not None:
            met = "met" if plan.get("memory_budget_met") else "NOT met"
            line += f", budget {format_bytes(plan['memory_budget'])} ({met}; without swaps "
            line += f"{format_bytes(plan.get('memory_peak_unswapped', plan['memory_peak']))})"
        out.append(line)
    for e in plan.get("envs", []):
        out.append(f"env {e['name']} = {e['spec']!r} batch {e['batch']} ({e['num_envs']})")
    out.append("")
    out.append("buffers:")
    for sid, b in plan.get("buffers", {}).items():
        types = ", ".join(f"{o['dtype']}{o['shape']}" for o in b.get("outputs", []))
        ext = "x".join(str(x) for x in b.get("extents", [])) or "scalar"
        dims = ",".join(b.get("dims", []))
        out.append(f"  {sid:>5} {_name(plan, sid):24s} [{dims}] {ext} of {types}: {_storage(b)}")
    out.append("")
    out.append("statements:")
    for sid, s in plan.get("statements", {}).items():
        ops = " ".join(n["op"] for n in s.get("nodes", []))
        out.append(
            f"  {sid:>5} {_name(plan, sid):24s} loops [{', '.join(s.get('loops', []))}] "
            f"vector [{', '.join(s.get('vector', []))}]: {ops}"
        )
    out.append("")
    out.append("loop tree:")
    _tree(plan, plan.get("tree", []), 1, out)
    for kind in ("outputs", "metrics"):
        if plan.get(kind):
            out.append(f"{kind}: " + ", ".join(plan[kind]))
    return "\n".join(out) + "\n"


def _tree(plan: dict, items: list, depth: int, out: list):
    pad = "  " * depth
    for it in items:
        if "for" in it:
            step = it["inc"]
            out.append(
                f"{pad}for {it['for']} = {expr(it['init'])}; {expr(it['cond'])}; "
                f"{it['for']} += {step}:"
            )
            _tree(plan, it["body"], depth + 1, out)
        elif "if" in it:
            out.append(f"{pad}if {expr(it['if'])}:")
            _tree(plan, it["then"], depth + 1, out)
            if it.get("else"):
                out.append(f"{pad}else:")
                _tree(plan, it["else"], depth + 1, out)
        elif "call" in it:
            args = ", ".join(expr(a) for a in it["args"])
            out.append(f"{pad}{_name(plan, it['call'])}[{args}]")
        elif "free" in it:
            out.append(f"{pad}free " + ", ".join(_name(plan, s) for s in it["free"]))
        elif "swap_out" in it or "swap_in" in it:
            kind = "swap_out" if "swap_out" in it else "swap_in"
            where = "to host" if kind == "swap_out" else "from host"
            out.append(f"{pad}{kind} {where} " + ", ".join(_name(plan, s) for s in it[kind]))
        else:
            out.append(f"{pad}{json.dumps(it)}")
