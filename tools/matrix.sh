#!/usr/bin/env bash
# The declared-versions matrix: for each Python given (default: the pyenv 3.10, 3.12 and
# 3.13 interpreters), a fresh venv with torch 2.13.0 (the registry's default build for that
# Python, CUDA included, which runs on the CPU), this checkout's sdist with the dev extras
# (so the C accelerator is built for that Python), and the test suite run from a copy of the
# tests. Heavy (several GB per Python): run on demand, `tox -e matrix`, and record the
# results in docs/compatibility.md.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${MATRIX_DIR:-$(mktemp -d)}
mkdir -p "$work"
pythons=("$@")
if [ ${#pythons[@]} -eq 0 ]; then
    pythons=(~/.pyenv/versions/3.10.*/bin/python3.10 ~/.pyenv/versions/3.12.*/bin/python3.12
             ~/.pyenv/versions/3.13.*/bin/python3.13)
fi
# from $work: a build/ folder in the checkout (setup.py's) would shadow the build package
(cd "$work" && python3 -m build --sdist --outdir "$work/dist" "$root") > "$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 2; }
sdist=$(ls "$work"/dist/*.tar.gz)
status=0
for py in "${pythons[@]}"; do
    version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    env="$work/py$version"
    [ -x "$env/bin/python" ] || "$py" -m venv "$env"
    "$env/bin/pip" install -q torch==2.13.0 numpy > "$env.log" 2>&1
    "$env/bin/pip" install -q --force-reinstall --no-deps "$sdist" >> "$env.log" 2>&1
    "$env/bin/pip" install -q -c <(echo torch==2.13.0) "$sdist[dev]" >> "$env.log" 2>&1
    rm -rf "$env-run" && mkdir "$env-run"
    cp -r "$root"/tests "$root"/examples "$root"/docs "$root"/README.md "$root"/pyproject.toml "$env-run/"
    (cd "$env-run" && "$env/bin/python" -c "import sys, torch, instrument; from instrument._native import speedups as s; print(sys.version.split()[0], 'torch', torch.__version__, 'instrument', instrument.__version__, 'C accelerator', s is not None and bool(s.CONTEXT_LAYOUT_KNOWN))" \
        && "$env/bin/python" -m pytest -q -p no:cacheprovider -m "slow or not slow" 2>&1 | grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed)"; exit "${PIPESTATUS[0]}") || status=1
done
exit $status
