"""Optimizer equations (LANGUAGE.md section 9), expanded before the program is checked.

In: the parsed program. Out: the same program where each params record ``P`` updated by
``adam`` gets a hidden params record ``P@adam`` (its moments and step count) that mirrors
P's recurrence: initialized to zeros where P is initialized, updated by the same equation
that updates P, copied where P is copied. So

    net[i+1] = adam(net[i], g, lr)          becomes
    net[i+1], net@adam[i+1] = adam@step(net[i], net@adam[i], g, lr, ...)
    net[i+1, 0] = net[i, K]                 becomes
    net[i+1, 0], net@adam[i+1, 0] = net[i, K], net@adam[i, K]

``sgd`` has no state. Any other equation of an optimized record is an error, as is an
optimizer anywhere but as the whole right side of an update of a params record.
"""

from __future__ import annotations

from dataclasses import replace

from timerlc.diagnostics import ProgramError
from timerlc.frontend import ast

OPTIMIZERS = ("adam", "sgd")
ADAM_STEP = "adam@step"


def state_name(params: str) -> str:
    return f"{params}@adam"


def expand_optimizers(program: ast.Program) -> ast.Program:
    params = {s.name.name: s for s in program.statements if isinstance(s, ast.ParamsDecl)}
    shadowed = {s.name.name for s in program.statements if isinstance(s, ast.DefDecl)}
    if shadowed & set(OPTIMIZERS):
        return program  # a def named adam or sgd is the user's own function
    optimized: dict[str, str] = {}  # params name -> optimizer
    for stmt in program.statements:
        if isinstance(stmt, ast.Equation) and _optimizer_call(stmt.rhs) is not None:
            name, kind = _check_update(stmt, params)
            optimized.setdefault(name, kind)
        _refuse_nested(stmt)
    out = []
    for stmt in program.statements:
        if isinstance(stmt, ast.ParamsDecl) and optimized.get(stmt.name.name) == "adam":
            out += [stmt, _state_decl(stmt)]
        elif isinstance(stmt, ast.Equation):
            out.append(_rewrite(stmt, optimized))
        else:
            out.append(stmt)
    return ast.Program(tuple(out))


def _optimizer_call(rhs) -> ast.Call | None:
    if len(rhs) == 1 and isinstance(rhs[0], ast.Call) and isinstance(rhs[0].func, ast.Name):
        if rhs[0].func.id in OPTIMIZERS:
            return rhs[0]
    return None


def _head(e) -> ast.Name | None:
    if isinstance(e, ast.Subscript):
        e = e.value
    return e if isinstance(e, ast.Name) else None


SIGNATURES = {
    "adam": (["p", "g", "lr", "beta1", "beta2", "eps"], ["p", "g", "lr"]),
    "sgd": (["p", "g", "lr"], ["p", "g", "lr"]),
}


def _check_update(stmt: ast.Equation, params: dict) -> tuple[str, str]:
    from timerlc.frontend.builtins import bind_arguments

    call = _optimizer_call(stmt.rhs)
    kind = call.func.id
    bind_arguments(kind, *SIGNATURES[kind], call)
    if not call.args:
        raise ProgramError(
            f"{kind} needs the parameters to update as its first argument", call.func.span
        )
    target = _head(call.args[0])
    if target is None or target.id not in params:
        what = f"'{target.id}'" if target is not None else "its first argument"
        raise ProgramError(
            f"{kind} updates a params record, and {what} is not one (declare it with params)",
            call.args[0].span,
        )
    if len(stmt.lhs) != 1 or _head(stmt.lhs[0]) is None or _head(stmt.lhs[0]).id != target.id:
        raise ProgramError(
            f"{kind}({target.id}...) must define '{target.id}' itself: write "
            f"{target.id}[...] = {kind}({target.id}[...], ...)",
            stmt.lhs[0].span,
        )
    return target.id, kind


