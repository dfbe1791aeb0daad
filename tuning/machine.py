"""Which machine measured a candidate: its CPU (or GPU) and a stable host id.

A cost is only meaningful on the hardware that produced it, so every `MeasureResult` and every
logged record says where it was measured. The identity is taken *in the measuring process*
(`LocalRunner.machine` asks its worker), not in the tuner: a runner that measures on another
host reports that host. A CPU machine is its model name (``/proc/cpuinfo``), the LLVM CPU name
and enabled features that tecomp's host target detects; a GPU machine adds the device name and
compute capability. ``host_id`` is a hash of ``/etc/machine-id`` (else of the hostname and a
MAC address): stable across reboots and renames, without writing the raw id into logs.

Logs store each machine once, as a ``"machine"`` line, and records refer to it by `Machine.id`
(`tuning.records`); logs of schema version 1 only had the tuner's LLVM CPU name, read back as
`Machine.legacy`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import socket
import uuid
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Machine:
    """The identity of a measuring machine (empty strings: not known)."""

    host: str = ""  # hostname, for people
    host_id: str = ""  # stable hash of the machine id (see the module docstring)
    cpu_model: str = ""  # e.g. "AMD EPYC 7B13"
    llvm_cpu: str = ""  # LLVM's name of the host CPU, e.g. "znver3"
    features: str = ""  # the enabled LLVM features, "+avx,+avx2,..." sorted
    gpu_name: str = ""  # e.g. "NVIDIA H100 80GB HBM3"; "" for a CPU measurement
    compute_capability: str = ""  # e.g. "9.0"

    @property
    def kind(self) -> str:
        """``"cuda"`` for a GPU measurement, else ``"cpu"``."""
        return "cuda" if self.gpu_name else "cpu"

    @functools.cached_property
    def id(self) -> str:
        """A short hash of every field: what records in a log refer to."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """One line for people, e.g. ``"node3 [1a2b3c4d] AMD EPYC 7B13 (znver3)"``."""
        where = " ".join(p for p in (self.host, f"[{self.host_id[:8]}]" if self.host_id else "") if p)
        if self.gpu_name:
            what = f"{self.gpu_name} (compute capability {self.compute_capability or '?'})"
        elif self.cpu_model:
            what = f"{self.cpu_model} ({self.llvm_cpu})" if self.llvm_cpu else self.cpu_model
        elif self.llvm_cpu:
            what = f"LLVM CPU {self.llvm_cpu}"
        else:
            what = "unknown hardware"
        return f"{where} {what}" if where else what

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> Machine:
        """The machine of a log's ``"machine"`` line; ValueError naming what is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"a machine is a JSON object, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown machine field(s) {unknown}")
        bad = sorted(k for k, v in d.items() if not isinstance(v, str))
        if bad:
            raise ValueError(f"machine field(s) {bad} must be strings")
        return cls(**d)

    @classmethod
    def legacy(cls, host_cpu: str) -> Machine:
        """What a schema-1 record knew: the LLVM CPU name of the *tuner's* host."""
        return cls(llvm_cpu=host_cpu)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw:
            return hashlib.sha256(("tecomp-host:" + raw).encode()).hexdigest()[:16]
    raw = f"{socket.gethostname()}:{uuid.getnode():012x}"
    return hashlib.sha256(("tecomp-host:" + raw).encode()).hexdigest()[:16]


@functools.cache
def local_machine() -> Machine:
    """This process's CPU machine (cached: the hardware does not change under a process)."""
    from tecomp.codegen.target import Target

    host = Target.host()
    feats = ",".join(sorted(f for f in host.features.split(",") if f.startswith("+")))
    return Machine(host=socket.gethostname(), host_id=_host_id(), cpu_model=_cpu_model(),
                   llvm_cpu=host.cpu, features=feats)


def cpu_machine_job() -> Machine:
    """`local_machine`, as a job for a measuring process (pickled by name)."""
    return local_machine()


def gpu_machine_job() -> Machine:
    """The host and GPU 0 of a GPU measuring process (raises when it has no GPU)."""
    from tecomp.runtime.cuda import get_device

    dev = get_device(0)
    major, minor = dev.compute_capability
    cpu = local_machine()
    return Machine(host=cpu.host, host_id=cpu.host_id, cpu_model=cpu.cpu_model, llvm_cpu=cpu.llvm_cpu,
                   features=cpu.features, gpu_name=dev.name, compute_capability=f"{major}.{minor}")


__all__ = ["Machine", "cpu_machine_job", "gpu_machine_job", "local_machine"]
