#!/usr/bin/env bash
# Start or stop a Dask cluster by hand: one scheduler here, workers on one or
# more hosts (localhost by default, others over ssh).  The scheduler address
# is printed on stdout (the last line) and kept in $DIR/address.
#
#   cluster/start-cluster.sh start [options]      # prints tcp://HOST:PORT
#   cluster/start-cluster.sh status [-d DIR]
#   cluster/start-cluster.sh stop   [-d DIR]
#
# Options of start (defaults in brackets):
#   -H, --hosts H1,H2,...     hosts that run workers [localhost]; a host other
#                             than localhost/127.0.0.1 is reached with ssh and
#                             must have the same Python environment and see
#                             the data and DIR at the same paths
#   -n, --workers N           worker processes per host [1]
#   -t, --nthreads N          threads per worker process [1]
#   -m, --memory-limit SIZE   memory limit per worker process, e.g. 4GiB [auto]
#   -p, --port PORT           scheduler port; 0 picks a free one [8786]
#   -s, --scheduler-host H    address the scheduler binds to and workers dial
#                             [127.0.0.1 if every host is local, else $(hostname)]
#       --dashboard ADDR|none scheduler dashboard address [:8787]
#       --timeout SECONDS     how long to wait for all workers [60]
#   -d, --dir DIR             state directory: pid files, logs, scheduler file
#                             [$DASK_CLUSTER_DIR or ./.dask-cluster]
#       --dry-run             print the commands start would run; start nothing
# Environment: PYTHON (interpreter with dask_mcpca installed) [python3].
set -euo pipefail

PYTHON=${PYTHON:-python3}
DIR=${DASK_CLUSTER_DIR:-$PWD/.dask-cluster}
HOSTS=localhost
WORKERS=1
NTHREADS=1
MEMORY=auto
PORT=8786
SCHED_HOST=
DASHBOARD=:8787
TIMEOUT=60
DRY_RUN=0

# The workers' glibc malloc, as `dask-mcpca fit` sets it for its own process
# (dask_mcpca/_malloc.py, WORKER_ENV; docs/performance.md): each chunk read
# reuses the pages of the one before instead of mapping and faulting in fresh
# ones (a fit on 2 workers 1.8x as fast, 62 MiB more per worker).  The nanny
# would give its worker its own MALLOC_TRIM_THRESHOLD_, hence the last one.
WORKER_ENV=(
    MALLOC_ARENA_MAX=1
    MALLOC_MMAP_MAX_=0
    MALLOC_TRIM_THRESHOLD_=2147483647
    "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON={'MALLOC_TRIM_THRESHOLD_': 2147483647, 'OMP_NUM_THREADS': 1, 'MKL_NUM_THREADS': 1, 'OPENBLAS_NUM_THREADS': 1}"
)

die() { echo "start-cluster.sh: $*" >&2; exit 1; }
say() { echo "$*" >&2; }
usage() { sed -n '2,27s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }

is_local() { [[ $1 == localhost || $1 == 127.0.0.1 || $1 == "$(hostname)" ]]; }
# A pid that runs (a zombie left to a parent that does not reap it counts as gone).
alive() { kill -0 "$1" 2>/dev/null && [[ $(ps -o stat= -p "$1" 2>/dev/null) != Z* ]]; }

cmd=${1:-}
case $cmd in
    start|stop|status) shift ;;
    -h|--help|help) usage 0 ;;
    "") usage ;;
    *) die "unknown command $cmd (start, status or stop; see --help)" ;;
esac
while [[ $# -gt 0 ]]; do
    case $1 in  # an option without its value: one line, not bash's "unbound variable"
        -H|--hosts|-n|--workers|-t|--nthreads|-m|--memory-limit|-p|--port|-s|--scheduler-host|--dashboard|--timeout|-d|--dir)
            [[ $# -ge 2 ]] || die "$1 needs a value (see --help)" ;;
    esac
    case $1 in
        -H|--hosts) HOSTS=$2; shift 2 ;;
        -n|--workers) WORKERS=$2; shift 2 ;;
        -t|--nthreads) NTHREADS=$2; shift 2 ;;
        -m|--memory-limit) MEMORY=$2; shift 2 ;;
        -p|--port) PORT=$2; shift 2 ;;
        -s|--scheduler-host) SCHED_HOST=$2; shift 2 ;;
        --dashboard) DASHBOARD=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        -d|--dir) DIR=$2; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $DRY_RUN == 0 || $cmd == start ]] || die "--dry-run goes with start only"

