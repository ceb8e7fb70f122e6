"""Gradient checks of the autodiff pass through recurrences and temporal reads (LANGUAGE.md
sections 4, 5 and 8): forward and backward recurrences, first-match merges, two dims,
shifted / constant / sliced / windowed reads, dynamic windows under reductions, records,
params with a dim, stop_grad; and the diagnostics of grad. Finite differences in f64
(tests/grad_helpers.py).
"""

import numpy as np
import pytest
from grad_helpers import error, error_at, gradcheck, gradcheck_or_refused, run

from timerlc.diagnostics import ProgramError

W2 = np.array([0.6, -0.35])
W3 = np.array([0.5, 0.3, -0.2])
T5 = "config T = 5\ndim t < T\n"
T6 = "config T = 6, gamma = 0.8\ndim t < T\n"


def check(body, params, header=T5, **kw):
    return gradcheck(body, params, header=header, **kw)


# ============================================================================ recurrences


def test_forward_recurrence_bptt():
    check("""
        x[t] = f64(t) * 0.1 + 1.0
        h[0] = zeros([3], dtype=f64)
        h[t+1] = tanh(h[t] * p.w + x[t] * p.c)
        loss = sum(h[0:T+1]) + mean(h[T] * h[T])
        """, {"w": W3, "c": np.array(2.0)})


def test_forward_recurrence_from_a_parameter_initial_state():
    check("""
        x[t] = f64(t) * 0.3 - 0.5
        h[0] = p.h0
        h[t+1] = tanh(p.a @ h[t] + x[t] * p.u)
        loss = sum(h[T] * stack([1.0, -2.0])) + 0.1 * sum(h[0:T+1] ** 2)
        """, {"h0": W2, "a": np.array([[0.5, -0.4], [0.3, 0.8]]), "u": np.array([0.2, -0.9])})


def test_backward_recurrence():
    check("""
        x[t] = f64(t) * 0.2 - 0.3
        v[T] = p.b
        v[t] = tanh(x[t] * p.c + 0.9 * v[t+1] * p.d)
        loss = sum(v[0:T+1] * v[0:T+1]) + v[0]
        """, {"b": np.array(0.4), "c": np.array(1.3), "d": np.array(-0.7)})


def test_returns_recurrence_with_t_minus_one_first_match():
    check("""
        r[t] = sin(p.a * f64(t) + p.b)
        ret[T-1] = r[T-1]
        ret[t] = r[t] + gamma * ret[t+1]
        ema[0] = r[0]
        ema[t] = 0.3 * r[t] + 0.7 * ema[t-1]
        loss = sum(ret[0:T] * ret[0:T]) + sum(ema[0:T] * f64(arange(T)))
        """, {"a": np.array(0.7), "b": np.array(0.2)}, header=T6)


def test_first_match_merges_with_when():
    check("""
        x[t] = f64(t) * 0.25 + 0.5
        y[t] = p.a * x[t] when t % 2 == 0
        y[t] = p.b * x[t] ** 2 when t < 3
        y[t] = exp(p.a * p.b * x[t])
        z[0] = p.a
        z[t+1] = z[t] * p.b when t >= 2
        z[t+1] = z[t] + y[t]
        loss = sum(y[0:T] * y[0:T]) + sum(z[0:T+1])
        """, {"a": np.array(0.7), "b": np.array(-0.45)})


def test_two_dims_i_and_t():
    check("""
        config I = 3
        dim i < I
        dim t < T
        x[i, t] = f64(i) * 0.5 + f64(t) * 0.1 - 0.2
        h[i, 0] = p.h0 * f64(i + 1)
        h[i, t+1] = tanh(h[i, t] * p.w + x[i, t])
        s[i] = sum(h[i, 1:T+1] * h[i, 1:T+1], 0)
        loss = sum(h[0:I, T]) + mean(h[1, 0:T+1]) + sum(s[0:I] * s[0:I])
        """, {"h0": W3, "w": np.array([0.9, -0.6, 0.4])}, header="config T = 4")


