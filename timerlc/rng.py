"""Counter-based random streams of RTL (LANGUAGE.md section 7): the cross-backend contract.

This module is the reference implementation of every random draw of an RTL program.  It
imports only NumPy and the standard library, so compiled runtimes can import it without
the compiler.  The LLVM and CUDA backends reimplement the *raw draws* below bit for bit;
this docstring is the specification they follow.

Generator: Philox4x32-10 (Salmon et al., SC'11; Random123)
-----------------------------------------------------------
State: counter (c0, c1, c2, c3) and key (k0, k1), all uint32.  One round::

    p0 = 0xD2511F53 * c0          (exact 64-bit product)
    p1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) = (hi32(p1) ^ c1 ^ k0, lo32(p1), hi32(p0) ^ c3 ^ k1, lo32(p0))

Ten rounds; between consecutive rounds (9 times) the key is bumped:
``k0 += 0x9E3779B9, k1 += 0xBB67AE85`` (mod 2**32).  The output is the final counter,
lanes ``x0 x1 x2 x3``.  Checked against Random123's known-answer vectors.

Key, counter and indices
------------------------
* ``seed``: any Python int, reduced to ``seed32 = seed mod 2**32`` (Python ``%``, so
  ``-1 -> 0xFFFFFFFF``).
* ``site``: a string is mapped to ``site_id(text)`` = the first 4 bytes of
  SHA-256(text as UTF-8), read little endian; an int in [0, 2**32) is used as is.
* key = ``(k0, k1) = (seed32, site32)``.
* point index ``P``: the iteration point ``(p_0, ..., p_{d-1})`` linearized row-major
  with the dims' bounds as radices, ``P = (...((p_0 * b_1 + p_1) * b_2 + p_2)...)``;
  ``P = 0`` for an equation without dims.  ``b_0`` is only range-checked (it may be None
  for an unbounded leading dim).  ``P`` must be < 2**64.
* element index ``E``: the row-major position of the element in the draw's shape
  (``E = 0`` for a scalar), < 2**64.
* counter = ``(E mod 2**32, E >> 32, P mod 2**32, P >> 32)``.  One Philox call per
  element; an element uses up to the 4 lanes of its block.

Raw draws (bit-identical across backends)
-----------------------------------------
Every float operation below is one IEEE-754 binary64/binary32 operation with
round-to-nearest-even, evaluated exactly in the written order: no fused multiply-add
(C: ``-ffp-contract=off``; CUDA: ``__dmul_rn``/``__dadd_rn`` or ``-fmad=false``; LLVM: no
``fmuladd`` and no fast-math flags), no reassociation, no excess precision.  Integer to
float conversions below are exact.  ``f32(v)`` is round-to-nearest f64 -> f32.

* ``bits``: ``x0`` (uint32).
* ``n53(a, b) = ((a >> 5) << 26) | (b >> 6)`` (uint64 < 2**53: the top 27 bits of ``a``
  over the top 26 bits of ``b``).
* ``uniform`` f32: ``float(x0 >> 8) * 2**-24`` (top 24 bits of x0), in [0, 1 - 2**-24].
  ``uniform`` f64: ``float(n53(x0, x1)) * 2**-53``, in [0, 1 - 2**-53].  Both exact.
  With ``lo``/``hi`` (rounded to the dtype first): ``d = hi - lo; t = d * u; r = lo + t``
  in the dtype (may round up to ``hi``).
* ``normal`` (computed in f64, then rounded once to the dtype)::

      a = n53(x0, x1);  b = n53(x2, x3)
      u1 = float(2**53 - a) * 2**-53             # in (0, 1], exact
      L  = log64(u1);   r = sqrt(-2.0 * L)       # sqrt correctly rounded
      (s, c) = sincos_turns53(b)                 # sin/cos of 2*pi*b*2**-53
      z  = r * c

* ``log64(x)`` (fdlibm e_log.c, single branch, x positive normal finite)::

      bits = bitcast<u64>(x); e = (bits >> 52) - 1023; m = bits & (2**52 - 1)
      if m >= 0x6A09C00000000: k = e + 1; y = bitcast<f64>(m | 0x3FE0000000000000)
      else:                    k = e;     y = bitcast<f64>(m | 0x3FF0000000000000)
      f = y - 1.0;  hfsq = (0.5 * f) * f;  s = f / (2.0 + f);  z = s * s;  w = z * z
      t1 = w * (LG2 + w * (LG4 + w * LG6))
      t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)));  R = t2 + t1;  dk = float(k)
      log64 = dk * LN2_HI - ((hfsq - (s * (hfsq + R) + dk * LN2_LO)) - f)

* ``sincos_turns53(n)`` for an integer 0 <= n < 2**53 (angle ``2*pi*n/2**53``)::

      q = (n + 2**50) >> 51                      # nearest quarter turn, 0..4
      j = n - (q << 51)                          # signed, in [-2**50, 2**50)
      x = float(j) * TWOPI_2M53                  # |x| <= pi/4 (one rounding)
      S = ksin(x);  C = kcos(x)
      q & 3 == 0: (S, C);  1: (C, -S);  2: (-S, -C);  3: (-C, S)   -> (sin, cos)

  ``ksin(x)``: ``z = x*x; v = z*x; r = S2+z*(S3+z*(S4+z*(S5+z*S6))); x + v*(S1+z*r)``.
  ``kcos(x)``: ``z = x*x; r = z*(C1+z*(C2+z*(C3+z*(C4+z*(C5+z*C6)))));``
  ``hz = 0.5*z; w = 1.0-hz; w + (((1.0-w)-hz) + z*r)`` (fdlibm k_sin.c / k_cos.c).
  The constants (``_HEX`` below) are given as exact binary64 bit patterns.

Derived draws (deterministic; other backends need only agree within tolerance)
------------------------------------------------------------------------------
* ``categorical(logits)``: one draw per (element, category) over the logits' shape;
  ``u = float(2 * (n53(x0, x1) >> 1) + 1) * 2**-53`` in (0, 1); Gumbel
  ``g = -log64(-log64(u))``; sample = first argmax over the last axis of
  ``f64(logits) + g`` (ties -> lowest index).
* ``bernoulli(p)``: ``uniform_f64 < f64(p)``.
* ``permutation(n)``: stable argsort of ``bits`` over shape ``[n]`` (ties by index).
* initializers (one site per params field): ``glorot_uniform`` = ``uniform`` with
  ``hi = -lo = sqrt(6.0 / (fan_in + fan_out))`` (f64; Keras fans: 1-D ``(n, n)``, 2-D
  ``shape``, more dims ``(shape[-2] * rf, shape[-1] * rf)``, ``rf = prod(shape[:-2])``);
  ``uniform_init`` = ``uniform`` with lo/hi; ``normal_init`` = ``mean + std * z`` in the
  dtype (product first); ``orthogonal`` as torch.nn.init.orthogonal_: f64 normals of
  shape ``(rows, prod(rest))``, transposed if rows < cols, ``Q * sign(diag R)`` (0 -> 1)
  from a host QR, transposed back, times gain, rounded to the dtype.

Dtypes of float draws: f32 or f64 (``np.float32``/``np.float64`` or ``"f32"``/``"f64"``).

Batches of points
-----------------
Every draw takes ``point`` either as a tuple of ints (one point) or as an integer array
of shape ``[..., ndims]``; a batch of points adds those leading axes to the result, and
each entry equals the draw at that single point.  For ``categorical``/``bernoulli`` the
parameter's leading axes must then equal the batch shape.
"""

