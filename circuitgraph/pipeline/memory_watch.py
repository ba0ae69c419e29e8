"""The memory budget of a run and the watch that keeps a run under it.

The budget (``--memory-limit GB``, the ``CIRCUITGRAPH_MEMORY_LIMIT`` environment variable in GB,
or ``memory_limit=`` in bytes from Python) lowers the memory a run may use: the run may use the
smaller of the budget and :data:`~circuitgraph.attribution.plan.USABLE` of the memory available
(what this process holds plus what the system has free).  The dry run's estimate and its advice
are computed against that limit (:mod:`circuitgraph.pipeline.estimate`), the engine refuses a
sweep that cannot fit it before the sweep (:func:`circuitgraph.attribution.plan.check_plan`), and
:class:`MemoryWatch` stops a run that passes it anyway, in whatever stage, before the operating
system's out-of-memory killer would: a thread samples the process's resident memory every
``interval`` seconds (20 ms) and, above the limit (or when the system's free memory falls below
:data:`FLOOR_BYTES`), interrupts the main thread; the run then raises a
:class:`~circuitgraph.errors.ResourceError` naming the stage, the memory and the fix, and writes
nothing (the exports are staged and moved into place together, or not at all).

The watch also records each stage's peak (:attr:`MemoryWatch.peaks`): the run's ``memory``
(bytes per stage) and the measurements of docs/benchmarks/memory.md.
"""

from __future__ import annotations

import _thread
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

from circuitgraph.attribution.plan import USABLE, available_memory, process_memory
from circuitgraph.errors import ResourceError, SpecError

__all__ = ["MEMORY_LIMIT_ENV", "FLOOR_BYTES", "memory_budget", "run_limit", "MemoryWatch", "parse_gb"]

#: the environment variable of the budget, in GB (``CIRCUITGRAPH_MEMORY_LIMIT=6``)
MEMORY_LIMIT_ENV = "CIRCUITGRAPH_MEMORY_LIMIT"
#: the watch stops a run when the system has less than this free (another process grew)
FLOOR_BYTES = 256 * 1024**2
_GB = 1024**3


def parse_gb(value: str | float, where: str) -> int:
    """Bytes of a budget given in GB (GiB: 1024**3 bytes), checked: a positive number."""
    try:
        gb = float(value)
    except (TypeError, ValueError):
        raise SpecError([(where, f"the memory limit {value!r} is not a number of GB; give e.g. 6 or 2.5")]) from None
    if not gb > 0 or gb != gb or gb == float("inf"):
        raise SpecError([(where, f"the memory limit {value!r} GB must be a positive number of GB, e.g. 6")])
    return int(gb * _GB)


def memory_budget(memory_limit: int | None = None) -> int | None:
    """The budget in bytes: ``memory_limit`` (bytes, from Python or ``--memory-limit``) if given,
    else the ``CIRCUITGRAPH_MEMORY_LIMIT`` environment variable (GB), else ``None`` (no budget:
    the memory available decides)."""
    if memory_limit is not None:
        if memory_limit <= 0:
            raise SpecError([("memory_limit", f"the memory limit {memory_limit} bytes must be positive")])
        return int(memory_limit)
    env = os.environ.get(MEMORY_LIMIT_ENV)
    if env is None or not env.strip():
        return None
    return parse_gb(env, MEMORY_LIMIT_ENV)


def run_limit(budget: int | None) -> int:
    """The memory a run may use now: the smaller of ``budget`` and ``USABLE`` of what is
    available to this process (its resident memory plus the system's available memory)."""
    usable = int(USABLE * (available_memory() + process_memory()))
    return usable if budget is None else min(int(budget), usable)


def _gb(b: float) -> str:
    return f"{b / _GB:.2f} GB"


class MemoryWatch:
    """Samples the process's resident memory while a run runs; records each stage's peak; stops
    the run (interrupting the main thread) when it passes ``limit`` or the system's free memory
    falls below :data:`FLOOR_BYTES`.  Use :meth:`watching` around the run and :meth:`stage`
    around each stage; :meth:`check` between stages."""

    def __init__(self, limit: int | None, *, interval: float = 0.02, budget_given: bool = False) -> None:
        self.limit = limit
        self.interval = interval
        self.budget_given = budget_given
        #: per stage: the resident memory when it started, and its peak (bytes)
        self.starts: dict[str, int] = {}
        self.peaks: dict[str, int] = {}
        self.current = "between stages"
        #: ``(stage, rss, why)`` once the watch stopped the run
        self.tripped: tuple[str, int, str] | None = None
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread() is threading.current_thread()

    # -------------------------------------------------------------------- sampling
    def _sample(self) -> None:
        rss = self._proc.memory_info().rss
        if rss > self.peaks.get(self.current, 0):
            self.peaks[self.current] = rss
        if self.tripped is not None:
            return
        why = None
        if self.limit is not None and rss > self.limit:
            why = f"{_gb(rss)} resident, more than the {_gb(self.limit)} it may use"
        elif psutil.virtual_memory().available < FLOOR_BYTES:
            why = f"{_gb(rss)} resident and the system has less than {_gb(FLOOR_BYTES)} free"
        if why is not None:
            self.tripped = (self.current, rss, why)
            if self._main:
                _thread.interrupt_main()  # raises KeyboardInterrupt in the run, between two bytecodes

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except psutil.Error:  # pragma: no cover - the process is going away
                return

    @contextmanager
    def watching(self) -> Iterator[MemoryWatch]:
        """Sample in a thread while the block runs; turn the watch's interrupt into a
        :class:`ResourceError` (any other KeyboardInterrupt passes through)."""
        self._thread = threading.Thread(target=self._loop, name="circuitgraph-memory-watch", daemon=True)
        self._thread.start()
        try:
            yield self
            self.check()
        except KeyboardInterrupt:
            if self.tripped is None:
                raise
            raise self.error() from None
        finally:
            self._stop.set()
            self._thread.join()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Attribute the samples of the block to stage ``name``; check the watch before and after."""
        self.check()
        before, self.current = self.current, name
        rss = self._proc.memory_info().rss
        self.starts.setdefault(name, rss)
        self.peaks[name] = max(self.peaks.get(name, 0), rss)
        try:
            yield
        finally:
            self._sample()
            self.current = before
        self.check()

    def check(self) -> None:
        """Raise the watch's error if it stopped the run (also when the interrupt could not be
        delivered: the run is not on the main thread)."""
        if self.tripped is not None:
            raise self.error()

    def error(self) -> ResourceError:
        stage, _, why = self.tripped or (self.current, 0, "")
        fix = ("raise --memory-limit (CIRCUITGRAPH_MEMORY_LIMIT) or " if self.budget_given else "")
        return ResourceError(
            f"the run stopped in stage '{stage}': {why}; nothing was written; {fix}run `circuitgraph run SPEC "
            "--dry-run` and follow its advice (a smaller graph.neuron_top_k or graph.max_feature_nodes, a "
            "shorter prompt, or queries on: pruned)")
