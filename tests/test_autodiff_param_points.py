"""Gradients of a loss that also reads other points of the parameter (LANGUAGE.md section 8).

PPO as a user first writes it: the rollout of iteration i acts with ``net[i, 0]`` and its
log-probs, advantages and returns go into the loss of every minibatch step k without
``stop_grad``, and ``grad(loss[i, k], net[i, k])`` drives the two-dim recurrence
``net[i, k+1] = adam(net[i, k], ...)``, ``net[i+1, 0] = net[i, K]``. Section 8 defines
it: x = ``net[i, k]`` is an input and what it depends on is not traversed, so for k > 0
the rollout (computed from ``net[i, 0]``, which x depends on) is a constant, and for k = 0
it is computed from x itself and is differentiated through.

Each gradient is checked against central finite differences of that definition, in f64:
a forward-only program computes the loss of one point (i, k) from a params record ``p``
(x, perturbed) and a record ``q`` (``net[i, 0]``, held), the rollout reading ``q`` for
k > 0 and ``p`` for k = 0. The full programs run on the reference and the cpu backend
(``grad_helpers.run``), which must agree.
"""

import numpy as np
import pytest
from grad_helpers import compile_program, error, numeric_grad, params_decl, run, src

from timerlc.reference.interpreter import outputs, run_graph

HEADER = """
config I = 2, K = 3, T = 4, gamma = 0.9, lam = 0.8
dim i < I
dim k < K
dim t < T
"""

INIT = {
    "pi": np.array([[0.6, -0.4], [0.3, 0.8]]),
    "v": np.array([0.5, -0.2]),
}

# A fake rollout (features, actions and rewards that need no environment) acting with
# {roll}, GAE over it, and the clipped-surrogate loss of minibatch step k under {cur}.
# {sg} wraps what the rollout hands to the loss: "" (as a user first writes it) or
# "stop_grad" (as programs/ppo.rtl does).
PPO = """
feat[i, t] = stack([f64(t) * 0.35 - f64(i) * 0.25 - 0.4, cos(f64(t + i))])
act[i, t] = (t + 2 * i) % 2
r[i, t] = sin(f64(3 * t + i))

logits[i, t] = feat @ {roll}.pi
logp[i, t] = log_softmax(logits)[act]
val[i, t] = sum(feat * {roll}.v)
val[i, T] = 0.5 * sum(feat[i, T-1] * {roll}.v)
delta[i, t] = r + gamma * val[i, t+1] - val
adv[i, T-1] = delta[i, T-1]
adv[i, t] = delta + gamma * lam * adv[i, t+1]
ret[i, t] = adv + val

old_logp[i] = {sg}(logp[i, 0:T])
old_adv[i] = {sg}(adv[i, 0:T])
old_ret[i] = {sg}(ret[i, 0:T])

new_logits[i, k] = feat[i, 0:T] @ {cur}.pi
new_logp[i, k] = sum(log_softmax(new_logits) * one_hot(act[i, 0:T], 2), 1)
ratio[i, k] = exp(new_logp - old_logp[i])
pg[i, k] = mean(maximum(-old_adv[i] * ratio, -old_adv[i] * clip(ratio, 0.8, 1.2)))
new_v[i, k] = sum(feat[i, 0:T] * {cur}.v, 1)
v_loss[i, k] = 0.5 * mean((new_v - old_ret[i]) ** 2)
ent[i, k] = mean(entropy_logits(new_logits))
L[i, k] = pg + 0.5 * v_loss - 0.01 * ent
"""

UPDATE = """
g[i, k] = grad(L[i, k], net[i, k])
net[i, k+1] = adam(net[i, k], g[i, k], 0.05)
net[i+1, 0] = net[i, K]
out g, net, L
"""


def full_program(sg: str = "") -> str:
    body = src(PPO).format(roll="net[i, 0]", cur="net[i, k]", sg=sg)
    decl = params_decl(INIT, name="net", dims="[i, k]")
    return src(HEADER) + decl + "\n" + body + src(UPDATE)


def at(out: dict, name: str, point: tuple) -> dict[str, np.ndarray]:
    return {f: out[f"{name}.{f}"][point] for f in INIT}


def definition(out: dict, i: int, k: int, held: bool, sg: str = "") -> dict[str, np.ndarray]:
    """Central differences of L[i, k] with respect to x = net[i, k]: the rollout reads x
    too (k = 0) or the constant net[i, 0] (``held``)."""
    x, rollout = at(out, "net", (i, k)), at(out, "net", (i, 0))
    body = src(PPO).format(roll="q" if held else "p", cur="p", sg=sg)
    text = (
        src(HEADER)
        + "config ci = 0, ck = 0\n"
        + params_decl(x, name="p")
        + "\n"
        + params_decl(rollout, name="q")
        + "\n"
        + body
        + "loss = L[ci, ck]\nout loss\n"
    )
    fwd = compile_program(text, ci=i, ck=k)
    value = float(outputs(run_graph(fwd))["loss"])
    np.testing.assert_allclose(value, out["L"][i, k], rtol=1e-12, err_msg="L[i, k] differs")
    return numeric_grad(fwd, x)


