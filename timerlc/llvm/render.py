"""Rendering kernels (``codegen.kir``) as LLVM IR text.

Each kernel becomes ``define i32 @NAME(ptr %table, ptr %args, ptr %scratch)``: its slots are
pointers loaded from ``table``, its temporaries offsets into ``scratch``, its arguments
i64 values of ``args``; every local (loop variables included) is an ``alloca`` that LLVM's
``mem2reg`` turns into registers. Scalars follow NumPy's semantics for their dtype (integer
division by zero gives 0, a float cast to an int out of range or nan gives the smallest
int, as NumPy does on x86; see ``docs/codegen.md``). Bools are ``i1`` in registers and one
byte in memory. No fast-math flags: floats round as NumPy's do, operation by operation.
"""

from __future__ import annotations

import dataclasses
import math
import struct

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Fail,
    Fn,
    For,
    Gemm,
    Host,
    If,
    Launch,
    Let,
    Load,
    Loop,
    Permute,
    Ref,
    Sel,
    Store,
    Un,
)
from timerlc.plan.items import (
    GEMM_FALLBACK,
    HOST_FAILED,
    KERNEL_FAILED,
    NO_STEPS_LEFT,
    OUTSIDE_BOX,
)

REG = {"bool": "i1", "i32": "i32", "i64": "i64", "f32": "float", "f64": "double"}
MEM = {"bool": "i8", "i32": "i32", "i64": "i64", "f32": "float", "f64": "double"}
_INT_MIN = {"i32": -(1 << 31), "i64": -(1 << 63)}
_FSUFFIX = {"f32": "f32", "f64": "f64"}
_LIBM = {
    ("tanh", "f32"): "tanhf",
    ("tanh", "f64"): "tanh",
    ("log1p", "f32"): "log1pf",
    ("log1p", "f64"): "log1p",
}
_INTRINSIC = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "sin": "sin",
    "cos": "cos",
    "floor": "floor",
    "ceil": "ceil",
    "round": "roundeven",
    "abs": "fabs",
    "pow": "pow",
    "trunc": "trunc",
}

# integer powers with NumPy's rules for negative exponents (0, but 1 and -1 for bases 1, -1)
_IPOW = """
define internal {t} @tl_ipow_{t}({t} %a, {t} %b) alwaysinline {{
entry:
  %neg = icmp slt {t} %b, 0
  br i1 %neg, label %negative, label %loop
negative:
  %one = icmp eq {t} %a, 1
  %mone = icmp eq {t} %a, -1
  %odd = and {t} %b, 1
  %isodd = icmp ne {t} %odd, 0
  %sgn = select i1 %isodd, {t} -1, {t} 1
  %r1 = select i1 %mone, {t} %sgn, {t} 0
  %r2 = select i1 %one, {t} 1, {t} %r1
  ret {t} %r2
loop:
  %acc = phi {t} [1, %entry], [%acc2, %next]
  %base = phi {t} [%a, %entry], [%base2, %next]
  %e = phi {t} [%b, %entry], [%e2, %next]
  %done = icmp eq {t} %e, 0
  br i1 %done, label %exit, label %next
next:
  %bit = and {t} %e, 1
  %set = icmp ne {t} %bit, 0
  %m = mul {t} %acc, %base
  %acc2 = select i1 %set, {t} %m, {t} %acc
  %base2 = mul {t} %base, %base
  %e2 = lshr {t} %e, 1
  br label %loop
exit:
  ret {t} %acc
}}
"""


# f32 exp, sigmoid, log and log1p without calls (so that loops over them vectorize),
# computed in f64 and rounded once: within an ulp of the exact value (the C library's and
# NumPy's are within one or two). f32 tanh in f32 arithmetic, 16 lanes to a vector: the odd
# rational approximation of degree 13/6 that Eigen and XLA use, on |x| clamped to 7.905
# (where it reaches 1), x itself below 4e-4; within 7 ulp (NumPy's: 1.4), relative error
# < 4e-7. exp: x = n ln2 + r (Cody and Waite's two-part ln2), e^r by its Taylor series to
# r^9 (|r| <= ln2 / 2: a relative error below 1e-11), 2^n from its bits; the argument
# clamped to [-110, 100], beyond which the f32 result is 0 or inf anyway. log: x = 2^k z
# with z in [sqrt(1/2), sqrt(2)) from the bits (every f32 is a normal f64), log z = 2
# atanh((z-1)/(z+1)) by its series; log1p(x) = log(u) x / (u - 1) for u = 1 + x (exact
# in f64 but for tiny x, where it is x), which keeps the relative precision of small x.
_F32_MATH = """
define internal double @tl_exp_f32range(double %x0) alwaysinline {{
  %low = fcmp olt double %x0, {m110}
  %x1 = select i1 %low, double {m110}, double %x0
  %high = fcmp ogt double %x1, {p100}
  %x = select i1 %high, double {p100}, double %x1
  %t = fmul double %x, {inv_ln2}
  %n = call double @llvm.rint.f64(double %t)
  %a = fmul double %n, {ln2_hi}
  %r0 = fsub double %x, %a
  %b = fmul double %n, {ln2_lo}
  %r = fsub double %r0, %b
{horner}
  %k = fptosi double %n to i64
  %k2 = add i64 %k, 1023
  %bits = shl i64 %k2, 52
  %scale = bitcast i64 %bits to double
  %res = fmul double %p0, %scale
  %nan = fcmp uno double %x0, %x0
  %out = select i1 %nan, double %x0, double %res
  ret double %out
}}

define internal float @tl_expf(float %x) alwaysinline {{
  %d = fpext float %x to double
  %e = call double @tl_exp_f32range(double %d)
  %r = fptrunc double %e to float
  ret float %r
}}

define internal double @tl_log_pos(double %x) alwaysinline {{
  %ix = bitcast double %x to i64
  %tmp = sub i64 %ix, 4604544271217802189
  %k = ashr i64 %tmp, 52
  %hi = and i64 %tmp, -4503599627370496
  %iz = sub i64 %ix, %hi
  %z = bitcast i64 %iz to double
  %f = fsub double %z, 1.0
  %den = fadd double %f, 2.0
  %s = fdiv double %f, %den
  %w = fmul double %s, %s
{log_horner}
  %s2 = fmul double %s, 2.0
  %lz = fmul double %s2, %lp0
  %kd = sitofp i64 %k to double
  %kl = fmul double %kd, {ln2}
  %r = fadd double %kl, %lz
  ret double %r
}}

; a logarithm's value %v at %x, but at the special values: -inf at the pole (x = %pole),
; nan below it, x itself for +inf and nan
define internal float @tl_log_edges(float %x, float %pole, float %v) alwaysinline {{
  %at = fcmp oeq float %x, %pole
  %r1 = select i1 %at, float 0xFFF0000000000000, float %v
  %below = fcmp olt float %x, %pole
  %r2 = select i1 %below, float 0x7FF8000000000000, float %r1
  %inf = fcmp oeq float %x, 0x7FF0000000000000
  %r3 = select i1 %inf, float %x, float %r2
  %nan = fcmp uno float %x, %x
  %r = select i1 %nan, float %x, float %r3
  ret float %r
}}

define internal float @tl_logf(float %x) alwaysinline {{
  %d = fpext float %x to double
  %pos = fcmp ogt double %d, 0.0
  %safe = select i1 %pos, double %d, double 1.0
  %l = call double @tl_log_pos(double %safe)
  %r0 = fptrunc double %l to float
  %r = call float @tl_log_edges(float %x, float 0.0, float %r0)
  ret float %r
}}

define internal float @tl_log1pf(float %x) alwaysinline {{
  %d = fpext float %x to double
  %u = fadd double %d, 1.0
  %pos = fcmp ogt double %u, 0.0
  %one = fcmp oeq double %u, 1.0
  %bad = xor i1 %one, true
  %okpos = and i1 %pos, %bad
  %safe = select i1 %okpos, double %u, double 2.0
  %l = call double @tl_log_pos(double %safe)
  %um1 = fsub double %safe, 1.0
  %q = fdiv double %d, %um1
  %lq = fmul double %l, %q
  %r0 = select i1 %one, double %d, double %lq
  %f0 = fptrunc double %r0 to float
  %r = call float @tl_log_edges(float %x, float -1.0, float %f0)
  ret float %r
}}

define internal float @tl_tanhf(float %x) alwaysinline {{
  %a = call float @llvm.fabs.f32(float %x)
  %big = fcmp ogt float %a, {clamp}
  %ac = select i1 %big, float {clamp}, float %a
  %x2 = fmul float %ac, %ac
{tanh_horner}
  %p = fmul float %pa0, %ac
  %r = fdiv float %p, %qb0
  %tiny = fcmp olt float %a, {tanh_tiny}
  %t0 = select i1 %tiny, float %a, float %r
  %t = select i1 %big, float 1.0, float %t0
  %s = call float @llvm.copysign.f32(float %t, float %x)
  ret float %s
}}

define internal float @tl_sigmoidf(float %x) alwaysinline {{
  %d = fpext float %x to double
  %n = fneg double %d
  %e = call double @tl_exp_f32range(double %n)
  %den = fadd double %e, 1.0
  %s = fdiv double 1.0, %den
  %r = fptrunc double %s to float
  ret float %r
}}
"""


def _f32_math() -> str:
    import math as m

    def h(x: float) -> str:
        return const(x, "f64")

    ln2_hi = float.fromhex("0x1.62e42fee00000p-1")  # n * ln2_hi is exact for |n| < 2^11
    # log(z) = 2 s P(s^2), P(w) = 1 + w/3 + ... + w^6/13, for s = (z-1)/(z+1): |s| <= 0.1716
    # where z lies in [sqrt(1/2), sqrt(2)) (an error below 1e-12)
    log_p = tuple(1 / (2 * k + 1) for k in range(7))
    return _F32_MATH.format(
        m110=h(-110.0),
        p100=h(100.0),
        inv_ln2=h(1 / m.log(2)),
        ln2_hi=h(ln2_hi),
        ln2_lo=h(m.log(2) - ln2_hi),
        horner=_horner("p", tuple(1 / m.factorial(k) for k in range(10)), "%r", "f64"),
        log_horner=_horner("lp", log_p, "%w", "f64"),
        ln2=h(m.log(2)),
        clamp=const(7.90531110763549805, "f32"),
        tanh_tiny=const(0.0004, "f32"),
        tanh_horner=_horner("pa", _TANH_P, "%x2", "f32")
        + "\n"
        + _horner("qb", _TANH_Q, "%x2", "f32"),
    )


# tanh(x) ~ x * P(x^2) / Q(x^2) on |x| <= 7.905 (Eigen's generic_fast_tanh_float)
_TANH_P = (
    4.89352455891786e-03,
    6.37261928875436e-04,
    1.48572235717979e-05,
    5.12229709037114e-08,
    -8.60467152213735e-11,
    2.00018790482477e-13,
    -2.76076847742355e-16,
)
_TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)


