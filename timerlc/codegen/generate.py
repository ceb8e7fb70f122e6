"""The code generator's entry point: a plan's kernels, as one LLVM module (the cpu backend)
or one CUDA C module (the cuda backend).

Every statement the lowering supports (``codegen.lower``) becomes a kernel; the module's
text starts with the digest of the plan it was made for, and the plan gets a ``kernels``
field (``plan.items.Kernels``) with the text's SHA-256, so that a runtime refuses a kernel
file that does not belong to its plan (``runtime.native.check_kernels``). The LLVM module
also has the tree functions (``codegen.tree``) and the fused kernels they launch; the CUDA
module has the statements' kernels, the fused kernels and the loop kernels, which the device
runtime launches itself (``docs/cuda.md``), the kernels of the statements that only fused
kernels compute (``Kernels.covered``) under ``#ifndef TL_FUSED_ONLY``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from timerlc.codegen import checks, grams, kir, rows
from timerlc.codegen.lower import Unsupported, lower_statement
from timerlc.codegen.tree import by_level, lower_tree
from timerlc.llvm.render import render_module
from timerlc.plan import expr as px
from timerlc.plan.items import (
    CUDA_KERNELS_HEADER,
    KERNELS_HEADER,
    At,
    ChainCall,
    GemmCall,
    Kernels,
    Plan,
    SwapIn,
    SwapOut,
    digest,
    walk,
)

KERNEL_FILE = "kernels/cpu.ll"
CUDA_KERNEL_FILE = "kernels/cuda.cu"
TARGETS = ("cpu", "cuda")
LISTING_HEAD = "kernel IR: "  # how a listing (NN-kernels.txt) starts


@dataclass(frozen=True)
class Generated:
    plan: Plan  # with its ``kernels`` field
    text: str  # the LLVM IR of every kernel
    kernels: tuple[kir.Kernel, ...]  # one per statement that has one
    trees: tuple[kir.Tree, ...]
    interpreted: dict[int, str]  # statement -> why it has no kernel
    fused: tuple[kir.Kernel, ...] = ()  # the fused kernels the trees launch (codegen.fuse)
    rows: tuple[kir.Kernel, ...] = ()  # the row variants the row loops' chunks launch


def generate(plan: Plan, target: str = "cpu") -> Generated:
    """The kernels of ``plan`` for ``target`` (``TARGETS``)."""
    if target not in TARGETS:
        raise ValueError(f"no code generator for target {target!r}")
    slot_of = plan.slots()
    kernels, interpreted = [], {}
    for st in plan.statements:
        try:
            kernels.append(lower_statement(plan, st, slot_of, blocks=target == "cpu"))
        except Unsupported as e:
            interpreted[st.id] = str(e)
    # (the checks the stores' ranges decide: gone before fusion, each statement's kernel
    # as it is launched alone too)
    kernels = checks.prove(plan, kernels)
    if target == "cuda":
        return _generate_cuda(plan, kernels, interpreted)
    fused: dict[tuple, kir.Kernel] = {}
    by_sid = {k.sid: k for k in kernels}
    recorded = {sid for _, sid, _ in plan.outputs + plan.metrics}
    by_rows = rows.row_loops(plan, by_sid, recorded)
    trees = lower_tree(plan, by_sid, fused, rows=by_rows)
    variants = {k.name: k for r in by_rows.values() for k in r.variants.values()}
    # a statement's rows with the small grams and the sums that read them (codegen.grams)
    named = {k.name: k for k in kernels} | {k.name: k for k in fused.values()} | variants
    trees, chains = grams.gram_chains(plan, trees, named)
    # the fused kernels the trees launch (a run's prefixes were fused on the way, the gram
    # chains after), and the row variants of the row loops' chunks
    used = {s.kernel for t in trees for s in kir.walk_tree(t.body) if isinstance(s, kir.Launch)}
    fused_used = [k for k in [*fused.values(), *chains] if k.name in used]
    rows_used = [k for name, k in variants.items() if name in used]
    module = render_module(kernels + fused_used + rows_used, trees)
    text = KERNELS_HEADER + digest(plan) + "\n" + module
    info = Kernels(
        KERNEL_FILE,
        hashlib.sha256(text.encode()).hexdigest(),
        tuple((k.sid, k.name, k.scratch_bytes) for k in kernels),
        tuple((t.item, t.name, t.scratch_bytes) for t in trees),
        tuple(k.parts for k in fused_used),
        row_loops=tuple(
            dict.fromkeys(
                s.sids for t in trees for s in kir.walk_tree(t.body) if isinstance(s, kir.Rows)
            )
        ),
    )
    return Generated(
        dataclasses.replace(plan, kernels=info),
        text,
        tuple(kernels),
        tuple(trees),
        interpreted,
        tuple(fused_used),
        tuple(rows_used),
    )


def _generate_cuda(plan: Plan, kernels: list, interpreted: dict) -> Generated:
    from timerlc.cuda.loops import render_loops
    from timerlc.cuda.nvrtc import FUSED_ONLY
    from timerlc.cuda.render import (
        SHIFT_KERNEL,
        chain_saved,
        functions,
        head,
        kernel_key,
        leave_out,
        render_kernels,
    )

    texts, skipped, launches = render_kernels(kernels)
    for k in kernels:
        if k.name in skipped:
            interpreted[k.sid] = f"no CUDA C for its kernel yet: {skipped[k.name]}"
    kernels = [k for k in kernels if k.name not in skipped]
    # calls one after another at the same loop values as one kernel, as the cpu's trees
    # fuse them (codegen.fuse): not a kernel that runs block after block, nor an output's
    # or a metric's (the runtime records those after their calls)
    recorded = {sid for _, sid, _ in plan.outputs} | {sid for _, sid, _ in plan.metrics}
    eligible = {k.sid: k for k in kernels if k.repeat == 1 and k.sid not in recorded}
    # (the calls inside its loops in the order that joins the most: codegen.tree.by_level)
    # (each fused kernel's functions counted once: the orders by level and the lowering
    # after them fuse the same runs of statements into the same kernels, under other names)
    counted: dict = {}

    def cost(k: kir.Kernel) -> int:
        key = kernel_key(k)
        got = counted.get(key)
        if got is None:
            got = counted[key] = functions(k)
        return got

    plan = by_level(plan, eligible, recorded, cost)
    fused: dict[tuple, kir.Kernel] = {}
    trees = lower_tree(plan, eligible, fused, horizontal=True, cost=cost, chains=chain_saved)
    used = {s.kernel for t in trees for s in kir.walk_tree(t.body) if isinstance(s, kir.Launch)}
    mine = [k for k in fused.values() if k.name in used]
    fails = {k.sid for k in kernels if launches[k.name].fails}
    more, refused, fused_launches = render_kernels(
        mine, confined=_confined(plan, mine, recorded, fails)
    )
    fused_ok = [k for k in mine if k.name not in refused]
    # the statements whose every call the trees make through a fused kernel: only a profile
    # launches their own kernels (a run that is not profiled compiles the module without
    # them: render.FUSED_ONLY)
    apart = {sid for k in mine if k.name in refused for sid in k.parts}
    in_fused = {sid for k in fused_ok for sid in k.parts} - apart
    covered = {k.sid for k in kernels if k.sid in in_fused and k.name not in used}
    texts = [leave_out(t, FUSED_ONLY) if k.sid in covered else t for k, t in zip(kernels, texts)]
    # loops whose rows never meet, each one kernel (cuda/loops.py)
    rendered = {k.sid: k for k in kernels}
    loops, _ = render_loops(plan, rendered, launches, recorded)
    body = "\n".join([head(), SHIFT_KERNEL, *texts, *more, *(lk.text for lk in loops)])
    text = CUDA_KERNELS_HEADER + digest(plan) + "\n" + body
    info = Kernels(
        CUDA_KERNEL_FILE,
        hashlib.sha256(text.encode()).hexdigest(),
        tuple((k.sid, k.name, launches[k.name].scratch) for k in kernels),
        launches=tuple((k.sid, launches[k.name].phases) for k in kernels),
        unfailing=tuple(k.sid for k in kernels if not launches[k.name].fails),
        repeats=tuple(
            (k.sid, launches[k.name].repeat) for k in kernels if launches[k.name].repeat > 1
        ),
        fused=tuple(k.parts for k in fused_ok),
        fused_launches=tuple(
            (fused_launches[k.name].scratch, fused_launches[k.name].phases) for k in fused_ok
        ),
        loops=tuple((lk.statements, lk.blocks, lk.scratch) for lk in loops),
        covered=tuple(sorted(covered)),
    )
    return Generated(
        dataclasses.replace(plan, kernels=info),
        text,
        tuple(kernels),
        (),
        interpreted,
        tuple(fused_ok),
    )


def _confined(plan: Plan, fused: list, recorded: set, fails: set) -> dict[str, frozenset]:
    """Per fused kernel, the slots whose buffers nothing but its statements touches (no
    other statement reads them, nor the run: no output, metric or swap, no donor's memory),
    each call of the kernel writing them afresh (a window of one slot along one of its
    loop dims: a call reads only what it wrote), none of those statements able to fail (a
    failure's statement is computed again from its inputs: ``runtime``): the buffers its
    chains may keep a tile at a time (``cuda.render._chain_remap``)."""
    # (a statement's buffer -> the statements touching it: its own and its readers)
    touched = {s.id: {s.id} for s in plan.statements}
    readers = plan.readers()
    for b, reads in readers.items():
        touched.setdefault(b, set()).update(sid for sid, _ in reads)
    kept = set(recorded)
    for it in walk(plan.tree):
        if isinstance(it, (SwapIn, SwapOut)):
            kept.update(it.buffers)
    for b in plan.buffers:
        if b.donor is not None:
            kept.update((b.id, b.donor))
        if b.home is not None:  # (their values live from one call to the next)
            kept.update((b.id, b.home.buffer))
    out = {}
    for k in fused:
        parts = set(k.parts)
        names = []
        for slot in k.slots:
            sid = slot.sid
            if slot.state or sid not in parts or sid in kept:
                continue
            buf = plan.buffer(sid)
            window = buf.window
            if window is None or window.size != 1 or window.dim not in k.params:
                continue
            if buf.inner is not None:  # (its slots along another dim outlive the call)
                continue
            k_dim = buf.dims.index(window.dim)
            if any(
                not isinstance(r.access[k_dim], At) or r.access[k_dim].index != window.dim
                for _, r in readers.get(sid, ())
            ):
                continue  # (read at another index of its dim: a slot an earlier call wrote)
            if touched[sid] <= parts and not touched[sid] & fails:
                names.append(slot.name)
        out[k.name] = frozenset(names)
    return out


def listing(gen: Generated) -> str:
    """The kernel IR of every kernel, and why the other statements have none
    (``--dump-ir``: ``NN-kernels.txt``)."""
    head = (
        f"{LISTING_HEAD}{len(gen.kernels)} kernels, {len(gen.fused)} fused kernels, "
        + (f"{len(gen.rows)} row variants, " if gen.rows else "")
        + f"{len(gen.trees)} tree functions, {len(gen.interpreted)} statements interpreted"
    )
    launches = dict(gen.plan.kernels.launches) if gen.plan.kernels else {}
    covered = set(gen.plan.kernels.covered) if gen.plan.kernels else set()
    parts = [head] + [
        _with_launches(kir.text(k), launches.get(k.sid))
        + ("\n  (only under --profile: fused kernels make its calls)" if k.sid in covered else "")
        for k in gen.kernels
    ]
    fused = {}  # (a fused kernel's phases, by its statements: plan.kernels.fused's order)
    if gen.plan.kernels and gen.plan.kernels.fused_launches:
        rows = zip(gen.plan.kernels.fused, gen.plan.kernels.fused_launches)
        fused = {sids: phases for sids, (_, phases) in rows}
    parts += [_with_launches(kir.text(k), fused.get(k.parts)) for k in gen.fused]
    parts += [kir.text(k) for k in gen.rows]
    parts += [kir.tree_text(t) for t in gen.trees]
    if gen.interpreted:
        rows = [f"  statement {sid}: {why}" for sid, why in sorted(gen.interpreted.items())]
        parts.append("interpreted (no kernel yet):\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def _with_launches(text: str, phases) -> str:
    """A kernel's listing and, for the cuda target, the functions a call launches."""
    if not phases:
        return text

    def step(f) -> str:
        if isinstance(f, ChainCall):
            fns = " then ".join(f"{x} ({n} threads)" for x, n in f.functions)
            if f.tf32:
                fns = f"{fns[:-1]}; TF32: {' then '.join(x for x, _ in f.tf32)})"
            after = "the launch" if f.covers == 1 else f"the {f.covers} launches"
            return f"chain {fns} or {after} after it"
        if isinstance(f, GemmCall):
            when = "" if f.when is True else f" where {px.text(f.when)}"
            ours = f" or ours ({' then '.join(x for x, _ in f.own)})" if f.own else ""
            if f.tf32:
                ours = f"{ours[:-1]}; TF32: {' then '.join(x for x, _ in f.tf32)})"
            if f.joint:
                joint = " then ".join(x for x, _ in f.joint)
                ours = f"{ours[:-1]}; TF32 with the next product: {joint})"
            after = f" then {' then '.join(x for x, _ in f.then)}" if f.then else ""
            return f"BLAS gemm.{f.dtype} {f.m}x{f.k}x{f.n}{when}{after}{ours}"
        return f"{f[0]} ({f[1]} thread{'s' if f[1] != 1 else ''})"

    return f"{text}\n  launched as: {', '.join(step(f) for f in phases)}"
