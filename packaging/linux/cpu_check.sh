#!/usr/bin/env bash
# Does the built bundle answer a chat on an older x86-64 CPU? Runs smoke.py's serve check (an
# empty HOME, no network, `hearth serve --model MODEL` on a loopback port, one
# /v1/chat/completions request) with the bundle under user-mode QEMU emulating each CPU:
#
#   packaging/linux/cpu_check.sh [BUNDLE_DIR] [MODEL.gguf]
#
# CPUs: HEARTH_QEMU_CPUS (default "Haswell", plus "Nehalem" when the bundle has llama.cpp's
# baseline CPU library: AVX2+FMA, then SSE4.2 only). Needs qemu-x86_64 (Debian: apt install
# qemu-user). Emulation is slow: HEARTH_QEMU_DEADLINE seconds per wait (default 1500).
# Prints per CPU the seconds it took, which llama.cpp CPU library ggml chose and the answer.
# User-mode QEMU emulates one process: a program it execs runs natively. PyInstaller's
# bootloader execs itself once (to set LD_LIBRARY_PATH), so the bundle is started with the
# environment that second stage gets, and runs emulated from the start. The model check child
# Hearth starts runs natively; the server's own model load and generation are emulated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# shellcheck source=args.sh
. "$ROOT/packaging/linux/args.sh"
BUNDLE="$(hearth_bundle_arg "${1:-}")"
MODEL="$(hearth_model_arg "${2:-}")"
QEMU="$(command -v qemu-x86_64 || true)"
[ -n "$QEMU" ] || { echo "cpu_check.sh: qemu-x86_64 is missing (apt install qemu-user)" >&2; exit 1; }

LIB="$BUNDLE/_internal/llama_cpp/lib"
CPUS="${HEARTH_QEMU_CPUS:-Haswell$([ -f "$LIB/libggml-cpu-x64.so" ] && echo " Nehalem")}"
OUT="${HEARTH_SMOKE_OUT:-$(mktemp -d -t hearth-cpu-check-XXXXXX)}"
echo "bundle: $BUNDLE"
echo "llama.cpp CPU libraries: $(cd "$LIB" && ls libggml-cpu*.so | tr '\n' ' ')"
# what the bootloader's first stage sets before it execs itself (PyInstaller 6)
wrap="env $(printf '%q ' "LD_LIBRARY_PATH=$BUNDLE/_internal" "_PYI_ARCHIVE_FILE=$BUNDLE/hearth" \
    _PYI_PARENT_PROCESS_LEVEL=-1 _PYI_LINUX_PROCESS_NAME=hearth)"
failed=0
for cpu in $CPUS; do
    out="$OUT/$cpu"
    mkdir -p "$out"
    t0=$(date +%s)
    if env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" /usr/bin/python3 "$ROOT/packaging/linux/smoke.py" \
        --offline --out "$out" --wrap "$wrap $QEMU -cpu $cpu" --deadline "${HEARTH_QEMU_DEADLINE:-1500}" \
        "$BUNDLE" "$MODEL" serve > "$out/result.txt" 2>&1; then
        verdict=ok
    else
        verdict=FAILED
        failed=1
    fi
    took=$(($(date +%s) - t0))
    chosen="$(sed -n 's/.*"cpu_backend": "\([^"]*\)".*/\1/p' "$out/result.txt" | head -1)"
    [ -n "$chosen" ] || chosen="$(grep -o 'CPU backend: [^ ]*' "$out/serve-stderr.txt" 2>/dev/null | head -1 | cut -d' ' -f3 || true)"
    echo "CPU_CHECK $cpu $verdict ${took}s cpu_backend=${chosen:-?}"
    sed -n 's/^SMOKE serve [0-9.]*s //p' "$out/result.txt"
    [ "$verdict" = ok ] || { tail -n 20 "$out/result.txt"; tail -n 20 "$out/serve-stderr.txt" 2>/dev/null || true; }
done
echo "logs: $OUT"
exit "$failed"
