#!/usr/bin/env bash
# Run distributed's own tests of the worker's memory management, metrics
# and Prometheus exporter against spillbuffer's mapping.
#
#   python/distributed-suite/run.sh DISTRIBUTED_CHECKOUT [pytest args...]
#
# DISTRIBUTED_CHECKOUT is a clone of https://github.com/dask/distributed at
# the version installed next to spillbuffer (the tests are not in its
# wheel). Uses python/.venv (made by python/test.sh) unless PYTHON names
# another interpreter; installs the tests' extra dependencies into it.
# SPILLBUFFER_PATCH=0 runs the same tests against distributed's own mapping.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ $# -lt 1 ] || [ ! -f "$1/distributed/tests/test_worker_memory.py" ]; then
    echo "usage: $0 DISTRIBUTED_CHECKOUT [pytest args...]" >&2
    echo "  (a clone of dask/distributed with distributed/tests/test_worker_memory.py)" >&2
    exit 2
fi
checkout="$(cd "$1" && pwd)"
shift
py="${PYTHON:-$here/../.venv/bin/python}"
"$py" -m pip install --quiet prometheus_client aiohttp pytest-timeout pytest-rerunfailures
cd "$checkout"
PYTHONPATH="$here:$checkout${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest \
    -p spillbuffer_patch -o addopts= --runslow --timeout=180 -rs \
    distributed/tests/test_worker_memory.py \
    distributed/tests/test_worker_metrics.py \
    distributed/http/worker/tests/test_worker_http.py "$@"
