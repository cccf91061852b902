"""Hostile constraints on the MLX runtime (llguidance): the same bounded validator in front, nothing hangs or
grows, and what llguidance would read from a client beyond the schema is not taken."""

from __future__ import annotations

import json
import resource
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Served, serving
from tests.e2e.hostile.test_grammar_bounds import HOSTILE, routes

pytest.importorskip("mlx_lm", reason="MLX runtime tests need mlx-lm (and mlx[cpu] on Linux)")

# every route but the Responses/Anthropic ones, which the MLX test model serves the same way
MLX_ROUTES = (
    "chat response_format",
    "completions response_format",
    "ollama chat format",
    "ollama raw generate format",
    "chat tool_choice required",
    "messages tool_choice any",
)


@pytest.fixture(scope="module")
def mlx_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.support.mlx_model import build_tiny_mlx_model

    model = build_tiny_mlx_model(tmp_path_factory.mktemp("mlx") / "Tiny-MLX-Llama")
    with serving(tmp_path_factory.mktemp("mlxserved"), model) as s:
        yield s


def post(s: Served, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        s.root + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_hostile_schemas_are_refused_at_once_on_mlx(mlx_served: Served) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    failures = []
    for name, (schema, _) in HOSTILE.items():
        if name.startswith("stacks multiply"):
            continue  # a llama.cpp cost: llguidance takes it (below)
        for route, (path, body, _param) in routes(mlx_served.model_id, schema).items():
            if route not in MLX_ROUTES:
                continue
            status, answer = post(mlx_served, path, body)
            if status != 400:
                failures.append(f"{name} on {route}: {status} {str(answer)[:200]}")
    assert not failures, "\n".join(failures)
    # the inputs that took 0.9-1.9 GB elsewhere did not expand here (ru_maxrss is in KiB)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200 * 1024
    status, chat = post(
        mlx_served,
        "/v1/chat/completions",
        {
            "model": mlx_served.model_id,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
        },
    )
    assert status == 200 and chat["usage"]["completion_tokens"] == 3


def test_a_client_cannot_set_llguidance_options(mlx_served: Served) -> None:
    # x-guidance would hand llguidance a whitespace regex no bound has looked at
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_pattern": "(?: {200000000})?"},
    }
    started = time.monotonic()
    status, body = post(
        mlx_served,
        "/v1/chat/completions",
        {
            "model": mlx_served.model_id,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 40,
            "temperature": 0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema},
            },
        },
    )
    assert status == 200, body
    assert json.loads(body["choices"][0]["message"]["content"]) in ({"ok": True}, {"ok": False})
    assert time.monotonic() - started < 120


def test_forced_tools_with_refs_and_wide_unions_work_on_mlx(mlx_served: Served) -> None:
    # a random model loves the line breaks the grammar allows between JSON tokens
    folder = Path(mlx_served.service.models._library.get(mlx_served.model_id).path)  # type: ignore[attr-defined]
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    no_line_breaks = {str(vocab[ws]): -100 for ws in ("\u010a", "\u0109", "\u010d")}
    priority = {
        "$defs": {"P": {"enum": ["low", "high"]}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/P"}},
        "required": ["p"],
        "additionalProperties": False,
    }
    tools = [
        {"type": "function", "function": {"name": "set_priority", "parameters": priority}},
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
    ]
    status, body = post(
        mlx_served,
        "/v1/chat/completions",
        {
            "model": mlx_served.model_id,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "set_priority"}},
            "parallel_tool_calls": False,
            "max_tokens": 120,
            "temperature": 0,
            "logit_bias": no_line_breaks,
        },
    )
    assert status == 200, body
    (call,) = body["choices"][0]["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert args.get("p") in ("low", "high"), json.dumps(body)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    # the union llama.cpp refuses (64 x 64 stacks) costs llguidance nothing
    wide, _ = HOSTILE["stacks multiply (3 s a token)"]
    status, body = post(
        mlx_served,
        "/v1/chat/completions",
        {
            "model": mlx_served.model_id,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": wide},
            },
        },
    )
    assert status == 200, body


async def test_mlx_compiles_constraints_off_its_worker(tmp_path: Path) -> None:
    """llguidance compiles on the compile threads: a worker busy with a stream does not hold a
    new request's check up, and the check holds up no stream."""
    import asyncio
    import threading

    from app.core.types import LoadOptions, LocalModel
    from app.errors import InvalidRequest
    from app.runtimes.mlx.runtime import MlxRuntime
    from tests.support.mlx_model import build_tiny_mlx_model

    folder = build_tiny_mlx_model(tmp_path / "m")
    model = LocalModel(id="tiny", path=str(folder), format="mlx", size_bytes=0, owned=False)
    lm = await asyncio.to_thread(MlxRuntime().load, model, LoadOptions(context_length=256))
    try:
        gate = threading.Event()
        held = lm.worker.run(
            lambda _cancelled: gate.wait()
        )  # the worker is busy until the test opens the gate
        schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}}
        # compiled while the worker is still held: not behind its queue
        await asyncio.wait_for(lm.check_constraint(("json_schema", json.dumps(schema))), 120)
        assert not held.done()
        gate.set()
        await asyncio.wait_for(held, 60)
        bad = ("json_schema", json.dumps({"type": "string", "format": "no-such-format"}))
        with pytest.raises(InvalidRequest) as ei:
            await asyncio.wait_for(lm.check_constraint(bad), 120)
        assert ei.value.param == "response_format"
    finally:
        await asyncio.to_thread(lm.close)
