#!/usr/bin/env bash
# The support matrix: for each PYTHON:TORCH pair given (default: the pairs below), a fresh
# venv with that torch (the registry's build for that Python, CUDA included, which runs on
# the CPU; "+cpu" picks the local CPU wheel), then this checkout's wheel (on the Python that
# built it) or sdist (elsewhere: the C accelerator is built for that Python) installed
# WITHOUT a torch constraint, checking that the torch already there stays in place (pip
# freeze before and after), the dev extras installed one by one
# with torch constrained to the pair's version (an extra that cannot install beside that
# torch or Python is skipped and named: its tests importorskip it), then the default test
# tier run from a copy of the tests. Each venv is deleted after its run (several GB each).
# Heavy: run on demand (`tox -e matrix`, or `bash tools/matrix.sh 3.10:2.6.0`) and record
# the results in docs/compatibility.md. MATRIX_KEEP=1 keeps each venv (and reuses it when
# run again for the same pair, reinstalling this checkout's build). Results: $MATRIX_DIR/results.tsv, logs beside it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${MATRIX_DIR:-$(mktemp -d)}
mkdir -p "$work"
pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
    pairs=(3.10:2.6.0 3.11:2.13.0+cpu 3.11:2.14.1 3.12:2.14.1 3.13:2.15.0)
fi
host=${PYTHON:-python3}
# from $work: a build/ folder in the checkout (setup.py's) would shadow the build package
rm -rf "$work/dist"
(cd "$work" && "$host" -m build --outdir "$work/dist" "$root") > "$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 2; }
sdist=$(ls "$work"/dist/*.tar.gz)
rm -rf "$work/src" && mkdir "$work/src" && tar xzf "$sdist" -C "$work/src" --strip-components 1
wheel=$(ls "$work"/dist/*.whl)
wheel_python=$("$host" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
dev=$("$host" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["dev"]))' "$root/pyproject.toml")
: > "$work/no-constraint.txt"  # an empty constraints file: replaces any pip.conf constraint
[ -f "$work/results.tsv" ] || printf 'python\ttorch\tdate\tinstalled\tC accelerator\ttorch kept\tresult\textras skipped\n' > "$work/results.tsv"
status=0
for pair in "${pairs[@]}"; do
    pyver=${pair%%:*} torch=${pair#*:}
    py=$(ls ~/.pyenv/versions/"$pyver".*/bin/python"$pyver" 2>/dev/null | tail -1)
    [ -n "$py" ] || py=$(command -v "python$pyver") || { echo "no Python $pyver"; status=1; continue; }
    name="py$pyver-torch$torch"
    env="$work/$name" log="$work/$name.log"
    echo "== $name ($(date -u +%H:%M:%S))"
    reused=
    if [ -n "${MATRIX_KEEP:-}" ] && [ -x "$env/bin/python" ]; then reused=1; else rm -rf "$env"; fi
    rm -rf "$env-run"
    [ -n "$reused" ] || "$py" -m venv "$env"
    pins="$work/$name.constraints.txt"
    echo "torch==$torch" > "$pins"
    export PIP_NO_CACHE_DIR=1 DS_BUILD_OPS=0
    PIP_CONSTRAINT="$work/no-constraint.txt" "$env/bin/pip" install -q "torch==$torch" numpy > "$log" 2>&1 \
        || { echo "torch $torch does not install on Python $pyver: see $log"; status=1; rm -rf "$env"; continue; }
    before=$("$env/bin/pip" freeze | grep -i '^torch==')
    dist=$sdist kind=sdist
    [ "$pyver" != "$wheel_python" ] || dist=$wheel kind=wheel
    PIP_CONSTRAINT="$work/no-constraint.txt" "$env/bin/pip" install -q "$dist" >> "$log" 2>&1 \
        || { echo "$(basename "$dist") does not install: see $log"; status=1; }
    [ -z "$reused" ] || "$env/bin/pip" install -q --force-reinstall --no-deps "$dist" >> "$log" 2>&1
    after=$("$env/bin/pip" freeze | grep -i '^torch==')
    kept=yes
    [ "$before" = "$after" ] || { kept="no: $before became $after"; status=1; }
    skipped=()
    while read -r req; do
        PIP_CONSTRAINT="$pins" "$env/bin/pip" install -q "$req" >> "$log" 2>&1 || skipped+=("${req%%[<>=]*}")
    done <<< "$dev"
    [ "$("$env/bin/pip" freeze | grep -i '^torch==')" = "$before" ] || { kept="no: an extra changed $before"; status=1; }
    mkdir "$env-run"
    cp -r "$work"/src/{tests,examples,docs,README.md,CONTRIBUTING.md,CHANGELOG.md,pyproject.toml} "$env-run/"  # as shipped
    accel=$(cd "$env-run" && "$env/bin/python" -c "from instrument._native import speedups as s; print('none' if s is None else 'known layout' if s.CONTEXT_LAYOUT_KNOWN else 'generic path')")
    (cd "$env-run" && timeout 5400 "$env/bin/python" -m pytest -q -p no:cacheprovider) > "$work/$name.pytest.log" 2>&1 \
        || status=1
    result=$(grep -E '[0-9]+ (passed|failed|errors?|skipped).* in [0-9.]+s' "$work/$name.pytest.log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$("$env/bin/python" -c 'import platform; print(platform.python_version())')" \
        "${after#*==}" "$(date -u +%F)" "$kind" "$accel" "$kept" "${result:-no summary, see $name.pytest.log}" \
        "${skipped[*]:-none}" | tee -a "$work/results.tsv"
    grep -E '^(FAILED|ERROR) ' "$work/$name.pytest.log" | head -40
    [ -n "${MATRIX_KEEP:-}" ] || rm -rf "$env" "$env-run"
done
exit $status
