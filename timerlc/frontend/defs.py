"""Checks of ``def`` bodies that do not need a call: names resolve, the body ends with its
value, and no def calls itself (directly or through others).

Types are checked where a def is inlined, since its parameters take the types of each
call's arguments; these checks make an unused def's mistakes visible too.
"""

from __future__ import annotations

from timerlc.diagnostics import ProgramError, did_you_mean
from timerlc.frontend import ast
from timerlc.frontend.declarations import ProgramInfo


def check_defs(info: ProgramInfo):
    calls: dict[str, list[tuple[str, object]]] = {}
    for name, d in info.defs.items():
        calls[name] = _check_body(info, d)
    _check_recursion(info, calls)


def _check_body(info: ProgramInfo, d: ast.DefDecl) -> list[tuple[str, object]]:
    if not d.body or d.body[-1].targets is not None:
        raise ProgramError(
            f"the body of '{d.name.name}' must end with an expression (its value)", d.name.span
        )
    local = {p.name for p in d.params}
    calls: list = []
    for item in d.body:
        if item.targets is None and item is not d.body[-1]:
            raise ProgramError(
                "only the last line of a def body is its value; bind this with name = ...",
                item.span,
            )
        for e in item.value:
            _names(info, e, local, calls)
        for t in item.targets or ():
            if not isinstance(t, ast.Name):
                raise ProgramError("a def binding must assign plain names", t.span)
            local.add(t.id)
    return calls


def _names(info: ProgramInfo, e, local: set, calls: list):
    if isinstance(e, ast.Name):
        if e.id not in local and e.id not in info.names and e.id != "None":
            raise ProgramError(
                f"unknown name '{e.id}'" + did_you_mean(e.id, list(local) + list(info.names)),
                e.span,
            )
        return
    if isinstance(e, ast.Call):
        f = e.func
        if isinstance(f, ast.Name):
            if f.id in local:
                raise ProgramError(f"'{f.id}' is a local value, not a function", f.span)
            if f.id in info.defs:
                calls.append((f.id, f.span))
            elif f.id not in info.names:
                raise ProgramError(
                    f"unknown function '{f.id}'" + did_you_mean(f.id, info.names), f.span
                )
        else:
            _names(info, f, local, calls)
        for a in e.args:
            _names(info, a, local, calls)
        for k in e.kwargs:
            _names(info, k.value, local, calls)
        return
    if isinstance(e, ast.Attribute):
        _names(info, e.value, local, calls)
        return
    for child in _children(e):
        if child is not None:
            _names(info, child, local, calls)


def _children(e):
    if isinstance(e, ast.Unary):
        return (e.operand,)
    if isinstance(e, ast.Binary):
        return (e.left, e.right)
    if isinstance(e, ast.Compare):
        return e.operands
    if isinstance(e, ast.Subscript):
        return (e.value, *e.items)
    if isinstance(e, ast.Slice):
        return (e.lo, e.hi)
    if isinstance(e, (ast.TupleLit, ast.ListLit)):
        return e.items
    return ()


def _check_recursion(info: ProgramInfo, calls: dict):
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]):
        state[name] = 1
        for callee, span in calls.get(name, ()):
            if state.get(callee) == 1:
                chain = (
                    " -> ".join(path[path.index(callee) :] + [name, callee])
                    if callee != name
                    else f"{name} -> {name}"
                )
                raise ProgramError(
                    f"recursive call of def '{callee}' ({chain}); defs cannot recurse", span
                )
            if state.get(callee) is None:
                visit(callee, path + [name])
        state[name] = 2

    for name in info.defs:
        if state.get(name) is None:
            visit(name, [])
