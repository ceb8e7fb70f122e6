"""Conformance tests from LANGUAGE.md section 5: temporal indexing (points, slices, basis
shorthand), dynamic slices in each reduction, spatial indexing (ints, slices, gathers) and
dims used as values.
"""

import numpy as np
import pytest
from rtl_helpers import close, run, run1

# ============================================================================ temporal indexing


def test_temporal_slices_add_leading_axes_in_order():
    out = run(
        """
        config I = 2, B = 3, T = 4
        dim i < I
        dim b < B
        dim t < T
        r[i, b, t] = f32(100 * i + 10 * b + t)
        s[i] = r[i, 0:B, 0:T]
        u[i] = r[i, 1:3, 2]
        v[b] = r[0:I, b, 1:3]
        out r, s, u, v
        """
    )
    r = out["r"]
    i, b, t = np.meshgrid(np.arange(2), np.arange(3), np.arange(4), indexing="ij")
    close(r, (100 * i + 10 * b + t).astype(np.float32))
    close(out["s"], r)
    close(out["u"], r[:, 1:3, 2])
    close(out["v"], np.transpose(r[:, :, 1:3], (1, 0, 2)))


def test_temporal_slice_then_spatial_axes():
    out = run(
        """
        config T = 3
        dim t < T
        x[t] = f32(arange(2)) + 10.0 * f32(t)
        y = x[0:T]
        z = x[1:3]
        out y, z
        """
    )
    x = np.arange(2, dtype=np.float32)[None, :] + 10 * np.arange(3, dtype=np.float32)[:, None]
    close(out["y"], x)
    close(out["z"], x[1:3])


def test_temporal_slice_with_open_bounds():
    out = run(
        """
        config T = 4
        dim t < T
        x[t] = f32(t)
        y = x[:]
        z = x[1:]
        w = x[:2]
        out y, z, w
        """
    )
    x = np.arange(4, dtype=np.float32)
    close(out["y"], x)
    close(out["z"], x[1:])
    close(out["w"], x[:2])


