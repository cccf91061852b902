"""The special model ``auto``: rules in settings.json pick a target from what a request needs.

``"routing": {"auto": [{"target": ID, "max_prompt_tokens": N, "needs": [...], "keywords": [...],
"priority": N}]}``; every condition a rule names must hold; the highest priority wins, and
among equals a loaded target, then the first listed.
Tested by tests/core/gateway/test_gateway.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import ConfigError, InvalidRequest

AUTO = "auto"
NEEDS = ("tools", "vision", "embeddings", "json_schema", "fim")
# the prompt's size before a model (and its tokenizer) is chosen: UTF-8 bytes / 4, a usual
# ratio for English text with BPE vocabularies
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class AutoRule:
    target: str
    max_prompt_tokens: int | None = None
    needs: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    priority: int = 0

    def matches(self, facts: RequestFacts) -> bool:
        if self.max_prompt_tokens is not None and facts.prompt_tokens > self.max_prompt_tokens:
            return False
        if not set(facts.needs) <= set(self.needs):
            return False  # a rule lists what its target can do; it serves no more than that
        if ("embeddings" in self.needs) != ("embeddings" in facts.needs):
            return False  # an embedding model answers embedding requests only, and only it does
        if self.keywords:
            text = facts.keyword_text.lower()
            return any(k.lower() in text for k in self.keywords)
        return True


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What ``auto`` looks at: the capabilities a request needs, its text and estimated size."""

    needs: tuple[str, ...] = ()
    text: str = ""  # the whole prompt's text (its size)
    keyword_text: str = ""  # where keywords are looked for: the last user message, the prompt
    prompt_token_ids: int = 0  # prompts given as token ids (their size is known)

    @property
    def prompt_tokens(self) -> int:
        n_bytes = len(self.text.encode("utf-8", "replace"))
        return self.prompt_token_ids + -(-n_bytes // BYTES_PER_TOKEN)

    def describe(self) -> str:
        needs = ", ".join(self.needs) if self.needs else "nothing special"
        return f"needs {needs}, about {self.prompt_tokens} prompt tokens"


def pick(rules: Sequence[AutoRule], facts: RequestFacts, loaded: Callable[[str], bool]) -> str:
    """The target of the best matching rule.

    Raises:
        InvalidRequest: no rule matches (or none is configured), with the reason.
    """
    if not rules:
        raise InvalidRequest(
            "model 'auto' has no rules: add them under routing.auto in settings.json",
            param="model",
        )
    matching = [(i, r) for i, r in enumerate(rules) if r.matches(facts)]
    if not matching:
        raise InvalidRequest(
            f"no 'auto' routing rule matches this request ({facts.describe()})", param="model"
        )
    best = max(matching, key=lambda ir: (ir[1].priority, loaded(ir[1].target), -ir[0]))
    return best[1].target


def parse_rules(raw: Any) -> tuple[AutoRule, ...]:
    """``routing.auto`` from settings.json.

    Raises:
        ConfigError: naming the rule and field that is wrong.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("settings: routing.auto must be a list of rules")
    return tuple(_rule(r, f"routing.auto[{i}]") for i, r in enumerate(raw))


def _rule(raw: Any, where: str) -> AutoRule:
    if not isinstance(raw, dict):
        raise ConfigError(f"settings: {where} must be an object")
    unknown = set(raw) - {"target", "max_prompt_tokens", "needs", "keywords", "priority"}
    if unknown:
        raise ConfigError(f"settings: {where} has an unknown field '{sorted(unknown)[0]}'")
    target = raw.get("target")
    if not isinstance(target, str) or not target or target == AUTO:
        raise ConfigError(f"settings: {where}.target must be a model id or alias (not 'auto')")
    limit = raw.get("max_prompt_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"settings: {where}.max_prompt_tokens must be a positive integer")
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ConfigError(f"settings: {where}.priority must be an integer")
    needs = _strings(raw.get("needs", []), f"{where}.needs")
    bad = [n for n in needs if n not in NEEDS]
    if bad:
        raise ConfigError(f"settings: {where}.needs: '{bad[0]}' is not one of {', '.join(NEEDS)}")
    return AutoRule(
        target, limit, needs, _strings(raw.get("keywords", []), f"{where}.keywords"), priority
    )


def _strings(v: Any, where: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(f"settings: {where} must be a list of non-empty strings")
    return tuple(v)


def rules_to_json(rules: Iterable[AutoRule]) -> list[dict[str, Any]]:
    out = []
    for r in rules:
        d: dict[str, Any] = {"target": r.target, "priority": r.priority}
        if r.max_prompt_tokens is not None:
            d["max_prompt_tokens"] = r.max_prompt_tokens
        if r.needs:
            d["needs"] = list(r.needs)
        if r.keywords:
            d["keywords"] = list(r.keywords)
        out.append(d)
    return out
