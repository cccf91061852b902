"""Adding, testing and presenting providers: what the CLI (with or without a server) and the
GUI share. Detection and tests talk to the engine through its RemoteClient."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.gateway.providers.base import RemoteClient
from app.core.gateway.providers.store import ProviderConfig
from app.core.requests import ChatRequest
from app.core.types import ChatMessage, SamplingParams
from app.errors import HearthError

# each kind's usual OpenAI base URL on this machine (the GUI's preset; the port is the point)
DEFAULT_URLS = {
    "vllm": "http://127.0.0.1:8000/v1",
    "sglang": "http://127.0.0.1:30000/v1",
    "llama.cpp": "http://127.0.0.1:8080/v1",
    "ollama": "http://127.0.0.1:11434/v1",
    "hearth": "http://127.0.0.1:8421/v1",
    "tgi": "http://127.0.0.1:3000/v1",
    "openai": "https://api.openai.com/v1",
}


def prefix_clash(prefix: str, model_ids: Iterable[str], aliases: Iterable[str]) -> str | None:
    """What ``prefix`` would shadow: a library id or an alias starting with it (or an alias
    named as the prefix without its ``/``), or None."""
    for m in model_ids:
        if m.startswith(prefix):
            return f"the library model '{m}'"
    for a in aliases:
        if a.startswith(prefix) or a == prefix.rstrip("/"):
            return f"the alias '{a}'"
    return None


async def detect(cfg: ProviderConfig, client: RemoteClient) -> tuple[ProviderConfig, str | None]:
    """``cfg`` with the kind the engine's answers say (None, or why detection failed)."""
    p = await client.probe(detect=True)
    if p.state == "unreachable" or p.kind is None:
        return cfg, f"could not detect the kind ({p.error or p.state}); kept '{cfg.kind}'"
    return replace(cfg, kind=p.kind), None


@dataclass(slots=True)
class TestStep:
    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class ProviderTest:
    """``hearth providers test``: health, model list, a 1-token chat; ``reason`` when not ok."""

    name: str
    steps: list[TestStep] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    @property
    def reason(self) -> str | None:
        return next((f"{s.name}: {s.detail}" for s in self.steps if not s.ok), None)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "reason": self.reason,
            "steps": [{"step": s.name, "ok": s.ok, "detail": s.detail} for s in self.steps],
        }


async def test(cfg: ProviderConfig, client: RemoteClient) -> ProviderTest:
    out = ProviderTest(cfg.name)
    p = await client.probe()
    health = p.state == "ready"
    out.steps.append(
        TestStep(
            "health",
            health,
            f"{p.state} in {p.latency_ms} ms" + (f": {p.error}" if p.error else ""),
        )
    )
    if not health:
        return out
    chat = [m for m in p.models if "chat" in m.capabilities]
    out.steps.append(
        TestStep(
            "models",
            bool(chat),
            ", ".join(cfg.prefix + m.id for m in p.models) or "the engine lists no models",
        )
    )
    if not chat:
        return out
    req = ChatRequest(
        model=chat[0].id,
        messages=(ChatMessage("user", "Say OK."),),
        sampling=SamplingParams(temperature=0.0),
        max_tokens=1,
    )
    t0 = time.monotonic()
    try:
        stream = await client.chat(chat[0].id, req)
        final = None
        async for d in stream:
            if d.finish_reason is not None:
                final = d
        if final is None or final.finish_reason == "error":
            raise RuntimeError(final.error if final is not None else "no answer")
        detail = f"{cfg.prefix}{chat[0].id} answered in {(time.monotonic() - t0) * 1000:.0f} ms"
        out.steps.append(TestStep("chat", True, detail))
    except (HearthError, RuntimeError) as e:
        out.steps.append(TestStep("chat", False, str(e)))
    return out
