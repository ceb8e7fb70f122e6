"""Rendering kernels (``codegen.kir``) as CUDA C text.

A kernel's top-level statements are cut into *steps*, each a function ``__global__ void
NAME(void **table, const long long *args, char *scratch, int *err)`` (``NAME``, then
``NAME_1``, ``NAME_2``, ...) that the device runtime launches one after another over a grid
of blocks of ``THREADS`` threads (``Launches``: each step and the threads it asks for):

- a ``parallel`` loop (a statement's loop over its vector dims, ``kir.For.parallel``) is
  one thread per iteration, the loop striding over the grid; each thread has its own locals
  and its own copy of the per-point temporaries (a temporary written in the loop and used
  nowhere else);
- a gemm is one thread per element of the product, each summing its terms in order (cuBLAS
  is to come);
- a run of the other statements runs on one thread (of block 0). A local it assigns that
  another step reads goes through the scratch memory, after the kernel's temporaries (the
  step stores it at its end, the others load it at their start).

``table`` holds the device addresses of the plan's buffers, ``args`` the call's loop values,
``scratch`` the temporaries (global memory, shared by the steps). A ``Fail`` sets its
block's code and skips the rest of its point (or of the serial step); the block then sets
``*err`` if it is still 0 (the runtime keeps it 0 between failures), and every later step
returns at once when ``*err`` is set. A parallel loop inside another statement (an
element loop inside a loop over points, the cpu's blocks of a layer chain) runs on its
step's thread like any loop, but for ``if c: <parallel loop>``, which becomes the loop of
``if c: <its body>``.
Scalars follow NumPy's semantics for their dtype, as the LLVM
renderer's do (``docs/codegen.md``): the helpers of ``PRELUDE``. Bools are ``bool`` in
registers and one byte in memory.

Random draws call the Philox library of ``_philox_c`` (bit for bit ``timerlc/rng.py``, as the
LLVM kernels' draws are; the module must be compiled without contracting multiply-adds:
``--fmad=false``). An environment's kernel (``codegen.envs``) finds its state at the table
entries the runtime keeps for it, as on the cpu. Not rendered yet (``Unsupported``): tree
functions.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass

from timerlc.codegen import kir
from timerlc.codegen.kir import (
    Bin,
    Cast,
    Const,
    Fail,
    Fn,
    For,
    Gemm,
    If,
    Let,
    Load,
    Permute,
    Ref,
    Sel,
    Store,
    Un,
)

CTYPE = {"bool": "bool", "i32": "int", "i64": "long long", "f32": "float", "f64": "double"}
MTYPE = {
    "bool": "unsigned char",
    "i32": "int",
    "i64": "long long",
    "f32": "float",
    "f64": "double",
}
SUFFIX = {"bool": "b", "i32": "i32", "i64": "i64", "f32": "f32", "f64": "f64"}


class Unsupported(Exception):
    """A kernel this renderer does not render yet."""


# NumPy's semantics for each scalar op and dtype (as timerlc/llvm/render.py computes them)
PRELUDE = r"""
#ifndef __CUDACC_RTC__ /* NVRTC has the math library built in */
#include <math.h>
#include <string.h>
#endif
#define TL_F __host__ __device__ inline
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

/* integers wrap (two's complement), as LLVM's add/sub/mul and NumPy's do */
TL_F int tl_add_i32(int a, int b) { return (int)((u32)a + (u32)b); }
TL_F int tl_sub_i32(int a, int b) { return (int)((u32)a - (u32)b); }
TL_F int tl_mul_i32(int a, int b) { return (int)((u32)a * (u32)b); }
TL_F int tl_neg_i32(int a) { return (int)(0u - (u32)a); }
TL_F i64 tl_add_i64(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
TL_F i64 tl_sub_i64(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
TL_F i64 tl_mul_i64(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
TL_F i64 tl_neg_i64(i64 a) { return (i64)(0ull - (u64)a); }

/* floor division and modulo: by 0 they give 0, by -1 the negation (wrapping) and 0 */
#define TL_INTDIV(T, S)                                                        \
  TL_F T tl_floordiv_##S(T a, T b) {                                          \
    if (b == 0) return 0;                                                      \
    if (b == -1) return tl_neg_##S(a);                                         \
    T q = a / b, r = a % b;                                                    \
    return (r != 0 && ((r ^ b) < 0)) ? q - 1 : q;                              \
  }                                                                            \
  TL_F T tl_mod_##S(T a, T b) {                                                \
    if (b == 0 || b == -1) return 0;                                           \
    T r = a % b;                                                               \
    return (r != 0 && ((r ^ b) < 0)) ? r + b : r;                              \
  }                                                                            \
  TL_F T tl_rem_##S(T a, T b) { return (b == 0 || b == -1) ? 0 : a % b; }     \
  TL_F T tl_pow_##S(T a, T b) {                                                \
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);         \
    T acc = 1, base = a;                                                       \
    while (b != 0) {                                                           \
      if (b & 1) acc = tl_mul_##S(acc, base);                                  \
      base = tl_mul_##S(base, base);                                           \
      b = (T)((u64)b >> 1);                                                    \
    }                                                                          \
    return acc;                                                                \
  }                                                                            \
  TL_F T tl_abs_##S(T a) { return a < 0 ? tl_neg_##S(a) : a; }                \
  TL_F T tl_sign_##S(T a) { return (T)((a > 0) - (a < 0)); }                  \
  TL_F T tl_max_##S(T a, T b) { return a >= b ? a : b; }                      \
  TL_F T tl_min_##S(T a, T b) { return a <= b ? a : b; }