from __future__ import annotations

import hashlib
import math
import operator
import struct

import numpy as np

__all__ = [
    "bernoulli",
    "bits",
    "categorical",
    "cos_kernel",
    "glorot_fans",
    "glorot_uniform",
    "log64",
    "normal",
    "normal_init",
    "orthogonal",
    "permutation",
    "philox4x32_10",
    "point_index",
    "seed32",
    "sin_kernel",
    "sincos_turns53",
    "site_id",
    "uniform",
    "uniform_init",
]

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10

_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)


def _f64(bits_hex: str) -> float:
    """The binary64 value with the given 16-hex-digit bit pattern."""
    return struct.unpack("<d", int(bits_hex, 16).to_bytes(8, "little"))[0]


# fdlibm constants, as bit patterns (e_log.c, k_sin.c, k_cos.c).
_HEX = {
    "LN2_HI": "3FE62E42FEE00000",
    "LN2_LO": "3DEA39EF35793C76",
    "LG1": "3FE5555555555593",
    "LG2": "3FD999999997FA04",
    "LG3": "3FD2492494229359",
    "LG4": "3FCC71C51D8E78AF",
    "LG5": "3FC7466496CB03DE",
    "LG6": "3FC39A09D078C69F",
    "LG7": "3FC2F112DF3E5244",
    "S1": "BFC5555555555549",
    "S2": "3F8111111110F8A6",
    "S3": "BF2A01A019C161D5",
    "S4": "3EC71DE357B1FE7D",
    "S5": "BE5AE5E68A2B9CEB",
    "S6": "3DE5D93A5ACFD57C",
    "C1": "3FA555555555554C",
    "C2": "BF56C16C16C15177",
    "C3": "3EFA01A019CB1590",
    "C4": "BE927E4F809C52AD",
    "C5": "3E21EE9EBDB4B1C4",
    "C6": "BDA8FAE9BE8838D4",
    # fl(2*pi) * 2**-53 (= 0x1.921fb54442d18p-51)
    "TWOPI_2M53": "3CC921FB54442D18",
}
_K = {name: _f64(h) for name, h in _HEX.items()}
LN2_HI, LN2_LO = _K["LN2_HI"], _K["LN2_LO"]
LG1, LG2, LG3, LG4, LG5, LG6, LG7 = (_K[f"LG{i}"] for i in range(1, 8))
S1, S2, S3, S4, S5, S6 = (_K[f"S{i}"] for i in range(1, 7))
C1, C2, C3, C4, C5, C6 = (_K[f"C{i}"] for i in range(1, 7))
TWOPI_2M53 = _K["TWOPI_2M53"]
_LOG_SPLIT = 0x6A09C00000000  # mantissa of ~sqrt(2): fdlibm's (hx + 0x95f64) & 0x100000
_TWO_M24 = 2.0**-24
_TWO_M53 = 2.0**-53


