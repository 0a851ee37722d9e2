#!/usr/bin/env bash
# The core suite under a debug CPython with -X dev (tox -e debug; docs/testing.md).
#
# A debug build (Py_DEBUG) checks reference counts and the garbage collector's bookkeeping
# on every step: a C type that visits an object twice in tp_traverse, or drops a reference
# it does not own, aborts the interpreter with an assertion instead of corrupting memory
# silently. The C accelerator is built for that interpreter (its own extension suffix,
# .cpython-311d-...so, next to the release one in instrument/), and the tests run from the
# source tree with it.
#
# The debug interpreter has no packages of its own: it borrows the site-packages of a
# release Python of the same minor version (the one running this script: the tox env, or
# an activated venv). That works because the debug ABI is compatible with release
# extensions since CPython 3.8 and Debian's python3.11-dbg also loads the release
# extension suffix (importlib.machinery.EXTENSION_SUFFIXES), so torch, numpy and wrapt
# import as they are.
#
# Needs: apt-get install python3.11-dbg (it brings the debug headers; python3.11-dev for
# the release ones). Override the interpreter with DEBUG_PYTHON=..., the tests with
# arguments: tools/debug_cpython.sh tests/test_c_safety.py
set -euo pipefail
cd "$(dirname "$0")/.."

DEBUG_PYTHON=${DEBUG_PYTHON:-python3.11-dbg}
if ! command -v "$DEBUG_PYTHON" >/dev/null; then
    echo "debug_cpython.sh: $DEBUG_PYTHON not found (apt-get install python3.11-dbg)" >&2
    exit 2
fi
if ! "$DEBUG_PYTHON" -c 'import sys; sys.exit(not hasattr(sys, "gettotalrefcount"))'; then
    echo "debug_cpython.sh: $DEBUG_PYTHON is not a debug build (no sys.gettotalrefcount)" >&2
    exit 2
fi
release_version=$(python -c 'import sys; print(sys.version_info[:2])')
debug_version=$("$DEBUG_PYTHON" -c 'import sys; print(sys.version_info[:2])')
if [ "$release_version" != "$debug_version" ]; then
    echo "debug_cpython.sh: python is $release_version, $DEBUG_PYTHON is $debug_version:" \
        "run it from a release env of the same version" >&2
    exit 2
fi
site_packages=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
export PYTHONPATH="$PWD:$site_packages"
unset INSTRUMENT_NO_EXTENSIONS

# Build with the debug interpreter (setuptools from the release env: the system one may be
# too old for pyproject.toml); the build folder is its own, the extension lands in place.
"$DEBUG_PYTHON" setup.py -q build_ext --inplace --build-temp build/debug-cpython
"$DEBUG_PYTHON" -X dev -c '
import sys, sysconfig, instrument._native as n
built = n.speedups.__file__ if n.speedups else "no C accelerator"
assert built.endswith(sysconfig.get_config_var("EXT_SUFFIX")), f"not the debug build: {built}"
print(sys.version.split()[0], "debug build, C accelerator:", built)'

# The core suite: the hot path on both of its implementations, the reports built from it,
# and the C-specific safety, stress and sub-interpreter tests.
core=(
    tests/test_c_safety.py
    tests/test_c_stress.py
    tests/test_subinterpreter.py
    tests/test_native.py
    tests/test_region.py
    tests/test_registry.py
    tests/test_open_regions.py
    tests/test_concurrent_spans.py
    tests/test_property.py
    tests/test_stats.py
    tests/test_report.py
    tests/test_reporter.py
    tests/test_cuda_seam.py
    tests/test_auto.py
    tests/test_stepcounter.py
    tests/test_step_guard.py
    tests/test_backward_call.py
)
if [ $# -gt 0 ]; then
    core=("$@")
fi
# Deselected: its 60 s limit on a subprocess that imports torch, which a debug interpreter
# with -X dev can exceed on a loaded machine (it checks an environment variable, no C).
exec "$DEBUG_PYTHON" -X dev -m pytest -q -p no:randomly -o timeout=600 -m "slow or not slow" \
    --deselect tests/test_native.py::test_pure_python_path_is_selected_by_the_environment_variable \
    "${core[@]}"