TL_INTDIV(int, i32)
TL_INTDIV(i64, i64)

/* floats: nan wins minimum and maximum; % has the divisor's sign (a zero too) */
#define TL_FLOAT(T, S, F)                                                      \
  TL_F T tl_max_##S(T a, T b) { return (a >= b || a != a) ? a : b; }          \
  TL_F T tl_min_##S(T a, T b) { return (a <= b || a != a) ? a : b; }          \
  TL_F T tl_mod_##S(T a, T b) {                                                \
    T r = fmod##F(a, b);                                                       \
    if (r != 0) return ((r < 0) != (b < 0)) ? r + b : r;                       \
    return copysign##F((T)0, b);                                               \
  }                                                                            \
  TL_F T tl_floordiv_##S(T a, T b) { return floor##F(a / b); }                 \
  TL_F T tl_sign_##S(T a) { return a > 0 ? (T)1 : (a < 0 ? (T)-1 : a); }     \
  TL_F T tl_sigmoid_##S(T a) {                                                 \
    double d = (double)a, e = exp(-fabs(d));                                   \
    return (T)(d >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e));                     \
  }
TL_FLOAT(float, f32, f)
TL_FLOAT(double, f64, )

/* a double's bits and back (device code has intrinsics; NVRTC has no string.h) */
#ifdef __CUDA_ARCH__
TL_F u64 tl_bits_f64(double x) { return (u64)__double_as_longlong(x); }
TL_F double tl_f64_bits(u64 b) { return __longlong_as_double((long long)b); }
#else
TL_F u64 tl_bits_f64(double x) { u64 b; memcpy(&b, &x, 8); return b; }
TL_F double tl_f64_bits(u64 b) { double x; memcpy(&x, &b, 8); return x; }
#endif