# --------------------------------------------------------------------------- Philox


def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 arrays holding 32-bit words (broadcasting)."""
    m0, m1, w0, w1 = _U64(PHILOX_M0), _U64(PHILOX_M1), _U64(PHILOX_W0), _U64(PHILOX_W1)
    k0, k1 = np.asarray(k0, _U64), np.asarray(k1, _U64)
    sh = _U64(32)
    for rnd in range(PHILOX_ROUNDS):
        if rnd:
            k0, k1 = (k0 + w0) & _M32, (k1 + w1) & _M32
        p0 = c0 * m0
        p1 = c2 * m1
        c0, c1, c2, c3 = (p1 >> sh) ^ c1 ^ k0, p1 & _M32, (p0 >> sh) ^ c3 ^ k1, p0 & _M32
    return c0, c1, c2, c3


def _words(a, n: int, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "ui" or a.ndim < 1 or a.shape[-1] != n:
        raise ValueError(f"{what} must be an integer array of shape [..., {n}]")
    if (a.dtype.kind == "i" and (a < 0).any()) or (a.astype(_U64) >> _U64(32)).any():
        raise ValueError(f"{what} words must lie in [0, 2**32)")
    return a.astype(_U64)


def philox4x32_10(counter, key) -> np.ndarray:
    """Philox4x32-10: counter uint32 [..., 4], key uint32 [..., 2] (broadcast) -> [..., 4]."""
    c, k = _words(counter, 4, "counter"), _words(key, 2, "key")
    out = _philox(c[..., 0], c[..., 1], c[..., 2], c[..., 3], k[..., 0], k[..., 1])
    return np.stack(np.broadcast_arrays(*out), axis=-1).astype(np.uint32)


# ----------------------------------------------------------------- keys and indices


def site_id(text: str) -> int:
    """Stable 32-bit id of a site: first 4 bytes of SHA-256(UTF-8 text), little endian."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little")


def seed32(seed) -> int:
    """The key word of a seed: any integer, reduced mod 2**32."""
    return operator.index(seed) % 2**32


