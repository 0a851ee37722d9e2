#!/usr/bin/env bash
# The distribution as a user gets it: build the sdist and the wheel, check their metadata,
# install the WHEEL (not the checkout) into a fresh venv, run the README demo and the test
# suite from a copy of the tests; then install the sdist once with a C compiler (the
# accelerator is built) and once without one (pure Python). Run by `tox -e dist`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
python=${PYTHON:-python3}
echo "== building in $work"
"$python" -m build --outdir "$work/dist" "$root"
"$python" -m twine check --strict "$work"/dist/*
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
tar -tzf "$sdist" | grep -qE '^[^/]+/LICENSE$' || { echo "LICENSE is not in the sdist"; exit 1; }
"$python" -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist()
assert any(n.endswith('.dist-info/licenses/LICENSE') for n in names), 'LICENSE is not in the wheel'" "$wheel"

fresh_venv() {  # fresh_venv DIR: a venv with the pinned CPU torch
    "$python" -m venv "$1"
    "$1/bin/pip" install -q torch==2.13.0 numpy
}

echo "== wheel: installed beside torch, which stays in place; demo and test suite"
fresh_venv "$work/wheel"
before=$("$work/wheel/bin/pip" freeze | grep -i '^torch==')
"$work/wheel/bin/pip" install -q "$wheel[dev]"
after=$("$work/wheel/bin/pip" freeze | grep -i '^torch==')
[ "$before" = "$after" ] || { echo "installing the wheel replaced $before by $after"; exit 1; }
mkdir "$work/run"
cp -r "$root"/tests "$root"/examples "$root"/docs "$root"/README.md "$root"/pyproject.toml "$work/run/"
cd "$work/run"
"$work/wheel/bin/python" - <<PY
import importlib.metadata as metadata
import instrument
assert instrument.__file__.startswith("$work/wheel"), instrument.__file__
assert instrument.__version__ == metadata.version("torch-instrument"), instrument.__version__
print("installed", instrument.__version__, "from", instrument.__file__)
PY
"$work/wheel/bin/python" examples/train_lm.py > /dev/null
"$work/wheel/bin/python" -m pytest -q -x -p no:cacheprovider

echo "== sdist with a C compiler: the accelerator is built"
fresh_venv "$work/sdist-cc"
"$work/sdist-cc/bin/pip" install -q "$sdist"
"$work/sdist-cc/bin/python" -c "from instrument._native import speedups; assert speedups is not None; print('C accelerator:', speedups.__file__)"

echo "== sdist without a C compiler: pure Python, same results"
fresh_venv "$work/sdist-nocc"
CC=/bin/false "$work/sdist-nocc/bin/pip" install -q --no-cache-dir "$sdist"
"$work/sdist-nocc/bin/python" -c "from instrument._native import speedups; assert speedups is None; import instrument; print('pure Python', instrument.__version__)"
echo "== dist checks passed"
