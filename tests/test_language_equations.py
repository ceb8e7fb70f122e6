"""Conformance tests from LANGUAGE.md sections 4 and 12: equations (iteration domains,
defined points, first match wins, when, tuple equations, tensors without dims) and the
layout of outputs (bounding box from 0, zeros outside the domain).
"""

import numpy as np
from rtl_helpers import close, run

# ============================================================================ §4 equations


def test_iteration_domain_is_the_box_of_the_lhs_dims():
    out = run(
        """
        config I = 3, T = 2
        dim i < I
        dim t < T
        y[i, t] = f32(i) - f32(t)
        out y
        """
    )
    i, t = np.meshgrid(np.arange(3), np.arange(2), indexing="ij")
    close(out["y"], (i - t).astype(np.float32))


def test_defined_points_past_the_upper_bound():
    # o[t+1] over t < T defines t = 1..T; with o[0] the domain is 0..T (T+1 points)
    out = run(
        """
        config T = 4
        dim t < T
        o[0] = 0.0
        o[t+1] = o[t] + 1.0
        out o
        """
    )
    close(out["o"], np.arange(5, dtype=np.float32), np.float32)


def test_constant_index_past_the_bound():
    out = run(
        """
        config T = 3
        dim t < T
        x[t] = 1.0
        x[T + 2] = 5.0
        out x
        """
    )
    close(out["x"], np.array([1, 1, 1, 0, 0, 5], np.float32))


def test_shifted_domain_bounding_box_starts_at_zero():
    out = run(
        """
        config T = 3
        dim t < T
        x[t+2] = f32(t) + 1.0
        out x
        """
    )
    close(out["x"], np.array([0, 0, 1, 2, 3], np.float32))


def test_first_match_wins_later_equation_only_on_the_rest():
    out = run(
        """
        config T = 6
        dim t < T
        y[t] = 1.0 when t < 2
        y[t] = 2.0 when t < 4
        y[t] = 3.0
        out y
        """
    )
    close(out["y"], np.array([1, 1, 2, 2, 3, 3], np.float32))


def test_first_match_wins_constant_point_before_general_equation():
    out = run(
        """
        config T = 5
        dim t < T
        y[2] = 100.0
        y[t] = f32(t)
        out y
        """
    )
    close(out["y"], np.array([0, 1, 100, 3, 4], np.float32))


def test_first_match_wins_with_the_shifted_recurrence():
    # REINFORCE-style returns: g[T-1] first, then g[t] on t < T-1
    out = run(
        """
        config T = 5, gamma = 0.5
        dim t < T
        r[t] = f32(t) + 1.0
        g[T-1] = r[T-1]
        g[t] = r + gamma * g[t+1]
        out g
        """
    )
    r = np.arange(5, dtype=np.float32) + 1
    g = np.zeros(5, np.float32)
    g[4] = r[4]
    for t in range(3, -1, -1):
        g[t] = r[t] + np.float32(0.5) * g[t + 1]
    close(out["g"], g)


def test_when_with_and_or_not_and_comparisons():
    out = run(
        """
        config T = 10
        dim t < T
        a[t] = 1.0 when t >= 2 and t < 5
        a[t] = 0.0
        b[t] = 1.0 when t == 0 or t > 7
        b[t] = 0.0
        c[t] = 1.0 when not t <= 6
        c[t] = 0.0
        d[t] = 1.0 when t != 3
        d[t] = 0.0
        out a, b, c, d
        """
    )
    t = np.arange(10)
    close(out["a"], ((t >= 2) & (t < 5)).astype(np.float32))
    close(out["b"], ((t == 0) | (t > 7)).astype(np.float32))
    close(out["c"], (~(t <= 6)).astype(np.float32))
    close(out["d"], (t != 3).astype(np.float32))


def test_when_with_a_chain_of_equalities_is_the_set_they_name():
    """``or`` chains of equalities of one index expression (the checker merges them into
    ranges, ``timerlc.frontend.indexing._ranges``): repeated, out of order, written either
    way round, of an expression of dims and configs, with gaps and beside other parts;
    one of a thousand, as fast as a range."""
    out = run(
        """
        config T = 12, K = 3
        dim t < T
        dim u < 2
        a[t] = 1.0 when t == 2 or t == 0 or 1 == t or t == 5 or t + 1 == 8 or t == 2 or t == 6
        a[t] = 0.0
        b[t, u] = 1.0 when 2 * t - u == 4 or t > 10 or 2 * t - u == 5 or t * 2 - u == 7 or u == 1
        b[t, u] = 0.0
        c[t] = 1.0 when t == K or t - K == 1 or t == K - 3
        c[t] = 0.0
        d[t] = 1.0 when CHAIN
        d[t] = 0.0
        out a, b, c, d
        """.replace("CHAIN", " or ".join(f"t == {k}" for k in range(1000) if k != 4))
    )
    t = np.arange(12)
    close(out["a"], np.isin(t, [0, 1, 2, 5, 6, 7]).astype(np.float32))
    tt, u = t[:, None], np.arange(2)[None, :]
    b = np.isin(2 * tt - u, [4, 5, 7]) | (tt > 10) | (u == 1)
    close(out["b"], b.astype(np.float32))
    close(out["c"], np.isin(t, [0, 3, 4]).astype(np.float32))
    close(out["d"], (t != 4).astype(np.float32))