def _site32(site) -> int:
    if isinstance(site, str):
        return site_id(site)
    s = operator.index(site)
    if not 0 <= s < 2**32:
        raise ValueError(f"an integer site must lie in [0, 2**32), got {s}")
    return s


def _check_bounds(bounds) -> tuple:
    bounds = tuple(None if b is None else operator.index(b) for b in bounds)
    for d, b in enumerate(bounds):
        if b is None and d:
            raise ValueError("only the first (leading) bound may be None")
        if b is not None and b < 1:
            raise ValueError(f"bound {b} of dim {d} must be positive")
    return bounds


def point_index(point, bounds):
    """Row-major index of ``point`` with ``bounds`` as radices (see the module docstring).

    ``point`` a tuple of ints -> a Python int; an integer array ``[..., ndims]`` -> a
    uint64 array of shape ``[...]``.
    """
    bounds = _check_bounds(bounds)
    if isinstance(point, np.ndarray):
        return _point_array(point, bounds)
    point = tuple(operator.index(p) for p in point)
    if len(point) != len(bounds):
        raise ValueError(f"point {point} has {len(point)} entries, bounds {len(bounds)}")
    idx = 0
    for d, (p, b) in enumerate(zip(point, bounds)):
        if p < 0 or (b is not None and p >= b):
            raise ValueError(f"point {point} lies outside bounds {bounds} (dim {d})")
        idx = p if d == 0 else idx * b + p
    if idx >= 2**64:
        raise ValueError(f"point index of {point} does not fit in 64 bits")
    return idx


def _point_array(pts: np.ndarray, bounds: tuple) -> np.ndarray:
    if pts.dtype.kind not in "ui" or pts.ndim < 1 or pts.shape[-1] != len(bounds):
        raise ValueError(f"a batch of points must be an integer array [..., {len(bounds)}]")
    out = np.zeros(pts.shape[:-1], _U64)
    if pts.size == 0 or not bounds:
        return out
    if (pts < 0).any():
        raise ValueError("point entries must be non-negative")
    rest = 1
    for d, b in enumerate(bounds):
        if b is not None and (pts[..., d] >= b).any():
            raise ValueError(f"a point lies outside bounds {bounds} (dim {d})")
        rest *= b if d else 1
    if (int(pts[..., 0].max()) + 1) * rest > 2**64:
        raise ValueError("point indices do not fit in 64 bits")
    for d, b in enumerate(bounds):
        out = out * _U64(b if d else 0) + pts[..., d].astype(_U64)
    return out


def _points(point, bounds) -> tuple[np.ndarray, tuple]:
    """(point indices uint64 of the batch shape, batch shape)."""
    if isinstance(point, np.ndarray) and point.ndim >= 1:
        idx = point_index(point, bounds)
        return idx, idx.shape
    return np.asarray(point_index(point, bounds), _U64), ()


def _shape(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    shape = tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative extent in shape {shape}")
    if math.prod(shape) > 2**64:
        raise ValueError(f"shape {shape} has more than 2**64 elements")
    return shape


def _lanes(seed, site, point, bounds, shape):
    """The 4 Philox lanes (uint64 arrays < 2**32) of each element, shape batch + shape."""
    shape = _shape(shape)
    pidx, batch = _points(point, bounds)
    e = np.arange(math.prod(shape), dtype=_U64).reshape(shape)
    p = pidx.reshape(batch + (1,) * len(shape))
    sh = _U64(32)
    lanes = _philox(e & _M32, e >> sh, p & _M32, p >> sh, seed32(seed), _site32(site))
    full = batch + shape
    return [np.broadcast_to(x, full) for x in lanes], batch


def _n53(a, b):
    return ((a >> _U64(5)) << _U64(26)) | (b >> _U64(6))


def _float_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype({"f32": np.float32, "f64": np.float64}.get(dtype, dtype))
    except TypeError:
        dt = np.dtype(np.int8)
    if dt.kind != "f" or dt.itemsize not in (4, 8):
        raise ValueError(f"random floats are f32 or f64, not {dtype}")
    return dt


# ---------------------------------------------------------------------- float kernels


def log64(x) -> np.ndarray:
    """Natural log of positive normal finite float64 values, basic IEEE ops only."""
    b = np.asarray(x, np.float64).view(_U64)
    e = (b >> _U64(52)).astype(np.int64) - 1023
    m = b & _U64((1 << 52) - 1)
    big = m >= _U64(_LOG_SPLIT)
    k = e + big
    y = (m | np.where(big, _U64(0x3FE << 52), _U64(0x3FF << 52))).view(np.float64)
    f = y - 1.0
    hfsq = (0.5 * f) * f
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (LG2 + w * (LG4 + w * LG6))
    t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)))
    r = t2 + t1
    dk = k.astype(np.float64)
    return dk * LN2_HI - ((hfsq - (s * (hfsq + r) + dk * LN2_LO)) - f)


