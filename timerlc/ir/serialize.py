"""Serialized forms of the PDG: readable text, versioned JSON, and Graphviz dot.

In: a ``timerlc.ir.pdg.Graph``. Out: ``to_text`` (the canonical dump, ``ir/NN-pass.pdg``),
``to_json`` (the build folder's ``program.pdg.json``) and ``to_dot`` (for viewing only).
``from_text`` and ``from_json`` read the first two back, spans included, with attribute
values keeping their exact Python types: ``from_text(to_text(g)) == g``. Bad input raises
``ValueError`` whose message starts with where the problem is (``line N:`` in text, a path
such as ``nodes[3].types[0]:`` in JSON).

The text form has one item per line; ``#`` starts a comment::

    pdg format 1
    config T = 10, gamma = 0.9, seed = 0
    dim t < 10
    domain D1 = [t] : ((t >= 0) and (t < 10)) or (t == 9)
    domain D3 = [] : true
    g = %1 = merge(%8[] if t == 9, %11[t] if ...) : f32[] over D1  @4:1-2 [@4:1-2 @5:1-2]
        %6 = const() {dtype="f32", shape=(), value=0.5} : f32[] over D3  @3:17-20
    tensor g = %1
    out g

A node line is ``[NAME =] %ID = OP(INPUT, ...) [{KEY=VALUE, ...}] : TYPE over DOMAIN``, then
optionally the node's span and, in brackets, its inputs' spans (``@_``: none). An input is
``%SRC[.OUT][ACCESS] [if COND]``. Index expressions and conditions use the RTL syntax of
``timerlc.ir.index``. Attribute values are ``none``, ``true``/``false``, ints, floats (``repr``,
``inf``, ``nan``), JSON strings, tuples ``(a, b)`` / ``(a,)`` and sympy index values ``ix(t + 1)``.
"""

from __future__ import annotations

import json
import math
import re

import sympy

from timerlc.diagnostics import Span
from timerlc.ir import index as ix
from timerlc.ir.pdg import (
    FORMAT_VERSION,
    Dim,
    Domain,
    Edge,
    Env,
    Graph,
    Node,
    Tensor,
    access_to_text,
)
from timerlc.ir.textparse import _KEYWORDS, Parser, from_text  # noqa: F401  (from_text is API)

_NAME_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")
_NAME_WIDTH, _CALL_WIDTH, _TYPE_WIDTH = 20, 64, 16


# ----------------------------------------------------------------------------- printing
def _name(s: str, reserved: frozenset = frozenset()) -> str:
    """A name as written: bare when it is a (dotted) identifier not reserved, else quoted."""
    return s if _NAME_RE.match(s) and s not in reserved else json.dumps(s)


