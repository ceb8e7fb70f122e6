"""The op records: every primitive op of the PDG declared once, with its type rule, its
NumPy semantics (one kernel over a batch of points, which both the reference interpreter
and the cpu runtime run), its vector-Jacobian product, its attributes and its cost
(``core.Op``; JAX's one place per primitive).

Families: ``elementwise``, ``reductions``, ``arrays`` (matmul and shape ops), ``indexing``,
``sources``, ``random``, ``control`` (merge, grad, environment calls). Importing this
package registers them all. It is shared by the compiler and the runtime and imports no
compiler module (nor sympy).
"""

from timerlc.ops import arrays, control, elementwise, indexing, random, reductions, sources  # noqa: F401, E402, I001
from timerlc.ops.core import (  # noqa: F401  (the registry's API)
    NO_GRAD,
    REGISTRY,
    Op,
    TypeRuleError,
    broadcast_shapes,
    get,
    infer,
    is_env,
    normalize_axes,
)
from timerlc.ops.kernel import kernel_of, numpy_dtype, run_op, run_prepared  # noqa: F401