# The interpreter and its distributed, or one line saying how to get them (not a Python traceback).
need_distributed() {
    command -v "$PYTHON" >/dev/null 2>&1 \
        || die "no $PYTHON on PATH: set PYTHON to the interpreter that has dask_mcpca installed (PYTHON=/path/to/venv/bin/python)"
    "$PYTHON" -c 'import distributed' >/dev/null 2>&1 \
        || die "$PYTHON ($(command -v "$PYTHON")) cannot import distributed: install it there ($PYTHON -m pip install 'dask[distributed]'; installing dask_mcpca brings it) or set PYTHON to the interpreter that has it"
}

if [[ $cmd == start && $DRY_RUN == 0 ]]; then
    need_distributed
    mkdir -p "$DIR"
fi
if [[ ! -d $DIR && $DRY_RUN == 0 ]]; then
    [[ $cmd == stop ]] && { say "nothing was started from $DIR"; exit 0; }
    die "no state directory $DIR (nothing was started from it)"
fi
[[ -d $DIR ]] && DIR=$(cd "$DIR" && pwd)
IFS=, read -r -a HOST_LIST <<< "$HOSTS"

# Start a command detached from this shell (own session where setsid exists),
# logging to $2; print its pid.
spawn() {
    local log=$1; shift
    if command -v setsid >/dev/null; then
        setsid nohup "$@" >"$log" 2>&1 </dev/null &
    else
        nohup "$@" >"$log" 2>&1 </dev/null &
    fi
    echo $!
}

# What start would run, one command a line (the port 0 picks is known only once the scheduler runs).
dry_run() {
    local address="tcp://$SCHED_HOST:$PORT" h
    [[ $PORT == 0 ]] && address="tcp://$SCHED_HOST:<the port the scheduler picks>"
    echo "# dry run: nothing started; start would run, with $DIR as its state directory:"
    printf '%q ' "$PYTHON" -m distributed.cli.dask_scheduler --host "$SCHED_HOST" --port "$PORT" "$@" \
        --scheduler-file "$DIR/scheduler.json"; echo
    local wargs=("$address" --nworkers "$WORKERS" --nthreads "$NTHREADS" --memory-limit "$MEMORY" --nanny)
    [[ $SCHED_HOST == 127.0.0.1 || $SCHED_HOST == localhost ]] && wargs+=(--host 127.0.0.1)
    for h in "${HOST_LIST[@]}"; do
        is_local "$h" || printf 'ssh %q ' "$h"
        printf '%q ' env "${WORKER_ENV[@]}" "$PYTHON" -m distributed.cli.dask_worker "${wargs[@]}" \
            --local-directory "$DIR/work-$h"; echo
    done
    echo "# then wait up to ${TIMEOUT}s for $(( ${#HOST_LIST[@]} * WORKERS )) workers and print the address"
}