def _value(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple):
        inner = ", ".join(_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    if isinstance(v, sympy.Basic):
        return f"ix({_index_text(v)})"
    raise TypeError(f"cannot serialize a value of type {type(v).__name__}: {v!r}")


def _index_text(v) -> str:
    # a dim symbol is both an Expr and a Boolean to sympy: test Expr first
    return ix.to_text(v) if isinstance(v, sympy.Expr) else ix.cond_to_text(v)


def _span(s: Span | None) -> str:
    if s is None:
        return "@_"
    if s.end_line == s.line:
        return f"@{s.line}:{s.col}-{s.end_col}"
    return f"@{s.line}:{s.col}-{s.end_line}:{s.end_col}"


def _ref(node: int, out: int) -> str:
    return f"%{node}.{out}" if out else f"%{node}"


def _edge(e: Edge) -> str:
    s = _ref(e.src, e.out) + access_to_text(e.access)
    return s if e.cond is None else f"{s} if {ix.cond_to_text(e.cond)}"


def _types(types) -> str:
    return str(types[0]) if len(types) == 1 else "(" + ", ".join(str(t) for t in types) + ")"


def _domain_table(graph: Graph) -> dict[Domain, int]:
    table: dict[Domain, int] = {}
    for n in graph.nodes:
        table.setdefault(n.domain, len(table))
    return table


def _call(n: Node) -> str:
    s = f"{_name(n.op)}({', '.join(_edge(e) for e in n.inputs)})"
    if n.attrs:
        s += " {" + ", ".join(f"{_name(k)}={_value(v)}" for k, v in n.attrs) + "}"
    return s


def to_text(graph: Graph) -> str:
    """The canonical text dump of a graph (see the module docstring)."""
    domains = _domain_table(graph)
    out = [f"pdg format {FORMAT_VERSION}"]
    if graph.configs:
        out.append("config " + ", ".join(f"{_name(k)} = {_value(v)}" for k, v in graph.configs))
    out += [f"dim {_name(d.name)} < {d.bound}" for d in graph.dims]
    out += [
        f"env {_name(e.name)} = {json.dumps(e.spec)} batch {_name(e.batch)}" for e in graph.envs
    ]
    out.append("")
    for d, k in domains.items():
        out.append(f"domain D{k} = [{', '.join(map(_name, d.dims))}] : {ix.cond_to_text(d.cond)}")
    out.append("")
    rows = []
    for n in graph.nodes:
        edge_spans = any(e.span is not None for e in n.inputs)
        spans = _span(n.span) if n.span is not None or edge_spans else ""
        if edge_spans:
            spans += " [" + " ".join(_span(e.span) for e in n.inputs) + "]"
        label = "" if n.name is None else _name(n.name, _KEYWORDS) + " ="
        rows.append((label, f"%{n.id}", _call(n), _types(n.types), f"D{domains[n.domain]}", spans))
    if rows:
        wl, wr, wc, wt = (
            min(max(len(r[k]) for r in rows), w)
            for k, w in enumerate((_NAME_WIDTH, 8, _CALL_WIDTH, _TYPE_WIDTH))
        )
        for label, ref, call, types, dom, spans in rows:
            line = f"{label:>{wl}} {ref:<{wr}} = {call:<{wc}} : {types:<{wt}} over {dom:<4}"
            out.append(f"{line} {spans}".rstrip())
        out.append("")
    out += [f"tensor {_name(t.name)} = {_ref(t.node, t.out)}" for t in graph.tensors]
    if graph.outputs:
        out.append("out " + ", ".join(map(_name, graph.outputs)))
    if graph.metrics:
        out.append("metric " + ", ".join(map(_name, graph.metrics)))
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- JSON
def _enc(v):
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": _value(v)}
    if isinstance(v, tuple):
        return [_enc(x) for x in v]
    if isinstance(v, sympy.Basic):
        return {"ix": _index_text(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"cannot serialize a value of type {type(v).__name__}: {v!r}")


def _dec(v, where: str):
    if isinstance(v, list):
        return tuple(_dec(x, where) for x in v)
    if isinstance(v, dict):
        if set(v) == {"ix"}:
            return _parse(v["ix"], where, Parser.cond)
        if set(v) == {"float"} and v["float"] in ("inf", "-inf", "nan"):
            return float(v["float"])
        raise ValueError(f"{where}: unknown tagged value {json.dumps(v)}")
    return v


def _json_span(s: Span | None):
    return None if s is None else [s.line, s.col, s.end_line, s.end_col]


def _node_json(n: Node, domains: dict[Domain, int]) -> dict:
    inputs = []
    for e in n.inputs:
        d = {"src": e.src, "access": access_to_text(e.access)}
        if e.out:
            d["out"] = e.out
        if e.cond is not None:
            d["cond"] = ix.cond_to_text(e.cond)
        inputs.append(dict(d, span=_json_span(e.span)))
    return {
        "id": n.id,
        "op": n.op,
        "name": n.name,
        "domain": domains[n.domain],
        "types": [str(t) for t in n.types],
        "inputs": inputs,
        "attrs": [[k, _enc(v)] for k, v in n.attrs],
        "span": _json_span(n.span),
    }


def to_json(graph: Graph) -> str:
    """The versioned JSON form: one line per node, index expressions as RTL text."""
    domains = _domain_table(graph)
    head = {
        "format_version": FORMAT_VERSION,
        "configs": [[k, _enc(v)] for k, v in graph.configs],
        "dims": [[d.name, d.bound] for d in graph.dims],
        "envs": [[e.name, e.spec, e.batch] for e in graph.envs],
        "domains": [[list(d.dims), ix.cond_to_text(d.cond)] for d in domains],
    }
    tail = {
        "tensors": [[t.name, t.node, t.out] for t in graph.tensors],
        "outputs": list(graph.outputs),
        "metrics": list(graph.metrics),
    }
    nodes = ",\n".join(f"    {json.dumps(_node_json(n, domains))}" for n in graph.nodes)
    rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
    rows.append(f'  "nodes": [\n{nodes}\n  ]' if nodes else '  "nodes": []')
    rows += [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items()]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def _parse(text, where: str, method):
    p = Parser(_typed(text, str, where), where)
    v = method(p)
    p.end()
    return v


def _typed(v, kind: type, where: str):
    if isinstance(v, kind) and not (kind is int and isinstance(v, bool)):
        return v
    raise ValueError(
        f"{where}: expected {'a string' if kind is str else 'an integer'}, got {json.dumps(v)}"
    )


def _span_from(v, where: str) -> Span | None:
    if v is not None and (not isinstance(v, list) or len(v) != 4):
        raise ValueError(f"{where}: expected a span [line, col, end_line, end_col] or null")
    return None if v is None else Span(*(_typed(x, int, where) for x in v))


def _rows(data: dict, key: str, width: int) -> list:
    for r in data[key]:
        if not isinstance(r, list) or len(r) != width:
            raise ValueError(f"{key}: expected rows of {width} items, got {json.dumps(r)}")
    return data[key]


def from_json(text: str) -> Graph:
    """Parse what ``to_json`` writes; raises ``ValueError`` naming the bad place."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"line {e.lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or "format_version" not in data:
        raise ValueError("line 1: not a PDG JSON file (no format_version)")
    version = data["format_version"]
    if version != FORMAT_VERSION:
        raise ValueError(
            f"format_version: this is PDG format {json.dumps(version)}; "
            f"this timerlc reads format {FORMAT_VERSION}"
        )
    where = "the top level"
    try:
        where = "configs"
        configs = tuple((_typed(k, str, where), _dec(v, where)) for k, v in _rows(data, where, 2))
        where = "dims"
        dims = tuple(
            Dim(_typed(n, str, where), _typed(b, int, where)) for n, b in _rows(data, where, 2)
        )
        where = "envs"
        envs = (
            tuple(Env(*(_typed(x, str, where) for x in row)) for row in _rows(data, where, 3))
            if "envs" in data
            else ()
        )
        domains = []
        for k, (ddims, cond) in enumerate(_rows(data, "domains", 2)):
            where = f"domains[{k}]"
            domains.append(
                Domain(
                    tuple(_typed(d, str, where) for d in ddims), _parse(cond, where, Parser.boolean)
                )
            )
        nodes = [_node_from_json(d, k, domains) for k, d in enumerate(data["nodes"])]
        where = "tensors"
        tensors = tuple(
            Tensor(_typed(n, str, where), _typed(i, int, where), _typed(o, int, where))
            for n, i, o in _rows(data, where, 3)
        )
        where = "outputs"
        outputs = tuple(_typed(s, str, where) for s in data["outputs"])
        where = "metrics"
        metrics = tuple(_typed(s, str, where) for s in data["metrics"])
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"{where}: malformed ({type(e).__name__}: {e})") from None
    for n in nodes:
        for e in n.inputs:
            if not 0 <= e.src < len(nodes):
                raise ValueError(f"nodes[{n.id}]: %{e.src} is not a node")
    for t in tensors:
        if not 0 <= t.node < len(nodes):
            raise ValueError(f"tensors: {t.name} refers to %{t.node}, which is not a node")
    return Graph(dims, tuple(nodes), tensors, outputs, metrics, configs, envs)


def _node_from_json(d: dict, k: int, domains: list) -> Node:
    where = f"nodes[{k}]"
    if _typed(d["id"], int, where) != k:
        raise ValueError(f"{where}: has id {d['id']}; nodes must be listed in id order")
    dom = _typed(d["domain"], int, f"{where}.domain")
    if not 0 <= dom < len(domains):
        raise ValueError(f"{where}.domain: no domain {dom}")
    inputs = []
    for j, e in enumerate(d["inputs"]):
        w = f"{where}.inputs[{j}]"
        cond = None if e.get("cond") is None else _parse(e["cond"], w + ".cond", Parser.boolean)
        access = _parse(e["access"], w + ".access", Parser.access)
        inputs.append(
            Edge(
                _typed(e["src"], int, w),
                access,
                _typed(e.get("out", 0), int, w),
                cond,
                _span_from(e.get("span"), w + ".span"),
            )
        )
    types = tuple(_parse(t, f"{where}.types[{j}]", Parser.type_) for j, t in enumerate(d["types"]))
    attrs = tuple(
        (_typed(a, str, where), _dec(v, f"{where}.attrs.{a}")) for a, v in _rows(d, "attrs", 2)
    )
    name = None if d["name"] is None else _typed(d["name"], str, where)
    return Node(
        k,
        _typed(d["op"], str, where),
        domains[dom],
        tuple(inputs),
        types,
        attrs,
        name,
        _span_from(d["span"], where),
    )


# ----------------------------------------------------------------------------- dot
def _dot_label(parts) -> str:
    return '"' + "\\n".join(json.dumps(p, ensure_ascii=False)[1:-1] for p in parts) + '"'


def to_dot(graph: Graph) -> str:
    """Graphviz dot: a box per node, an edge per input labelled with its access."""
    out = [
        "digraph pdg {",
        '  node [shape=box, fontname="monospace", fontsize=10];',
        '  edge [fontname="monospace", fontsize=9];',
    ]
    outputs = set(graph.outputs) | set(graph.metrics)
    for n in graph.nodes:
        parts = [f"%{n.id} {n.op}"] + ([n.name] if n.name is not None else [])
        parts.append(f"{_types(n.types)} over [{', '.join(n.dims)}]")
        attrs = ", ".join(f"{k}={_value(v)}" for k, v in n.attrs)
        if attrs:
            parts.append(attrs if len(attrs) <= 48 else attrs[:45] + "...")
        style = ""
        if n.name is not None:
            fill = "#fde9c8" if n.name in outputs else "#e3ecfa"
            style = f', style=filled, fillcolor="{fill}"'
        out.append(f"  n{n.id} [label={_dot_label(parts)}{style}];")
    for n in graph.nodes:
        for e in n.inputs:
            parts = [(f".{e.out}" if e.out else "") + access_to_text(e.access)]
            if e.cond is not None:
                parts.append("if " + ix.cond_to_text(e.cond))
            out.append(f"  n{e.src} -> n{n.id} [label={_dot_label(parts)}];")
    return "\n".join(out + ["}"]) + "\n"
