"""The gateway (pure core): aliases file, resolution order, auto rules, fallback classes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.gateway import AliasStore, AutoRule, Gateway, RequestFacts, Routing, parse_rules
from app.core.gateway.aliases import AliasCycle
from app.core.requests import RequestContext
from app.core.util.fsutil import atomic_write_json
from app.errors import (
    ConfigError,
    HearthError,
    InsufficientMemory,
    InvalidRequest,
    ModelLoadFailed,
    ModelNotFound,
    ModelUnloaded,
    QueueFull,
)

MODELS = {"small", "big", "embedder"}


def _gw(tmp_path: Path, routing: Routing | None = None, loaded: set[str] | None = None) -> Gateway:
    return Gateway(
        AliasStore(tmp_path / "aliases.json"),
        lambda: routing or Routing(),
        MODELS.__contains__,
        (loaded or set()).__contains__,
    )


def test_alias_set_validates_and_refuses_cycles(tmp_path: Path) -> None:
    store = AliasStore(tmp_path / "aliases.json")
    assert store.set("fast", ["small"], MODELS.__contains__) == ("small",)
    store.set("chain", ["big", "fast"], MODELS.__contains__)
    with pytest.raises(InvalidRequest, match="reserved"):
        store.set("auto", ["small"], MODELS.__contains__)
    with pytest.raises(InvalidRequest, match="is a model id"):
        store.set("small", ["big"], MODELS.__contains__)
    with pytest.raises(InvalidRequest, match="neither a model id nor an alias"):
        store.set("x", ["nope"], MODELS.__contains__)
    with pytest.raises(AliasCycle, match="fast -> chain -> fast"):
        store.set("fast", ["chain"], MODELS.__contains__)
    with pytest.raises(AliasCycle, match="me -> me"):
        store.set("me", ["me"], MODELS.__contains__)
    # a refused change leaves the file as it was; another reader of the file sees the rest
    assert AliasStore(tmp_path / "aliases.json").all() == {
        "fast": ("small",),
        "chain": ("big", "fast"),
    }
    assert store.remove("chain") and not store.remove("chain")


def test_resolution_order(tmp_path: Path) -> None:
    gw = _gw(tmp_path, Routing(default_model="fast"))
    gw.aliases.set("fast", ["small"], MODELS.__contains__)  # type: ignore[union-attr]
    gw.aliases.set("chain", ["big", "fast", "small"], MODELS.__contains__)  # type: ignore[union-attr]
    assert gw.targets("big", RequestFacts()) == ["big"]
    assert gw.targets("chain", RequestFacts()) == ["big", "small"]  # expanded, each once
    assert gw.targets("", RequestFacts()) == ["small"]  # default_model, itself an alias
    with pytest.raises(ModelNotFound):
        gw.targets("gpt-4o-mini", RequestFacts())


def test_an_alias_another_process_just_wrote_resolves_on_the_next_request(tmp_path: Path) -> None:
    """The alias cache re-reads the file within a second; a name it does not know makes it look
    at once (another process wrote ``aliases.json``: the server's gateway test got a 404)."""
    gw = _gw(tmp_path)
    gw.aliases.set("first", ["small"], MODELS.__contains__)  # type: ignore[union-attr]
    assert gw.targets("first", RequestFacts()) == ["small"]  # the file is cached now
    # what ``hearth alias set`` in another process does: replace the file (a new inode)
    atomic_write_json(tmp_path / "aliases.json", {"aliases": {"first": ["small"], "new": ["big"]}})
    assert gw.is_routable("new")
    assert gw.targets("new", RequestFacts()) == ["big"]


def test_no_model_and_no_default_is_a_400(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="must not be empty") as e:
        _gw(tmp_path).targets("", RequestFacts())
    assert e.value.status == 400 and e.value.param == "model"


def test_hand_edited_cycle_is_an_error_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "aliases.json").write_text('{"aliases": {"a": ["b"], "b": ["a"]}}')
    with pytest.raises(InvalidRequest, match="alias cycle"):
        _gw(tmp_path).targets("a", RequestFacts())


RULES = parse_rules(
    [
        {"target": "small", "max_prompt_tokens": 50, "priority": 1},
        {"target": "big", "priority": 0},
        {"target": "big", "needs": ["tools", "json_schema"], "priority": 0},
        {"target": "small", "keywords": ["Translate"], "priority": 5},
        {"target": "embedder", "needs": ["embeddings"]},
    ]
)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (RequestFacts((), "hi", "hi"), "small"),  # short: the priority-1 length rule
        (RequestFacts((), "x" * 400, "x"), "big"),  # ~100 tokens: over small's limit
        (RequestFacts(("tools",), "hi", "hi"), "big"),  # only the tools rule serves tools
        (RequestFacts((), "x" * 400, "please translate this"), "small"),  # keyword, priority 5
        (RequestFacts(("embeddings",), "hi", "hi"), "embedder"),
    ],
)
def test_auto_picks_by_rule(tmp_path: Path, facts: RequestFacts, expected: str) -> None:
    assert _gw(tmp_path, Routing(auto=RULES)).targets("auto", facts) == [expected]


