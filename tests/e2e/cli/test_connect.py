"""``hearth connect TOOL``: the settings each app needs, checked by using them. The
clients that are on PyPI (openai-python, the anthropic SDK as Claude Code's stand-in, LangChain)
are run against a real server with exactly the environment the command gives; the others'
snippets are checked against their documented shapes (YAML, JSON, TOML that parse, with the URL,
model and context in the fields those tools read)."""

from __future__ import annotations

import json
import os
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.core.desktop.connect import KEY_PLACEHOLDER, TOOLS
from tests.conftest import Served, serving

CONTRACT = {"tool", "base_url", "model", "env", "snippet", "context_needed"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("connect"), smollm2_path) as s:
        yield s


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


# the command runs in this process (a subprocess per call cost ~1.5 s each); --exec's child
# writes to the same file descriptors, which capfd reads
_CAP: list[pytest.CaptureFixture[str]] = []


@pytest.fixture(autouse=True)
def _capture(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    _CAP.append(capfd)
    yield
    _CAP.pop()


def hearth(home: Path, *args: str) -> Ran:
    from app.cli import main

    cap = _CAP[-1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEARTH_HOME", str(home))
        mp.delenv("HEARTH_API_KEY", raising=False)
        cap.readouterr()
        try:
            rc = main(["connect", *args])
        except SystemExit as e:  # argparse's usage errors
            rc = int(e.code or 0)
        out, err = cap.readouterr()
    return Ran(rc, out, err)


def connect_json(home: Path, tool: str, *args: str) -> dict[str, Any]:
    r = hearth(home, tool, "--json", *args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert CONTRACT <= set(out) and out["tool"] == tool
    return out


@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_tool_names_the_running_server_and_the_model(served: Served, tool: str) -> None:
    out = connect_json(served.home, tool, "--model", served.model_id)
    # Claude Code adds /v1 itself; Continue's Ollama provider, llama.vscode and Twinny (a
    # host, a port and a path) take the root
    roots = ("claude-code", "continue-autocomplete", "llama-vscode", "twinny")
    want = served.root if tool in roots else served.base_url
    assert out["base_url"] == want and out["model"] == served.model_id
    assert served.model_id in out["snippet"] and out["context_needed"] == TOOLS[tool].context_needed
    assert isinstance(out["env"], dict)


def test_the_default_model_is_the_library_s_first_chat_model(served: Served) -> None:
    assert connect_json(served.home, "openai-python")["model"] == served.model_id


def _clean_env(mp: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k in list(os.environ):
        if k.startswith(("OPENAI_", "ANTHROPIC_")):
            mp.delenv(k)
    for k, v in env.items():
        mp.setenv(k, v)


def test_openai_python_works_with_the_environment_alone(served: Served) -> None:
    from openai import OpenAI

    out = connect_json(served.home, "openai-python", "--model", served.model_id)
    with pytest.MonkeyPatch.context() as mp:
        _clean_env(mp, out["env"])
        client = OpenAI()  # the environment alone says where and with which key
    r = client.chat.completions.create(
        model=served.model_id,
        max_tokens=4,
        temperature=0,
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert r.model == served.model_id and r.usage is not None and r.usage.completion_tokens > 0


def test_langchain_works_with_the_environment_alone(served: Served) -> None:
    from langchain_openai import ChatOpenAI

    out = connect_json(served.home, "langchain", "--model", served.model_id)
    with pytest.MonkeyPatch.context() as mp:
        _clean_env(mp, out["env"])
        llm = ChatOpenAI(model=served.model_id, max_tokens=4, temperature=0)  # type: ignore[call-arg]
    assert llm.invoke("Hi").response_metadata["model_name"] == served.model_id


def test_claude_code_s_environment_reaches_the_messages_api(served: Served) -> None:
    """Claude Code reads ANTHROPIC_BASE_URL / ANTHROPIC_AUTH_TOKEN / ANTHROPIC_MODEL: the same
    variables the anthropic SDK reads, and the request it makes (POST BASE/v1/messages with a
    bearer token) is the one checked here, through the SDK when it is installed."""
    out = connect_json(served.home, "claude-code", "--model", served.model_id)
    env = out["env"]
    assert env["ANTHROPIC_MODEL"] == served.model_id and "/v1" not in env["ANTHROPIC_BASE_URL"]
    req = urllib.request.Request(
        env["ANTHROPIC_BASE_URL"] + "/v1/messages",
        data=json.dumps(
            {
                "model": env["ANTHROPIC_MODEL"],
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}],
            }
        ).encode(),
        headers={
            "Authorization": "Bearer " + env["ANTHROPIC_AUTH_TOKEN"],
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        body = json.loads(r.read())
    assert (body["type"], body["model"]) == ("message", served.model_id)


def test_the_snippets_parse_and_carry_the_settings(served: Served) -> None:
    import yaml  # type: ignore[import-untyped]

    cont = connect_json(served.home, "continue", "--model", served.model_id)
    model = yaml.safe_load(cont["snippet"])["models"][0]
    assert (model["provider"], model["apiBase"], model["model"]) == (
        "openai",
        served.base_url,
        served.model_id,
    )
    assert model["defaultCompletionOptions"]["contextLength"] == cont["context_needed"]

    zed = connect_json(served.home, "zed", "--model", served.model_id)
    body = zed["snippet"].split("\n", 1)[1]  # after the // comment line
    hearth_provider = json.loads(body)["language_models"]["openai_compatible"]["Hearth"]
    assert hearth_provider["api_url"] == served.base_url
    assert hearth_provider["available_models"][0]["max_tokens"] == zed["context_needed"]
    assert zed["env"] == {"HEARTH_API_KEY": "hearth"}

    codex = connect_json(served.home, "codex", "--model", served.model_id)
    cfg = tomllib.loads(codex["snippet"])
    provider = cfg["model_providers"][cfg["model_provider"]]
    assert cfg["model"] == served.model_id and provider["base_url"] == served.base_url
    assert provider["wire_api"] == "responses" and provider["env_key"] in codex["env"]


def test_exec_runs_the_command_with_the_environment_and_its_exit_code(served: Served) -> None:
    code = "import os, sys; print(os.environ['OPENAI_BASE_URL']); sys.exit(7)"
    r = hearth(served.home, "openai-python", "--exec", "--", sys.executable, "-c", code)
    assert r.returncode == 7 and r.stdout.strip() == served.base_url
    r = hearth(served.home, "cline", "--exec", "--", sys.executable, "-c", "pass")
    assert r.returncode == 1 and "no environment variables" in r.stderr


def test_a_context_too_small_is_warned_and_can_be_raised(served: Served) -> None:
    # the module's server loads with 2,048 tokens (tests/conftest.write_settings); SmolLM2 was
    # trained for 8,192: Continue's 8,192 fits the model but not this load
    served.call(served.service.models.load(served.model_id))  # type: ignore[attr-defined]
    r = hearth(served.home, "continue", "--model", served.model_id)
    assert r.returncode == 0
    assert "runs with a 2,048-token context; this tool needs 8,192" in r.stderr
    out = connect_json(served.home, "continue", "--model", served.model_id)
    assert out["context_ok"] is False and "2,048" in out["context_warning"]
    # Claude Code needs more than the model was trained for: no setting can fix that
    cc = connect_json(served.home, "claude-code", "--model", served.model_id)
    assert "trained for 8,192" in cc["context_warning"]
    fixed = hearth(served.home, "continue", "--model", served.model_id, "--set-context")
    assert fixed.returncode == 0 and "unload" in fixed.stderr  # loaded now: it says how
    presets = json.loads((served.home / "config" / "presets.json").read_text())
    assert presets[served.model_id]["context_length"] == 8192
    refused = hearth(served.home, "claude-code", "--model", served.model_id, "--set-context")
    assert refused.returncode == 1 and "trained for 8,192" in refused.stderr


def test_a_server_that_needs_a_key_gets_a_placeholder_or_the_given_key(tmp_path: Path) -> None:
    home = tmp_path / "h"
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.json").write_text(
        json.dumps({"server": {"api_key_hashes": ["0" * 64]}})
    )
    out = connect_json(home, "openai-python", "--model", "m")
    assert out["env"]["OPENAI_API_KEY"] == KEY_PLACEHOLDER
    plain = hearth(home, "openai-python", "--model", "m")
    assert "requires an API key" in plain.stdout
    given = connect_json(home, "openai-python", "--model", "m", "--key", "hearth-secret")
    assert given["env"]["OPENAI_API_KEY"] == "hearth-secret"
    # no server running: the address comes from settings
    assert given["base_url"] == "http://127.0.0.1:8421/v1"


def test_an_unknown_tool_is_a_usage_error(tmp_path: Path) -> None:
    r = hearth(tmp_path, "vim")
    assert r.returncode == 2 and "invalid choice" in r.stderr