def _horner(stem: str, coefs: tuple, var: str, dtype: str) -> str:
    """``%{stem}0`` = the polynomial in ``var`` with ``coefs`` (lowest first), by Horner's
    rule in ``dtype`` (``f32`` or ``f64``). Its multiply-adds may fuse (``contract``: one
    rounding instead of two, as accurate or more; f32 tanh over 32768 values 13.2 -> 11.4
    us, its error 4.9 -> 3.8 ulp at most)."""
    t = REG[dtype]
    top = len(coefs) - 1
    lines = [f"  %{stem}{top} = fadd {t} 0.0, {const(coefs[top], dtype)}"]
    for k in range(top - 1, -1, -1):
        lines.append(f"  %{stem}m{k} = fmul contract {t} %{stem}{k + 1}, {var}")
        lines.append(f"  %{stem}{k} = fadd contract {t} %{stem}m{k}, {const(coefs[k], dtype)}")
    return "\n".join(lines)


# A kernel call of a tree function: the call's loop values (in args) must lie in the box,
# else code {outside}; a kernel's non-zero code becomes {failed}; either way err[1] gets the
# statement and err[2..] its loop values.
_LAUNCH = """
@tl_prof = global ptr null
declare i64 @llvm.readcyclecounter()

define i64 @tl_cycles() {{
  %c = call i64 @llvm.readcyclecounter()
  ret i64 %c
}}

; a profiled run: the cycles since c0 and one call counted at statement sid (a launch's, or
; a row loop's, whose chunks' calls count nothing: the threads would race on the counters)
define internal void @tl_counted(i64 %sid, i64 %c0) noinline {{
entry:
  %prof = load ptr, ptr @tl_prof
  %on = icmp ne ptr %prof, null
  br i1 %on, label %count, label %done
count:
  %c1 = call i64 @llvm.readcyclecounter()
  %dc = sub i64 %c1, %c0
  %i2 = shl i64 %sid, 1
  %pc = getelementptr i64, ptr %prof, i64 %i2
  %oc = load i64, ptr %pc
  %nc = add i64 %oc, %dc
  store i64 %nc, ptr %pc
  %i3 = add i64 %i2, 1
  %pn = getelementptr i64, ptr %prof, i64 %i3
  %on2 = load i64, ptr %pn
  %nn = add i64 %on2, 1
  store i64 %nn, ptr %pn
  br label %done
done:
  ret void
}}

define internal void @tl_record(ptr %err, i64 %sid, i64 %n, ptr %args) noinline {{
entry:
  %p = getelementptr i64, ptr %err, i64 1
  store i64 %sid, ptr %p
  br label %head
head:
  %j = phi i64 [ 0, %entry ], [ %j1, %body ]
  %more = icmp slt i64 %j, %n
  br i1 %more, label %body, label %done
body:
  %pa = getelementptr i64, ptr %args, i64 %j
  %v = load i64, ptr %pa
  %k = add i64 %j, 2
  %pe = getelementptr i64, ptr %err, i64 %k
  store i64 %v, ptr %pe
  %j1 = add i64 %j, 1
  br label %head
done:
  ret void
}}

"""

# A kernel call with its box check and its failure record (``_Function.launch``): ``name``
# ``tl_launch``, whose call a profiled run times (``_TIMED_CALL``), or ``tl_launch_rows``,
# a row loop's chunks' (``_PLAIN_CALL``: they count nothing, the threads would race on the
# counters; the loop is counted as one call, ``tl_counted``).
_LAUNCH_FN = """
define internal i32 @{name}(ptr %fn, ptr %table, ptr %args, ptr %scratch, ptr %err,
                               ptr %sids, i64 %nsids, i64 %n, ptr %box) noinline {{
entry:
  %sid = load i64, ptr %sids
  br label %head
head:
  %j = phi i64 [ 0, %entry ], [ %j1, %next ]
  %more = icmp slt i64 %j, %n
  br i1 %more, label %body, label %call
body:
  %pa = getelementptr i64, ptr %args, i64 %j
  %v = load i64, ptr %pa
  %pb = getelementptr i64, ptr %box, i64 %j
  %b = load i64, ptr %pb
  %low = icmp slt i64 %v, 0
  %high = icmp sge i64 %v, %b
  %out = or i1 %low, %high
  %j1 = add i64 %j, 1
  br i1 %out, label %outside, label %next
next:
  br label %head
outside:
  call void @tl_record(ptr %err, i64 %sid, i64 %n, ptr %args)
  ret i32 {outside}
call:
{call}  %bad = icmp ne i32 %r, 0
  br i1 %bad, label %failed, label %fine
failed:
  ; the n-th statement of a fused kernel returns n
  %r64 = sext i32 %r to i64
  %k = sub i64 %r64, 1
  %kin = icmp ult i64 %k, %nsids
  %kk = select i1 %kin, i64 %k, i64 0
  %pk = getelementptr i64, ptr %sids, i64 %kk
  %fsid = load i64, ptr %pk
  call void @tl_record(ptr %err, i64 %fsid, i64 %n, ptr %args)
  ret i32 {failed}
fine:
  ret i32 0
}}
"""

_TIMED_CALL = """  %prof = load ptr, ptr @tl_prof
  %on = icmp ne ptr %prof, null
  br i1 %on, label %timed, label %plain
plain:
  %r0 = call i32 %fn(ptr %table, ptr %args, ptr %scratch)
  br label %check
timed:
  %c0 = call i64 @llvm.readcyclecounter()
  %r1 = call i32 %fn(ptr %table, ptr %args, ptr %scratch)
  call void @tl_counted(i64 %sid, i64 %c0)
  br label %check
check:
  %r = phi i32 [ %r0, %plain ], [ %r1, %timed ]
"""

_PLAIN_CALL = """  %r = call i32 %fn(ptr %table, ptr %args, ptr %scratch)
"""


# A chunk of a row loop failed (``_Function.rows``): the first to claim the tree function's
# failure record fills it with the chunk's own (its statement and loop values, tl_record's).
_ROWS_FAILED = """
define internal void @tl_rows_failed(ptr %claim, ptr %err, ptr %errs, i64 %n) noinline {
entry:
  %got = cmpxchg ptr %claim, i64 0, i64 1 seq_cst seq_cst
  %won = extractvalue { i64, i1 } %got, 1
  br i1 %won, label %copy, label %done
copy:
  %ps = getelementptr i64, ptr %errs, i64 1
  %sid = load i64, ptr %ps
  %args = getelementptr i64, ptr %errs, i64 2
  %nargs = sub i64 %n, 2
  call void @tl_record(ptr %err, i64 %sid, i64 %nargs, ptr %args)
  br label %done
done:
  ret void
}
"""


# The gemm of a machine without a BLAS: the CBLAS row-major signature, c = op(a) @ op(b)
# (alpha 1 and beta 0: all the kernels pass), row by row, the inner loop along a row of b and
# of c. The kernels call @tl_sgemm/@tl_dgemm, which the runtime points at the BLAS's gemm or,
# where it finds none, at these loops; it compiles them only then (``GEMM_FALLBACK``:
# they were a tenth of LLVM's time on PPO).
_GEMM_LOOPS = """
define void @{fallback}{t}(i32 %order, i32 %ta, i32 %tb, i64 %m, i64 %n, i64 %k,
    {t} %alpha, ptr %a, i64 %lda, ptr %b, i64 %ldb, {t} %beta, ptr %c, i64 %ldc) noinline {{
entry:
  %tra = icmp eq i32 %ta, 112
  %trb = icmp eq i32 %tb, 112
  br label %ihead
ihead:
  %i = phi i64 [ 0, %entry ], [ %i1, %iend ]
  %imore = icmp slt i64 %i, %m
  br i1 %imore, label %clear, label %done
clear:
  %crow = mul i64 %i, %ldc
  br label %zhead
zhead:
  %z = phi i64 [ 0, %clear ], [ %z1, %zbody ]
  %zmore = icmp slt i64 %z, %n
  br i1 %zmore, label %zbody, label %khead
zbody:
  %zi = add i64 %crow, %z
  %zp = getelementptr {t}, ptr %c, i64 %zi
  store {t} 0.0, ptr %zp
  %z1 = add i64 %z, 1
  br label %zhead
khead:
  %kk = phi i64 [ 0, %zhead ], [ %kk1, %jend ]
  %kmore = icmp slt i64 %kk, %k
  br i1 %kmore, label %kbody, label %iend
kbody:
  %ia = mul i64 %i, %lda
  %ian = add i64 %ia, %kk
  %ka = mul i64 %kk, %lda
  %iat = add i64 %ka, %i
  %aidx = select i1 %tra, i64 %iat, i64 %ian
  %ap = getelementptr {t}, ptr %a, i64 %aidx
  %aik = load {t}, ptr %ap
  br label %jhead
jhead:
  %j = phi i64 [ 0, %kbody ], [ %j1, %jbody ]
  %jmore = icmp slt i64 %j, %n
  br i1 %jmore, label %jbody, label %jend
jbody:
  %kb = mul i64 %kk, %ldb
  %bn = add i64 %kb, %j
  %jb = mul i64 %j, %ldb
  %bt = add i64 %jb, %kk
  %bidx = select i1 %trb, i64 %bt, i64 %bn
  %bp = getelementptr {t}, ptr %b, i64 %bidx
  %bkj = load {t}, ptr %bp
  %prod = fmul {t} %aik, %bkj
  %ci = add i64 %crow, %j
  %cp = getelementptr {t}, ptr %c, i64 %ci
  %cv = load {t}, ptr %cp
  %sum = fadd {t} %cv, %prod
  store {t} %sum, ptr %cp
  %j1 = add i64 %j, 1
  br label %jhead
jend:
  %kk1 = add i64 %kk, 1
  br label %khead
iend:
  %i1 = add i64 %i, 1
  br label %ihead
done:
  ret void
}}
"""


_F32_INTRINSICS = (
    "declare double @llvm.rint.f64(double)",
    "declare float @llvm.fabs.f32(float)",
    "declare float @llvm.copysign.f32(float, float)",
)