/* a float to an int truncates; nan and values out of range give the smallest int */
TL_F int tl_f2i32(double v) {
  double t = trunc(v);
  return (t >= -2147483648.0 && t < 2147483648.0) ? (int)t : (int)0x80000000u;
}
TL_F i64 tl_f2i64(double v) {
  double t = trunc(v);
  return (t >= -9223372036854775808.0 && t < 9223372036854775808.0) ? (i64)t
                                                                      : (i64)0x8000000000000000ull;
}
"""


def _philox_c() -> str:
    """Philox4x32-10 and the draws of ``timerlc/rng.py`` in C, operation by operation as
    ``timerlc/llvm/philox.py`` computes them (the module is compiled without contracting
    multiply-adds, ``--fmad=false``, so that every operation rounds once, as NumPy's do)."""
    from timerlc import rng

    def f(x: float) -> str:
        return f"{x.hex()}"

    rounds = []
    for r in range(rng.PHILOX_ROUNDS):
        k0 = (r * rng.PHILOX_W0) % 2**32
        k1 = (r * rng.PHILOX_W1) % 2**32
        rounds.append(
            f"  {{ u64 p0 = (u64)x0 * {rng.PHILOX_M0}ull, p1 = (u64)x2 * {rng.PHILOX_M1}ull;\n"
            f"    u32 y0 = (u32)(p1 >> 32) ^ x1 ^ (k0 + {k0}u), "
            f"y2 = (u32)(p0 >> 32) ^ x3 ^ (k1 + {k1}u);\n"
            f"    x0 = y0; x1 = (u32)p1; x2 = y2; x3 = (u32)p0; }}"
        )
    k = {n: f(getattr(rng, n)) for n in ("LN2_HI", "LN2_LO", "TWOPI_2M53")}
    k |= {f"LG{i}": f(getattr(rng, f"LG{i}")) for i in range(1, 8)}
    k |= {f"S{i}": f(getattr(rng, f"S{i}")) for i in range(1, 7)}
    k |= {f"C{i}": f(getattr(rng, f"C{i}")) for i in range(1, 7)}
    return (
        "struct tl_lanes { u32 x0, x1, x2, x3; };\n"
        "TL_F tl_lanes tl_rng_block(int seed, int site, i64 p, i64 e) {\n"
        "  u32 x0 = (u32)(u64)e, x1 = (u32)((u64)e >> 32), x2 = (u32)(u64)p, "
        "x3 = (u32)((u64)p >> 32);\n"
        "  u32 k0 = (u32)seed, k1 = (u32)site;\n"
        + "\n".join(rounds)
        + "\n  tl_lanes r = {x0, x1, x2, x3};\n  return r;\n}\n"
        + _subst_consts(_RNG_C, k, rng._LOG_SPLIT)
    )


def _subst_consts(text: str, k: dict, split: int) -> str:
    text = text.replace("$SPLIT", f"{split}ull")
    for n in sorted(k, key=len, reverse=True):
        text = text.replace(f"${n}", k[n])
    return text


_RNG_C = r"""
TL_F u64 tl_rng_n53(u32 a, u32 b) { return ((u64)(a >> 5) << 26) | (u64)(b >> 6); }
TL_F double tl_rng_log64(double x) {
  u64 bits = tl_bits_f64(x);
  i64 e = (i64)(bits >> 52) - 1023;
  u64 m = bits & ((1ull << 52) - 1);
  int big = m >= $SPLIT;
  i64 k = e + big;
  u64 yb = m | (big ? (0x3FEull << 52) : (0x3FFull << 52));
  double y = tl_f64_bits(yb);
  double f = y - 1.0;
  double hfsq = (0.5 * f) * f;
  double s = f / (2.0 + f);
  double z = s * s, w = z * z;
  double t1 = w * ($LG2 + w * ($LG4 + w * $LG6));
  double t2 = z * ($LG1 + w * ($LG3 + w * ($LG5 + w * $LG7)));
  double r = t2 + t1, dk = (double)k;
  return dk * $LN2_HI - ((hfsq - (s * (hfsq + r) + dk * $LN2_LO)) - f);
}
TL_F double tl_rng_ksin(double x) {
  double z = x * x, v = z * x;
  double r = $S2 + z * ($S3 + z * ($S4 + z * ($S5 + z * $S6)));
  return x + v * ($S1 + z * r);
}
TL_F double tl_rng_kcos(double x) {
  double z = x * x;
  double r = z * ($C1 + z * ($C2 + z * ($C3 + z * ($C4 + z * ($C5 + z * $C6)))));
  double hz = 0.5 * z, w = 1.0 - hz;
  return w + (((1.0 - w) - hz) + z * r);
}
TL_F double tl_rng_cos_turns53(u64 n) {
  u64 q = (n + (1ull << 50)) >> 51;
  i64 j = (i64)n - (i64)(q << 51);
  double x = (double)j * $TWOPI_2M53;
  double s = tl_rng_ksin(x), c = tl_rng_kcos(x);
  double cos0 = (q & 1) ? s : c;
  u64 q3 = q & 3;
  return (q3 == 1 || q3 == 2) ? -cos0 : cos0;
}
TL_F int tl_rng_bits(int seed, int site, i64 p, i64 e) {
  return (int)tl_rng_block(seed, site, p, e).x0;
}
TL_F float tl_rng_uniform_f32(int seed, int site, i64 p, i64 e) {
  return (float)(tl_rng_block(seed, site, p, e).x0 >> 8) * 0x1p-24f;
}
TL_F double tl_rng_uniform_f64(int seed, int site, i64 p, i64 e) {
  tl_lanes x = tl_rng_block(seed, site, p, e);
  return (double)tl_rng_n53(x.x0, x.x1) * 0x1p-53;
}
TL_F float tl_rng_uniform_range_f32(int seed, int site, i64 p, i64 e, float lo, float hi) {
  return lo + (hi - lo) * tl_rng_uniform_f32(seed, site, p, e);
}
TL_F double tl_rng_uniform_range_f64(int seed, int site, i64 p, i64 e, double lo, double hi) {
  return lo + (hi - lo) * tl_rng_uniform_f64(seed, site, p, e);
}
TL_F double tl_rng_normal_f64(int seed, int site, i64 p, i64 e) {
  tl_lanes x = tl_rng_block(seed, site, p, e);
  u64 a = tl_rng_n53(x.x0, x.x1), b = tl_rng_n53(x.x2, x.x3);
  double u1 = (double)((1ull << 53) - a) * 0x1p-53;
  double r = sqrt(-2.0 * tl_rng_log64(u1));
  return r * tl_rng_cos_turns53(b);
}
TL_F float tl_rng_normal_f32(int seed, int site, i64 p, i64 e) {
  return (float)tl_rng_normal_f64(seed, site, p, e);
}
TL_F float tl_rng_normal_affine_f32(int seed, int site, i64 p, i64 e, float mean, float std) {
  return mean + std * tl_rng_normal_f32(seed, site, p, e);
}
TL_F double tl_rng_normal_affine_f64(int seed, int site, i64 p, i64 e, double mean, double std) {
  return mean + std * tl_rng_normal_f64(seed, site, p, e);
}
/* a permutation of 0..n-1: the stable argsort of bits(e) (rng.permutation); the keys
   (bits << 32 | e) are distinct, so any sort is stable; a bottom-up merge sort in the
   scratch's 2n words */
TL_F void tl_rng_permutation(int seed, int site, i64 p, i64 n, int *out, i64 *scratch) {
  u64 *a = (u64 *)scratch, *b = (u64 *)scratch + n;
  for (i64 e = 0; e < n; e++) a[e] = ((u64)(u32)tl_rng_bits(seed, site, p, e) << 32) | (u64)e;
  for (i64 w = 1; w < n; w *= 2) {
    for (i64 lo = 0; lo < n; lo += 2 * w) {
      i64 mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      i64 i = lo, j = mid, o = lo;
      while (i < mid && j < hi) b[o++] = a[i] <= a[j] ? a[i++] : a[j++];
      while (i < mid) b[o++] = a[i++];
      while (j < hi) b[o++] = a[j++];
    }
    u64 *t = a; a = b; b = t;
  }
  for (i64 e = 0; e < n; e++) out[e] = (int)(a[e] & 0xFFFFFFFFull);
}
TL_F double tl_rng_gumbel_f64(int seed, int site, i64 p, i64 e) {
  tl_lanes x = tl_rng_block(seed, site, p, e);
  u64 n = tl_rng_n53(x.x0, x.x1);
  double u = (double)((n >> 1) * 2 + 1) * 0x1p-53;
  return -tl_rng_log64(-tl_rng_log64(u));
}
"""


def head() -> str:
    """The text every module starts with (the scalar helpers and the Philox library): the
    emulation compiles it once, as a precompiled header (``timerlc.cuda.emu``)."""
    return PRELUDE + "\n" + _philox_c()


THREADS = 128  # of a block: the device runtime launches every function with blocks of them


@dataclass(frozen=True)
class Launches:
    """How a kernel runs: its functions, launched one after another (``(name, threads)``:
    the threads a launch asks for, as blocks of ``THREADS``), and the bytes of scratch
    memory a call needs (the kernel's temporaries, then the values its phases pass on)."""

    phases: tuple[tuple[str, int], ...]
    scratch: int


def render_module(kernels) -> tuple[str, dict[str, str], dict[str, Launches]]:
    """The CUDA C text of the ``kernels`` it renders (after ``head()``), why it renders none
    of the others (kernel name -> reason), and how each it renders runs."""
    parts, skipped, launches = [head()], {}, {}
    for k in kernels:
        try:
            r = _Kernel(k)
            parts.append(r.render())
            launches[k.name] = Launches(tuple(r.phases), r.scratch)
        except Unsupported as e:
            skipped[k.name] = str(e)
    return "\n".join(parts), skipped, launches


def name(v: str) -> str:
    """A local's C name (kernel IR names may hold ``.`` and ``$``)."""
    return "v_" + v.replace(".", "_").replace("$", "_")


def buf(b: str) -> str:
    """A buffer's C name (a fused kernel's temporaries are named ``t1.2``)."""
    return "m_" + b.replace(".", "_").replace("$", "_")


class _Kernel:
    def __init__(self, k: kir.Kernel):
        self.k = k
        self.lines: list[str] = []
        self.labels = 0
        self.bufs = {s.name: s.dtype for s in k.slots} | {t.name: t.dtype for t in k.temps}
        self.local_temps: set[str] = set()  # temps of a parallel loop's own (per thread)
        self.jumps: set[str] = set()  # the labels a Fail jumps to
        self.phases: list[tuple[str, int]] = []  # (function, threads) launched in order
        self.scratch = k.scratch_bytes

    def emit(self, depth: int, line: str):
        self.lines.append("  " * depth + line)

    def label(self) -> str:
        self.labels += 1
        return f"tl_skip{self.labels}"

    def end(self, depth: int, skip: str):
        """The label a ``Fail`` of the step jumps to, where one does."""
        if skip in self.jumps:
            self.emit(depth, f"{skip}:;")

    def render(self) -> str:
        _check_supported(self.k.body)
        return self.render_phases()

    # ------------------------------------------------------------------ phases
    def render_phases(self) -> str:
        """One function per step of the kernel's body, each launched over a grid: a run of
        serial statements (on one thread), a parallel loop (one thread per iteration, the
        loop striding over the grid), a gemm (one thread per element of the product). A
        value a serial step computes and a later step reads goes through the scratch
        memory after the temporaries; a failing step sets ``*err`` and the steps after it
        return at once."""
        steps: list[tuple[str, object]] = []
        serial: list = []
        self.step_of: dict[int, object] = {}  # a parallel step's loop -> its statement
        for top in self.k.body:
            s = _pushed_in(top)
            if isinstance(s, For) and s.parallel or isinstance(s, Gemm):
                if serial:
                    steps.append(("serial", serial))
                    serial = []
                steps.append(("parallel" if isinstance(s, For) else "gemm", s))
                self.step_of[id(s)] = top
            else:
                serial.append(s)
        if serial or not steps:
            steps.append(("serial", serial))
        defined = [_lets(body) if kind == "serial" else {} for kind, body in steps]
        used = [_refs([body] if kind != "serial" else body) for kind, body in steps]
        params = set(self.k.params)
        passed: dict[str, tuple[str, int]] = {}  # let -> (dtype, offset in scratch)
        offset = (self.k.scratch_bytes + 7) // 8 * 8
        for j, lets in enumerate(defined):
            for v, dt in lets.items():
                elsewhere = any(
                    v in used[q] or v in defined[q] for q in range(len(steps)) if q != j
                )
                if elsewhere and v not in passed and v not in params:
                    passed[v] = (dt, offset)
                    offset += 8
        self.scratch = offset if passed else self.k.scratch_bytes
        out = []
        for j, (kind, body) in enumerate(steps):
            fname = self.k.name if j == 0 else f"{self.k.name}_{j}"
            loads = sorted(v for v in passed if v in used[j] or v in defined[j])
            stores = sorted(v for v in passed if v in defined[j])
            out.append(self.phase(fname, kind, body, loads, stores, passed))
        return "\n".join(out)

    def phase(self, fname: str, kind: str, body, loads, stores, passed) -> str:
        self.lines = []
        self.local_temps = set()
        self.jumps = set()
        if kind == "serial":
            threads = 1
            mine = _lets(body)
            skip = self.label()
            self.emit(1, "if (blockIdx.x == 0 && threadIdx.x == 0) {")
            for v, dt in mine.items():
                if v not in loads:
                    self.emit(2, f"{CTYPE[dt]} {name(v)};")
            self.stmts(body, 2, skip)
            self.end(2, skip)
            self.emit(2, "if (tl_fail) { *err = tl_fail; return; }")
            for v in stores:
                dt, off = passed[v]
                self.emit(2, f"*({CTYPE[dt]} *)(scratch + {off}) = {name(v)};")
            self.emit(1, "}")
        elif kind == "parallel":
            threads = _extent(body)
            self.grid_loop(body, 1)
        else:
            threads = body.m * body.n
            self.gemm(
                body,
                1,
                "(long long)blockIdx.x * blockDim.x + threadIdx.x",
                "(long long)gridDim.x * blockDim.x",
            )
        self.phases.append((fname, max(1, min(threads, 1 << 31))))
        head = [
            (
                f'extern "C" __global__ void {fname}(void **table, const long long *args, '
                "char *scratch, int *err) {"
            ),
            "  if (*(volatile int *)err) return;  // an earlier step failed",
        ]
        if kind != "gemm":  # (a product cannot fail)
            head += ["  __shared__ int tl_fail;", "  if (threadIdx.x == 0) tl_fail = 0;"]
        head += self.pointers(body if kind == "serial" else [body])
        for v in loads:
            dt, off = passed[v]
            head.append(f"  {CTYPE[dt]} {name(v)} = *({CTYPE[dt]} *)(scratch + {off});")
        if kind != "gemm":
            head.append("  __syncthreads();")
        return "\n".join(head + self.lines + ["}"]) + "\n" + _emu_entry(fname)

    def grid_loop(self, s: For, depth: int):
        """A parallel loop over the grid: each thread its iterations, its own locals and its
        own copy of the per-point temporaries; a failing iteration sets its block's code,
        which goes to ``*err`` once the block is done."""
        v = name(s.var)
        temps = {t.name for t in self.k.temps}
        # (the kernel's other statements: not the one this loop came from, which
        # ``_pushed_in`` may have rewritten)
        top = self.step_of[id(s)]
        mine = temps & (_written(s.body) - _buffers([t for t in self.k.body if t is not top]))
        self.local_temps |= mine
        self.emit(
            depth,
            f"for (long long {v} = ({self.expr(s.lo)}) + (long long)blockIdx.x * blockDim.x + "
            f"threadIdx.x; {v} < {self.expr(s.hi)}; {v} += (long long)gridDim.x * blockDim.x) {{",
        )
        for t in self.k.temps:
            if t.name in mine:
                self.emit(depth + 1, f"{MTYPE[t.dtype]} {buf(t.name)}[{max(t.size, 1)}];")
        for lv, dt in _lets(s.body).items():
            self.emit(depth + 1, f"{CTYPE[dt]} {name(lv)};")
        skip = self.label()
        self.stmts(s.body, depth + 1, skip)
        self.end(depth + 1, skip)
        self.emit(depth, "}")
        self.emit(depth, "__syncthreads();")
        self.emit(depth, "if (threadIdx.x == 0 && tl_fail) atomicCAS(err, 0, tl_fail);")

    def pointers(self, body=None) -> list[str]:
        """The kernel's loop values, and the buffers and (global) temporaries that the
        statements ``body`` (default: all) use, as C locals."""
        k = self.k
        used = _buffers(k.body if body is None else body)
        out = []
        for j, p in enumerate(k.params):
            out.append(f"  const long long {name(p)} = args[{j}];  (void){name(p)};")
        for s in k.slots:
            if s.name in used:
                t = MTYPE[s.dtype]
                out.append(f"  {t} *{buf(s.name)} = ({t} *)table[{s.index}];")
        for tmp in k.temps:
            if tmp.name in used and tmp.name not in self.local_temps:
                t, b = MTYPE[tmp.dtype], buf(tmp.name)
                out.append(f"  {t} *{b} = ({t} *)(scratch + {tmp.offset});")
        return out

    def gemm(self, s: Gemm, depth: int, first: str, step: str):
        """``C = op(A) @ op(B)`` element by element, its terms summed in order: the elements
        dealt to the grid's threads (``first``, ``step``), or all on one (``"0"``, ``"1"``)."""
        t = CTYPE[s.dtype]
        a = f"A[{'k * ' + str(s.lda) + ' + i' if s.ta else 'i * ' + str(s.lda) + ' + k'}]"
        b = f"B[{'j * ' + str(s.ldb) + ' + k' if s.tb else 'k * ' + str(s.ldb) + ' + j'}]"
        self.emit(depth, "{")
        self.emit(depth + 1, f"const {t} *A = {buf(s.a)} + ({self.expr(s.aoff)});")
        self.emit(depth + 1, f"const {t} *B = {buf(s.b)} + ({self.expr(s.boff)});")
        self.emit(depth + 1, f"{t} *C = {buf(s.c)} + ({self.expr(s.coff)});")
        self.emit(depth + 1, f"for (long long e = {first}; e < {s.m}LL * {s.n}; e += {step}) {{")
        self.emit(depth + 2, f"long long i = e / {s.n}, j = e % {s.n};")
        self.emit(depth + 2, f"{t} acc = 0;")
        self.emit(depth + 2, f"for (long long k = 0; k < {s.k}; k++) acc += {a} * {b};")
        self.emit(depth + 2, f"C[i * {s.ldc} + j] = acc;")
        self.emit(depth + 1, "}")
        self.emit(depth, "}")

    # ------------------------------------------------------------------ statements
    def stmts(self, stmts, depth: int, skip: str):
        for s in stmts:
            self.stmt(s, depth, skip)

    def stmt(self, s, depth: int, skip: str):
        if isinstance(s, Let):
            self.emit(depth, f"{name(s.name)} = {self.expr(s.value)};")
        elif isinstance(s, Store):
            val = self.expr(s.value)
            if self.bufs[s.buf] == "bool":
                val = f"(unsigned char)({val})"
            self.emit(depth, f"{buf(s.buf)}[{self.expr(s.index)}] = {val};")
        elif isinstance(s, For):
            v = name(s.var)
            self.emit(
                depth,
                f"for (long long {v} = {self.expr(s.lo)}; {v} < {self.expr(s.hi)}; {v}++) {{",
            )
            self.stmts(s.body, depth + 1, skip)
            self.emit(depth, "}")
        elif isinstance(s, If):
            self.emit(depth, f"if ({self.expr(s.cond)}) {{")
            self.stmts(s.then, depth + 1, skip)
            if s.orelse:
                self.emit(depth, "} else {")
                self.stmts(s.orelse, depth + 1, skip)
            self.emit(depth, "}")
        elif isinstance(s, Fail):
            self.jumps.add(skip)
            self.emit(depth, f"{{ tl_fail = {int(s.code)}; goto {skip}; }}")
        elif isinstance(s, Gemm):  # a gemm inside a loop of thread 0 (a product per point)
            self.gemm(s, depth, "0", "1")
        elif isinstance(s, Permute):
            self.emit(
                depth,
                f"tl_rng_permutation({s.seed}, {s.site}, {self.expr(s.p)}, {s.n}LL, "
                f"{buf(s.out)}, (long long *){buf(s.scratch)});",
            )
        else:  # pragma: no cover - _check_supported refused it
            raise Unsupported(f"a {type(s).__name__} statement")

    # ------------------------------------------------------------------ expressions
    def expr(self, e) -> str:
        if isinstance(e, Const):
            return const(e.value, e.dtype)
        if isinstance(e, Ref):
            return name(e.name)
        if isinstance(e, Load):
            x = f"{buf(e.buf)}[{self.expr(e.index)}]"
            return f"({x} != 0)" if e.dtype == "bool" else x
        if isinstance(e, Cast):
            return cast(self.expr(e.x), e.x.dtype, e.dtype)
        if isinstance(e, Sel):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, Un):
            return unary(e.op, self.expr(e.x), e.x.dtype)
        if isinstance(e, Bin):
            return binary(e.op, self.expr(e.a), self.expr(e.b), e.a.dtype)
        if isinstance(e, Fn) and e.name in RNG_FUNCTIONS:
            return f"{e.name}({', '.join(self.expr(a) for a in e.args)})"
        raise Unsupported(f"the expression {type(e).__name__}")


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_FMATH = {
    "exp": "exp",
    "log": "log",
    "log1p": "log1p",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "sin": "sin",
    "cos": "cos",
    "floor": "floor",
    "ceil": "ceil",
    "round": "rint",
}


