"""Whole small programs in the style of LANGUAGE.md section 1 (without environments,
random draws or gradients): returns, GAE, n-step targets, windows, minibatch slicing,
an env.step-like tuple recurrence, mutual recurrences. Expected values from NumPy loops.
"""

import numpy as np
from rtl_helpers import close, run


def test_reinforce_style_returns_and_loss_shapes():
    out = run(
        """
        config I = 2, B = 3, T = 4, gamma = 0.9
        dim i < I
        dim b < B
        dim t < T
        r[i, b, t] = f32((i + 2 * b + 3 * t) % 5) * 0.5
        done[i, b, t] = (t + b) % 3 == 2
        g[i, b, T-1] = r[i, b, T-1]
        g[i, b, t] = r + gamma * (1 - f32(done)) * g[i, b, t+1]
        logits[i, b, t] = f32(arange(2)) * f32(t + 1) - f32(b)
        a[i, b, t] = (i + b + t) % 2
        logp[i, b, t] = log_softmax(logits)[a]
        loss[i] = -mean(logp[i, 0:B, 0:T] * stop_grad(g[i, 0:B, 0:T]))
        ret[i] = mean(sum(r[i, 0:B, 0:T], 1))
        out g, logp, loss, ret
        """
    )
    I, B, T = 2, 3, 4
    i, b, t = np.meshgrid(np.arange(I), np.arange(B), np.arange(T), indexing="ij")
    r = ((i + 2 * b + 3 * t) % 5).astype(np.float32) * np.float32(0.5)
    done = (t + b) % 3 == 2
    g = np.zeros_like(r)
    g[..., T - 1] = r[..., T - 1]
    for k in range(T - 2, -1, -1):
        g[..., k] = (
            r[..., k] + np.float32(0.9) * (1 - done[..., k].astype(np.float32)) * g[..., k + 1]
        )
    logits = np.arange(2, dtype=np.float64)[None, None, None, :] * (t + 1)[..., None] - b[..., None]
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    a = (i + b + t) % 2
    logp = np.take_along_axis(lsm, a[..., None], -1)[..., 0]
    close(out["g"], g, np.float32, rtol=1e-5)
    close(out["logp"], logp, np.float32, rtol=1e-5)
    close(out["loss"], -(logp * g).mean(axis=(1, 2)), np.float32, rtol=1e-5)
    close(out["ret"], r.sum(2).mean(1), np.float32, rtol=1e-5)
    assert out["loss"].shape == (I,)


def test_gae_backward_recurrence():
    out = run(
        """
        config I = 2, T = 5, gamma = 0.9, lam = 0.8
        dim i < I
        dim t < T
        r[i, t] = f32(t) * 0.1 + f32(i)
        v[i, t] = f32(t) * 0.05
        v_last[i] = 0.5
        delta[i, T-1] = r[i, T-1] + gamma * v_last[i] - v[i, T-1]
        delta[i, t] = r + gamma * v[i, t+1] - v
        adv[i, T-1] = delta[i, T-1]
        adv[i, t] = delta + gamma * lam * adv[i, t+1]
        ret[i, t] = adv + v
        out adv, ret
        """
    )
    T = 5
    adv = np.zeros((2, T))
    for i in range(2):
        r = np.arange(T) * 0.1 + i
        v = np.arange(T) * 0.05
        vn = np.append(v[1:], 0.5)
        delta = r + 0.9 * vn - v
        acc = 0.0
        for t in range(T - 1, -1, -1):
            acc = delta[t] + 0.9 * 0.8 * acc
            adv[i, t] = acc
    close(out["adv"], adv, np.float32, rtol=1e-5)
    close(out["ret"], adv + np.arange(T) * 0.05, rtol=1e-5)


def test_n_step_targets_with_a_clipped_dynamic_slice():
    out = run(
        """
        config T = 7, N = 3, gamma = 0.5
        dim t < T
        r[t] = f32(t) + 1.0
        g[t] = discounted_sum(r[t:min(t + N, T)], gamma)
        out g
        """
    )
    r = np.arange(7) + 1.0
    close(out["g"], [sum(0.5**k * r[t + k] for k in range(min(3, 7 - t))) for t in range(7)])


