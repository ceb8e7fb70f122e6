"""Row loops: a loop of the tree whose rows never meet, run a chunk of rows at a time on the
threads (the cpu target).

A rollout's loop over its steps calls, at every step, a few kernels over the environments
``b``: the observation, the policy's layers, the draw, the environment's step. Each is a
parallel loop over the 256 rows of a step, and the threads meet after each (a fork and a
join a kernel): some 20 us of calls a step at 256 environments on two threads, where the
work itself is some 18 us on one. But where
every call of the body is over the same rows and a row reads, of what the loop writes,
only what was written at the same row (``cuda.loops.prove``: the proof of the CUDA loop
kernels, on the cpu target's kernels), the rows never meet inside the loop: a thread can
run the whole loop for a chunk of rows on its own. ``row_loops`` finds such loops; each
runs as a ``kir.Rows``: the threads take chunks of its rows, and each chunk runs the loop
with each call's kernel restricted to the chunk's rows (``variant``: two more arguments,
the chunk's first row and its end; its products by the BLAS on one thread, its loops on
the chunk's thread).

What a failure leaves must be what the loop on one thread leaves (the runtime then
computes the failing call again to name the failing point). So a row loop's calls may fail
only where every chunk fails alike: a check on one thread that reads nothing the loop
writes (an environment's "reset before step"), a call outside its box, the loop's budget
of steps. A check at a row (an action's range) must have been proven to hold
(``codegen.checks``), else the loop runs as before. A profile counts the whole loop at its
first statement (``kernels.row_loops`` names its statements).
"""

from __future__ import annotations

import dataclasses

from timerlc.codegen import kir
from timerlc.codegen.kir import Bin, Const, Fail, For, Gemm, If, Ref
from timerlc.codegen.lower import Unsupported

LO, HI = "tl_lo", "tl_hi"  # a row variant's last two arguments: the chunk's rows
GEMM_WORK = 4  # multiply-adds of a product that count as one store (``_row_work``)
CHUNK_SCRATCH = 1 << 20  # the most bytes of a chunk's own scratch memory (its stack)
# the fewest rows a chunk takes: each chunk makes every call of the loop's body, a few
# hundred nanoseconds each (more for a product by the BLAS), whatever its rows; REINFORCE
# 16 x 128 in chunks of 4 rows took 0.299 ms an iteration, on one thread 0.274 (one chunk
# of 16: 0.280), 64 x 128 0.767 in chunks of 32 against 0.869
ROWS_MIN = 32


@dataclasses.dataclass(frozen=True)
class RowLoop:
    """A loop of the tree that runs by chunks of rows: its rows ``lo ..< hi``, the fewest a
    chunk takes (``grain``), each statement's row variant, and a chunk's scratch bytes."""

    lo: int
    hi: int
    grain: int
    variants: dict  # statement -> kir.Kernel
    scratch: int


def loop_key(scope: tuple[str, ...], loop) -> str:
    """The name of ``loop`` (a plan loop inside the loops ``scope``): what it computes."""
    from timerlc.cuda.loops import function_name

    return function_name(scope, loop)


def row_loops(plan, kernels: dict[int, kir.Kernel], recorded: set[int]) -> dict[str, RowLoop]:
    """The loops of ``plan``'s tree that run by chunks of rows, by ``loop_key``
    (``kernels``: by statement, the kernels there are)."""
    from timerlc.cuda.loops import loops_of_tree
    from timerlc.cuda.render import Unsupported as NotRows

    out: dict[str, RowLoop] = {}
    for around, loop in loops_of_tree(plan.tree):
        if not around:
            continue  # (the runtime steps a loop at the top of the tree)
        key = loop_key(tuple(x.var for x in around), loop)
        if key in out:
            continue
        try:
            got = _row_loop(plan, around, loop, kernels, recorded)
        except (Unsupported, NotRows):
            continue
        if got is not None:
            out[key] = got
    return out


