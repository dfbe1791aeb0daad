"""The NVPTX code generator's warp-level and asynchronous memory operations, as mixins of
`llvm_nvptx.CodegenNVPTX`: cp.async copies with their commit/wait groups (software
pipelining, passes/inject_software_pipeline.py) and the tensor-core calls (ldmatrix, mma.sync;
te/intrin_cuda.py). docs/gpu-ir.md describes the IR each one consumes.
"""

from __future__ import annotations

from llvmlite import ir

from ..arith.divisibility import pow2_divisor
from ..errors import CodegenError, TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from ..te.intrin_cuda import LDMATRIX as _LDMATRIX
from ..te.intrin_cuda import MIN_CC as _MMA_MIN_CC
from ..te.intrin_cuda import fragment_elements
from .gpu_shared import SHARED_ALIGN
from .llvm_base import CodegenLLVM, const_elements
from .llvm_common import I1, I32, VOID, declare, llvm_type, opaque

PARAM_ALIGN = 16  # bytes promised for every buffer argument (at most the buffer's own align)


def _param_align(buf: Buffer) -> int:
    """Bytes a buffer argument's address is promised to be a multiple of (docs/gpu-ir.md)."""
    return min(PARAM_ALIGN, max(buf.align, buf.itemsize))


class AsyncCopyMixin(CodegenLLVM):
    """cp.async: the copies of an ``ASYNC_COPY_SCOPE`` and the group calls."""

    _async_scope: int = 0

    def _attr(self, s: S.AttrStmt) -> None:
        """``ASYNC_COPY_SCOPE``: the copies in the body become cp.async (`emit_store`)."""
        if s.key != S.ASYNC_COPY_SCOPE:
            super()._attr(s)
            return
        self._async_scope = getattr(self, "_async_scope", 0) + 1
        try:
            self.stmt(s.body)
        finally:
            self._async_scope -= 1

    def emit_store(self, s: S.BufferStore) -> None:
        if getattr(self, "_async_scope", 0):
            from ..passes.inject_software_pipeline import cp_async_bytes

            nbytes = cp_async_bytes(s)
            if nbytes is not None:
                self._cp_async(s, nbytes)
                return
        super().emit_store(s)

    def _cp_async(self, s: S.BufferStore, nbytes: int) -> None:
        """One thread's ``cp.async.{cg|ca}.shared.global [dst], [src], nbytes``: 16-byte copies
        bypass L1 (.cg, the only form PTX has for 16 bytes and what CUTLASS uses); 4/8-byte
        ones go through it (.ca). A guarded copy (`cp_async_source`: a padded input, a ragged
        tile) is the zero-filling form ``cp.async [dst], [src], nbytes, src_size`` (LLVM's
        ``...{nbytes}.s`` intrinsics) with ``src_size = cond ? nbytes : 0``, or ``count *
        element size`` for a vector's live prefix: the bytes past src_size are written as zeros;
        with 0 nothing is read, and the source then points at element 0 of the buffer, so no
        address outside it is ever formed."""
        from ..passes.inject_software_pipeline import cp_async_source

        found = cp_async_source(s)
        assert found is not None
        src, cond = found
        b = self.b

        def ptr(buf: Buffer, idx: E.Expr, space: int, keep: ir.Value | None = None) -> ir.Value:
            self._check_cp_async_align(buf, idx, nbytes)
            base = idx.base if isinstance(idx, E.Ramp) else idx
            memel = llvm_type(dt.element(buf.dtype), memory=True)
            off = self.expr(base)
            if keep is not None:  # element 0 where nothing is read (aligned, in bounds)
                off = b.select(keep, off, ir.Constant(off.type, 0))
            p = b.gep(self.binding(buf).ptr, [off], inbounds=True, source_etype=memel)
            return b.addrspacecast(p, ir.PointerType(addrspace=space))

        kind = "cg" if nbytes == 16 else "ca"
        ptrs = [ir.PointerType(addrspace=3), ir.PointerType(addrspace=1)]
        dst = ptr(s.buffer, s.indices[0], 3)
        if cond is None:
            gsrc = ptr(src.buffer, src.indices[0], 1)
            b.call(declare(self.module, f"llvm.nvvm.cp.async.{kind}.shared.global.{nbytes}",
                           ir.FunctionType(VOID, ptrs)), [dst, gsrc])
            return
        g = self.expr(cond)
        if dt.is_bool(cond.dtype):  # all lanes or none
            c = g if g.type == I1 else b.icmp_unsigned("!=", g, ir.Constant(g.type, 0))
            size = b.select(c, ir.Constant(I32, nbytes), ir.Constant(I32, 0))
        else:  # a count of leading lanes (in [0, lanes]): that many elements are read
            count = g if g.type == I32 else b.trunc(g, I32) if g.type.width > 32 else b.sext(g, I32)
            size = b.mul(count, ir.Constant(I32, nbytes // dt.lanes(src.dtype)))
            c = b.icmp_unsigned("!=", size, ir.Constant(I32, 0))
        gsrc = ptr(src.buffer, src.indices[0], 1, keep=c)
        b.call(declare(self.module, f"llvm.nvvm.cp.async.{kind}.shared.global.{nbytes}.s",
                       ir.FunctionType(VOID, [*ptrs, I32])), [dst, gsrc, size])

    def _check_cp_async_align(self, buf: Buffer, idx: E.Expr, nbytes: int) -> None:
        """cp.async needs both addresses ``nbytes``-aligned. Proven (`access_align`): fine.
        Provably not (the index's variable part keeps the alignment, its constant breaks it):
        a CodegenError here. Otherwise the emulator checks each copy at run time."""
        el = dt.element(buf.dtype)
        if self.access_align(buf, idx, el) >= nbytes:
            return
        from ..arith.simplify import simplify

        size = dt.itemsize(el)
        first = simplify(idx.base if isinstance(idx, E.Ramp) else idx)
        c: int = 0
        rest: E.Expr | None = first
        if isinstance(first, E.IntImm):
            c, rest = first.value, None
        elif isinstance(first, E.Add) and isinstance(first.b, E.IntImm):
            c, rest = first.b.value, first.a
        base = SHARED_ALIGN if buf.scope in ("shared", "local") else _param_align(buf)
        var_ok = rest is None or pow2_divisor(rest, cap=nbytes) * size >= nbytes
        if base >= nbytes and var_ok and (c * size) % nbytes:
            raise CodegenError(
                f"cp.async of {nbytes} bytes from/to '{buf.name}' at element {first} is not "
                f"{nbytes}-byte aligned (element offset {c} mod {nbytes // size}); make the tile "
                "row length a multiple of the vector width or load narrower vectors")

    def _cp_async_group(self, e: E.Call) -> ir.Value:
        """``cp.async.commit_group`` / ``cp.async.wait_group n`` (n a constant)."""
        if e.name == S.CP_ASYNC_COMMIT:
            fn = declare(self.module, "llvm.nvvm.cp.async.commit.group", ir.FunctionType(VOID, []))
            self.b.call(fn, [])
            return ir.Constant(I32, 0)
        (n,) = e.args
        if not isinstance(n, E.IntImm) or n.value < 0:
            raise CodegenError(f"cp.async.wait_group takes a constant count >= 0: {e}")
        fn = declare(self.module, "llvm.nvvm.cp.async.wait.group", ir.FunctionType(VOID, [I32]))
        self.b.call(fn, [ir.Constant(I32, n.value)])
        return ir.Constant(I32, 0)


class TensorCoreMixin(CodegenLLVM):
    """Tensor-core fragments, ldmatrix and mma.sync (warp-collective)."""

    _guards: list[str]

    def _allocate_fragment(self, s: S.Allocate) -> None:
        """A tensor-core fragment: an alloca of the lane's ``size / 32`` elements (SROA keeps it
        in registers when every access has a constant offset: unroll the tile loops)."""
        buf = s.buffer
        n = const_elements(buf)
        if n is None:
            raise CodegenError(f"fragment '{buf.name}' must have a constant shape, got "
                               f"({', '.join(map(str, buf.shape))})")
        try:
            per_lane = fragment_elements(buf.scope, n, buf.name)
        except TecompError as err:
            raise CodegenError(str(err)) from None
        memty = llvm_type(dt.element(buf.dtype), memory=True)
        ptr = opaque(self.st.entry.alloca(ir.ArrayType(memty, per_lane), name=buf.name))
        ptr.align = SHARED_ALIGN
        self.bind_buffer(buf, ptr, None)
        self.stmt(s.body)
        del self.st.bufs[buf.data]

    def _tensor_core_call(self, e: E.Call) -> ir.Value:
        """`LDMATRIX` / `MMA` (warp-collective: every lane of the warp executes it)."""
        gpu = self.target.gpu
        if gpu.compute_capability < _MMA_MIN_CC:
            raise CodegenError(
                f"{e.name}: tensor-core mma.m16n8k16 with float32 accumulation needs sm_80 or newer; "
                f"the target is {self.target} ({gpu.arch}). Use the SIMT schedule on this arch")
        if self._guards:
            raise CodegenError(
                f"{e.name} inside the guard {self._guards[-1]}: it is warp-collective, and threads "
                "outside the loop's extent would not take part (launch 32 threadIdx.x)")
        if e.name == _LDMATRIX:
            self._ldmatrix(e)
        else:
            self._mma(e)
        return ir.Constant(I32, 0)

    def _tc_ptr(self, a: E.Expr, what: str) -> tuple[ir.Value, Buffer]:
        if not (isinstance(a, E.Call) and a.name == "address_of" and len(a.args) == 1
                and isinstance(a.args[0], E.BufferLoad)):
            raise CodegenError(f"{what}: operand must be address_of(buffer[index]), got {a}")
        return self.address_of(a), a.args[0].buffer

    def _ldmatrix(self, e: E.Call) -> None:
        """``ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16``: ``num`` 32-bit registers
        stored to the fragment, in order."""
        trans, num, dst, src = e.args
        if not (isinstance(trans, E.IntImm) and isinstance(num, E.IntImm) and num.value in (1, 2, 4)):
            raise CodegenError(f"ldmatrix: trans and num (1, 2, 4) must be constants: {e}")
        b = self.b
        sptr, sbuf = self._tc_ptr(src, "ldmatrix")
        if sbuf.scope != "shared" or dt.bits(sbuf.dtype) != 16:
            raise CodegenError(f"ldmatrix reads 16-bit shared memory, not {sbuf.scope} {sbuf.dtype}")
        dptr, _ = self._tc_ptr(dst, "ldmatrix")
        n = num.value
        shared_ptr = ir.PointerType(addrspace=3)
        ret: ir.Type = I32 if n == 1 else ir.LiteralStructType([I32] * n)
        name = f"llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{n}{'.trans' if trans.value else ''}.b16"
        fn = declare(self.module, name, ir.FunctionType(ret, [shared_ptr]))
        res = b.call(fn, [b.addrspacecast(sptr, shared_ptr)])
        for j in range(n):
            v = res if n == 1 else b.extract_value(res, j)
            b.store(v, b.gep(dptr, [ir.Constant(I32, j)], source_etype=I32), align=4)

    def _mma(self, e: E.Call) -> None:
        """``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32``: d = a * b + c,
        d stored over c."""
        shape, dtype, a, bb, c = e.args
        if not (isinstance(shape, E.StringImm) and shape.value == "m16n8k16"
                and isinstance(dtype, E.StringImm) and dtype.value in ("float16", "bfloat16")):
            raise CodegenError(f"mma: only m16n8k16 with float16/bfloat16 inputs: {e}")
        b = self.b
        pa, pb, pc = (self._tc_ptr(x, "mma")[0] for x in (a, bb, c))
        f32 = llvm_type("float32")
        if dtype.value == "float16":
            reg: ir.Type = ir.VectorType(ir.HalfType(), 2)
            name = "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"
        else:
            reg, name = I32, "llvm.nvvm.mma.m16n8k16.row.col.bf16"

        def regs(p: ir.Value, ty: ir.Type, count: int) -> list[ir.Value]:
            return [b.load(b.gep(p, [ir.Constant(I32, j)], source_etype=ty), typ=ty, align=4)
                    for j in range(count)]

        args = regs(pa, reg, 4) + regs(pb, reg, 2) + regs(pc, f32, 4)
        ret = ir.LiteralStructType([f32] * 4)
        fn = declare(self.module, name, ir.FunctionType(ret, [reg] * 6 + [f32] * 4))
        d = b.call(fn, args)
        for j in range(4):
            b.store(b.extract_value(d, j), b.gep(pc, [ir.Constant(I32, j)], source_etype=f32), align=4)
