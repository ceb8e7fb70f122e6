"""The random draws of ``timerlc.rng`` as LLVM IR text, bit for bit.

Stage: code generation (a library the LLVM renderer pastes into a module). In: the
specification in ``timerlc/rng.py``'s docstring, whose constants this module reads. Out:
``LIBRARY``, LLVM IR text (opaque pointers) of ``internal`` functions named ``tl_rng_*``,
and ``FUNCTIONS``, one line per function saying what it computes.

A draw takes its key and counter as ``(i32 %seed, i32 %site, i64 %p, i64 %e)``: the seed
reduced mod 2**32, the site id, the point index P and the element index E (unsigned bit
patterns in signed registers). Every float operation is one IEEE operation in the order the
specification writes, with no fast-math flags and no ``fmuladd``; the only intrinsics are
``llvm.sqrt.f64`` (correctly rounded) and ``llvm.memset``. They are called undeclared (this
LLVM declares intrinsics on use), so a module that declares them too still parses.
"""

from __future__ import annotations

import struct
from string import Template

from timerlc import rng

FUNCTIONS: dict[str, str] = {
    "tl_rng_philox": "<4 x i32> (c0, c1, c2, c3, k0, k1): Philox4x32-10 of one counter, key",
    "tl_rng_block": "<4 x i32> (seed, site, P, E): the Philox lanes x0..x3 of element E at P",
    "tl_rng_n53": "i64 (a, b): ((a >> 5) << 26) | (b >> 6), 53 random bits",
    "tl_rng_log64": "double (x): fdlibm log of a positive normal finite x (rng.log64)",
    "tl_rng_ksin": "double (x): fdlibm __kernel_sin, |x| <= pi/4 (rng.sin_kernel)",
    "tl_rng_kcos": "double (x): fdlibm __kernel_cos, |x| <= pi/4 (rng.cos_kernel)",
    "tl_rng_sincos_turns53": "{double, double} (n): (sin, cos) of 2*pi*n/2**53, n < 2**53",
    "tl_rng_normal_lanes": "double (x0, x1, x2, x3): the f64 Box-Muller normal of one block",
    "tl_rng_bits": "i32 (seed, site, P, E): lane x0, the sort key of a permutation",
    "tl_rng_uniform_f32": "float (seed, site, P, E): uniform in [0, 1), top 24 bits of x0",
    "tl_rng_uniform_f64": "double (seed, site, P, E): uniform in [0, 1), n53(x0, x1) * 2**-53",
    "tl_rng_uniform_range_f32": (
        "float (seed, site, P, E, lo, hi): lo + (hi - lo) * u in f32 (lo, hi rounded to f32;"
        " glorot: hi = -lo = f32(sqrt(6 / (fan_in + fan_out))))"
    ),
    "tl_rng_uniform_range_f64": "double (seed, site, P, E, lo, hi): lo + (hi - lo) * u in f64",
    "tl_rng_normal_f64": "double (seed, site, P, E): standard normal (Box-Muller, f64)",
    "tl_rng_normal_f32": "float (seed, site, P, E): the f64 normal rounded once to f32",
    "tl_rng_normal_affine_f32": (
        "float (seed, site, P, E, mean, std): mean + std * z in f32 (normal_init; z f32)"
    ),
    "tl_rng_normal_affine_f64": "double (seed, site, P, E, mean, std): mean + std * z in f64",
    "tl_rng_gumbel_f64": "double (seed, site, P, E): -log(-log(u)), u on the odd 53-bit grid",
    "tl_rng_bernoulli": "i1 (seed, site, P, E, double p): uniform_f64 < p (false for nan p)",
    "tl_rng_categorical_f32": (
        "i32 (seed, site, P, E0, ptr logits, i64 stride, i64 n): first argmax over k < n of"
        " f64(logits[k * stride]) + gumbel(E0 + k) (a nan wins, as np.argmax); n >= 1"
    ),
    "tl_rng_categorical_f64": "i32: as tl_rng_categorical_f32, for f64 logits",
    "tl_rng_sort_hi32": (
        "void (ptr a, ptr b, i64 n): stable LSD radix sort of n i64 in a by their high 32"
        " bits (unsigned); b is scratch of n i64; the result is in a"
    ),
    "tl_rng_permutation": (
        "void (seed, site, P, i64 n, ptr out, ptr scratch): out[0..n) (i32) = stable argsort"
        " of bits(E = 0..n-1); scratch holds 2n i64; n <= 2**31"
    ),
}