def test_temporal_point_indices_offsets_and_constants():
    out = run(
        """
        config T = 5
        dim t < T
        x[t] = f32(t * t)
        a[t] = x[T-1] + x[0] when t < 1
        b[t] = x[t+1] - x[t] when t < T - 1
        c[t] = x[t-1] when t >= 1
        d[t] = x[t // 2]
        e[t] = x[min(t + 1, T - 1)]
        f[t] = x[max(t - 2, 0)]
        g[t] = x[(t + 2) % T]
        out a, b, c, d, e, f, g
        """
    )
    x = np.arange(5, dtype=np.float32) ** 2
    t = np.arange(5)
    close(out["a"], np.array([x[4] + x[0]], np.float32))
    close(out["b"], x[1:] - x[:-1])
    close(out["c"], np.concatenate([[0], x[:-1]]).astype(np.float32))
    close(out["d"], x[t // 2])
    close(out["e"], x[np.minimum(t + 1, 4)])
    close(out["f"], x[np.maximum(t - 2, 0)])
    close(out["g"], x[(t + 2) % 5])


def test_temporal_slice_bounds_with_config_arithmetic():
    out = run(
        """
        config T = 6, H = 2
        dim t < T
        x[t] = f32(t)
        y = x[H:T-H]
        out y
        """
    )
    close(out["y"], np.arange(2, 4, dtype=np.float32))


def test_basis_shorthand_reads_the_same_point():
    out = run(
        """
        config I = 2, T = 3
        dim i < I
        dim t < T
        a[i, t] = f32(i * 10 + t)
        b[t] = f32(t) * 0.5
        c[i, t] = a * 2.0 + b
        out c
        """
    )
    i, t = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
    close(out["c"], (i * 10 + t) * 2.0 + t * 0.5)


def test_basis_shorthand_in_an_equation_with_a_shifted_lhs():
    # o[t+1] iterates t: the bare name a means a[t]
    out = run(
        """
        config T = 3
        dim t < T
        a[t] = f32(t) + 1.0
        o[0] = 0.0
        o[t+1] = o[t] + a
        out o
        """
    )
    close(out["o"], np.concatenate([[0], np.cumsum(np.arange(3) + 1.0)]).astype(np.float32))


# ============================================================================ dynamic slices


DYN = """
config T = 6, gamma = 0.5
dim t < T
x[t] = f32((t * 7) % 5) - 1.5
"""


def _x():
    return ((np.arange(6) * 7) % 5).astype(np.float32) - 1.5


@pytest.mark.parametrize(
    "expr, fn",
    [
        ("sum(x[t:T])", lambda x, t: x[t:].sum()),
        ("mean(x[t:T])", lambda x, t: x[t:].mean()),
        ("max(x[t:T])", lambda x, t: x[t:].max()),
        ("min(x[t:T])", lambda x, t: x[t:].min()),
        ("logsumexp(x[t:T])", lambda x, t: np.log(np.exp(x[t:].astype(np.float64)).sum())),
        (
            "discounted_sum(x[t:T], gamma)",
            lambda x, t: sum(0.5**k * x[t + k] for k in range(6 - t)),
        ),
        ("sum(x[0:t+1])", lambda x, t: x[: t + 1].sum()),
        ("mean(x[max(0, t-2):t+1])", lambda x, t: x[max(0, t - 2) : t + 1].mean()),
        ("max(x[max(0, t-2):t+1])", lambda x, t: x[max(0, t - 2) : t + 1].max()),
        ("sum(x[t:min(t+3, T)])", lambda x, t: x[t : min(t + 3, 6)].sum()),
    ],
)
def test_dynamic_slice_as_direct_argument_of_each_reduction(expr, fn):
    y = run1(DYN + f"y[t] = {expr}\nout y\n")
    x = _x()
    close(y, np.array([fn(x, t) for t in range(6)], np.float32), np.float32, rtol=1e-5)


def test_dynamic_slice_of_ints_and_bools_under_each_reduction():
    # the reduction converts as it does for a static slice: sum of bools counts (i32), mean,
    # logsumexp and discounted_sum of ints are f32
    out = run(
        """
        config T = 5
        dim t < T
        x[t] = t * 2 - 3
        p[t] = t % 2 == 0
        c[t] = sum(p[0:t+1])
        s[t] = sum(x[max(0, t-2):t+1])
        m[t] = mean(x[t:T])
        l[t] = logsumexp(x[0:t+1])
        d[t] = discounted_sum(x[t:T], 0.5)
        out c, s, m, l, d
        """
    )
    x, p = np.arange(5) * 2 - 3, np.arange(5) % 2 == 0
    close(out["c"], np.array([p[: t + 1].sum() for t in range(5)], np.int32), np.int32)
    want_s = [x[max(0, t - 2) : t + 1].sum() for t in range(5)]
    close(out["s"], np.array(want_s, np.int32), np.int32)
    close(out["m"], np.array([x[t:].mean() for t in range(5)], np.float32), np.float32)
    want_l = [np.log(np.exp(x[: t + 1].astype(np.float64)).sum()) for t in range(5)]
    close(out["l"], np.array(want_l, np.float32), np.float32, rtol=1e-5)
    want_d = [sum(0.5**k * x[t + k] for k in range(5 - t)) for t in range(5)]
    close(out["d"], np.array(want_d, np.float32), np.float32)


def test_dynamic_slice_that_is_empty_at_the_last_point():
    out = run(
        DYN
        + """
        a[t] = sum(x[t+1:T])
        b[t] = discounted_sum(x[t+1:T], gamma)
        out a, b
        """.replace("        ", "")
    )
    x = _x()
    close(out["a"], np.array([x[t + 1 :].sum() for t in range(6)], np.float32))
    close(
        out["b"],
        np.array([sum(0.5**k * x[t + 1 + k] for k in range(5 - t)) for t in range(6)], np.float32),
    )


def test_dynamic_slice_over_several_dims_with_an_axis():
    out = run(
        """
        config B = 3, T = 4
        dim b < B
        dim t < T
        r[b, t] = f32(b * 10 + t)
        s[t] = sum(r[0:B, t:T], 1)
        m[t] = mean(r[0:B, t:T])
        out r, s, m
        """
    )
    r = out["r"]
    close(out["s"], np.stack([r[:, t:].sum(1) for t in range(4)]))
    close(out["m"], np.array([r[:, t:].mean() for t in range(4)], np.float32))


def test_dynamic_slice_of_a_tensor_with_spatial_shape():
    out = run(
        """
        config T = 4, gamma = 0.9
        dim t < T
        x[t] = f32(arange(2)) + f32(t)
        s[t] = sum(x[t:T], 0)
        d[t] = discounted_sum(x[t:T], gamma)
        out s, d
        """
    )
    x = np.arange(2, dtype=np.float32)[None] + np.arange(4, dtype=np.float32)[:, None]
    close(out["s"], np.stack([x[t:].sum(0) for t in range(4)]))
    close(
        out["d"],
        np.stack([sum(np.float32(0.9) ** k * x[t + k] for k in range(4 - t)) for t in range(4)]),
        rtol=1e-5,
    )


# ============================================================================ spatial indexing


SP = """
m = reshape(f32(arange(12)), [3, 4])
v = f32(arange(6)) * 10.0
"""
M = np.arange(12, dtype=np.float32).reshape(3, 4)
V = np.arange(6, dtype=np.float32) * 10


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("v[2]", V[2]),
        ("v[-1]", V[-1]),
        ("v[-6]", V[-6]),
        ("m[1]", M[1]),
        ("m[1, 2]", M[1, 2]),
        ("m[-1, -2]", M[-1, -2]),
        ("m[:, 0]", M[:, 0]),
        ("m[0:2]", M[0:2]),
        ("m[1:, 1:3]", M[1:, 1:3]),
        ("m[:, -2:]", M[:, -2:]),
        ("m[:-1, :]", M[:-1, :]),
        ("v[1:4]", V[1:4]),
        ("v[4:2]", V[4:2]),
        ("m[1][2]", M[1][2]),
        ("m[0:2][1]", M[0:2][1]),
        ("m[:, 1:3][2]", M[:, 1:3][2]),
    ],
)
def test_spatial_indexing_numpy_style(expr, expected):
    y = run1(SP + f"y = {expr}\nout y\n")
    close(y, np.asarray(expected, np.float32), np.float32)


