"""Progress lines per pass: numpy, local dask and distributed input, read from stderr."""

import io
import re
import sys

import dask
import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA, _passes, _progress

N_ROWS, N_FEATURES, BLOCK_ROWS = 4000, 4, 500
N_BLOCKS = N_ROWS // BLOCK_ROWS

#: "pass   3  robust step 2   [####---]  5/8 blocks   1.2 M rows/s"
LINE = re.compile(r"pass +(\d+)  (.+?) +\[([#-]+)\] +(\d+)/(\d+) blocks +[\d.]+ (?:[kMG] )?rows/s")

INPUTS = ["numpy", "dask-threads", "dask-sync", "distributed"]


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_ROWS, N_FEATURES)) * [3.0, 2.0, 1.0, 0.5]
    X[:100] = rng.normal(scale=20.0, size=(100, N_FEATURES))
    return X


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, so every redraw is kept."""

    def isatty(self):
        return True


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster, distributed.Client(cluster, set_as_default=False) as c:
        yield c


@pytest.fixture
def run_fit(request, monkeypatch):
    """Fit with progress on the named input kind; return (model, stderr text)."""

    def run(kind, *, stream=None, progress=True):
        monkeypatch.setattr(_passes, "NUMPY_BLOCK_ROWS", BLOCK_ROWS)
        if stream is not None:
            monkeypatch.setattr(sys, "stderr", stream)
        X = _data()
        model = MCPCA(progress=progress)
        if kind == "numpy":
            model.fit(X)
        elif kind == "distributed":
            client = request.getfixturevalue("client")
            with dask.config.set(scheduler=client):
                model.fit(da.from_array(X, chunks=(BLOCK_ROWS, N_FEATURES)))
        else:
            scheduler = {"dask-threads": "threads", "dask-sync": "synchronous"}[kind]
            with dask.config.set(scheduler=scheduler):
                model.fit(da.from_array(X, chunks=(BLOCK_ROWS, N_FEATURES)))
        return model

    return run


@pytest.mark.parametrize("kind", INPUTS)
def test_one_finished_line_per_pass(kind, run_fit, capsys):
    model = run_fit(kind)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "\r" not in err  # not a terminal: finished lines only
    assert len(lines) == model.n_passes_ >= 2
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [int(m[1]) for m in parsed] == list(range(1, model.n_passes_ + 1))
    assert parsed[0][2] == "moments"
    assert [m[2] for m in parsed[1:]] == [f"robust step {i}" for i in range(1, model.n_passes_)]
    assert all(m[3] == "#" * 30 and m[4] == m[5] == str(N_BLOCKS) for m in parsed)
    assert all(line.endswith(" s") for line in lines)  # the pass's time


@pytest.mark.parametrize("kind", INPUTS)
def test_terminal_shows_every_block_as_it_finishes(kind, run_fit, monkeypatch):
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 0.0)
    terminal = _Terminal()
    model = run_fit(kind, stream=terminal)
    draws = [d for d in terminal.getvalue().replace("\n", "\r").split("\r") if d]
    per_pass = {}
    for d in draws:
        m = LINE.match(d)
        assert m, d
        assert int(m[5]) == N_BLOCKS
        per_pass.setdefault(int(m[1]), []).append(int(m[4]))
    assert sorted(per_pass) == list(range(1, model.n_passes_ + 1))
    for counts in per_pass.values():
        # Drawn at the start, after each of the 8 blocks, and once finished.
        assert counts == list(range(N_BLOCKS + 1)) + [N_BLOCKS]
    assert terminal.getvalue().count("\n") == model.n_passes_


@pytest.mark.parametrize("kind", INPUTS)
def test_disabled_progress_writes_nothing_and_changes_nothing(kind, run_fit, capsys):
    quiet = run_fit(kind, progress=False)
    assert capsys.readouterr().err == ""
    loud = run_fit(kind, progress=True)
    capsys.readouterr()
    # The counting route (callback, futures) must not change the result.
    assert np.array_equal(quiet.components_, loud.components_)
    assert np.array_equal(quiet.explained_variance_, loud.explained_variance_)
    assert quiet.n_passes_ == loud.n_passes_


def test_distributed_bar_counts_futures_not_a_local_callback(run_fit, client, monkeypatch):
    # On a distributed client, local dask callbacks never fire: the bar must
    # come from the futures.  Check the route by counting both.
    calls = {"posttask": 0}
    original = _progress.PassProgress._posttask

    def counting(self, *args):
        calls["posttask"] += 1
        return original(self, *args)

    monkeypatch.setattr(_progress.PassProgress, "_posttask", counting)
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 0.0)
    terminal = _Terminal()
    model = run_fit("distributed", stream=terminal)
    assert calls["posttask"] == 0
    assert terminal.getvalue().count(f" 1/{N_BLOCKS} blocks") == model.n_passes_


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_distributed_bar_lets_each_block_result_go_once_counted(client):
    """The bar counts the blocks' futures; a future held to the end of the pass pins that block's
    statistics in a worker's memory (a p x p matrix each: gigabytes over a thousand blocks at
    p = 1000).  The scheduler's own transitions count the block results in memory at once."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    class Held(SchedulerPlugin):
        def __init__(self):
            self.now = self.most = 0

        def transition(self, key, start, finish, *args, **kwargs):
            if not str(key[0] if isinstance(key, tuple) else key).startswith("_block_task"):
                return
            self.now += (finish == "memory") - (start == "memory")
            self.most = max(self.most, self.now)

    blocks = 64
    X = np.random.default_rng(0).normal(size=(blocks * 200, 6))
    held = {}
    for progress in (False, True):
        plugin = Held()
        client.cluster.scheduler.add_plugin(plugin, name="held-blocks")
        try:
            with dask.config.set(scheduler=client):
                MCPCA(progress=progress).fit(da.from_array(X, chunks=(200, 6)))
        finally:
            client.cluster.scheduler.remove_plugin(name="held-blocks")
        held[progress] = plugin.most
    assert 0 < held[False] <= blocks // 4
    assert held[True] <= blocks // 4, held  # all 64 while the bar held every future


