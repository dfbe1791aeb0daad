"""Schedule -> loop nest: one nest per stage, attached stages placed inside their consumers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..arith.simplify import simplify
from ..codegen.target import Target
from ..errors import LoweringError, ScheduleError, TecompError
from ..ir import dtype as dt
from ..ir.buffer import Buffer
from ..ir.expr import (
    And,
    BufferLoad,
    Call,
    Expr,
    IntImm,
    ProducerLoad,
    Reduce,
    Var,
    const,
)
from ..ir.functor import ExprMutator, StmtMutator, StmtVisitor, free_vars, substitute
from ..ir.stmt import (
    ASYNC_PIPELINE_SCOPE,
    DOUBLE_BUFFER_SCOPE,
    THREAD_TAG,
    Allocate,
    AttrStmt,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Stmt,
    seq,
)
from ..te.extern import ExternOp, bind_extern_body
from ..te.scan import ScanOp, scan_body
from ..te.schedule import Schedule, Stage
from ..te.tensor import ComputeOp, IterVar, IterVarKind, PlaceholderOp, Tensor
from .bound import StageBounds, infer_bounds
from .inline import effective_bodies


class _ToBuffers(ExprMutator):
    """ProducerLoad(T, idx) -> BufferLoad(buffer of T, idx - realized min of T)."""

    def __init__(self, lowering: Lowering) -> None:
        self.lw = lowering

    def visit_ProducerLoad(self, e: ProducerLoad) -> Expr:
        idx = [self.visit(i) for i in e.indices]
        buf, mins = self.lw.buffer_of(e.producer)
        flat = tuple(simplify(i - m) if not (isinstance(m, IntImm) and m.value == 0) else i
                     for i, m in zip(idx, mins))
        return BufferLoad(buf, flat)

    def visit_Reduce(self, e: Reduce) -> Expr:
        raise LoweringError("a reduction may only appear as the whole body of a compute")


class Lowering:
    def __init__(self, sch: Schedule, args: Sequence[Any], name: str, target: Target | None = None,
                 binds: Mapping[Tensor, Buffer] | None = None) -> None:
        self.sch = sch
        self.name = name
        self.target = target
        self.gpu = target is not None and target.is_gpu
        self.args = list(args)
        self.binds: dict[Tensor, Buffer] = _check_binds(binds, name)
        self.buffers: dict[tuple[Stage, int], Buffer] = {}
        self.params: list[Buffer] = []
        self.outputs: list[int] = []
        self.bodies = effective_bodies(sch)
        self.stages = [
            st for st in sch.stages
            if isinstance(st.op, ComputeOp) and st.attach_type != "inline"
        ]
        # extern and scan stages (te/extern.py, te/scan.py); buffers indexed by absolute
        # position (scan states: init, update and state placeholder share the scan's buffer)
        self.special = [st for st in sch.stages if isinstance(st.op, (ExternOp, ScanOp))]
        self.absolute: set[Buffer] = set()
        self.local_allocs: dict[Stage, list[Buffer]] = {}
        self.scan_of: dict[Stage, Stage] = {}  # scan body stage -> its scan's stage
        self._bind_args()
        self.scopes = storage_scopes(self.stages, self.gpu)
        self.bounds: dict[Stage, StageBounds] = infer_bounds(
            sch, self.bodies, self.stages, self.scopes if self.gpu else None,
            self._scan_rows())
        self._make_local_buffers()
        self.mutator = _ToBuffers(self)

    # buffers --------------------------------------------------------------------------------
    def _bind_args(self) -> None:
        seen: set[int] = set()
        # scalar kernel parameters (TVM: a te.var in the argument list), with their position
        # in the argument list; the C signature puts them after the buffers and dims
        self.scalars: list[tuple[int, Var]] = []
        for k, a in enumerate(self.args):
            if isinstance(a, Var):
                self._bind_scalar(k, a)
                continue
            if not isinstance(a, Tensor):
                raise LoweringError(
                    f"argument {k} of {self.name} must be a te.Tensor, got {type(a).__name__} "
                    "(or a te.var, for a scalar parameter)"
                )
            st = self.sch._by_op.get(a.op)
            if st is None:
                raise LoweringError(f"argument {k} ({a.name}) is not part of this schedule")
            key = (st, a.value_index)
            if id(key[0]) * 64 + key[1] in seen:
                raise LoweringError(f"argument {k} ({a.name}) is listed twice")
            seen.add(id(key[0]) * 64 + key[1])
            if st.attach_type == "inline":
                raise LoweringError(f"argument {a.name} is computed inline and has no buffer")
            if st.attach_type == "scope":
                raise LoweringError(
                    f"argument {a.name} is computed at {st.attach_stage.name}; arguments must "  # type: ignore[union-attr]
                    "be computed at root"
                )
            buf = self._arg_buffer(a)
            self.buffers[key] = buf
            self.params.append(buf)
            if not isinstance(st.op, PlaceholderOp):
                self.outputs.append(len(self.params) - 1)
        self._bind_special()
        for st in self.sch.stages:
            if st.is_output and (st, 0) not in self.buffers:
                raise LoweringError(f"output {st.origin_op.name} is missing from the arguments")
            if isinstance(st.op, PlaceholderOp) and (st, 0) not in self.buffers:
                if any(self._reads_tensor(s2, st) for s2 in self.stages):
                    raise LoweringError(
                        f"placeholder {st.op.name} is read but not passed in the argument list"
                    )
        self.dim_vars: list[Var] = []
        # the shapes' dims first, then the vars of strided arguments' strides (binds): both
        # travel as int64 arguments after the buffers, bound from the arrays' shapes/strides
        for exts in [b.shape for b in self.params] + [b.strides for b in self.params]:
            for d in exts:
                for v in sorted(free_vars(d), key=lambda x: x.name):
                    if all(v is not x for x in self.dim_vars):  # identity: == builds IR
                        self.dim_vars.append(v)

    def _bind_scalar(self, k: int, v: Var) -> None:
        d = v.dtype
        if not (dt.is_int(d) or dt.is_float(d)) or dt.lanes(d) != 1 or dt.is_bool(d):
            raise LoweringError(
                f"argument {k} ({v.name}) of {self.name}: a scalar parameter must be an int or "
                f"float te.var, got dtype {d}")
        if d in ("float16", "bfloat16"):
            # no portable C ABI for a 16-bit float argument; the value is converted anyway
            raise LoweringError(
                f"argument {k} ({v.name}) of {self.name}: {d} scalar parameters are not "
                "supported; declare the var as float32 and cast it in the computation")
        if any(v is x for _, x in self.scalars):
            raise LoweringError(f"argument {k} ({v.name}) of {self.name} is listed twice")
        self.scalars.append((k, v))

    def _arg_buffer(self, t: Tensor) -> Buffer:
        """The parameter buffer of argument ``t``: the user's ``binds`` entry if any, else a
        compact one. A bound buffer keeps its strides (`te.extern.arg_layout`: symbolic ones
        become dims bound from the array's strides at call time); its elem_offset is 0, as
        the array is passed by its own data pointer. cuda kernels take compact arrays only."""
        bound = self.binds.get(t)
        if bound is None:
            return Buffer(t.name.replace(".", "_"), tuple(t.shape), t.dtype)
        return _arg_buffer_from_bind(t, bound, self.name, self.gpu)

    def _bind_special(self) -> None:
        """Buffers of extern and scan stages: the argument's, else a local one of the full
        shape; a scan's init/update/state tensors share its buffer (TVM's ScanOp)."""
        externs = [st.name for st in self.special if isinstance(st.op, ExternOp)]
        if externs and self.gpu:
            # a scan lowers to loops like any stage; an extern is a call into a host library
            raise LoweringError(
                f"{self.name}: te.extern stage(s) {', '.join(externs)} cannot be built for a cuda "
                "target: an extern stage calls a C function of a library loaded into this "
                "process, which a GPU kernel cannot call; build it for an llvm target, or write "
                "the computation as te.compute stages")
        for st in self.special:
            op = st.op
            for k in range(op.num_outputs):
                buf = self.buffers.get((st, k))
                if buf is None:
                    t = op.output(k)
                    # on a GPU the init and update kernels share it: global, as intermediates are
                    buf = Buffer(t.name.replace(".", "_"), tuple(t.shape), t.dtype,
                                 scope="global" if self.gpu else "local")
                    self.buffers[(st, k)] = buf
                    self.local_allocs.setdefault(st, []).append(buf)
                self.absolute.add(buf)
                if isinstance(op, ScanOp):
                    for t in (op.init[k], op.update[k], op.state_placeholder[k]):
                        ts = self.sch._by_op.get(t.op)
                        if ts is None:
                            raise LoweringError(f"scan {op.name}: {t.name} is not in the schedule")
                        if (ts, t.value_index) in self.buffers and t is not op.state_placeholder[k]:
                            raise LoweringError(
                                f"scan {op.name}: {t.name} is an argument or shared by two scans; "
                                "pass the scan's output instead")
                        self.buffers[(ts, t.value_index)] = buf
            if isinstance(op, ScanOp):
                for body_st in scan_body(op, self.sch._by_op):
                    if body_st.attach_type == "root":
                        self.scan_of[body_st] = st
            if isinstance(op, ExternOp):
                for t in op.inputs:
                    ts = self.sch._by_op.get(t.op)
                    if ts is not None and isinstance(ts.op, PlaceholderOp) and (ts, 0) not in self.buffers:
                        raise LoweringError(
                            f"placeholder {t.name} is read by extern {op.name} but not passed in "
                            "the argument list")

    def _scan_rows(self) -> dict[Stage, dict[int, tuple[Expr, Expr]]]:
        """Bound overrides of the root stages of scan bodies: one time step (row ``t`` of
        the scan's time axis) per iteration of the scan's loop."""
        out: dict[Stage, dict[int, tuple[Expr, Expr]]] = {}
        for body_st, scan_st in self.scan_of.items():
            op = scan_st.op
            assert isinstance(op, ScanOp)
            out[body_st] = {0: (op.scan_axis.var, const(1))}
        return out

    def _reads_tensor(self, reader: Stage, st: Stage) -> bool:
        from .bound import _Loads

        v = _Loads(st)
        for e in self.bodies.get(reader, []):
            v.visit(e)
        return bool(v.found)

    def _make_local_buffers(self) -> None:
        for st in self.stages:
            op = st.op
            assert isinstance(op, ComputeOp)
            b = self.bounds[st]
            for k in range(op.num_outputs):
                if (st, k) in self.buffers:
                    continue
                shape = tuple(b.buf_ext)
                strides: tuple[Expr, ...] = ()
                if st.storage_align_:
                    strides = _aligned_strides(shape, st.storage_align_, st)
                buf = Buffer(op.output(k).name.replace(".", "_"), shape, op.output(k).dtype,
                             strides=strides, scope=self.scopes[st] if self.gpu else "local")
                self.buffers[(st, k)] = buf
                self.local_allocs.setdefault(st, []).append(buf)

    def buffer_of(self, t: Tensor) -> tuple[Buffer, list[Expr]]:
        st = self.sch._by_op.get(t.op)
        if st is None:
            raise LoweringError(f"tensor {t.name} is not part of this schedule")
        buf = self.buffers.get((st, t.value_index))
        if buf is None:
            raise LoweringError(f"tensor {t.name} has no buffer (is it an argument?)")
        if buf.scope == "global" or buf in self.absolute:
            return buf, [const(0)] * len(t.shape)
        return buf, self.bounds[st].buf_min

    # statements -----------------------------------------------------------------------------
    def lower(self) -> PrimFunc:
        roots = [st for st in self.sch.stages
                 if (st in self.special or st in self.bounds) and st.attach_type == "root"
                 and st not in self.scan_of]
        for st in self.stages:
            if st.double_buffer_:
                self._check_double_buffer(st)
            if getattr(st, "pipeline_depth_", 0):
                self._check_pipeline(st)
            if self.gpu:
                continue
            for iv, a in st.iter_var_attrs.items():
                if a.bind_thread is not None:
                    raise LoweringError(
                        f"stage {st.name}: axis '{iv.name}' is bound to {a.bind_thread.thread_tag}; "
                        "thread binding needs a GPU target (target=\"cuda\")"
                    )
            if st.scope == "shared":
                raise LoweringError(
                    f"stage {st.name}: storage scope 'shared' (GPU shared memory) needs a GPU "
                    "target (target=\"cuda\"); on a CPU use 'local' or 'global'")
        if self.gpu and len(roots) > 1:
            return self._kernels(roots)
        body = seq(*[self.stage_nest(st) for st in roots])
        for st in reversed(roots):
            for buf in self.local_allocs.get(st, []):
                body = Allocate(buf, body)
        body = self._finish(body)
        fn = PrimFunc(self.name, self.params, body, self.dim_vars)
        fn.attrs["outputs"] = self.outputs
        if self.scalars:
            fn.attrs["scalar_params"] = list(self.scalars)
        if self.gpu:
            from .gpu_check import check_gpu_kernel

            assert self.target is not None
            fn.attrs["target"] = self.target
            fn.attrs["launch"] = check_gpu_kernel(fn, self.target, {st.name for st in roots})
        return fn

    def _check_double_buffer(self, st: Stage) -> None:
        """double_buffer() (TVM's InjectDoubleBuffer) loads the tile of the next iteration of the
        loop a shared stage is computed at while the threads compute on the current one; the
        pass needs a shared stage at a serial loop, so anything else is refused here, by name."""
        if not self.gpu:
            raise LoweringError(
                f"stage {st.name}: double_buffer hides global-memory latency of shared-memory "
                "stages on GPUs; CPU builds have no such stage (use prefetch instead)"
            )
        scope = self.scopes[st]
        if scope != "shared":
            raise LoweringError(
                f"stage {st.name}: double_buffer applies to shared-memory stages (e.g. "
                f"s.cache_read(A, \"shared\", [C])); {st.name} has scope '{scope}'")
        iv = st.attach_ivar
        if st.attach_type != "scope" or iv is None or st.attach_stage is None:
            raise LoweringError(
                f"stage {st.name}: double_buffer loads the next tile while the current one is "
                "used, so the stage must be computed at a serial loop of its consumer (compute_at "
                "the outer reduction loop), not at root")
        a = st.attach_stage.iter_var_attrs.get(iv)
        if a is not None and a.bind_thread is not None:
            raise LoweringError(
                f"stage {st.name}: double_buffer needs the stage computed at a serial loop; "
                f"'{iv.name}' is bound to {a.bind_thread.thread_tag}")

    def _check_pipeline(self, st: Stage) -> None:
        """pipeline(depth) needs what double_buffer needs (a shared stage at a serial loop of
        its consumer) and cp.async, i.e. sm_80 or newer: older archs are refused (use
        double_buffer there) rather than silently given synchronous loads."""
        if st.double_buffer_:
            raise LoweringError(f"stage {st.name}: pipeline() and double_buffer() both rewrite the "
                                "loop the stage is computed at; use one of them")
        try:
            self._check_double_buffer(st)
        except LoweringError as err:
            raise LoweringError(str(err).replace("double_buffer", "pipeline")) from None
        assert self.target is not None and self.target.gpu is not None
        if self.target.gpu.compute_capability < (8, 0):
            raise LoweringError(
                f"stage {st.name}: pipeline() loads with cp.async, which needs sm_80 or newer; "
                f"the target is {self.target.gpu.arch} (use double_buffer() there)")

    def _finish(self, body: Stmt) -> Stmt:
        body = _PlainVars().visit_stmt(body)
        unbound = _Unbound(self.dim_vars + [v for _, v in self.scalars])
        unbound.visit_stmt(body)
        if unbound.found:
            names = ", ".join(sorted(v.name for v in unbound.found))
            raise LoweringError(
                f"{self.name}: the computation uses variable(s) {names} that are not a dimension "
                "of any argument nor in the argument list; pass each as a scalar parameter "
                "(tc.build(s, [A, n, B]))"
            )
        return body

    def _kernels(self, roots: list[Stage]) -> PrimFunc:
        """One kernel per root stage, launched in order (as TVM does): a tensor computed at
        root that is not an argument lives in global memory between the kernels, allocated by
        the runtime for each call (``attrs["intermediates"]``). The returned function is the
        host side: the arguments, and ``attrs["kernels"]``, each a complete GPU kernel whose
        parameters are the buffers it touches."""
        from ..ir.expr import StringImm
        from ..ir.stmt import Evaluate
        from .gpu_check import check_gpu_kernel

        assert self.target is not None
        inter = [b for st in roots for b in self.local_allocs.get(st, [])]
        kernels: list[PrimFunc] = []
        for k, st in enumerate(roots):
            body = self._finish(self.stage_nest(st))
            data = _Data()
            data.visit_stmt(body)
            used = data.used
            params = [b for b in self.params + inter if b.data in used]
            shape_vars: set[Var] = set()
            for b in params:
                for d in b.shape:
                    shape_vars |= free_vars(d)
            dims = [v for v in self.dim_vars if v in shape_vars]
            body_vars = free_vars(body)
            # scalar parameters the kernel reads and gets no other way (not a dim of its own
            # buffers) are its own by-value parameters, after its buffers
            scalars = [v for _, v in self.scalars if v in body_vars and v not in shape_vars]
            missing = sorted(v.name for v in body_vars
                             if v in set(self.dim_vars) - shape_vars and v not in set(scalars))
            if missing:
                raise LoweringError(
                    f"{self.name}: the kernel of stage {st.name} uses the size(s) {', '.join(missing)} "
                    "but touches no buffer with that size in its shape")
            kf = PrimFunc(f"{self.name}_kernel{k}", params, body, dims)
            kf.attrs["target"] = self.target
            kf.attrs["outputs"] = [i for i, b in enumerate(params) if b in self._written(st)]
            if scalars:
                kf.attrs["scalar_params"] = [(len(params) + j, v) for j, v in enumerate(scalars)]
            kf.attrs["launch"] = check_gpu_kernel(kf, self.target, {st.name})
            kernels.append(kf)
        host_body = seq(*[Evaluate(Call("int32", "launch_kernel", (StringImm(kf.name),)))
                          for kf in kernels])
        fn = PrimFunc(self.name, self.params, host_body, self.dim_vars)
        fn.attrs["outputs"] = self.outputs
        fn.attrs["target"] = self.target
        fn.attrs["kernels"] = kernels
        fn.attrs["intermediates"] = inter
        if self.scalars:
            fn.attrs["scalar_params"] = list(self.scalars)
        return fn

    def _written(self, st: Stage) -> list[Buffer]:
        """The global buffers the nest of root stage ``st`` stores to."""
        return [b for k in range(st.op.num_outputs)  # type: ignore[attr-defined]
                if (b := self.buffers[(st, k)]).scope == "global" or b in self.params]

    def _attached(self, st: Stage, iv: IterVar) -> list[Stage]:
        return [c for c in self.stages if c.attach_stage is st and c.attach_ivar is iv]

    def _extern_nest(self, st: Stage) -> Stmt:
        op = st.op
        assert isinstance(op, ExternOp)
        ins = [self.buffer_of(t)[0] for t in op.inputs]
        outs = [self.buffers[(st, k)] for k in range(op.num_outputs)]
        try:
            return bind_extern_body(op, ins, outs)
        except TecompError as e:
            raise LoweringError(str(e)) from None

    def _scan_nest(self, st: Stage) -> Stmt:
        """The serial time loop of a scan: its body stages, each computing row ``t``."""
        op = st.op
        assert isinstance(op, ScanOp)
        body_stages = [b for b in self.sch.stages if self.scan_of.get(b) is st]
        nests = [self.stage_nest(b) for b in body_stages]
        annotations: tuple[tuple[str, Any], ...] = ()
        if self.gpu:
            # the time loop runs in every thread around the thread loops (gpu_scan.py); when
            # threads of one block read each other's rows, a barrier ends each stage's step
            from .gpu_check import SCAN_TIME_LOOP
            from .gpu_scan import scan_step_needs_barrier

            inner = [b for b in scan_body(op, self.sch._by_op) if b in self.bounds]
            if scan_step_needs_barrier(st, body_stages, inner, self.bodies, self.bounds):
                from ..ir.stmt import barrier

                nests = [x for n in nests for x in (n, barrier())]
            annotations = ((SCAN_TIME_LOOP, op.name),)
        body = seq(*nests)
        for b in reversed(body_stages):
            for buf in self.local_allocs.get(b, []):
                body = Allocate(buf, body)
        ax = op.scan_axis
        assert ax.dom is not None
        return For(ax.var, ax.dom.min, ax.dom.extent, ForKind.SERIAL, body, annotations)

    def stage_nest(self, st: Stage) -> Stmt:
        if isinstance(st.op, ExternOp):
            return self._extern_nest(st)
        if isinstance(st.op, ScanOp):
            return self._scan_nest(st)
        op = st.op
        assert isinstance(op, ComputeOp)
        if self.gpu:
            from .cross_thread import cross_thread_nest, thread_reduce_leaves

            if thread_reduce_leaves(st):
                return cross_thread_nest(self, st)
        b = self.bounds[st]
        leaves = st.leaf_iter_vars
        vmap = {iv.var: b.root_value(iv) for iv in op.axis + op.reduce_axis}
        if all(self.buffers[(st, k)] in self.absolute for k in range(op.num_outputs)):
            out_idx = [b.root_value(iv) for iv in op.axis]  # a scan's buffer: absolute rows
        else:
            out_idx = [simplify(b.value[iv]) for iv in op.axis]
        bodies = [self.mutator.visit(substitute(x, vmap)) if not isinstance(x, Reduce) else x
                  for x in self.bodies[st]]
        first_red = next((k for k, iv in enumerate(leaves) if iv.kind == IterVarKind.REDUCE),
                         len(leaves))
        is_reduce = isinstance(self.bodies[st][0], Reduce)
        conds = [simplify(c) for c in b.conds]
        # the init skips loops over reduction axes only (TVM's skip_iter): a leaf fusing a
        # spatial with a reduction axis is looped over, and its bound conditions guard it
        red_vars = {iv.var for iv in leaves if st.reduce_only(iv)}
        spatial_conds = [c for c in conds if not (free_vars(c) & red_vars)]
        pred = self.store_predicate(st)
        if pred is not None:  # TVM: the predicate guards every store of the stage
            conds.append(pred)
            spatial_conds.append(pred)
        init_stmt: Stmt | None = None
        init_end = len(leaves)  # the init nest spans leaves[first_red:init_end]
        if is_reduce:
            update, init = self._reduce_stmts(st, vmap, out_idx)
            init_stmt = _guard(spatial_conds, init)
        tpos = next((k for k, iv in enumerate(leaves)
                     if iv in st.iter_var_attrs and st.iter_var_attrs[iv].tensor_intrin is not None), None)
        if tpos is not None:
            from .tensorize import tensorize_parts

            for iv in leaves[tpos:]:
                if self._attached(st, iv):
                    raise ScheduleError(f"stage {st.name}: a stage is computed inside the "
                                        f"tensorized loop '{iv.name}'")
            inner, reset = tensorize_parts(self, st, tpos, st.iter_var_attrs[leaves[tpos]].tensor_intrin)
            # tensorize_parts proved the conditions over the tensorized loops; those over the
            # outer loops alone (a tail of an outer split) still decide whether a tile exists
            tiled = {iv.var for iv in leaves[tpos:]}
            outer_conds = [c for c in conds if not free_vars(c) & tiled]
            inner = _guard(outer_conds, inner)
            nloops = tpos
            first_red = min(first_red, tpos)
            if reset is not None and init_stmt is not None:
                # the intrinsic initialises its own tile (a tensor-core accumulator fragment
                # cannot be written element by element): loops outside the tensorized axis only
                init_stmt, init_end = _guard([c for c in outer_conds if not free_vars(c) & red_vars],
                                             reset), tpos
        else:
            if is_reduce:
                inner = _guard(conds, update)
            else:
                stores = [BufferStore(self.buffers[(st, k)], v, tuple(out_idx))
                          for k, v in enumerate(bodies)]
                inner = _guard(conds, seq(*stores))
            nloops = len(leaves)
        for k in range(nloops - 1, -1, -1):
            if k + 1 == first_red and init_stmt is not None:
                inner = seq(self._init_nest(st, leaves[first_red:init_end], init_stmt), inner)
            inner = self._loop(st, leaves[k], inner)
        if first_red == 0 and init_stmt is not None:
            inner = seq(self._init_nest(st, leaves[:init_end], init_stmt), inner)
        return inner

    def _init_nest(self, st: Stage, leaves: list[IterVar], init: Stmt) -> Stmt:
        b = self.bounds[st]
        body = init
        for iv in reversed(leaves):
            if st.reduce_only(iv):
                continue
            attr = st.iter_var_attrs.get(iv)
            kind = attr.kind if attr is not None else None
            body = self._for(st, iv, b.ext[iv], kind or ForKind.SERIAL, body, ())
        return body

    def _for(self, st: Stage, iv: IterVar, ext: Expr, kind: ForKind, body: Stmt,
             ann: tuple[tuple[str, Any], ...]) -> Stmt:
        attr = st.iter_var_attrs.get(iv)
        thread = attr.bind_thread if attr is not None else None
        if thread is None or not self.gpu:
            return For(iv.var, const(0), ext, kind, body, ann)
        tag = thread.thread_tag
        if tag == "vthread":
            # virtual threads: an unrolled loop marked as such; the GPU pipeline's
            # inject_virtual_thread pushes it inward so that what does not depend on it (a
            # shared tile's load) runs once
            return For(iv.var, const(0), ext, ForKind.UNROLLED, body, ((THREAD_TAG, "vthread"), *ann))
        if iv.kind == IterVarKind.REDUCE and not tag.startswith("threadIdx"):
            # threadIdx-bound reduce axes are cross-thread reductions (cross_thread.py); blocks
            # cannot synchronise with each other inside a kernel
            raise ScheduleError(
                f"stage {st.name}: reduction axis '{iv.name}' is bound to {tag}; blocks cannot "
                "combine their partial results within one kernel: bind it to threadIdx.* (a "
                "cross-thread reduction), or rfactor it into a stage of its own")
        if tag not in THREAD_TAGS:
            raise ScheduleError(f"stage {st.name}: axis '{iv.name}' is bound to unknown thread tag "
                                f"{tag!r}; use one of {', '.join(THREAD_TAGS)} or 'vthread'")
        if thread.dom is not None:
            want = simplify(thread.dom.extent)
            got = simplify(ext)
            if isinstance(want, IntImm) and isinstance(got, IntImm) and want.value != got.value:
                raise ScheduleError(f"stage {st.name}: axis '{iv.name}' has extent {got.value} but is "
                                    f"bound to {tag} declared with extent {want.value}")
        return For(iv.var, const(0), ext, ForKind.THREAD_BINDING, body, ((THREAD_TAG, tag), *ann))

    def _loop(self, st: Stage, iv: IterVar, inner: Stmt) -> Stmt:
        b = self.bounds[st]
        attr = st.iter_var_attrs.get(iv)
        pre: list[Stmt] = []
        children = self._attached(st, iv)
        if attr is not None and attr.prefetch:
            pre.extend(self._prefetch(st, iv, attr.prefetch))
        body = seq(*pre, *[self._marked_nest(c) for c in children], inner)
        for c in reversed(children):
            for buf in self.local_allocs.get(c, []):
                body = Allocate(buf, body)
        kind = attr.kind if attr is not None and attr.kind is not None else ForKind.SERIAL
        ann = tuple((k, v) for k, v in attr.pragmas) if attr is not None else ()
        ext = b.ext[iv]
        if kind == ForKind.VECTORIZED and not isinstance(simplify(ext), IntImm):
            raise ScheduleError(
                f"stage {st.name}: cannot vectorize axis '{iv.name}' with non-constant extent {ext}"
            )
        return self._for(st, iv, ext, kind, body, ann)

    def _marked_nest(self, st: Stage) -> Stmt:
        """``st``'s nest; a double-buffered stage's is wrapped in one DOUBLE_BUFFER_SCOPE attr
        per buffer (as TVM's schedule ops do) for passes/inject_double_buffer.py."""
        nest = self.stage_nest(st)
        if self.gpu and st.double_buffer_:
            for buf in reversed(self.local_allocs.get(st, [])):
                nest = AttrStmt(DOUBLE_BUFFER_SCOPE, buf.data, nest)
        depth = getattr(st, "pipeline_depth_", 0)
        if self.gpu and depth:  # for passes/inject_software_pipeline.py
            for buf in reversed(self.local_allocs.get(st, [])):
                nest = AttrStmt(ASYNC_PIPELINE_SCOPE, (buf.data, depth), nest)
        return nest

    def store_predicate(self, st: Stage) -> Expr | None:
        """``st``'s store predicate with thread axes read as the loops bound to them."""
        pred = st.store_predicate
        if pred is None:
            return None
        from .cross_thread import enclosing_threads

        vmap: dict[Var, Expr] = {}
        around = [(st, iv) for iv in st.leaf_iter_vars] + [(o, iv) for _, iv, o in enclosing_threads(st)]
        for owner, iv in around:
            a = owner.iter_var_attrs.get(iv)
            if a is not None and a.bind_thread is not None:
                vmap.setdefault(a.bind_thread.var, iv.var)
        # the stage's own root axes, as TVM reads them (``i % 3 != 1`` after ``i`` was split)
        op = st.op
        if isinstance(op, ComputeOp) and st in self.bounds:
            b = self.bounds[st]
            for iv in op.axis:
                vmap.setdefault(iv.var, b.root_value(iv))
        return simplify(substitute(pred, vmap))

    def _reduce_stmts(self, st: Stage, vmap: dict[Var, Expr], out_idx: list[Expr]) -> tuple[Stmt, Stmt]:
        reds = self.bodies[st]
        r0 = reds[0]
        assert isinstance(r0, Reduce)
        comb = r0.combiner
        bufs = [self.buffers[(st, k)] for k in range(len(reds))]
        idx = tuple(out_idx)
        src = [self.mutator.visit(substitute(s, vmap)) for s in r0.source]
        cond = simplify(self.mutator.visit(substitute(r0.condition, vmap)))
        acc = {lv: BufferLoad(bf, idx) for lv, bf in zip(comb.lhs, bufs)}
        vals = {rv: s for rv, s in zip(comb.rhs, src)}
        news = [substitute(r, {**acc, **vals}) for r in comb.result]
        if len(news) == 1:
            update: Stmt = BufferStore(bufs[0], news[0], idx)
        else:
            tmps = [Var(f"{bf.name}_v{k}", bf.dtype) for k, bf in enumerate(bufs)]
            update = seq(*[BufferStore(bf, t, idx) for bf, t in zip(bufs, tmps)])
            for t, n in reversed(list(zip(tmps, news))):
                update = LetStmt(t, n, update)
        if not (isinstance(cond, IntImm) and cond.value == 1):
            update = IfThenElse(cond, update)
        inits = r0.init if r0.init else comb.identity
        init_vals = [self.mutator.visit(substitute(v, vmap)) for v in inits]
        init = seq(*[BufferStore(bf, v, idx) for bf, v in zip(bufs, init_vals)])
        return update, init

    def _prefetch(self, st: Stage, iv: IterVar, items: list[tuple[Tensor, Expr]]) -> list[Stmt]:
        from .prefetch import prefetch_stmts

        return prefetch_stmts(self, st, iv, items)


class _PlainVars(StmtMutator):
    """Replace te axis variables by plain loop Vars: below te, a loop variable is just a Var."""

    def __init__(self) -> None:
        self.map: dict[Var, Var] = {}

    def visit_Var(self, e: Var) -> Expr:  # type: ignore[override]
        if type(e) is Var:
            return e
        v = self.map.get(e)
        if v is None:
            v = self.map[e] = Var(e.name, e.dtype)
        return v

    def visit_For(self, s: For) -> Stmt:
        s2 = super().visit_For(s)
        assert isinstance(s2, For)
        v = self.visit_Var(s.var)
        if v is s.var:
            return s2
        return For(v, s2.min, s2.extent, s2.kind, s2.body, s2.annotations)  # type: ignore[arg-type]

    def visit_LetStmt(self, s: LetStmt) -> Stmt:
        s2 = super().visit_LetStmt(s)
        assert isinstance(s2, LetStmt)
        v = self.visit_Var(s.var)
        return s2 if v is s.var else LetStmt(v, s2.value, s2.body)  # type: ignore[arg-type]


class _Data(StmtVisitor):
    """The data Vars of the buffers a statement loads or stores."""

    def __init__(self) -> None:
        self.used: set[Var] = set()

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self.used.add(e.buffer.data)
        super().visit_BufferLoad(e)

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.used.add(s.buffer.data)
        super().visit_BufferStore(s)


class _Unbound(StmtVisitor):
    """Variables used but bound by nothing: no loop, no let, no argument dimension."""

    def __init__(self, dims: list[Var]) -> None:
        self.bound: set[Var] = set(dims)
        self.found: set[Var] = set()

    def visit_Var(self, e: Var) -> None:
        if e not in self.bound and e.dtype != "handle":
            self.found.add(e)

    def visit_For(self, s: For) -> None:
        self.bound.add(s.var)
        super().visit_For(s)

    def visit_LetStmt(self, s: LetStmt) -> None:
        self.bound.add(s.var)
        super().visit_LetStmt(s)

    def visit_Let(self, e: Any) -> None:
        self.bound.add(e.var)
        super().visit_Let(e)


def _guard(conds: list[Expr], body: Stmt) -> Stmt:
    live = [c for c in conds if not (isinstance(c, IntImm) and c.value == 1)]
    if not live:
        return body
    c = live[0]
    for x in live[1:]:
        c = And(c, x)
    return IfThenElse(c, body)


def _aligned_strides(shape: tuple[Expr, ...], align: dict[int, tuple[int, int]],
                     st: Stage) -> tuple[Expr, ...]:
    strides: list[Expr] = [const(1)] * len(shape)
    acc: Expr = const(1)
    for d in range(len(shape) - 1, -1, -1):
        if d in align:
            factor, offset = align[d]
            # round the natural stride up to k * factor + offset
            s = simplify(acc)
            if not isinstance(s, IntImm):
                ax = st.op.axis[d].name  # type: ignore[attr-defined]
                raise ScheduleError(f"stage {st.name}: storage_align of axis '{ax}' needs constant "
                                    f"extents inside it, got a row of {s} elements")
            k = -(-(s.value - offset) // factor)
            acc = const(max(k * factor + offset, s.value))
        strides[d] = acc
        acc = simplify(acc * shape[d])
    return tuple(strides)


THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def storage_scopes(stages: Sequence[Stage], gpu: bool) -> dict[Stage, str]:
    """The storage scope of each stage's buffer.

    A scope the schedule set (``cache_read(A, "shared")``, ``set_scope``) is kept. On a GPU a
    stage without one follows TVM: computed inside a ``threadIdx`` loop it is per thread
    ("local"), inside only ``blockIdx`` loops per block ("shared").
    """
    out: dict[Stage, str] = {}
    for st in stages:
        if st.scope != "global" or not gpu or st.attach_type != "scope":
            out[st] = st.scope
            continue
        tags: set[str] = set()
        p: Stage | None = st
        while p is not None and p.attach_stage is not None and p.attach_ivar is not None:
            parent = p.attach_stage
            for leaf in parent.leaf_iter_vars[: parent.leaf_iter_vars.index(p.attach_ivar) + 1]:
                a = parent.iter_var_attrs.get(leaf)
                if a is not None and a.bind_thread is not None:
                    tags.add(a.bind_thread.thread_tag.split(".")[0])
            p = parent
        out[st] = "local" if "threadIdx" in tags else "shared" if "blockIdx" in tags else "global"
    return out


def _check_binds(binds: Mapping[Tensor, Buffer] | None, name: str) -> dict[Tensor, Buffer]:
    out: dict[Tensor, Buffer] = {}
    for t, b in (binds or {}).items():
        if not isinstance(t, Tensor) or not isinstance(b, Buffer):
            raise LoweringError(
                f"{name}: binds maps te.Tensors to buffers from tc.tir.decl_buffer, got "
                f"{type(t).__name__} -> {type(b).__name__}")
        if len(b.shape) != len(t.shape) or b.dtype != t.dtype:
            raise LoweringError(
                f"{name}: binds: buffer {b.name} ({b.dtype}, {len(b.shape)} dims) does not match "
                f"tensor {t.name} ({t.dtype}, {len(t.shape)} dims)")
        out[t] = b
    return out


def _arg_buffer_from_bind(t: Tensor, b: Buffer, name: str, gpu: bool = False) -> Buffer:
    """A bound argument buffer: the tensor's shape with ``b``'s strides (see _arg_buffer)."""
    from ..te.extern import arg_layout

    return arg_layout(b, tuple(t.shape), f"{name}: binds of {t.name}", gpu)


def lower_schedule(sch: Schedule, args: Sequence[Any], name: str = "main",
                   target: Target | None = None,
                   binds: Mapping[Tensor, Buffer] | None = None) -> PrimFunc:
    """The loop nest of ``sch`` with ``args`` as kernel parameters (before passes);
    ``target`` (default: the CPU) decides what thread bindings and storage scopes mean;
    ``binds`` gives tensors the buffers (tc.tir.decl_buffer) their argument should use."""
    return Lowering(sch, args, name, target, binds).lower()


__all__ = ["Lowering", "lower_schedule"]