@pytest.mark.parametrize(
    "idx, expr, expected",
    [
        ("arange(3) * 2", "v[idx]", V[np.arange(3) * 2]),
        ("arange(2) + 1", "m[idx]", M[np.arange(2) + 1]),
        ("arange(2) + 1", "m[:, idx]", M[:, np.arange(2) + 1]),
        ("arange(2) + 1", "m[2, idx]", M[2, np.arange(2) + 1]),
        ("reshape(arange(4), [2, 2])", "v[idx]", V[np.arange(4).reshape(2, 2)]),
        ("reshape(arange(4) % 3, [2, 2])", "m[idx, 1]", M[np.arange(4).reshape(2, 2) % 3, 1]),
        ("0 - arange(2) - 1", "v[idx]", V[-np.arange(2) - 1]),
        ("i64(arange(2))", "m[idx]", M[np.arange(2)]),
    ],
)
def test_spatial_gather_with_one_integer_tensor(idx, expr, expected):
    y = run1(SP + f"idx = {idx}\ny = {expr}\nout y\n")
    close(y, np.asarray(expected, np.float32), np.float32)


def test_gather_with_an_integer_scalar_tensor():
    out = run(
        """
        config T = 4
        dim t < T
        l[t] = f32(arange(3)) * f32(t + 1)
        a[t] = (t * 2) % 3
        p[t] = log_softmax(l)[a]
        q[t] = l[t][a[t]]
        out p, q
        """
    )
    l = np.arange(3, dtype=np.float32)[None] * (np.arange(4, dtype=np.float32)[:, None] + 1)
    a = (np.arange(4) * 2) % 3
    lsm = l - np.log(np.exp(l.astype(np.float64)).sum(-1, keepdims=True))
    close(out["p"], lsm[np.arange(4), a], rtol=1e-5)
    close(out["q"], l[np.arange(4), a])


def test_temporal_then_spatial_index():
    out = run(
        """
        config I = 2, B = 2, T = 3
        dim i < I
        dim b < B
        dim t < T
        x[i, b, t] = f32(arange(3)) + f32(i * 100 + b * 10 + t)
        y[i, b, t] = x[i, b, t][0]
        z[i] = x[i, 0:B, 0:T][1, 2]
        w[t] = x[1, 0, t][-1]
        out y, z, w
        """
    )
    i, b, t = np.meshgrid(np.arange(2), np.arange(2), np.arange(3), indexing="ij")
    base = (i * 100 + b * 10 + t).astype(np.float32)
    close(out["y"], base)
    close(out["z"], base[:, 1, 2][:, None] + np.arange(3, dtype=np.float32))
    close(out["w"], base[1, 0, :] + 2)