def test_rate_units():
    assert _progress._rate(3_400_000).strip() == "3.4 M rows/s"
    assert _progress._rate(12_500).strip() == "12.5 k rows/s"
    assert _progress._rate(950).strip() == "950 rows/s"


class _Future:
    """A stand-in for a ``distributed.Future`` with a fixed status."""

    def __init__(self, status, value=None):
        self.status, self.value = status, value

    def release(self):
        pass

    def result(self):
        if self.status != "finished":
            raise RuntimeError("the pass was cancelled: its workers were lost")
        return self.value


class _Client:
    """A stand-in for a ``distributed.Client`` whose pass ends as ``statuses`` say."""

    loop = None

    def __init__(self, final, statuses):
        self.final, self.statuses = final, statuses

    def compute(self, collections):
        return [self.final] + [_Future(s) for s in self.statuses]


@pytest.mark.parametrize("live", [False, True])
def test_cancelled_blocks_are_not_counted_and_a_failed_pass_is_marked(monkeypatch, live):
    """distributed.as_completed yields the futures cancelled when the workers die; each
    counted as a finished block drew a failed pass as 8/8 before its error (review 7)."""
    pytest.importorskip("distributed")
    import distributed

    statuses = ["finished"] * 3 + ["cancelled"] * (N_BLOCKS - 3)
    client = _Client(_Future("cancelled"), statuses)
    monkeypatch.setattr(_progress, "_active_client", lambda: client)
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(futures))
    stream = _Terminal() if live else io.StringIO()
    runner = type("Runner", (), {"n_rows": N_ROWS, "n_blocks": N_BLOCKS, "n_passes": 1})()
    with pytest.raises(RuntimeError, match="cancelled"):
        with _progress.PassProgress(runner, "robust step 1", stream=stream) as bar:
            bar.compute(None, blocks=[None] * N_BLOCKS)
    last = stream.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    m = LINE.match(last)
    assert m and (m[4], m[5]) == ("3", str(N_BLOCKS)), last
    assert "interrupted" in last
    assert stream.getvalue().endswith("\n")


def test_a_finished_distributed_pass_counts_every_block_unmarked(monkeypatch):
    pytest.importorskip("distributed")
    import distributed

    client = _Client(_Future("finished", 42), ["finished"] * N_BLOCKS)
    monkeypatch.setattr(_progress, "_active_client", lambda: client)
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(futures))
    stream = io.StringIO()
    runner = type("Runner", (), {"n_rows": N_ROWS, "n_blocks": N_BLOCKS, "n_passes": 0})()
    with _progress.PassProgress(runner, "moments", stream=stream) as bar:
        assert bar.compute(None, blocks=[None] * N_BLOCKS) == 42
    m = LINE.match(stream.getvalue())
    assert m and m[4] == m[5] == str(N_BLOCKS)
    assert "interrupted" not in stream.getvalue()
