"""Start and stop a real Dask cluster (scheduler + nanny-managed workers) as subprocesses.

The tests of the distributed code path use real processes, not an in-process
``LocalCluster``: a worker that dies must be a process that dies.  Each
process is started in its own session (process group) so that stopping it
also stops the worker process a nanny started under it.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ProcessCluster", "REPO_ROOT", "same_environment", "subprocess_env"]

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Seconds to wait for the scheduler file and for the workers to register.
START_TIMEOUT = 60.0
#: Seconds a process gets to exit after SIGTERM before it is sent SIGKILL.
STOP_TIMEOUT = 10.0


def same_environment(got: dict, expected: dict) -> bool:
    """Environment variables equal, a value that is a Python literal (dask's config from the
    environment, e.g. ``DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON``) compared as the literal."""

    def parsed(value):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value

    return got.keys() == expected.keys() and all(parsed(got[k]) == parsed(expected[k]) for k in expected)


def subprocess_env() -> dict:
    """The environment for a subprocess of the tests: the checkout importable, one BLAS thread."""
    env = dict(os.environ)
    # Workers import dask_mcpca (unpickling the tasks): make the checkout
    # importable even where the package is not installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # One BLAS thread per process: dask parallelises over blocks.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


class ProcessCluster:
    """A scheduler and ``n_workers`` nanny-managed workers on 127.0.0.1.

    Ports are chosen by the operating system (``--port 0``); the scheduler
    writes its address to a scheduler file, which is read back.

    Parameters
    ----------
    directory : path
        Where the scheduler file, the worker spill directories and the logs go.
    n_workers : int
    nthreads : int
        Threads per worker.
    memory_limit : str
        Memory limit per worker (``dask worker --memory-limit``).
    worker_env : dict, optional
        Environment variables added to the workers' (the nannies') environment.

    Examples
    --------
    In a test (it starts real processes, so it is not a doctest)::

        with ProcessCluster(tmp_path) as cluster:
            with distributed.Client(cluster.address) as client:
                ...
    """

    def __init__(self, directory, *, n_workers: int = 2, nthreads: int = 1, memory_limit: str = "1GiB",
                 worker_env: dict | None = None):
        self.directory = Path(directory)
        self.worker_env = dict(worker_env or {})
        self.n_workers = n_workers
        self.nthreads = nthreads
        self.memory_limit = memory_limit
        self.address: str | None = None
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._logs: list = []

    # ------------------------------------------------------------ start
    def _spawn(self, name: str, args: list[str], extra_env: dict | None = None) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "wb")
        self._logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.directory,
            env={**subprocess_env(), **(extra_env or {})},
            start_new_session=True,
        )
        self._procs.append((name, proc))
        return proc

    def start(self) -> ProcessCluster:
        """Start the scheduler, then the workers; return when all have registered."""
        self.directory.mkdir(parents=True, exist_ok=True)
        scheduler_file = self.directory / "scheduler.json"
        scheduler_file.unlink(missing_ok=True)
        try:
            self._spawn(
                "scheduler",
                [
                    "distributed.cli.dask_scheduler",
                    "--host", "127.0.0.1",
                    "--port", "0",
                    "--no-dashboard",
                    "--scheduler-file", str(scheduler_file),
                    # Ends a scheduler orphaned by a killed test run (its workers
                    # follow after --death-timeout); far above a test's length.
                    "--idle-timeout", "300s",
                ],
            )
            self.address = self._read_address(scheduler_file)
            for i in range(self.n_workers):
                self._spawn(
                    f"worker-{i}",
                    [
                        "distributed.cli.dask_worker",
                        self.address,
                        "--host", "127.0.0.1",
                        "--nanny",
                        "--nthreads", str(self.nthreads),
                        "--memory-limit", self.memory_limit,
                        "--name", f"worker-{i}",
                        "--no-dashboard",
                        "--local-directory", str(self.directory / f"worker-{i}"),
                        "--death-timeout", "60",
                    ],
                    self.worker_env,
                )
            self.wait_for_workers(self.n_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def _read_address(self, scheduler_file: Path) -> str:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                return json.loads(scheduler_file.read_text())["address"]
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                time.sleep(0.05)
        raise TimeoutError(f"the scheduler wrote no address within {START_TIMEOUT} s\n{self.logs()}")

    def _check_alive(self) -> None:
        dead = [(name, p.returncode) for name, p in self._procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"cluster process(es) exited: {dead}\n{self.logs()}")

    def wait_for_workers(self, n: int, *, timeout: float = START_TIMEOUT) -> None:
        """Block until the scheduler has ``n`` workers (polls the scheduler)."""
        from distributed import Client

        with Client(self.address, set_as_default=False, timeout=timeout) as client:
            deadline = time.monotonic() + timeout
            while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fewer than {n} workers after {timeout} s\n{self.logs()}")
                time.sleep(0.1)

    # ------------------------------------------------------------- stop
    def stop(self) -> None:
        """Terminate every process group started here (SIGTERM, then SIGKILL)."""
        for _, proc in reversed(self._procs):  # workers first, scheduler last
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT
        for _, proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # Kill whatever is left in the group (a worker whose nanny went first).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        for log in self._logs:
            log.close()
        self._procs, self._logs = [], []

    def kill_workers(self) -> None:
        """SIGKILL every worker with its nanny (each worker's process group): none comes back."""
        for name, proc in self._procs:
            if name.startswith("worker-") and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    def logs(self, tail: int = 3000) -> str:
        """The last ``tail`` characters of each process's log, for error messages."""
        out = []
        for path in sorted(self.directory.glob("*.log")):
            text = path.read_text(errors="replace")[-tail:]
            out.append(f"--- {path.name} ---\n{text}")
        return "\n".join(out)

    def __enter__(self) -> ProcessCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
