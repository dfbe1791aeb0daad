"""Loads, stores, addresses and debug bounds checks of the CPU code generator.

After flattening every access has one index in elements: a scalar, a contiguous
``Ramp(base, 1, n)`` (one vector load/store), or any other int vector (gather/scatter; on
the CPU an unmasked load of ``Ramp(base, s, n)`` with a small constant stride ``s`` is ``s``
contiguous loads within its span and shuffles instead, `MemoryMixin.strided_load_max`). A
``predicate`` masks lanes; masked-off lanes are never touched (``llvm.masked.*`` intrinsics,
passthru zero). A scalar predicate becomes a branch around the access.

In debug builds every access is checked against the buffer's extent before memory is touched;
a violation is recorded in a module global (first one wins, also across threads), the access is
skipped (a load yields 0) and the kernel returns `ErrorCode.OUT_OF_BOUNDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir
from llvmlite.ir.instructions import Instruction

from ..errors import CodegenError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from .llvm_common import (
    I1,
    I32,
    I64,
    PTR,
    VOID,
    call_intrinsic,
    cast,
    concat_vectors,
    f32_to_half,
    half_to_f32,
    llvm_type,
    opaque,
    shuffle_mask,
    splat,
    to_i64,
)

if TYPE_CHECKING:
    from .llvm_cpu import FnState


@dataclass(slots=True)
class BufBinding:
    """A buffer visible in the function being generated."""

    name: str
    ptr: ir.Value
    size: ir.Value | None  # i64 extent in elements of ``dtype`` (debug builds only)
    id: int  # index into CodegenCPU.debug_buffers
    dtype: str  # element dtype the buffer was declared with


_OOB_TYPE = ir.LiteralStructType([I32, I32, I64, I64])  # claimed flag, buffer id, index, extent


class MemoryMixin:
    """Memory-access half of `CodegenCPU` (needs its ``b``, ``st``, ``expr``, ``if_value``...)."""

    # provided by CodegenCPU
    module: ir.Module
    debug: bool
    debug_buffers: list[str]
    oob_record_name: str
    _mask: ir.Value | None
    #: the largest constant stride of an unmasked vector load that is read as contiguous
    #: vectors and shuffled (`_strided_load`) rather than gathered; 0: always gather. A
    #: stride-2 window ``x * 2 + rx`` (a strided convolution vectorized over output columns)
    #: is then two loads and one two-source permute; a 16-lane gather costs far more on Zen
    #: (docs/benchmark-notes.md)
    strided_load_max = 0
    if TYPE_CHECKING:

        @property
        def st(self) -> FnState: ...

        @property
        def b(self) -> ir.IRBuilder: ...

        def expr(self, e: E.Expr) -> ir.Value: ...

        def as_i1(self, e: E.Expr) -> ir.Value: ...

        def if_value(self, cond: ir.Value, then: Callable[[], ir.Value],
                     otherwise: Callable[[], ir.Value]) -> ir.Value: ...

        def with_mask(self, mask: ir.Value, fn: Callable[[], ir.Value]) -> ir.Value: ...

    # buffers --------------------------------------------------------------------------------
    def bind_buffer(self, buf: Buffer, ptr: ir.Value, size: ir.Value | None) -> BufBinding:
        self.debug_buffers.append(buf.name)
        binding = BufBinding(buf.name, ptr, size, len(self.debug_buffers) - 1, dt.element(buf.dtype))
        self.st.bufs[buf.data] = binding
        return binding

    def binding(self, buf: Buffer) -> BufBinding:
        # Keyed by the data Var, so views of one allocation (storage rewrite) share it.
        info = self.st.bufs.get(buf.data)
        if info is None:
            raise CodegenError(
                f"buffer '{buf.name}' is accessed but is neither a parameter nor allocated here"
            )
        return info

    def buffer_extent(self, buf: Buffer) -> ir.Value:
        """Number of elements of ``buf`` as an i64 (strided buffers: the furthest row end)."""
        b = self.b
        dims = [to_i64(b, self.expr(s), s.dtype) for s in buf.shape]
        n: ir.Value = ir.Constant(I64, 1)
        for d in dims:
            n = b.mul(n, d)
        for d, s in zip(dims, buf.strides, strict=False):  # strides may be empty
            alt = b.mul(d, to_i64(b, self.expr(s), s.dtype))
            n = b.select(b.icmp_signed(">", alt, n), alt, n)
        return n

    # loads and stores -----------------------------------------------------------------------
    def _access_masks(self, pred: E.Expr | None, lanes: int,
                      outer: ir.Value | None) -> tuple[ir.Value | None, ir.Value | None]:
        """Split the access's predicate and the enclosing Select mask into a scalar guard
        (branch around the access) and a per-lane mask (masked intrinsics)."""
        guard: ir.Value | None = None
        vmask: ir.Value | None = None
        p = self.as_i1(pred) if pred is not None else None
        b = self.b
        for m in (p, outer):
            if m is None:
                continue
            ml = m.type.count if isinstance(m.type, ir.VectorType) else 1
            if lanes > 1 and ml == lanes:
                vmask = m if vmask is None else b.and_(vmask, m)
                continue
            if ml > 1:  # a scalar access under a vector mask runs if any lane is active
                m = call_intrinsic(b, "vector.reduce.or", [m], ret=I1)
            guard = m if guard is None else b.and_(guard, m)
        return guard, vmask

    def emit_load(self, e: E.BufferLoad) -> ir.Value:
        if len(e.indices) != 1:
            raise CodegenError(f"load {e} has {len(e.indices)} indices; flatten buffers first")
        lanes = dt.lanes(e.dtype)
        guard, vmask = self._access_masks(e.predicate, lanes, self._mask)
        zero = ir.Constant(llvm_type(e.dtype), None)

        def inner() -> ir.Value:
            if vmask is None:
                return self._load(e, None)
            return self.with_mask(vmask, lambda: self._load(e, vmask))

        if guard is None:
            return inner()
        return self.if_value(guard, inner, lambda: zero)

    def _load(self, e: E.BufferLoad, vmask: ir.Value | None) -> ir.Value:
        info = self.binding(e.buffer)
        el = dt.element(e.dtype)
        memel = llvm_type(el, memory=True)
        lanes = dt.lanes(e.dtype)
        align = self.access_align(e.buffer, e.indices[0], el)
        idx, idx_dtype, contiguous = self._index(e.indices[0], lanes)
        b = self.b

        def do() -> ir.Value:
            if contiguous:
                ptr = b.gep(info.ptr, [idx], inbounds=True, source_etype=memel)
                vty = ir.VectorType(memel, lanes)
                if vmask is None:
                    v = b.load(ptr, typ=vty, align=align)
                else:
                    v = self._masked_zero("load", vty, [ptr, ir.Constant(I32, align), vmask], vmask)
            elif lanes > 1 and vmask is None and (stride := self._load_stride(e.indices[0])):
                v = self._strided_load(info.ptr, e.indices[0], stride, memel, lanes, align)
            elif lanes > 1:
                vty = ir.VectorType(memel, lanes)
                ptrs = self._vector_gep(info.ptr, idx, memel)
                if vmask is None:
                    v = self._masked("gather", vty, [ptrs, ir.Constant(I32, align), _all_true(lanes),
                                                     ir.Constant(vty, None)])
                else:
                    v = self._masked_zero("gather", vty, [ptrs, ir.Constant(I32, align), vmask], vmask)
            else:
                ptr = b.gep(info.ptr, [idx], inbounds=True, source_etype=memel)
                v = b.load(ptr, typ=memel, align=align)
            if el == "bool":  # stored as bytes, computed as i1
                v = b.icmp_unsigned("!=", v, ir.Constant(v.type, None))
            elif dt.is_half(el):  # stored as 16 bits, computed as float32
                v = half_to_f32(b, v, el)
            return v

        if not self.debug:
            return do()
        ok, offending = self._bounds(info, el, idx, idx_dtype, lanes, contiguous, vmask)

        def fail() -> ir.Value:
            self._report_oob(info, el, offending())
            return ir.Constant(llvm_type(e.dtype), None)  # a skipped load reads 0

        return self.if_value(ok, do, fail)

    def emit_store(self, s: S.BufferStore) -> None:
        if len(s.indices) != 1:
            raise CodegenError(f"store to '{s.buffer.name}' has {len(s.indices)} indices; "
                               "flatten buffers first")
        lanes = max(dt.lanes(s.indices[0].dtype), dt.lanes(s.value.dtype))
        guard, vmask = self._access_masks(s.predicate, lanes, None)
        if guard is None:
            self._store(s, lanes, vmask)
            return
        with self.b.if_then(guard):
            self._store(s, lanes, vmask)

    def _store(self, s: S.BufferStore, lanes: int, vmask: ir.Value | None) -> None:
        info = self.binding(s.buffer)
        el = dt.element(s.buffer.dtype)
        memel = llvm_type(el, memory=True)
        align = self.access_align(s.buffer, s.indices[0], el)
        # The value is computed under the store's mask: its loads must not read lanes the
        # store will not write (a vectorised tail reads past the end otherwise).
        value = (self.with_mask(vmask, lambda: self.expr(s.value)) if vmask is not None
                 else self.expr(s.value))
        value = cast(self.b, value, s.value.dtype, dt.with_lanes(el, lanes))
        idx, idx_dtype, contiguous = self._index(s.indices[0], lanes)
        b = self.b
        if el == "bool":
            value = b.zext(value, ir.VectorType(memel, lanes) if lanes > 1 else memel)
        elif dt.is_half(el):  # the float32 value rounds to 16 bits here (and only here)
            value = f32_to_half(b, value, el)

        def do() -> None:
            if contiguous:
                ptr = b.gep(info.ptr, [idx], inbounds=True, source_etype=memel)
                if vmask is None:
                    b.store(value, ptr, align=align)
                else:
                    self._masked("store", VOID, [value, ptr, ir.Constant(I32, align), vmask])
            elif lanes > 1:
                ptrs = self._vector_gep(info.ptr, idx, memel)
                self._masked("scatter", VOID, [value, ptrs, ir.Constant(I32, align),
                                               vmask if vmask is not None else _all_true(lanes)])
            else:
                ptr = b.gep(info.ptr, [idx], inbounds=True, source_etype=memel)
                b.store(value, ptr, align=align)

        if not self.debug:
            do()
            return
        ok, offending = self._bounds(info, el, idx, idx_dtype, lanes, contiguous, vmask)
        with b.if_else(ok) as (then, otherwise):
            with then:
                do()
            with otherwise:
                self._report_oob(info, el, offending())

    def access_align(self, buf: Buffer, index: E.Expr, el: str) -> int:
        """Bytes the address of an access (of its first lane) is known to be a multiple of.
        The element's size here: CPU buffers are numpy arrays, which promise no more (a view
        can start at any element). A target that knows more about its buffers overrides it."""
        return dt.itemsize(el)

    def _index(self, index: E.Expr, lanes: int) -> tuple[ir.Value, str, bool]:
        """(value, dtype, contiguous): for a unit-stride Ramp the value is just its base."""
        if lanes > 1 and isinstance(index, E.Ramp) and _is_one(index.stride):
            return self.expr(index.base), index.base.dtype, True
        v = self.expr(index)
        il = dt.lanes(index.dtype)
        if il != lanes:
            if il != 1:
                raise CodegenError(f"index {index} has {il} lanes but the access has {lanes}")
            v = splat(self.b, v, lanes)  # one address for every lane (e.g. broadcast store)
            return v, dt.with_lanes(index.dtype, lanes), False
        return v, index.dtype, False

    def _load_stride(self, index: E.Expr) -> int:
        """The stride of ``index`` when a load of it is to be `_strided_load`ed, else 0."""
        if (isinstance(index, E.Ramp) and isinstance(index.stride, E.IntImm)
                and 2 <= index.stride.value <= self.strided_load_max):
            return index.stride.value
        return 0

    def _strided_load(self, ptr: ir.Value, index: E.Expr, stride: int, memel: ir.Type,
                      lanes: int, align: int) -> ir.Value:
        """The ``lanes`` elements ``base + i * stride`` as ``stride`` contiguous ``lanes``-wide
        loads and shuffles. The loads cover ``[base, base + stride * (lanes - 1)]`` and no more
        (the last one is moved back to end at the last element read): every element between
        two elements of one buffer is in it, so nothing outside the accessed span is touched."""
        assert isinstance(index, E.Ramp)  # `_load_stride` said so
        b = self.b
        vty = ir.VectorType(memel, lanes)
        span = stride * (lanes - 1) + 1
        starts = [min(k * lanes, span - lanes) for k in range(stride)]
        base = self.expr(index.base)
        chunks = []
        for st in starts:
            off = base if st == 0 else b.add(base, ir.Constant(base.type, st))
            chunks.append(b.load(b.gep(ptr, [off], inbounds=True, source_etype=memel), typ=vty, align=align))
        # lane i reads element i * stride: from the first chunk that holds it; chunk k's lanes
        # sit at k * lanes.. in the inputs of the final shuffle
        pick = []
        for i in range(lanes):
            p = i * stride
            k = next(k for k, st in enumerate(starts) if st <= p < st + lanes)
            pick.append(k * lanes + p - starts[k])
        if stride == 2:
            return b.shuffle_vector(chunks[0], chunks[1], shuffle_mask(pick))
        while len(chunks) < 4:  # two pairs; a repeated chunk is never picked
            chunks.append(chunks[-1])
        lo, hi = concat_vectors(b, chunks[0], chunks[1]), concat_vectors(b, chunks[2], chunks[3])
        return b.shuffle_vector(lo, hi, shuffle_mask(pick))

    def _vector_gep(self, base: ir.Value, idx: ir.Value, memel: ir.Type) -> ir.Value:
        g = self.b.gep(base, [idx], inbounds=True, source_etype=memel)
        # llvmlite types a GEP by its base; with a vector index the result is a vector of ptrs.
        g.type = ir.VectorType(PTR, idx.type.count)
        return g

    def _masked_zero(self, op: str, vty: ir.Type, args: list[ir.Value], vmask: ir.Value) -> ir.Value:
        """A masked load or gather whose masked-off lanes are zero, by a select on its frozen
        result rather than by its pass-through operand. LLVM 22's x86 backend miscompiles a
        masked load whose mask has lanes known to be false but is not a constant (``splat(c)
        & <1 x 8, 0 x 8>``, as a padded tile's last vector gets): it loads those lanes from
        memory instead of taking the pass-through (reproduced in plain IR; found as a wrong
        depthwise convolution in a tuning run). The freeze keeps InstCombine from folding the
        select back into the pass-through."""
        raw = self._masked(op, vty, [*args, ir.Constant(vty, ir.Undefined)])
        frozen = Instruction(self.b.block, vty, "freeze", [raw])
        self.b._insert(frozen)  # llvmlite's builder has no freeze; this is its generic instruction
        return self.b.select(vmask, frozen, ir.Constant(vty, None))

    def _masked(self, op: str, vty: ir.Type, args: list[ir.Value]) -> ir.Value:
        # The i32 alignment operand is the pre-LLVM-22 form; LLVM auto-upgrades it to an
        # `align` parameter attribute, and older LLVMs take it as is.
        data_ty = vty if op in ("load", "gather") else args[0].type
        addr_ty = args[0].type if op in ("load", "gather") else args[1].type
        return call_intrinsic(self.b, f"masked.{op}", args, ret=vty, overloads=(data_ty, addr_ty))

    # addresses and prefetch -----------------------------------------------------------------
    def address_of(self, e: E.Call) -> ir.Value:
        """``address_of(buf[i])`` -> pointer to that element (no bounds check: not an access)."""
        if len(e.args) != 1 or not isinstance(e.args[0], E.BufferLoad):
            raise CodegenError(f"address_of expects one BufferLoad, got {e}")
        return self._element_ptr(e.args[0])

    def _element_ptr(self, load: E.BufferLoad) -> ir.Value:
        info = self.binding(load.buffer)
        idx = load.indices[0]
        if isinstance(idx, E.Ramp):
            idx = idx.base
        if dt.lanes(idx.dtype) != 1:
            raise CodegenError(f"cannot take the address of a gathered element: {load}")
        memel = llvm_type(dt.element(load.dtype), memory=True)
        # Not inbounds: prefetching past the end is allowed and must not become poison.
        return self.b.gep(info.ptr, [self.expr(idx)], source_etype=memel)

    def emit_prefetch(self, e: E.Call) -> ir.Value:
        """``prefetch(addr[, rw, locality])`` -> llvm.prefetch (read, keep in all cache levels)."""
        if not e.args:
            raise CodegenError("prefetch needs an address argument")
        a = e.args[0]
        if isinstance(a, E.Call) and a.name == "address_of":
            ptr = self.address_of(a)
        elif isinstance(a, E.BufferLoad):
            ptr = self._element_ptr(a)
        else:
            raise CodegenError(f"prefetch expects address_of(buffer[i]) or buffer[i], got {a}")
        opts = [0, 3]
        for i, x in enumerate(e.args[1:3]):
            if not isinstance(x, E.IntImm):
                raise CodegenError(f"prefetch option {i + 1} must be an int constant, got {x}")
            opts[i] = x.value
        fn = self.module.declare_intrinsic("llvm.prefetch", [PTR],
                                           ir.FunctionType(VOID, [PTR, I32, I32, I32]))
        self.b.call(fn, [ptr, ir.Constant(I32, opts[0]), ir.Constant(I32, opts[1]),
                         ir.Constant(I32, 1)])
        return ir.Constant(I32, 0)

    # debug bounds checks --------------------------------------------------------------------
    def emit_axis_oob(self, e: E.Call) -> ir.Value:
        """Report ``index`` outside ``[0, extent)`` on one axis (passes/bounds_check.py).

        The axis travels in the high half of the record's buffer id (``id | (axis+1) << 16``),
        so the record layout, which exported C headers describe, stays the same.
        """
        load, _name, axis, index, extent = e.args
        assert isinstance(load, E.BufferLoad) and isinstance(axis, E.IntImm)
        if not self.debug:
            return ir.Constant(I32, 0)
        info = self.binding(load.buffer)
        code = ir.Constant(I32, info.id | ((axis.value + 1) << 16))
        idx = to_i64(self.b, self.expr(index), index.dtype)
        ext = to_i64(self.b, self.expr(extent), extent.dtype)
        self.b.call(self._oob_reporter(), [code, idx, ext, self.st.err])
        return ir.Constant(I32, 0)

    def _bounds(self, info: BufBinding, el: str, idx: ir.Value, idx_dtype: str, lanes: int,
                contiguous: bool, vmask: ir.Value | None
                ) -> tuple[ir.Value, Callable[[], ir.Value]]:
        """(all active lanes in bounds, thunk computing the first offending flat index)."""
        b = self.b
        size = self._extent_in(info, el)
        if contiguous:
            first = to_i64(b, idx, idx_dtype)
            if vmask is None:  # a unit-stride ramp is in bounds iff its two ends are
                last = b.add(first, ir.Constant(I64, lanes - 1))
                ok_first = b.icmp_unsigned("<", first, size)
                ok = b.and_(ok_first, b.icmp_unsigned("<", last, size))
                return ok, lambda: self.b.select(ok_first, last, first)
            iv = b.add(splat(b, first, lanes), ir.Constant(ir.VectorType(I64, lanes), list(range(lanes))))
        elif lanes == 1:
            i = to_i64(b, idx, idx_dtype)
            return b.icmp_unsigned("<", i, size), lambda: i
        else:
            iv = to_i64(b, idx, idx_dtype)
        # Negative indices are huge as unsigned, so one unsigned compare checks both ends.
        bad = b.not_(b.icmp_unsigned("<", iv, splat(b, size, lanes)))
        if vmask is not None:
            bad = b.and_(bad, vmask)
        bits = b.bitcast(bad, ir.IntType(lanes))
        ok = b.icmp_unsigned("==", bits, ir.Constant(bits.type, 0))

        def offending() -> ir.Value:
            lane = call_intrinsic(self.b, "cttz", [bits, ir.Constant(I1, 0)])
            if lanes != 32:
                lane = self.b.zext(lane, I32) if lanes < 32 else self.b.trunc(lane, I32)
            return self.b.extract_element(iv, lane)

        return ok, offending

    def _extent_in(self, info: BufBinding, el: str) -> ir.Value:
        assert info.size is not None
        have, want = dt.itemsize(info.dtype), dt.itemsize(el)
        if have == want:
            return info.size
        # Accessed through a view of another element size: convert the extent.
        return self.b.udiv(self.b.mul(info.size, ir.Constant(I64, have)), ir.Constant(I64, want))

    def _report_oob(self, info: BufBinding, el: str, index: ir.Value) -> None:
        self.b.call(self._oob_reporter(), [ir.Constant(I32, info.id), index,
                                           self._extent_in(info, el), self.st.err])

    def _oob_reporter(self) -> ir.Function:
        """``void report(i32 id, i64 index, i64 extent, ptr err)``: first violation wins."""
        name = self.oob_record_name + "_report"
        fn = self.module.globals.get(name)
        if isinstance(fn, ir.Function):
            return fn
        rec = ir.GlobalVariable(self.module, _OOB_TYPE, self.oob_record_name)
        opaque(rec)
        rec.initializer = ir.Constant(_OOB_TYPE, None)
        fn = ir.Function(self.module, ir.FunctionType(VOID, [I32, I64, I64, PTR]), name)
        fn.linkage = "internal"
        fn.attributes.add("cold")
        fn.attributes.add("noinline")
        fid, idx, size, err = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        won = b.extract_value(b.cmpxchg(rec, ir.Constant(I32, 0), ir.Constant(I32, 1),
                                        "monotonic", "monotonic"), 1)
        with b.if_then(won):
            for k, v in ((1, fid), (2, idx), (3, size)):
                b.store(v, b.gep(rec, [ir.Constant(I32, 0), ir.Constant(I32, k)],
                                 source_etype=_OOB_TYPE))
        # ErrorCode.OUT_OF_BOUNDS; atomic because several threads may report at once.
        b.atomic_rmw("xchg", err, ir.Constant(I32, 1), "monotonic")
        b.ret_void()
        return fn


def _all_true(lanes: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I1, lanes), [1] * lanes)


def _is_one(e: E.Expr) -> bool:
    return isinstance(e, E.IntImm) and e.value == 1


__all__ = ["BufBinding", "MemoryMixin"]