def test_sliding_windows_and_ema():
    out = run(
        """
        config B = 2, T = 8, W = 3
        config alpha = 2.0 / (W + 1)
        dim b < B
        dim t < T
        x[b, t] = f32((t * 5 + b * 3) % 7) - 2.0
        mean_w[b, t] = mean(x[b, max(0, t-W+1):t+1])
        max_w[b, t] = max(x[b, max(0, t-W+1):t+1])
        ema[b, 0] = x[b, 0]
        ema[b, t] = alpha * x[b, t] + (1 - alpha) * ema[b, t-1]
        def stats(w) { m = mean(w); (m, sqrt(mean((w - m) ** 2))) }
        fm[b, t], fs[b, t] = stats(x[b, t-W+1:t+1]) when t >= W - 1
        out mean_w, max_w, ema, fm, fs
        """
    )
    b, t = np.meshgrid(np.arange(2), np.arange(8), indexing="ij")
    x = ((t * 5 + b * 3) % 7).astype(np.float32) - 2
    mean_w = np.stack([[x[j, max(0, k - 2) : k + 1].mean() for k in range(8)] for j in range(2)])
    max_w = np.stack([[x[j, max(0, k - 2) : k + 1].max() for k in range(8)] for j in range(2)])
    alpha = np.float32(0.5)
    ema = np.zeros_like(x)
    ema[:, 0] = x[:, 0]
    for k in range(1, 8):
        ema[:, k] = alpha * x[:, k] + (1 - alpha) * ema[:, k - 1]
    fm = np.zeros_like(x)
    fs = np.zeros_like(x)
    for k in range(2, 8):
        fm[:, k] = x[:, k - 2 : k + 1].mean(1)
        fs[:, k] = x[:, k - 2 : k + 1].std(1)
    close(out["mean_w"], mean_w, rtol=1e-5)
    close(out["max_w"], max_w)
    close(out["ema"], ema, rtol=1e-5)
    close(out["fm"], fm, rtol=1e-5)
    close(out["fs"], fs, rtol=1e-5, atol=1e-5)


def test_minibatch_indices_by_dim_dependent_slice_then_gather():
    out = run(
        """
        config K = 4, MB = 2, N = 3
        dim k < K
        perm = (arange(MB * N) * 5) % (MB * N)
        data = f32(arange(MB * N)) * 10.0
        idx[k] = perm[(k % MB) * N : (k % MB + 1) * N]
        mb[k] = data[idx[k]]
        out idx, mb
        """
    )
    perm = (np.arange(6) * 5) % 6
    data = np.arange(6, dtype=np.float32) * 10
    idx = np.stack([perm[(k % 2) * 3 : (k % 2 + 1) * 3] for k in range(4)])
    close(out["idx"], idx, np.int32)
    close(out["mb"], data[idx])


def test_env_step_like_tuple_recurrence_with_different_offsets():
    # o[t+1], r[t] = step(o[t]): one equation defines o at 1..T and r at 0..T-1
    out = run(
        """
        config B = 2, T = 3
        dim b < B
        dim t < T
        def step(o, a) { (o * 0.5 + f32(a), sum(o)) }
        o[b, 0] = f32(arange(2)) + f32(b)
        a[b, t] = (b + t) % 2
        o[b, t+1], r[b, t] = step(o[b, t], a[b, t])
        out o, r
        """
    )
    o = np.zeros((2, 4, 2), np.float32)
    r = np.zeros((2, 3), np.float32)
    for b in range(2):
        o[b, 0] = np.arange(2) + b
        for t in range(3):
            a = (b + t) % 2
            o[b, t + 1] = o[b, t] * 0.5 + a
            r[b, t] = o[b, t].sum()
    close(out["o"], o)
    close(out["r"], r)


def test_mutual_recurrence_between_two_tensors():
    out = run(
        """
        config T = 4
        dim t < T
        a[0] = 1.0
        a[t+1] = b[t] + 1.0
        b[t] = a[t] * 2.0
        out a, b
        """
    )
    a, b = [1.0], []
    for _ in range(4):
        b.append(a[-1] * 2)
        a.append(b[-1] + 1)
    close(out["a"], a)
    close(out["b"], b)