def assert_grad(got: dict, want: dict, what: str):
    for f in INIT:
        np.testing.assert_allclose(
            got[f], want[f], rtol=1e-6, atol=1e-8, err_msg=f"{what}: field {f}"
        )


@pytest.fixture(scope="module")
def no_stop_grad():
    return run(full_program())


@pytest.mark.parametrize("point", [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)])
def test_ppo_without_stop_grad_is_the_gradient_of_the_definition(no_stop_grad, point):
    i, k = point
    got = at(no_stop_grad, "g", point)
    # k = 0: the rollout is computed from x itself; k > 0: from net[i, 0], a constant
    want = definition(no_stop_grad, i, k, held=k > 0)
    assert_grad(got, want, f"g[{i}, {k}]")
    if k == 0:
        # the rollout's contribution is not zero here: holding it would be another answer
        held = definition(no_stop_grad, i, k, held=True)
        assert not np.allclose(held["v"], want["v"], rtol=1e-3), "the rollout adds nothing"


def test_without_stop_grad_the_first_step_has_no_surrogate_gradient(no_stop_grad):
    # at k = 0 the ratio exp(new_logp - logp) is 1 for every x, both log-probs coming from
    # x: of the whole loss, only the entropy bonus moves the policy (why PPO needs
    # stop_grad). The entropy term's gradient, by finite differences in NumPy:
    pi = no_stop_grad["net.pi"][0, 0]
    t = np.arange(4.0)
    feat = np.stack([t * 0.35 - 0.4, np.cos(t)], 1)  # feat[0, t]

    def entropy_term(pi):
        logits = feat @ pi
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        return -0.01 * np.mean(-(np.exp(logp) * logp).sum(1))

    fd = np.zeros_like(pi)
    for idx in np.ndindex(*pi.shape):
        d = np.zeros_like(pi)
        d[idx] = 1e-6
        fd[idx] = (entropy_term(pi + d) - entropy_term(pi - d)) / 2e-6
    np.testing.assert_allclose(no_stop_grad["g.pi"][0, 0], fd, rtol=1e-6, atol=1e-9)


def test_stop_grad_holds_the_rollout_and_changes_the_first_step(no_stop_grad):
    with_sg = run(full_program(sg="stop_grad"))
    # net[0, 0] is the same initial value in both programs
    np.testing.assert_array_equal(with_sg["net.pi"][0, 0], no_stop_grad["net.pi"][0, 0])
    got = at(with_sg, "g", (0, 0))
    # with stop_grad, the first step's gradient holds the rollout constant
    assert_grad(got, definition(with_sg, 0, 0, held=True, sg="stop_grad"), "stop_grad g[0, 0]")
    # and it is not the gradient without stop_grad
    other = at(no_stop_grad, "g", (0, 0))
    for f in INIT:
        assert not np.allclose(got[f], other[f], rtol=1e-3), f"stop_grad changed nothing in {f}"
    # at k > 0 both programs hold the rollout: the same rule on their own trajectories
    for i, k in [(0, 1), (1, 2)]:
        assert_grad(
            at(with_sg, "g", (i, k)),
            definition(with_sg, i, k, held=True, sg="stop_grad"),
            f"stop_grad g[{i}, {k}]",
        )


# ============================================================================ with an env

ENV_PPO = """
config I = 2, K = 2, B = 2, T = 3
dim i < I
dim k < K
dim b < B
dim t < T
env E = "trivial?obs=2&length=4" batch b
{params}
o[i, b, 0] = E.reset()
logits[i, b, t] = f64(o[i, b, t]) @ {roll}.pi
a[i, b, t] = categorical(logits[i, b, t])
o[i, b, t+1], r[i, b, t], done[i, b, t] = E.step(a[i, b, t])
logp[i, b, t] = log_softmax(logits)[a]
val[i, b, t] = sum(f64(o[i, b, t]) * {roll}.v)
ret[i, b, T-1] = f64(r[i, b, T-1])
ret[i, b, t] = f64(r) + 0.9 * (1.0 - f64(done)) * ret[i, b, t+1]
adv[i, b, t] = ret - val

new_logits[i, k] = f64(o[i, 0:B, 0:T]) @ {cur}.pi
new_logp[i, k] = sum(log_softmax(new_logits) * one_hot(a[i, 0:B, 0:T], 2), 2)
ratio[i, k] = exp(new_logp - logp[i, 0:B, 0:T])
pg[i, k] = mean(maximum(-adv[i, 0:B, 0:T] * ratio,
                        -adv[i, 0:B, 0:T] * clip(ratio, 0.8, 1.2)))
new_v[i, k] = sum(f64(o[i, 0:B, 0:T]) * {cur}.v, 2)
L[i, k] = pg + 0.5 * mean((new_v - ret[i, 0:B, 0:T]) ** 2)
"""

