"""The GPU emulator's race detector: which threads touched which elements between barriers.

Every load and store of a shared buffer, and of a global buffer the kernel writes somewhere,
appends one entry to `RaceTracker.log` as it runs: its access site, the offsets it touched
(an int or an array over the block's lanes) and the lanes that were active. Nothing is
compared while the block runs; at each barrier (and at the end of the block) `end_region`
analyses the region's log in a few vectorised numpy calls, buffer by buffer, and only for
buffers written in the region (reads alone never race), so a region that only reads shared
memory (a GEMM's inner k loop) costs one pass over a short Python list.

Rules:
  * within a block, between two barriers: an element accessed by two different threads, at
    least one of them writing, is a race (shared and global memory alike; barriers order both
    within a block). One thread reading its own write is fine; two lanes of one store hitting
    one address are two threads writing it.
  * across blocks (global buffers the kernel stores to): blocks are not ordered within a
    launch, so an element written by one block and read or written by another is a race. Each
    block's accesses are checked against those of the blocks that ran before it, at its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TecompError
from ..ir.buffer import Buffer


class RaceError(TecompError):
    """Two threads touched one element without a barrier between them, at least one writing.

    ``buffer`` names the buffer, ``element`` is the flat element index, ``threads`` the two
    threads' (x, y, z) indices and ``blocks`` their blocks' (equal for a race within a block).
    """

    def __init__(
        self, msg: str, buffer: str, element: int,
        threads: tuple[tuple[int, int, int], tuple[int, int, int]],
        blocks: tuple[tuple[int, int, int], tuple[int, int, int]],
    ) -> None:
        super().__init__(msg)
        self.buffer, self.element, self.threads, self.blocks = buffer, element, threads, blocks


@dataclass(frozen=True)
class Site:
    """One load or store in the kernel, registered when it is compiled."""

    buffer: Buffer
    write: bool
    varying: bool  # offsets carry the lane axis first ([T] or [T, lanes])
    lanes: int  # vector width of the access
    where: str  # the statement it belongs to, as printed IR


# one run-time access: (site index, offsets, live lanes or None, the storage array touched)
Entry = tuple[int, Any, Any, np.ndarray]


class _GlobalTrack:
    """Cross-block record of one global buffer: per element, the last block that wrote it and
    one block that read it, each packed with its thread and site as block << 32 | info."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.writer = np.full(size, -1, np.int64)
        self.reader = np.full(size, -1, np.int64)
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []


class RaceTracker:
    """Collects the accesses of the running block and checks them at barriers and block ends."""

    def __init__(self, nthreads: int, block_dims: tuple[int, int, int]) -> None:
        self.T = nthreads
        self.dims = block_dims
        self.sites: list[Site] = []
        self.log: list[Entry] = []
        self.hot: list[int] = []  # sites of this region's entries that need analysis
        self.lanes = np.arange(nthreads, dtype=np.int64)
        self.lin = self.lanes  # lane -> linear thread id of the running block (set per block)
        self.block = (0, 0, 0)
        self.block_lin = 0
        self.grid = (1, 1, 1)
        self._globals: dict[int, _GlobalTrack] = {}  # id(storage) -> record
        self._table = np.full(0, -1, np.int32)

    # set-up -----------------------------------------------------------------------------------

    def site(self, buffer: Buffer, write: bool, varying: bool, lanes: int, where: str) -> int:
        self.sites.append(Site(buffer, write, varying, lanes, where))
        return len(self.sites) - 1

    def track_global(self, name: str, storage: np.ndarray) -> None:
        """Check ``storage`` (a parameter the kernel writes) across blocks too."""
        self._globals[id(storage)] = _GlobalTrack(name, storage.shape[0])

    def start_block(self, block: tuple[int, int, int], block_lin: int, lin: np.ndarray) -> None:
        self.block, self.block_lin, self.lin = block, block_lin, lin
        self.log.clear()
        self.hot.clear()

    # helpers ----------------------------------------------------------------------------------

    def thread(self, lin: int) -> tuple[int, int, int]:
        x, y, _ = self.dims
        return (lin % x, lin // x % y, lin // (x * y))

    def block_of(self, lin: int) -> tuple[int, int, int]:
        gx, gy, _ = self.grid
        return (lin % gx, lin // gx % gy, lin // (gx * gy))

    def _expand(self, ent: Entry) -> tuple[np.ndarray, np.ndarray]:
        """The (element, lane) pairs of one entry, as two flat int arrays."""
        s, o, live, _ = ent
        site, T = self.sites[s], self.T
        if site.lanes == 1 and site.varying and (live is None or live.ndim == 1):
            o = np.asarray(o)  # the common case, without broadcasting
            return (o, self.lanes) if live is None else (o[live], self.lanes[live])
        shape = (T,) if site.lanes == 1 else (T, site.lanes)
        full = np.broadcast_to(np.asarray(o, np.int64), shape)
        lane = self.lanes if site.lanes == 1 else np.broadcast_to(self.lanes[:, None], shape)
        if live is None:
            return full.reshape(-1), lane.reshape(-1)
        live = np.asarray(live, bool)
        if live.ndim < len(shape):
            live = live[:, None]
        live = np.broadcast_to(live, shape)
        return full[live], lane[live]

    # analysis ---------------------------------------------------------------------------------

    def end_region(self) -> None:
        """A barrier or the end of the block: check the accesses since the last one."""
        log = self.log
        if not self.hot:  # only shared-memory reads: nothing can race
            log.clear()
            return
        self.hot.clear()
        groups: dict[int, list[Entry]] = {}
        written: set[int] = set()
        sites = self.sites
        seen: set[tuple[int, int, int]] = set()
        for ent in log:
            # the same site with the very same offset and mask objects touched the same
            # elements (values never change in place, and the log keeps them alive): e.g. an
            # accumulation into global memory at a block-invariant index, once per k step
            key = (ent[0], id(ent[1]), id(ent[2]))
            if key in seen:
                continue
            seen.add(key)
            k = id(ent[3])
            g = groups.get(k)
            if g is None:
                groups[k] = g = []
            g.append(ent)
            if sites[ent[0]].write:
                written.add(k)
        for k, ents in groups.items():
            track = self._globals.get(k)
            if k not in written and track is None:
                continue
            parts = [self._expand(e) for e in ents]
            if len(parts) == 1:
                E, L = parts[0]
            else:
                E = np.concatenate([p[0] for p in parts])
                L = np.concatenate([p[1] for p in parts])
            size = ents[0][3].shape[0]
            if len(ents) == 1:  # one store alone (a tile load): only its own lanes can collide
                if k in written and self._may_race(E, L, None, size):
                    self._check_block(*self._columns(ents, parts, E, L))
                if track is not None and E.size:
                    E1, L1, W1, S1, _ = self._columns(ents, parts, E, L)
                    track.pending.append((E1, self.lin[L1], W1, S1))
                continue
            E, L, W, S, Q = self._columns(ents, parts, E, L)
            if k in written and self._may_race(E, L, W, size):
                self._check_block(E, L, W, S, Q)
            if track is not None and E.size:
                track.pending.append((E, self.lin[L], W, S))
        log.clear()

    def _columns(self, ents: list[Entry], parts: list[tuple[np.ndarray, np.ndarray]], E: np.ndarray,
                 L: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per (element, lane) pair: element, lane, is-write, site, entry number."""
        Q = np.repeat(np.arange(len(ents)), [p[0].shape[0] for p in parts])
        S = np.fromiter((e[0] for e in ents), np.int64, len(ents))[Q]
        W = np.fromiter((self.sites[e[0]].write for e in ents), bool, len(ents))[Q]
        return E.astype(np.int64), L, W, S, Q

    def _may_race(self, E: np.ndarray, L: np.ndarray, W: np.ndarray | None, size: int) -> bool:
        """A quick exact test (W None: all writes): one lane per written element (a table of
        last writers), and no other lane reading it; `_check_block` finds and reports the pair."""
        if size > 64 * E.shape[0] + (1 << 22):
            return True  # a table this large costs more than sorting: go the slow way
        EW, LW = (E, L) if W is None else (E[W], L[W])
        writer = self._scratch(size)
        writer[EW] = LW
        try:
            if (writer[EW] != LW).any():
                return True
            if W is None:
                return False
            R = ~W
            wr = writer[E[R]]
            return bool(((wr >= 0) & (wr != L[R])).any())
        finally:
            writer[EW] = -1  # back to empty for the next region

    def _scratch(self, size: int) -> np.ndarray:
        """A table of ``size`` entries, all -1 (kept between regions, grown when needed)."""
        if self._table.shape[0] < size:
            self._table = np.full(max(size, 2 * self._table.shape[0]), -1, np.int32)
        return self._table

    def _check_block(self, E: np.ndarray, L: np.ndarray, W: np.ndarray, S: np.ndarray, Q: np.ndarray) -> None:
        T = self.T
        pairs = np.unique(E * T + L)  # distinct (element, lane)
        pe = pairs // T
        shared_by_two = pe[1:][pe[1:] == pe[:-1]]  # elements touched by >= 2 lanes (sorted)
        if shared_by_two.size == 0:
            return
        bad = np.intersect1d(shared_by_two, E[W])
        if bad.size == 0:
            return
        e = int(bad[0])
        # the lowest-numbered writing thread and the lowest other thread, in program order, so
        # the report does not depend on the seed's lane shuffle
        at = np.flatnonzero(E == e)
        lin = self.lin[L[at]]
        writes = at[W[at]]
        j = int(writes[np.argmin(self.lin[L[writes]])])
        others = at[lin != self.lin[L[j]]]
        k = int(others[np.argmin(self.lin[L[others]])])
        first, second = sorted((j, k), key=lambda i: (int(Q[i]), int(self.lin[L[i]])))
        ta, tb = (self.thread(int(self.lin[L[i]])) for i in (first, second))
        sa, sb = self.sites[int(S[first])], self.sites[int(S[second])]
        buf = sa.buffer
        msg = (f"data race on {buf.scope} buffer '{buf.name}', element {e}, in block {self.block}: "
               f"no barrier between\n  thread {ta} {_verb(sa)}: {sa.where}\n"
               f"  thread {tb} {_verb(sb)}: {sb.where}")
        raise RaceError(msg, buf.name, e, (ta, tb), (self.block, self.block))

    def end_block(self) -> None:
        """Check the block's global accesses against those of the blocks that ran before it."""
        self.end_region()
        T = self.T
        me = self.block_lin << 32
        for track in self._globals.values():
            if not track.pending:
                continue
            E = np.concatenate([p[0] for p in track.pending])
            lin = np.concatenate([p[1] for p in track.pending])
            W = np.concatenate([p[2] for p in track.pending])
            S = np.concatenate([p[3] for p in track.pending])
            track.pending.clear()
            info = me | (S * T + lin)
            R = ~W
            ew, er = E[W], E[R]
            # with repeated elements (a thread's many accesses) the checks and updates below
            # hold all the same: any earlier block's mark is a conflict, and any of this
            # block's marks will do for a later report
            for elems, mine, theirs, verb in (
                (ew, info[W], track.writer, "wrote"), (ew, info[W], track.reader, "read"),
                (er, info[R], track.writer, "wrote"),
            ):
                prev = theirs[elems]
                hit = np.flatnonzero(prev >= 0)
                if hit.size:
                    i = int(hit[0])
                    self._cross_block(track.name, int(elems[i]), int(mine[i]), int(prev[i]), verb)
            track.writer[ew] = info[W]
            fresh = track.reader[er] < 0
            track.reader[er[fresh]] = info[R][fresh]

    def _cross_block(self, name: str, e: int, mine: int, prev: int, prev_verb: str) -> None:
        T = self.T
        def unpack(v: int) -> tuple[tuple[int, int, int], tuple[int, int, int], Site]:
            low = v & 0xFFFFFFFF
            return self.block_of(v >> 32), self.thread(low % T), self.sites[low // T]
        b1, t1, s1 = unpack(prev)
        b2, t2, s2 = unpack(mine)
        msg = (f"data race on global buffer '{name}', element {e}, between blocks {b1} and {b2} "
               f"(blocks of one launch are not ordered):\n"
               f"  block {b1} thread {t1} {prev_verb} it: {s1.where}\n"
               f"  block {b2} thread {t2} {_verb(s2)}: {s2.where}")
        raise RaceError(msg, name, e, (t1, t2), (b1, b2))


def _verb(site: Site) -> str:
    return "writes" if site.write else "reads"


__all__ = ["RaceError", "RaceTracker", "Site"]
