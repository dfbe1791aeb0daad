"""Human-readable text for expressions, statements and functions (what ``tc.lower`` prints)."""

from __future__ import annotations

import threading
from typing import Any

from . import expr as E
from . import stmt as S

_BIN = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/", E.FloorDiv: "//", E.FloorMod: "%",
    E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">=",
    E.And: "&&", E.Or: "||",
}
_PREC = {
    E.Or: 1, E.And: 2, E.EQ: 3, E.NE: 3, E.LT: 4, E.LE: 4, E.GT: 4, E.GE: 4,
    E.Add: 5, E.Sub: 5, E.Mul: 6, E.Div: 6, E.FloorDiv: 6, E.FloorMod: 6,
}


class _Names:
    """Display names of the variables bound while printing one statement or function.

    Distinct variables may carry the same name (a stage computed at a consumer's loop ``i``
    has its own axis ``i``); printed as is, the inner ``for i`` would shadow the outer one and
    the text would not say which ``i`` an index uses. A variable bound while another of the
    same name is in scope is printed with a suffix (``i_1``), as TVM's printer does. Names
    depend only on the order of the statement, never on object ids, so printing the same IR
    twice, or the IR of the same schedule lowered twice, gives the same text.
    """

    def __init__(self) -> None:
        self.names: dict[E.Var, str] = {}
        self.in_scope: dict[str, int] = {}  # display name -> how many bindings hold it

    def bind(self, v: E.Var) -> str:
        name = self.names.get(v)
        if name is None:
            name = v.name
            k = 0
            while self.in_scope.get(name):
                k += 1
                name = f"{v.name}_{k}"
            self.names[v] = name
        self.in_scope[name] = self.in_scope.get(name, 0) + 1
        return name

    def unbind(self, v: E.Var) -> None:
        self.in_scope[self.names[v]] -= 1


class _State(threading.local):
    # per thread: expr_str also serves outside printing (simplify's keys, other threads)
    names: _Names | None = None


_STATE = _State()


def _var_name(v: E.Var) -> str:
    names = _STATE.names
    if names is None:
        return v.name
    return names.names.get(v, v.name)


def _p(e: E.Expr, outer: int, right: bool = False) -> str:
    s = expr_str(e)
    prec = _PREC.get(type(e))
    if prec is not None and (prec < outer or (right and prec == outer)):
        return f"({s})"
    return s


def expr_str(e: E.Expr) -> str:
    t = type(e)
    if t is E.IntImm:
        if e.dtype == "bool":  # type: ignore[attr-defined]
            return "True" if e.value else "False"  # type: ignore[attr-defined]
        suffix = "" if e.dtype in ("int32",) else f"i{e.dtype[3:]}" if e.dtype.startswith("int") else f"u{e.dtype[4:]}"
        return f"{e.value}{suffix}"  # type: ignore[attr-defined]
    if t is E.FloatImm:
        suffix = "f" if e.dtype == "float32" else ("h" if e.dtype == "float16" else "")
        return f"{e.value!r}{suffix}"  # type: ignore[attr-defined]
    if t is E.StringImm:
        return repr(e.value)  # type: ignore[attr-defined]
    if isinstance(e, E.Var):
        return _var_name(e)
    if t in _BIN:
        prec = _PREC[t]
        return f"{_p(e.a, prec)} {_BIN[t]} {_p(e.b, prec, right=True)}"  # type: ignore[attr-defined]
    if t is E.Min or t is E.Max:
        return f"{t.__name__.lower()}({expr_str(e.a)}, {expr_str(e.b)})"  # type: ignore[attr-defined]
    if t is E.Not:
        return f"!{_p(e.a, 9)}"  # type: ignore[attr-defined]
    if t is E.Select:
        return f"select({expr_str(e.cond)}, {expr_str(e.t)}, {expr_str(e.f)})"  # type: ignore[attr-defined]
    if t is E.Cast:
        return f"{e.dtype}({expr_str(e.value)})"  # type: ignore[attr-defined]
    if t is E.Call:
        args = ", ".join(expr_str(a) for a in e.args)  # type: ignore[attr-defined]
        return f"{'@' if e.extern else ''}{e.name}({args})"  # type: ignore[attr-defined]
    if t is E.Let:
        value = expr_str(e.value)  # type: ignore[attr-defined]
        names = _STATE.names
        if names is None:
            return f"(let {e.var.name} = {value} in {expr_str(e.body)})"  # type: ignore[attr-defined]
        name = names.bind(e.var)  # type: ignore[attr-defined]
        body = expr_str(e.body)  # type: ignore[attr-defined]
        names.unbind(e.var)  # type: ignore[attr-defined]
        return f"(let {name} = {value} in {body})"
    if t is E.Ramp:
        return f"ramp({expr_str(e.base)}, {expr_str(e.stride)}, {e.lanes})"  # type: ignore[attr-defined]
    if t is E.Broadcast:
        return f"x{e.lanes}({expr_str(e.value)})"  # type: ignore[attr-defined]
    if t is E.Shuffle:
        vs = ", ".join(expr_str(v) for v in e.vectors)  # type: ignore[attr-defined]
        return f"shuffle(({vs}), {list(e.indices)})"  # type: ignore[attr-defined]
    if t is E.VectorReduce:
        return f"reduce_{e.op}({expr_str(e.value)})"  # type: ignore[attr-defined]
    if t is E.BufferLoad:
        idx = ", ".join(expr_str(i) for i in e.indices)  # type: ignore[attr-defined]
        pred = f" if {expr_str(e.predicate)}" if e.predicate is not None else ""  # type: ignore[attr-defined]
        return f"{e.buffer.name}[{idx}{pred}]"  # type: ignore[attr-defined]
    if t is E.ProducerLoad:
        idx = ", ".join(expr_str(i) for i in e.indices)  # type: ignore[attr-defined]
        return f"{e.producer.name}[{idx}]"  # type: ignore[attr-defined]
    if t is E.Reduce:
        axes = ", ".join(str(a.var) for a in e.axis)  # type: ignore[attr-defined]
        src = ", ".join(expr_str(s) for s in e.source)  # type: ignore[attr-defined]
        return f"reduce({e.combiner.name}, [{src}], axis=[{axes}])"  # type: ignore[attr-defined]
    return f"<{t.__name__}>"


