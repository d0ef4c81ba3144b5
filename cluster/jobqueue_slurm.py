"""Fit MCPCA to a store on a SLURM (or PBS) cluster with dask-jobqueue.

Run this on a login node (or in a small batch job) of the HPC system.  It
starts a Dask scheduler in this process, submits ``--jobs`` batch jobs that
each run ``--processes`` Dask workers, fits ``MCPCA`` to the store through
them, saves the model and cancels the jobs::

    pip install dask-jobqueue            # tested with 0.9.0; dask_mcpca installed too
    python cluster/jobqueue_slurm.py /scratch/me/survey.zarr \\
        --queue compute --account proj123 --jobs 4 --cores 8 --memory 32GiB \\
        --walltime 01:00:00 --output model.json

    python cluster/jobqueue_slurm.py STORE --dry-run   # print what it would run; start nothing

The store takes the options of ``dask-mcpca fit``: ``--dataset``,
``--variables a,b,c`` (the 1-D variables of an xarray store),
``--nan-policy``, ``--rows START:STOP``, ``--time START:STOP`` (or
``START/STOP`` for times holding colons) and ``--storage-option KEY=VALUE``.
It is opened here before any job is submitted, so that a store that cannot
be read is one line of error, not a queue of jobs.

The store must be on a file system that the login node and the compute nodes
see at the same path (Lustre, GPFS, NFS).  Every worker needs the same Python
environment.  With ``--prologue "source /path/to/venv/bin/activate"`` (or
``module load ...``) the workers run ``python`` as the prologue leaves it on
their ``PATH``; without a prologue they run this process's interpreter, by
its path here (right when the environment is on the shared file system).
``--python PATH`` names the workers' interpreter outright.

PBS/Torque: ``--system pbs`` uses ``dask_jobqueue.PBSCluster``; it takes the
same ``queue``, ``account``, ``cores``, ``memory``, ``processes``, ``walltime``,
``job_extra_directives`` and ``job_script_prologue``, plus ``resource_spec``
(e.g. ``"select=1:ncpus=8:mem=32GB"``) instead of SLURM's ``job_cpu``/``job_mem``.
``--system local`` runs the same job scripts as local processes
(``dask_jobqueue.LocalCluster``): a way to try the recipe without a batch system.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

PROG = "jobqueue_slurm.py"

try:
    from dask_mcpca._malloc import WORKER_ENV as MALLOC_ENV  # light: the package's names load on first use
except ImportError as err:  # run by an interpreter without the package: one line, not a traceback
    print(f"{PROG}: error: {sys.executable} cannot import dask_mcpca ({err}); install it there "
          f"({sys.executable} -m pip install dask-mcpca) or run this script with the interpreter that has it",
          file=sys.stderr)
    sys.exit(2)

#: How to install what the script imports beyond dask_mcpca, by the name Python imports.
INSTALL = {"dask_jobqueue": "dask-jobqueue", "distributed": "'dask[distributed]'"}


def _row_slice(text: str) -> slice:
    """``START:STOP`` (either may be left out) as a slice of row positions."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:STOP of row positions, got {text!r}") from None


