"""The optimizers of LANGUAGE.md section 9 (sgd, adam, clip_norm) against torch.optim's
formulas written independently in NumPy, float32, in PyTorch's order of operations; the
optimizer state mirroring the parameters' recurrence (PPO-style inner loops, copies); and
the errors of section 9. Where torch is importable, also against torch.optim itself.

The NumPy reference is fed the gradients the program computed (``out g``), so each test
checks the optimizer step by step, every iterate of every field; that those gradients are
the right ones is checked separately, loosely, against a NumPy gradient of the loss.
"""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from grad_helpers import error_at, run

F32 = np.float32

# a least-squares loss over three fields of different shapes
PARAMS = """
params net{dims} {{
  w : f32[3] = stack([0.5, -1.0, 2.0])
  b : f32[] = 0.25
  m : f32[2, 2] = reshape(stack([0.3, -0.7, 1.1, 0.05]), [2, 2])
}}
X = reshape(f32(arange(12)) * 0.25 - 1.0, [4, 3])
Y = stack([1.0, -0.5, 0.25, 2.0])
"""
LOSS = "mean((X @ {p}.w + {p}.b - Y) ** 2) + 0.5 * sum(({p}.m @ {p}.m - 0.2) ** 2)"
FIELDS = ("w", "b", "m")
X = (np.arange(12, dtype=F32) * F32(0.25) - F32(1.0)).reshape(4, 3)
Y = np.array([1.0, -0.5, 0.25, 2.0], F32)


def loss_grad(p):
    """The gradient of LOSS in f64 (only to check that the program's gradients are sane)."""
    w, b, m = (np.float64(p[k]) for k in FIELDS)
    r = X @ w + b - Y
    d = m @ m - 0.2
    return {"w": 2 * X.T @ r / 4, "b": np.array(2 * r.sum() / 4), "m": d @ m.T + m.T @ d}


def program(update: str, header: str = "config I = 6, lr = 0.05\ndim i < I", dims="[i]",
            rest: str = "") -> str:
    p = "net" + dims
    return (f"{header}\n{PARAMS.format(dims=dims)}"
            f"loss{dims} = {LOSS.format(p=p)}\n"
            f"g{dims} = grad(loss{dims}, {p})\n{update}\n{rest}out net, g, loss\n")


def at(out, prefix, idx):
    return {k: out[f"{prefix}.{k}"][idx] for k in FIELDS}


def close32(actual, expected, ulps=4, what=""):
    """Equal within a few float32 ulps (of the element, or of the largest element)."""
    actual, expected = np.asarray(actual), np.asarray(expected, F32)
    assert actual.dtype == F32, f"{what}: dtype {actual.dtype}"
    scale = np.spacing(np.max(np.abs(expected)).astype(F32))
    np.testing.assert_allclose(actual, expected, rtol=ulps * 2.0**-23, atol=ulps * scale,
                               err_msg=what)