def unary(op: str, x: str, dt: str) -> str:
    s = SUFFIX[dt]
    isf = dt in ("f32", "f64")
    if op == "not":
        return f"(!{x})"
    if op == "neg":
        return f"(-{x})" if isf else f"tl_neg_{s}({x})"
    if op in ("abs", "sign"):
        if isf and op == "abs":
            return f"fabs{'f' if dt == 'f32' else ''}({x})"
        return f"tl_{op}_{s}({x})"
    if op == "sigmoid" and isf:
        return f"tl_sigmoid_{s}({x})"
    if op in _FMATH and isf:
        return f"{_FMATH[op]}{'f' if dt == 'f32' else ''}({x})"
    raise Unsupported(f"{op} of {dt}")


def binary(op: str, a: str, b: str, dt: str) -> str:
    s = SUFFIX[dt]
    isf = dt in ("f32", "f64")
    if op in _CMP:
        return f"({a} {_CMP[op]} {b})"
    if op == "and":
        return f"({a} && {b})"
    if op == "or":
        return f"({a} || {b})"
    if op in ("add", "sub", "mul"):
        if isf:
            return f"({a} {'+-*'[('add', 'sub', 'mul').index(op)]} {b})"
        return f"tl_{op}_{s}({a}, {b})"
    if op == "div" and isf:
        return f"({a} / {b})"
    if op in ("minimum", "maximum"):
        if dt == "bool":
            return f"({a} {'&&' if op == 'minimum' else '||'} {b})"
        return f"tl_{op[:3]}_{s}({a}, {b})"
    if op == "pow":
        return f"pow{'f' if dt == 'f32' else ''}({a}, {b})" if isf else f"tl_pow_{s}({a}, {b})"
    if op in ("floordiv", "mod") or (op == "rem" and not isf):
        return f"tl_{op}_{s}({a}, {b})"
    raise Unsupported(f"{op} of {dt}")