def _hex64(x: float) -> str:
    """LLVM's literal of a double (or of a float exactly representable): its bit pattern."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"


_CONSTS = {
    name: _hex64(getattr(rng, name))
    for name in ["LN2_HI", "LN2_LO", "TWOPI_2M53"]
    + [f"LG{i}" for i in range(1, 8)]
    + [f"S{i}" for i in range(1, 7)]
    + [f"C{i}" for i in range(1, 7)]
}
_CONSTS.update(
    M2_24=_hex64(2.0**-24),
    M2_53=_hex64(2.0**-53),
    SPLIT=str(rng._LOG_SPLIT),
    MANT=str((1 << 52) - 1),
    EXP_HALF=str(0x3FE << 52),
    EXP_ONE=str(0x3FF << 52),
)


def _philox() -> str:
    """Ten rounds, unrolled; the key bumps between rounds are folded into constants."""
    head = "i32 %c0, i32 %c1, i32 %c2, i32 %c3, i32 %k0, i32 %k1"
    lines = [f"define internal <4 x i32> @tl_rng_philox({head}) {{"]
    x = ["%c0", "%c1", "%c2", "%c3"]
    for r in range(rng.PHILOX_ROUNDS):
        k0, k1 = "%k0", "%k1"
        if r:
            k0, k1 = f"%r{r}.k0", f"%r{r}.k1"
            lines += [
                f"  {k0} = add i32 %k0, {(r * rng.PHILOX_W0) % 2**32}",
                f"  {k1} = add i32 %k1, {(r * rng.PHILOX_W1) % 2**32}",
            ]
        p = f"%r{r}."
        lines += [
            f"  {p}a = zext i32 {x[0]} to i64",
            f"  {p}p0 = mul i64 {p}a, {rng.PHILOX_M0}",
            f"  {p}b = zext i32 {x[2]} to i64",
            f"  {p}p1 = mul i64 {p}b, {rng.PHILOX_M1}",
            f"  {p}h0w = lshr i64 {p}p0, 32",
            f"  {p}h0 = trunc i64 {p}h0w to i32",
            f"  {p}l0 = trunc i64 {p}p0 to i32",
            f"  {p}h1w = lshr i64 {p}p1, 32",
            f"  {p}h1 = trunc i64 {p}h1w to i32",
            f"  {p}l1 = trunc i64 {p}p1 to i32",
            f"  {p}y0a = xor i32 {p}h1, {x[1]}",
            f"  {p}y0 = xor i32 {p}y0a, {k0}",
            f"  {p}y2a = xor i32 {p}h0, {x[3]}",
            f"  {p}y2 = xor i32 {p}y2a, {k1}",
        ]
        x = [f"{p}y0", f"{p}l1", f"{p}y2", f"{p}l0"]
    vec = "poison"
    for i, v in enumerate(x):
        lines.append(f"  %out{i} = insertelement <4 x i32> {vec}, i32 {v}, i32 {i}")
        vec = f"%out{i}"
    lines += [f"  ret <4 x i32> {vec}", "}"]
    return "\n".join(lines)


# Each block below is one function in the order of the specification's formulas; $NAME is a
# constant of _CONSTS (a bit pattern for the floats).
_KERNELS = r"""
define internal <4 x i32> @tl_rng_block(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %c0 = trunc i64 %e to i32
  %eh = lshr i64 %e, 32
  %c1 = trunc i64 %eh to i32
  %c2 = trunc i64 %p to i32
  %ph = lshr i64 %p, 32
  %c3 = trunc i64 %ph to i32
  %x = call <4 x i32> @tl_rng_philox(i32 %c0, i32 %c1, i32 %c2, i32 %c3, i32 %seed, i32 %site)
  ret <4 x i32> %x
}

define internal i64 @tl_rng_n53(i32 %a, i32 %b) {
  %a64 = zext i32 %a to i64
  %a5 = lshr i64 %a64, 5
  %hi = shl i64 %a5, 26
  %b6 = lshr i32 %b, 6
  %lo = zext i32 %b6 to i64
  %n = or i64 %hi, %lo
  ret i64 %n
}

