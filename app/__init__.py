"""Hearth: run open LLMs locally and serve them through an OpenAI-compatible API."""

from __future__ import annotations

__version__ = "0.1.0"