def cast(x: str, src: str, dst: str) -> str:
    if src == dst:
        return x
    if dst == "bool":
        return f"({x} != 0)"
    if src in ("f32", "f64") and dst in ("i32", "i64"):
        return f"tl_f2{dst}((double)({x}))"
    return f"(({CTYPE[dst]})({x}))"


def const(v, dtype: str) -> str:
    if dtype == "bool":
        return "true" if v else "false"
    if dtype == "i32":
        return f"({int(v)})" if int(v) != -(2**31) else "((int)0x80000000u)"
    if dtype == "i64":
        return f"({int(v)}LL)" if int(v) != -(2**63) else "((long long)0x8000000000000000ull)"
    x = float(v)
    f = "f" if dtype == "f32" else ""
    if math.isnan(x):
        return f"(({CTYPE[dtype]})tl_f64_bits(0x7FF8000000000000ull))"
    if math.isinf(x):
        return f"(({CTYPE[dtype]})({'-' if x < 0 else ''}tl_f64_bits(0x7FF0000000000000ull)))"
    if dtype == "f32":
        import numpy as np

        x = float(np.float32(x))
    bits = struct.unpack(">Q", struct.pack(">d", x))[0]
    return f"({x.hex()}{f})" if bits else f"(0.0{f})"


# ----------------------------------------------------------------------------- analyses
RNG_FUNCTIONS = frozenset(
    f"tl_rng_{f}"
    for f in (
        "uniform_f32",
        "uniform_f64",
        "uniform_range_f32",
        "uniform_range_f64",
        "normal_f32",
        "normal_f64",
        "normal_affine_f32",
        "normal_affine_f64",
        "gumbel_f64",
    )
)