def test_recurrence_over_t_inside_i_reading_the_other_dim():
    check("""
        config I = 3
        dim i < I
        dim t < T
        a[i] = p.w * f64(i + 1)
        h[i, 0] = a[i]
        h[i, t+1] = h[i, t] * 0.5 + a[i] * f64(t) * p.c
        c[t] = sum(h[0:I, t] ** 2)
        loss = sum(c[0:T])
        """, {"w": W2, "c": np.array(0.3)}, header="config T = 4")


# ============================================================================ temporal reads


def test_reads_at_t_plus_one_t_minus_one_constant_and_full_slice():
    check("""
        x[t] = p.w * (f64(t) + 1.0) + sin(p.w * f64(t))
        y[t] = x[t+1] * x[t] when t < T-1
        y[t] = x[0] * x[t]
        z[t] = x[t-1] * 2.0 when t >= 1
        z[t] = x[T-1] * x[2]
        loss = sum(y[0:T]) + sum(z[0:T] ** 2) + sum(x[0:T] * x[0:T]) + sum(x[1:3])
        """, {"w": W2})


def test_static_window_under_when():
    check("""
        x[t] = sin(p.w * f64(t) + p.c)
        y[t] = sum(x[t-2:t+1] * stack([1.0, 2.0, 3.0])) when t >= 2
        y[t] = x[t]
        u[t] = x[t-2:t+1] @ reshape(f64(arange(6)) * 0.5 - 1.0, [3, 2]) when t >= 2
        loss = sum(y[0:T] ** 2) + sum(u[2:T] ** 2)
        """, {"w": np.array(0.45), "c": np.array(0.3)}, header="config T = 6\ndim t < T")


def test_static_window_of_vectors_with_its_own_axes():
    check("""
        x[t] = tanh(p.w * f64(t + 1))
        y[t] = x[t-1:t+1] when t >= 1
        loss = sum(y[1:T] * reshape(f64(arange(2 * (T - 1) * 2)), [T - 1, 2, 2]))
        """, {"w": W2})


@pytest.mark.parametrize("expr", [
    "sum(x[t:T])",
    "mean(x[t:T])",
    "sum(x[0:t+1])",
    "mean(x[max(0, t-2):t+1])",
    "sum(x[max(0, t-2):t+1])",
    "sum(x[t:min(t+3, T)])",
    "sum(x[t+1:T])",
    "sum(x[max(0, t-2):min(t+2, T)])",
    "mean(x[max(0, t-2):min(t+2, T)])",
    "discounted_sum(x[t:T], gamma)",
    "discounted_sum(x[t:min(t+3, T)], gamma)",
])
def test_dynamic_windows_under_reductions(expr):
    check(f"""
        x[t] = exp(p.w * f64(t) * 0.3) + p.c * f64(t)
        y[t] = {expr}
        loss = sum(y[0:T] * (f64(arange(T)) + 1.0) * y[0:T])
        """, {"w": np.array(0.45), "c": np.array(-0.3)}, header=T6)


def test_dynamic_window_of_vectors_with_an_axis_reduction():
    check("""
        x[t] = p.w * f64(t + 1) + p.w * p.w
        y[t] = sum(x[t:T], 0)
        m[t] = mean(x[max(0, t-1):t+1], 0)
        loss = sum(y[0:T] * y[0:T]) + sum(m[0:T] * stack([1.0, 3.0]))
        """, {"w": W2}, header=T6)


@pytest.mark.parametrize("expr", ["mean(x[0:t+1])", "mean(x[t:T], [0, 1])",
                                  "mean(x[max(0, t-2):min(t+2, T)], keepdims=true)"])
def test_mean_over_a_dynamic_window_of_vectors_over_all_axes(expr):
    check(f"x[t] = p.w * f64(t + 1)\ny[t] = {expr}\nloss = sum(y[0:T] ** 2)\n", {"w": W2})


def test_sum_over_a_dynamic_window_of_vectors_over_all_axes():
    check("x[t] = p.w * f64(t + 1) + p.w * p.w\ny[t] = sum(x[t:T]) + sum(x[0:t+1], [0, 1])\n"
          "loss = sum(y[0:T] ** 2)\n", {"w": W2})


