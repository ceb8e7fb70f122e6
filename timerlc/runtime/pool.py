"""The cpu backend's threads: one pool per process that the native kernels hand their
parallel loops and their large products to (docs/codegen.md, "Threads").

A kernel's parallel loop (``kir.For.parallel``) with enough work is rendered as a function
of its own, ``fn(frame, lo, hi)`` over a range of its iterations (``llvm.render``), and the
kernel calls ``tl_pool_run(fn, frame, lo, hi, grain, per)`` through the pointer ``@tl_par``
its module has, which ``NativeModule`` sets to this pool's. ``tl_pool_run`` cuts the range
into chunks of at least ``grain`` iterations (at most ``per`` a thread, at most 64), and the
caller and the pool's workers take chunks until none is left; the caller then waits for
the chunks a worker took, and returns the first failure code by chunk order (0: none).

The chunks are claimed from one word, the job's tag (a count of jobs), the number of chunks
and the next chunk: a worker claims chunk ``c`` by a compare-and-swap on the word it read,
so that it never takes a chunk of a job that has ended (the caller cannot end a job before
every chunk claimed is done, and the job's fields do not change until then). A worker that
is slow to come, asleep or gone (a forked child has none) leaves its chunks to the caller:
the results are the same, only later. Chunk boundaries depend on the range, ``grain`` and
the number of threads, not on which thread runs what: a run's values are the same from run
to run.

Workers spin for ``SPIN`` pauses after their last chunk (a PPO minibatch step's kernels
come microseconds apart), then sleep, a little longer each time up to ``MAX_SLEEP_US``.

The products (``@tl_sgemm``/``@tl_dgemm`` of the kernels) go to ``tl_pool_sgemm``/
``tl_pool_dgemm``: one of at least ``GEMM_SPLIT_MACS`` multiply-adds is cut along the longer
of C's sides into a chunk a thread, each the BLAS's gemm on its rows (or columns) of C, or,
for a weight's gradient (``k`` at least 4 times C's longer side), along ``k``, the chunks'
partial products added into C in chunk order (a float32 chunk of a skinny gram, C's one side
at most ``GRAM_SMALL`` and the other a multiple of 16 up to ``16 * GRAM_VECTORS``, by a gram
of the pool's own, ``_gram``); a smaller one goes to the BLAS as it is.
While the pool has workers, the BLAS (NumPy's
OpenBLAS) runs on one thread: its own threads spin after each call, on the cores the pool's
want (measured: a 8192 x 64 x 64 product 297 us by OpenBLAS's two threads alone, 388 us cut
in two beside its spinning thread, 287 us with OpenBLAS on one thread). A run of one thread
(``TIMERLC_THREADS=1``, one CPU) has no pool, and the BLAS runs on one thread too.

The text below is the runtime's own (no program's): it is compiled once per process, or
loaded from the user's cache of machine code (``native.cached_object``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

# the pauses a worker spins for after its last chunk: half a millisecond to a millisecond on
# this machine (x86's pause: 25-40 ns here, on an AMD EPYC; other CPUs differ)
SPIN = 20_000
MAX_SLEEP_US = 2000
GEMM_SPLIT_MACS = 1 << 18  # a product of fewer multiply-adds goes to the BLAS whole
GEMM_GRAIN = 16  # the fewest rows (columns) of C a product's chunk takes
# a product cut along k (a weight's gradient) keeps its chunks' partial products, but the
# first's, in at most this many bytes of the caller's stack
GEMM_PARTIALS = 1 << 18
MAX_THREADS = 16
WORKER_STACK = 16 << 20  # bytes of a worker's stack (pages are committed as they are used)

_POOL = r"""
@pj_busy = global i32 0
@pj_gen = global i64 0
@pj_next = global i64 0
@pj_done = global i64 0
@pj_fn = global ptr null
@pj_frame = global ptr null
@pj_lo = global i64 0
@pj_hi = global i64 0
@pj_step = global i64 0
@pj_codes = global [64 x i32] zeroinitializer
@pj_stop = global i32 0
@pj_live = global i32 0
@pj_taken = global i64 0

declare i32 @usleep(i32)
PAUSE_DECLARE
define internal void @pj_pause() alwaysinline {
PAUSE_CALL
  ret void
}

