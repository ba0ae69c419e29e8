"""Executors: where a dataset's prompts run.

* :class:`LocalExecutor` (``executor: {kind: local, workers: N}``): N worker processes on
  this machine, each loading the model and dictionaries once.  Prompts are handed out one at
  a time; a worker that dies (killed, out of memory) is replaced and the prompt it held is
  retried, up to ``max_retries`` times, then recorded as failed.  Workers are forked from a
  fresh server process (``forkserver``), never from a process that has already run torch.
* :class:`RayExecutor` (``executor: {kind: ray, address: ...}``): one Ray task per prompt;
  each Ray worker process loads the model once (a per-process cache) and Ray retries a task
  whose worker died.  Files come back to the driver, which writes them, so a cluster needs
  no shared filesystem.

Both call ``on_result(record)`` in the driver as prompts finish (in any order); the
aggregate does not depend on that order (see :mod:`circuitgraph.datasets.reduce`).

What a task is and does is a *job* (:class:`PromptJob` by default: a task is a dataset row,
run through the pipeline).  A job is a picklable object with ``load(spec)`` (once per worker),
``run(spec, task, inputs) -> PromptOutput``, ``commit(out_dir, output, attempts)`` and
``failed(task, error) -> PromptOutput``; the feature dashboards
(:mod:`circuitgraph.features`) hand shards of rows to the same executors this way.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from circuitgraph.datasets.prompt import PromptOutput, commit, one_line, run_prompt
from circuitgraph.errors import LoadError
from circuitgraph.pipeline.inputs import load_inputs
from circuitgraph.spec import Spec
from circuitgraph.spec.dataset import ExecutorSpec, Row

if TYPE_CHECKING:
    from circuitgraph.pipeline.inputs import LoadedInputs

__all__ = ["LocalExecutor", "RayExecutor", "make_executor", "executor_from", "default_workers", "PromptJob"]

OnResult = Callable[[dict[str, Any]], None]

#: imported once by the fork server, so each worker starts with them loaded (importing
#: TransformerLens alone takes seconds); nothing here runs torch code
_PRELOAD = (
    "torch",
    "transformer_lens",
    "circuitgraph.pipeline.inputs",
    "circuitgraph.pipeline.runner",
    "circuitgraph.attribution.build",
    "circuitgraph.queries",
    "circuitgraph.validation",
    "circuitgraph.export",
    "circuitgraph.datasets.prompt",
    "circuitgraph.datasets.reduce",
    "circuitgraph.datasets.executors",
    "circuitgraph.features.stream",
)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _prepare_worker(threads: int) -> None:
    torch.set_num_threads(threads)


class PromptJob:
    """The job of a dataset run: a task is a :class:`Row`, run through the pipeline."""

    def load(self, spec: Spec) -> LoadedInputs:
        return load_inputs(spec)

    def run(self, spec: Spec, task: Row, inputs: LoadedInputs) -> Any:
        return run_prompt(spec, task, inputs)

    def commit(self, out_dir: Path, output: Any, attempts: int = 1) -> dict[str, Any]:
        return commit(out_dir, output, attempts)

    def failed(self, task: Row, error: str) -> Any:
        return PromptOutput({"id": task.id, "row": task.number, "status": "failed", "error": error})


# ------------------------------------------------------------------ local processes
def _local_worker(conn: Any, spec: Spec, out_dir: str, threads: int, job: Any = None) -> None:
    """A worker process: load once, then run and commit tasks until told to stop."""
    job = job or PromptJob()
    _prepare_worker(threads)
    try:
        inputs = job.load(spec)
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which stops the run
        conn.send(("fatal", one_line(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        row, attempts = task
        output = job.run(spec, row, inputs)
        record = job.commit(Path(out_dir), output, attempts)
        try:
            conn.send(("done", record))
        except (BrokenPipeError, OSError):
            return


class LocalExecutor:
    """Worker processes on this machine (see the module docstring)."""

    def __init__(self, workers: int | None = None, threads: int = 1, max_retries: int = 2):
        self.workers = workers or default_workers()
        self.threads = threads
        self.max_retries = max_retries

    def run(self, spec: Spec, rows: list[Row], out_dir: Path, on_result: OnResult, job: Any = None) -> None:
        if not rows:
            return
        job = job or PromptJob()
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # inherited by the server, then the workers
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(_PRELOAD))
        queue: deque[tuple[Row, int]] = deque((row, 1) for row in rows)
        slots: dict[Any, dict[str, Any]] = {}  # connection -> {process, task}

        def start() -> None:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_local_worker, args=(child, spec, str(out_dir), self.threads, job),
                               daemon=True)
            proc.start()
            child.close()
            slots[parent] = {"process": proc, "task": None, "ready": False}

        def hand_out(conn: Any) -> None:
            slot = slots[conn]
            if queue:
                slot["task"] = queue.popleft()
                conn.send(slot["task"])
            else:
                slot["task"] = None
                _stop(conn, slot)
                del slots[conn]

        for _ in range(min(self.workers, len(rows))):
            start()
        try:
            while slots:
                wait(list(slots) + [slot["process"].sentinel for slot in slots.values()])
                for conn in list(slots):
                    slot = slots[conn]
                    dead = False
                    try:
                        while conn in slots and conn.poll():
                            kind, payload = conn.recv()
                            if kind == "fatal":
                                raise LoadError(f"a worker could not load the model: {payload}")
                            if kind == "done":
                                on_result(payload)
                            hand_out(conn)
                    except (EOFError, OSError):
                        dead = True
                    if conn in slots and (dead or not slot["process"].is_alive()):
                        self._worker_died(conn, slot, slots, queue, on_result, out_dir, job)
                        if queue and len(slots) < self.workers:
                            start()
        finally:
            for conn, slot in list(slots.items()):
                _stop(conn, slot, kill=True)

    def _worker_died(self, conn: Any, slot: dict[str, Any], slots: dict[Any, Any], queue: deque, on_result: OnResult,
                     out_dir: Path, job: Any = None) -> None:
        job = job or PromptJob()
        proc = slot["process"]
        proc.join(timeout=5)
        del slots[conn]
        conn.close()
        task = slot["task"]
        if task is None:
            return
        row, attempts = task
        if attempts <= self.max_retries:
            queue.appendleft((row, attempts + 1))
            return
        error = (f"the worker running this prompt died {attempts} times (last exit code {proc.exitcode}); "
                 "the prompt may need more memory than a worker has")
        on_result(job.commit(out_dir, job.failed(row, error), attempts))


def _stop(conn: Any, slot: dict[str, Any], kill: bool = False) -> None:
    proc = slot["process"]
    try:
        conn.send(None)
    except (BrokenPipeError, OSError):
        pass
    proc.join(timeout=0 if kill else 10)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
    conn.close()


# ------------------------------------------------------------------ Ray
_RAY_INPUTS: dict[str, Any] = {}


def _ray_prompt(spec_bytes: bytes, key: str, row: Row, threads: int, job: Any = None) -> Any:
    """A Ray task: load the model once per worker process (cached by spec and job), run one task."""
    job = job or PromptJob()
    spec = pickle.loads(spec_bytes)  # our own bytes, from the driver
    key = f"{key}:{type(job).__module__}.{type(job).__qualname__}"
    if key not in _RAY_INPUTS:
        _prepare_worker(threads)
        _RAY_INPUTS.clear()
        _RAY_INPUTS[key] = job.load(spec)
    return job.run(spec, row, _RAY_INPUTS[key])


class RayExecutor:
    """Ray tasks, on a local instance (``address: local``) or a cluster (see the module docstring)."""

    def __init__(self, address: str | None = None, workers: int | None = None, threads: int = 1,
                 max_retries: int = 2):
        self.address = address
        self.workers = workers
        self.threads = threads
        self.max_retries = max_retries

    def _init(self) -> bool:
        """Connect to (or start) Ray; returns whether this call started it."""
        try:
            import ray
        except ImportError:
            raise LoadError("executor kind ray needs the ray package: pip install 'circuitgraph-lm[dataset]' "
                            "(or pip install ray)") from None
        if ray.is_initialized():
            return False

        package_root = str(Path(__file__).resolve().parents[2])  # the folder holding circuitgraph/
        env = {"OMP_WAIT_POLICY": "PASSIVE"}
        if self.address in (None, "local"):
            # a local instance runs this very code, wherever it is imported from
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "include_dashboard": False,
                                  "log_to_driver": False, "configure_logging": False}
        if self.address == "local":
            kwargs["address"] = "local"
            if self.workers is not None:
                kwargs["num_cpus"] = self.workers
        elif self.address is not None:
            kwargs["address"] = self.address
        ray.init(**kwargs)
        return True

    def run(self, spec: Spec, rows: list[Row], out_dir: Path, on_result: OnResult, job: Any = None) -> None:
        if not rows:
            return
        job = job or PromptJob()
        started = self._init()
        import ray

        try:
            task = ray.remote(num_cpus=1, max_retries=self.max_retries)(_ray_prompt)
            spec_bytes = pickle.dumps(spec)
            key = hashlib.sha256(spec_bytes).hexdigest()
            spec_ref = ray.put(spec_bytes)
            limit = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            pending: deque[Any] = deque(rows)
            running: dict[Any, Any] = {}
            while pending or running:
                while pending and len(running) < limit:
                    row = pending.popleft()
                    running[task.remote(spec_ref, key, row, self.threads, job)] = row
                done, _ = ray.wait(list(running), num_returns=1)
                for ref in done:
                    row = running.pop(ref)
                    try:
                        output = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - worker lost after every retry
                        output = job.failed(row, f"the Ray task failed {self.max_retries + 1} times: {one_line(exc)}")
                    on_result(job.commit(out_dir, output))
        finally:
            if started:
                ray.shutdown()


def make_executor(spec: Spec) -> Any:
    return executor_from(spec.executor or ExecutorSpec())


def executor_from(e: ExecutorSpec) -> Any:
    """The executor an ``executor:`` block describes."""
    if e.kind == "ray":
        return RayExecutor(address=e.address, workers=e.workers, threads=e.threads, max_retries=e.max_retries)
    return LocalExecutor(workers=e.workers, threads=e.threads, max_retries=e.max_retries)
