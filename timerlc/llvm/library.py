"""The runtime library of the LLVM modules (``llvm.render``), as LLVM IR text: f32 math
without calls (``_F32_MATH``: exp, log, log1p, tanh, sigmoid, so that loops over them
vectorize), NumPy's integer powers (``_IPOW``), a tree function's kernel launch with its
box check and failure record (``_LAUNCH``, ``_LAUNCH_FN``), a row loop chunk's failure
(``_ROWS_FAILED``), the threads' entry (``_PAR_RUN``), the gemm loops of a machine without
a BLAS (``_GEMM_LOOPS``); and LLVM's spelling of a dtype's registers and constants (``REG``,
``const``). Text only: ``render_module`` formats and joins it."""

from __future__ import annotations

import math
import struct

REG = {"bool": "i1", "i32": "i32", "i64": "i64", "f32": "float", "f64": "double"}


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