def render_module(kernels: list[kir.Kernel], trees=(), library: str = "") -> str:
    """One LLVM module of ``kernels`` and ``trees`` (``library``: LLVM IR text the kernels'
    ``Fn`` calls need, such as the random draws)."""
    r = _Module()
    bodies = r.kernels(kernels) + [_Function(r, t).render() for t in trees]
    head = ["; generated by timerlc: the statements' kernels", ""]
    head += sorted(r.declares)
    # the BLAS's gemm (CBLAS, 64-bit ints), or the loops below where there is none: the
    # runtime sets these
    head += [f"@tl_{t}gemm = global ptr null" for t in sorted(r.gemm)]
    head += [f"@tl_{t}gemm1 = global ptr null" for t in sorted(r.gemm1)]
    head += [
        _GEMM_LOOPS.format(fallback=GEMM_FALLBACK, t={"s": "float", "d": "double"}[w])
        for w in sorted(r.gemm)
    ]
    head += [_IPOW.format(t=t) for t in sorted(r.ipow)]
    if r.launches:
        head += [
            f"@{name} = private unnamed_addr constant [{len(b)} x i64] "
            f"[{', '.join(f'i64 {n}' for n in b)}]"
            for b, name in r.boxes.items()
            if not (b and b[0] == "sids")
        ]
        head += [
            f"@{name} = private unnamed_addr constant [{len(b) - 1} x i64] "
            f"[{', '.join(f'i64 {n}' for n in b[1:])}]"
            for b, name in r.boxes.items()
            if b and b[0] == "sids"
        ]
        head.append(_LAUNCH.format())
        codes = {"outside": OUTSIDE_BOX, "failed": KERNEL_FAILED}
        head.append(_LAUNCH_FN.format(name="tl_launch", call=_TIMED_CALL, **codes))
        if r.rows:
            head.append(_LAUNCH_FN.format(name="tl_launch_rows", call=_PLAIN_CALL, **codes))
            head.append(_ROWS_FAILED)
    if r.f32_math:
        head += [d for d in _F32_INTRINSICS if d not in r.declares]
        head.append(_f32_math())
    if r.rng:
        from timerlc.llvm.philox import LIBRARY

        head.append(LIBRARY)
    if r.par:
        head.append(_PAR_RUN)
    return "\n".join(head + r.constants + [library] + bodies + r.metadata) + "\n"


class _Module:
    def __init__(self):
        self.declares: set[str] = set()
        self.ipow: set[str] = set()
        self.boxes: dict[tuple, str] = {}  # the loop boxes of the launches, as constants
        self.launches = False  # whether a tree function calls a kernel (tl_launch)
        self.gemm: set[str] = set()  # "s", "d": the gemm functions the kernels call
        self.gemm1: set[str] = set()  # those the row variants call (the BLAS on one thread)
        self.f32_math = False  # whether the kernels call tl_expf, tl_tanhf or tl_sigmoidf
        self.rng = False  # whether they draw random numbers (the library of llvm.philox)
        self.metadata: list[str] = []  # !N = ... lines (alias scopes)
        self.constants: list[str] = []  # the slot lists of kernels that share a body
        self.par = False  # whether a kernel hands a loop to the threads (``tl_par_run``)
        self.rows = False  # whether a tree function has a row loop (``tl_launch_rows``)

    def kernels(self, kernels) -> list[str]:
        """The functions of ``kernels``. Kernels that differ only in their buffers (the
        same ops on other tensors: an optimizer's update of each parameter, a layer's
        backward pass) share one body ``kN(table, args, scratch, slots)``, which finds its
        buffers at the table entries ``slots`` lists; each kernel's own function passes
        its list (a constant) to the body. LLVM compiles each body once."""
        shapes: dict[tuple, list] = {}
        for k in kernels:
            f = _Function(self, k)
            f.outer = not k.alone  # (a row variant runs on its chunk's thread)
            own, shared, rest = f.kernel_parts()
            key = (len(k.slots), rest, tuple(f.meta_lines))
            shapes.setdefault(key, []).append((k, own, shared, rest, f.meta_lines))
        out = []
        for n, members in enumerate(shapes.values()):
            k, own, shared, rest, meta = members[0]
            if len(members) == 1:
                out.append(self.place(own + rest.replace("@PAR.", f"@{k.name}.par"), meta))
                continue
            body = f"k{n}"
            rest = rest.replace("@PAR.", f"@{body}.par")
            out.append(self.place(shared.replace("@KBODY(", f"@{body}(", 1) + rest, meta))
            for k, *_ in members:
                idx = ", ".join(f"i64 {s.index}" for s in k.slots)
                self.constants.append(
                    f"@{k.name}.slots = private unnamed_addr constant [{len(k.slots)} x i64] "
                    f"[{idx}]"
                )
                out.append(
                    f"define i32 @{k.name}(ptr noalias %table, ptr noalias %args, "
                    "ptr noalias %scratch) noinline {\n"
                    f"  %r = call i32 @{body}(ptr %table, ptr %args, ptr %scratch, "
                    f"ptr @{k.name}.slots)\n"
                    "  ret i32 %r\n}\n"
                )
        return out

    def place(self, text: str, meta_lines: list[str]) -> str:
        """A function's text with its metadata (``!LOCALn``) numbered in the module's."""
        base = len(self.metadata)
        lines = list(meta_lines)
        for j in reversed(range(len(meta_lines))):  # !LOCAL12 before !LOCAL1
            text = text.replace(f"!LOCAL{j}", f"!{base + j}")
            lines = [line.replace(f"!LOCAL{j}", f"!{base + j}") for line in lines]
        self.metadata.extend(lines)
        return text

    def sids(self, sids: tuple) -> str:
        """A constant array of a launch's statements (one; a fused kernel's, in order)."""
        name = self.boxes.get(("sids",) + tuple(sids))
        if name is None:
            name = self.boxes[("sids",) + tuple(sids)] = f"tl_sids{len(self.boxes)}"
        return f"@{name}"

    def box(self, box: tuple) -> str:
        """A constant array of a launch's loop box (``ptr null`` for no loop dims)."""
        self.launches = True
        if not box:
            return "null"
        name = self.boxes.get(tuple(box))
        if name is None:
            name = self.boxes[tuple(box)] = f"tl_box{len(self.boxes)}"
        return f"@{name}"