; chunk %c of the job in flight: its code kept, then counted done
define internal void @pj_chunk(i64 %c) {
  %fn = load ptr, ptr @pj_fn
  %frame = load ptr, ptr @pj_frame
  %lo0 = load i64, ptr @pj_lo
  %hi0 = load i64, ptr @pj_hi
  %step = load i64, ptr @pj_step
  %off = mul i64 %c, %step
  %lo = add i64 %lo0, %off
  %e = add i64 %lo, %step
  %lt = icmp slt i64 %e, %hi0
  %hi = select i1 %lt, i64 %e, i64 %hi0
  %r = call i32 %fn(ptr %frame, i64 %lo, i64 %hi)
  %cp = getelementptr [64 x i32], ptr @pj_codes, i64 0, i64 %c
  store i32 %r, ptr %cp
  %old = atomicrmw add ptr @pj_done, i64 1 release
  ret void
}

; fn(frame, lo, hi) over lo ..< hi, in chunks of at least %grain iterations, at most %per a
; thread, with the pool's workers; alone where it has none, is busy or the range is small
define i32 @tl_pool_run(ptr %fn, ptr %frame, i64 %lo, i64 %hi, i64 %grain, i64 %per) {
entry:
  %n = sub i64 %hi, %lo
  %live = load atomic i32, ptr @pj_live monotonic, align 4
  %nolive = icmp eq i32 %live, 0
  %two = shl i64 %grain, 1
  %small = icmp slt i64 %n, %two
  %alone = or i1 %nolive, %small
  br i1 %alone, label %serial, label %try
try:
  %x = cmpxchg ptr @pj_busy, i32 0, i32 1 acquire monotonic
  %got = extractvalue { i32, i1 } %x, 1
  br i1 %got, label %split, label %serial
serial:
  %r0 = call i32 %fn(ptr %frame, i64 %lo, i64 %hi)
  ret i32 %r0
split:
  %threads = add i32 %live, 1
  %t64 = zext i32 %threads to i64
  %want = mul i64 %t64, %per
  %bygrain = sdiv i64 %n, %grain
  %c1 = icmp slt i64 %bygrain, %want
  %ch0 = select i1 %c1, i64 %bygrain, i64 %want
  %c2 = icmp sgt i64 %ch0, 64
  %ch1 = select i1 %c2, i64 64, i64 %ch0
  %nm1 = add i64 %n, -1
  %s0 = add i64 %nm1, %ch1
  %step = sdiv i64 %s0, %ch1
  %s1 = add i64 %n, %step
  %s2 = add i64 %s1, -1
  %chunks = sdiv i64 %s2, %step
  store ptr %fn, ptr @pj_fn
  store ptr %frame, ptr @pj_frame
  store i64 %lo, ptr @pj_lo
  store i64 %hi, ptr @pj_hi
  store i64 %step, ptr @pj_step
  store atomic i64 0, ptr @pj_done monotonic, align 8
  %g0 = load i64, ptr @pj_gen
  %g = add i64 %g0, 1
  store i64 %g, ptr @pj_gen
  %tag = shl i64 %g, 16
  %nn = shl i64 %chunks, 8
  %word = or i64 %tag, %nn
  store atomic i64 %word, ptr @pj_next release, align 8
  br label %claim
claim:
  %old = atomicrmw add ptr @pj_next, i64 1 acq_rel
  %c = and i64 %old, 255
  %more = icmp slt i64 %c, %chunks
  br i1 %more, label %run, label %wait
run:
  call void @pj_chunk(i64 %c)
  br label %claim
wait:
  %d = load atomic i64, ptr @pj_done acquire, align 8
  %all = icmp sge i64 %d, %chunks
  br i1 %all, label %codes, label %spin
spin:
  call void @pj_pause()
  br label %wait
codes:
  %j = phi i64 [ 0, %wait ], [ %j1, %next ]
  %in = icmp slt i64 %j, %chunks
  br i1 %in, label %look, label %ok
look:
  %cp = getelementptr [64 x i32], ptr @pj_codes, i64 0, i64 %j
  %code = load i32, ptr %cp
  %bad = icmp ne i32 %code, 0
  %j1 = add i64 %j, 1
  br i1 %bad, label %fail, label %next
next:
  br label %codes
fail:
  store atomic i32 0, ptr @pj_busy release, align 4
  ret i32 %code
ok:
  store atomic i32 0, ptr @pj_busy release, align 4
  ret i32 0
}

