"""Tests of timerlc.rng: the counter-based random streams (LANGUAGE.md section 7)."""

import hashlib
import math

import numpy as np
import pytest

from timerlc import rng

N = 10**6  # draws for the statistical checks
Z = 6.0  # every statistical bound is a 6-sigma bound (the draws are fixed by the seed)


def _chi2_bound(df: int) -> float:
    return df + Z * math.sqrt(2.0 * df)


def _chi2(counts, probs) -> float:
    counts = np.asarray(counts, np.float64)
    expected = counts.sum() * np.asarray(probs, np.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def _ulps(got, ref) -> np.ndarray:
    return np.abs(got - ref) / np.spacing(np.abs(ref))


# --------------------------------------------------------------------- Philox KAT

# Random123 known-answer vectors for philox4x32 with 10 rounds, in the format
# "counter[4] key[2]  expected[4]".  Copied from D. E. Shaw Research's
# DEShawResearch/Random123-Boost, libs/random/test/test_philox.cpp (commit 916db91a),
# whose comment says they are "cut-and-pasted from the kat_vectors file in the original
# Random123 distribution" (DEShawResearch/random123, tests/kat_vectors).
KAT = """
00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
"""


def _kat_rows():
    for line in KAT.strip().splitlines():
        w = [int(x, 16) for x in line.split()]
        yield w[0:4], w[4:6], w[6:10]


@pytest.mark.parametrize("ctr,key,expected", list(_kat_rows()))
def test_philox_known_answers(ctr, key, expected):
    out = rng.philox4x32_10(np.array(ctr, np.uint32), np.array(key, np.uint32))
    assert out.dtype == np.uint32
    assert out.tolist() == expected


def test_philox_batches_and_broadcasts_keys():
    rows = list(_kat_rows())
    ctr = np.array([r[0] for r in rows], np.uint32)
    key = np.array([r[1] for r in rows], np.uint32)
    assert rng.philox4x32_10(ctr, key).tolist() == [r[2] for r in rows]
    one_key = rng.philox4x32_10(ctr, key[2])  # [3, 4] counters with one [2] key
    for i in range(3):
        assert one_key[i].tolist() == rng.philox4x32_10(ctr[i], key[2]).tolist()


def test_philox_rejects_bad_words():
    with pytest.raises(ValueError):
        rng.philox4x32_10([0, 0, 0], [0, 0])
    with pytest.raises(ValueError):
        rng.philox4x32_10([0, 0, 0, 2**32], [0, 0])
    with pytest.raises(ValueError):
        rng.philox4x32_10([0, 0, 0, 0], [-1, 0])


# ----------------------------------------------------------- key and counter layout


def test_site_id_is_sha256_prefix_little_endian():
    # SHA-256("") = e3b0c442 98fc1c14 ...
    assert rng.site_id("") == 0x42C4B0E3
    for text in ["policy/act", "a", "net.W1", "ünïcode"]:
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        assert rng.site_id(text) == int.from_bytes(digest[:4], "little")
    assert rng.site_id("policy/act") == 0x35902434


def test_seed_reduction_mod_2_32():
    assert rng.seed32(-1) == 0xFFFFFFFF
    assert rng.seed32(2**32 + 5) == 5
    assert rng.seed32(np.int64(7)) == 7
    a = rng.uniform(-1, "s", (), (), (8,))
    assert np.array_equal(a, rng.uniform(2**32 - 1, "s", (), (), (8,)))
    assert np.array_equal(a, rng.uniform(2**64 - 1, "s", (), (), (8,)))


def test_point_index_row_major():
    assert rng.point_index((), ()) == 0
    assert rng.point_index((1, 2), (3, 4)) == 6
    assert rng.point_index((2, 3, 4), (3, 4, 5)) == 2 * 20 + 3 * 5 + 4
    assert rng.point_index((10**6, 1), (None, 7)) == 7 * 10**6 + 1  # unbounded lead dim
    all_points = [(i, j, k) for i in range(3) for j in range(4) for k in range(5)]
    assert [rng.point_index(p, (3, 4, 5)) for p in all_points] == list(range(60))
    arr = rng.point_index(np.array(all_points).reshape(3, 20, 3), (3, 4, 5))
    assert arr.dtype == np.uint64 and arr.shape == (3, 20)
    assert arr.ravel().tolist() == list(range(60))
    for bad in [(3, 0), (0, 4), (-1, 0)]:
        with pytest.raises(ValueError):
            rng.point_index(bad, (3, 4))
    with pytest.raises(ValueError):
        rng.point_index(np.array([[0, 4]]), (3, 4))
    with pytest.raises(ValueError):
        rng.point_index((0,), (3, 4))
    with pytest.raises(ValueError):
        rng.point_index((0, 0), (3, None))
    with pytest.raises(ValueError):
        rng.point_index((2**40, 0), (None, 2**24))


def test_counter_and_key_layout():
    """Element e at point P uses philox((e lo, e hi, P lo, P hi), (seed32, site id))."""
    seed, site, bounds = -3, "layout", (None, 2**40)
    point = (3, 5)
    p = 3 * 2**40 + 5  # > 2**32: exercises the point's high word
    assert rng.point_index(point, bounds) == p
    shape = (2, 3)
    ctr = np.array([[e, 0, p % 2**32, p >> 32] for e in range(6)], np.uint32)
    key = np.array([rng.seed32(seed), rng.site_id(site)], np.uint32)
    blocks = rng.philox4x32_10(ctr, key)
    x = [[int(v) for v in row] for row in blocks]
    assert rng.bits(seed, site, point, bounds, shape).ravel().tolist() == [r[0] for r in x]
    u32 = rng.uniform(seed, site, point, bounds, shape, np.float32).ravel()
    assert u32.tolist() == [(r[0] >> 8) * 2.0**-24 for r in x]
    u64 = rng.uniform(seed, site, point, bounds, shape, "f64").ravel()
    assert u64.tolist() == [(((r[0] >> 5) << 26) | (r[1] >> 6)) * 2.0**-53 for r in x]
    # Integer sites are used as is.
    assert np.array_equal(
        rng.bits(seed, rng.site_id(site), point, bounds, shape),
        rng.bits(seed, site, point, bounds, shape),
    )


def test_normal_matches_box_muller_formula():
    seed, site = 11, "bm"
    shape = (1000,)
    x = rng.philox4x32_10(
        np.array([[e, 0, 0, 0] for e in range(1000)], np.uint32),
        np.array([seed, rng.site_id(site)], np.uint32),
    ).astype(object)
    a = ((x[:, 0] >> 5) << 26) | (x[:, 1] >> 6)
    b = ((x[:, 2] >> 5) << 26) | (x[:, 3] >> 6)
    u1 = np.array([(2**53 - v) * 2.0**-53 for v in a])
    u2 = np.array([v * 2.0**-53 for v in b])
    ref = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    z64 = rng.normal(seed, site, (), (), shape, np.float64)
    np.testing.assert_allclose(z64, ref, rtol=1e-13, atol=1e-14)
    z32 = rng.normal(seed, site, (), (), shape, np.float32)
    assert z32.dtype == np.float32
    assert np.array_equal(z32.view(np.uint32), z64.astype(np.float32).view(np.uint32))


# Conformance vectors for the other backends: bit patterns of raw draws with
# seed 1234, site "policy/act", point (2, 3) of bounds (10, 5), shape [4].
GOLDEN = {
    "bits": [0x41502CE5, 0x0982FF14, 0xFCDE6D33, 0x8671EF3D],
    "uniform_f32": [0x3E82A058, 0x3D182FF0, 0x3F7CDE6D, 0x3F0671EF],
    "uniform_f64": [0x3FD0540B3FB222DC, 0x3FA305FE23475190, 0x3FEF9BCDA7CF15B9,
                    0x3FE0CE3DE75B9AFD],
    "normal_f32": [0xBF0FB954, 0xBE85F3EA, 0xBF107846, 0xBF565092],
    "normal_f64": [0xBFE1F72A7F0598D5, 0xBFD0BE7D33CBCD29, 0xBFE20F08CEBD7B44,
                   0xBFEACA124FBD0C95],
}


def test_golden_bit_patterns():
    args = (1234, "policy/act", (2, 3), (10, 5), (4,))
    assert rng.bits(*args).tolist() == GOLDEN["bits"]
    for name, fn in [("uniform", rng.uniform), ("normal", rng.normal)]:
        assert fn(*args, "f32").view(np.uint32).tolist() == GOLDEN[f"{name}_f32"]
        assert fn(*args, "f64").view(np.uint64).tolist() == GOLDEN[f"{name}_f64"]


# ----------------------------------------------------------------- order independence

DRAWS = [
    ("bits", lambda pt, sh: rng.bits(5, "site", pt, (6, 7), sh)),
    ("u32", lambda pt, sh: rng.uniform(5, "site", pt, (6, 7), sh, np.float32)),
    ("u64", lambda pt, sh: rng.uniform(5, "site", pt, (6, 7), sh, np.float64)),
    ("n32", lambda pt, sh: rng.normal(5, "site", pt, (6, 7), sh, np.float32)),
    ("n64", lambda pt, sh: rng.normal(5, "site", pt, (6, 7), sh, np.float64)),
]


@pytest.mark.parametrize("name,draw", DRAWS, ids=[d[0] for d in DRAWS])
def test_draws_do_not_depend_on_evaluation_order(name, draw):
    whole = draw((4, 2), (3, 5))
    flat = whole.ravel()
    # The same elements, drawn as another shape or as a prefix.
    assert np.array_equal(draw((4, 2), (15,)), flat)
    assert np.array_equal(draw((4, 2), (5, 3)).ravel(), flat)
    assert np.array_equal(draw((4, 2), (7,)), flat[:7])
    # One element at a time: its own Philox block, computed directly.
    key = np.array([5, rng.site_id("site")], np.uint32)
    p = rng.point_index((4, 2), (6, 7))
    for e in range(15):
        block = rng.philox4x32_10(np.array([e, 0, p, 0], np.uint32), key)
        if name == "bits":
            assert flat[e] == block[0]
        elif name == "u32":
            assert flat[e] == (int(block[0]) >> 8) * 2.0**-24
    # A batch of points, in a shuffled order, equals the points one by one.
    pts = np.array([(i, j) for i in range(6) for j in range(7)])
    pts = pts[np.random.default_rng(0).permutation(len(pts))]
    batch = draw(pts.reshape(6, 7, 2), (3, 5))
    assert batch.shape == (6, 7, 3, 5)
    for (i, j), got in zip(pts.tolist(), batch.reshape(42, 3, 5)):
        assert np.array_equal(got, draw((i, j), (3, 5)))


def test_derived_draws_do_not_depend_on_evaluation_order():
    pts = np.array([(i, j) for i in range(6) for j in range(7)])[::-1].copy()
    logits = np.random.default_rng(1).normal(size=(42, 3, 4))
    probs = np.random.default_rng(2).uniform(size=(42, 5))
    cat = rng.categorical(9, "c", pts, (6, 7), logits)
    ber = rng.bernoulli(9, "b", pts, (6, 7), probs)
    perm = rng.permutation(9, "p", pts, (6, 7), 10)
    assert cat.shape == (42, 3) and cat.dtype == np.int32
    assert ber.shape == (42, 5) and ber.dtype == bool
    assert perm.shape == (42, 10) and perm.dtype == np.int32
    for k, pt in enumerate(map(tuple, pts.tolist())):
        assert np.array_equal(cat[k], rng.categorical(9, "c", pt, (6, 7), logits[k]))
        assert np.array_equal(ber[k], rng.bernoulli(9, "b", pt, (6, 7), probs[k]))
        assert np.array_equal(perm[k], rng.permutation(9, "p", pt, (6, 7), 10))


def test_streams_differ_by_seed_site_and_point():
    base = rng.uniform(1, "a", (0,), (4,), (N // 10,), np.float64)
    others = [
        rng.uniform(2, "a", (0,), (4,), (N // 10,), np.float64),
        rng.uniform(1, "b", (0,), (4,), (N // 10,), np.float64),
        rng.uniform(1, "a", (1,), (4,), (N // 10,), np.float64),
    ]
    bound = Z / math.sqrt(N // 10)
    for other in others:
        assert np.mean(base == other) < 1e-3
        assert abs(np.corrcoef(base, other)[0, 1]) < bound
    # Swapping the element and point roles gives another stream too.
    a = rng.uniform(1, "a", (0,), (64,), (64,))
    b = rng.uniform(1, "a", np.arange(64).reshape(64, 1), (64,), ())
    assert a[0] == b[0] and np.mean(a[1:] == b[1:]) == 0


# ------------------------------------------------------------------------- uniform


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniform_range_moments_and_histogram(dtype):
    u = rng.uniform(3, "u", (), (), (N,), dtype)
    assert u.dtype == dtype
    assert u.min() >= 0.0 and u.max() < 1.0
    x = u.astype(np.float64)
    assert abs(x.mean() - 0.5) < Z * math.sqrt(1 / 12 / N)
    # Var of the sample variance of U(0,1): (mu4 - sigma^4) / N = (1/80 - 1/144) / N.
    assert abs(x.var() - 1 / 12) < Z * math.sqrt((1 / 80 - 1 / 144) / N)
    counts = np.bincount((x * 100).astype(int), minlength=100)
    assert _chi2(counts, np.full(100, 0.01)) < _chi2_bound(99)


def test_uniform_never_reaches_one():
    top = [np.uint64(0xFFFFFFFF)] * 4
    assert rng._unit(top, np.dtype(np.float32)) == np.float32(1 - 2.0**-24)
    assert rng._unit(top, np.dtype(np.float64)) == 1 - 2.0**-53
    zero = [np.uint64(0)] * 4
    assert rng._unit(zero, np.dtype(np.float32)) == 0.0


def test_uniform_lo_hi_and_init():
    u = rng.uniform(3, "u", (), (), (1000,), np.float32, lo=-2.0, hi=3.0)
    raw = rng.uniform(3, "u", (), (), (1000,), np.float32)
    assert u.dtype == np.float32
    assert np.array_equal(u, np.float32(-2.0) + np.float32(5.0) * raw)
    assert u.min() >= -2.0 and u.max() <= 3.0
    assert np.array_equal(rng.uniform_init(3, "u", (), (), (1000,), -2.0, 3.0), u)
    with pytest.raises(ValueError):
        rng.uniform(3, "u", (), (), (4,), "i32")


# -------------------------------------------------------------------------- normal


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_moments_and_histogram(dtype):
    z = rng.normal(4, "n", (), (), (N,), dtype)
    assert z.dtype == dtype
    x = z.astype(np.float64)
    assert np.isfinite(x).all() and np.abs(x).max() < 8.58  # sqrt(-2 log 2**-53)
    assert abs(x.mean()) < Z / math.sqrt(N)
    assert abs(x.var() - 1.0) < Z * math.sqrt(2.0 / N)
    edges = np.concatenate([[-np.inf], np.arange(-4.0, 4.01, 0.25), [np.inf]])
    cdf = np.array([0.5 * (1.0 + math.erf(e / math.sqrt(2.0))) for e in edges])
    counts, _ = np.histogram(x, bins=edges)
    assert _chi2(counts, np.diff(cdf)) < _chi2_bound(len(counts) - 1)


def test_normal_init():
    w = rng.normal_init(4, "w", (), (), (500, 200), std=0.1, mean=1.0)
    assert w.dtype == np.float32 and w.shape == (500, 200)
    z = rng.normal(4, "w", (), (), (500, 200), np.float32)
    assert np.array_equal(w, np.float32(1.0) + np.float32(0.1) * z)
    assert abs(w.mean() - 1.0) < Z * 0.1 / math.sqrt(w.size)
    assert abs(w.std() - 0.1) < 0.1 * Z * math.sqrt(0.5 / w.size)


# ------------------------------------------------------------------ derived draws


def test_categorical_frequencies_match_softmax():
    logits = np.array([1.0, 0.0, -1.0, 2.0, -np.inf], np.float32)
    n = 200_000
    samples = rng.categorical(5, "cat", (), (), np.broadcast_to(logits, (n, 5)))
    assert samples.shape == (n,) and samples.dtype == np.int32
    counts = np.bincount(samples, minlength=5)
    assert counts[4] == 0  # a -inf logit is never drawn
    probs = np.exp(logits[:4] - logits[:4].max())
    probs /= probs.sum()
    assert _chi2(counts[:4], probs) < _chi2_bound(3)


def test_categorical_ties_go_to_lowest_index():
    logits = np.broadcast_to(np.array([-np.inf, np.inf, np.inf, 0.0]), (1000, 4))
    assert (rng.categorical(5, "tie", (), (), logits) == 1).all()
    assert rng.categorical(5, "one", (), (), np.zeros(1)) == 0
    with pytest.raises(ValueError):
        rng.categorical(5, "none", (), (), np.zeros((3, 0)))


def test_bernoulli_rate():
    p = np.full(N, 0.3)
    hits = rng.bernoulli(6, "b", (), (), p)
    assert hits.dtype == bool
    assert abs(hits.mean() - 0.3) < Z * math.sqrt(0.3 * 0.7 / N)
    assert not rng.bernoulli(6, "b", (), (), np.zeros(1000)).any()
    assert rng.bernoulli(6, "b", (), (), np.ones(1000)).all()
    assert rng.bernoulli(6, "b", (1,), (2,), 0.5).shape == ()


def test_permutation_validity_and_uniformity():
    for n in [0, 1, 2, 17, 1000]:
        perm = rng.permutation(7, "perm", (), (), n)
        assert perm.dtype == np.int32 and sorted(perm.tolist()) == list(range(n))
    keys = rng.bits(7, "perm", (), (), (1000,))
    assert np.array_equal(rng.permutation(7, "perm", (), (), 1000),
                          np.argsort(keys, kind="stable"))
    assert not np.array_equal(rng.permutation(7, "perm", (0,), (2,), 50),
                              rng.permutation(7, "perm", (1,), (2,), 50))
    # All 24 permutations of 4 items are about equally likely.
    perms = rng.permutation(7, "perm", np.arange(48_000)[:, None], (48_000,), 4)
    codes = perms @ np.array([64, 16, 4, 1])
    _, counts = np.unique(codes, return_counts=True)
    assert len(counts) == 24
    assert _chi2(counts, np.full(24, 1 / 24)) < _chi2_bound(23)


# ------------------------------------------------------------------- float kernels


def test_log64_is_accurate():
    r = np.random.default_rng(0)
    x = np.concatenate([
        1.0 + r.uniform(-0.3, 0.45, 200_000),
        1.0 + r.uniform(-1e-6, 1e-6, 100_000),
        np.exp(r.uniform(-708.0, 709.0, 200_000)),
        r.integers(1, 2**53, 200_000) * 2.0**-53,  # the Box-Muller domain
        [2.0**-1022, np.finfo(np.float64).max, 2.0**-53, 0.5, 2.0, np.e, 1e-300],
        [np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), np.sqrt(0.5), np.sqrt(2.0)],
    ])
    got = rng.log64(x)
    assert rng.log64(1.0) == 0.0
    assert _ulps(got, np.log(x)).max() <= 2.0


def test_sin_cos_kernels_are_accurate():
    x = np.linspace(-np.pi / 4, np.pi / 4, 400_001)
    x = np.concatenate([x, [1e-300, -1e-20, 2.0**-27, np.pi / 4, -np.pi / 4]])
    nz = x != 0
    assert _ulps(rng.sin_kernel(x[nz]), np.sin(x[nz])).max() <= 2.0
    assert _ulps(rng.cos_kernel(x), np.cos(x)).max() <= 2.0


def test_sincos_turns53_against_high_precision():
    mpmath = pytest.importorskip("mpmath")
    n = np.concatenate([
        np.random.default_rng(3).integers(0, 2**53, 2000, dtype=np.uint64),
        np.array([1, 2**50 - 1, 2**50, 2**50 + 1, 2**51 - 1, 2**51 + 1, 3 * 2**50,
                  2**52 - 1, 2**52 + 1, 7 * 2**50, 2**53 - 1], np.uint64),
    ])
    s, c = rng.sincos_turns53(n)
    with mpmath.workprec(200):
        for k, sv, cv in zip(n.tolist(), s.tolist(), c.tolist()):
            a = 2 * mpmath.pi * k / mpmath.mpf(2) ** 53
            for got, ref in [(sv, mpmath.sin(a)), (cv, mpmath.cos(a))]:
                err = abs(mpmath.mpf(got) - ref) / np.spacing(abs(float(ref)))
                assert err <= 4, (k, got, ref)
    # Quarter turns are exact.
    q = np.array([0, 2**51, 2**52, 3 * 2**51], np.uint64)
    s, c = rng.sincos_turns53(q)
    assert s.tolist() == [0.0, 1.0, 0.0, -1.0] and c.tolist() == [1.0, 0.0, -1.0, 0.0]
    # And against numpy over the whole turn.
    t = np.arange(0, 2**53, 2**37, dtype=np.uint64)
    s, c = rng.sincos_turns53(t)
    ang = 2.0 * np.pi * (t.astype(np.float64) * 2.0**-53)
    np.testing.assert_allclose(s, np.sin(ang), rtol=0, atol=2e-15)
    np.testing.assert_allclose(c, np.cos(ang), rtol=0, atol=2e-15)


# -------------------------------------------------------------------- initializers


def test_glorot_fans_and_bounds():
    assert rng.glorot_fans(()) == (1, 1)
    assert rng.glorot_fans((7,)) == (7, 7)
    assert rng.glorot_fans((3, 5)) == (3, 5)
    assert rng.glorot_fans((3, 3, 16, 32)) == (9 * 16, 9 * 32)
    for shape in [(64,), (64, 32), (3, 3, 16, 32)]:
        fan_in, fan_out = rng.glorot_fans(shape)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        w = rng.glorot_uniform(8, "g", (), (), shape)
        assert w.dtype == np.float32 and w.shape == shape
        assert np.abs(w).max() <= np.float32(limit)
    w = rng.glorot_uniform(8, "g", (), (), (1000, 1000), np.float64)
    limit = math.sqrt(6.0 / 2000)
    # w = limit * (2u - 1): Var(w) = 4 limit^2 Var(u); the sample variance's sd scales alike.
    sd = 4 * limit**2 * math.sqrt((1 / 80 - 1 / 144) / N)
    assert abs(w.var() - limit**2 / 3) < Z * sd


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (16, 4, 3, 3), (10, 10)])
def test_orthogonal(shape):
    w = rng.orthogonal(9, "o", (), (), shape, gain=2.0, dtype=np.float64)
    assert w.shape == shape
    rows, cols = shape[0], math.prod(shape[1:])
    m = w.reshape(rows, cols)
    gram = m.T @ m if rows >= cols else m @ m.T
    np.testing.assert_allclose(gram, 4.0 * np.eye(min(rows, cols)), atol=1e-12)
    w32 = rng.orthogonal(9, "o", (), (), shape, gain=2.0)
    assert w32.dtype == np.float32 and np.array_equal(w32, w.astype(np.float32))
    assert not np.allclose(w, rng.orthogonal(10, "o", (), (), shape, 2.0, np.float64))
    with pytest.raises(ValueError):
        rng.orthogonal(9, "o", (), (), (5,))