def test_auto_ties_prefer_a_loaded_model(tmp_path: Path) -> None:
    rules = (AutoRule("small"), AutoRule("big"))
    assert _gw(tmp_path, Routing(auto=rules)).targets("auto", RequestFacts()) == ["small"]
    loaded_big = _gw(tmp_path, Routing(auto=rules), loaded={"big"})
    assert loaded_big.targets("auto", RequestFacts()) == ["big"]


def test_auto_without_a_match_is_a_400_with_the_reason(tmp_path: Path) -> None:
    rules = (AutoRule("small", max_prompt_tokens=10),)
    with pytest.raises(InvalidRequest, match="no 'auto' routing rule matches.*needs tools"):
        _gw(tmp_path, Routing(auto=rules)).targets("auto", RequestFacts(("tools",), "hi"))
    with pytest.raises(InvalidRequest, match="has no rules"):
        _gw(tmp_path).targets("auto", RequestFacts())


def test_bad_rules_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"routing.auto\[0\].needs"):
        parse_rules([{"target": "a", "needs": ["telepathy"]}])
    with pytest.raises(ConfigError, match="target"):
        parse_rules([{"target": "auto"}])


@pytest.mark.parametrize(
    "err",
    [
        InsufficientMemory("no room", needed=2, available=1),
        ModelLoadFailed("broken"),
        QueueFull("full"),
    ],
)
def test_retryable_failures_fall_through(tmp_path: Path, err: HearthError) -> None:
    gw = _gw(tmp_path)
    gw.aliases.set("chain", ["big", "small"], MODELS.__contains__)  # type: ignore[union-attr]
    tried: list[str] = []

    async def start(m: str) -> str:
        tried.append(m)
        if m == "big":
            raise err
        return f"answer from {m}"

    assert asyncio.run(gw.run("chain", RequestFacts(), RequestContext(), start)) == (
        "answer from small",
        ["big", "small"],
    )
    assert tried == ["big", "small"]


def test_non_retryable_failures_answer_at_once(tmp_path: Path) -> None:
    gw = _gw(tmp_path)
    gw.aliases.set("chain", ["big", "small"], MODELS.__contains__)  # type: ignore[union-attr]
    tried: list[str] = []

    async def start(m: str) -> str:
        tried.append(m)
        raise InvalidRequest("bad request")

    with pytest.raises(InvalidRequest) as e:
        asyncio.run(gw.run("chain", RequestFacts(), RequestContext(), start))
    assert tried == ["big"] and e.value.route == ["big"]  # type: ignore[attr-defined]


def test_last_retryable_failure_is_raised_with_the_route(tmp_path: Path) -> None:
    gw = _gw(tmp_path)
    gw.aliases.set("chain", ["big", "small"], MODELS.__contains__)  # type: ignore[union-attr]

    async def start(m: str) -> str:
        raise InsufficientMemory(f"{m} does not fit", needed=2, available=1)

    with pytest.raises(InsufficientMemory, match="small") as e:
        asyncio.run(gw.run("chain", RequestFacts(), RequestContext(), start))
    assert e.value.route == ["big", "small"]  # type: ignore[attr-defined]


def test_an_unload_racing_the_start_retries_the_same_target_once(tmp_path: Path) -> None:
    """A model found, then retired before the request was submitted (nothing ran): the same
    target starts once more (which loads it again); an unload after the start answers."""
    gw = _gw(tmp_path)
    calls: list[str] = []

    async def raced_once(m: str) -> str:
        calls.append(m)
        if len(calls) == 1:
            raise ModelUnloaded("unloading", raced=True)
        return m

    assert asyncio.run(gw.run("small", RequestFacts(), RequestContext(), raced_once)) == (
        "small",
        ["small"],
    )
    assert calls == ["small", "small"]

    async def always_raced(m: str) -> str:
        calls.append(m)
        raise ModelUnloaded("unloading", raced=True)

    calls.clear()
    with pytest.raises(ModelUnloaded):
        asyncio.run(gw.run("small", RequestFacts(), RequestContext(), always_raced))
    assert calls == ["small", "small"]  # once more, not forever

    async def unloaded_while_running(m: str) -> str:
        calls.append(m)
        raise ModelUnloaded("unloaded while it ran")

    calls.clear()
    with pytest.raises(ModelUnloaded):
        asyncio.run(gw.run("small", RequestFacts(), RequestContext(), unloaded_while_running))
    assert calls == ["small"]