def _label_slice(text: str) -> slice:
    """``START:STOP`` (or ``START/STOP`` for times holding colons) as a slice of labels."""
    start, sep, stop = text.partition("/") if "/" in text else text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected START:STOP or START/STOP, got {text!r}")
    return slice(start or None, stop or None)


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _parse(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="Zarr store or file.h5:/dataset on a shared file system")
    p.add_argument("--output", "-o", default="model.json", help="model file (dask_mcpca's JSON format)")
    p.add_argument("--n-components", type=int, default=None)
    p.add_argument("--solver", choices=["auto", "paper"], default="auto")
    # The store, as dask-mcpca fit takes it.
    p.add_argument("--dataset", default=None, help="array inside the store (needed when it holds several)")
    p.add_argument("--variables", type=lambda t: [v for v in t.split(",") if v], default=None, metavar="A,B,C",
                   help="1-D variables of an xarray store to use as the channels")
    p.add_argument("--nan-policy", choices=["raise", "omit", "partial"], default="raise")
    p.add_argument("--rows", type=_row_slice, default=None, metavar="START:STOP", help="rows to use, by position")
    p.add_argument("--time", type=_label_slice, default=None, metavar="START:STOP",
                   help="rows to use, by the row coordinate (xarray)")
    p.add_argument("--storage-option", type=_storage_option, action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec option for a URL store, e.g. endpoint_url=http://minio:9000 (repeatable)")
    # Batch-job shape: one job = `processes` workers sharing `cores` and `memory`.
    p.add_argument("--jobs", type=int, default=2, help="batch jobs to submit")
    p.add_argument("--cores", type=int, default=8, help="cores per job")
    p.add_argument("--processes", type=int, default=None,
                   help="worker processes per job (default: --cores, i.e. one thread per worker)")
    p.add_argument("--memory", default="32GiB", help="memory per job, shared by its workers")
    p.add_argument("--walltime", default="01:00:00")
    p.add_argument("--queue", default=None, help="partition (SLURM -p) / queue (PBS -q)")
    p.add_argument("--account", default=None, help="project to charge (SLURM -A / PBS -A)")
    p.add_argument("--interface", default=None, help="network interface of the workers, e.g. ib0")
    p.add_argument("--local-directory", default="${TMPDIR:-/tmp}", help="node-local spill directory")
    p.add_argument("--log-directory", default="dask-jobqueue-logs")
    p.add_argument("--directive", action="append", default=[], metavar="LINE",
                   help="extra #SBATCH/#PBS directive, e.g. --directive=--constraint=amd (repeatable)")
    p.add_argument("--prologue", action="append", default=[], metavar="CMD",
                   help="shell line run before the workers start (repeatable); the workers then run the "
                        "'python' it puts on PATH")
    p.add_argument("--python", default=None, metavar="PATH",
                   help="the workers' interpreter (default: 'python' after a --prologue, else this one's path)")
    p.add_argument("--system", choices=["slurm", "pbs", "local"], default="slurm",
                   help="batch system (local: run the jobs as processes here, for a trial)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would run (the cluster, the batch script, the fit) and exit; starts nothing")
    return p.parse_args(argv)


#: Set in every worker's environment: read-only HDF5 on a shared file system
#: needs no file locks, one BLAS thread per process (dask runs one task per
#: worker thread), and glibc's malloc as ``dask-mcpca fit`` sets it
#: (``dask_mcpca._malloc.WORKER_ENV``: each chunk read reuses the pages of the
#: one before; its last variable stops the nanny from setting its own trim
#: threshold).
WORKER_ENV = {
    "HDF5_USE_FILE_LOCKING": "FALSE",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    **MALLOC_ENV,
}


def worker_python(args) -> str:
    """The workers' interpreter: ``--python``; else ``python`` as a ``--prologue`` leaves it; else this one."""
    if args.python:
        return args.python
    return "python" if args.prologue else sys.executable


def cluster_kwargs(args) -> dict:
    """Keyword arguments of the dask-jobqueue cluster class that ``args.system`` names."""
    common = dict(
        cores=args.cores,
        processes=args.processes or args.cores,
        memory=args.memory,
        interface=args.interface,
        # Workers exit when the scheduler (this process) has been gone this
        # long, so an interrupted run does not leave jobs holding nodes.
        death_timeout=120,
        scheduler_options={"dashboard_address": ":8787"},
    )
    if args.system == "local":
        # Local "jobs" are plain subprocesses (no shell): they inherit this
        # process's environment, and the spill directory is the local tmp.
        return dict(common, local_directory=tempfile.gettempdir())
    return dict(
        common,
        python=worker_python(args),
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        local_directory=args.local_directory,
        log_directory=args.log_directory,
        job_extra_directives=args.directive,
        job_script_prologue=[*args.prologue, *(f"export {k}={shlex.quote(v)}" for k, v in WORKER_ENV.items())],
    )


def cluster_class(system: str):
    """The dask-jobqueue cluster class of ``--system`` (importing it starts nothing)."""
    from dask_jobqueue import PBSCluster, SLURMCluster
    from dask_jobqueue.local import LocalCluster

    return {"local": LocalCluster, "pbs": PBSCluster, "slurm": SLURMCluster}[system]


def missing_dependency(err: ImportError) -> str:
    """One line: what this interpreter cannot import, and how to install it."""
    name = (err.name or "dask_jobqueue").split(".")[0]
    package = INSTALL.get(name, name.replace("_", "-"))
    return (f"this script needs {package.strip(chr(39))}, which {sys.executable} cannot import ({err}); install it: "
            f"{sys.executable} -m pip install {package}")


def make_cluster(args):
    """The dask-jobqueue cluster object (starts a scheduler here; submits nothing yet)."""
    cls = cluster_class(args.system)
    if args.system == "local":
        os.environ.update(WORKER_ENV)  # the local "jobs" inherit it
    return cls(**cluster_kwargs(args))


def dry_run(args) -> str:
    """What a run would do, the batch script included, rendered without a scheduler (nothing started)."""
    kwargs = cluster_kwargs(args)
    n_workers = args.jobs * (args.processes or args.cores)
    lines = [f"# dry run: nothing started or submitted. {PROG} would open {args.store}, then start a scheduler "
             f"here and submit {args.jobs} {args.system} job(s) of {kwargs['processes']} worker process(es), "
             f"{args.cores} cores and {args.memory} each ({n_workers} workers), fit MCPCA(n_components="
             f"{args.n_components}, solver={args.solver!r}, nan_policy={args.nan_policy!r}) through them and "
             f"save the model to {args.output}."]
    try:
        cls = cluster_class(args.system)
    except ImportError as err:
        lines.append(f"# the batch script is written by dask-jobqueue: {missing_dependency(err)}")
        return "\n".join(lines)
    job_kwargs = {k: v for k, v in kwargs.items() if k != "scheduler_options"}  # the cluster's, not a job's
    job = cls.job_cls("tcp://<this host's address>:<the port the scheduler picks>", name="dummy-name", **job_kwargs)
    lines += [f"# each job ({cls.__name__}):", job.job_script()]
    return "\n".join(lines)


def open_store(args):
    """The store as ``dask-mcpca fit`` opens it: lazy, nothing read but metadata."""
    from dask_mcpca import open_archive

    return open_archive(args.store, dataset=args.dataset, variables=args.variables, rows=args.rows,
                        time=args.time, storage_options=dict(args.storage_option) or None)


def _as_typed(err: BaseException, args) -> str:
    """The error in one line; a selection that selects nothing named by the options as typed."""
    from dask_mcpca import SelectionError

    if isinstance(err, SelectionError):
        named = " with ".join(
            f"--{o} {'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}"
            for o, s in ((o, getattr(args, o)) for o in err.options)
        )
        reason = " ".join(err.reason.split())
        return f"{named} {reason}" if reason.startswith("select") else f"{named}: {reason}"
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    for name in ("variables", "nan_policy", "dataset"):  # the estimator's spelling, as the options are typed
        text = text.replace(f"{name}=", f"--{name.replace('_', '-')} ")
    return " ".join(text.split())


def main(argv=None) -> int:
    args = _parse(argv)
    if args.dry_run:
        print(dry_run(args))
        return 0

    from dask_mcpca import MCPCA, check_params

    model = MCPCA(args.n_components, solver=args.solver, nan_policy=args.nan_policy, progress=True)
    try:
        check_params(model)
        X = open_store(args)  # before any job is submitted: a store that cannot be read is one line
    except (ValueError, TypeError, KeyError, OSError) as err:
        print(f"{PROG}: error: {_as_typed(err, args)}", file=sys.stderr)
        return 2
    try:
        cluster_class(args.system)  # what is missing, in one line, before anything starts
        from distributed import Client
    except ImportError as err:
        print(f"{PROG}: error: {missing_dependency(err)}", file=sys.stderr)
        return 2

    n_workers = args.jobs * (args.processes or args.cores)
    try:
        with make_cluster(args) as cluster, Client(cluster) as client:
            cluster.scale(jobs=args.jobs)
            print(f"dashboard: {client.dashboard_link}; waiting for {n_workers} workers", file=sys.stderr)
            # Start as soon as a first job runs; later workers join the fit as they come.
            client.wait_for_workers(1, timeout=3600)
            started = time.perf_counter()
            model.fit(X)
            seconds = time.perf_counter() - started
            model.save(args.output, storage_options=dict(args.storage_option) or None)
    except (ValueError, OSError, TimeoutError) as err:
        print(f"{PROG}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(f"{model.n_passes_} passes in {seconds:.0f} s; model saved to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
