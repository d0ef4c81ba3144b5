"""Fit MCPCA to a store on a SLURM (or PBS) cluster with dask-jobqueue.

Run this on a login node (or in a small batch job) of the HPC system.  It
starts a Dask scheduler in this process, submits ``--jobs`` batch jobs that
each run ``--processes`` Dask workers, fits ``MCPCA`` to the store through
them, saves the model and cancels the jobs::

    pip install dask-jobqueue            # tested with 0.9.0; dask_mcpca installed too
    python cluster/jobqueue_slurm.py /scratch/me/survey.zarr \\
        --queue compute --account proj123 --jobs 4 --cores 8 --memory 32GiB \\
        --walltime 01:00:00 --output model.json

    python cluster/jobqueue_slurm.py STORE --dry-run   # print the job script only

The store must be on a file system that the login node and the compute nodes
see at the same path (Lustre, GPFS, NFS).  Every worker needs the same Python
environment: activate it with ``--prologue "source /path/to/venv/bin/activate"``
(or ``module load ...``), or run this script from that environment so that
``python=sys.executable`` points at it.

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
import sys
import tempfile
import time


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="Zarr store or file.h5:/dataset on a shared file system")
    p.add_argument("--output", default="model.json", help="model file (dask_mcpca's JSON format)")
    p.add_argument("--n-components", type=int, default=None)
    p.add_argument("--solver", choices=["auto", "paper"], default="auto")
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
                   help="shell line run before the workers start (repeatable)")
    p.add_argument("--system", choices=["slurm", "pbs", "local"], default="slurm",
                   help="batch system (local: run the jobs as processes here, for a trial)")
    p.add_argument("--dry-run", action="store_true", help="print the batch script and exit")
    return p.parse_args(argv)


#: Set in every worker's environment: read-only HDF5 on a shared file system
#: needs no file locks, and one BLAS thread per process (dask runs one task
#: per worker thread).
WORKER_ENV = {
    "HDF5_USE_FILE_LOCKING": "FALSE",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def make_cluster(args):
    """The dask-jobqueue cluster object (starts a scheduler here; submits nothing yet)."""
    from dask_jobqueue import PBSCluster, SLURMCluster
    from dask_jobqueue.local import LocalCluster

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
        os.environ.update(WORKER_ENV)
        return LocalCluster(**common, local_directory=tempfile.gettempdir())
    cls = PBSCluster if args.system == "pbs" else SLURMCluster
    return cls(
        **common,
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        local_directory=args.local_directory,
        log_directory=args.log_directory,
        job_extra_directives=args.directive,
        job_script_prologue=[*args.prologue, *(f"export {k}={v}" for k, v in WORKER_ENV.items())],
    )


def main(argv=None) -> int:
    args = _parse(argv)
    cluster = make_cluster(args)
    if args.dry_run:
        print(cluster.job_script())
        cluster.close()
        return 0

    from distributed import Client

    from dask_mcpca import MCPCA

    n_workers = args.jobs * (args.processes or args.cores)
    with cluster, Client(cluster) as client:
        cluster.scale(jobs=args.jobs)
        print(f"dashboard: {client.dashboard_link}; waiting for {n_workers} workers", file=sys.stderr)
        # Start as soon as a first job runs; later workers join the fit as they come.
        client.wait_for_workers(1, timeout=3600)
        started = time.perf_counter()
        model = MCPCA(args.n_components, solver=args.solver, progress=True).fit(args.store)
        seconds = time.perf_counter() - started
        model.save(args.output)
    print(f"{model.n_passes_} passes in {seconds:.0f} s; model saved to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
