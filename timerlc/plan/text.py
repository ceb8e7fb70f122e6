"""A plan in readable form (``timerlc inspect build/plan.json``): the sizes, every buffer
with its storage decision, every statement with its loops and vectorized dims and the ops
it runs, and the loop tree as indented code.

In: a ``Plan`` (``timerlc.plan.items``). Out: text.
"""

from __future__ import annotations

from timerlc.plan import expr as px
from timerlc.plan.items import FORMAT_VERSION, Call, Free, If, Loop, Plan, SwapOut
from timerlc.runner import format_bytes

expr = px.text  # an expression as text


def _name(plan: Plan, sid: int) -> str:
    return plan.buffer(sid).name or f"%{sid}"


def _storage(buf) -> str:
    text = "block"
    if buf.window is not None:
        text = f"window dim={buf.window.dim} size={buf.window.size}"
    if buf.inner is not None:
        text += f", inner dim={buf.inner.dim} size={buf.inner.size}"
        if buf.inner_outputs is not None:
            text += f" of outputs {','.join(str(k) for k in buf.inner_outputs)}"
    if buf.donor is not None:
        text += f", donated by {buf.donor}"
    if buf.home is not None:
        at = ", ".join(px.text(e) for e in buf.home.at)
        text += f", in the memory of {buf.home.buffer} at [{at}]"
    return text


HEAD = "plan format "  # how the text form starts (``timerlc inspect`` knows it by this)


def render(plan: Plan) -> str:
    out = [f"{HEAD}{FORMAT_VERSION}  source {plan.source or '-'}"]
    out.append("dims: " + ", ".join(f"{d} < {n}" for d, n in plan.dims))
    line = f"memory: peak {format_bytes(plan.memory_peak)} of buffers"
    if plan.memory_budget is not None:
        met = "met" if plan.memory_budget_met else "NOT met"
        line += f", budget {format_bytes(plan.memory_budget)} ({met}; without swaps "
        line += f"{format_bytes(plan.memory_peak_unswapped)})"
    out.append(line)
    for e in plan.envs:
        out.append(f"env {e.name} = {e.spec!r} batch {e.batch} ({e.num_envs})")
    out.append("")
    out.append("buffers:")
    for b in plan.buffers:
        types = ", ".join(f"{o.dtype}{list(o.shape)}" for o in b.outputs)
        exts = dict.fromkeys(
            "x".join(str(x) for x in b.extents(k)) or "scalar" for k in range(len(b.outputs))
        )
        ext = " | ".join(exts)
        dims = ",".join(b.dims)
        out.append(f"  {b.id:>5} {_name(plan, b.id):24s} [{dims}] {ext} of {types}: {_storage(b)}")
    out.append("")
    out.append("statements:")
    for s in plan.statements:
        ops = " ".join(n.op for n in s.nodes)
        out.append(
            f"  {s.id:>5} {_name(plan, s.id):24s} loops [{', '.join(s.loops)}] "
            f"vector [{', '.join(s.vector)}]: {ops}"
        )
    out.append("")
    out.append("loop tree:")
    _tree(plan, plan.tree, 1, out)
    for kind, rows in (("outputs", plan.outputs), ("metrics", plan.metrics)):
        if rows:
            out.append(f"{kind}: " + ", ".join(name for name, _, _ in rows))
    return "\n".join(out) + "\n"


def _tree(plan: Plan, items, depth: int, out: list):
    pad = "  " * depth
    for it in items:
        if isinstance(it, Loop):
            out.append(
                f"{pad}for {it.var} = {expr(it.init)}; {expr(it.cond)}; {it.var} += {it.inc}:"
            )
            _tree(plan, it.body, depth + 1, out)
        elif isinstance(it, If):
            out.append(f"{pad}if {expr(it.cond)}:")
            _tree(plan, it.then, depth + 1, out)
            if it.orelse:
                out.append(f"{pad}else:")
                _tree(plan, it.orelse, depth + 1, out)
        elif isinstance(it, Call):
            args = ", ".join(expr(a) for a in it.args)
            out.append(f"{pad}{_name(plan, it.statement)}[{args}]")
        elif isinstance(it, Free):
            out.append(f"{pad}free " + ", ".join(_name(plan, s) for s in it.buffers))
        else:
            kind = "swap_out" if isinstance(it, SwapOut) else "swap_in"
            where = "to host" if kind == "swap_out" else "from host"
            out.append(f"{pad}{kind} {where} " + ", ".join(_name(plan, s) for s in it.buffers))
