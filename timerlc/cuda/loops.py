"""Loop kernels: a loop of the plan's tree run as one CUDA kernel, each block its own rows.

A loop whose body only launches (the rollout's steps: the observation, the policy, the
draw, the environment's step) makes as many launches as its statements have steps, at
every iteration: PPO's rollout at 2048 x 128 some 1,400 launches and products a rollout,
a chain the GPU runs one after another. But where every statement of the body is over the
same vector dim (the environments ``b``) and a point at ``b`` reads, of what the loop
writes, only what was written at the same ``b``, the environments never meet inside the
loop: a block of threads can run the whole loop for a few environments (its *rows*) on its
own, its threads meeting at ``__syncthreads`` between two steps, with no other block to
wait for. The loop is then one launch (``render_loop``):

- each block takes rows ``tl_rb ..< tl_re`` of the row dim (as many as make a block's
  threads busy in the widest step: ``THREADS`` over its points a row), then the next
  ``gridDim.x`` blocks' worth; for each it runs the loop, and at every iteration each call of the body: its loop
  values computed from the loop's variable and the values of the loops around (passed by
  value, as a launch's), checked against the statement's box (else the failure code
  ``LOOP_BOX``: the runtime says which call left its box), then the statement's steps, a
  parallel loop over the block's rows' points, a product computed element by element (its
  rows the block's: no cuBLAS), a run of checks on one thread;
- every temporary of every statement has scratch memory of its own (``layout``): blocks
  run different statements at once; a row's element loop that only stores is spread over
  the block's threads (``shapes._spread``);
- a failure sets the block's code, which it records (``tl_failed``) and stops; every block
  stops at the iteration after its next once the record is set (thread 0 reads the record
  during an iteration, the block looks at the read at the top of the next: the read's wait
  is behind the iteration's work).

``_RowKernel.analyze`` notes each call's accesses and ``_Facts.check`` proves the rows
independent on the kernel IR, or the loop is launched as before: every buffer the loop
writes is written and read only at byte offsets ``C * row + f`` with one ``C != 0`` for all
of them, and no two rows' elements meet (``_rows_apart``: ``f``'s spread over the ranges of
the other loops' variables, the loop's own variable taking any of its values on either
side, narrowed by the conditions around the access; or, the terms that are multiples of a
larger stride taken apart, only at the same step). The other buffers (the parameters) are
read only. A product's operand that the loop writes is row-major with the row dim.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    For,
    Gemm,
    If,
    Let,
    Load,
    Ref,
    Sel,
    Store,
)
from timerlc.codegen.lower import interval as _interval
from timerlc.codegen.lower import plan_expr
from timerlc.cuda import cexpr, render
from timerlc.cuda.cexpr import Unsupported
from timerlc.cuda.facts import _buffers, _lets, _nest, _refs, _written
from timerlc.cuda.render import THREADS
from timerlc.plan import arena
from timerlc.plan import expr as px
from timerlc.plan.items import Call, Plan, _item_json
from timerlc.plan.items import If as PlanIf
from timerlc.plan.items import Loop as PlanLoop

LOOP_BOX = 1 << 20  # the failure code of a call outside its statement's box
ALIGN = 256  # of each statement's scratch in a loop kernel's
MAX_ITERATIONS = 1 << 20  # the most a loop's range is computed over
# the bytes of shared memory a loop kernel keeps its products' weights in (``_LoopText.
# stage``: B operands the loop never writes, copied once a block; the rest of the 48 KB a
# block may hold statically is the steps' own: a reduction's tree, a product's tiles)
STAGE_BYTES = 20 * 1024
# the bytes of shared memory a loop kernel keeps its statements' temporaries in, a block's
# rows of each (``_shared_temps``; the rest are the device's scratch memory)
TEMP_BYTES = 8 * 1024


@dataclass(frozen=True)
class LoopKernel:
    """A loop of the tree as one kernel: its function, the statements its body calls (in
    order, ``body_calls``), the blocks it asks for and its scratch bytes."""

    name: str
    statements: tuple[int, ...]
    blocks: int
    scratch: int
    text: str


def function_name(scope: tuple[str, ...], loop: PlanLoop) -> str:
    """The function of ``loop`` inside the loops ``scope``: named after what it computes,
    so that a plan cannot send one loop's kernel to another."""
    text = json.dumps([list(scope), _item_json(loop)], sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    return "tl_loop_" + digest[:16]


def body_calls(loop: PlanLoop) -> tuple[int, ...] | None:
    """The statements the body of ``loop`` calls, in order (an ``if``'s branches one after
    the other), or None where it holds anything else (a loop, a free, a swap)."""
    out: list[int] = []

    def walk(items) -> bool:
        for it in items:
            if isinstance(it, Call):
                out.append(it.statement)
            elif isinstance(it, PlanIf):
                if not (walk(it.then) and walk(it.orelse)):
                    return False
            else:
                return False
        return True

    return tuple(out) if walk(loop.body) and out else None


def layout(statements, scratch_of) -> tuple[dict[int, int], int]:
    """Each statement's scratch memory in a loop kernel's (by first call), and its bytes."""
    base, total = {}, 0
    for sid in statements:
        if sid not in base:
            base[sid] = total
            total += (scratch_of[sid] + ALIGN - 1) // ALIGN * ALIGN
    return base, max(total, 8)


def loops_of_tree(tree, around=()):
    """``(around, loop)`` for every loop of the tree (``around``: the loops around it)."""
    for it in tree:
        if isinstance(it, PlanLoop):
            yield around, it
            yield from loops_of_tree(it.body, around + (it,))
        elif isinstance(it, PlanIf):
            yield from loops_of_tree(it.then, around)
            yield from loops_of_tree(it.orelse, around)


def render_loops(plan: Plan, kernels: dict, launches: dict, recorded: set):
    """The loop kernels of ``plan``'s tree (``kernels``: by statement, the kernel IR of those
    rendered; ``launches``: by kernel name, ``render.Launches``; ``recorded``: statements
    the runtime records after each call): ``(kernels, refused)``, ``refused`` saying by
    function why a loop runs as launches."""
    out: dict[str, LoopKernel] = {}
    refused: dict[str, str] = {}
    for around, loop in loops_of_tree(plan.tree):
        fname = function_name(tuple(x.var for x in around), loop)
        if fname in out or fname in refused:
            continue
        try:
            out[fname] = render_loop(plan, around, loop, kernels, launches, recorded, fname)
        except Unsupported as e:
            refused[fname] = str(e)
    return list(out.values()), refused


def render_loop(plan, around, loop, kernels, launches, recorded, fname) -> LoopKernel:
    calls, facts, rowk = prove(plan, around, loop, kernels, recorded)
    scope = tuple(x.var for x in around)
    rows = facts.rows[1] - facts.rows[0]
    per_block = max(1, THREADS // max(1, facts.widest))
    _shared_temps(facts, rowk, per_block)
    blocks = max(1, min(-(-rows // per_block), 1 << 20))
    text = _LoopText(plan, scope, loop, rowk, fname, per_block, rows).render()
    # (its text naming the scratch memory only in its signature, each temporary in a
    # block's shared memory or a thread's own: the kernel takes none, and a graph's
    # launches that do need not wait for it, nor it for them: the rollout beside the next
    # epoch's permutation)
    scratch = facts.scratch
    if text.count("scratch") == 1:
        scratch = 0
    return LoopKernel(fname, calls, blocks, scratch, text)


def prove(plan, around, loop, kernels, recorded) -> tuple[tuple[int, ...], _Facts, dict]:
    """The proof that the calls of ``loop``'s body (inside the loops ``around``) never meet
    across rows (``_Facts.check``): the statements the body calls, the facts (the rows:
    ``facts.rows``; ``facts.scratch``, the bytes of every temporary its own), and each
    statement's ``_RowKernel``; raises ``Unsupported`` where it cannot be made. The cpu
    target's row loops (``codegen.rows``) rest on it too."""
    scope = tuple(x.var for x in around)
    calls = body_calls(loop)
    if calls is None:
        raise Unsupported("its body holds more than calls")
    if not scope:
        # the arena gives values that live within an iteration of a top-level loop bytes
        # they share with others (plan/arena.py): blocks at different iterations would meet
        used = set(calls)
        for sid in calls:
            used |= {r.src for n in plan.statement(sid).nodes for r in n.inputs if r.stored}
        if used & set(arena.iteration_local(plan)):
            raise Unsupported("a loop at the top of the tree with values local to an iteration")
    for sid in calls:
        k = kernels.get(sid)
        if k is None:
            raise Unsupported(f"statement {sid} has no CUDA kernel")
        if sid in recorded:
            raise Unsupported(f"statement {sid} is an output or a metric")
        if k.repeat != 1 or k.shared:
            raise Unsupported(f"statement {sid} runs block after block or takes a donor's memory")
        if len(k.params) > render.ARGS:
            raise Unsupported(f"statement {sid} takes too many loop values")
    if len(scope) > render.ARGS:
        raise Unsupported("too many loops around it")
    # every temporary its own bytes (a statement's kernel packs those whose uses do not
    # overlap: in a loop kernel, blocks run different steps at once)
    unpacked = {}
    for sid in calls:
        k, at = kernels[sid], 0
        temps = []
        for t in k.temps:
            temps.append(dataclasses.replace(t, offset=at))
            at += (t.size * kir.SIZES[t.dtype] + 7) // 8 * 8
        unpacked[sid] = tuple(temps)
    scratch_of = {
        sid: sum(t.size * kir.SIZES[t.dtype] + 8 for t in unpacked[sid]) for sid in calls
    }
    base, scratch = layout(calls, scratch_of)
    span = _loop_range(loop)
    outer = {x.var: r for x in around if (r := _loop_range(x)) is not None}
    facts = _Facts(loop.var, scope, span, outer)
    rowk: dict[int, _RowKernel] = {}
    for sid in dict.fromkeys(calls):
        k = kernels[sid]
        temps = tuple(dataclasses.replace(t, offset=t.offset + base[sid]) for t in unpacked[sid])
        rowk[sid] = _RowKernel(dataclasses.replace(k, temps=temps), facts)
    # every call's accesses, its kernel's parameters bound to the call's loop values
    probe = next(iter(rowk.values()))
    env = {v: {"O:" + repr(Ref(v)): 1} for v in scope} | {loop.var: {"L": 1}}
    for v in scope:
        facts.arg_form(Ref(v))  # (their ranges)

    def walk(items, ranges):
        for it in items:
            if isinstance(it, Call):
                rowk[it.statement].analyze(it.args, ranges)
            else:
                cond = plan_expr(it.cond)
                walk(it.then, probe._narrow(cond, True, env, ranges))
                walk(it.orelse, probe._narrow(cond, False, env, ranges))

    walk(loop.body, facts.outer_ranges | ({"L": span} if span is not None else {}))
    facts.check()
    facts.scratch = scratch
    return calls, facts, rowk


def _calls(items):
    for it in items:
        if isinstance(it, Call):
            yield it
        elif isinstance(it, PlanIf):
            yield from _calls(it.then)
            yield from _calls(it.orelse)


def _loop_range(loop: PlanLoop) -> tuple[int, int] | None:
    """The least and the greatest value of the loop's variable, where its start is a
    constant and its condition names only the variable (else None)."""
    if not isinstance(loop.init, int) or isinstance(loop.init, bool):
        return None
    if px.names(loop.cond) - {loop.var} or loop.inc == 0:
        return None
    cond = px.compile_expr(loop.cond, (loop.var,))
    v, lo, hi, n = loop.init, None, None, 0
    while cond(v):
        lo = v if lo is None else min(lo, v)
        hi = v if hi is None else max(hi, v)
        v += loop.inc
        n += 1
        if n > MAX_ITERATIONS:
            return None
    return None if lo is None else (lo, hi)


# ---------------------------------------------------------------------- the rows' proof
# An affine form is a dict: symbol -> coefficient, "" -> the constant. Symbols: "R" the row,
# "L" the loop's variable, "O:..." a value of the loops around (the same for every access
# of a launch), any other a loop variable of a kernel (its range in the access's ranges).


def _add(a: dict, b: dict, k: int = 1) -> dict:
    out = dict(a)
    for s, c in b.items():
        out[s] = out.get(s, 0) + k * c
        if out[s] == 0 and s:
            del out[s]
    return out


def _scale(a: dict, k: int) -> dict:
    return {s: c * k for s, c in a.items() if c * k or not s}


def _bounds(a: dict, ranges: dict) -> tuple[int, int] | None:
    lo = hi = a.get("", 0)
    for s, c in a.items():
        if not s:
            continue
        r = ranges.get(s)
        if r is None:
            return None
        lo += min(c * r[0], c * r[1])
        hi += max(c * r[0], c * r[1])
    return lo, hi


@dataclass
class _Access:
    key: tuple
    form: dict  # the byte offset, affine
    width: int
    write: bool
    ranges: dict
    where: str


class _Facts:
    """What the loop's calls do to memory, and the proof that rows do not meet."""

    def __init__(self, var: str, scope: tuple[str, ...], span, outer: dict):
        self.var, self.scope, self.span = var, scope, span
        self.outer = outer  # the loops around: variable -> (least, greatest) where known
        self.outer_ranges: dict[str, tuple[int, int]] = {}  # "O:..." -> its range
        self.accesses: list[_Access] = []
        self.rows: tuple[int, int] | None = None
        self.widest = 1
        self.fresh = 0
        self.decided: dict = {}  # (a condition, its forms' ranges) -> _decide's answer
        self.names: dict = {}  # a condition -> the locals and loop variables it reads
        self.scratch = 0  # the bytes of the calls' temporaries, each its own (``prove``)

    def row_range(self, lo, hi, where: str):
        if not (isinstance(lo, Const) and isinstance(hi, Const)):
            raise Unsupported(f"{where}: its parallel loop's bounds are not constants")
        r = (int(lo.value), int(hi.value))
        if self.rows is None:
            self.rows = r
        elif self.rows != r:
            raise Unsupported(f"{where}: its rows {r} are not the loop's {self.rows}")

    def arg_form(self, e) -> dict | None:
        """A call's loop value (a kernel expression over the loops' variables) as a form."""
        names = {x.name for x in kir.subexprs(e) if isinstance(x, Ref)}
        if isinstance(e, Const):
            return {"": int(e.value)}
        if self.var not in names:
            sym = "O:" + repr(e)
            got = _interval(e, self.outer)
            if got is not None:
                self.outer_ranges[sym] = got
            return {sym: 1}
        if isinstance(e, Ref):
            return {"L": 1}
        if isinstance(e, Const):
            return {"": int(e.value)}
        if isinstance(e, Bin) and e.op in ("add", "sub"):
            a, b = self.arg_form(e.a), self.arg_form(e.b)
            if a is None or b is None:
                return None
            return _add(a, b, 1 if e.op == "add" else -1)
        if isinstance(e, Bin) and e.op == "mul":
            a, b = self.arg_form(e.a), self.arg_form(e.b)
            if a is None or b is None:
                return None
            if set(a) <= {""}:
                return _scale(b, a.get("", 0))
            if set(b) <= {""}:
                return _scale(a, b.get("", 0))
        return None

    def by_key(self) -> dict:
        """The accesses of each buffer (its key), in order."""
        out: dict = {}
        for a in self.accesses:
            out.setdefault(a.key, []).append(a)
        return out

    def check(self):
        if self.rows is None:
            raise Unsupported("no statement of its body runs over rows")
        for key, accesses in self.by_key().items():
            for w in accesses:
                if not w.write:
                    continue
                for a in accesses:
                    if not self._apart(w, a):
                        raise Unsupported(
                            f"two rows may meet in {key[1]} ({w.where} writes, {a.where} "
                            f"{'writes' if a.write else 'reads'})"
                        )

    def _apart(self, w: _Access, a: _Access) -> bool:
        cw, ca = w.form.get("R", 0), a.form.get("R", 0)
        if cw != ca or cw == 0:
            return False
        fw = {s: c for s, c in w.form.items() if s != "R"}
        fa = {s: c for s, c in a.form.items() if s != "R"}

        # the loops around have the same values on both sides (a term of both cancels; one
        # of one side takes any value of its range); the others are each side's own
        def own(f, side):
            return {(side + s if s and not s.startswith("O:") else s): c for s, c in f.items()}

        fw, fa = own(fw, "w"), own(fa, "a")
        ranges = dict(self.outer_ranges)
        ranges.update({"w" + s: r for s, r in w.ranges.items() if not s.startswith("O:")})
        ranges.update({"a" + s: r for s, r in a.ranges.items() if not s.startswith("O:")})
        d = _add(fa, fw, -1)
        c, n = abs(cw), self.rows[1] - self.rows[0]
        if _rows_apart(d, ranges, c, n, w.width, a.width):
            return True
        # D = B + S, B the terms that are multiples of M: where C * (b - b') - S stays
        # within (-M, M) less the widths, only B = 0 can meet, and S alone decides
        for m in sorted({abs(k) for s, k in d.items() if s}, reverse=True):
            big = {s: k for s, k in d.items() if k % m == 0}  # (the constant too)
            small = {s: k for s, k in d.items() if s not in big}
            got = _bounds(small, ranges)
            if got is None:
                continue
            x_lo, x_hi = -c * (n - 1) - got[1], c * (n - 1) - got[0]
            fits = x_hi <= m - w.width and x_lo >= -m + a.width
            if fits and _rows_apart(small, ranges, c, n, w.width, a.width):
                return True
        return False


def _shared_temps(facts: _Facts, rowk: dict, per_block: int):
    """The temporaries a block keeps in its shared memory (``_RowKernel.in_shared``, while
    they fit in ``TEMP_BYTES``): those whose every access is at byte ``C * row + f`` of
    the temporary, one ``C`` for all, ``f`` within the row's ``C`` bytes, at a row of the
    parallel loop or the product over the block's rows (no access by a run on one thread),
    the rows from 0. A block's rows of one are then its own (``C`` bytes each, the block's
    first at the array's start), where each was a row of the device's scratch memory: the
    rollout's layers' activations, written and read back at every step."""
    if facts.rows is None or facts.rows[0] != 0:
        return
    temps = {key: a for key, a in facts.by_key().items() if key[0] == "s"}
    total = 0
    for (_, sid, name), accesses in temps.items():
        temp = next(t for t in rowk[sid].k.temps if t.name == name)
        c = accesses[0].form.get("R", 0)
        if c <= 0 or any(a.form.get("R", 0) != c or "?" in a.form for a in accesses):
            continue
        inside = True
        for a in accesses:
            f = {s: k for s, k in a.form.items() if s != "R"}
            got = _bounds(_add(f, {"": -temp.offset}), {**facts.outer_ranges, **a.ranges})
            if got is None or got[0] < 0 or got[1] + a.width > c:
                inside = False
                break
        size = per_block * c
        if not inside or total + size > TEMP_BYTES:
            continue
        total += size
        rowk[sid].in_shared[name] = (f"tl_st{sid}_{render.name(name)}", c, size)


class _RowKernel(render._Kernel):
    """A statement's kernel as part of a loop kernel: its steps over the block's rows."""

    def __init__(self, k: kir.Kernel, facts: _Facts):
        super().__init__(k, blas=False, merge_rows=False)  # (shapes._spread: yes)
        self.facts = facts
        # temporaries in the block's shared memory: name -> (array, bytes a row, bytes)
        self.in_shared: dict[str, tuple[str, int, int]] = {}
        self.pointed: set[str] = set()  # (those a call points at: declared)
        self.rows = True
        self.step_list = self._steps()
        for st in self.step_list:
            if st.kind in ("reduce", "perm", "blas"):
                raise Unsupported(f"statement {k.sid}: a {st.kind} step")
        self.step_bufs = [_buffers(st.statements()) for st in self.step_list]
        self.staged: dict = {}  # (a product's B -> its copy in shared memory: _LoopText)
        for st in self.step_list:  # (the rows, before any product needs them)
            for loop in st.body if st.kind == "either" else (st.body,):
                if st.kind in ("parallel", "either"):
                    facts.row_range(loop.lo, loop.hi, f"statement {k.sid}")

    def others_of(self, j: int) -> set:
        return set().union(*(b for q, b in enumerate(self.step_bufs) if q != j))

    def pointer_body(self) -> list:
        """The statements whose buffers a call of the kernel points at: its steps', a
        product's B its copy where the loop kernel made one (no pointer to the buffer,
        which nvcc would call set but never used)."""
        out = []
        for st in self.step_list:
            stmts = st.statements()
            out += [self.staged_gemm(x) if isinstance(x, Gemm) else x for x in stmts]
        return out

    def temp_pointer(self, tmp: str, dt: str, off: int) -> str:
        if tmp not in self.in_shared:
            return super().temp_pointer(tmp, dt, off)
        self.pointed.add(tmp)
        array, c, _ = self.in_shared[tmp]
        t, b = cexpr.MTYPE[dt], render.buf(tmp)
        # (row r of it at byte C * r: the block's first row at the array's start)
        return f"  {t} *{b} = ({t} *)((char *){array} - tl_rb * {c}LL);"

    def staged_gemm(self, s: Gemm) -> Gemm:
        """Gemm ``s`` with its B read from the block's copy in shared memory, where the loop
        kernel made one (``_LoopText.stage``)."""
        got = self.staged.get(_stage_key(s, self.k))
        if got is None:
            return s
        name, ld = got
        return dataclasses.replace(s, b=name, boff=kir.i64(0), ldb=ld)

    # ------------------------------------------------------------------ analysis
    def analyze(self, args, ranges: dict):
        """Note what a call at the loop values ``args`` (plan expressions) reads and
        writes, each access's index as a form over the row."""
        k, facts = self.k, self.facts
        env = {}
        for p, a in zip(k.params, args):
            f = facts.arg_form(plan_expr(a))
            if f is not None:
                env[p] = f
        self.sizes = {s.name: (("t", s.index), kir.SIZES[s.dtype], 0) for s in k.slots}
        for t in k.temps:
            self.sizes[t.name] = (("s", k.sid, t.name), kir.SIZES[t.dtype], t.offset)
        where = f"statement {k.sid}"
        outer = ranges
        for j, st in enumerate(self.step_list):
            others = self.others_of(j)
            # (a step under a guard makes its accesses only where the guard holds: a
            # product over the rows under the call's condition, lower._uniform_branch)
            ranges = outer if st.guard is None else self._narrow(st.guard, True, env, outer)
            if st.kind == "serial":
                if any(isinstance(s, Store) for s in kir.walk_tree(st.body)):
                    raise Unsupported(f"{where}: a run on one thread writes memory")
                if set(_lets(st.body)) & set().union(
                    *(_refs(o.statements()) for q, o in enumerate(self.step_list) if q != j)
                ):
                    raise Unsupported(f"{where}: a run on one thread passes values on")
                self._walk(st.body, env, ranges, set(), where, row=False)
            elif st.kind in ("parallel", "either"):
                loops = st.body if st.kind == "either" else (st.body,)
                for loop in loops:
                    nest = _nest(loop)
                    facts.widest = max(
                        facts.widest, max(1, _prod(render._extent(x) for x in nest[1:]))
                    )
                    mine = {t.name for t in k.temps} & (_written(loop.body) - others)
                    inner = dict(env)
                    inner[loop.var] = {"R": 1}
                    self._walk(loop.body, inner, ranges, mine, where, row=True)
            elif st.kind == "gemm":
                self._gemm(st.body, env, ranges, where)

    def _walk(self, body, env, ranges, mine, where, row: bool):
        for s in body:
            for e in kir.own_exprs(s):
                self._loads(e, env, ranges, mine, where, row)
            if isinstance(s, Store):
                self._access(s.buf, s.index, True, env, ranges, mine, where, row)
            elif isinstance(s, For):
                inner, rng = dict(env), dict(ranges)
                sym = f"v{self.facts.fresh}"
                self.facts.fresh += 1
                inner[s.var] = {sym: 1}
                lo, hi = self._form(s.lo, env, ranges), self._form(s.hi, env, ranges)
                if lo is not None and hi is not None and set(lo) <= {""} and set(hi) <= {""}:
                    rng[sym] = (lo.get("", 0), max(lo.get("", 0), hi.get("", 0) - 1))
                self._walk(s.body, inner, rng, mine, where, row)
            elif isinstance(s, If):
                then = self._narrow(s.cond, True, env, ranges)
                self._walk(s.then, env, then, mine, where, row)
                orelse = self._narrow(s.cond, False, env, ranges)
                self._walk(s.orelse, env, orelse, mine, where, row)
            elif isinstance(s, (Gemm, kir.Permute)):
                raise Unsupported(f"{where}: a {type(s).__name__} inside a loop")
            elif isinstance(s, Let):
                env.pop(s.name, None)  # (a local: not a form)

    def _loads(self, e, env, ranges, mine, where, row):
        for x in kir.subexprs(e):
            if isinstance(x, Load):
                self._access(x.buf, x.index, False, env, ranges, mine, where, row)

    def _access(self, b, index, write, env, ranges, mine, where, row):
        if b in mine or b not in self.sizes:
            return  # (a thread's own temporary; a reduction's partial results are refused)
        key, size, form = self._bytes(b, self._form(index, env, ranges))
        if not row:
            form = {s: c for s, c in form.items() if s != "R"} | {"?": 1}
        self.facts.accesses.append(_Access(key, form, size, write, dict(ranges), where))

    def _bytes(self, b: str, f: dict | None) -> tuple:
        """Buffer ``b``'s key, element size, and the byte offset of its element at index
        form ``f`` (None, unknown: ``?``, fine for memory the loop only reads)."""
        key, size, offset = self.sizes[b]
        return key, size, {"?": 1} if f is None else _add(_scale(f, size), {"": offset})

    def _form(self, e, env, ranges) -> dict | None:
        if isinstance(e, Const):
            return {"": int(e.value)} if not isinstance(e.value, float) else None
        if isinstance(e, Ref):
            return env.get(e.name)
        if isinstance(e, Cast):
            return self._form(e.x, env, ranges) if e.dtype in ("i32", "i64") else None
        if isinstance(e, Bin) and e.op in ("add", "sub", "mul"):
            a, b = self._form(e.a, env, ranges), self._form(e.b, env, ranges)
            if a is None or b is None:
                return None
            if e.op != "mul":
                return _add(a, b, 1 if e.op == "add" else -1)
            if set(a) <= {""}:
                return _scale(b, a.get("", 0))
            if set(b) <= {""}:
                return _scale(a, b.get("", 0))
            return None
        if isinstance(e, Bin) and e.op in ("floordiv", "mod"):
            # of values the same for the whole launch: a value of the loops around
            a, b = self._form(e.a, env, ranges), self._form(e.b, env, ranges)
            if a is None or b is None or "R" in a or set(b) - {""} or b.get("", 0) <= 0:
                return None
            d = b.get("", 0)
            got = _bounds(a, {**self.facts.outer_ranges, **ranges})
            span = None
            if got is not None:
                span = (got[0] // d, got[1] // d) if e.op == "floordiv" else (0, d - 1)
            if all(not x or x.startswith("O:") for x in a):
                sym = f"O:{e.op}({sorted(a.items())},{d})"
                if span is not None:
                    self.facts.outer_ranges[sym] = span
                return {sym: 1}
            # (of the loop's variables: a value of its own in its range, as a slot of a
            # window: ``t % 2``)
            if span is None:
                return None
            sym = f"v{self.facts.fresh}"
            self.facts.fresh += 1
            ranges[sym] = span
            return {sym: 1}
        if isinstance(e, Sel):
            holds = self._decide(e.cond, env, ranges)
            if holds is None:
                return None
            return self._form(e.a if holds else e.b, env, ranges)
        return None

    def _narrow(self, c, holds: bool, env, ranges) -> dict:
        """``ranges`` where condition ``c`` is ``holds``: a comparison of one variable's
        multiple with a constant bounds it (``!=`` where it excludes an end of its range)."""
        ranges = {**self.facts.outer_ranges, **ranges}
        if isinstance(c, kir.Un) and c.op == "not":
            return self._narrow(c.x, not holds, env, ranges)
        if isinstance(c, Bin) and c.op in ("and", "or"):
            if (c.op == "and") == holds:  # both hold (and), or neither does (not or)
                ranges = self._narrow(c.b, holds, env, self._narrow(c.a, holds, env, ranges))
            return self._peel(c, holds, env, ranges)
        a = b = None
        if isinstance(c, Bin) and c.op in _FLIP:
            a, b = self._form(c.a, env, ranges), self._form(c.b, env, ranges)
        f = _add(a, b, -1) if a is not None and b is not None else {"?": 1}
        syms = [x for x in f if x]
        if len(syms) != 1 or syms[0] not in ranges:
            return self._peel(c, holds, env, ranges)
        sym, k, const = syms[0], f[syms[0]], f.get("", 0)
        op = c.op if holds else _FLIP[c.op]
        if k < 0:  # k*x + const op 0  ->  (-k)*x - const (op mirrored) 0
            k, const, op = -k, -const, _MIRROR[op]
        lo, hi = ranges[sym]
        # k*x op -const, k > 0
        if op == "lt":
            hi = min(hi, -(const // k) - 1)  # x < -const/k: x <= ceil(-const/k) - 1
        elif op == "le":
            hi = min(hi, (-const) // k)
        elif op == "gt":
            lo = max(lo, (-const) // k + 1)
        elif op == "ge":
            lo = max(lo, -(const // k))
        elif op == "eq":
            if (-const) % k:
                return ranges
            lo = hi = -const // k
        elif op == "ne" and (-const) % k == 0:
            x = -const // k
            lo, hi = (lo + 1, hi) if x == lo else (lo, hi - 1) if x == hi else (lo, hi)
        out = dict(ranges)
        out[sym] = (lo, max(lo, hi))
        return out

    def _peel(self, c, holds: bool, env, ranges) -> dict:
        """``ranges`` with the values at either end of a variable's range where ``c`` is
        never ``holds`` taken off (a few at each end)."""
        out = dict(ranges)
        for sym in list(ranges):
            for _ in range(4):
                lo, hi = out[sym]
                if lo >= hi:
                    break
                if self._decide(c, env, {**out, sym: (lo, lo)}) is (not holds):
                    out[sym] = (lo + 1, hi)
                elif self._decide(c, env, {**out, sym: (hi, hi)}) is (not holds):
                    out[sym] = (lo, hi - 1)
                else:
                    break
        return out

    def _decide(self, c, env, ranges) -> bool | None:
        """Whether condition ``c`` holds at every point (True), at none (False), or either:
        remembered by what it depends on (the forms of the names ``c`` reads, their
        symbols' ranges, the loop's rows), since ``_narrow`` and ``_peel`` ask again and
        again of the parts of an ``and``/``or`` (PPO: some 440,000 questions, 4 s of its
        cuda build, were a few thousand)."""
        facts = self.facts
        names = facts.names.get(c)
        if names is None:
            names = facts.names[c] = tuple(
                sorted({x.name for x in kir.subexprs(c) if isinstance(x, Ref)})
            )
        forms = tuple((n, tuple(sorted(env[n].items()))) for n in names if n in env)
        syms = sorted({x for _, f in forms for x, _ in f if x})
        spans = tuple((x, ranges.get(x, facts.outer_ranges.get(x))) for x in syms)
        key = (c, forms, spans, facts.rows)
        if key in facts.decided:
            return facts.decided[key]
        got = facts.decided[key] = self._decided(c, env, ranges)
        return got

    def _decided(self, c, env, ranges) -> bool | None:
        if isinstance(c, Const) and c.dtype == "bool":
            return bool(c.value)
        if isinstance(c, kir.Un) and c.op == "not":
            got = self._decide(c.x, env, ranges)
            return None if got is None else not got
        if isinstance(c, Bin) and c.op in ("and", "or"):
            # "a and b": b where a holds; "a or b": b where a does not
            first = c.op == "and"
            a = self._decide(c.a, env, ranges)
            if a is (not first):
                return a
            b = self._decide(c.b, env, self._narrow(c.a, first, env, ranges))
            if b is (not first):
                return b
            return first if (a is first and b is first) else None
        if isinstance(c, Bin) and c.op in ("lt", "le", "gt", "ge", "eq", "ne"):
            a, b = self._form(c.a, env, ranges), self._form(c.b, env, ranges)
            if a is None or b is None:
                return None
            rr = {**self.facts.outer_ranges, **ranges}
            if self.facts.rows is not None:
                rr["R"] = (self.facts.rows[0], self.facts.rows[1] - 1)
            got = _bounds(_add(a, b, -1), rr)
            if got is None:
                return None
            lo, hi = got
            table = {
                "lt": (hi < 0, lo >= 0),
                "le": (hi <= 0, lo > 0),
                "gt": (lo > 0, hi <= 0),
                "ge": (lo >= 0, hi < 0),
                "eq": (lo == hi == 0, lo > 0 or hi < 0),
                "ne": (lo > 0 or hi < 0, lo == hi == 0),
            }
            yes, no = table[c.op]
            return True if yes else (False if no else None)
        return None

    def _gemm(self, s: Gemm, env, ranges, where):
        """A product's accesses: row ``i`` of ``op(a)`` and of ``c`` is the row ``lo + i``."""
        facts = self.facts
        if facts.rows is None:
            raise Unsupported(f"{where}: a product before any loop over the rows")
        rows = facts.rows
        if s.m != rows[1] - rows[0]:
            raise Unsupported(f"{where}: a product of {s.m} rows, not the loop's")
        facts.widest = max(facts.widest, s.n)
        rng = dict(ranges)
        k_sym, j_sym = f"v{facts.fresh}", f"v{facts.fresh + 1}"
        facts.fresh += 2
        rng[k_sym], rng[j_sym] = (0, s.k - 1), (0, s.n - 1)
        i = {"R": 1, "": -rows[0]}
        kk, jj = {k_sym: 1}, {j_sym: 1}

        def at(off, first, second, ld):
            f = self._form(off, env, ranges)
            if f is None:
                return None
            return _add(_add(f, _scale(first, ld)), second)

        forms = [
            (s.a, at(s.aoff, kk, i, s.lda) if s.ta else at(s.aoff, i, kk, s.lda), False),
            (s.b, at(s.boff, jj, kk, s.ldb) if s.tb else at(s.boff, kk, jj, s.ldb), False),
            (s.c, at(s.coff, i, jj, s.ldc), True),
        ]
        for b, f, write in forms:
            key, size, form = self._bytes(b, f)
            facts.accesses.append(_Access(key, form, size, write, rng, where))

    # ------------------------------------------------------------------ rendering
    def label(self) -> str:
        self.facts.fresh += 1
        return f"tl_skip{self.facts.fresh}"

    def call_lines(self, depth: int) -> list[str]:
        """A call's steps over the block's rows (the call's ``args`` in scope), each after
        the block's threads met."""
        out = []
        self.shared_temps: set[str] = set()  # the temporaries a step uses in scratch memory
        temps = {t.name for t in self.k.temps}
        for j, st in enumerate(self.step_list):
            self.lines = []
            self.local_temps = set()
            self.jumps = set()
            self.others = self.others_of(j)
            if st.kind == "serial":
                skip = self.label()
                self.emit(depth, "if (threadIdx.x == 0) {")
                for v, dt in _lets(st.body).items():
                    self.emit(depth + 1, f"{cexpr.CTYPE[dt]} {render.name(v)};")
                self.stmts(st.body, depth + 1, skip)
                self.end(depth + 1, skip)
                self.emit(depth, "}")
            elif st.kind == "parallel":
                self.grid_loop(st.body, depth, epilogue=False, collapse=True)
            elif st.kind == "either":
                outside = self.others
                for loop in st.body:
                    self.others = outside | _buffers([x for x in st.body if x is not loop])
                    self.grid_loop(loop, depth, epilogue=False, collapse=True)
            else:  # a product, element by element over the block's rows
                s = self.staged_gemm(st.body)
                inner = depth
                if st.guard is not None:
                    self.emit(depth, f"if ({self.expr(st.guard)}) {{")
                    inner += 1
                first = f"(tl_rb * {s.n}LL) + threadIdx.x"
                self.gemm(s, inner, first, "blockDim.x", f"tl_re * {s.n}LL")
                if st.guard is not None:
                    self.emit(depth, "}")
            self.shared_temps |= (self.step_bufs[j] & temps) - self.local_temps
            out += self.lines
            out.append("  " * depth + "__syncthreads();")
        return out


def _stage_key(s: Gemm, k: kir.Kernel) -> tuple | None:
    """A product's B as a loop kernel may copy it into shared memory (``_LoopText.stage``):
    ``(table entry, offset, rows, columns, leading dimension, dtype)`` of a buffer's at a
    constant offset, or None."""
    slot = next((x for x in k.slots if x.name == s.b), None)
    if slot is None or not isinstance(s.boff, Const):
        return None
    rows, cols = (s.n, s.k) if s.tb else (s.k, s.n)
    return (slot.index, s.boff.value, rows, cols, s.ldb, s.dtype)


def _rows_apart(d: dict, ranges: dict, c: int, n: int, ww: int, wa: int) -> bool:
    """Whether rows ``b != b'`` (``n`` of them, ``c`` bytes apart) never meet: a write of
    ``ww`` bytes at ``c * b + f_w`` and an access of ``wa`` at ``c * b' + f_a``, ``d`` the
    form of ``f_a - f_w`` over ``ranges``. They meet where ``c * (b - b')`` lies strictly
    between ``D - ww`` and ``D + wa``."""
    got = _bounds(d, ranges)
    if got is None:
        return False
    lo, hi = got[0] - ww, got[1] + wa  # (open)
    first, last = lo // c + 1, -(-hi // c) - 1  # the multiples strictly inside
    first, last = max(first, -(n - 1)), min(last, n - 1)
    return first > last or (first == last == 0)


_FLIP = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


class _LoopText:
    """The CUDA C of a loop kernel (see the module's text)."""

    def __init__(self, plan, scope, loop, rowk, fname, per_block, rows):
        self.plan, self.scope, self.loop = plan, scope, loop
        self.rowk, self.fname, self.per_block, self.rows = rowk, fname, per_block, rows
        self.lines: list[str] = []
        self.expr = next(iter(rowk.values())).expr  # (plan names render as any local)

    def emit(self, depth: int, line: str):
        self.lines.append("  " * depth + line)

    def render(self) -> str:
        loop, name = self.loop, render.name
        self.lines = [
            (
                f'extern "C" __global__ void {self.fname}(void **table, const tl_args args_in, '
                "char *scratch, int *err, const long long *shift) {"
            ),
            "  const tl_args tl_outer = tl_shifted(args_in, shift);",
            "  __shared__ int tl_fail;",
            "  __shared__ int tl_stops[2];",
            "  if (threadIdx.x == 0) { tl_fail = 0; tl_stops[0] = *(volatile int *)err; }",
            "  int tl_seen = 0, tl_turn = 1;  // (thread 0's read of the failure code, a step old)",
        ]
        self.stage()
        at = len(self.lines)  # (the temporaries in shared memory that a call points at)
        self.emit(1, "__syncthreads();")
        self.emit(1, "if (tl_stops[0]) return;  // an earlier step failed")
        for j, v in enumerate(self.scope):
            self.emit(1, f"const long long {name(v)} = tl_outer.v[{j}];  (void){name(v)};")
        rows, per = self.rows, self.per_block
        self.emit(
            1,
            f"for (long long tl_rb = (long long)blockIdx.x * {per}; tl_rb < {rows}LL; "
            f"tl_rb += (long long)gridDim.x * {per}) {{",
        )
        self.emit(
            2, f"const long long tl_re = tl_rb + {per} < {rows}LL ? tl_rb + {per} : {rows}LL;"
        )
        v = name(loop.var)
        init = self.expr(plan_expr(loop.init))
        cond = self.expr(plan_expr(loop.cond))
        self.emit(2, f"for (long long {v} = {init}; {cond}; {v} += {loop.inc}LL) {{")
        # another block's failure, as thread 0 read it during the step before: published in
        # the step's slot (two, by turns: the other slot's readers are a barrier behind),
        # then read anew, the read's wait behind the step's work (it was a read of the
        # device's memory and a barrier waiting for it at the top of every step: some 0.6 us
        # of each of the rollout's 129 steps)
        self.emit(3, "if (threadIdx.x == 0) tl_stops[tl_turn] = tl_seen;")
        self.emit(3, "__syncthreads();")
        self.emit(3, "if (tl_stops[tl_turn]) return;  // a block failed")
        self.emit(3, "if (threadIdx.x == 0) tl_seen = *(volatile int *)err;")
        self.emit(3, "tl_turn ^= 1;")
        self.items(loop.body, 3)
        self.emit(2, "}")
        self.emit(1, "}")
        self.lines.append("}")
        arrays = {  # (_shared_temps: 8-byte aligned)
            f"  __shared__ double {array}[{(size + 7) // 8}];"
            for rk in self.rowk.values()
            for tmp, (array, _, size) in rk.in_shared.items()
            if tmp in rk.pointed
        }
        self.lines[at:at] = sorted(arrays)
        return "\n".join(self.lines) + "\n"

    def stage(self):
        """The weights of the loop's products in shared memory, copied once a block before
        the loop: each product's B that no statement of the loop writes, at an offset the
        same at every call, while they fit in ``STAGE_BYTES`` (a product's threads each
        read a column of B at every step: the rollout's 64 x 64 layer 16 KiB a block from
        the device's memory, 1,024 blocks, 129 steps); the products read the copies
        (``_RowKernel.staged_gemm``)."""
        written = set().union(*(_written(rk.k.body) for rk in self.rowk.values()))
        staged: dict = {}
        total = 0
        for rk in self.rowk.values():
            for st in rk.step_list:
                if st.kind != "gemm":
                    continue
                s = st.body
                key = _stage_key(s, rk.k)
                if key is None or s.b in written or key in staged:
                    continue
                _, off, rows, cols, ld, dt = key
                size = rows * cols * kir.SIZES[dt]
                if total + size > STAGE_BYTES:
                    continue
                total += size
                name = f"tl_w{len(staged)}"
                staged[key] = (name, cols)
                t = cexpr.CTYPE[dt]
                self.emit(1, f"__shared__ {t} {render.buf(name)}[{rows * cols}];")
                # (not where the table has no memory for it: a buffer no call of this
                # launch reaches, which its product's guard keeps it from reading)
                self.emit(1, f"if (table[{key[0]}]) {{")
                self.emit(2, f"const {t} *tl_src = ({t} *)table[{key[0]}] + {off}LL;")
                self.lines.append("#pragma unroll 8")  # (its loads 8 at a time)
                self.emit(
                    2,
                    f"for (int tl_q = threadIdx.x; tl_q < {rows * cols}; tl_q += blockDim.x) "
                    f"{render.buf(name)}[tl_q] = tl_src[(tl_q / {cols}) * {ld} + tl_q % {cols}];",
                )
                self.emit(1, "}")
        for rk in self.rowk.values():
            rk.staged = staged

    def items(self, items, depth: int):
        for it in items:
            if isinstance(it, Call):
                self.call(it, depth)
            else:
                self.emit(depth, f"if ({self.expr(plan_expr(it.cond))}) {{")
                self.items(it.then, depth + 1)
                if it.orelse:
                    self.emit(depth, "} else {")
                    self.items(it.orelse, depth + 1)
                self.emit(depth, "}")

    def call(self, it: Call, depth: int):
        rk = self.rowk[it.statement]
        sid = it.statement
        st = self.plan.statement(sid)
        box = self.plan.buffer(sid).box
        loop_box = [box[st.dims.index(d)] for d in st.loops]
        self.emit(depth, f"{{  // statement {sid}")
        self.emit(depth + 1, "tl_args tl_a = {};")
        for j, a in enumerate(it.args):
            self.emit(depth + 1, f"tl_a.v[{j}] = {self.expr(plan_expr(a))};")
        inside = " && ".join(
            f"tl_a.v[{j}] >= 0 && tl_a.v[{j}] < {n}LL" for j, n in enumerate(loop_box)
        )
        if inside:
            self.emit(depth + 1, f"if (!({inside})) {{")
            self.emit(depth + 2, f"if (threadIdx.x == 0) tl_failed(err, {LOOP_BOX}, {sid}, tl_a);")
            self.emit(depth + 2, "return;")
            self.emit(depth + 1, "}")
        self.emit(depth + 1, "{")
        self.emit(depth + 2, "const tl_args args = tl_a;")
        body = rk.call_lines(depth + 2)
        # (a temporary that every step using it keeps per thread has no pointer)
        rk.local_temps = {t.name for t in rk.k.temps} - rk.shared_temps
        for line in rk.pointers(rk.pointer_body()):
            self.emit(depth + 2, line.strip())
        self.lines += body
        self.emit(
            depth + 2,
            f"if (tl_fail) {{ if (threadIdx.x == 0) tl_failed(err, tl_fail, {sid}, args); "
            "return; }",
        )
        self.emit(depth + 1, "}")
        self.emit(depth, "}")