define internal double @tl_rng_log64(double %x) {
  %bits = bitcast double %x to i64
  %eb = lshr i64 %bits, 52
  %e = sub i64 %eb, 1023
  %m = and i64 %bits, $MANT
  %big = icmp uge i64 %m, $SPLIT
  %inc = zext i1 %big to i64
  %k = add i64 %e, %inc
  %ex = select i1 %big, i64 $EXP_HALF, i64 $EXP_ONE
  %yb = or i64 %m, %ex
  %y = bitcast i64 %yb to double
  %f = fsub double %y, 1.0
  %hf = fmul double 0.5, %f
  %hfsq = fmul double %hf, %f
  %den = fadd double 2.0, %f
  %s = fdiv double %f, %den
  %z = fmul double %s, %s
  %w = fmul double %z, %z
  %a6 = fmul double %w, $LG6
  %a4 = fadd double $LG4, %a6
  %a4w = fmul double %w, %a4
  %a2 = fadd double $LG2, %a4w
  %t1 = fmul double %w, %a2
  %b7 = fmul double %w, $LG7
  %b5 = fadd double $LG5, %b7
  %b5w = fmul double %w, %b5
  %b3 = fadd double $LG3, %b5w
  %b3w = fmul double %w, %b3
  %b1 = fadd double $LG1, %b3w
  %t2 = fmul double %z, %b1
  %r = fadd double %t2, %t1
  %dk = sitofp i64 %k to double
  %hi = fmul double %dk, $LN2_HI
  %hr = fadd double %hfsq, %r
  %shr = fmul double %s, %hr
  %lo = fmul double %dk, $LN2_LO
  %in = fadd double %shr, %lo
  %d1 = fsub double %hfsq, %in
  %d2 = fsub double %d1, %f
  %log = fsub double %hi, %d2
  ret double %log
}

define internal double @tl_rng_ksin(double %x) {
  %z = fmul double %x, %x
  %v = fmul double %z, %x
  %a6 = fmul double %z, $S6
  %a5 = fadd double $S5, %a6
  %a5z = fmul double %z, %a5
  %a4 = fadd double $S4, %a5z
  %a4z = fmul double %z, %a4
  %a3 = fadd double $S3, %a4z
  %a3z = fmul double %z, %a3
  %r = fadd double $S2, %a3z
  %zr = fmul double %z, %r
  %a1 = fadd double $S1, %zr
  %va = fmul double %v, %a1
  %sin = fadd double %x, %va
  ret double %sin
}

define internal double @tl_rng_kcos(double %x) {
  %z = fmul double %x, %x
  %a6 = fmul double %z, $C6
  %a5 = fadd double $C5, %a6
  %a5z = fmul double %z, %a5
  %a4 = fadd double $C4, %a5z
  %a4z = fmul double %z, %a4
  %a3 = fadd double $C3, %a4z
  %a3z = fmul double %z, %a3
  %a2 = fadd double $C2, %a3z
  %a2z = fmul double %z, %a2
  %a1 = fadd double $C1, %a2z
  %r = fmul double %z, %a1
  %hz = fmul double 0.5, %z
  %w = fsub double 1.0, %hz
  %ow = fsub double 1.0, %w
  %owh = fsub double %ow, %hz
  %zr = fmul double %z, %r
  %tail = fadd double %owh, %zr
  %cos = fadd double %w, %tail
  ret double %cos
}

define internal { double, double } @tl_rng_sincos_turns53(i64 %n) {
  %nr = add i64 %n, 1125899906842624
  %q = lshr i64 %nr, 51
  %qs = shl i64 %q, 51
  %j = sub i64 %n, %qs
  %jf = sitofp i64 %j to double
  %x = fmul double %jf, $TWOPI_2M53
  %s = call double @tl_rng_ksin(double %x)
  %c = call double @tl_rng_kcos(double %x)
  %q3 = and i64 %q, 3
  %odd = trunc i64 %q to i1
  %sin0 = select i1 %odd, double %c, double %s
  %cos0 = select i1 %odd, double %s, double %c
  %negs = icmp uge i64 %q3, 2
  %nsin = fneg double %sin0
  %sin = select i1 %negs, double %nsin, double %sin0
  %q3m = add i64 %q3, -1
  %negc = icmp ult i64 %q3m, 2
  %ncos = fneg double %cos0
  %cos = select i1 %negc, double %ncos, double %cos0
  %sc0 = insertvalue { double, double } poison, double %sin, 0
  %sc = insertvalue { double, double } %sc0, double %cos, 1
  ret { double, double } %sc
}