def test_dynamic_window_in_a_batch_dim():
    check("""
        config B = 2
        dim b < B
        dim t < T
        x[b, t] = tanh(p.w[b] * f64(t + 1))
        ret[b, t] = discounted_sum(x[b, t:T], gamma) - mean(x[b, max(0, t-2):t+1])
        loss = sum(ret[0:B, 0:T] ** 2)
        """, {"w": W2}, header="config T = 5, gamma = 0.9")


def test_dynamic_windows_with_a_point_index_after_or_before():
    check("""
        config T = 4, B = 2
        dim t < T
        dim b < B
        x[t, b] = p.w[b] * f64(t + 1) + p.w[0] * p.w[1]
        y[t, b] = sum(x[t:T, b]) + mean(x[max(0, t-1):t+1, b])
        z[t] = sum(x[t:T, 1]) * sum(x[0:t+1, 0])
        loss = sum(y[0:T, 0:B] ** 2) + sum(z[0:T])
        """, {"w": W2}, header="")


def test_two_step_recurrence():
    check("h[0] = p.w[0]\nh[1] = p.w[1]\nh[t+2] = h[t+1] * h[t] + 0.5\nloss = h[T+1]\n",
          {"w": W2})


def test_loss_read_at_a_constant_point_of_a_recurrence():
    out = run("config T = 3\ndim t < T\n"
              "params p {\n  w : f64[2] = stack([f64(0.5), f64(2.0)])\n}\n"
              "l[0] = p.w[0]\nl[t+1] = l[t] * p.w[1]\ng = grad(l[T], p)\n"
              "h = grad(sum(p.w ** 2) + 1.0, p)\nout g, h\n")
    np.testing.assert_allclose(out["g.w"], [8.0, 6.0])  # l[3] = w0 w1^3
    np.testing.assert_allclose(out["h.w"], [1.0, 4.0])


def test_a_dim_the_reader_has_and_the_param_lacks():
    check("""
        config B = 3
        dim b < B
        dim t < T
        y[b, t] = p.w * f64(b + t) + p.c * p.c
        s[b] = sum(y[b, 0:T] ** 2)
        loss = sum(s[0:B]) + sum(y[0:B, 2])
        """, {"w": W2, "c": np.array(0.3)}, header="config T = 5")


def test_dim_dependent_spatial_indices():
    check("""
        y[t] = p.w[t % 3] * f64(t + 1)
        z[t] = sum(p.w[t % 2 : t % 2 + 2] * p.w[t % 2 : t % 2 + 2]) when t < 4
        z[t] = p.w[2 - t % 3]
        loss = sum(y[0:T] ** 2) + sum(z[0:T] * f64(arange(T)))
        """, {"w": W3})


def test_spatial_index_with_floor_division_by_a_constant():
    check("z[t] = p.w[t // 2] + sum(p.w[t // 2 : t // 2 + 2])\nloss = sum(z[0:T] ** 2)\n",
          {"w": W3}, header="config T = 4\ndim t < T")


def test_gather_by_a_dim_dependent_tensor_index():
    check("""
        a[t] = (t * 2) % 3
        l[t] = p.l * f64(t + 1)
        lp[t] = log_softmax(l[t])[a[t]]
        loss = -mean(lp[0:T] * (f64(arange(T)) - 1.5))
        """, {"l": W3})


# ============================================================================ records


def test_record_with_several_fields_through_a_def():
    check("""
        def policy(q, x) {
          h = tanh(x @ q.w1 + q.b1)
          h @ q.w2 + q.b2
        }
        o[t] = stack([f64(t) * 0.3, 1.0 - f64(t) * 0.2])
        l[t] = policy(p, o[t])
        loss = -mean(log_softmax(l[0:T])[0:T, 1]) + 0.5 * mean(policy(p, o[0]) ** 2)
        """, {"w1": np.array([[0.3, -0.2, 0.5], [0.1, 0.4, -0.6]]),
              "b1": np.array([0.05, -0.1, 0.2]),
              "w2": np.array([[0.5, -0.3], [0.2, 0.7], [-0.4, 0.1]]),
              "b2": np.array([0.1, -0.2])})