def _check_supported(body):
    for s in kir.walk_tree(body):
        if isinstance(s, (kir.Loop, kir.Launch, kir.Host)):
            raise Unsupported(f"a {type(s).__name__} (a tree's statement)")
    for e in _exprs(body):
        if isinstance(e, Fn) and e.name not in RNG_FUNCTIONS:
            raise Unsupported(f"a call of {e.name}")


def _pushed_in(s):
    """``if c: for v (parallel): body`` as ``for v (parallel): if c: body`` (``c`` is the
    same at every iteration: it cannot name ``v``), so that the loop is a step of its own;
    any other statement as it is."""
    if (
        isinstance(s, If)
        and not s.orelse
        and len(s.then) == 1
        and isinstance(s.then[0], For)
        and s.then[0].parallel
    ):
        loop = s.then[0]
        return dataclasses.replace(loop, body=(If(s.cond, loop.body, ()),))
    return s


def _lets(body) -> dict:
    """The locals ``body`` assigns, with their dtypes (the first's)."""
    out: dict = {}
    for s in kir.walk_tree(body):
        if isinstance(s, Let):
            out.setdefault(s.name, s.dtype)
    return out


def _exprs(body):
    """Every expression of the statements of ``body``, nested ones included."""
    for s in kir.walk_tree(body):
        for e in kir.own_exprs(s):
            yield from kir.subexprs(e)