define internal double @tl_rng_normal_lanes(i32 %x0, i32 %x1, i32 %x2, i32 %x3) {
  %a = call i64 @tl_rng_n53(i32 %x0, i32 %x1)
  %b = call i64 @tl_rng_n53(i32 %x2, i32 %x3)
  %na = sub i64 9007199254740992, %a
  %naf = uitofp i64 %na to double
  %u1 = fmul double %naf, $M2_53
  %l = call double @tl_rng_log64(double %u1)
  %m2l = fmul double -2.0, %l
  %r = call double @llvm.sqrt.f64(double %m2l)
  %sc = call { double, double } @tl_rng_sincos_turns53(i64 %b)
  %c = extractvalue { double, double } %sc, 1
  %z = fmul double %r, %c
  ret double %z
}

define internal i32 @tl_rng_bits(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %x = call <4 x i32> @tl_rng_block(i32 %seed, i32 %site, i64 %p, i64 %e)
  %x0 = extractelement <4 x i32> %x, i32 0
  ret i32 %x0
}

define internal float @tl_rng_uniform_f32(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %x = call <4 x i32> @tl_rng_block(i32 %seed, i32 %site, i64 %p, i64 %e)
  %x0 = extractelement <4 x i32> %x, i32 0
  %top = lshr i32 %x0, 8
  %f = uitofp i32 %top to float
  %u = fmul float %f, $M2_24
  ret float %u
}

define internal double @tl_rng_uniform_f64(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %x = call <4 x i32> @tl_rng_block(i32 %seed, i32 %site, i64 %p, i64 %e)
  %x0 = extractelement <4 x i32> %x, i32 0
  %x1 = extractelement <4 x i32> %x, i32 1
  %n = call i64 @tl_rng_n53(i32 %x0, i32 %x1)
  %f = uitofp i64 %n to double
  %u = fmul double %f, $M2_53
  ret double %u
}

define internal float @tl_rng_uniform_range_f32(i32 %seed, i32 %site, i64 %p, i64 %e,
                                                float %lo, float %hi) {
  %u = call float @tl_rng_uniform_f32(i32 %seed, i32 %site, i64 %p, i64 %e)
  %d = fsub float %hi, %lo
  %t = fmul float %d, %u
  %r = fadd float %lo, %t
  ret float %r
}

define internal double @tl_rng_uniform_range_f64(i32 %seed, i32 %site, i64 %p, i64 %e,
                                                 double %lo, double %hi) {
  %u = call double @tl_rng_uniform_f64(i32 %seed, i32 %site, i64 %p, i64 %e)
  %d = fsub double %hi, %lo
  %t = fmul double %d, %u
  %r = fadd double %lo, %t
  ret double %r
}

define internal double @tl_rng_normal_f64(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %x = call <4 x i32> @tl_rng_block(i32 %seed, i32 %site, i64 %p, i64 %e)
  %x0 = extractelement <4 x i32> %x, i32 0
  %x1 = extractelement <4 x i32> %x, i32 1
  %x2 = extractelement <4 x i32> %x, i32 2
  %x3 = extractelement <4 x i32> %x, i32 3
  %z = call double @tl_rng_normal_lanes(i32 %x0, i32 %x1, i32 %x2, i32 %x3)
  ret double %z
}

define internal float @tl_rng_normal_f32(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %z = call double @tl_rng_normal_f64(i32 %seed, i32 %site, i64 %p, i64 %e)
  %z32 = fptrunc double %z to float
  ret float %z32
}

define internal float @tl_rng_normal_affine_f32(i32 %seed, i32 %site, i64 %p, i64 %e,
                                                float %mean, float %std) {
  %z = call float @tl_rng_normal_f32(i32 %seed, i32 %site, i64 %p, i64 %e)
  %t = fmul float %std, %z
  %r = fadd float %mean, %t
  ret float %r
}

define internal double @tl_rng_normal_affine_f64(i32 %seed, i32 %site, i64 %p, i64 %e,
                                                 double %mean, double %std) {
  %z = call double @tl_rng_normal_f64(i32 %seed, i32 %site, i64 %p, i64 %e)
  %t = fmul double %std, %z
  %r = fadd double %mean, %t
  ret double %r
}

