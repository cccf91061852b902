"""One pure translator per wire API (no aiohttp: an import-linter contract checks it)."""

from __future__ import annotations

from app.server.protocols.anthropic.render import Anthropic
from app.server.protocols.ollama.render import Ollama
from app.server.protocols.openai.render import OpenAI

OPENAI = OpenAI()
ANTHROPIC = Anthropic()
OLLAMA = Ollama()
