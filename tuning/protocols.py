"""What the tuner needs of whatever builds and measures its candidates.

`tune` and `measure_batch` accept any `Builder` and `Runner`; `LocalBuilder`/`LocalRunner`
(this machine's worker processes) are the defaults, `tuning.gpu_measure`'s GPU pair and its
test stand-in conform too, and a runner that measures on other machines (a cluster) is one
more class, not a change to the tuner loop.

A builder turns a batch of `MeasureInput`s into `BuildResult`s: an `Artifact` whose code is
bytes (object code or PTX) plus what the builder learnt (``info``), or the error that kept it
from building. A runner turns built candidates into `MeasureResult`s, reporting each one
through ``callback`` as soon as it exists (the tuner logs it there, so a crash of the tuner
loses nothing measured), and stamps each with the `tuning.machine.Machine` that measured it.
Neither raises for a bad candidate: every failure is a `MeasureErrorNo` in its result.

Scheduling is the runner's to declare:

* ``capacity``: how many batches it can measure at once (e.g. one per measuring node). The
  tuner keeps that many in flight, each in a thread of its own that builds then runs it, so
  `run` must be safe to call from several threads when ``capacity > 1``. Builds of different
  batches are serialised by the tuner (a builder need not be thread-safe).
* ``exclusive``: the runner measures on the tuner's own machine, so nothing else may run
  while it does: the tuner then builds, measures and searches one after the other (one batch
  in flight, whatever ``capacity`` says), as timing a kernel while the compiler or the search
  uses the cores would perturb its time.

``reset`` abandons whatever is in flight (after Ctrl-C: a stale answer must not be read as
the next job's); ``close`` releases everything. The tuner closes only builders and runners
it created itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .measure import BuildResult, MeasureInput, MeasureResult

ResultCallback = Callable[["MeasureInput", "MeasureResult"], None]


@runtime_checkable
class Builder(Protocol):
    """Compiles batches of candidates (module docstring)."""

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """One result per input, in order: an artifact, or why there is none."""
        ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Runner(Protocol):
    """Measures built candidates (module docstring)."""

    # batches this runner can measure at once (>= 1)
    capacity: int
    # True when it measures on the tuner's machine: nothing may run beside a measurement
    exclusive: bool

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            callback: ResultCallback | None = None) -> list[MeasureResult]:
        """One result per input, in order; ``callback(input, result)`` as each one finishes.
        A failed build gives its error back without running anything."""
        ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def check_builder(builder: object) -> Builder:
    """``builder`` if it is a `Builder`; TypeError naming what it lacks otherwise."""
    missing = [m for m in ("build", "reset", "close") if not callable(getattr(builder, m, None))]
    if missing:
        raise TypeError(f"builder {type(builder).__name__} is not a tuning Builder: it has no "
                        f"{', '.join(missing)} method(s) (see tuning.protocols.Builder)")
    return builder  # type: ignore[return-value]


def check_runner(runner: object) -> Runner:
    """``runner`` if it is a `Runner` with a sane ``capacity``; TypeError/ValueError naming
    what is wrong otherwise."""
    missing = [m for m in ("run", "reset", "close") if not callable(getattr(runner, m, None))]
    missing += [a for a in ("capacity", "exclusive") if not hasattr(runner, a)]
    if missing:
        raise TypeError(f"runner {type(runner).__name__} is not a tuning Runner: it lacks "
                        f"{', '.join(missing)} (see tuning.protocols.Runner)")
    cap = runner.capacity  # type: ignore[attr-defined]
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"runner {type(runner).__name__}: capacity must be an int >= 1, got {cap!r}")
    return runner  # type: ignore[return-value]


__all__ = ["Builder", "ResultCallback", "Runner", "check_builder", "check_runner"]