class _Function:
    def __init__(self, module: _Module, k):
        self.m, self.k = module, k
        self.meta_lines: list[str] = []  # its metadata nodes, numbered !LOCALn
        self.lines: list[str] = []
        self.n = 0
        self.locals: dict[str, str] = {}  # name -> dtype
        self.ptr: dict[str, tuple[str, str]] = {}  # buffer -> (register, dtype)
        self.memo: dict = {}
        self.alias: dict[str, str] = {}  # buffer -> the alias metadata of its accesses
        self.outer = True  # not a loop's own function (``outline``): may hand loops out
        self.frames: list[str] = []  # the entry block's allocas of the loops' frames
        self.outlined: list[str] = []  # the functions of its loops the threads run
        self.chunk_of: kir.Rows | None = None  # the row loop of a chunk's function

    def tmp(self) -> str:
        self.n += 1
        return f"%v{self.n}"

    def label(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def emit(self, line: str):
        self.lines.append("  " + line)

    def render(self) -> str:
        """The function's text (a kernel in its own form: ``kernel_parts`` gives both)."""
        k = self.k
        if isinstance(k, kir.Tree):
            return self._tree()
        own, _, rest = self.kernel_parts()
        return own + rest

    def _entry(self) -> tuple[list[str], list[str]]:
        """The entry block's allocas of the function's locals, and its loads of the
        arguments (``params``) into theirs."""
        k = self.k
        for p in k.params:
            self.locals[p] = "i64"
        _collect_locals(k.body, self.locals)
        allocas = [f"  %l.{name} = alloca {REG[dt]}" for name, dt in self.locals.items()]
        args = []
        for j, p in enumerate(k.params):
            args.append(f"  %arg{j}.p = getelementptr i64, ptr %args, i64 {j}")
            args.append(f"  %arg{j} = load i64, ptr %arg{j}.p")
            args.append(f"  store i64 %arg{j}, ptr %l.{p}")
        return allocas, args

    def _tree(self) -> str:
        k = self.k
        allocas, args = self._entry()
        out = [
            # optnone: a tree is control code around its kernel calls; LLVM's O3 took 0.22
            # of its 1.2 s on PPO's trees for no time that a run could measure
            (
                f"define i32 @{k.name}(ptr %table, ptr %args, ptr %scratch, ptr %host, "
                "ptr %err) optnone noinline {"
            ),
            "entry:",
            *allocas,
            f"  %callargs = alloca [{kir.MAX_ARGS} x i64]",
            *args,
        ]
        self.stmts(k.body)
        self.emit("ret i32 0")
        out += self.frames  # (the row loops' frames and counts)
        return "\n".join(out + self.lines) + "\n}\n" + "".join(self.outlined)

    def kernel_parts(self) -> tuple[str, str, str]:
        """A kernel's function as (its own head and slots, the head and slots of a body
        that kernels of its shape share, the rest): ``own + rest`` is the kernel's
        function, ``shared + rest`` the shared body ``@KBODY(table, args, scratch, slots)``,
        which finds the buffers at the table entries ``slots`` lists (``_Module.kernels``).
        The rest names the buffers by position (``%p.s0``...), so that it is the same text
        for every kernel of the shape."""
        k = self.k
        allocas, args = self._entry()
        own = [
            (
                f"define i32 @{k.name}(ptr noalias %table, ptr noalias %args, "
                "ptr noalias %scratch) noinline {"
            ),
            "entry:",
        ]
        shared = [
            (
                "define i32 @KBODY(ptr noalias %table, ptr noalias %args, "
                "ptr noalias %scratch, ptr noalias %slots) noinline {"
            ),
            "entry:",
        ]
        for j, s in enumerate(k.slots):
            what = f"state {s.state}" if s.state else f"buffer {s.sid}.{s.out}"
            own.append(f"  ; s{j}: {s.name}, {what}")
            own.append(f"  %a.s{j} = getelementptr ptr, ptr %table, i64 {s.index}")
            own.append(f"  %p.s{j} = load ptr, ptr %a.s{j}")
            shared.append(f"  %i.s{j} = getelementptr i64, ptr %slots, i64 {j}")
            shared.append(f"  %x.s{j} = load i64, ptr %i.s{j}")
            shared.append(f"  %a.s{j} = getelementptr ptr, ptr %table, i64 %x.s{j}")
            shared.append(f"  %p.s{j} = load ptr, ptr %a.s{j}")
            self.ptr[s.name] = (f"%p.s{j}", s.dtype)
        out = list(allocas)
        for t in k.temps:
            out.append(f"  %p.{t.name} = getelementptr i8, ptr %scratch, i64 {t.offset}")
            self.ptr[t.name] = (f"%p.{t.name}", t.dtype)
        self.scopes(k)
        out += args
        self.stmts(k.body)
        self.emit("ret i32 0")
        out += self.frames
        rest = "\n".join(out + self.lines) + "\n}\n" + "".join(self.outlined)
        return "\n".join(own) + "\n", "\n".join(shared) + "\n", rest

    def scopes(self, k):
        """Alias scopes: each buffer of the kernel is memory of its own (the memory plan
        gives live buffers disjoint memory, temporaries are disjoint regions of the
        scratch area), but for the slots in ``k.shared`` (a donor's memory, taken by the
        statement's own buffer), which share one: LLVM vectorizes the loops without
        run-time overlap checks."""
        names = [s.name for s in k.slots] + [t.name for t in k.temps]
        if len(names) < 2:
            return
        group = {n: n for n in names}
        for n in k.shared:
            group[n] = "shared"
        domain = self.meta('distinct !{!SELF, !"timerlc buffers"}')
        scope = {}
        for g in dict.fromkeys(group.values()):
            scope[g] = self.meta(f"distinct !{{!SELF, {domain}}}")
        for n in names:
            mine = scope[group[n]]
            others = [v for g, v in scope.items() if g != group[n]]
            a = self.meta(f"!{{{mine}}}")
            b = self.meta("!{" + ", ".join(others) + "}") if others else None
            self.alias[n] = f", !alias.scope {a}" + (f", !noalias {b}" if b else "")

    def meta(self, body: str) -> str:
        """A new metadata node of the function (``!SELF`` in ``body``: its own name)."""
        name = f"!LOCAL{len(self.meta_lines)}"
        self.meta_lines.append(f"{name} = " + body.replace("!SELF", name))
        return name

    # ------------------------------------------------------------------ statements
    def stmts(self, body):
        for s in body:
            self.stmt(s)

    def stmt(self, s):
        if isinstance(s, Let):
            v = self.expr(s.value)
            self.emit(f"store {REG[s.dtype]} {v}, ptr %l.{s.name}")
            self.memo.clear()
        elif isinstance(s, Store):
            idx = self.expr(s.index)
            val = self.expr(s.value)
            reg, dt = self.ptr[s.buf]
            p = self.tmp()
            self.emit(f"{p} = getelementptr {MEM[dt]}, ptr {reg}, i64 {idx}")
            if dt == "bool":
                b = self.tmp()
                self.emit(f"{b} = zext i1 {val} to i8")
                val = b
            self.emit(f"store {MEM[dt]} {val}, ptr {p}{self.alias.get(s.buf, '')}")
            self.memo.clear()
        elif isinstance(s, For):
            own = self.outer and not isinstance(self.k, kir.Tree)
            private = _private(s, self.k) if own and s.parallel else frozenset()
            grain = own and threaded(s, private)
            if grain:
                self.outline(s, grain, private)
                return
            chunks = own and reduced(s)
            if chunks and self.outline_reduce(s, chunks):
                return
            if _tiny(s):  # its iterations one after another, the loop around innermost
                for v in range(int(s.lo.value), int(s.hi.value)):
                    self.emit(f"store i64 {v}, ptr %l.{s.var}")
                    self.memo.clear()
                    self.stmts(s.body)
                return
            self.for_(s, self.expr(s.lo), self.expr(s.hi))
        elif isinstance(s, If):
            c = self.expr(s.cond)
            then, other, done = self.label("then"), self.label("else"), self.label("fi")
            self.emit(f"br i1 {c}, label %{then}, label %{other}")
            self.memo.clear()
            self.lines.append(f"{then}:")
            self.stmts(s.then)
            self.emit(f"br label %{done}")
            self.memo.clear()
            self.lines.append(f"{other}:")
            self.stmts(s.orelse)
            self.emit(f"br label %{done}")
            self.memo.clear()
            self.lines.append(f"{done}:")
        elif isinstance(s, Fail):
            self.emit(f"ret i32 {int(s.code)}")
            self.lines.append(f"{self.label('dead')}:")
        elif isinstance(s, Loop):
            self.loop(s)
        elif isinstance(s, kir.Rows):
            self.rows(s)
        elif isinstance(s, Gemm):
            self.gemm(s)
        elif isinstance(s, Permute):
            self.m.rng = True
            p = self.expr(s.p)
            out, _ = self.ptr[s.out]
            scratch, _ = self.ptr[s.scratch]
            self.emit(
                f"call void @tl_rng_permutation(i32 {s.seed}, i32 {s.site}, i64 {p}, "
                f"i64 {s.n}, ptr {out}, ptr {scratch})"
            )
            self.memo.clear()
        elif isinstance(s, Launch):
            self.launch(s)
        elif isinstance(s, Host):
            self.args(s.args)
            r = self.op(f"call i32 %host(i64 {s.sid}, i64 {s.mode}, ptr %callargs)")
            self.fail_unless_zero(r, HOST_FAILED)
        else:  # pragma: no cover
            raise TypeError(f"not a kernel statement: {s!r}")

    def for_(self, s: For, lo: str, hi: str):
        """``s`` over ``lo ..< hi`` (values of the function)."""
        head, body, done = self.label("for"), self.label("body"), self.label("done")
        self.emit(f"store i64 {lo}, ptr %l.{s.var}")
        self.emit(f"br label %{head}")
        self.memo.clear()
        self.lines.append(f"{head}:")
        v, c = self.tmp(), self.tmp()
        self.emit(f"{v} = load i64, ptr %l.{s.var}")
        self.emit(f"{c} = icmp slt i64 {v}, {hi}")
        self.emit(f"br i1 {c}, label %{body}, label %{done}")
        self.lines.append(f"{body}:")
        self.stmts(s.body)
        self.memo.clear()
        v2, v3 = self.tmp(), self.tmp()
        self.emit(f"{v2} = load i64, ptr %l.{s.var}")
        self.emit(f"{v3} = add nsw i64 {v2}, 1")
        self.emit(f"store i64 {v3}, ptr %l.{s.var}")
        self.emit(f"br label %{head}")
        self.lines.append(f"{done}:")

    def outline(self, s: For, grain: int, private=frozenset()):
        """Parallel loop ``s`` as a function of its own, ``i32 @PAR.j(frame, lo, hi)`` over a
        range of its iterations, handed to the threads (``tl_par_run``: the pool's
        ``tl_pool_run``, or the function over the whole range where the runtime set no
        pool). The frame holds the kernel's pointers (its slots' and temporaries') and the
        locals the body reads but does not set, 8 bytes each; the function loads them back
        into registers and locals of its own."""
        self.m.par = True
        j = len(self.outlined)
        names = list(self.ptr)
        sets: dict[str, str] = {s.var: "i64"}
        _collect_locals(s.body, sets)
        reads = [n for n in dict.fromkeys(_refs(s.body)) if n not in sets]
        frame = f"%frame{j}"
        self.frames.append(f"  {frame} = alloca [{len(names) + len(reads) or 1} x i64]")
        lo, hi = self.expr(s.lo), self.expr(s.hi)
        for at, name in enumerate(names):
            p = self.op(f"getelementptr i64, ptr {frame}, i64 {at}")
            self.emit(f"store ptr {self.ptr[name][0]}, ptr {p}")
        for at, name in enumerate(reads, len(names)):
            t = REG[self.locals[name]]
            v = self.op(f"load {t}, ptr %l.{name}")
            p = self.op(f"getelementptr i64, ptr {frame}, i64 {at}")
            self.emit(f"store {t} {v}, ptr {p}")
        r = self.op(
            f"call i32 @tl_par_run(ptr @PAR.{j}, ptr {frame}, i64 {lo}, i64 {hi}, i64 {grain}, "
            f"i64 {PAR_PER})"
        )
        # a chunk that failed (``Fail``): the kernel fails with the code of the first such
        # chunk, as the serial loop would with its first failing iteration's
        self.memo.clear()
        self.return_unless_zero(r)
        # the loop's own function
        f = _Function(self.m, self.k)
        f.outer = False
        f.alias, f.meta_lines = self.alias, self.meta_lines
        f.locals = dict(sets)
        for name in reads:
            f.locals[name] = self.locals[name]
        head = [
            f"define i32 @PAR.{j}(ptr noalias %frame, i64 %lo, i64 %hi) noinline {{",
            "entry:",
        ]
        head += [f"  %l.{name} = alloca {REG[dt]}" for name, dt in f.locals.items()]
        temps = {t.name: t for t in self.k.temps}
        for at, name in enumerate(names):
            reg, dt = self.ptr[name]
            if name in private:  # (a chunk's own copy, ``_private``)
                t = temps[name]
                head.append(f"  {reg} = alloca [{t.size * kir.SIZES[t.dtype]} x i8], align 64")
            else:
                head.append(f"  %f.{at} = getelementptr i64, ptr %frame, i64 {at}")
                head.append(f"  {reg} = load ptr, ptr %f.{at}")
            f.ptr[name] = (reg, dt)
        for at, name in enumerate(reads, len(names)):
            t = REG[self.locals[name]]
            head.append(f"  %f.{at} = getelementptr i64, ptr %frame, i64 {at}")
            head.append(f"  %f.{at}.v = load {t}, ptr %f.{at}")
            head.append(f"  store {t} %f.{at}.v, ptr %l.{name}")
        f.for_(s, "%lo", "%hi")
        f.emit("ret i32 0")
        self.outlined.append("\n".join(head + f.lines) + "\n}\n")

    def outline_reduce(self, s: For, chunks: int) -> bool:
        """Reduction loop ``s`` (``For.reduce``) in ``chunks`` chunks of its iterations, the
        same number whatever the threads (``reduced``), handed to the threads as a
        function over a range of chunks (``outline``): each chunk sums its iterations in
        their order into accumulators of its own (its own copy of each temporary one, its
        elements first set to the op's identity), kept in a partial area of the kernel's
        frame, then the kernel adds the chunks' into its accumulators in chunk order. The
        terms are summed in another order than the loop's (``For.reduce``'s ops are
        associative: the IR lets a renderer), the same for every number of threads. False
        (nothing emitted) where the partial area would pass ``PAR_PARTIALS`` bytes."""
        temps = {t.name: t for t in self.k.temps}
        ops = dict(s.reduce)
        if any(
            (temps[n].dtype if n in temps else self.locals.get(n)) not in _IDENTITY for n in ops
        ):
            return False
        sizes = {n: temps[n].size if n in temps else 1 for n in ops}
        kinds = {n: temps[n].dtype if n in temps else self.locals[n] for n in ops}
        each = sum(sizes[n] * kir.SIZES[kinds[n]] for n in ops)
        if chunks * each > PAR_PARTIALS:
            return False
        j = len(self.outlined)
        # the partial area (in the entry block), a buffer ``part$j.NAME`` per accumulator
        area = f"%part{j}"
        self.frames.append(f"  {area} = alloca [{chunks * each} x i8], align 64")
        at = 0
        part = {}
        for n in ops:
            part[n] = f"part${j}.{n}"
            reg = f"%p.part{j}.{len(part)}"
            self.frames.append(f"  {reg} = getelementptr i8, ptr {area}, i64 {at}")
            self.ptr[part[n]] = (reg, kinds[n])
            at += chunks * sizes[n] * kir.SIZES[kinds[n]]
        trips = _trips(s)
        step = -(-trips // chunks)
        c, clo, chi = f"c${j}", f"clo${j}", f"chi${j}"

        def mine(x):  # a temporary accumulator's access, at its chunk's copy
            if isinstance(x, (Load, Store)) and x.buf in temps and x.buf in ops:
                base = Bin("mul", Ref(c), Const("i64", sizes[x.buf]), "i64")
                return dataclasses.replace(x, buf=part[x.buf], index=_add(base, x.index))
            return x

        first = Bin("add", Ref(clo), Bin("mul", Ref(c), Const("i64", step), "i64"), "i64")
        last = Bin("minimum", Ref(chi), _add(first, Const("i64", step)), "i64")
        body = []
        for n in ops:
            zero = Const(kinds[n], _IDENTITY[kinds[n]][ops[n]])
            if n in temps:
                i = f"i${j}"
                at_i = _add(Bin("mul", Ref(c), Const("i64", sizes[n]), "i64"), Ref(i))
                store = Store(part[n], at_i, zero)
                body.append(For(i, Const("i64", 0), Const("i64", sizes[n]), (store,)))
            else:
                body.append(Let(n, kinds[n], zero))
        body.append(dataclasses.replace(s, lo=first, hi=last, body=kir.rewrite(s.body, mine)))
        body += [Store(part[n], Ref(c), Ref(n, kinds[n])) for n in ops if n not in temps]
        chunk = For(c, Const("i64", 0), Const("i64", chunks), tuple(body))
        # the range's ends go in the frame as locals of the chunks' function
        self.locals[clo] = self.locals[chi] = "i64"
        self.frames.append(f"  %l.{clo} = alloca i64")
        self.frames.append(f"  %l.{chi} = alloca i64")
        self.emit(f"store i64 {self.expr(s.lo)}, ptr %l.{clo}")
        self.emit(f"store i64 {self.expr(s.hi)}, ptr %l.{chi}")
        self.memo.clear()
        self.outline(chunk, 1)
        # the chunks' accumulators into the kernel's, in chunk order
        combine = []
        for n, op in ops.items():
            if n in temps:
                i = f"i${j}"
                at_p = _add(Bin("mul", Ref(c), Const("i64", sizes[n]), "i64"), Ref(i))
                val = Bin(op, Load(n, Ref(i), kinds[n]), Load(part[n], at_p, kinds[n]), kinds[n])
                add = For(i, Const("i64", 0), Const("i64", sizes[n]), (Store(n, Ref(i), val),))
                combine.append(add)
            else:
                val = Bin(op, Ref(n, kinds[n]), Load(part[n], Ref(c), kinds[n]), kinds[n])
                combine.append(Let(n, kinds[n], val))
        for name in (c, f"i${j}"):
            if name not in self.locals:
                self.locals[name] = "i64"
                self.frames.append(f"  %l.{name} = alloca i64")
        self.for_(For(c, Const("i64", 0), Const("i64", chunks), tuple(combine)), "0", str(chunks))
        return True

    def gemm(self, s: Gemm):
        t = REG[s.dtype]
        which = "s" if s.dtype == "f32" else "d"
        self.m.gemm.add(which)
        # (a row variant's: the BLAS on the chunk's thread, not the pool's cut products)
        one = "1" if getattr(self.k, "alone", False) else ""
        if one:
            self.m.gemm1.add(which)
        fn = self.op(f"load ptr, ptr @tl_{which}gemm{one}")  # set by the runtime first
        ptrs = []
        for buf, off in ((s.a, s.aoff), (s.b, s.boff), (s.c, s.coff)):
            reg, _ = self.ptr[buf]
            o = self.expr(off)
            ptrs.append(self.op(f"getelementptr {t}, ptr {reg}, i64 {o}"))
        a, b, c = ptrs
        ta, tb = 112 if s.ta else 111, 112 if s.tb else 111  # CblasTrans, CblasNoTrans
        m = s.m if isinstance(s.m, int) else self.expr(s.m)
        self.emit(
            f"call void {fn}(i32 101, i32 {ta}, i32 {tb}, i64 {m}, i64 {s.n}, i64 {s.k}, "
            f"{t} 1.0, ptr {a}, i64 {s.lda}, ptr {b}, i64 {s.ldb}, {t} 0.0, ptr {c}, "
            f"i64 {s.ldc})"
        )
        self.memo.clear()

    # ------------------------------------------------------------------ tree items
    def args(self, exprs) -> list[str]:
        """The values of a call's loop dims, stored in ``%callargs``."""
        vals = [self.expr(a) for a in exprs]
        for j, v in enumerate(vals):
            p = self.op(f"getelementptr i64, ptr %callargs, i64 {j}")
            self.emit(f"store i64 {v}, ptr {p}")
        self.memo.clear()
        return vals

    def fail_unless_zero(self, r: str, code: int, sid=None, vals=()):
        bad = self.op(f"icmp ne i32 {r}, 0")
        fail, ok = self.label("fail"), self.label("ok")
        self.emit(f"br i1 {bad}, label %{fail}, label %{ok}")
        self.lines.append(f"{fail}:")
        if sid is not None:
            self.emit(f"store i64 {sid}, ptr {self.err(1)}")
            for j, v in enumerate(vals):
                self.emit(f"store i64 {v}, ptr {self.err(2 + j)}")
        self.emit(f"ret i32 {code}")
        self.lines.append(f"{ok}:")
        self.memo.clear()

    def err(self, j: int) -> str:
        errs = "%errs" if self.chunk_of is not None else "%err"
        return self.op(f"getelementptr i64, ptr {errs}, i64 {j}")

    def launch(self, s: Launch):
        """A kernel call through ``tl_launch`` (its box check, the call, the record of a
        failure): a few lines per call, so that a tree of hundreds of calls stays a small
        function for LLVM. In a row loop's chunk, the chunk's rows are the call's last two
        arguments (a row variant's, ``codegen.rows``), its failure record its own."""
        self.args(s.args)
        launch, err = "tl_launch", "%err"
        if self.chunk_of is not None:
            for j, v in enumerate(("%lo", "%hi"), len(s.args)):
                self.emit(
                    f"store i64 {v}, ptr {self.op(f'getelementptr i64, ptr %callargs, i64 {j}')}"
                )
            launch, err = "tl_launch_rows", "%errs"
        box = self.m.box(s.box)
        sids = s.sids or (s.sid,)
        r = self.op(
            f"call i32 @{launch}(ptr @{s.kernel}, ptr %table, ptr %callargs, ptr %scratch, "
            f"ptr {err}, ptr {self.m.sids(sids)}, i64 {len(sids)}, i64 {len(s.args)}, "
            f"ptr {box})"
        )
        self.return_unless_zero(r)
        self.memo.clear()

    def return_unless_zero(self, r: str):
        """Return code ``r`` (an i32 value) from the function where it is not 0."""
        bad = self.op(f"icmp ne i32 {r}, 0")
        fail, ok = self.label("fail"), self.label("ok")
        self.emit(f"br i1 {bad}, label %{fail}, label %{ok}")
        self.lines.append(f"{fail}:")
        if self.chunk_of is not None:  # (a row loop's chunk: the first to fail says where)
            self.emit(f"call void @tl_rows_failed(ptr %claim, ptr %err, ptr %errs, i64 {ERRS})")
        self.emit(f"ret i32 {r}")
        self.lines.append(f"{ok}:")

    def rows(self, s: kir.Rows):
        """Row loop ``s``: the steps its loop makes counted first (its condition reads only
        loop variables) and taken from the budget of loop steps; then, unless that runs
        out, its chunk's loop as a function of its own, ``i32 @NAME.rowsJ(frame, lo, hi)``
        over a range of the rows, handed to the threads (``tl_par_run``, at most
        ``ROWS_PER`` chunks a thread); else the loop as it runs on one thread. A chunk that
        fails (only where every chunk fails alike, ``codegen.rows``) stops, and the first
        to fail copies its failure record (``err``) to the function's. A profile counts the whole loop at its first statement
        (``tl_counted``); the chunks' calls count nothing (``tl_launch_rows``: the threads
        would race on the counters)."""
        self.m.par = self.m.rows = True
        j = len(self.outlined)
        loop = s.loop
        count = f"rows${j}.n"
        self.locals[count] = "i64"
        self.frames.append(f"  %l.{count} = alloca i64")
        self.emit(f"store i64 0, ptr %l.{count}")
        one_more = Let(count, "i64", Bin("add", Ref(count), kir.i64(1), "i64"))
        self.loop(dataclasses.replace(loop, body=(one_more,)), budget=False)
        p = self.err(0)
        left = self.op(f"load i64, ptr {p}")
        n = self.op(f"load i64, ptr %l.{count}")
        rest = self.op(f"sub i64 {left}, {n}")
        short = self.op(f"icmp slt i64 {rest}, 0")
        serial, par, done = self.label("serial"), self.label("chunks"), self.label("rowsdone")
        self.emit(f"br i1 {short}, label %{serial}, label %{par}")
        self.memo.clear()
        self.lines.append(f"{par}:")
        # the frame: the table, the failure record, the claim on it, the locals read
        reads = [x for x in dict.fromkeys(_refs(s.chunk)) if x != loop.var]
        frame = f"%rframe{j}"
        self.frames.append(f"  {frame} = alloca [{3 + len(reads)} x i64]")
        self.emit(f"store ptr %table, ptr {frame}")
        self.emit(f"store ptr %err, ptr {self.op(f'getelementptr i64, ptr {frame}, i64 1')}")
        self.emit(f"store i64 0, ptr {self.op(f'getelementptr i64, ptr {frame}, i64 2')}")
        for at, name in enumerate(reads, 3):
            val = self.op(f"load i64, ptr %l.{name}")
            self.emit(
                f"store i64 {val}, ptr {self.op(f'getelementptr i64, ptr {frame}, i64 {at}')}"
            )
        fn = f"@{self.k.name}.rows{j}"
        c0 = self.op("call i64 @llvm.readcyclecounter()")
        r = self.op(
            f"call i32 @tl_par_run(ptr {fn}, ptr {frame}, i64 {s.lo}, i64 {s.hi}, i64 {s.grain}, "
            f"i64 {ROWS_PER})"
        )
        if s.sids:  # (a profile: the whole loop's time at its first statement)
            self.emit(f"call void @tl_counted(i64 {s.sids[0]}, i64 {c0})")
        self.memo.clear()
        self.return_unless_zero(r)
        self.emit(f"store i64 {rest}, ptr {p}")
        self.emit(f"br label %{done}")
        self.memo.clear()
        self.lines.append(f"{serial}:")
        self.loop(loop)
        self.emit(f"br label %{done}")
        self.memo.clear()
        self.lines.append(f"{done}:")
        # the chunk's function
        f = _Function(self.m, self.k)
        f.outer = False
        f.chunk_of = s
        f.locals = {loop.var: "i64"}
        f.locals.update({name: "i64" for name in reads})
        head = [
            # (optnone: calls one after another, as a tree function's)
            f"define i32 {fn}(ptr noalias %frame, i64 %lo, i64 %hi) optnone noinline {{",
            "entry:",
            *[f"  %l.{name} = alloca {REG[dt]}" for name, dt in f.locals.items()],
            f"  %callargs = alloca [{kir.MAX_ARGS + 2} x i64]",
            f"  %errs = alloca [{ERRS} x i64]",
            f"  %scratch = alloca [{max(s.scratch, 8)} x i8], align 64",
            "  %table = load ptr, ptr %frame",
            "  %f.err = getelementptr i64, ptr %frame, i64 1",
            "  %err = load ptr, ptr %f.err",
            "  %claim = getelementptr i64, ptr %frame, i64 2",
        ]
        for at, name in enumerate(reads, 3):
            head.append(f"  %f.{at} = getelementptr i64, ptr %frame, i64 {at}")
            head.append(f"  %f.{at}.v = load i64, ptr %f.{at}")
            head.append(f"  store i64 %f.{at}.v, ptr %l.{name}")
        f.loop(s.chunk, budget=False)
        f.emit("ret i32 0")
        self.outlined.append("\n".join(head + f.lines) + "\n}\n")

    def loop(self, s: Loop, budget: bool = True):
        init = self.expr(s.init)
        self.emit(f"store i64 {init}, ptr %l.{s.var}")
        head, body, done = self.label("loop"), self.label("step"), self.label("end")
        self.emit(f"br label %{head}")
        self.memo.clear()
        self.lines.append(f"{head}:")
        c = self.expr(s.cond)
        self.emit(f"br i1 {c}, label %{body}, label %{done}")
        self.memo.clear()
        self.lines.append(f"{body}:")
        if budget:
            # a step of the budget of loop steps (a plan's loops cannot run on and on)
            p = self.err(0)
            left = self.op(f"load i64, ptr {p}")
            left1 = self.op(f"sub i64 {left}, 1")
            self.emit(f"store i64 {left1}, ptr {p}")
            out = self.op(f"icmp slt i64 {left1}, 0")
            code = self.op(f"zext i1 {out} to i32")
            self.fail_unless_zero(code, NO_STEPS_LEFT)
        self.stmts(s.body)
        self.memo.clear()
        v = self.op(f"load i64, ptr %l.{s.var}")
        v2 = self.op(f"add i64 {v}, {int(s.inc)}")
        self.emit(f"store i64 {v2}, ptr %l.{s.var}")
        self.emit(f"br label %{head}")
        self.lines.append(f"{done}:")

    # ------------------------------------------------------------------ expressions
    def expr(self, e) -> str:
        if isinstance(e, Const):
            return const(e.value, e.dtype)
        key = e
        got = self.memo.get(key)
        if got is not None:
            return got
        v = self._expr(e)
        self.memo[key] = v
        return v

    def call(self, ret: str, name: str, args: list[tuple[str, str]]) -> str:
        """A call of ``name`` (declared on first use)."""
        sig = ", ".join(t for t, _ in args)
        if name.startswith("llvm.") or not name.startswith("tl_"):
            self.m.declares.add(f"declare {ret} @{name}({sig})")
        v = self.tmp()
        self.emit(f"{v} = call {ret} @{name}({', '.join(f'{t} {a}' for t, a in args)})")
        return v

    def op(self, text: str) -> str:
        v = self.tmp()
        self.emit(f"{v} = {text}")
        return v

    def _expr(self, e) -> str:
        if isinstance(e, Ref):
            return self.op(f"load {REG[e.dtype]}, ptr %l.{e.name}")
        if isinstance(e, Load):
            idx = self.expr(e.index)
            reg, dt = self.ptr[e.buf]
            p = self.op(f"getelementptr {MEM[dt]}, ptr {reg}, i64 {idx}")
            v = self.op(f"load {MEM[dt]}, ptr {p}{self.alias.get(e.buf, '')}")
            if dt == "bool":
                return self.op(f"icmp ne i8 {v}, 0")
            return v
        if isinstance(e, Cast):
            return self.cast(self.expr(e.x), e.x.dtype, e.dtype)
        if isinstance(e, Sel):
            c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
            return self.op(f"select i1 {c}, {REG[e.dtype]} {a}, {REG[e.dtype]} {b}")
        if isinstance(e, Un):
            return self.unary(e.op, self.expr(e.x), e.x.dtype)
        if isinstance(e, Bin):
            return self.binary(e.op, self.expr(e.a), self.expr(e.b), e.a.dtype)
        if isinstance(e, Fn):
            if e.name.startswith("tl_rng_"):
                self.m.rng = True
            args = [(REG[a.dtype], self.expr(a)) for a in e.args]
            return self.call(REG[e.dtype], e.name, args)
        raise TypeError(f"not a kernel expression: {e!r}")

    def cast(self, v: str, src: str, dst: str) -> str:
        if src == dst:
            return v
        s, d = REG[src], REG[dst]
        if dst == "bool":
            if src in ("f32", "f64"):
                return self.op(f"fcmp une {s} {v}, 0.0")
            return self.op(f"icmp ne {s} {v}, 0")
        if src == "bool":
            if dst in ("f32", "f64"):
                return self.op(f"uitofp i1 {v} to {d}")
            return self.op(f"zext i1 {v} to {d}")
        if src in ("f32", "f64") and dst in ("f32", "f64"):
            return self.op(f"{'fpext' if dst == 'f64' else 'fptrunc'} {s} {v} to {d}")
        if dst in ("f32", "f64"):
            return self.op(f"sitofp {s} {v} to {d}")
        if src in ("i32", "i64"):
            if src == "i64" and dst == "i32":
                return self.op(f"trunc i64 {v} to i32")
            return self.op(f"sext i32 {v} to i64")
        # float -> int: NumPy (x86) gives the smallest int for nan and out of range
        t = self.call(s, f"llvm.trunc.{_FSUFFIX[src]}", [(s, v)])
        lo = const(float(_INT_MIN[dst]), src)
        hi = const(-float(_INT_MIN[dst]), src)
        ok1 = self.op(f"fcmp oge {s} {t}, {lo}")
        ok2 = self.op(f"fcmp olt {s} {t}, {hi}")
        ok = self.op(f"and i1 {ok1}, {ok2}")
        safe = self.op(f"select i1 {ok}, {s} {t}, {s} 0.0")
        i = self.op(f"fptosi {s} {safe} to {d}")
        return self.op(f"select i1 {ok}, {d} {i}, {d} {_INT_MIN[dst]}")

    def unary(self, op: str, v: str, dt: str) -> str:
        t = REG[dt]
        isf = dt in ("f32", "f64")
        if op == "not":
            return self.op(f"xor i1 {v}, true")
        if op == "neg":
            return self.op(f"fneg {t} {v}") if isf else self.op(f"sub {t} 0, {v}")
        if op == "abs":
            if isf:
                return self.call(t, f"llvm.fabs.{_FSUFFIX[dt]}", [(t, v)])
            n = self.op(f"sub {t} 0, {v}")
            c = self.op(f"icmp slt {t} {v}, 0")
            return self.op(f"select i1 {c}, {t} {n}, {t} {v}")
        if op == "sign":
            if isf:
                pos = self.op(f"fcmp ogt {t} {v}, 0.0")
                neg = self.op(f"fcmp olt {t} {v}, 0.0")
                r = self.op(f"select i1 {neg}, {t} -1.0, {t} {v}")
                return self.op(f"select i1 {pos}, {t} 1.0, {t} {r}")
            pos = self.op(f"icmp sgt {t} {v}, 0")
            neg = self.op(f"icmp slt {t} {v}, 0")
            p = self.op(f"zext i1 {pos} to {t}")
            n = self.op(f"zext i1 {neg} to {t}")
            return self.op(f"sub {t} {p}, {n}")
        if dt == "f32" and op in ("exp", "tanh", "sigmoid", "log", "log1p"):
            self.m.f32_math = True
            return self.call(t, f"tl_{op}f", [(t, v)])
        if op == "sigmoid":
            a = self.call(t, f"llvm.fabs.{_FSUFFIX[dt]}", [(t, v)])
            na = self.op(f"fneg {t} {a}")
            e = self.call(t, f"llvm.exp.{_FSUFFIX[dt]}", [(t, na)])
            one = self.op(f"fadd {t} 1.0, {e}")
            p = self.op(f"fdiv {t} 1.0, {one}")
            q = self.op(f"fdiv {t} {e}, {one}")
            c = self.op(f"fcmp oge {t} {v}, 0.0")
            return self.op(f"select i1 {c}, {t} {p}, {t} {q}")
        if (op, dt) in _LIBM:
            return self.call(t, _LIBM[(op, dt)], [(t, v)])
        if op in _INTRINSIC and isf:
            return self.call(t, f"llvm.{_INTRINSIC[op]}.{_FSUFFIX[dt]}", [(t, v)])
        raise ValueError(f"no {op} for {dt}")

    def binary(self, op: str, a: str, b: str, dt: str) -> str:
        t = REG[dt]
        isf = dt in ("f32", "f64")
        if op in kir.COMPARE:
            if isf:
                cc = {
                    "lt": "olt",
                    "le": "ole",
                    "gt": "ogt",
                    "ge": "oge",
                    "eq": "oeq",
                    "ne": "une",
                }[op]
                return self.op(f"fcmp {cc} {t} {a}, {b}")
            sign = "u" if dt == "bool" else "s"
            cc = {
                "lt": f"{sign}lt",
                "le": f"{sign}le",
                "gt": f"{sign}gt",
                "ge": f"{sign}ge",
                "eq": "eq",
                "ne": "ne",
            }[op]
            return self.op(f"icmp {cc} {t} {a}, {b}")
        if op in ("and", "or"):
            return self.op(f"{op} i1 {a}, {b}")
        if op in ("add", "sub", "mul"):
            return self.op(f"{'f' if isf else ''}{op} {t} {a}, {b}")
        if op == "div":
            return self.op(f"fdiv {t} {a}, {b}")
        if op in ("minimum", "maximum"):
            if dt == "bool":
                return self.op(f"{'and' if op == 'minimum' else 'or'} i1 {a}, {b}")
            if isf:  # NumPy: a nan on either side wins
                cc = "oge" if op == "maximum" else "ole"
                c = self.op(f"fcmp {cc} {t} {a}, {b}")
                n = self.op(f"fcmp uno {t} {a}, {a}")
                c = self.op(f"or i1 {c}, {n}")
            else:
                c = self.op(f"icmp {'sge' if op == 'maximum' else 'sle'} {t} {a}, {b}")
            return self.op(f"select i1 {c}, {t} {a}, {t} {b}")
        if op == "pow":
            if isf:
                return self.call(t, f"llvm.pow.{_FSUFFIX[dt]}", [(t, a), (t, b)])
            self.m.ipow.add(t)
            return self.call(t, f"tl_ipow_{t}", [(t, a), (t, b)])
        if op == "rem":
            return self.op(f"srem {t} {a}, {b}")
        if op == "floordiv":
            if isf:
                q = self.op(f"fdiv {t} {a}, {b}")
                return self.call(t, f"llvm.floor.{_FSUFFIX[dt]}", [(t, q)])
            return self.int_floordiv(a, b, t)
        if op == "mod":
            return self.float_mod(a, b, t) if isf else self.int_mod(a, b, t)
        raise ValueError(f"no {op} for {dt}")

    def _divisor(self, b: str, t: str) -> tuple[str, str | None, str | None]:
        """A divisor ``sdiv``/``srem`` can take (1 where ``b`` is 0 or -1: LLVM's
        division by 0 and of the smallest int by -1 are undefined), and whether ``b`` is 0,
        whether it is -1 (None, None: a positive constant, an index's divisor)."""
        if b.lstrip("-").isdigit() and int(b) > 0:
            return b, None, None
        zero = self.op(f"icmp eq {t} {b}, 0")
        mone = self.op(f"icmp eq {t} {b}, -1")
        bad = self.op(f"or i1 {zero}, {mone}")
        return self.op(f"select i1 {bad}, {t} 1, {t} {b}"), zero, mone

    def _remainder(self, a: str, b: str, t: str) -> tuple[str, str]:
        """C's remainder of ``a / b`` (``b`` a safe divisor), and whether the floor differs
        from C's truncation there (a non-zero remainder of the other sign than ``b``)."""
        r = self.op(f"srem {t} {a}, {b}")
        nz = self.op(f"icmp ne {t} {r}, 0")
        x = self.op(f"xor {t} {r}, {b}")
        opp = self.op(f"icmp slt {t} {x}, 0")
        return r, self.op(f"and i1 {nz}, {opp}")

    def int_floordiv(self, a: str, b: str, t: str) -> str:
        bs, zero, mone = self._divisor(b, t)
        q = self.op(f"sdiv {t} {a}, {bs}")
        _, below = self._remainder(a, bs, t)
        q1 = self.op(f"sub {t} {q}, 1")
        q = self.op(f"select i1 {below}, {t} {q1}, {t} {q}")
        if zero is None:
            return q
        # NumPy: by -1, the negation (wrapping at the smallest int); by 0, 0
        na = self.op(f"sub {t} 0, {a}")
        q = self.op(f"select i1 {mone}, {t} {na}, {t} {q}")
        return self.op(f"select i1 {zero}, {t} 0, {t} {q}")

    def int_mod(self, a: str, b: str, t: str) -> str:
        bs, zero, mone = self._divisor(b, t)
        r, below = self._remainder(a, bs, t)
        r1 = self.op(f"add {t} {r}, {bs}")
        r = self.op(f"select i1 {below}, {t} {r1}, {t} {r}")
        if zero is None:
            return r
        bad = self.op(f"or i1 {zero}, {mone}")  # NumPy: 0 by 0 and by -1
        return self.op(f"select i1 {bad}, {t} 0, {t} {r}")

    def float_mod(self, a: str, b: str, t: str) -> str:
        # NumPy: the remainder has the divisor's sign (a zero too); mod by 0 is nan
        r = self.op(f"frem {t} {a}, {b}")
        nz = self.op(f"fcmp une {t} {r}, 0.0")
        rn = self.op(f"fcmp olt {t} {r}, 0.0")
        bn = self.op(f"fcmp olt {t} {b}, 0.0")
        opp = self.op(f"xor i1 {rn}, {bn}")
        adj = self.op(f"and i1 {nz}, {opp}")
        r1 = self.op(f"fadd {t} {r}, {b}")
        r2 = self.op(f"select i1 {adj}, {t} {r1}, {t} {r}")
        z = self.call(
            t, f"llvm.copysign.{_FSUFFIX['f32' if t == 'float' else 'f64']}", [(t, "0.0"), (t, b)]
        )
        return self.op(f"select i1 {nz}, {t} {r2}, {t} {z}")


# A kernel's parallel loop with at least PAR_WORK stores and lets to run (its iterations'
# together, inner loops counted) is handed to the threads (``_Function.outline``,
# ``runtime.pool``) in chunks of at least PAR_CHUNK of them: measured on this project's
# 2-core machine, a tanh over 32,768 floats 52 -> 30 us on two threads, over 524,288 floats
# 823 -> 424 us
PAR_WORK = 32768
PAR_CHUNK = 8192
PAR_PER = 4  # the most chunks of a kernel's loop a thread takes (``tl_par_run``)
ROWS_PER = 2  # the most chunks of a row loop a thread takes
ERRS = 2 + kir.MAX_ARGS  # i64 values of a failure record: steps left, statement, loop values

_PAR_RUN = """
; the threads' pool (runtime.pool's tl_pool_run), set by the runtime; null: none
@tl_par = global ptr null

; fn over lo ..< hi in chunks of at least grain iterations, at most per a thread (a kernel's
; loop: PAR_PER; a row loop's chunks, each the whole loop over its rows: ROWS_PER)
define internal i32 @tl_par_run(ptr %fn, ptr %frame, i64 %lo, i64 %hi, i64 %grain, i64 %per) {
  %p = load ptr, ptr @tl_par
  %none = icmp eq ptr %p, null
  br i1 %none, label %alone, label %pool
alone:
  %r = call i32 %fn(ptr %frame, i64 %lo, i64 %hi)
  ret i32 %r
pool:
  %r2 = call i32 %p(ptr %fn, ptr %frame, i64 %lo, i64 %hi, i64 %grain, i64 %per)
  ret i32 %r2
}

"""


def threaded(s: For, private=frozenset()) -> int:
    """The fewest iterations of a chunk where parallel loop ``s`` is handed to the threads
    (``_Function.outline``), else 0: it must be marked parallel (``kir.For.parallel``), over
    a constant number of iterations, with at least ``PAR_WORK`` stores and lets in all
    (inner loops over constant ranges), no call of the runtime, no product, and each
    iteration's stores must fall in a span of their buffers of its own (``_own_stores``).
    The temporaries in ``private`` (``_private``: each chunk gets a copy of its own) are
    left out of the stores' check. A failure (``Fail``) may be inside: a chunk stops at its
    first, the others run on, and the kernel fails with the code of the first chunk that
    failed, the code the serial loop's first failing iteration gives (the call's outputs are
    not recorded then, and the runtime computes the call again to name the point,
    ``CpuRuntime``'s ``rerun``)."""
    if not s.parallel or s.reduce:
        return 0
    work = _enough(s)
    if work is None or not _own_stores(s, private):
        return 0
    return max(1, -(-PAR_CHUNK // work[1]))


# an innermost loop of at most TINY_TRIPS iterations over constants, of at most TINY_BODY
# statements, is written out iteration by iteration (``_tiny``): the loop around it is then
# the innermost, which LLVM's loop vectorizer takes, where a loop of two iterations it left
# alone: PPO's Gumbel noise at 256 x 128 (two draws for each of 32,768 points) 640 -> 195
# us on two threads, REINFORCE's log-softmax of the rollout 500 -> 84 us; PPO's compile
# 1.74 -> 1.82 s (more loops vectorized)
TINY_TRIPS = 4
TINY_BODY = 4


def _tiny(s: For) -> bool:
    """Whether loop ``s`` is written out iteration by iteration: constant bounds, at most
    ``TINY_TRIPS`` iterations, a body of at most ``TINY_BODY`` statements with no loop
    inside (the values are the loop's: the same statements in the same order)."""
    if not (isinstance(s.lo, Const) and isinstance(s.hi, Const)):
        return False
    if int(s.hi.value) - int(s.lo.value) > TINY_TRIPS or len(s.body) > TINY_BODY:
        return False
    return not any(isinstance(x, (For, Loop)) for x in kir.walk_tree(s.body))


def _enough(s: For) -> tuple[int, int] | None:
    """(iterations, stores and lets of one) of loop ``s`` where it has at least two
    iterations, a constant number of them (``_trips``), nothing a thread may not run
    (``_work``) and ``PAR_WORK`` stores and lets in all; else None."""
    trips = _trips(s)
    each = _work(s.body)
    if each is None or trips < 2 or trips * each < PAR_WORK:
        return None
    return trips, each


def _trips(s: For) -> int:
    """The iterations of loop ``s``: ``hi - lo`` where that is a constant (its bounds may
    move with the loops around it: a block's rows), else 0."""
    lo, hi = _affine(s.lo), _affine(s.hi)
    if lo is None or hi is None:
        return 0
    for k, v in lo.items():
        hi[k] = hi.get(k, 0) - v
    if any(v for k, v in hi.items() if k is not None):
        return 0
    return max(0, hi.get(None, 0))


# a reduction loop (``For.reduce``) with at least PAR_WORK stores and lets to run goes to the
# threads in chunks of about PAR_CHUNK of them, at least 2 and at most PAR_REDUCE_CHUNKS
# (``_Function.outline_reduce``), with at most PAR_PARTIALS bytes of the chunks' accumulators
PAR_REDUCE_CHUNKS = 16
PAR_PARTIALS = 1 << 18
# each reduction op's identity, by dtype: a chunk's accumulators start there
_IDENTITY = {
    "f32": {"add": 0.0, "mul": 1.0, "maximum": -math.inf, "minimum": math.inf},
    "f64": {"add": 0.0, "mul": 1.0, "maximum": -math.inf, "minimum": math.inf},
    "i32": {"add": 0, "mul": 1, "maximum": -(1 << 31), "minimum": (1 << 31) - 1},
    "i64": {"add": 0, "mul": 1, "maximum": -(1 << 63), "minimum": (1 << 63) - 1},
}


def reduced(s: For) -> int:
    """The chunks a reduction loop ``s`` is run in by the threads
    (``_Function.outline_reduce``), else 0: a loop marked ``reduce`` over a constant number
    of iterations, with at least ``PAR_WORK`` stores and lets in all, none but the
    accumulators' (``acc = op(acc, x)``, ``t[i] = op(t[i], x)``) and the inner loops'
    variables, nothing a thread may not run (``_work``). The chunks depend on the loop's
    work only, not on the threads: so do the sums."""
    if s.parallel or not s.reduce:
        return 0
    work = _enough(s)
    if work is None:
        return 0
    trips, each = work
    accs = {n for n, _ in s.reduce}
    own = _iteration_lets(s.body, accs)
    for x in kir.walk_tree(s.body):
        if isinstance(x, Let) and x.name not in accs and x.name not in own:
            return 0
        if isinstance(x, Store) and x.buf not in accs:
            return 0
    return max(2, min(PAR_REDUCE_CHUNKS, trips * each // PAR_CHUNK, trips))


def _iteration_lets(body, accs) -> set:
    """The locals ``body`` sets once, each before any read of it in the same block and read
    nowhere else: an iteration's own (a gram chain's value at its point,
    ``codegen.grams``), which a chunk of a reduction may hold in locals of its own."""
    sets: dict[str, int] = {}
    reads: dict[str, int] = {}
    for x in kir.walk_tree(body):
        if isinstance(x, Let):
            sets[x.name] = sets.get(x.name, 0) + 1
        for name in _refs(kir.own_exprs(x)):
            reads[name] = reads.get(name, 0) + 1
    own = set()

    def visit(block):
        for j, x in enumerate(block):
            if isinstance(x, Let) and x.name not in accs and sets.get(x.name) == 1:
                after = sum(1 for name in _refs(_exprs_of(block[j + 1 :])) if name == x.name)
                mine = sum(1 for name in _refs(x.value) if name == x.name)
                if mine == 0 and after == reads.get(x.name, 0):
                    own.add(x.name)
            for inner in (x.body,) if isinstance(x, For) else ():
                visit(inner)

    visit(body)
    return own


def _exprs_of(body) -> tuple:
    """Every expression of ``body``'s statements, theirs inside included."""
    return tuple(e for x in kir.walk_tree(body) for e in kir.own_exprs(x))


def _add(a, b):
    return Bin("add", a, b, "i64")


# what a loop's work (``_work``) counts for a call, in stores: one of the module's own f32
# functions (``tl_expf``, ``tl_tanhf``, ...) or a random draw (both vectorized, a few ns)
# COSTLY_WORK; one of the C library (f64 ``exp``, ``sin``, ``cos``, ``pow``) or a random
# draw under a condition LIBRARY_WORK. A loop of such calls pays for the hand-over to the
# threads with fewer iterations: REINFORCE 256 x 128's rollout, 256 environments' tanh layer
# a step, its statements 0.132-0.150 -> 0.124-0.127 s for 40 iterations at COSTLY_WORK 4
# (PPO and REINFORCE at 16 x 128 unchanged, three alternations); CartPole's step over 256
# environments (a cos and a sin each, four draws at a reset) at LIBRARY_WORK 16,
# 0.114-0.124 -> 0.107-0.117 s. The draws of PPO 16 x 128's noise (4,096) on the threads
# made its iterations slower (0.051-0.053 -> 0.055-0.057 s of statements, five alternations)
COSTLY_WORK = 4
LIBRARY_WORK = 16
_OWN_F32 = frozenset({"exp", "log", "log1p", "tanh", "sigmoid"})  # (tl_expf, ...)
_LIBRARY = frozenset({"exp", "log", "log1p", "tanh", "sigmoid", "sin", "cos"})


def _costly(e, branch: bool = False) -> int:
    """What the calls in expression ``e`` count in a loop's work (``_work``); ``branch``:
    the expression is under a condition, where a random draw is not vectorized."""
    if isinstance(e, Fn):
        own = LIBRARY_WORK if branch else COSTLY_WORK
    elif isinstance(e, Un) and e.op in _OWN_F32 and e.dtype == "f32":
        own = COSTLY_WORK
    elif isinstance(e, Un) and e.op in _LIBRARY:
        own = LIBRARY_WORK
    else:
        own = LIBRARY_WORK if isinstance(e, Bin) and e.op == "pow" else 0
    return own + sum(_costly(x, branch) for x in kir.children(e))


def _work(body, branch: bool = False) -> int | None:
    """The work of one run of ``body``: its stores and lets, and the calls in them
    (``_costly``) (None: a statement a thread may not run, or a loop over a range that is
    not constant)."""
    n = 0
    for s in body:
        if isinstance(s, (Let, Store)):
            n += 1 + _costly(s.value, branch)
        elif isinstance(s, For):
            if not (isinstance(s.lo, Const) and isinstance(s.hi, Const)):
                return None
            inner = _work(s.body, branch)
            if inner is None:
                return None
            n += max(0, int(s.hi.value) - int(s.lo.value)) * inner
        elif isinstance(s, If):
            a, b = _work(s.then, True), _work(s.orelse, True)
            if a is None or b is None:
                return None
            n += 1 + max(a, b)
        elif isinstance(s, Fail):  # (a chunk stops there; the pool gives the first by chunk)
            n += 1
        else:  # Loop, Launch, Host, Gemm, Permute
            return None
    return n


# a temporary of at most PRIVATE_BYTES that a parallel loop sets before it reads it, at each
# iteration, and that nothing else in the kernel touches, is a chunk's own (``_private``):
# REINFORCE 256 x 128's gradient of the log-softmax at the actions taken (a one-hot of two
# floats a point) 245 -> 126 us on two threads
PRIVATE_BYTES = 4096


def _private(s: For, k) -> frozenset:
    """The temporaries of kernel ``k`` that parallel loop ``s`` may give each chunk a copy of
    (in the chunk's function's stack frame, ``_Function.outline``): at most
    ``PRIVATE_BYTES``, touched nowhere in the kernel but in ``s``, and in each iteration of
    ``s`` first touched by a loop that sets every element (``t[e] = v`` for ``e`` over the
    temporary's size, ``v`` not reading it), not under a condition: no value flows from
    one iteration to another, nor in or out of the loop (REINFORCE's gradient of the
    log-softmax at the actions taken: a point's two logits' one-hot, ``index_add``)."""
    if isinstance(k, kir.Tree):
        return frozenset()
    inside = _touched(s.body)
    small = {
        t.name
        for t in k.temps
        if t.name in inside and t.size * kir.SIZES[t.dtype] <= PRIVATE_BYTES
    }
    if not small:
        return frozenset()
    outside: set = set()
    _touched_outside(k.body, s, outside)
    sizes = {t.name: t.size for t in k.temps}
    return frozenset(n for n in small - outside if _set_first(s.body, n, sizes[n]))


def _touched(body) -> set:
    """The buffers that the statements ``body`` (and those they hold) read or write."""
    out: set = set()
    for x in kir.walk_tree(body):
        out |= _own_touched(x)
    return out


def _own_touched(x) -> set:
    """The buffers that statement ``x`` itself reads or writes."""
    read, written = kir.own_buffers(x)
    return {*read, *written} | {b for e in kir.own_exprs(x) for b in _loads(e)}


def _touched_outside(body, s: For, out: set):
    """Add to ``out`` the buffers that ``body`` touches outside loop ``s``."""
    for x in body:
        if x is not s:
            out |= _own_touched(x)
            _touched_outside(kir.nested(x), s, out)


def _loads(e) -> set:
    """The buffers expression ``e`` loads from."""
    return {y.buf for y in kir.subexprs(e) if isinstance(y, Load)}


def _set_first(body, name: str, size: int) -> bool | None:
    """Whether, in program order through ``body`` (into loops over constant, non-empty
    ranges, not into conditions), the first statement that touches temporary ``name`` is a
    loop setting all its ``size`` elements (``_sets_all``); None where none touches it."""
    for x in body:
        if _sets_all(x, name, size):
            return True
        if name not in _touched([x]):
            continue
        if not (isinstance(x, For) and _trips(x) > 0 and name not in _own_touched(x)):
            return False
        return _set_first(x.body, name, size)
    return None


def _sets_all(x, name: str, size: int) -> bool:
    """Whether ``x`` is ``for e in 0 ..< size: name[e] = v`` (``v`` not reading ``name``)."""
    if not (isinstance(x, For) and len(x.body) == 1 and isinstance(x.lo, Const)):
        return False
    (y,) = x.body
    return (
        int(x.lo.value) == 0
        and isinstance(x.hi, Const)
        and int(x.hi.value) == size
        and isinstance(y, Store)
        and y.buf == name
        and y.index == Ref(x.var)
        and name not in _loads(y.value)
    )


def _own_stores(s: For, private=frozenset()) -> bool:
    """Whether each iteration of ``s`` stores only into elements no other iteration does:
    every store's index is ``c * var + f`` (``var`` the loop's, ``c`` a constant, the same
    for all stores into the buffer, and the same other terms of locals set outside the
    loop), with ``f``'s constant part and the inner loops' terms spanning fewer than
    ``|c|`` elements over all the stores into the buffer."""
    sets: dict[str, str] = {}
    _collect_locals(s.body, sets)
    spans: dict[str, list] = {}  # buffer -> [c, other terms, lowest, highest]

    def visit(body, ranges: dict) -> bool:
        for x in body:
            if isinstance(x, For):
                r = dict(ranges)
                r[x.var] = (int(x.lo.value), int(x.hi.value) - 1)
                if not visit(x.body, r):
                    return False
            elif isinstance(x, If):
                if not (visit(x.then, ranges) and visit(x.orelse, ranges)):
                    return False
            elif isinstance(x, Store) and x.buf not in private:
                aff = _affine(x.index)
                if aff is None:
                    return False
                c = aff.pop(s.var, 0)
                const = aff.pop(None, 0)
                low = high = const
                others = {}
                for name, k in aff.items():
                    if name in ranges:
                        a, b = ranges[name]
                        low += min(k * a, k * b)
                        high += max(k * a, k * b)
                    elif name in sets:  # (a local the body sets: not the same everywhere)
                        return False
                    else:
                        others[name] = k
                key = (c, tuple(sorted(others.items())))
                got = spans.setdefault(x.buf, [key, low, high])
                if got[0] != key:
                    return False
                got[1], got[2] = min(got[1], low), max(got[2], high)
        return True

    if not visit(s.body, {}):
        return False
    return all(key[0] != 0 and high - low < abs(key[0]) for key, low, high in spans.values())


def _affine(e) -> dict | None:
    """An i64 index as ``{local: coefficient, None: constant}``, or None where it is not a
    sum of constant multiples of locals."""
    if isinstance(e, Const):
        return {None: int(e.value)} if e.dtype in ("i32", "i64") else None
    if isinstance(e, Ref):
        return {e.name: 1} if e.dtype == "i64" else None
    if isinstance(e, Bin) and e.op in ("add", "sub"):
        a, b = _affine(e.a), _affine(e.b)
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        for k, v in b.items():
            a[k] = a.get(k, 0) + sign * v
        return {k: v for k, v in a.items() if v != 0 or k is None}
    if isinstance(e, Bin) and e.op == "mul":
        a, b = _affine(e.a), _affine(e.b)
        if a is None or b is None:
            return None
        if set(b) <= {None}:
            a, b = b, a
        if not set(a) <= {None}:
            return None  # (a product of two locals)
        k = a.get(None, 0)
        return {n: k * v for n, v in b.items() if k * v != 0 or n is None}
    return None


def _refs(x):
    """The names of the locals ``x`` (statements, expressions, tuples of them) reads, in
    order."""
    if isinstance(x, Ref):
        yield x.name
    elif isinstance(x, tuple):
        for y in x:
            yield from _refs(y)
    elif dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            yield from _refs(getattr(x, f.name))


def _collect_locals(body, out: dict):
    for s in body:
        if isinstance(s, Let):
            out.setdefault(s.name, s.dtype)
        elif isinstance(s, (For, Loop)):
            out.setdefault(s.var, "i64")
            _collect_locals(s.body, out)
        elif isinstance(s, If):
            _collect_locals(s.then, out)
            _collect_locals(s.orelse, out)
        elif isinstance(s, kir.Rows):
            _collect_locals((s.loop,), out)


def const(v, dtype: str) -> str:
    """An LLVM constant of ``dtype``."""
    if dtype == "bool":
        return "true" if v else "false"
    if dtype in ("i32", "i64"):
        return str(int(v))
    x = float(v)
    if dtype == "f32":
        import numpy as np

        x = float(np.float32(x))
    if x == 0.0 and math.copysign(1.0, x) > 0:
        return "0.0"
    return f"0x{struct.unpack('>Q', struct.pack('>d', x))[0]:016X}"