def _refs(body) -> set[str]:
    """Every local (and loop variable) the statements of ``body`` read."""
    return {e.name for e in _exprs(body) if isinstance(e, Ref)}


def _buffers(body) -> set[str]:
    """Every buffer (slot or temporary) the statements of ``body`` read or write."""
    out = {e.buf for e in _exprs(body) if isinstance(e, Load)}
    for s in kir.walk_tree(body):
        read, written = kir.own_buffers(s)
        out.update(read + written)
    return out


def _written(body) -> set[str]:
    """Every buffer the statements of ``body`` write."""
    return {b for s in kir.walk_tree(body) for b in kir.own_buffers(s)[1]}


def _extent(loop: For) -> int:
    """The iterations of a parallel loop, where its bounds are constants (else one block's
    worth: the loop strides over whatever grid it gets)."""
    if isinstance(loop.lo, Const) and isinstance(loop.hi, Const):
        return max(int(loop.hi.value) - int(loop.lo.value), 1)
    return THREADS


def _emu_entry(fname: str) -> str:
    """The host's entry to a function on the emulation: ``NAME_emu(table, args, scratch,
    err, blocks)`` runs it over ``blocks`` blocks (``emu.h``)."""
    return (
        f'#ifdef TL_EMU\nextern "C" void {fname}_emu(void **table, const long long *args, '
        f"char *scratch, int *err, unsigned blocks) {{\n  TL_EMU_LAUNCH(blocks, {fname}, table, "
        "args, scratch, err);\n}\n#endif\n"
    )
