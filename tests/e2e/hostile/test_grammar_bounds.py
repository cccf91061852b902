"""No schema, pattern or grammar a client sends can crash or exhaust the server.

Driven against a real ``hearth serve`` subprocess with SmolLM2 loaded, so that a native crash
(maxLength 32000 was a SIGSEGV in llama.cpp's grammar parser) shows as a failed test, not a
dead test run. Every route that takes a schema is tried with every input; afterwards the same
process still answers /health and a normal chat.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.core.inference.test_constraints import AGENT_TOOLS

pytestmark = pytest.mark.model

MSG = [{"role": "user", "content": "hi"}]


@dataclass
class Server:
    proc: subprocess.Popen[str]
    base: str
    model: str

    def post(self, path: str, body: dict[str, Any], timeout: float = 300) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
        except (urllib.error.URLError, ConnectionError) as e:
            code = self.proc.poll()
            pytest.fail(f"the server is gone (exit code {code}) after {path}: {e}")

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("grammar-serve")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--model", str(smollm2_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # llama.cpp may print a refused grammar whole
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip()
        srv = Server(proc, f"http://127.0.0.1:{port}", "")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            _, body = srv.get("/v1/models")
            if body["data"] and body["data"][0]["state"] == "loaded":
                srv.model = body["data"][0]["id"]
                break
            time.sleep(0.2)
        assert srv.model, "the model did not load"
        yield srv
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _object(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as the one parameter of a tool (its local refs follow it down)."""
    inner = json.loads(json.dumps(schema).replace('"#/', '"#/properties/x/'))
    return {"type": "object", "properties": {"x": inner}, "required": ["x"]}


