import numpy as np

from timerlc.diagnostics import Source
from timerlc.frontend.check import check_source
from timerlc.reference.interpreter import outputs, run_graph


def test_returns_recurrence_matches_numpy():
    src = Source(
        "t.rtl",
        "config T = 10, gamma = 0.9\ndim t < T\nr[t] = f32(t) * 0.5\n"
        "g[T-1] = r[T-1]\ng[t] = r + gamma * g[t+1]\nout g\n",
    )
    out = outputs(run_graph(check_source(src)))
    r = np.arange(10, dtype=np.float32) * 0.5
    g = np.zeros(10, np.float32)
    g[-1] = r[-1]
    for t in range(8, -1, -1):
        g[t] = r[t] + np.float32(0.9) * g[t + 1]
    np.testing.assert_allclose(out["g"], g, rtol=1e-6)
