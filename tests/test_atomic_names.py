"""Temporaries carry their writer's pid and host; who is alive is decided by this host's rules (issue 23).

Real files and real processes: a sleeping child is a live writer, a reaped one a dead writer, and a
temporary named with another host is judged by its age (set with ``os.utime``), never by this
host's process table.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from dask_mcpca._atomic import FOREIGN_TEMPORARY_AGE, atomic_open, recover, stale_temporaries

#: What a temporary of ``model.json`` written by this process looks like (the module docstring's format).
THIS_HOST = socket.gethostname()


@pytest.fixture()
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture()
def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: no process has this pid until the OS hands it out again
    return proc.pid


def _touch(path, age: float = 0.0):
    path.write_bytes(b"partial")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_a_temporary_names_its_pid_and_host(tmp_path):
    target = tmp_path / "model.json"
    seen = []
    with atomic_open(target, "w") as f:
        seen = [n for n in os.listdir(tmp_path) if n != "model.json"]
        f.write("{}")
    assert len(seen) == 1, seen
    match = re.fullmatch(r"\.model\.json\.[0-9a-f]{8}-(\d+)@(.+)\.tmp", seen[0])
    assert match is not None, seen[0]
    assert int(match.group(1)) == os.getpid()
    assert match.group(2) == re.sub(r"[^A-Za-z0-9._-]", "_", THIS_HOST)
    assert os.listdir(tmp_path) == ["model.json"] and target.read_text() == "{}"


def test_this_hosts_temporaries_follow_the_process_table(tmp_path, sleeper, dead_pid):
    host = re.sub(r"[^A-Za-z0-9._-]", "_", THIS_HOST)
    live = _touch(tmp_path / f".model.json.0badf00d-{sleeper.pid}@{host}.tmp")
    dead = _touch(tmp_path / f".model.json.0badf00e-{dead_pid}@{host}.tmp")
    assert stale_temporaries(tmp_path / "model.json") == [str(dead)]
    assert sleeper.poll() is None  # asking whether it runs did not stop it
    recover(tmp_path / "model.json")
    assert live.exists() and not dead.exists()


def test_another_hosts_temporaries_are_alive_until_old(tmp_path, dead_pid):
    other = "other-node.cluster"
    assert other != THIS_HOST
    fresh = _touch(tmp_path / f".model.json.0badf00d-{dead_pid}@{other}.tmp", age=60)
    old = _touch(tmp_path / f".model.json.0badf00e-{dead_pid}@{other}.tmp", age=FOREIGN_TEMPORARY_AGE + 3600)
    # the pid is dead here, but it names a process of the other host: only the age counts
    assert stale_temporaries(tmp_path / "model.json") == [str(old)]
    recover(tmp_path / "model.json")
    assert fresh.exists() and not old.exists()


def test_a_stores_old_copy_of_another_host_is_not_restored_while_fresh(tmp_path, dead_pid):
    """A store moved aside by a writer on another host (``.old``) is that writer's until it is old."""
    other = "other-node.cluster"
    aside = tmp_path / f".scores.zarr.0badf00d-{dead_pid}@{other}.tmp.old"
    aside.mkdir()
    assert stale_temporaries(tmp_path / "scores.zarr") == []
    recover(tmp_path / "scores.zarr")
    assert aside.is_dir() and not (tmp_path / "scores.zarr").exists()