define internal double @tl_rng_gumbel_f64(i32 %seed, i32 %site, i64 %p, i64 %e) {
  %x = call <4 x i32> @tl_rng_block(i32 %seed, i32 %site, i64 %p, i64 %e)
  %x0 = extractelement <4 x i32> %x, i32 0
  %x1 = extractelement <4 x i32> %x, i32 1
  %n = call i64 @tl_rng_n53(i32 %x0, i32 %x1)
  %h = lshr i64 %n, 1
  %ev = shl i64 %h, 1
  %odd = or i64 %ev, 1
  %f = uitofp i64 %odd to double
  %u = fmul double %f, $M2_53
  %l1 = call double @tl_rng_log64(double %u)
  %n1 = fneg double %l1
  %l2 = call double @tl_rng_log64(double %n1)
  %g = fneg double %l2
  ret double %g
}

define internal i1 @tl_rng_bernoulli(i32 %seed, i32 %site, i64 %p, i64 %e, double %prob) {
  %u = call double @tl_rng_uniform_f64(i32 %seed, i32 %site, i64 %p, i64 %e)
  %b = fcmp olt double %u, %prob
  ret i1 %b
}
"""

# Gumbel-max over n logits; np.argmax's rule: the first maximum, and the first nan if any.
_CATEGORICAL = r"""
define internal i32 @tl_rng_categorical_$T(i32 %seed, i32 %site, i64 %p, i64 %e0,
                                           ptr %logits, i64 %stride, i64 %n) {
entry:
  %l0 = load $LT, ptr %logits
  %f0 = $EXT
  %g0 = call double @tl_rng_gumbel_f64(i32 %seed, i32 %site, i64 %p, i64 %e0)
  %v0 = fadd double %f0, %g0
  %one = icmp sle i64 %n, 1
  br i1 %one, label %done, label %loop
loop:
  %k = phi i64 [ 1, %entry ], [ %k1, %loop ]
  %best = phi double [ %v0, %entry ], [ %best1, %loop ]
  %arg = phi i64 [ 0, %entry ], [ %arg1, %loop ]
  %off = mul i64 %k, %stride
  %at = getelementptr $LT, ptr %logits, i64 %off
  %l = load $LT, ptr %at
  %f = $EXTK
  %ek = add i64 %e0, %k
  %g = call double @tl_rng_gumbel_f64(i32 %seed, i32 %site, i64 %p, i64 %ek)
  %v = fadd double %f, %g
  %gt = fcmp ugt double %v, %best
  %ord = fcmp ord double %best, 0.0
  %take = and i1 %gt, %ord
  %best1 = select i1 %take, double %v, double %best
  %arg1 = select i1 %take, i64 %k, i64 %arg
  %k1 = add i64 %k, 1
  %more = icmp slt i64 %k1, %n
  br i1 %more, label %loop, label %done
done:
  %res = phi i64 [ 0, %entry ], [ %arg1, %loop ]
  %r32 = trunc i64 %res to i32
  ret i32 %r32
}
"""

# LSD radix sort of packed (key << 32 | index) words on the key: four stable passes of 8
# bits, so equal keys keep the order of their indices (np.argsort(kind="stable")).
_SORT = r"""
define internal void @tl_rng_sort_hi32(ptr %a, ptr %b, i64 %n) {
entry:
  %cnt = alloca [1024 x i64], align 8
  call void @llvm.memset.p0.i64(ptr %cnt, i8 0, i64 8192, i1 false)
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %done, label %hist
hist:
  %i = phi i64 [ 0, %entry ], [ %i1, %hist ]
  %ap = getelementptr i64, ptr %a, i64 %i
  %v = load i64, ptr %ap
  %d0s = lshr i64 %v, 32
  %d0 = and i64 %d0s, 255
  %c0p = getelementptr i64, ptr %cnt, i64 %d0
  %c0 = load i64, ptr %c0p
  %c0n = add i64 %c0, 1
  store i64 %c0n, ptr %c0p
  %d1s = lshr i64 %v, 40
  %d1a = and i64 %d1s, 255
  %d1 = or i64 %d1a, 256
  %c1p = getelementptr i64, ptr %cnt, i64 %d1
  %c1 = load i64, ptr %c1p
  %c1n = add i64 %c1, 1
  store i64 %c1n, ptr %c1p
  %d2s = lshr i64 %v, 48
  %d2a = and i64 %d2s, 255
  %d2 = or i64 %d2a, 512
  %c2p = getelementptr i64, ptr %cnt, i64 %d2
  %c2 = load i64, ptr %c2p
  %c2n = add i64 %c2, 1
  store i64 %c2n, ptr %c2p
  %d3a = lshr i64 %v, 56
  %d3 = or i64 %d3a, 768
  %c3p = getelementptr i64, ptr %cnt, i64 %d3
  %c3 = load i64, ptr %c3p
  %c3n = add i64 %c3, 1
  store i64 %c3n, ptr %c3p
  %i1 = add i64 %i, 1
  %hmore = icmp ult i64 %i1, %n
  br i1 %hmore, label %hist, label %scan
scan:
  %j = phi i64 [ 0, %hist ], [ %j1, %scan ]
  %acc = phi i64 [ 0, %hist ], [ %acc2, %scan ]
  %cp = getelementptr i64, ptr %cnt, i64 %j
  %c = load i64, ptr %cp
  %jl = and i64 %j, 255
  %first = icmp eq i64 %jl, 0
  %acc0 = select i1 %first, i64 0, i64 %acc
  store i64 %acc0, ptr %cp
  %acc2 = add i64 %acc0, %c
  %j1 = add i64 %j, 1
  %jmore = icmp ult i64 %j1, 1024
  br i1 %jmore, label %scan, label %pass
pass:
  %d = phi i64 [ 0, %scan ], [ %dn, %next ]
  %src = phi ptr [ %a, %scan ], [ %dst, %next ]
  %dst = phi ptr [ %b, %scan ], [ %src, %next ]
  %d8 = shl i64 %d, 3
  %sh = add i64 %d8, 32
  %base = shl i64 %d, 8
  br label %scatter
scatter:
  %s = phi i64 [ 0, %pass ], [ %s1, %scatter ]
  %sp = getelementptr i64, ptr %src, i64 %s
  %w = load i64, ptr %sp
  %ws = lshr i64 %w, %sh
  %dig = and i64 %ws, 255
  %slot = add i64 %base, %dig
  %op = getelementptr i64, ptr %cnt, i64 %slot
  %o = load i64, ptr %op
  %dp = getelementptr i64, ptr %dst, i64 %o
  store i64 %w, ptr %dp
  %o1 = add i64 %o, 1
  store i64 %o1, ptr %op
  %s1 = add i64 %s, 1
  %smore = icmp ult i64 %s1, %n
  br i1 %smore, label %scatter, label %next
next:
  %dn = add i64 %d, 1
  %pmore = icmp ult i64 %dn, 4
  br i1 %pmore, label %pass, label %done
done:
  ret void
}