def test_outer_recurrence_reads_a_slice_of_an_inner_tensor():
    out = run(
        """
        config I = 3, T = 2
        dim i < I
        dim t < T
        w[0] = 1.0
        r[i, t] = w[i] * f32(t + 1)
        w[i+1] = w[i] + sum(r[i, 0:T])
        out w, r
        """
    )
    w = [1.0]
    for _ in range(3):
        w.append(w[-1] + w[-1] * 3)
    close(out["w"], w)
    close(out["r"], np.array(w[:3])[:, None] * np.array([1, 2]))


def test_prefix_sum_recurrence_reading_a_growing_slice_of_itself():
    out = run(
        """
        config T = 5
        dim t < T
        x[0] = 1.0
        x[t] = sum(x[0:t]) when t > 0
        out x
        """
    )
    close(out["x"], [1, 1, 2, 4, 8])


def test_ppo_style_inner_loop_over_two_dims():
    out = run(
        """
        config I = 3, K = 2
        dim i < I
        dim k < K
        theta[0, 0] = 1.0
        theta[i, k+1] = theta[i, k] * 0.5 + f32(k)
        theta[i+1, 0] = theta[i, K]
        final[i] = theta[i, K]
        out theta, final
        """
    )
    th = np.zeros((4, 3))
    th[0, 0] = 1
    for i in range(3):
        for k in range(2):
            th[i, k + 1] = th[i, k] * 0.5 + k
        th[i + 1, 0] = th[i, 2]
    th[3, 1:] = 0
    close(out["theta"], th)
    close(out["final"], th[:3, 2])


def test_dependences_in_every_direction_without_cycles():
    out = run(
        """
        config T = 5, N = 4
        dim i < N
        dim j < N
        dim t < T
        # a point reading a later constant point defined by a base equation
        x[0] = 1.0
        x[T-1] = 2.0
        x[t] = x[t-1] + x[T-1]
        # anti-diagonal dependences (i-1, j+1) and (i+1, j-1)
        p[0, j] = f32(j)
        p[i, N-1] = 10.0
        p[i, j] = p[i-1, j+1] + 1.0
        q[N-1, j] = f32(j)
        q[i, 0] = 10.0
        q[i, j] = q[i+1, j-1] + 1.0
        # two tensors that read each other at alternating offsets
        u[t] = w[t+1] when t < T-1
        u[t] = 0.0
        w[t] = u[t-2] + 1.0 when t >= 2
        w[t] = f32(t)
        # backward in the inner dim, forward in the outer dim
        v[0, t] = f32(t)
        v[i, T-1] = v[i-1, 0]
        v[i, t] = v[i, t+1] + v[i-1, t]
        # a suffix reduction of itself
        s[T-1] = 1.0
        s[t] = sum(s[t+1:T])
        out x, p, q, u, w, v, s
        """
    )
    T, N = 5, 4
    x = np.zeros(T)
    x[0], x[T - 1] = 1, 2
    for t in range(1, T - 1):
        x[t] = x[t - 1] + x[T - 1]
    p = np.zeros((N, N))
    p[0] = np.arange(N)
    q = np.zeros((N, N))
    q[N - 1] = np.arange(N)
    for i in range(1, N):
        for j in range(N):
            p[i, j] = 10 if j == N - 1 else p[i - 1, j + 1] + 1
    for i in range(N - 2, -1, -1):
        for j in range(N):
            q[i, j] = 10 if j == 0 else q[i + 1, j - 1] + 1
    u, w = np.zeros(T), np.arange(T, dtype=float)
    for t in range(T - 1):
        if t + 1 >= 2:
            w[t + 1] = u[t - 1] + 1
        u[t] = w[t + 1]
    v = np.zeros((N, T))
    v[0] = np.arange(T)
    for i in range(1, N):
        v[i, T - 1] = v[i - 1, 0]
        for t in range(T - 2, -1, -1):
            v[i, t] = v[i, t + 1] + v[i - 1, t]
    s = np.zeros(T)
    s[T - 1] = 1
    for t in range(T - 2, -1, -1):
        s[t] = s[t + 1 :].sum()
    close(out["x"], x)
    close(out["p"], p)
    close(out["q"], q)
    close(out["u"], u)
    close(out["w"], w)
    close(out["v"], v)
    close(out["s"], s)
