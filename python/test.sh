#!/usr/bin/env bash
# The Python half of the test command: builds the package (maturin, through
# pip) into a virtual environment under python/.venv (gitignored), installs
# the pinned test dependencies and runs pytest. Extra arguments go to pytest.
# PYTHON picks the interpreter the venv is made from (default: python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet -r "$here/requirements-test.txt"
"$py" -m pip install --quiet "$here"
# From the tests' directory's parent's parent, so that the installed package
# is imported, not the source tree's.
cd "$here/.."
set +e
# A hung test (a cluster that never shuts down) must fail the run, not
# stall it: the whole suite takes a few minutes.
timeout --kill-after=30 1800 "$venv/bin/pytest" -p no:cacheprovider -ra "$here/tests" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "python/test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