def test_spatial_int_index_depending_on_a_dim():
    out = run(
        """
        config T = 4
        dim t < T
        v = f32(arange(8)) * 3.0
        y[t] = v[2 * t + 1]
        z[t] = v[T - 1 - t]
        out y, z
        """
    )
    v = np.arange(8, dtype=np.float32) * 3
    close(out["y"], v[2 * np.arange(4) + 1])
    close(out["z"], v[3 - np.arange(4)])


def test_spatial_slice_with_dim_dependent_start_and_constant_length():
    out = run(
        """
        config K = 5, MB = 3, N = 4
        dim k < K
        perm = arange(MB * N) * 2
        y[k] = perm[(k % MB) * N : (k % MB + 1) * N]
        z[k] = perm[k : k + 3]
        out y, z
        """
    )
    perm = np.arange(12) * 2
    close(out["y"], np.stack([perm[(k % 3) * 4 : (k % 3 + 1) * 4] for k in range(5)]))
    close(out["z"], np.stack([perm[k : k + 3] for k in range(5)]))


# ============================================================================ dims as values


def test_dims_as_i32_values():
    out = run(
        """
        config T = 4
        dim t < T
        a[t] = t
        b[t] = f32(t) / f32(T)
        c[t] = where(t % 2 == 0, 1.0, -1.0)
        d[t] = t * 3 - 1
        e[t] = t + T
        out a, b, c, d, e
        """
    )
    t = np.arange(4)
    close(out["a"], t.astype(np.int32), np.int32)
    close(out["b"], (t / 4).astype(np.float32), np.float32)
    close(out["c"], np.where(t % 2 == 0, 1.0, -1.0).astype(np.float32))
    close(out["d"], (t * 3 - 1).astype(np.int32), np.int32)
    close(out["e"], (t + 4).astype(np.int32), np.int32)


def test_dim_value_in_a_shifted_equation_is_the_iteration_index():
    out = run(
        """
        config T = 3
        dim t < T
        o[t+1] = t
        out o
        """
    )
    close(out["o"], np.array([0, 0, 1, 2], np.int32), np.int32)


def test_dim_dependent_negative_spatial_index_counts_from_the_end():
    out = run(
        """
        config T = 3
        dim t < T
        v = f32(arange(3)) * 10.0
        y[t] = v[t - T]
        out y
        """
    )
    close(out["y"], np.array([0, 10, 20], np.float32))


def test_the_index_type_rule_gives_numpys_shapes():
    """``ops.indexing.index_shape`` works out ``x[items]``'s shape from the extents (NumPy
    refuses an array of extents past 2^63 before timerlc's limits could name them); here
    against NumPy's own indexing on random small cases: ints, slices, full axes and one
    gather anywhere (its ints advanced indices too, the gather's shape in their place when
    they are next to each other, else first)."""
    import random

    from timerlc.ops.indexing import index_shape

    rng = random.Random(1)
    for _ in range(3000):
        shape = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 4)))
        m = rng.randint(0, len(shape))
        gpos = rng.randrange(m) if m and rng.random() < 0.6 else -1
        gshape = tuple(rng.randint(0, 3) for _ in range(rng.randint(0, 2)))
        items, numpy_items = [], []
        for k in range(m):
            kind = "gather" if k == gpos else rng.choice(("int", "slice", "full"))
            if kind == "gather":
                items.append(("gather",))
                numpy_items.append(np.zeros(gshape, np.intp))
            elif kind == "int":
                items.append(("int", 0))
                numpy_items.append(0)
            elif kind == "slice":
                n = rng.randint(0, shape[k])
                items.append(("slice", 0, n))
                numpy_items.append(slice(0, n))
            else:
                items.append(("full",))
                numpy_items.append(slice(None))
        want = np.zeros(shape)[tuple(numpy_items)].shape
        assert index_shape(shape, items, gshape if gpos >= 0 else None) == want, (shape, items)