def _row_loop(plan, around, loop, kernels, recorded) -> RowLoop | None:
    from timerlc.cuda.loops import _loop_range, prove
    from timerlc.llvm.render import PAR_CHUNK, PAR_WORK

    calls, facts, _ = prove(plan, around, loop, kernels, recorded)
    lo, hi = facts.rows
    variants = {sid: variant(kernels[sid], (lo, hi)) for sid in dict.fromkeys(calls)}
    scratch = max((k.scratch_bytes for k in variants.values()), default=0)
    if scratch > CHUNK_SCRATCH:
        return None
    span = _loop_range(loop)
    steps = 1 if span is None else (span[1] - span[0]) // abs(loop.inc) + 1
    per_row = steps * sum(_row_work(kernels[sid]) for sid in calls)
    if per_row * (hi - lo) < PAR_WORK:
        return None  # (too little work for the threads: the loop as before)
    grain = max(ROWS_MIN, -(-PAR_CHUNK // max(1, per_row)))
    if hi - lo < 2 * grain:
        return None  # (one chunk: the loop on one thread, as before)
    return RowLoop(lo, hi, grain, variants, scratch)


def _row_work(k: kir.Kernel) -> int:
    """The stores and lets a call of ``k`` makes at a row (a product's multiply-adds
    ``GEMM_WORK`` to one)."""
    from timerlc.llvm.render import _work

    n = 0
    for s in _steps(k.body):
        if isinstance(s, For):
            w = _work(s.body)
            n += 64 if w is None else w  # (a loop over ranges not constant: some work)
        elif isinstance(s, Gemm):
            n += s.n * s.k // GEMM_WORK
    return n


def _steps(body):
    """The row loops and products of a kernel's body (inside ``if``s on its arguments)."""
    for s in body:
        if isinstance(s, For) and s.parallel or isinstance(s, Gemm):
            yield s
        elif isinstance(s, If):
            yield from _steps(s.then)
            yield from _steps(s.orelse)


def variant(k: kir.Kernel, rows: tuple[int, int]) -> kir.Kernel:
    """Kernel ``k`` over the rows ``tl_lo ..< tl_hi`` of ``rows`` (two more arguments): its
    loops over the rows, and its products' rows, narrowed to them; the rest as it is (a
    check on one thread: ``prove`` found that it writes nothing). It runs inside a chunk
    (``Kernel.alone``). Raises ``Unsupported`` where a row may fail (a ``Fail`` inside a
    loop over the rows: ``codegen.checks`` did not take it out)."""
    params = set(k.params)

    def restrict(body) -> tuple:
        out = []
        for s in body:
            if isinstance(s, For) and s.parallel:
                if (s.lo, s.hi) != (kir.i64(rows[0]), kir.i64(rows[1])):
                    raise Unsupported(f"statement {k.sid}: a loop over other rows")
                if any(isinstance(x, Fail) for x in kir.walk_tree(s.body)):
                    raise Unsupported(f"statement {k.sid}: a row may fail")
                s = dataclasses.replace(s, lo=Ref(LO), hi=Ref(HI))
            elif isinstance(s, Gemm):
                if s.m != rows[1] - rows[0]:
                    raise Unsupported(f"statement {k.sid}: a product of other rows")
                first = Bin("sub", Ref(LO), kir.i64(rows[0]), "i64") if rows[0] else Ref(LO)
                s = dataclasses.replace(
                    s,
                    m=Bin("sub", Ref(HI), Ref(LO), "i64"),
                    aoff=_plus(s.aoff, first, 1 if s.ta else s.lda),
                    coff=_plus(s.coff, first, s.ldc),
                )
            elif isinstance(s, If):
                if _names(s.cond) - params:
                    if any(_writes_rows(x) for x in kir.walk_tree(s.then + s.orelse)):
                        raise Unsupported(f"statement {k.sid}: rows under a condition")
                else:
                    s = dataclasses.replace(s, then=restrict(s.then), orelse=restrict(s.orelse))
            elif any(_writes_rows(x) for x in kir.walk_tree((s,))):
                raise Unsupported(f"statement {k.sid}: rows inside a loop of one thread")
            out.append(s)
        return tuple(out)

    return dataclasses.replace(
        k, name=f"{k.name}_rows", params=k.params + (LO, HI), body=restrict(k.body), alone=True
    )


def _writes_rows(s) -> bool:
    return isinstance(s, Gemm) or isinstance(s, For) and s.parallel


def _names(e) -> set[str]:
    return {x.name for x in kir.subexprs(e) if isinstance(x, Ref)}


def _plus(off, first, scale: int):
    step = first if scale == 1 else Bin("mul", first, kir.i64(scale), "i64")
    if isinstance(off, Const) and off.value == 0:
        return step
    return Bin("add", off, step, "i64")