# ----------------------------------------------------------------------------- NumPy torch
class AdamRef:
    """torch.optim.Adam (_single_tensor_adam, no weight decay, no amsgrad) in float32."""

    def __init__(self, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps
        self.m, self.v, self.step = {}, {}, 0

    def update(self, p: dict, g: dict) -> dict:
        self.step += 1
        b1, b2, step = self.b1, self.b2, self.step
        bc1 = 1 - b1**step  # Python floats (float64), as torch does
        bc2 = 1 - b2**step
        step_size = self.lr / bc1
        bc2_sqrt = bc2**0.5
        out = {}
        for k, pk in p.items():
            gk = np.asarray(g[k], F32)
            m = self.m.get(k, np.zeros_like(gk))
            v = self.v.get(k, np.zeros_like(gk))
            w = F32(1 - b1)  # exp_avg.lerp_(grad, 1 - beta1)
            m = m + w * (gk - m) if w < 0.5 else gk - (gk - m) * (F32(1) - w)
            v = v * F32(b2) + gk * gk * F32(1 - b2)  # mul_(beta2).addcmul_(g, g, 1 - beta2)
            denom = np.sqrt(v) / F32(bc2_sqrt) + F32(self.eps)
            out[k] = np.asarray(pk, F32) + F32(-step_size) * (m / denom)  # addcdiv_
            self.m[k], self.v[k] = m, v
        return out


def sgd_ref(p, g, lr):
    return {k: np.asarray(p[k], F32) + F32(-lr) * np.asarray(g[k], F32) for k in p}


def clip_ref(g, max_norm):
    """torch.nn.utils.clip_grad_norm_: one coefficient over all fields."""
    total = F32(np.sqrt(sum(np.sum(np.square(np.asarray(v, F32)), dtype=F32) for v in g.values())))
    coef = min(F32(1.0), F32(max_norm) / (total + F32(1e-6)))
    return {k: np.asarray(v, F32) * F32(coef) for k, v in g.items()}


def check_trajectory(out, opt, n=6):
    """net[i+1] == opt(net[i], g[i]) for every i, from the program's net[i] and g[i]."""
    p = at(out, "net", 0)
    for i in range(n):
        g = at(out, "g", i)
        want = loss_grad(at(out, "net", i))
        for k in FIELDS:  # the program's gradient is the loss's gradient
            np.testing.assert_allclose(g[k], want[k], rtol=2e-4, atol=2e-5)
        p = opt(p, g)
        for k in FIELDS:
            close32(out[f"net.{k}"][i + 1], p[k], what=f"net.{k} after step {i + 1}")
            p[k] = out[f"net.{k}"][i + 1]  # continue from the program's iterate


# ============================================================================ sgd and adam


def test_sgd_matches_torch_sgd():
    out = run(program("net[i+1] = sgd(net[i], g[i], lr)"))
    check_trajectory(out, lambda p, g: sgd_ref(p, g, 0.05))
    assert out["loss"][-1] < out["loss"][0]


def test_adam_matches_torch_adam_every_iterate():
    out = run(program("net[i+1] = adam(net[i], g[i], lr)"))
    ref = AdamRef(0.05)
    check_trajectory(out, ref.update)
    assert out["loss"][-1] < out["loss"][0]


@pytest.mark.parametrize("call, kw", [
    ("adam(net[i], g[i], lr, beta1=0.8, beta2=0.99, eps=1e-3)",
     {"beta1": 0.8, "beta2": 0.99, "eps": 1e-3}),
    ("adam(net[i], g[i], 0.02, 0.6, 0.95, 1e-6)",
     {"lr": 0.02, "beta1": 0.6, "beta2": 0.95, "eps": 1e-6}),
    ("adam(net[i], g[i], lr, eps=0.1)", {"eps": 0.1}),
    ("adam(net[i], g[i], lr, beta2=0.5)", {"beta2": 0.5}),
    ("adam(net[i], g[i], lr, beta1=0.3)", {"beta1": 0.3}),  # lerp weight >= 0.5
    ("adam(net[i], g[i], lr, beta1=0.0)", {"beta1": 0.0}),
])
def test_adam_with_custom_hyperparameters(call, kw):
    out = run(program(f"net[i+1] = {call}"))
    ref = AdamRef(kw.pop("lr", 0.05), **kw)
    check_trajectory(out, ref.update)


def test_adam_on_f64_parameters():
    text = """
        config I = 4
        dim i < I
        params net[i] {
          w : f64[2] = stack([f64(0.5), f64(-1.5)])
        }
        loss[i] = sum((net[i].w - stack([f64(1.0), f64(2.0)])) ** 2)
        g[i] = grad(loss[i], net[i])
        net[i+1] = adam(net[i], g[i], 0.1)
        out net, g
        """
    out = run(text)
    p, m, v = np.array([0.5, -1.5]), 0.0, 0.0
    for i in range(4):
        g = 2 * (p - np.array([1.0, 2.0]))
        np.testing.assert_allclose(out["g.w"][i], g, rtol=1e-14)
        m = m + 0.1 * (g - m)
        v = v * 0.999 + g * g * (1 - 0.999)
        denom = np.sqrt(v) / math.sqrt(1 - 0.999 ** (i + 1)) + 1e-8
        p = p - 0.1 / (1 - 0.9 ** (i + 1)) * (m / denom)
        assert out["net.w"].dtype == np.float64
        np.testing.assert_allclose(out["net.w"][i + 1], p, rtol=1e-14)


def test_two_records_one_with_adam_one_with_sgd():
    text = program("net[i+1] = adam(net[i], g[i], lr)", rest="""
params critic[i] {
  c : f32[] = 1.5
}
closs[i] = (critic[i].c - 0.5) ** 2
cg[i] = grad(closs[i], critic[i])
critic[i+1] = sgd(critic[i], cg[i], 0.25)
out critic
""")
    out = run(text)
    check_trajectory(out, AdamRef(0.05).update)
    c = F32(1.5)
    for i in range(6):
        c = c + F32(-0.25) * (F32(2.0) * (c - F32(0.5)))
        close32(out["critic.c"][i + 1], c)


def test_two_records_each_with_its_optimizer_on_one_shared_loss():
    # actor-critic style: each update differentiates the same loss with respect to its own
    # record; critic[i] was updated from actor[i-1], which is not actor[i] (section 8)
    out = run("""
config I = 4
dim i < I
params actor[i] {
  a : f32[] = 1.0
}
params critic[i] {
  c : f32[] = 2.0
}
loss[i] = (actor[i].a * critic[i].c - 0.5) ** 2
actor[i+1] = sgd(actor[i], grad(loss[i], actor[i]), 0.1)
critic[i+1] = adam(critic[i], grad(loss[i], critic[i]), 0.1)
out actor, critic, loss
""")
    a, c, ref = F32(1.0), F32(2.0), AdamRef(0.1)
    for i in range(4):
        r = a * c - F32(0.5)
        ga, gc = F32(2.0) * r * c, F32(2.0) * r * a
        a = a - F32(0.1) * ga
        c = ref.update({"c": c}, {"c": gc})["c"]
        close32(out["actor.a"][i + 1], a, what=f"actor[{i + 1}]")
        close32(out["critic.c"][i + 1], c, what=f"critic[{i + 1}]")
        a, c = out["actor.a"][i + 1], out["critic.c"][i + 1]


# ============================================================================ state recurrence


def ppo_three_fields(n_i: int = 3, n_k: int = 4):
    """The PPO form with the three-field record: net[i, k] over I*K steps of one Adam."""
    header = f"config I = {n_i}, K = {n_k}, lr = 0.05\ndim i < I\ndim k < K"
    text = program("net[i, k+1] = adam(net[i, k], g[i, k], lr)\nnet[i+1, 0] = net[i, K]",
                   header=header, dims="[i, k]")
    out = run(text)
    ref = AdamRef(0.05)
    p = at(out, "net", (0, 0))
    for i in range(n_i):
        close32(out["net.w"][i, 0], p["w"], what=f"net[{i}, 0] is net[{i - 1}, K]")
        for k in range(n_k):
            g = at(out, "g", (i, k))
            for f in FIELDS:
                np.testing.assert_allclose(g[f], loss_grad(at(out, "net", (i, k)))[f],
                                           rtol=2e-4, atol=2e-5)
            p = ref.update(p, g)  # one Adam state over all I*K steps: step = i*K + k + 1
            for f in FIELDS:
                close32(out[f"net.{f}"][i, k + 1], p[f], what=f"net.{f}[{i}, {k + 1}]")
                p[f] = out[f"net.{f}"][i, k + 1]
    for f in FIELDS:
        close32(out[f"net.{f}"][n_i, 0], p[f], what=f"net.{f}[I, 0]")


def test_ppo_inner_loop_carries_the_state_across_iterations():
    ppo_three_fields(2, 2)


def test_ppo_inner_loop_of_realistic_size_checks_without_hanging():
    # in a subprocess, so that a hang (the cycle check once took minutes here) costs a bounded
    # time; a guard, not a measurement: the limit is far above the ~2 s it takes
    code = "import test_optimizers as t; t.ppo_three_fields(3, 4)"
    try:
        res = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the PPO program did not check and run within 300 s")
    assert res.returncode == 0, res.stderr[-3000:]


def test_ppo_inner_loop_with_data_that_changes_per_iteration():
    text = """
        config I = 3, K = 3
        dim i < I
        dim k < K
        params net[i, k] {
          w : f32[2] = stack([0.5, -1.0])
        }
        target[i] = stack([f32(i), 1.0 - f32(i)])
        loss[i, k] = sum((net[i, k].w - target[i]) ** 2)
        g[i, k] = grad(loss[i, k], net[i, k])
        net[i, k+1] = adam(net[i, k], g[i, k], 0.1)
        net[i+1, 0] = net[i, K]
        out net, g
        """
    out = run(text)
    ref, p = AdamRef(0.1), {"w": np.array([0.5, -1.0], F32)}
    for i in range(3):
        for k in range(3):
            g = {"w": F32(2.0) * (p["w"] - np.array([i, 1.0 - i], F32))}
            close32(out["g.w"][i, k], g["w"])
            p = ref.update(p, g)
            close32(out["net.w"][i, k + 1], p["w"], what=f"net[{i}, {k + 1}]")


def test_adam_state_is_copied_where_the_parameters_are_copied():
    # updates on even i only; the odd steps copy both the parameters and the moments
    out = run(program("net[i+1] = adam(net[i], g[i], lr) when i % 2 == 0\nnet[i+1] = net[i]"))
    ref = AdamRef(0.05)
    p = at(out, "net", 0)
    for i in range(6):
        if i % 2 == 0:
            p = ref.update(p, at(out, "g", i))
        for k in FIELDS:
            close32(out[f"net.{k}"][i + 1], p[k], what=f"net.{k}[{i + 1}]")
            p[k] = out[f"net.{k}"][i + 1]


# ============================================================================ clip_norm


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_norm_before_adam(max_norm):
    out = run(program(f"net[i+1] = adam(net[i], clip_norm(g[i], {max_norm}), lr)"))
    ref = AdamRef(0.05)
    check_trajectory(out, lambda p, g: ref.update(p, clip_ref(g, max_norm)))


def test_clip_norm_before_sgd_and_as_its_own_tensor():
    out = run(program("gc[i] = clip_norm(g[i], 0.75)\nnet[i+1] = sgd(net[i], gc[i], lr)",
                      rest="out gc\n"))
    for i in range(6):
        g = at(out, "g", i)
        c = clip_ref(g, 0.75)
        norm = np.sqrt(sum(np.sum(np.float64(v) ** 2) for v in c.values()))
        assert norm == pytest.approx(0.75, rel=1e-5)
        for k in FIELDS:
            close32(out[f"gc.{k}"][i], c[k], what=f"gc.{k}[{i}]")
    check_trajectory(out, lambda p, g: sgd_ref(p, clip_ref(g, 0.75), 0.05))


def test_clip_norm_of_a_plain_tensor():
    out = run("v = stack([3.0, 4.0])\nc = clip_norm(v, 1.0)\nd = clip_norm(v, 10.0)\nout c, d\n")
    close32(out["c"], np.array([3.0, 4.0], F32) * F32(F32(1.0) / (F32(5.0) + F32(1e-6))))
    close32(out["d"], [3.0, 4.0])


# ============================================================================ errors

ERR_HEAD = """config I = 3
dim i < I
params net[i] {
  w : f32[2] = zeros
}
loss[i] = sum(net[i].w ** 2)
g[i] = grad(loss[i], net[i])
"""
X0 = "x[0] = zeros([2])\n"


@pytest.mark.parametrize("lines, line, col, words", [
    # an optimizer on a tensor that is not params
    (X0 + "x[i+1] = adam(x[i], g[i], 0.1)\nnet[i+1] = net[i]\n", 9, 15, ["'x'", "params"]),
    (X0 + "x[i+1] = sgd(x[i], g[i].w, 0.1)\nnet[i+1] = net[i]\n", 9, 14, ["'x'", "params"]),
    ("net[i+1] = adam(loss[i], g[i], 0.1)\n", 8, 17, ["'loss'", "params"]),
    # not the whole right side
    ("net[i+1] = net[i]\ny[i] = sum(adam(net[i], g[i], 0.1).w)\n", 9, 12, ["whole right side"]),
    ("net[i+1] = sgd(adam(net[i], g[i], 0.1), g[i], 0.1)\n", 8, 16, ["sgd"]),
    (("net[i+1] = adam(net[i], g[i], 0.1) when i < 1\nnet[i+1] = net[i]\n"
      "y[i] = sgd(net[i], g[i], 0.1)\n"), 10, 1, ["net"]),
    # another equation form for an optimized parameter
    ("net[i+1] = adam(net[i], g[i], 0.1) when i < 1\nnet[i+1] = sgd(net[i], g[i], 0.1)\n",
     9, 12, ["adam", "sgd"]),
    ("net[i+1] = adam(net[i], g[i], 0.1) when i < 1\nnet[i+1] = grad(loss[i], net[i])\n",
     9, 1, ["net", "copy"]),
    ("net[i+1] = adam(net[i], g[i], 0.1) when i < 1\nnet[i+1] = net[i] * 2.0\n",
     9, 1, ["net", "copy"]),
    ("net[i+1] = sgd(net[i], g[i], 0.1) when i < 1\nnet[i+1] = g[i]\n", 9, 1, ["net"]),
    ("net[i+1] = adam(net[i], g[i], 0.1)\nnet[i+1], q[i] = net[i], 1.0\n", 9, 1, ["tuple"]),
    # arguments
    ("net[i+1] = adam(net[i], g[i], 0.1, beta3=1.0)\n", 8, 36, ["beta3"]),
])
def test_optimizer_errors(lines, line, col, words):
    error_at(ERR_HEAD + lines + "out net\n", line, col, *words)


def test_a_def_may_not_hide_an_optimizer():
    text = ERR_HEAD + "def step(p, q) {\n  adam(p, q, 0.1)\n}\nnet[i+1] = step(net[i], g[i])\n"
    error_at(text + "out net\n", 9, 3, "whole right side")


def test_adam_arity_error_speaks_of_adam():
    e = error_at(ERR_HEAD + "net[i+1] = adam(net[i], g[i])\nout net\n", 8, 12, "lr")
    assert "adam@step" not in e.message and "4 to 7" not in e.message, e.message


# ============================================================================ torch itself


def test_against_torch_optim():
    torch = pytest.importorskip("torch")
    for update, make in [
        ("adam(net[i], g[i], lr)", lambda ps: torch.optim.Adam(ps, lr=0.05, foreach=False)),
        ("adam(net[i], g[i], lr, beta1=0.6, beta2=0.95, eps=1e-4)",
         lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.6, 0.95), eps=1e-4, foreach=False)),
        ("sgd(net[i], g[i], lr)", lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=False)),
    ]:
        out = run(program(f"net[i+1] = {update}"))
        ps = [torch.tensor(out[f"net.{k}"][0]) for k in FIELDS]
        opt = make(ps)
        for i in range(6):
            for t, k in zip(ps, FIELDS):
                t.grad = torch.tensor(out[f"g.{k}"][i])
            opt.step()
            for t, k in zip(ps, FIELDS):
                close32(out[f"net.{k}"][i + 1], t.detach().numpy(), what=f"{update} {k} {i}")
                with torch.no_grad():
                    t.copy_(torch.tensor(out[f"net.{k}"][i + 1]))