; a worker: takes chunks of each job until told to stop; spins SPIN times after its last
; chunk (a pause each), then sleeps, longer each time (at most MAXSLEEP us)
define void @tl_pool_worker() {
entry:
  %w0 = load atomic i64, ptr @pj_next acquire, align 8
  %t0 = lshr i64 %w0, 16
  br label %top
top:
  %seen = phi i64 [ %t0, %entry ], [ %seen, %pause ], [ %seen, %slept ], [ %tag, %claim ]
  %spins = phi i64 [ 0, %entry ], [ %spins1, %pause ], [ %spins, %slept ], [ 0, %claim ]
  %nap = phi i32 [ 16, %entry ], [ %nap, %pause ], [ %nap2, %slept ], [ 16, %claim ]
  %stop = load atomic i32, ptr @pj_stop monotonic, align 4
  %quit = icmp ne i32 %stop, 0
  br i1 %quit, label %out, label %look
look:
  %w = load atomic i64, ptr @pj_next acquire, align 8
  %tag = lshr i64 %w, 16
  %new = icmp ne i64 %tag, %seen
  br i1 %new, label %claim, label %idle
claim:
  %cur = load atomic i64, ptr @pj_next acquire, align 8
  %ctag = lshr i64 %cur, 16
  %same = icmp eq i64 %ctag, %tag
  %c = and i64 %cur, 255
  %n8 = lshr i64 %cur, 8
  %n = and i64 %n8, 255
  %left = icmp slt i64 %c, %n
  %ok = and i1 %same, %left
  br i1 %ok, label %cas, label %top
cas:
  %cur1 = add i64 %cur, 1
  %x = cmpxchg ptr @pj_next, i64 %cur, i64 %cur1 acq_rel acquire
  %won = extractvalue { i64, i1 } %x, 1
  br i1 %won, label %take, label %claim
take:
  call void @pj_chunk(i64 %c)
  %tk = atomicrmw add ptr @pj_taken, i64 1 monotonic
  br label %claim
idle:
  %hot = icmp ult i64 %spins, SPIN
  br i1 %hot, label %pause, label %sleep
pause:
  call void @pj_pause()
  %spins1 = add i64 %spins, 1
  br label %top
sleep:
  %u = call i32 @usleep(i32 %nap)
  %nd = shl i32 %nap, 1
  %cap = icmp ugt i32 %nd, MAXSLEEP
  %nap2 = select i1 %cap, i32 MAXSLEEP, i32 %nd
  br label %slept
slept:
  br label %top
out:
  ret void
}
"""

# the frame of a cut product, 8 bytes a field: the gemm's arguments, then 1 where the cut
# is along C's columns, then a cut along k's chunk of k and its partial products' area
_FRAME = (
    "ta", "tb", "m", "n", "k", "alpha", "a", "lda", "b", "ldb", "beta", "c", "ldc",
    "cols", "step", "area",
)  # fmt: skip
_FRAME_TYPES = {"alpha": "{t}", "beta": "{t}", "a": "ptr", "b": "ptr", "c": "ptr", "area": "ptr"}


def _field(name: str, value: str | None = None) -> str:
    """IR of field ``name`` of the frame ``%f``: loaded into ``%name``, or ``value`` stored
    there (``{t}``: the product's float type, left for ``_GEMM.format``)."""
    t = _FRAME_TYPES.get(name, "i64")
    at = f"  %f.{name} = getelementptr i64, ptr %f, i64 {_FRAME.index(name)}\n"
    if value is None:
        return at + f"  %{name} = load {t}, ptr %f.{name}\n"
    return at + f"  store {t} {value}, ptr %f.{name}\n"


# a gemm's arguments loaded from its frame (``_GEMM``'s chunk functions), and stored there
_GEMM_ARGS = "  %g = load ptr, ptr @tl_blas_{w}gemm\n" + "".join(map(_field, _FRAME[:13]))
_GEMM_STORES = "".join(
    _field(n, "%ta64" if n == "ta" else "%tb64" if n == "tb" else f"%{n}") for n in _FRAME[:13]
)

# a product cut along C's longer side or along k, its arguments in a frame (``_FRAME``)
_GEMM = r"""
@tl_blas_{w}gemm = global ptr null

define internal i32 @pj_{w}gemm_chunk(ptr %f, i64 %lo, i64 %hi) {{
{args}{cols_load}  %w = sub i64 %hi, %lo
  %ta32 = trunc i64 %ta to i32
  %tb32 = trunc i64 %tb to i32
  %bycol = icmp ne i64 %cols, 0
  br i1 %bycol, label %col, label %row
row:
  %atr = icmp eq i64 %ta, 112
  %ar = mul i64 %lo, %lda
  %aoff = select i1 %atr, i64 %lo, i64 %ar
  %a2 = getelementptr {t}, ptr %a, i64 %aoff
  %cr = mul i64 %lo, %ldc
  %c2 = getelementptr {t}, ptr %c, i64 %cr
  call void %g(i32 101, i32 %ta32, i32 %tb32, i64 %w, i64 %n, i64 %k, {t} %alpha, ptr %a2, i64 %lda, ptr %b, i64 %ldb, {t} %beta, ptr %c2, i64 %ldc)
  ret i32 0
col:
  %btr = icmp eq i64 %tb, 112
  %br2 = mul i64 %lo, %ldb
  %boff = select i1 %btr, i64 %br2, i64 %lo
  %b2 = getelementptr {t}, ptr %b, i64 %boff
  %c3 = getelementptr {t}, ptr %c, i64 %lo
  call void %g(i32 101, i32 %ta32, i32 %tb32, i64 %m, i64 %w, i64 %k, {t} %alpha, ptr %a, i64 %lda, ptr %b2, i64 %ldb, {t} %beta, ptr %c3, i64 %ldc)
  ret i32 0
}}

; chunks %clo ..< %chi of a product cut along k (frame: the 13 arguments as above, then
; the k of a chunk and the partial products' area): chunk 0 into C, chunk c > 0 into the
; area's (c - 1)-th m x n block
define internal i32 @pj_{w}gemm_kpart(ptr %f, i64 %clo, i64 %chi) {{
entry:
{args}{cut_loads}  %ta32 = trunc i64 %ta to i32
  %tb32 = trunc i64 %tb to i32
  %mn = mul i64 %m, %n
  %atr = icmp eq i64 %ta, 112
  %btr = icmp eq i64 %tb, 112
  br label %head
head:
  %q = phi i64 [ %clo, %entry ], [ %q1, %next ]
  %more = icmp slt i64 %q, %chi
  br i1 %more, label %body, label %done
body:
  %k0 = mul i64 %q, %step
  %rest = sub i64 %k, %k0
  %short = icmp slt i64 %rest, %step
  %kw = select i1 %short, i64 %rest, i64 %step
  %ar = mul i64 %k0, %lda
  %aoff = select i1 %atr, i64 %ar, i64 %k0
  %a2 = getelementptr {t}, ptr %a, i64 %aoff
  %br = mul i64 %k0, %ldb
  %boff = select i1 %btr, i64 %k0, i64 %br
  %b2 = getelementptr {t}, ptr %b, i64 %boff
  %first = icmp eq i64 %q, 0
  %qm1 = add i64 %q, -1
  %toff = mul i64 %qm1, %mn
  %tp = getelementptr {t}, ptr %area, i64 %toff
  %out = select i1 %first, ptr %c, ptr %tp
  %ld = select i1 %first, i64 %ldc, i64 %n
  %be = select i1 %first, {t} %beta, {t} 0.0
{kcall}
next:
  %q1 = add i64 %q, 1
  br label %head
done:
  ret i32 0
}}

define void @tl_pool_{w}gemm(i32 %order, i32 %ta, i32 %tb, i64 %m, i64 %n, i64 %k, {t} %alpha, ptr %a, i64 %lda, ptr %b, i64 %ldb, {t} %beta, ptr %c, i64 %ldc) {{
entry:
  %mn = mul i64 %m, %n
  %mnk = mul i64 %mn, %k
  %small = icmp slt i64 %mnk, {macs}
  %rowmajor = icmp eq i32 %order, 101
  %fits = xor i1 %small, true
  %cut = and i1 %fits, %rowmajor
  br i1 %cut, label %split, label %whole
whole:
  %g = load ptr, ptr @tl_blas_{w}gemm
  call void %g(i32 %order, i32 %ta, i32 %tb, i64 %m, i64 %n, i64 %k, {t} %alpha, ptr %a, i64 %lda, ptr %b, i64 %ldb, {t} %beta, ptr %c, i64 %ldc)
  ret void
split:
  %f = alloca [16 x i64]
  %ta64 = zext i32 %ta to i64
  %tb64 = zext i32 %tb to i64
{stores}  %rows = icmp sge i64 %m, %n
  %cols = select i1 %rows, i64 0, i64 1
{cols_store}  %side = select i1 %rows, i64 %m, i64 %n
  ; a weight's gradient (k at least 4 times C's longer side): cut along k, a chunk a
  ; thread, where the partial products fit the area
  %k4 = mul i64 %side, 4
  %deep = icmp sge i64 %k, %k4
  %live = load atomic i32, ptr @pj_live monotonic, align 4
  %live64 = zext i32 %live to i64
  %cells = mul i64 %live64, %mn
  %room = icmp sle i64 %cells, {area}
  %some = icmp ugt i32 %live, 0
  %kd = and i1 %deep, %room
  %kc = and i1 %kd, %some
  br i1 %kc, label %kcut, label %rcut
rcut:
  %r = call i32 @tl_pool_run(ptr @pj_{w}gemm_chunk, ptr %f, i64 0, i64 %side, i64 {grain}, i64 1)
  ret void
kcut:
  %parts = alloca {t}, i64 {area}, align 64
  %threads = add i64 %live64, 1
  %km1 = add i64 %k, -1
  %s0 = add i64 %km1, %threads
  %s1 = sdiv i64 %s0, %threads
  %s2 = add i64 %s1, 15
  %step = and i64 %s2, -16
  %s3 = add i64 %k, %step
  %s4 = add i64 %s3, -1
  %chunks = sdiv i64 %s4, %step
{cut_stores}  %r2 = call i32 @tl_pool_run(ptr @pj_{w}gemm_kpart, ptr %f, i64 0, i64 %chunks, i64 1, i64 64)
  br label %chead
chead:
  %q = phi i64 [ 1, %kcut ], [ %q1, %cnext ]
  %cm = icmp slt i64 %q, %chunks
  br i1 %cm, label %cbody, label %cdone
cbody:
  %qm1 = add i64 %q, -1
  %base = mul i64 %qm1, %mn
  br label %ihead
ihead:
  %i = phi i64 [ 0, %cbody ], [ %i1, %jdone ]
  %im = icmp slt i64 %i, %m
  br i1 %im, label %jstart, label %cnext
jstart:
  %crow = mul i64 %i, %ldc
  %trow0 = mul i64 %i, %n
  %trow = add i64 %base, %trow0
  br label %jhead
jhead:
  %j = phi i64 [ 0, %jstart ], [ %j1, %jbody ]
  %jm = icmp slt i64 %j, %n
  br i1 %jm, label %jbody, label %jdone
jbody:
  %ci = add i64 %crow, %j
  %cp = getelementptr {t}, ptr %c, i64 %ci
  %ti = add i64 %trow, %j
  %tp = getelementptr {t}, ptr %parts, i64 %ti
  %cv = load {t}, ptr %cp
  %tv = load {t}, ptr %tp
  %sum = fadd {t} %cv, %tv
  store {t} %sum, ptr %cp
  %j1 = add i64 %j, 1
  br label %jhead
jdone:
  %i1 = add i64 %i, 1
  br label %ihead
cnext:
  %q1 = add i64 %q, 1
  br label %chead
cdone:
  ret void
}}
"""


_KCALL = """  call void %g(i32 101, i32 %ta32, i32 %tb32, i64 %m, i64 %n, i64 %kw, {t} %alpha, ptr %a2, i64 %lda, ptr %b2, i64 %ldb, {t} %be, ptr %out, i64 %ld)
  br label %next"""

# an f32 chunk goes to a gram of ours where it is one (pj_sgram), else to the BLAS
_KCALL_GRAM = """  %own = call i1 @pj_sgram(i64 %ta, i64 %tb, i64 %m, i64 %n, i64 %kw, float %alpha, ptr %a2, i64 %lda, ptr %b2, i64 %ldb, float %be, ptr %out, i64 %ld)
  br i1 %own, label %next, label %blas
blas:
""" + _KCALL.format(t="float")

# a skinny gram C = A^T B (A: k x m, B: k x n, row-major) of C's one side at most GRAM_SMALL
# and the other a multiple of 16 up to 16 * GRAM_VECTORS, alpha 1 and beta 0: each row of
# A and B, an outer product added into C's registers (<16 x float> accumulators, one
# fmuladd a vector a row; the terms in order), where OpenBLAS's sgemm took 6 times the time
# of reading its operands at these shapes (64 x 32768 by 32768 x 2: 398 us on one thread,
# a copy of the 8 MiB 134 us)
GRAM_SMALL = 4
GRAM_VECTORS = 4


def _gram(small: int, vectors: int) -> str:
    """``@pj_sgram_S_V(w, ldw, s, lds, k, out, ld, wide_n)``: the sum over rows ``r < k``
    of the outer product of the small operand's row (``S`` floats at ``s + r * lds``) and
    the wide one's (``16 V`` floats at ``w + r * ldw``) into ``out``: its rows the small
    side's (``wide_n``: C = S^T W) or its columns (C = W^T S), ``ld`` apart."""
    name = f"pj_sgram_{small}_{vectors}"
    accs = [(i, v) for i in range(small) for v in range(vectors)]
    lines = [
        (
            f"define internal void @{name}(ptr %w, i64 %ldw, ptr %s, i64 %lds, i64 %k, "
            "ptr %out, i64 %ld, i1 %widen) {"
        ),
        "entry:",
        "  br label %head",
        "head:",
        "  %r = phi i64 [ 0, %entry ], [ %r1, %body ]",
    ]
    lines += [
        f"  %acc{i}_{v} = phi <16 x float> [ zeroinitializer, %entry ], [ %nacc{i}_{v}, %body ]"
        for i, v in accs
    ]
    lines += ["  %more = icmp slt i64 %r, %k", "  br i1 %more, label %body, label %done", "body:"]
    lines += ["  %wo = mul i64 %r, %ldw", "  %so = mul i64 %r, %lds"]
    for v in range(vectors):
        lines += [
            f"  %wi{v} = add i64 %wo, {16 * v}",
            f"  %wp{v} = getelementptr float, ptr %w, i64 %wi{v}",
            f"  %wv{v} = load <16 x float>, ptr %wp{v}, align 4",
        ]
    for i in range(small):
        lines += [
            f"  %si{i} = add i64 %so, {i}",
            f"  %sp{i} = getelementptr float, ptr %s, i64 %si{i}",
            f"  %sx{i} = load float, ptr %sp{i}, align 4",
            f"  %sh{i} = insertelement <16 x float> poison, float %sx{i}, i64 0",
            (
                f"  %sv{i} = shufflevector <16 x float> %sh{i}, <16 x float> poison, "
                "<16 x i32> zeroinitializer"
            ),
        ]
    lines += [
        f"  %nacc{i}_{v} = call <16 x float> @llvm.fmuladd.v16f32(<16 x float> %sv{i}, "
        f"<16 x float> %wv{v}, <16 x float> %acc{i}_{v})"
        for i, v in accs
    ]
    lines += ["  %r1 = add i64 %r, 1", "  br label %head", "done:"]
    lines += ["  br i1 %widen, label %rows, label %cols", "rows:"]
    for i, v in accs:  # C[i, 16 v ..]: a vector a store
        lines += [
            f"  %ro{i}_{v} = mul i64 {i}, %ld",
            f"  %rq{i}_{v} = add i64 %ro{i}_{v}, {16 * v}",
            f"  %rp{i}_{v} = getelementptr float, ptr %out, i64 %rq{i}_{v}",
            f"  store <16 x float> %acc{i}_{v}, ptr %rp{i}_{v}, align 4",
        ]
    # C[16 v + l, i]: the accumulators through a block of the stack, S x 16 V, then an
    # element a store
    lines += ["  ret void", "cols:", f"  %t = alloca [{small * vectors * 16} x float], align 64"]
    for i, v in accs:
        lines += [
            f"  %tp{i}_{v} = getelementptr float, ptr %t, i64 {(i * vectors + v) * 16}",
            f"  store <16 x float> %acc{i}_{v}, ptr %tp{i}_{v}, align 64",
        ]
    lines += [
        "  br label %chead",
        "chead:",
        "  %q = phi i64 [ 0, %cols ], [ %q1, %cbody ]",
        f"  %cmore = icmp slt i64 %q, {small * vectors * 16}",
        "  br i1 %cmore, label %cbody, label %cdone",
        "cbody:",
        f"  %ci = udiv i64 %q, {vectors * 16}",  # (the small side's element)
        f"  %cj = urem i64 %q, {vectors * 16}",  # (the wide side's)
        "  %cv = getelementptr float, ptr %t, i64 %q",
        "  %cx = load float, ptr %cv, align 4",
        "  %co = mul i64 %cj, %ld",
        "  %cq = add i64 %co, %ci",
        "  %cp = getelementptr float, ptr %out, i64 %cq",
        "  store float %cx, ptr %cp, align 4",
        "  %q1 = add i64 %q, 1",
        "  br label %chead",
        "cdone:",
        "  ret void",
        "}",
        "",
    ]
    return "\n".join(lines)


def _grams() -> str:
    """The grams of ours (``_gram``) and ``@pj_sgram``, which runs the one for a chunk's
    shape and says whether it did (else the BLAS runs it)."""
    out = [_gram(si, v) for si in range(1, GRAM_SMALL + 1) for v in range(1, GRAM_VECTORS + 1)]
    out.append(
        "declare <16 x float> @llvm.fmuladd.v16f32(<16 x float>, <16 x float>, <16 x float>)"
    )
    lines = [
        (
            "define internal i1 @pj_sgram(i64 %ta, i64 %tb, i64 %m, i64 %n, i64 %k, float %alpha, "
            "ptr %a, i64 %lda, ptr %b, i64 %ldb, float %beta, ptr %c, i64 %ldc) {"
        ),
        "entry:",
        "  %at = icmp eq i64 %ta, 112",  # (A transposed: A is stored k x m)
        "  %bn = icmp eq i64 %tb, 111",  # (B as it is: k x n)
        "  %one = fcmp oeq float %alpha, 1.0",
        "  %zero = fcmp oeq float %beta, 0.0",
        "  %ok1 = and i1 %at, %bn",
        "  %ok2 = and i1 %one, %zero",
        "  %ok = and i1 %ok1, %ok2",
        "  br i1 %ok, label %shape, label %no",
        "shape:",
        "  %mwide = icmp sgt i64 %m, %n",
        "  %wide = select i1 %mwide, i64 %m, i64 %n",
        "  %small = select i1 %mwide, i64 %n, i64 %m",
        "  %w = select i1 %mwide, ptr %a, ptr %b",
        "  %ldw = select i1 %mwide, i64 %lda, i64 %ldb",
        "  %s = select i1 %mwide, ptr %b, ptr %a",
        "  %lds = select i1 %mwide, i64 %ldb, i64 %lda",
        "  %widen = xor i1 %mwide, true",
        "  %v = lshr i64 %wide, 4",
        "  %vr = and i64 %wide, 15",
        "  %whole = icmp eq i64 %vr, 0",
        "  br i1 %whole, label %pick, label %no",
        "pick:",
        "  %key = mul i64 %small, 16",
        "  %key2 = add i64 %key, %v",
        "  switch i64 %key2, label %no [",
    ]
    lines += [
        f"    i64 {si * 16 + v}, label %g{si}_{v}"
        for si in range(1, GRAM_SMALL + 1)
        for v in range(1, GRAM_VECTORS + 1)
    ]
    lines.append("  ]")
    for si in range(1, GRAM_SMALL + 1):
        for v in range(1, GRAM_VECTORS + 1):
            lines += [
                f"g{si}_{v}:",
                (
                    f"  call void @pj_sgram_{si}_{v}(ptr %w, i64 %ldw, ptr %s, i64 %lds, i64 %k, "
                    "ptr %c, i64 %ldc, i1 %widen)"
                ),
                "  ret i1 1",
            ]
    lines += ["no:", "  ret i1 0", "}", ""]
    out.append("\n".join(lines))
    return "\n".join(out)


def text() -> str:
    """The pool's LLVM IR (the runtime's own text, the same for every program)."""
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    body = (
        _POOL.replace("SPIN", str(SPIN))
        .replace("MAXSLEEP", str(MAX_SLEEP_US))
        .replace("PAUSE_DECLARE", "declare void @llvm.x86.sse2.pause()" if x86 else "")
        .replace("PAUSE_CALL", "  call void @llvm.x86.sse2.pause()" if x86 else "")
    )
    for w, t in (("s", "float"), ("d", "double")):
        area = GEMM_PARTIALS // (4 if w == "s" else 8)
        loads = _GEMM_ARGS.format(w=w, t=t)
        kcall = _KCALL_GRAM if w == "s" else _KCALL.format(t=t)
        fields = {
            "args": loads,
            "stores": _GEMM_STORES.format(t=t),
            "cols_load": _field("cols"),
            "cols_store": _field("cols", "%cols"),
            "cut_loads": _field("step") + _field("area"),
            "cut_stores": _field("step", "%step") + _field("area", "%parts"),
        }
        body += _GEMM.format(
            w=w, t=t, macs=GEMM_SPLIT_MACS, grain=GEMM_GRAIN, area=area, kcall=kcall, **fields
        )
    return body + _grams()


def threads() -> int:
    """The threads a run's kernels use: ``TIMERLC_THREADS``, else ``OMP_NUM_THREADS``, else
    the CPUs this process may run on (its affinity, its control group's quota; at most
    ``MAX_THREADS``). A value that is not a whole number above 0 is ignored."""
    for name in ("TIMERLC_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return min(int(value), MAX_THREADS)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, _quota(), MAX_THREADS))


def _quota() -> int:
    """The CPUs the process's control group lets it use at once (cgroup v2's ``cpu.max``:
    its quota over its period, rounded up), or ``MAX_THREADS`` where it sets none: a
    container of 8 CPUs' affinity but a quota of 2 gets 2 threads, not 8 that take turns."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota == "max":
            return MAX_THREADS
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return MAX_THREADS


# the pool's functions as ctypes types (for calls from Python: the tests, the scripts):
# tl_pool_run(fn, frame, lo, hi, grain, per), and a CBLAS gemm (row-major, 64-bit ints), as
# tl_pool_sgemm/tl_pool_dgemm and the BLAS's are
RUN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, *([ctypes.c_int64] * 4))


def gemm_type(which: str):
    """The ctypes type of a CBLAS ``sgemm`` (``which`` "s") or ``dgemm`` ("d")."""
    t = ctypes.c_float if which == "s" else ctypes.c_double
    i, p = ctypes.c_int64, ctypes.c_void_p
    return ctypes.CFUNCTYPE(None, *([ctypes.c_int32] * 3), i, i, i, t, p, i, p, i, t, p, i)


class Pool:
    """The process's pool (``get``): its functions' addresses and its workers."""

    def __init__(self, workers: int, blas: dict | None):
        from timerlc.runtime.native import (
            _llvm,
            cached_object,
            name_for_perf,
            target_machine,
        )

        llvm = _llvm()
        tm = target_machine()
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(cached_object(text(), "pool")))
        self.engine.finalize_object()
        name_for_perf(self.engine, text())
        self.workers = workers
        self.run = self.engine.get_function_address("tl_pool_run")
        self.gemm: dict[str, int] = {}
        if blas:
            for w in ("s", "d"):
                at = self.engine.get_global_value_address(f"tl_blas_{w}gemm")
                ctypes.c_void_p.from_address(at).value = blas[w]
                self.gemm[w] = self.engine.get_function_address(f"tl_pool_{w}gemm")
        self._live = ctypes.c_int32.from_address(self.engine.get_global_value_address("pj_live"))
        self._stop = ctypes.c_int32.from_address(self.engine.get_global_value_address("pj_stop"))
        self._taken = ctypes.c_int64.from_address(self.engine.get_global_value_address("pj_taken"))
        worker = ctypes.CFUNCTYPE(None)(self.engine.get_function_address("tl_pool_worker"))
        self._worker = worker  # (kept alive as long as the pool)
        self._threads = []
        # (a stack of known size: a row loop's chunk keeps its kernels' scratch memory there,
        # up to codegen.rows.CHUNK_SCRATCH bytes)
        old_size = threading.stack_size()
        try:
            threading.stack_size(WORKER_STACK)
            for j in range(workers):
                # ctypes lets go of the GIL for the call: the thread runs native code only
                t = threading.Thread(target=worker, name=f"timerlc-pool-{j}", daemon=True)
                t.start()
                self._threads.append(t)
        finally:
            threading.stack_size(old_size)
        self._live.value = workers
        _RUNNING.append(self)  # (its code must outlive its workers: until ``stop``)
        if workers and blas:
            from timerlc.runtime.native import blas_threads

            blas_threads(1)

    @property
    def taken(self) -> int:
        """The chunks the workers have run (the caller's own not counted)."""
        return self._taken.value

    def stop(self):
        """Stop the workers (the tests'): the pool's calls then run alone."""
        self._live.value = 0
        self._stop.value = 1
        for t in self._threads:
            t.join()
        self._threads = []
        if self in _RUNNING:
            _RUNNING.remove(self)

    def after_fork(self):
        """In a forked child: no worker runs there, so none is counted."""
        self._live.value = 0
        self._threads = []


_LOCK = threading.Lock()
_POOLS: list = []
_RUNNING: list = []  # every pool whose workers run (a worker runs the pool's code)


def get() -> Pool | None:
    """The process's pool, started at the first call where the kernels may use more than
    one thread (``threads``), else None."""
    if _POOLS:
        return _POOLS[0]
    with _LOCK:
        if not _POOLS:
            n = threads()
            pool = None
            if n == 1:
                # (one thread: the BLAS too, whose own threads would take every core and
                # spin there: two runs at once of REINFORCE-TD with TIMERLC_THREADS=1 took
                # 1.53 s of kernels each, 0.26 s alone)
                from timerlc.runtime.native import blas_threads

                blas_threads(1)
            elif n > 1:
                from timerlc.runtime.native import cblas

                try:
                    pool = Pool(n - 1, cblas())
                except Exception:  # noqa: BLE001 - (a platform whose libc LLVM cannot link)
                    pool = None  # the kernels then run on the caller's thread alone
                if pool is not None and hasattr(os, "register_at_fork"):
                    os.register_at_fork(after_in_child=pool.after_fork)
            _POOLS.append(pool)
    return _POOLS[0]
