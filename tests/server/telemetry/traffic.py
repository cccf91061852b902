"""Mixed traffic for the canary tests of /metrics and OpenTelemetry: every request
carries the canary somewhere (prompt, model name, path, query, user agent, forwarded address,
a wrong key), and the random names it makes up are collected so a test can look for them."""

from __future__ import annotations

import random
import string
from typing import Any

import aiohttp

CANARY = "CANARYzq7x"
KINDS = 14


def rand(n: int = 10) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=n))


def ask(model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


async def mixed(s: aiohttp.ClientSession, model: str, i: int, made_up: set[str]) -> int:
    """Request ``i`` of a cycle of ``KINDS`` kinds (chat, completions, embeddings, messages,
    Ollama, streams, unknown models and paths, a wrong key); its status. The random names it
    invents are added to ``made_up``."""

    def unknown() -> str:
        name = rand()
        made_up.add(name)
        return name

    prompt = f"{CANARY} secret prompt {i}"
    headers = {"User-Agent": f"{CANARY}-agent/{i}", "X-Forwarded-For": f"10.{i % 250}.0.9"}
    kind = i % KINDS
    if kind == 0:
        r = await s.post("/v1/chat/completions", json=ask(model, prompt), headers=headers)
    elif kind == 1:
        r = await s.post(
            "/v1/chat/completions", json=ask(model, prompt, stream=True), headers=headers
        )
    elif kind == 2:
        body = ask(f"{CANARY}-{unknown()}", prompt)
        r = await s.post("/v1/chat/completions", json=body, headers=headers)
    elif kind == 3:
        r = await s.get(f"/{CANARY}/{unknown()}/{unknown()}", headers=headers)
    elif kind == 4:
        r = await s.get(f"/v1/models/{CANARY}{unknown()}", headers=headers)
    elif kind == 5:
        body = {"model": f"{unknown()}:{CANARY}", "prompt": prompt, "stream": False}
        r = await s.post("/api/generate", json=body, headers=headers)
    elif kind == 6:
        body = {"model": f"{CANARY}/{unknown()}", "input": prompt}
        r = await s.post(f"/v1/embeddings?{CANARY}={unknown()}", json=body, headers=headers)
    elif kind == 7:
        body = {"model": model, "prompt": prompt, "max_tokens": 4}
        r = await s.post("/v1/completions", json=body, headers=headers)
    elif kind == 8:
        body = ask(model, prompt, max_tokens=8, stream=True)
        r = await s.post("/v1/messages", json=body, headers=headers)
    elif kind == 9:
        r = await s.post("/api/chat", json=ask(model, prompt, stream=True), headers=headers)
    elif kind == 10:
        r = await s.post(f"/v1/{CANARY}{unknown()}", json=ask(model, prompt), headers=headers)
    elif kind == 11:
        wrong = {**headers, "Authorization": f"Bearer sk-{CANARY}-{unknown()}"}
        r = await s.post("/v1/chat/completions", json=ask(model, prompt), headers=wrong)
    elif kind == 12:
        body = {"model": unknown(), "prompt": prompt, "stream": True}
        r = await s.post("/v1/completions", json=body, headers=headers)
    else:
        r = await s.post("/v1/embeddings", json={"model": model, "input": prompt}, headers=headers)
    await r.read()
    r.release()
    return r.status