def sin_kernel(x) -> np.ndarray:
    """sin(x) for |x| <= pi/4 (fdlibm __kernel_sin with a zero tail)."""
    x = np.asarray(x, np.float64)
    z = x * x
    v = z * x
    r = S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))
    return x + v * (S1 + z * r)


def cos_kernel(x) -> np.ndarray:
    """cos(x) for |x| <= pi/4 (fdlibm __kernel_cos with a zero tail)."""
    x = np.asarray(x, np.float64)
    z = x * x
    r = z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + z * r)


def sincos_turns53(n) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos) of 2*pi*n/2**53 for integers 0 <= n < 2**53; exact quadrant reduction."""
    n = np.asarray(n, _U64)
    q = (n + _U64(1 << 50)) >> _U64(51)
    j = n.astype(np.int64) - (q << _U64(51)).astype(np.int64)
    x = j.astype(np.float64) * TWOPI_2M53
    s, c = sin_kernel(x), cos_kernel(x)
    q = q & _U64(3)
    odd = (q & _U64(1)).astype(bool)
    sin = np.where(odd, c, s)
    cos = np.where(odd, s, c)
    sin = np.where(q >= _U64(2), -sin, sin)
    cos = np.where((q == _U64(1)) | (q == _U64(2)), -cos, cos)
    return sin, cos


# -------------------------------------------------------------------------- raw draws


def bits(seed, site, point, bounds, shape, dtype=None) -> np.ndarray:
    """Raw uint32 lane 0 of each element (sort keys); ``dtype`` is ignored."""
    (x0, _, _, _), _ = _lanes(seed, site, point, bounds, shape)
    return x0.astype(np.uint32)


def _unit(lanes, dt: np.dtype) -> np.ndarray:
    if dt == np.float32:
        return (lanes[0] >> _U64(8)).astype(np.float32) * np.float32(_TWO_M24)
    return _n53(lanes[0], lanes[1]).astype(np.float64) * _TWO_M53


def uniform(seed, site, point, bounds, shape, dtype=np.float32, lo=0.0, hi=1.0):
    """Uniform draws in [0, 1) (exact, see the docstring), scaled to [lo, hi) if given."""
    dt = _float_dtype(dtype)
    lanes, _ = _lanes(seed, site, point, bounds, shape)
    u = _unit(lanes, dt)
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and (lo, hi) == (0, 1):
        return u
    lo, hi = np.asarray(lo, dt), np.asarray(hi, dt)
    return (lo + (hi - lo) * u).astype(dt)


def normal(seed, site, point, bounds, shape, dtype=np.float32) -> np.ndarray:
    """Standard normal draws by Box-Muller (one per element), computed in f64."""
    dt = _float_dtype(dtype)
    (x0, x1, x2, x3), _ = _lanes(seed, site, point, bounds, shape)
    u1 = (_U64(1 << 53) - _n53(x0, x1)).astype(np.float64) * _TWO_M53
    r = np.sqrt(-2.0 * log64(u1))
    _, c = sincos_turns53(_n53(x2, x3))
    return (r * c).astype(dt)


# ---------------------------------------------------------------------- derived draws


def _elem_shape(param: np.ndarray, batch: tuple, what: str) -> tuple:
    if param.shape[: len(batch)] != batch:
        raise ValueError(
            f"{what} of shape {param.shape} must start with the point batch shape {batch}"
        )
    return param.shape[len(batch) :]


def _batch_of(point) -> tuple:
    if isinstance(point, np.ndarray) and point.ndim >= 1:
        return point.shape[:-1]
    return ()


def gumbel(seed, site, point, bounds, shape, dtype=np.float64) -> np.ndarray:
    """Standard Gumbel noise ``-log(-log(u))``, u uniform in (0, 1) on an odd 53-bit grid,
    in f64 (``dtype`` must be f64): the noise of ``categorical``, which does not depend on
    the logits (the compiler draws it ahead, for a whole rollout at once)."""
    if _float_dtype(dtype) != np.float64:
        raise ValueError("gumbel noise is f64")
    (x0, x1, _, _), _ = _lanes(seed, site, point, bounds, shape)
    u = ((_n53(x0, x1) >> _U64(1)) * _U64(2) + _U64(1)).astype(np.float64) * _TWO_M53
    return -log64(-log64(u))


def categorical(seed, site, point, bounds, logits) -> np.ndarray:
    """One int32 sample along the last axis of ``logits`` by Gumbel-max:
    ``argmax(f64(logits) + gumbel(same key, logits' shape))``."""
    logits = np.asarray(logits)
    shape = _elem_shape(logits, _batch_of(point), "logits")
    if not shape or shape[-1] == 0:
        raise ValueError("categorical needs logits with a non-empty last axis")
    g = gumbel(seed, site, point, bounds, shape)
    return np.argmax(logits.astype(np.float64) + g, axis=-1).astype(np.int32)


def bernoulli(seed, site, point, bounds, p) -> np.ndarray:
    """Bool draws ``uniform_f64 < p``, one per element of ``p``."""
    p = np.asarray(p, np.float64)
    shape = _elem_shape(p, _batch_of(point), "p")
    return uniform(seed, site, point, bounds, shape, np.float64) < p


def permutation(seed, site, point, bounds, n: int) -> np.ndarray:
    """An int32 permutation of range(n): stable argsort of ``bits`` over shape [n]."""
    keys = bits(seed, site, point, bounds, (operator.index(n),))
    return np.argsort(keys, axis=-1, kind="stable").astype(np.int32)


# ----------------------------------------------------------------------- initializers


def glorot_fans(shape) -> tuple[int, int]:
    """(fan_in, fan_out) by the Keras rule (receptive field product for > 2 dims)."""
    shape = _shape(shape)
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    rf = math.prod(shape[:-2])
    return shape[-2] * rf, shape[-1] * rf


def glorot_uniform(seed, site, point, bounds, shape, dtype=np.float32) -> np.ndarray:
    """Glorot/Xavier uniform in [-l, l), l = sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = glorot_fans(shape)
    limit = math.sqrt(6.0 / max(1, fan_in + fan_out))
    return uniform(seed, site, point, bounds, shape, dtype, lo=-limit, hi=limit)


def orthogonal(seed, site, point, bounds, shape, gain=1.0, dtype=np.float32):
    """As torch.nn.init.orthogonal_: QR of an f64 normal (rows, prod(rest)) matrix."""
    shape, dt = _shape(shape), _float_dtype(dtype)
    if len(shape) < 2:
        raise ValueError("orthogonal needs a shape with at least 2 dims")
    if _batch_of(point):
        raise ValueError("orthogonal takes a single point")
    rows = shape[0]
    cols = math.prod(shape[1:])
    a = normal(seed, site, point, bounds, (rows, cols), np.float64)
    if rows < cols:
        a = a.T
    q, r = np.linalg.qr(a)
    d = np.sign(np.diagonal(r))
    q = q * np.where(d == 0, 1.0, d)
    if rows < cols:
        q = q.T
    return (q * gain).reshape(shape).astype(dt)


def normal_init(seed, site, point, bounds, shape, std=1.0, mean=0.0, dtype=np.float32):
    """``mean + std * z`` in the dtype (product first), z the raw normal of the dtype."""
    dt = _float_dtype(dtype)
    z = normal(seed, site, point, bounds, shape, dt)
    return (np.asarray(mean, dt) + np.asarray(std, dt) * z).astype(dt)


def uniform_init(seed, site, point, bounds, shape, lo=0.0, hi=1.0, dtype=np.float32):
    """Uniform in [lo, hi): ``uniform(..., lo=lo, hi=hi)``."""
    return uniform(seed, site, point, bounds, shape, dtype, lo=lo, hi=hi)
