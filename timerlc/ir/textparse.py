"""Reading the text form of the PDG (``timerlc.ir.serialize.to_text``) back into a Graph.

In: text, one item per line (see ``serialize``). Out: a ``Graph`` equal to the one printed,
spans included. ``Parser`` also reads the index expressions, conditions, accesses and types
that the JSON form stores as text. Errors are ``ValueError("line N: ...")``.
"""

from __future__ import annotations

import json
import math
import re

import sympy
from sympy.logic.boolalg import Boolean

from timerlc.diagnostics import Span
from timerlc.ir import index as ix
from timerlc.ir.pdg import FORMAT_VERSION, Dim, Domain, Edge, Env, Graph, Node, Point, Range, Tensor
from timerlc.types import DTYPES, TensorType, normalize_extent

_KEYWORDS = frozenset({"pdg", "config", "dim", "env", "domain", "tensor", "out", "metric"})
_VALUE_WORDS = frozenset({"none", "true", "false", "inf", "nan", "ix"})
_EXPR_WORDS = frozenset({"and", "or", "not", "true", "false", "min", "max"})
_NAME_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\Z")
_NAME_WIDTH, _CALL_WIDTH, _TYPE_WIDTH = 20, 64, 16


# ----------------------------------------------------------------------------- tokens
_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>\#.*)
    |(?P<span>@(?:(?P<l>\d+):(?P<c>\d+)-(?P<a>\d+)(?::(?P<b>\d+))?|_))
    |(?P<ref>%\d+(?:\.\d+)?)
    |(?P<float>\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)
    |(?P<int>\d+)
    |(?P<str>"(?:[^"\\]|\\.)*")
    |(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
    |(?P<op>//|<=|>=|==|!=|[-+*%<>=()\[\]{},:])""",
    re.X,
)


class Parser:
    """A recursive-descent parser over the tokens of one line (or of one JSON string)."""

    def __init__(self, text: str, where: str):
        self.where, self.toks, self.pos = where, [], 0
        at = 0
        while at < len(text):
            m = _TOKEN.match(text, at)
            if m is None:
                raise self.error(f"unexpected character {text[at]!r}")
            if m.lastgroup not in ("ws", "comment"):
                self.toks.append(("span" if m.group("span") else m.lastgroup, m.group(), m))
            at = m.end()

    def error(self, msg: str) -> ValueError:
        return ValueError(f"{self.where}: {msg}")

    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.pos + k
        return self.toks[j][:2] if j < len(self.toks) else ("end", "")

    def next(self) -> tuple[str, str]:
        self.pos += 1
        return self.peek(-1)

    def at(self, text: str) -> bool:
        return self.peek() in (("op", text), ("name", text))

    def accept(self, text: str) -> bool:
        found = self.at(text)
        self.pos += found
        return found

    def expect(self, text: str) -> None:
        if not self.accept(text):
            raise self.error(f"expected '{text}', got {self._shown()}")

    def _shown(self) -> str:
        kind, text = self.peek()
        return "the end of the line" if kind == "end" else f"'{text}'"

    def end(self) -> None:
        if self.peek()[0] != "end":
            raise self.error(f"unexpected {self._shown()}")

    def take(self, kind: str, what: str) -> str:
        if self.peek()[0] != kind:
            raise self.error(f"expected {what}, got {self._shown()}")
        return self.next()[1]

    def name(self, what: str = "a name") -> str:
        return self.string() if self.peek()[0] == "str" else self.take("name", what)

    def string(self) -> str:
        text = self.take("str", "a string")
        try:
            return json.loads(text)
        except ValueError as e:
            raise self.error(f"bad string {text} ({e.args[0].split(':')[0]})") from None

    def ref(self) -> tuple[int, int]:
        node, _, out = self.take("ref", "a node reference %N")[1:].partition(".")
        return int(node), int(out or 0)

    def comma_list(self, item, close: str | None) -> list:
        """Items separated by commas up to ``close`` (consumed), or to the end if None."""
        if close is None:
            out = [item()]
            while self.accept(","):
                out.append(item())
            return out
        out = []
        while not self.accept(close):
            out.append(item())
            if not self.at(close):
                self.expect(",")
        return out

    # ------------------------------------------------------------------ index expressions
    def cond(self):
        return self._joined("or", sympy.Or, lambda: self._joined("and", sympy.And, self._not))

    def _joined(self, word: str, make, operand):
        parts = [operand()]
        while self.accept(word):
            parts.append(operand())
        return parts[0] if len(parts) == 1 else make(*map(self._bool, parts))

    def _not(self):
        if self.accept("not"):
            return sympy.Not(self._bool(self._not()))
        left = self._sum()
        kind, op = self.peek()
        if kind != "op" or op not in ix.RELATIONS:
            return left
        self.pos += 1
        rel = ix.RELATIONS[op](self._num(left), self.expr())
        if self.peek()[1] in ix.RELATIONS:
            raise self.error("chained comparisons are not index conditions")
        return rel

    def expr(self):
        return self._num(self._sum())

    def _sum(self):
        e = self._term()
        while self.at("+") or self.at("-"):
            sign, rhs = self.next()[1], self._num(self._term())
            e = self._num(e) + rhs if sign == "+" else self._num(e) - rhs
        return e

    def _term(self):
        e = self._unary()
        while True:
            kind, text = self.peek()
            if kind == "ref" and "." not in text:  # `t %2` tokenizes as a node reference
                self.pos += 1
                op, a, b = "%", self._num(e), sympy.Integer(int(text[1:]))
            elif kind == "op" and text in ("*", "//", "%"):
                self.pos += 1
                op, a, b = text, self._num(e), self._num(self._unary())
            else:
                return e
            if op != "*" and b.is_zero:
                raise self.error(f"'{op}' by zero")
            e = a * b if op == "*" else ix.floordiv(a, b) if op == "//" else ix.mod(a, b)

    def _unary(self):
        return -self._num(self._unary()) if self.accept("-") else self._atom()

    def _atom(self):
        kind, text = self.next()
        if kind == "int":
            return sympy.Integer(int(text))
        if (kind, text) == ("op", "("):
            e = self.cond()
            self.expect(")")
            return e
        if kind == "name" and text in ("true", "false"):
            return sympy.true if text == "true" else sympy.false
        if kind == "name" and text in ("min", "max"):
            self.expect("(")
            args = [self._num(a) for a in self.comma_list(self.cond, ")")]
            if not args:
                raise self.error(f"{text}() needs arguments")
            return (sympy.Min if text == "min" else sympy.Max)(*args)
        if kind == "name" and text not in _EXPR_WORDS and "." not in text:
            return ix.sym(text)
        self.pos -= 1
        raise self.error(f"expected an index expression, got {self._shown()}")

    def _num(self, e):
        if isinstance(e, sympy.Expr):
            return e
        raise self.error(
            "expected an index expression, got the condition "
            f"'{ix.to_text(e) if isinstance(e, sympy.Expr) else ix.cond_to_text(e)}'"
        )

    def _bool(self, e):
        if isinstance(e, Boolean) and not isinstance(e, sympy.Expr):
            return e
        raise self.error(f"expected a condition, got the expression '{ix.to_text(e)}'")

    def boolean(self):
        return self._bool(self.cond())

    # ------------------------------------------------------------------ IR pieces
    def access(self) -> tuple:
        self.expect("[")

        def entry():
            lo = self.expr()
            return Range(lo, self.expr()) if self.accept(":") else Point(lo)

        return tuple(self.comma_list(entry, "]"))

    def type_(self) -> TensorType:
        dtype = self.take("name", "a dtype")
        if dtype not in DTYPES:
            raise self.error(f"unknown dtype '{dtype}' (expected one of {', '.join(DTYPES)})")
        self.expect("[")
        shape = self.comma_list(self.expr, "]")
        return TensorType(dtype, tuple(normalize_extent(s) for s in shape))

    def types(self) -> tuple:
        return tuple(self.comma_list(self.type_, ")")) if self.accept("(") else (self.type_(),)

    def keyed(self, what: str):
        key = self.name(what)
        self.expect("=")
        return key, self.value()

    def value(self):
        if self.peek()[0] == "str":
            return self.string()
        kind, text = self.next()
        if kind in ("int", "float"):
            return int(text) if kind == "int" else float(text)
        if kind == "name" and text == "ix":
            self.expect("(")
            e = self.cond()
            self.expect(")")
            return e
        if kind == "name" and text in _VALUE_WORDS:
            return {"none": None, "true": True, "false": False, "inf": math.inf, "nan": math.nan}[
                text
            ]
        if text == "-" and (self.peek()[0] in ("int", "float") or self.peek() == ("name", "inf")):
            return -self.value()
        if text == "(":
            items, trailing = [], False
            while not self.accept(")"):
                items.append(self.value())
                trailing = self.accept(",")
                if not trailing and not self.at(")"):
                    raise self.error(f"expected ',' or ')', got {self._shown()}")
            return items[0] if len(items) == 1 and not trailing else tuple(items)
        self.pos -= 1
        raise self.error(f"expected a value, got {self._shown()}")

    def span(self) -> Span | None:
        self.take("span", "a span @LINE:COL-...")
        m = self.toks[self.pos - 1][2]
        if m.group() == "@_":
            return None
        line, col, a, b = (int(g) if g else None for g in m.group("l", "c", "a", "b"))
        return Span(line, col, line, a) if b is None else Span(line, col, a, b)

    def node_line(self, position: int, domains: dict) -> Node:
        name = None
        if self.peek()[0] in ("name", "str"):
            name = self.name()
            self.expect("=")
        nid, out = self.ref()
        if nid != position or out:
            raise self.error(f"expected node %{position} here, got {self.peek(-1)[1]}")
        self.expect("=")
        op = self.name("an op name")
        self.expect("(")
        inputs = self.comma_list(self.input, ")")
        attrs = (
            self.comma_list(lambda: self.keyed("an attribute name"), "}")
            if self.accept("{")
            else []
        )
        self.expect(":")
        types = self.types()
        self.expect("over")
        dname = self.name("a domain name")
        if dname not in domains:
            raise self.error(f"unknown domain {dname} (domains are declared before the nodes)")
        span = self.span() if self.peek()[0] == "span" else None
        if self.accept("["):
            spans = []
            while not self.accept("]"):
                spans.append(self.span())
            if len(spans) != len(inputs):
                raise self.error(f"{len(spans)} input spans for {len(inputs)} inputs")
            inputs = [Edge(e.src, e.access, e.out, e.cond, s) for e, s in zip(inputs, spans)]
        return Node(nid, op, domains[dname], tuple(inputs), types, tuple(attrs), name, span)

    def input(self) -> Edge:
        src, out = self.ref()
        access = self.access()
        return Edge(src, access, out, self.boolean() if self.accept("if") else None)


# ----------------------------------------------------------------------------- text reading
def from_text(text: str) -> Graph:
    """Parse what ``to_text`` writes; raises ``ValueError("line N: ...")``."""
    configs, dims, domains, nodes, tensors, outputs, metrics = [], [], {}, [], [], [], []
    envs = []
    refs: list[tuple[int, int]] = []  # (line, node id) of every reference, checked at the end
    header = False
    lines = text.splitlines()
    for no, line in enumerate(lines, 1):
        p = Parser(line, f"line {no}")
        kind, word = p.peek()
        if kind == "end":
            continue
        if not header:
            if word != "pdg":
                raise p.error("not a PDG text dump (expected the header 'pdg format N')")
            p.next()
            p.expect("format")
            version = int(p.take("int", "a format version"))
            if version != FORMAT_VERSION:
                raise p.error(
                    f"this is PDG format {version}; this timerlc reads format {FORMAT_VERSION}"
                )
            header = True
        elif kind != "name" or word not in _KEYWORDS or p.peek(1) == ("op", "="):
            nodes.append(p.node_line(len(nodes), domains))
            refs += [(no, e.src) for e in nodes[-1].inputs]
        else:
            p.next()
            if word == "config":
                configs += p.comma_list(lambda: p.keyed("a config name"), None)
            elif word == "dim":
                name = p.name("a dim name")
                p.expect("<")
                dims.append(Dim(name, int(p.take("int", "a dim bound"))))
            elif word == "env":
                ename = p.name("an env name")
                p.expect("=")
                spec = p.string()
                p.expect("batch")
                envs.append(Env(ename, spec, p.name("a dim name")))
            elif word == "domain":
                dname = p.name("a domain name")
                if dname in domains:
                    raise p.error(f"domain {dname} is defined twice")
                p.expect("=")
                p.expect("[")
                ddims = tuple(p.comma_list(lambda: p.name("a dim name"), "]"))
                p.expect(":")
                domains[dname] = Domain(ddims, p.boolean())
            elif word == "tensor":
                tname = p.name("a tensor name")
                p.expect("=")
                tensors.append(Tensor(tname, *p.ref()))
                refs.append((no, tensors[-1].node))
            elif word in ("out", "metric"):
                (outputs if word == "out" else metrics).extend(p.comma_list(p.name, None))
            else:
                raise p.error("the header 'pdg format N' is allowed only once")
        p.end()
    if not header:
        raise ValueError(f"line {len(lines) + 1}: no header 'pdg format N' (empty input?)")
    for no, nid in refs:
        if not 0 <= nid < len(nodes):
            raise ValueError(f"line {no}: %{nid} is not a node (there are {len(nodes)})")
    return Graph(
        tuple(dims),
        tuple(nodes),
        tuple(tensors),
        tuple(outputs),
        tuple(metrics),
        tuple(configs),
        tuple(envs),
    )