define internal void @tl_rng_permutation(i32 %seed, i32 %site, i64 %p, i64 %n,
                                         ptr %out, ptr %scratch) {
entry:
  %empty = icmp eq i64 %n, 0
  br i1 %empty, label %done, label %fill
fill:
  %i = phi i64 [ 0, %entry ], [ %i1, %fill ]
  %key = call i32 @tl_rng_bits(i32 %seed, i32 %site, i64 %p, i64 %i)
  %kz = zext i32 %key to i64
  %ks = shl i64 %kz, 32
  %v = or i64 %ks, %i
  %ap = getelementptr i64, ptr %scratch, i64 %i
  store i64 %v, ptr %ap
  %i1 = add i64 %i, 1
  %fmore = icmp ult i64 %i1, %n
  br i1 %fmore, label %fill, label %sort
sort:
  %b = getelementptr i64, ptr %scratch, i64 %n
  call void @tl_rng_sort_hi32(ptr %scratch, ptr %b, i64 %n)
  br label %copy
copy:
  %c = phi i64 [ 0, %sort ], [ %c1, %copy ]
  %sp = getelementptr i64, ptr %scratch, i64 %c
  %w = load i64, ptr %sp
  %idx = trunc i64 %w to i32
  %op = getelementptr i32, ptr %out, i64 %c
  store i32 %idx, ptr %op
  %c1 = add i64 %c, 1
  %cmore = icmp ult i64 %c1, %n
  br i1 %cmore, label %copy, label %done
done:
  ret void
}
"""


def library() -> str:
    """The LLVM IR text of every function of ``FUNCTIONS``."""
    cats = [
        Template(_CATEGORICAL).substitute(
            T=t, LT=lt, EXT=ext.format(v="%l0"), EXTK=ext.format(v="%l")
        )
        for t, lt, ext in [
            ("f32", "float", "fpext float {v} to double"),
            ("f64", "double", "bitcast double {v} to double"),  # a copy
        ]
    ]
    text = "\n".join(
        ["; timerlc.rng's raw draws (timerlc/llvm/philox.py)", _philox()]
        + [Template(_KERNELS).substitute(_CONSTS)]
        + cats
        + [_SORT]
    )
    return text


LIBRARY: str = library()
