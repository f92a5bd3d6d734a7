#!/usr/bin/env bash
# Build (once) and print the path of a llama-cpp-python wheel compiled with
# LLAMA_CMAKE_ARGS, cached in a project-local wheelhouse keyed by version+flags.
#
# Why: pip's wheel cache ignores CMAKE_ARGS, and a native build on some x86
# CPUs picks AMX kernels that segfault in the first decode. So the default is
# GGML_NATIVE=OFF plus exactly the x86 extensions this CPU reports (never AMX);
# a fixed list is not portable either: AVX_VNNI, for one, is missing on AMD
# EPYC (Zen 4) and crashes there with "Illegal instruction".
# Override LLAMA_CMAKE_ARGS for Metal/CUDA (see README).
set -euo pipefail

PY=${PYTHON:-python3}
VERSION=${LLAMA_CPP_VERSION:-0.3.36}
detect_args() {
    local flags args="-DGGML_NATIVE=OFF"
    if [ "$(uname -s)" = "Darwin" ]; then
        echo "-DGGML_METAL=ON"; return
    fi
    case "$(uname -m)" in
        x86_64|amd64) ;;
        *) echo "$args"; return ;;  # ARM Linux: ggml's portable defaults
    esac
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    has() { case "$flags" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
    has avx && args="$args -DGGML_AVX=ON"
    has avx2 && args="$args -DGGML_AVX2=ON"
    has fma && args="$args -DGGML_FMA=ON"
    has f16c && args="$args -DGGML_F16C=ON"
    has avx512f && args="$args -DGGML_AVX512=ON"
    has avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
    has avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
    echo "$args"
}
DEFAULT_ARGS=$(detect_args)
ARGS=${LLAMA_CMAKE_ARGS:-$DEFAULT_ARGS}
# libmtmd (llama-cpp-python's multimodal library, images and sound in) is built
# too: llama-cpp-python's LLAVA_BUILD defaults to ON; -DLLAVA_BUILD=OFF in
# LLAMA_CMAKE_ARGS leaves it out, and media input with it. Its video helpers
# are not: with them, bytes that decode as neither image nor sound are handed
# to an ffprobe/ffmpeg subprocess, a process per bad request on a server.
case "$ARGS" in *MTMD_VIDEO*) ;; *) ARGS="$ARGS -DMTMD_VIDEO=OFF" ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KEY=$(printf '%s|%s' "$VERSION" "$ARGS" | sha256sum | cut -c1-12)
DIR="$ROOT/.wheelhouse/llama-cpp-python-$VERSION-$KEY"

if ! ls "$DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    mkdir -p "$DIR"
    echo "building llama-cpp-python $VERSION with: $ARGS" >&2
    echo "(this takes 4 to 6 minutes on 2 cores; the wheel is cached in $DIR)" >&2
    printf '%s\n' "$ARGS" > "$DIR/CMAKE_ARGS"
    CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
        "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
        -w "$DIR" "llama-cpp-python==$VERSION" >&2
fi
ls "$DIR"/llama_cpp_python-*.whl | head -n 1
