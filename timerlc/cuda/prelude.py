"""The C text every CUDA module of the renderer starts with (``render.head``): NumPy's
semantics for each scalar op and dtype (``PRELUDE``, as ``timerlc/llvm/render.py`` computes
them), the Philox library whose draws are bit for bit ``timerlc/rng.py``'s (``philox_c``),
and the kernel that sets a CUDA graph's shifts (``SHIFT_KERNEL``). Text only: the runtime
compiles it (NVRTC on a GPU, the host's compiler under ``timerlc.cuda.emu``)."""

from __future__ import annotations


def leave_out(text: str, macro: str) -> str:
    """``text`` inside ``#ifndef macro``: a compile that defines ``macro`` leaves it out."""
    end = "" if text.endswith("\n") else "\n"
    return f"#ifndef {macro}\n{text}{end}#endif\n"


# NumPy's semantics for each scalar op and dtype (as timerlc/llvm/render.py computes them)
PRELUDE = r"""
#ifndef __CUDACC_RTC__ /* NVRTC has the math library built in */
#include <math.h>
#include <string.h>
#endif
#define TL_F __host__ __device__ inline
#ifdef TL_EMU
#define TL_UNROLL
#else /* (a loop's next loads go out before its sums wait for the first: UNROLL) */
#define TL_UNROLL _Pragma("unroll @UNROLL@")
#endif
/* a chain's shared memory past what a function may declare (render._Kernel.chain_body):
   the launch's dynamic shared memory on a GPU, whose bytes the runtime asks for
   (ChainCall.shared); a block's array of ``count`` on the emulation */
#ifdef TL_EMU
#define TL_DYNAMIC_SHARED(name, count) static float4 name[count]
#else
#define TL_DYNAMIC_SHARED(name, count) extern __shared__ float4 name[]
#endif
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

/* a call's loop values, passed by value (ARGS of them at most): no copy to the device */
struct tl_args { long long v[8]; };

/* a call's loop values: the launch's, plus ``shift``'s where it is not null (a launch of a
   CUDA graph, replayed for other values of the loops around it: runtime/graphs.py) */
__device__ inline tl_args tl_shifted(const tl_args &a, const long long *shift) {
  tl_args s = a;
  if (shift)
    for (int k = 0; k < 8; k++) s.v[k] += shift[k];
  return s;
}

#ifdef TL_EMU
/* the host's entry to every function of the module on the emulation (cuda/emu.py): ``k``
   over ``blocks`` blocks (emu.h), its ``nargs`` loop values read from the host's array
   ``args``, ``shift`` passed on. One entry for all (the functions share a signature): a
   module compiles in some third less time than with an entry for each function. */
typedef void (*tl_function)(void **, const tl_args, char *, int *, const long long *);
struct tl_call {
  tl_function k;
  void **table;
  tl_args a;
  char *scratch;
  int *err;
  const long long *shift;
};
static void tl_call_thunk(void *c) {
  const tl_call *x = (const tl_call *)c;
  x->k(x->table, x->a, x->scratch, x->err, x->shift);
}
extern "C" void tl_emu_launch(tl_function k, void **table, const long long *args,
                              unsigned nargs, char *scratch, int *err, unsigned blocks,
                              const long long *shift) {
  tl_call c = {k, table, {}, scratch, err, shift};
  memcpy(c.a.v, args, (nargs < 8 ? nargs : 8) * sizeof(long long));
  tl_emu_run(blocks, tl_emu_threads(), tl_call_thunk, &c);
}
#endif

/* the stream's first failure: its code in err[0], then (as long longs from byte 8) the
   statement that failed and its call's loop values, which the runtime reads when it next
   waits for the device (runtime/cuda.py: a failure is explained then) */
__device__ inline void tl_failed(int *err, int code, long long sid, const tl_args &args) {
  if (atomicCAS(err, 0, code) == 0) {
    long long *record = (long long *)err;
    record[1] = sid;
    for (int k = 0; k < 8; k++) record[2 + k] = args.v[k];
  }
}

/* a grid-stride loop's first point for thread ``f`` of a grid of ``step`` threads, where the
   loop's point 0 goes to thread ``off`` (loops side by side over one grid): ``f - off``, or
   for the threads before ``off`` the first of their points ``f - off + k * step`` >= 0: one
   step on where the grid spans the loop's offset, as it mostly does (a division of 64-bit
   values is a call of some hundred instructions: PPO's copies of the weights, 60 loops side
   by side, made one each a thread) */
__device__ inline long long tl_skew(long long f, long long off, long long step) {
  long long g = f - off;
  if (g >= 0) return g;
  if (g + step >= 0) return g + step;
  return g + ((-g + step - 1) / step) * step;
}

/* the blocks' tickets of a reduction whose last block combines the partial results (one
   counter after the failure record: the calls of kernels with scratch memory never run at
   once, and the last block sets it back to 0) */
__device__ inline unsigned *tl_count(int *err) { return (unsigned *)((long long *)err + 10); }

/* an array reduction's blocks in groups of tl_group_size(blocks), about the square root of
   their number: the last block of each group to finish combines the group's partial copies
   into its first, with a counter a group after tl_count (at most 256 groups: runtime/cuda.py's
   ERR_WORDS); then the last of those combines the groups' (a last block alone read all the
   copies, one after another: 2,048 of them were as many loads a thread); 1 where one group
   would hold them all (no groups: the last block combines the copies) */
__device__ inline unsigned *tl_groups(int *err) { return (unsigned *)((long long *)err + 11); }
__device__ inline unsigned tl_group_size(unsigned blocks) {
  unsigned g = (unsigned)sqrtf((float)blocks);
  while (g * g < blocks) g++;
  return g < blocks ? g : 1;
}

/* a launch's blocks between a product of ours and the loops beside it (render's
   own_beside): the product's first, as many as it asks for (pb) where the loops keep as many
   as they ask for (lb) or an eighth of the grid, whichever is fewer, and one at least (a
   product's block has far more work than a loop's: a 65,536 x 64 x 64 product's 1,024
   tiles on a grid of 660 lost half their blocks to cheap loops at a half); one block alone
   makes both */
__device__ inline unsigned tl_beside_split(unsigned grid, unsigned pb, unsigned lb) {
  if (grid <= 1) return 1;
  unsigned l = lb < grid / 8 ? lb : grid / 8;
  if (l < 1) l = 1;
  return pb < grid - l ? pb : grid - l;
}

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

/* TF32 (cuda/products.py's TF32 functions, --matmul-precision tensorfloat32): a float as
   the tensor cores take it, 10 bits of mantissa (cvt.rna: to the nearest, ties away from
   zero), its bits and its value; and mma.sync m16n8k8, d (16 x 8) += a (16 x 8) @ b (8 x 8)
   over a warp's fragments (an Ampere's or later: the functions that call it run only where
   TF32 is asked for). The emulation's own are in emu.h. */
#ifndef TL_EMU
__device__ __forceinline__ unsigned tl_tf32(float x) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#else
  return __float_as_uint(x);
#endif
}
__device__ __forceinline__ float tl_tf32_value(float x) { return __uint_as_float(tl_tf32(x)); }
__device__ __forceinline__ void tl_mma_tf32(float *d, const unsigned *a, const unsigned *b) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}
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
TL_F u64 tl_perm_key_at(int seed, int site, i64 p, i64 e) {
  return ((u64)(u32)tl_rng_bits(seed, site, p, e) << 32) | (u64)e;
}
TL_F void tl_rng_permutation(int seed, int site, i64 p, i64 n, int *out, i64 *scratch) {
  u64 *a = (u64 *)scratch, *b = (u64 *)scratch + n;
  for (i64 e = 0; e < n; e++) a[e] = tl_perm_key_at(seed, site, p, e);
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
/* the same on the grid (a kernel's step per call, render._Kernel.permute): the keys, then
   each pass of the merge sort by rank (an element's place in its pair of runs is its place
   in its run plus the partner run's keys below it, a binary search), then the indices */
TL_F void tl_perm_key(int seed, int site, i64 p, i64 e, u64 *a) {
  a[e] = tl_perm_key_at(seed, site, p, e);
}
/* or by buckets (render._Kernel.perm_buckets): key e's bucket, the top d bits of its draw
   (the buckets in the keys' order) */
TL_F unsigned tl_perm_bucket(u64 key, int d) { return d ? (unsigned)(key >> (64 - d)) : 0u; }
TL_F void tl_perm_merge(const u64 *src, u64 *dst, i64 n, i64 w, i64 e) {
  u64 x = src[e];
  i64 run = e / w, lo = run * w, pair = (run & ~1LL) * w;
  i64 plo = (run & 1) ? pair : pair + w;
  if (plo > n) plo = n;
  i64 phi = plo + w < n ? plo + w : n, a = plo, b = phi;
  while (a < b) {
    i64 m = a + (b - a) / 2;
    if (src[m] < x) a = m + 1; else b = m;
  }
  dst[pair + (e - lo) + (a - plo)] = x;
}
TL_F double tl_rng_gumbel_f64(int seed, int site, i64 p, i64 e) {
  tl_lanes x = tl_rng_block(seed, site, p, e);
  u64 n = tl_rng_n53(x.x0, x.x1);
  double u = (double)((n >> 1) * 2 + 1) * 0x1p-53;
  return -tl_rng_log64(-tl_rng_log64(u));
}
"""


# the shifts of a CUDA graph's call sites (runtime/graphs.py), set on the device before a
# replay: ``shift[i]`` is ``d.v[index[i] - 1]``, or 0 where ``index[i]`` is 0 (the changes of
# the outer loops' parts by value, as loop values are: no copy from the host's memory)
SHIFT_KERNEL = r"""
extern "C" __global__ void tl_set_shift(long long *shift, const int *index, long long n,
                                        const tl_args d) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    shift[i] = index[i] ? d.v[index[i] - 1] : 0;
}
#ifdef TL_EMU
extern "C" void tl_set_shift_emu(long long *shift, const int *index, long long n,
                                 const long long *d, unsigned blocks) {
  tl_args a = {};
  memcpy(a.v, d, 8 * sizeof(long long));
  TL_EMU_LAUNCH(blocks, tl_set_shift, shift, index, n, a);
}
#endif
"""