def routes(model: str, schema: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any], str | None]]:
    """Each route that takes a schema: (path, body, the param it names, or None where the
    protocol's error has no param). Tools get the schema as one parameter's schema."""
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    fn = {"type": "function", "function": {"name": "f", "parameters": _object(schema)}}
    flat = {"type": "function", "name": "f", "parameters": _object(schema)}
    anthropic = {"name": "f", "input_schema": _object(schema)}
    rf_param = "response_format.json_schema.schema"
    return {
        "chat response_format": (
            "/v1/chat/completions",
            {"model": model, "messages": MSG, "max_tokens": 4, "response_format": rf},
            rf_param,
        ),
        "completions response_format": (
            "/v1/completions",
            {"model": model, "prompt": "hi", "max_tokens": 4, "response_format": rf},
            rf_param,
        ),
        "responses text.format": (
            "/v1/responses",
            {
                "model": model,
                "input": "hi",
                "max_output_tokens": 4,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            },
            "text.format.schema",
        ),
        "ollama chat format": (
            "/api/chat",
            {"model": model, "messages": MSG, "stream": False, "format": schema},
            None,
        ),
        "ollama generate format": (
            "/api/generate",
            {"model": model, "prompt": "hi", "stream": False, "format": schema},
            None,
        ),
        "ollama raw generate format": (
            "/api/generate",
            {"model": model, "prompt": "hi", "raw": True, "stream": False, "format": schema},
            None,
        ),
        "chat tool_choice required": (
            "/v1/chat/completions",
            {"model": model, "messages": MSG, "tools": [fn], "tool_choice": "required"},
            "tools[0].function.parameters",
        ),
        "chat tool_choice named": (
            "/v1/chat/completions",
            {
                "model": model,
                "messages": MSG,
                "tools": [fn],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[0].function.parameters",
        ),
        "responses tool_choice required": (
            "/v1/responses",
            {"model": model, "input": "hi", "tools": [flat], "tool_choice": "required"},
            "tools[0].parameters",
        ),
        "responses tool_choice named": (
            "/v1/responses",
            {
                "model": model,
                "input": "hi",
                "tools": [flat],
                "tool_choice": {"type": "function", "name": "f"},
            },
            "tools[0].parameters",
        ),
        "messages tool_choice any": (
            "/v1/messages",
            {
                "model": model,
                "max_tokens": 4,
                "messages": MSG,
                "tools": [anthropic],
                "tool_choice": {"type": "any"},
            },
            None,
        ),
        "messages tool_choice tool": (
            "/v1/messages",
            {
                "model": model,
                "max_tokens": 4,
                "messages": MSG,
                "tools": [anthropic],
                "tool_choice": {"type": "tool", "name": "f"},
            },
            None,
        ),
    }


def _error(body: Any) -> tuple[str, str | None]:
    """(message, param) of any protocol's error body."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):  # Ollama
        return body["error"], None
    err = body["error"]
    return err["message"], err.get("param")


# (schema, what the message must say): the hostile inputs first, then their siblings
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "maxLength 32000 (SIGSEGV)": ({"type": "string", "maxLength": 32000}, "32000"),
    "pattern a{0,37000} (SIGSEGV)": ({"type": "string", "pattern": "^a{0,37000}$"}, "37000"),
    "minItems 20000000 (1.9 GB)": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 20_000_000},
        "20000000",
    ),
    "pattern a{200000000} (0.9 GB)": (
        {"type": "string", "pattern": "^a{200000000}$"},
        "200000000",
    ),
    "invalid regex ^(a$": ({"type": "string", "pattern": "^(a$"}, "unclosed group"),
    "maxItems 32000": ({"type": "array", "items": {"type": "integer"}, "maxItems": 32000}, "32000"),
    "maxLength 2500": ({"type": "string", "maxLength": 2500}, "2500"),
    "bad escape": ({"type": "string", "pattern": "^\\q+$"}, "bad escape"),
    "nested quantifiers": ({"type": "string", "pattern": "^(a{1000}){1000}$"}, "1000000"),
    "deep regex groups": (
        {"type": "string", "pattern": "^" + "(" * 40 + "a" + ")" * 40 + "$"},
        "32",
    ),
    "enum of 1000": ({"enum": [f"v{i}" for i in range(1000)]}, "256"),
    "min over max": ({"type": "string", "minLength": 9, "maxLength": 3}, "larger than"),
    "counts add up": (
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "maxLength": 1000} for i in range(21)},
        },
        "20000",
    ),
    "ref into data": (
        {"default": {"type": "string", "maxLength": 99999}, "$ref": "#/default"},
        "99999",
    ),
    "stacks multiply (3 s a token)": (
        {
            "$defs": {"e": {"enum": [f"v{i}" for i in range(64)]}},
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"k": {"$ref": "#/$defs/e"}, f"x{i}": {"type": "integer"}},
                    "required": ["k", f"x{i}"],
                }
                for i in range(64)
            ],
        },
        "512",
    ),
}


def test_every_route_refuses_every_hostile_schema_and_the_server_survives(server: Server) -> None:
    failures = []
    for name, (schema, says) in HOSTILE.items():
        for route, (path, body, param) in routes(server.model, schema).items():
            status, answer = server.post(path, body)
            if status != 400:
                failures.append(f"{name} on {route}: {status} {str(answer)[:200]}")
                continue
            message, got = _error(answer)
            if says not in message:
                failures.append(f"{name} on {route}: {message!r} does not say {says!r}")
            # the grammar-level refusal (the last input) names the runtime's field
            if (
                param is not None
                and not (got or "").startswith(param)
                and got
                not in (
                    "response_format",
                    "tools",
                )
            ):
                failures.append(f"{name} on {route}: param {got!r}, expected {param}...")
    assert server.proc.poll() is None, "the server process died"
    assert not failures, "\n".join(failures)
    status, health = server.get("/health")
    assert status == 200 and health["status"] == "ok" and server.model in health["loaded"]
    status, chat = server.post(
        "/v1/chat/completions", {"model": server.model, "messages": MSG, "max_tokens": 5}
    )
    assert status == 200 and chat["usage"]["completion_tokens"] > 0


def test_the_largest_allowed_schema_compiles_and_generates_valid_json(server: Server) -> None:
    colors = [f"color-{i}" for i in range(256)]
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 1000},
            "code": {"type": "string", "pattern": "^[a-z]{1,1000}$"},
            "color": {"type": "string", "enum": colors},
            "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 1000},
        },
        "required": ["name", "code", "color", "tags"],
        "additionalProperties": False,
    }
    status, body = server.post(
        "/v1/chat/completions",
        {
            "model": server.model,
            "messages": [
                {
                    "role": "user",
                    "content": 'Repeat this JSON exactly: {"name": "Ava", "code": "ab", '
                    '"color": "color-7", "tags": [1, 2]}',
                }
            ],
            "max_tokens": 300,
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "r", "schema": schema},
            },
        },
    )
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    record = json.loads(choice["message"]["content"])
    assert len(record["name"]) <= 1000 and record["color"] in colors
    assert record["code"].isalpha() and record["code"].islower() and len(record["code"]) <= 1000
    assert len(record["tags"]) <= 1000 and all(isinstance(t, int) for t in record["tags"])


def test_a_forced_call_over_real_agent_tools_is_a_valid_call(server: Server) -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": p}}
        for i, p in enumerate(AGENT_TOOLS)
    ]
    status, body = server.post(
        "/v1/chat/completions",
        {
            "model": server.model,
            "messages": [{"role": "user", "content": "Create a task named build."}],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "tool_6"}},  # has $refs
            # room for the whole call: one cut short comes back as text (hearth_tool_parse)
            "max_tokens": 400,
            "temperature": 0,
        },
    )
    assert status == 200, body
    (call,) = body["choices"][0]["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "tool_6" and isinstance(args["name"], str)
    assert args.get("priority", "low") in ("low", "high")
    status, body = server.post(
        "/v1/chat/completions",
        {
            "model": server.model,
            "messages": [{"role": "user", "content": "List the files."}],
            "tools": tools,
            "tool_choice": "required",
            "max_tokens": 60,
            "temperature": 0,
        },
    )
    assert status == 200, body
    calls = body["choices"][0]["message"]["tool_calls"]
    assert calls and all(json.loads(c["function"]["arguments"]) is not None for c in calls)


# a pydantic model's schema: the root is a union of two models kept in $defs
PET = {
    "$defs": {
        "Cat": {
            "type": "object",
            "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
            "required": ["kind", "lives"],
        },
        "Dog": {
            "type": "object",
            "properties": {"kind": {"const": "dog"}, "name": {"type": "string", "maxLength": 20}},
            "required": ["kind", "name"],
        },
    },
    "anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
}
# pydantic's tree: Node with children: list[Node]; the root is a $ref beside its $defs
TREE = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []},
            },
            "required": ["value"],
        }
    },
    "$ref": "#/$defs/Node",
}


def _forced_calls(model: str, schema: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """A forced call of the one tool ``pick`` in each protocol that forces calls."""
    ask = [{"role": "user", "content": "Call pick with a pet."}]
    fn = {"type": "function", "function": {"name": "pick", "parameters": schema}}
    named = {"type": "function", "function": {"name": "pick"}}
    return {
        "openai named": (
            "/v1/chat/completions",
            {"model": model, "messages": ask, "tools": [fn], "tool_choice": named},
        ),
        "anthropic tool": (
            "/v1/messages",
            {
                "model": model,
                "messages": ask,
                "max_tokens": 200,
                "tools": [{"name": "pick", "input_schema": schema}],
                "tool_choice": {"type": "tool", "name": "pick"},
            },
        ),
        "anthropic any": (
            "/v1/messages",
            {
                "model": model,
                "messages": ask,
                "max_tokens": 200,
                "tools": [{"name": "pick", "input_schema": schema}],
                # one call: parallel ones run on until max_tokens cuts the last one short
                "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            },
        ),
        "ollama tools": (
            "/api/chat",
            {"model": model, "messages": ask, "stream": False, "tools": [fn], "tool_choice": named},
        ),
    }


def _arguments(route: str, body: dict[str, Any]) -> list[Any]:
    """Each call's arguments (a forced "any" may make several calls)."""
    if route.startswith("openai"):
        calls = body["choices"][0]["message"]["tool_calls"]
        return [json.loads(c["function"]["arguments"]) for c in calls]
    if route.startswith("anthropic"):
        return [c["input"] for c in body["content"] if c["type"] == "tool_use"]
    return [c["function"]["arguments"] for c in body["message"]["tool_calls"]]


@pytest.mark.parametrize("schema", [PET, TREE], ids=["root anyOf of $refs", "recursive $defs"])
def test_a_forced_call_keeps_a_root_combinator_schema(server: Server, schema: Any) -> None:
    for route, (path, body) in _forced_calls(server.model, schema).items():
        body = {**body, "temperature": 0, "options": {"temperature": 0, "num_predict": 200}}
        if "max_tokens" not in body and not path.startswith("/api"):
            body["max_tokens"] = 200
        status, answer = server.post(path, body)
        assert status == 200, (route, answer)
        calls = _arguments(route, answer)
        assert calls, (route, answer)
        for args in calls:
            assert args != {}, f"{route}: the schema was dropped"
            jsonschema.validate(args, schema)  # the arguments are what the schema says


def test_five_objects_of_950_optional_properties_are_refused_before_converting(
    server: Server,
) -> None:
    schema = {
        "type": "object",
        "properties": {
            f"o{j}": {"type": "object", "properties": {f"p{i}": {} for i in range(950)}}
            for j in range(5)
        },
    }
    assert len(json.dumps(schema)) < 64 * 1024
    for route, (path, body, param) in routes(server.model, schema).items():
        status, answer = server.post(path, body, timeout=60)
        message, got = _error(answer)
        assert status == 400 and "optional properties" in message, (route, message)
        assert param is None or (got or "").startswith(param), (route, got)
