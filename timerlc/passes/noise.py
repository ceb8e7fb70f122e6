"""Noise ahead: a categorical draw becomes its logits plus Gumbel noise, then an argmax.

In: a PDG after autodiff. Out: the same values, where each ``random_categorical(logits)``
node is ``argmax(f64(logits) + random_gumbel(), axis=-1)`` (``timerlc.rng.categorical`` is
defined so, draw for draw). Why: the noise depends only on the draw's key and point, not on
the logits, so it has no dependence on the acting loop; the schedule computes it ahead, one
batched op per iteration for every env and step, instead of 10 Philox rounds and two logs
per step inside the loop. The categorical node keeps its id (it is now the argmax), so its
consumers are unchanged.

Likewise ``random_bernoulli(p)`` becomes ``random_uniform(f64, p's shape) < p`` (what
``timerlc.rng.bernoulli`` is, draw for draw): a comparison the code generator lowers, with
the draw ahead where it has no dependence.
"""

from __future__ import annotations

from timerlc.ir.pdg import Edge, Graph, Node, identity_access, input_type, make_attrs
from timerlc.types import TensorType


def split_categorical(graph: Graph) -> Graph:
    nodes = list(graph.nodes)
    for n in graph.nodes:
        if n.op == "random_bernoulli":
            _split_bernoulli(graph, n, nodes)
            continue
        if n.op != "random_categorical":
            continue
        (e,) = n.inputs
        t = input_type(graph, e)
        if not all(isinstance(s, int) for s in t.shape):
            continue
        here = identity_access(n.dims)
        noise_t = TensorType("f64", t.shape)
        noise = _draw_ahead(n, "random_gumbel", t.shape, nodes)
        logits = e
        if t.dtype != "f64":
            cast = Node(
                len(nodes),
                "cast",
                n.domain,
                (e,),
                (noise_t,),
                make_attrs(dtype="f64"),
                span=n.span,
            )
            nodes.append(cast)
            logits = Edge(cast.id, here)
        total = Node(
            len(nodes),
            "add",
            n.domain,
            (logits, Edge(noise.id, here)),
            (noise_t,),
            span=n.span,
        )
        nodes.append(total)
        nodes[n.id] = Node(
            n.id,
            "argmax",
            n.domain,
            (Edge(total.id, here),),
            n.types,
            make_attrs(axis=len(t.shape) - 1),
            n.name,
            n.span,
        )
    return graph.replace(nodes=tuple(nodes)) if len(nodes) > len(graph.nodes) else graph


def _draw_ahead(n: Node, op: str, shape: tuple, nodes: list) -> Node:
    """A new node of ``nodes``: the f64 draw ``op`` of ``shape`` with the key of the draw
    ``n`` (its seed, site and space), so draw for draw the numbers ``n`` draws."""
    attrs = dict(n.attrs)
    draw = Node(
        len(nodes),
        op,
        n.domain,
        (),
        (TensorType("f64", shape),),
        make_attrs(
            seed=attrs["seed"], site=attrs["site"], space=attrs["space"], shape=shape, dtype="f64"
        ),
        span=n.span,
    )
    nodes.append(draw)
    return draw


def _split_bernoulli(graph: Graph, n: Node, nodes: list):
    (e,) = n.inputs
    t = input_type(graph, e)  # f64 (the builtin casts p)
    if t.dtype != "f64" or not all(isinstance(s, int) for s in t.shape):
        return
    noise = _draw_ahead(n, "random_uniform", t.shape, nodes)
    here = identity_access(n.dims)
    nodes[n.id] = Node(
        n.id, "lt", n.domain, (Edge(noise.id, here), e), n.types, make_attrs(), n.name, n.span
    )
