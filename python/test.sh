#!/usr/bin/env bash
# The Python half of the test command, run as a user who installs the wheel:
#
# 1. builds the abi3 wheel (`maturin build --release`, maturin pinned in
#    requirements-build.txt, from a venv of its own under
#    python/target/build-venv) into python/target/tested-wheel, emptied
#    first (the wheel stays there after the run);
# 2. makes python/.venv afresh (gitignored, removed and made again each run)
#    and installs the pinned test dependencies (requirements-test.txt);
# 3. installs the wheel file into it, from no index and binaries only, so
#    that pip can neither build spillbuffer from source nor fetch another
#    one;
# 4. runs pytest against the installed package.
#
# Steps 2 to 4 run with no Rust toolchain on PATH (checked): the venv's bin,
# /usr/bin and /bin only. Extra arguments go to pytest. PYTHON picks the
# interpreter both venvs are made from (default: python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"

# 1. The wheel.
build="$here/target/build-venv"
if [ ! -x "$build/bin/python" ]; then
    "$python" -m venv "$build"
fi
"$build/bin/python" -m pip install --quiet -r "$here/requirements-build.txt"
out="$here/target/tested-wheel"
rm -rf "$out"
(cd "$here" && "$build/bin/maturin" build --release --out "$out")
shopt -s nullglob
wheels=("$out"/*.whl)
shopt -u nullglob
if [ "${#wheels[@]}" -ne 1 ]; then
    echo "python/test.sh: maturin made ${#wheels[@]} wheels in $out, not one" >&2
    exit 1
fi
wheel="${wheels[0]}"

# 2. A fresh venv, without Rust.
venv="$here/.venv"
rm -rf "$venv"
"$python" -m venv "$venv"
py="$venv/bin/python"
norust=(env -u CARGO_HOME -u RUSTUP_HOME -u CARGO -u RUSTC -u PYTHONPATH -u PYTHONHOME
    VIRTUAL_ENV="$venv" PATH="$venv/bin:/usr/bin:/bin")
found="$("${norust[@]}" sh -c 'for t in cargo rustc maturin; do command -v "$t"; done' || true)"
if [ -n "$found" ]; then
    echo "python/test.sh: Rust tools are on the install step's PATH:" $found >&2
    exit 1
fi
"${norust[@]}" "$py" -m pip install --quiet --upgrade pip
"${norust[@]}" "$py" -m pip install --quiet -r "$here/requirements-test.txt"

# 3. The wheel, by its path only.
"${norust[@]}" "$py" -m pip install --quiet --no-index --no-deps --only-binary :all: "$wheel"

# 4. pytest, from the tests' directory's parent's parent, so that the
# installed package is imported, not the source tree's (checked).
cd "$here/.."
"${norust[@]}" "$py" - "$(basename "$wheel")" <<'PY'
import os, sys
import spillbuffer._native as native
where = os.path.realpath(native.__file__)
assert where.startswith(os.path.realpath(sys.prefix) + os.sep), f"imported {where}, not the venv's"
print(f"python/test.sh: testing {sys.argv[1]} on Python {sys.version.split()[0]} ({where})")
PY
set +e
# A hung test (a cluster that never shuts down) must fail the run, not
# stall it: the whole suite takes a few minutes.
"${norust[@]}" timeout --kill-after=30 1800 "$venv/bin/pytest" -p no:cacheprovider -ra "$here/tests" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "python/test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