def test_field_unused_by_the_loss_gets_zero():
    out = check("loss = sum(p.w ** 2)\n", {"w": W2, "unused": np.array([1.0, 2.0])},
                header="")
    assert np.all(out["g.unused"] == 0.0)


def test_params_with_a_dim_and_grad_per_point():
    text = """
        config I = 4, T = 3
        dim i < I
        dim t < T
        params net[i] {
          w : f64[2] = stack([f64(0.6), f64(-0.35)])
          c : f64[] = f64(0.8)
        }
        x[i, t] = f64(i) * 0.5 + f64(t) * 0.2 - 0.4
        h[i, 0] = net[i].w * net[i].c
        h[i, t+1] = tanh(h[i, t] * net[i].w + x[i, t] * net[i].c)
        loss[i] = sum(h[i, 0:T+1] ** 2) + net[i].c * net[i].c
        g[i] = grad(loss[i], net[i])
        net[i+1] = sgd(net[i], g[i], 0.3)
        out g, net, loss
        """
    out = run(text)
    for i in range(4):
        w, c = out["net.w"][i], out["net.c"][i]
        body = f"""
            x[t] = {i * 0.5!r} + f64(t) * 0.2 - 0.4
            h[0] = p.w * p.c
            h[t+1] = tanh(h[t] * p.w + x[t] * p.c)
            loss = sum(h[0:T+1] ** 2) + p.c * p.c
            """
        ref = check(body, {"w": w, "c": c}, header="config T = 3\ndim t < T")
        np.testing.assert_allclose(out["loss"][i], ref["loss"], rtol=1e-12)
        np.testing.assert_allclose(out["g.w"][i], ref["g.w"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(out["g.c"][i], ref["g.c"], rtol=1e-12, atol=1e-15)
        if i < 3:  # and sgd used exactly that gradient
            np.testing.assert_allclose(out["net.w"][i + 1], w - 0.3 * out["g.w"][i], rtol=1e-15)


def test_grad_with_respect_to_a_tensor_read_at_the_current_point():
    out = run("""
        config T = 3
        dim t < T
        params p {
          w : f64[2] = stack([f64(0.6), f64(-0.35)])
        }
        x = p.w * 2.0
        h[0] = x
        h[t+1] = h[t] * x
        loss = sum(h[T])
        gx = grad(loss, x)
        out gx
        """)
    np.testing.assert_allclose(out["gx"], 4 * (2 * np.array([0.6, -0.35])) ** 3)


def test_two_grads_in_one_program():
    out = run("params p {\n  w : f64[2] = stack([f64(0.6), f64(-0.35)])\n}\n"
              "y = sum(p.w * p.w)\nz = sum(exp(p.w))\ngy = grad(y, p)\ngz = grad(z, p)\n"
              "gy2 = grad(y, p)\nout gy, gz, gy2\n")
    np.testing.assert_allclose(out["gy.w"], 2 * W2)
    np.testing.assert_allclose(out["gy2.w"], 2 * W2)
    np.testing.assert_allclose(out["gz.w"], np.exp(W2))


# ============================================================================ no gradient


def test_stop_grad_passes_no_gradient():
    check("loss = sum(p.w * stop_grad(p.w)) + sum(stop_grad(p.w * p.c) * p.c)\n",
          {"w": W2, "c": np.array(0.5)}, header="",
          expected={"w": W2, "c": np.array(np.sum(W2 * 0.5))})


def test_stop_grad_inside_a_recurrence():
    # h[t+1] = stop_grad(h[t]) * w + 1: only the last step's direct term counts
    h = 0.7
    for _ in range(2):
        h = h * 0.7 + 1.0
    check("""
        h[0] = p.w
        h[t+1] = stop_grad(h[t]) * p.w + 1.0
        loss = h[T]
        """, {"w": np.array(0.7)}, expected={"w": np.array(h)}, header="config T = 3\ndim t < T")


def test_environment_outputs_pass_no_gradient():
    # a continuous action: its observations and rewards depend on it, but pass no gradient
    out = run("""
        config B = 2, T = 3
        dim b < B
        dim t < T
        env E = "pendulum" batch b
        params p {
          w : f32[E.obs_dim, 1] = 0.5
        }
        o[b, 0] = E.reset()
        a[b, t] = tanh(o @ p.w)
        o[b, t+1], r[b, t], done[b, t] = E.step(a[b, t])
        loss = p.w[0, 0] * sum(r[0:B, 0:T]) + sum(a[0:B, 0:T])
        g = grad(loss, p)
        out g, o, r, a
        """)
    o, a = out["o"][:, :3].astype(np.float64), out["a"].astype(np.float64)
    want = np.einsum("bto,btk->ok", o, 1 - a**2)
    want[0, 0] += out["r"].sum(dtype=np.float64)
    np.testing.assert_allclose(out["g.w"], want, rtol=1e-5)


def test_loss_independent_of_the_parameters_gives_zeros():
    for body in ["loss = sum(f64(arange(3)))\n",
                 "loss = sum(stop_grad(p.w) ** 2)\n",
                 "loss = f64(argmax(p.w)) + f64(sum(i32(p.w > 0.0)))\n",
                 "loss = sum(floor(p.w) + sign(p.w))\n"]:
        out = check(body, {"w": W2}, header="", expected={"w": np.zeros(2)})
        assert np.all(out["g.w"] == 0.0)


# ============================================================================ diagnostics


def test_grad_of_a_non_scalar_points_at_y():
    error_at("params p {\n  w : f64[2] = zeros\n}\ny = p.w * 2.0\ng = grad(y, p)\nout g\n",
             5, 10, "scalar")


def test_grad_with_respect_to_a_slice_or_an_expression():
    head = "config T = 3\ndim t < T\nparams p {\n  w : f64[2] = zeros\n}\n"
    text = head + "x[t] = p.w * f64(t)\nloss = sum(x[0:T])\ng = grad(loss, x[0:T])\nout g\n"
    error_at(text, 8, 16, "grad")
    error_at(head + "loss = sum(p.w)\ng = grad(loss, p.w * 2.0)\nout g\n", 7, 16, "grad")


def test_grad_of_an_int_is_an_error():
    e = error("params p {\n  w : f64[2] = zeros\n}\nk = i32(sum(p.w))\ng = grad(k, p)\nout g\n")
    assert (e.span.line, e.span.col) == (5, 10)


def test_grad_of_a_gradient_is_right_or_refused():
    text = ("params p {\n  w : f64[2] = stack([f64(0.5), f64(2.0)])\n}\n"
            "loss = sum(p.w ** 3)\ng = grad(loss, p)\nl2 = sum(g.w ** 2)\nh = grad(l2, p)\n"
            "out h\n")
    try:
        out = run(text)
    except ProgramError as e:  # refusing it with a position is fine
        assert e.span is not None and e.span.line in (5, 7)
        return
    # l2 = sum(9 w^4): d l2 / dw = 36 w^3
    np.testing.assert_allclose(out["h.w"], 36 * np.array([0.5, 2.0]) ** 3)


@pytest.mark.parametrize("read", [
    "x[min(t, 3)]",
    "max(x[t:T])",
    "min(x[max(0, t-2):t+1])",
    "logsumexp(x[t:T])",
    "x[t // 2]",
    "x[2 * t % 5]",
    "x[T-1-t]",
    "x[max(t-1, 0)]",
    "discounted_sum(x[max(0, t-2):t+1], 0.5)",
    "discounted_sum(x[0:t+1], 0.5)",
    "discounted_sum(x[t:T], p.w * 0.5)",
    "sum(x[t:T]) * f64(b + 1)",
    "sum(xb[0:B, t:T])",
])
def test_unsupported_gradients_are_refused_with_a_position_or_right(read):
    # these are refused today with a clear message at the read; if supported later, the
    # gradient must be right
    e = gradcheck_or_refused(f"""
        x[t] = p.w * f64(t) + p.w ** 2
        xb[b, t] = x[t] * f64(b + 2)
        y[b, t] = {read}
        loss = sum(y[0:B, 0:T] ** 2)
        """, {"w": np.array(0.5)}, header="config T = 5, B = 2\ndim b < B\ndim t < T", line=3)
    if e is not None:
        assert "gradient" in e.message and "not supported" in e.message, e.message


def test_grad_with_respect_to_a_point_of_a_recurrence_is_right_or_refused():
    text = """
        config T = 3
        dim t < T
        params p {
          w : f64[2] = stack([f64(0.5), f64(2.0)])
        }
        h[0] = p.w
        h[t+1] = h[t] * 2.0
        loss = sum(h[T])
        gh = grad(loss, h[0])
        out gh
        """
    try:
        out = run(text)
    except ProgramError as e:
        assert e.span is not None and e.span.line == 9
        return
    np.testing.assert_allclose(out["gh"], [8.0, 8.0])


def test_grad_with_respect_to_an_inner_point_of_a_recurrence():
    """x = h[1] is an input: h[2] and h[3] depend on it, what defines h[1] (p.w) does not
    count, though the same equation defines h[1] and the later points."""
    text = """
        config T = 3
        dim t < T
        params p {
          w : f64[2] = stack([f64(0.5), f64(2.0)])
        }
        h[0] = p.w
        h[t+1] = h[t] * 2.0 + p.w
        loss = sum(h[T] * h[T])
        gh = grad(loss, h[1])
        out gh, h
        """
    out = run(text)
    np.testing.assert_allclose(out["gh"], 2.0 * out["h"][3] * 4.0)


def test_grad_with_respect_to_a_point_of_a_recurrence_per_iteration():
    text = """
        config I = 2, T = 3
        dim i < I
        dim t < T
        params p {
          w : f64[2] = stack([f64(0.5), f64(2.0)])
        }
        h[i, 0] = p.w * f64(i + 1)
        h[i, t+1] = tanh(h[i, t]) * 3.0
        loss[i] = sum(h[i, T])
        gh[i] = grad(loss[i], h[i, 0])
        out gh, h
        """
    out = run(text)
    h = out["h"]
    want = np.ones_like(h[:, 0])
    for t in range(3):
        want = want * 3.0 * (1.0 - np.tanh(h[:, t]) ** 2)
    np.testing.assert_allclose(out["gh"], want)


def test_cli_runs_a_gradient_program(tmp_path):
    from rtl_helpers import cli, write

    text = """
        config T = 4
        dim t < T
        params p {
          w : f64[3] = stack([f64(0.5), f64(0.3), f64(-0.2)])
          c : f64[] = 2.0
        }
        x[t] = f64(t) * 0.1 + 1.0
        h[0] = zeros([3], dtype=f64)
        h[t+1] = tanh(h[t] * p.w + x[t] * p.c)
        loss = sum(h[0:T+1]) + mean(h[T] * h[T])
        g = grad(loss, p)
        out g, loss
        """
    p = write(tmp_path, text)
    res = cli("run", p, "--backend", "reference", "--no-progress", "--outputs", tmp_path / "o.npz")
    assert res.exit_code == 0, res.stderr
    got = np.load(tmp_path / "o.npz")
    want = run(text)
    for k in ("g.w", "g.c", "loss"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-15)


def test_cli_reports_an_unsupported_gradient_as_a_program_error(tmp_path):
    from rtl_helpers import cli, write

    p = write(tmp_path, """
        config T = 5
        dim t < T
        params p {
          w : f64[] = f64(0.5)
        }
        x[t] = p.w * f64(t)
        y[t] = x[min(t, 3)]
        loss = sum(y[0:T])
        g = grad(loss, p)
        out g
        """)
    res = cli("check", p)
    assert res.exit_code == 1
    assert f"{p}:7:8: error:" in res.stderr and "Traceback" not in res.stderr


def test_gradient_that_mixes_points_of_its_own_dim_is_refused():
    e = error("""
config I = 3
dim i < I
params net[i] {
  w : f64[] = f64(0.5)
}
y[i] = net[i].w * 2.0
loss[i] = sum(y[0:I])
g[i] = grad(loss[i], net[i])
net[i+1] = sgd(net[i], g[i], 0.1)
out g
""")
    assert e.span.line in (8, 9)
