"""Building PDGs: a growing list of nodes with ids, constants shared, and type inference.

Used by the front end (lowering) and by passes that add nodes to an existing graph.
"""

from __future__ import annotations

from timerlc import ops
from timerlc.ir.pdg import SCALAR_DOMAIN, Domain, Edge, Graph, Node, identity_access, make_attrs
from timerlc.types import TensorType


class NodeBuilder:
    def __init__(self, nodes=()):
        self.nodes: list[Node | None] = list(nodes)
        self._consts: dict = {}

    @staticmethod
    def extending(graph: Graph) -> "NodeBuilder":
        return NodeBuilder(graph.nodes)

    def reserve(self) -> int:
        self.nodes.append(None)
        return len(self.nodes) - 1

    def add(self, op, domain, inputs, type_, attrs=(), name=None, span=None) -> int:
        nid = len(self.nodes)
        self.nodes.append(Node(nid, op, domain, tuple(inputs), (type_,), attrs, name, span))
        return nid

    def fill(self, nid: int, node: Node):
        assert self.nodes[nid] is None, nid
        self.nodes[nid] = node

    def put(self, nid: int, node: Node):
        """Replace node ``nid`` (a pass rewriting a node in place)."""
        self.nodes[nid] = node

    def const(self, value, dtype: str, shape: tuple, span=None) -> int:
        key = (repr(value), dtype, tuple(shape))
        if key not in self._consts:
            attrs = make_attrs(value=value, dtype=dtype, shape=tuple(shape))
            self._consts[key] = self.add(
                "const", SCALAR_DOMAIN, (), TensorType(dtype, tuple(shape)), attrs, span=span
            )
        return self._consts[key]

    def type_of(self, nid: int) -> TensorType:
        return self.nodes[nid].type

    def identity(self, nid: int, span=None) -> Edge:
        return Edge(nid, identity_access(self.nodes[nid].dims), span=span)

    def op(
        self, name: str, domain: Domain, inputs: list[Edge], in_types, span=None, **attrs
    ) -> int:
        """Add an op node, inferring its type (a TypeRuleError here is a bug of the caller)."""
        t = ops.infer(name, dict(attrs, _name=name), list(in_types))
        return self.add(name, domain, inputs, t, make_attrs(**attrs), span=span)