def test_the_checker_merges_an_or_chain_s_equalities_into_ranges():
    import sympy

    from timerlc.frontend.indexing import _ranges

    t, u = sympy.symbols("t u", integer=True)
    parts = [sympy.Eq(t, 3), sympy.Lt(u, 2), sympy.Eq(4, t), sympy.Eq(t, 9), sympy.Eq(u, 1)]
    assert _ranges(parts) == [
        sympy.And(sympy.Ge(t, 3), sympy.Le(t, 4)),
        sympy.Eq(t, 9),
        sympy.Lt(u, 2),
        sympy.Eq(u, 1),
    ]
    alone = [sympy.Eq(t, 3), sympy.Eq(u, 1), sympy.Gt(t, 7)]
    assert _ranges(alone) is alone  # (nothing to merge: the chain as written)


def test_when_with_floordiv_mod_min_max_and_configs():
    out = run(
        """
        config T = 12, K = 3
        dim t < T
        a[t] = 1.0 when t % K == 0
        a[t] = 0.0
        b[t] = 1.0 when t // 4 == 1
        b[t] = 0.0
        c[t] = 1.0 when min(t, 5) == t
        c[t] = 0.0
        d[t] = 1.0 when max(t, 8) == t
        d[t] = 0.0
        e[t] = 1.0 when 2 * t + 1 > T - 3
        e[t] = 0.0
        out a, b, c, d, e
        """
    )
    t = np.arange(12)
    close(out["a"], (t % 3 == 0).astype(np.float32))
    close(out["b"], (t // 4 == 1).astype(np.float32))
    close(out["c"], (t <= 5).astype(np.float32))
    close(out["d"], (t >= 8).astype(np.float32))
    close(out["e"], (2 * t + 1 > 9).astype(np.float32))


def test_when_precedence_not_binds_looser_than_comparison_and_and_before_or():
    out = run(
        """
        config T = 8
        dim t < T
        a[t] = 1.0 when t < 2 or t > 3 and t < 6
        a[t] = 0.0
        b[t] = 1.0 when not t < 3 and not t > 5
        b[t] = 0.0
        out a, b
        """
    )
    t = np.arange(8)
    close(out["a"], ((t < 2) | ((t > 3) & (t < 6))).astype(np.float32))
    close(out["b"], ((t >= 3) & (t <= 5)).astype(np.float32))


def test_when_with_parentheses_over_two_dims():
    out = run(
        """
        config I = 4, T = 4
        dim i < I
        dim t < T
        z[i, t] = 1.0 when t <= i and (i + t) % 2 == 0
        out z
        """
    )
    i, t = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    close(out["z"], ((t <= i) & ((i + t) % 2 == 0)).astype(np.float32))


def test_points_outside_the_domain_hold_zero():
    out = run(
        """
        config T = 6
        dim t < T
        y[t] = 7.0 when t % 2 == 1
        out y
        """
    )
    close(out["y"], np.array([0, 7, 0, 7, 0, 7], np.float32))


def test_tuple_equation_from_a_def():
    out = run(
        """
        config T = 4
        dim t < T
        def split(x) { x * 2.0, x + 1.0 }
        a[t], b[t] = split(f32(t))
        out a, b
        """
    )
    t = np.arange(4, dtype=np.float32)
    close(out["a"], t * 2)
    close(out["b"], t + 1)


def test_tuple_equation_with_when_and_first_match():
    out = run(
        """
        config T = 5
        dim t < T
        def pair(x) { (x, -x) }
        a[t], b[t] = pair(f32(t)) when t > 1
        a[t], b[t] = pair(100.0)
        out a, b
        """
    )
    t = np.arange(5, dtype=np.float32)
    close(out["a"], np.where(t > 1, t, 100))
    close(out["b"], np.where(t > 1, -t, -100))


def test_tuple_equation_with_shifted_lhs_recurrence():
    out = run(
        """
        config T = 4
        dim t < T
        def step(x, y) { (x + y, x) }
        a[0], b[0] = (1.0, 0.0)
        a[t+1], b[t+1] = step(a[t], b[t])
        out a, b
        """
    )
    a, b = [1.0], [0.0]
    for _ in range(4):
        a.append(a[-1] + b[-1])
        b.append(a[-2])
    close(out["a"], np.array(a, np.float32))
    close(out["b"], np.array(b, np.float32))


def test_tuple_equation_with_tensors_of_different_types():
    out = run(
        """
        def f() { (arange(3), 2.5) }
        a, b = f()
        out a, b
        """
    )
    close(out["a"], np.arange(3), np.int32)
    close(out["b"], np.float32(2.5), np.float32)


def test_tensor_without_dims_written_bare():
    out = run(
        """
        config T = 3
        dim t < T
        s = 2.0
        u = s * 3.0
        y[t] = f32(t) * u
        out s, u, y
        """
    )
    close(out["s"], np.float32(2.0), np.float32)
    assert out["s"].shape == ()
    close(out["u"], np.float32(6.0))
    close(out["y"], np.arange(3, dtype=np.float32) * 6)


def test_scalar_output_holds_a_spatial_array():
    out = run("m = reshape(arange(6), [2, 3])\nout m\n")
    close(out["m"], np.arange(6).reshape(2, 3))


def test_dims_and_spatial_shape_layout():
    out = run(
        """
        config T = 3
        dim t < T
        y[t] = f32(arange(4)) * f32(t)
        out y
        """
    )
    close(
        out["y"], np.arange(3, dtype=np.float32)[:, None] * np.arange(4, dtype=np.float32)[None, :]
    )


def test_later_equation_read_of_a_tensor_defined_below_in_the_source():
    # equations are not ordered by the source: a tensor may be read before it is written
    out = run(
        """
        config T = 3
        dim t < T
        y[t] = x[t] + 1.0
        x[t] = f32(t) * 2.0
        out y
        """
    )
    close(out["y"], np.arange(3, dtype=np.float32) * 2 + 1)


def test_two_dim_recurrence_over_outer_and_inner_dims():
    out = run(
        """
        config I = 3, K = 2
        dim i < I
        dim k < K
        w[0, 0] = 1.0
        w[i, k+1] = w[i, k] * 2.0
        w[i+1, 0] = w[i, K] + 1.0
        out w
        """
    )
    w = np.zeros((4, 3), np.float32)
    w[0, 0] = 1
    for i in range(3):
        for k in range(2):
            w[i, k + 1] = w[i, k] * 2
        w[i + 1, 0] = w[i, 2] + 1
    close(out["w"], w)


def test_two_dim_domains_first_match_transposed_reads_and_triangles():
    out = run(
        """
        config N = 5
        dim i < N
        dim j < N
        a[i, j] = f32(i * 10 + j) when j <= i
        a[i, j] = -1.0 when i + j > 5
        a[i, j] = 0.5
        b[i, j] = a[i, j] + a[j, i]
        c[i, j] = sum(a[i, 0:j+1])
        d[i, 0] = 1.0
        d[i, j+1] = d[i, j] * 2.0 + a[i, j] when j < i
        e[i] = d[i, i]
        f[i, j] = a[N - 1 - i, (j + i) % N] * f32(i - j)
        g[i] = max(a[i, i:N]) + min(a[0:i+1, i])
        out a, b, c, d, e, f, g
        """
    )
    N = 5
    a = np.zeros((N, N), np.float32)
    for i in range(N):
        for j in range(N):
            a[i, j] = i * 10 + j if j <= i else (-1 if i + j > 5 else 0.5)
    d = np.zeros((N, N), np.float32)
    for i in range(N):
        d[i, 0] = 1
        for j in range(i):
            d[i, j + 1] = d[i, j] * 2 + a[i, j]
    close(out["a"], a)
    close(out["b"], a + a.T)
    close(out["c"], np.cumsum(a, 1))
    close(out["d"], d)
    close(out["e"], np.diag(d))
    close(out["f"], [[a[N - 1 - i, (j + i) % N] * (i - j) for j in range(N)] for i in range(N)])
    close(out["g"], [a[i, i:].max() + a[: i + 1, i].min() for i in range(N)])


def test_negative_lhs_offset_restricted_by_when():
    # x[t-1] over t >= 1 defines x at 0..T-2: never below 0
    out = run("config T = 4\ndim t < T\nx[t-1] = f32(t) when t >= 1\nout x\n")
    close(out["x"], np.array([1, 2, 3], np.float32))


def test_constant_lhs_index_in_a_middle_position():
    out = run(
        """
        config I = 2, B = 3, T = 2
        dim i < I
        dim b < B
        dim t < T
        x[i, 0, t] = f32(i + t)
        x[i, b+1, t] = x[i, b, t] * 2.0 when b < B - 1
        out x
        """
    )
    i, t = np.meshgrid(np.arange(2), np.arange(2), indexing="ij")
    x = np.stack([(i + t) * 2.0**b for b in range(3)], axis=1)
    close(out["x"], x)


def test_crlf_line_endings_and_tabs():
    out = run("config T = 2\r\ndim t < T\r\ny[t] =\tf32(t) # c\r\nout y\r\n")
    close(out["y"], np.arange(2, dtype=np.float32))


def test_tuple_equation_partly_shadowed_by_an_earlier_equation():
    # first match wins per tensor: a[0] comes from the first equation, b[0] from the tuple
    out = run("config T = 3\ndim t < T\na[0] = 5.0\na[t], b[t] = (f32(t), 3.0)\nout a, b\n")
    close(out["a"], np.array([5, 1, 2], np.float32))
    close(out["b"], np.full(3, 3.0, np.float32))