start() {
    if [[ -f $DIR/scheduler.pid ]] && alive "$(cat "$DIR/scheduler.pid")"; then
        die "a scheduler started from $DIR is running ($(cat "$DIR/address" 2>/dev/null)); stop it first"
    fi
    if [[ -z $SCHED_HOST ]]; then
        SCHED_HOST=127.0.0.1
        for h in "${HOST_LIST[@]}"; do is_local "$h" || SCHED_HOST=$(hostname); done
    fi
    local dash=(--dashboard-address "$DASHBOARD")
    [[ $DASHBOARD == none ]] && dash=(--no-dashboard)
    if [[ $DRY_RUN == 1 ]]; then dry_run "${dash[@]}"; return; fi
    rm -f "$DIR/scheduler.json" "$DIR/address" "$DIR"/worker-*.pid

    spawn "$DIR/scheduler.log" "$PYTHON" -m distributed.cli.dask_scheduler \
        --host "$SCHED_HOST" --port "$PORT" "${dash[@]}" \
        --scheduler-file "$DIR/scheduler.json" >"$DIR/scheduler.pid"
    local waited=0
    until [[ -s $DIR/scheduler.json ]]; do
        alive "$(cat "$DIR/scheduler.pid")" || { tail -n 20 "$DIR/scheduler.log" >&2; die "the scheduler exited"; }
        (( waited++ < TIMEOUT * 5 )) || die "no scheduler file after ${TIMEOUT}s (see $DIR/scheduler.log)"
        sleep 0.2
    done
    sleep 0.2  # the file is written in one go, but be safe
    local address
    address=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$DIR/scheduler.json")
    echo "$address" >"$DIR/address"
    say "scheduler at $address (log: $DIR/scheduler.log)"

    local wargs=("$address" --nworkers "$WORKERS" --nthreads "$NTHREADS" --memory-limit "$MEMORY" --nanny)
    [[ $SCHED_HOST == 127.0.0.1 || $SCHED_HOST == localhost ]] && wargs+=(--host 127.0.0.1)
    for h in "${HOST_LIST[@]}"; do
        if is_local "$h"; then
            spawn "$DIR/worker-$h.log" env "${WORKER_ENV[@]}" "$PYTHON" -m distributed.cli.dask_worker "${wargs[@]}" \
                --local-directory "$DIR/work-$h" >"$DIR/worker-$h.pid"
        else
            # The remote shell starts the worker in the background and echoes its pid.
            ssh -n -o BatchMode=yes "$h" "mkdir -p '$DIR' && cd '$DIR' && \
                nohup env $(printf '%q ' "${WORKER_ENV[@]}")$PYTHON -m distributed.cli.dask_worker ${wargs[*]} \
                --local-directory '$DIR/work-$h' \
                >'$DIR/worker-$h.log' 2>&1 </dev/null & echo \$!" >"$DIR/worker-$h.pid" \
                || die "ssh $h failed"
        fi
        say "workers on $h: pid $(cat "$DIR/worker-$h.pid") (log: $DIR/worker-$h.log)"
    done

    local total=$(( ${#HOST_LIST[@]} * WORKERS ))
    "$PYTHON" - "$address" "$total" "$TIMEOUT" <<'EOF' || die "fewer workers than expected; see the logs in $DIR"
import sys
from distributed import Client
address, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with Client(address, timeout=timeout) as client:
    client.wait_for_workers(n, timeout=timeout)
    print(f"{n} workers connected", file=sys.stderr)
EOF
    echo "$address"
}

# Send SIGTERM to a local pid (and its process group), wait, then SIGKILL.
stop_local() {
    local pid=$1 i
    alive "$pid" || return 0
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do alive "$pid" || return 0; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

stop() {
    local f h pid
    for f in "$DIR"/worker-*.pid; do
        [[ -e $f ]] || continue
        h=${f##*/worker-}; h=${h%.pid}; pid=$(cat "$f")
        if is_local "$h"; then
            stop_local "$pid"
        else
            ssh -n -o BatchMode=yes "$h" "kill -TERM $pid" 2>/dev/null || say "could not reach $h to stop pid $pid"
        fi
        rm -f "$f"
        say "stopped workers on $h"
    done
    if [[ -f $DIR/scheduler.pid ]]; then
        stop_local "$(cat "$DIR/scheduler.pid")"
        rm -f "$DIR/scheduler.pid" "$DIR/scheduler.json" "$DIR/address"
        say "stopped the scheduler"
    fi
}

status() {
    [[ -f $DIR/scheduler.pid ]] && alive "$(cat "$DIR/scheduler.pid")" || { say "not running ($DIR)"; return 1; }
    need_distributed
    local address
    address=$(cat "$DIR/address")
    "$PYTHON" - "$address" <<'EOF'
import sys
from distributed import Client
with Client(sys.argv[1], timeout=10) as client:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    print(f"{sys.argv[1]}: {len(workers)} workers, "
          f"{sum(w['nthreads'] for w in workers.values())} threads", file=sys.stderr)
EOF
    echo "$address"
}

case $cmd in
    start) start ;;
    stop) stop ;;
    status) status ;;
esac