ENV_INIT = {"pi": np.array([[0.2, -0.3], [-0.1, 0.25]]), "v": np.array([0.3, -0.15])}


def test_ppo_with_an_environment_and_sampled_actions():
    decl = params_decl(ENV_INIT, name="net", dims="[i, k]")
    text = src(ENV_PPO).format(params=decl, roll="net[i, 0]", cur="net[i, k]") + src(
        """
        g[i, k] = grad(L[i, k], net[i, k])
        net[i, k+1] = adam(net[i, k], g[i, k], 0.1)
        net[i+1, 0] = net[i, K]
        out g, net, L
        """
    )
    out = run(text)
    for i, k in [(1, 0), (1, 1)]:
        x = {f: out[f"net.{f}"][i, k] for f in ENV_INIT}
        rollout = {f: out[f"net.{f}"][i, 0] for f in ENV_INIT}
        decls = "config ci = 0, ck = 0\n" + params_decl(x, name="p") + "\n"
        decls += params_decl(rollout, name="q")
        fwd_text = src(ENV_PPO).format(params=decls, roll="p" if k == 0 else "q", cur="p")
        fwd = compile_program(fwd_text + "loss = L[ci, ck]\nout loss\n", ci=i, ck=k)
        np.testing.assert_allclose(
            float(outputs(run_graph(fwd))["loss"]), out["L"][i, k], rtol=1e-12
        )
        want = numeric_grad(fwd, x)
        for f in ENV_INIT:
            np.testing.assert_allclose(
                out[f"g.{f}"][i, k], want[f], rtol=1e-6, atol=1e-8, err_msg=f"g.{f}[{i}, {k}]"
            )


# ============================================================================ other points


def test_a_read_of_an_earlier_point_of_the_parameter_is_a_constant():
    out = run("""
        config I = 3
        dim i < I
        params net[i] {
          w : f64[2] = stack([f64(0.5), f64(-0.3)])
        }
        loss[0] = sum(net[0].w ** 2)
        loss[i] = sum((net[i].w - 2.0 * net[i-1].w) ** 2)
        g[i] = grad(loss[i], net[i])
        net[i+1] = sgd(net[i], g[i], 0.1)
        out g, net
        """)
    w = out["net.w"]
    np.testing.assert_allclose(out["g.w"][0], 2 * w[0])
    for i in (1, 2):
        np.testing.assert_allclose(out["g.w"][i], 2 * (w[i] - 2 * w[i - 1]))


def test_one_node_reading_x_and_the_first_point_of_the_iteration():
    out = run("""
        config I = 2, K = 3
        dim i < I
        dim k < K
        params net[i, k] {
          w : f64[] = f64(0.5)
        }
        loss[i, k] = (net[i, k].w * net[i, 0].w - 0.3) ** 2
        g[i, k] = grad(loss[i, k], net[i, k])
        net[i, k+1] = sgd(net[i, k], g[i, k], 0.1)
        net[i+1, 0] = net[i, K]
        out g, net
        """)
    w = out["net.w"]
    for i in range(2):
        w0 = w[i, 0]
        np.testing.assert_allclose(out["g.w"][i, 0], 4 * w0 * (w0 * w0 - 0.3))
        for k in (1, 2):
            np.testing.assert_allclose(out["g.w"][i, k], 2 * (w[i, k] * w0 - 0.3) * w0)


# ============================================================================ still refused

TWO_DIM = """
config I = 2, K = 3
dim i < I
dim k < K
params net[i, k] {{
  w : f64[] = f64(0.5)
}}
loss2[i, k] = (net[i, k].w - 1.0) ** 2
net[i, k+1] = sgd(net[i, k], grad(loss2[i, k], net[i, k]), 0.1)
net[i+1, 0] = net[i, K]
{body}
g[i, k] = grad(loss[i, k], net[i, k])
out g
"""


@pytest.mark.parametrize(
    "body",
    [
        # a later point of the parameter: it depends on x (through the update)
        "loss[i, k] = net[i, k+1].w * net[i, k].w",
        "loss[i, k] = net[i, k+1].w ** 2",
        "loss[i, k] = net[i, K].w * net[i, k].w",
        # every point of the iteration, x's later ones included, through one node
        "z[i, k] = net[i, k].w * 2.0\ns[i] = sum(z[i, 0:K])\nloss[i, k] = net[i, k].w * s[i]",
    ],
)
def test_reads_that_depend_on_x_are_still_refused(body):
    e = error(TWO_DIM.format(body=body))
    assert "mix different points of i, k" in e.message, e.message
    assert e.span.line == 11 + body.count("\n"), e.message