def _refuse_nested(stmt):
    """An optimizer call anywhere but as the whole right side of an equation."""
    top = _optimizer_call(stmt.rhs) if isinstance(stmt, ast.Equation) else None
    for e in _expressions(stmt):
        for call in _calls(e):
            if call is not top and isinstance(call.func, ast.Name) and call.func.id in OPTIMIZERS:
                raise ProgramError(
                    f"{call.func.id} must be the whole right side of an update of a params "
                    f"record, like net[i+1] = {call.func.id}(net[i], g, lr)",
                    call.func.span,
                )


def _expressions(stmt):
    if isinstance(stmt, ast.Equation):
        return stmt.rhs
    if isinstance(stmt, ast.DefDecl):
        return tuple(v for item in stmt.body for v in item.value)
    return ()


def _calls(e):
    if isinstance(e, ast.Call):
        yield e
        yield from _calls(e.func)
        for a in e.args:
            yield from _calls(a)
        for k in e.kwargs:
            yield from _calls(k.value)
        return
    for name in ("operand", "left", "right", "value", "lo", "hi"):
        child = getattr(e, name, None)
        if isinstance(child, ast.Expr):
            yield from _calls(child)
    for name in ("operands", "items"):
        for child in getattr(e, name, ()) or ():
            if isinstance(child, ast.Expr):
                yield from _calls(child)


def _state_decl(p: ast.ParamsDecl) -> ast.ParamsDecl:
    fields = []
    for prefix in ("m_", "v_"):
        for f in p.fields:
            fields.append(
                ast.ParamField(
                    ast.Ident(prefix + f.name.name, f.name.span),
                    f.type,
                    ast.Name("zeros", f.span),
                    f.span,
                )
            )
    step_type = ast.TypeExpr(ast.Ident("f64", p.name.span), (), p.name.span)
    fields.append(
        ast.ParamField(
            ast.Ident("step", p.name.span), step_type, ast.Name("zeros", p.name.span), p.name.span
        )
    )
    return ast.ParamsDecl(
        ast.Ident(state_name(p.name.name), p.name.span), p.dims, tuple(fields), p.span
    )


def _with_head(e, name: str):
    """``e`` (a read or left side of P) with P renamed: the same indices on another tensor."""
    if isinstance(e, ast.Subscript):
        return replace(e, value=ast.Name(name, e.value.span))
    return ast.Name(name, e.span)


def _rewrite(stmt: ast.Equation, optimized: dict) -> ast.Equation:
    if len(stmt.lhs) != 1:
        for lhs in stmt.lhs:
            head = _head(lhs)
            if head is not None and optimized.get(head.id) == "adam":
                raise ProgramError(
                    f"'{head.id}' is updated by adam; it cannot be defined by a tuple equation",
                    lhs.span,
                )
        return stmt
    head = _head(stmt.lhs[0])
    if head is None or optimized.get(head.id) is None:
        return stmt
    name, kind = head.id, optimized[head.id]
    call = _optimizer_call(stmt.rhs)
    if call is not None:
        if kind != call.func.id:
            raise ProgramError(
                f"'{name}' is updated by both {kind} and {call.func.id}", call.func.span
            )
        if kind == "sgd":
            return stmt
        state = state_name(name)
        args = (call.args[0], _with_head(call.args[0], state)) + call.args[1:]
        step = ast.Call(ast.Name(ADAM_STEP, call.func.span), args, call.kwargs, call.span)
        return replace(stmt, lhs=stmt.lhs + (_with_head(stmt.lhs[0], state),), rhs=(step,))
    rhs = stmt.rhs[0] if len(stmt.rhs) == 1 else None
    if rhs is not None and _head(rhs) is not None and _head(rhs).id == name:
        if kind == "sgd":
            return stmt
        state = state_name(name)
        return replace(
            stmt,
            lhs=stmt.lhs + (_with_head(stmt.lhs[0], state),),
            rhs=(rhs, _with_head(rhs, state)),
        )
    raise ProgramError(
        f"'{name}' is updated by {kind}; its other equations may only copy it, "
        f"like {name}[i+1, 0] = {name}[i, K]",
        stmt.lhs[0].span,
    )