def _stmt(s: S.Stmt, ind: int, out: list[str]) -> None:
    pad = "  " * ind
    if isinstance(s, S.For):
        ann = "".join(f" {k}={v}" for k, v in s.annotations)
        head = s.kind.value
        if E.is_const_int(s.min, 0):
            rng = expr_str(s.extent)
        elif isinstance(s.min, E.IntImm) and isinstance(s.extent, E.IntImm):
            rng = f"{s.min.value}, {s.min.value + s.extent.value}"
        else:  # Python's range(start, stop): stop = min + extent
            rng = f"{expr_str(s.min)}, {_p(s.min, 5)} + {_p(s.extent, 5, right=True)}"
        names = _STATE.names
        name = names.bind(s.var) if names is not None else s.var.name
        out.append(f"{pad}{head} {name} in range({rng}){ann}:")
        _stmt(s.body, ind + 1, out)
        if names is not None:
            names.unbind(s.var)
    elif isinstance(s, S.BufferStore):
        idx = ", ".join(expr_str(i) for i in s.indices)
        pred = f" if {expr_str(s.predicate)}" if s.predicate is not None else ""
        out.append(f"{pad}{s.buffer.name}[{idx}] = {expr_str(s.value)}{pred}")
    elif isinstance(s, S.SeqStmt):
        for x in s.seq:
            _stmt(x, ind, out)
    elif isinstance(s, S.IfThenElse):
        out.append(f"{pad}if {expr_str(s.cond)}:")
        _stmt(s.then_case, ind + 1, out)
        if s.else_case is not None:
            out.append(f"{pad}else:")
            _stmt(s.else_case, ind + 1, out)
    elif isinstance(s, S.Allocate):
        b = s.buffer
        shape = ", ".join(expr_str(x) for x in b.shape)
        out.append(f"{pad}allocate {b.name}: {b.dtype}[{shape}] ({b.scope})")
        _stmt(s.body, ind, out)
    elif isinstance(s, S.LetStmt):
        value = expr_str(s.value)
        names = _STATE.names
        name = names.bind(s.var) if names is not None else s.var.name
        out.append(f"{pad}{name} = {value}")
        _stmt(s.body, ind, out)
        if names is not None:
            names.unbind(s.var)
    elif isinstance(s, S.Evaluate):
        out.append(f"{pad}{expr_str(s.value)}")
    elif isinstance(s, S.AttrStmt):
        out.append(f"{pad}# {s.key} = {s.value}")
        _stmt(s.body, ind, out)
    else:
        out.append(f"{pad}<{type(s).__name__}>")


def stmt_str(s: S.Stmt, indent: int = 0, free: tuple[E.Var, ...] = ()) -> str:
    """``s`` as text; ``free`` are variables in scope around it (a function's size vars),
    which a loop variable of the same name must not be confused with."""
    saved = _STATE.names
    names = _STATE.names = _Names()
    try:
        for v in free:
            names.bind(v)
        out: list[str] = []
        _stmt(s, indent, out)
    finally:
        _STATE.names = saved
    return "\n".join(out)


def func_str(f: Any) -> str:
    params = []
    for b in f.params:
        shape = ", ".join(expr_str(x) for x in b.shape)
        params.append(f"{b.name}: {b.dtype}[{shape}]")
    head = f"def {f.name}({', '.join(params)}):"
    text = head + "\n" + stmt_str(f.body, 1, tuple(getattr(f, "dim_vars", ()) or ()))
    inter = f.attrs.get("intermediates")
    if inter:
        text += "\n  # global intermediates: " + ", ".join(
            f"{b.name}: {b.dtype}[{', '.join(expr_str(x) for x in b.shape)}]" for b in inter)
    for k in f.attrs.get("kernels") or ():  # a host function: its kernels follow
        text += "\n\n" + func_str(k)
    return text
