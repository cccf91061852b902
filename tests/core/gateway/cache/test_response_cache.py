"""The response cache in the service, on the fake runtime over the real Worker and
a real SQLite file: an exact repeat never reaches the runtime, what changes the output changes
the key and what does not leaves it, non-deterministic requests are bypassed unless forced,
the TTL and the entry bound hold (an injected clock), and failed or cancelled generations are
never stored."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.core.engine.presets import PresetStore
from app.core.gateway import AliasStore
from app.core.gateway.cache.replay import ResponseCache, directive, local_identity, request_keys
from app.core.gateway.cache.store import CacheConfig, CachedAnswer, CacheStore, decode, encode
from app.core.inference.generation import Choices
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest, CompletionRequest, RequestContext
from app.core.service import assemble
from app.core.types import (
    ChatMessage,
    Constraint,
    Delta,
    LoadOptions,
    SamplingParams,
    Timings,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model

GREEDY = SamplingParams(temperature=0.0)
ASK = (ChatMessage("user", "What is two and two?"),)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A service on the fake runtime with the cache on (``config`` changes take effect at once)."""

    def __init__(self, tmp_path: Path, hold_at: int | None = None, **config: Any) -> None:
        lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
        lib.import_path(write_model(tmp_path / "src" / "m.gguf", chat_template=CHATML))
        (model,) = lib.list()
        self.model = model.id
        self.runtime = FakeRuntime(delay=0.0, pieces=("Four", ".", " Done"), hold_at=hold_at)
        self.config = CacheConfig(mode="exact", **config)
        self.clock = Clock()
        self.store = CacheStore(tmp_path / "data" / "response_cache.sqlite")
        presets = PresetStore(tmp_path / "presets.json")
        self.service = assemble(
            lib,
            {"gguf": self.runtime},
            load_defaults=LoadOptions,
            aliases=AliasStore(tmp_path / "aliases.json"),
            presets=presets,
            cache=lambda embed: ResponseCache(
                self.store,
                lambda: self.config,
                embed=embed,
                clock=self.clock,
                identity=local_identity(lib, presets),  # as build_service wires it
            ),
        )

    @property
    def submits(self) -> int:
        return sum(m.submit_calls for m in self.runtime.models)

    def chat_req(self, **kw: Any) -> ChatRequest:
        kw.setdefault("sampling", GREEDY)
        return ChatRequest(self.model, kw.pop("messages", ASK), **kw)

    async def chat(self, **kw: Any) -> tuple[str | None, list[list[Delta]]]:
        choices = await self.service.chat(self.chat_req(**kw))
        return choices.cache, await drain(choices)


async def drain(choices: Choices) -> list[list[Delta]]:
    out = []
    for i in range(choices.count):
        out.append([d async for d in await choices.get(i)])
    return out


def text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


async def test_an_exact_repeat_is_answered_without_the_runtime(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        first_result, first = await rig.chat()
        assert first_result == "miss" and rig.submits == 1
        again, second = await rig.chat()
        assert again == "hit"
        assert rig.submits == 1  # the runtime saw one generation
        assert [replace(d, usage=None, timings=None) for d in second[0]] == [
            replace(d, usage=None, timings=None) for d in first[0]
        ]
        u0, u1 = first[0][-1].usage, second[0][-1].usage
        assert u0 is not None and u1 is not None
        assert u1.prompt_tokens == u0.prompt_tokens > 0
        assert u1.cached_tokens == u0.prompt_tokens  # usage reports the prompt as cached
        assert u1.completion_tokens == u0.completion_tokens
        stats = rig.store.stats()
        assert (stats["hits"], stats["misses"], stats["entries"]) == (1, 1, 1)
    finally:
        await rig.service.close()


async def test_cache_off_stores_nothing_and_names_no_result(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.config = CacheConfig(mode="off")
    try:
        for _ in range(2):
            result, _ = await rig.chat()
            assert result is None
        assert rig.submits == 2 and rig.store.stats()["entries"] == 0
        rig.service.cache.mode_override = "exact"  # hearth serve --cache exact
        assert (await rig.chat())[0] == "miss"
        assert (await rig.chat())[0] == "hit"
    finally:
        await rig.service.close()


@pytest.mark.parametrize(
    "change",
    [
        {"sampling": SamplingParams(temperature=0.0, top_k=5)},
        {"sampling": SamplingParams(temperature=0.0, seed=7)},
        {"sampling": SamplingParams(temperature=0.0, logit_bias=((11, 1.0),))},
        {"max_tokens": 2},
        {"stop": ("Done",)},
        {"messages": (ChatMessage("system", "Be terse."), *ASK)},
        {"constraint": Constraint("json_object")},
        {"logprobs": 2},
        {"n": 2},
    ],
)
async def test_a_field_that_changes_the_output_misses(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    rig = Rig(tmp_path)
    try:
        assert (await rig.chat())[0] == "miss"
        assert (await rig.chat(**change))[0] == "miss"
        assert rig.submits == 1 + change.get("n", 1)
    finally:
        await rig.service.close()


def test_fields_that_do_not_change_the_output_keep_the_key() -> None:
    base = ChatRequest("m", ASK, GREEDY)
    key = request_keys(base, ["m"])[0]
    for same in (
        replace(base, ttl=30.0, request_id="abc"),
        replace(base, sampling=SamplingParams(temperature=0)),  # int 0 as some parser gives it
    ):
        assert request_keys(same, ["m"])[0] == key
    assert request_keys(base, ["other"])[0] != key  # the model as resolved is in the key
    assert request_keys(base, ["m", "fallback"])[0] != key


def test_each_key_partition_has_its_own_exact_and_semantic_keys() -> None:
    base = ChatRequest("m", ASK, GREEDY)
    shared = request_keys(base, ["m"])
    a, b, none = (request_keys(base, ["m"], p) for p in ("digest-a", "digest-b", ""))
    assert len({shared[0], a[0], b[0], none[0]}) == 4  # no key is another's, nor the shared one
    assert len({shared[1], a[1], b[1], none[1]}) == 4  # semantic keys too
    assert request_keys(base, ["m"], "digest-a") == a


async def test_aliases_resolve_before_the_key(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.service.routing.set_alias("fast", [rig.model])
        assert (await rig.chat())[0] == "miss"
        # the same request through an alias is the same resolved request
        choices = await rig.service.chat(replace(rig.chat_req(), model="fast"))
        assert choices.cache == "hit" and choices.model == rig.model
        await drain(choices)
        assert rig.submits == 1
    finally:
        await rig.service.close()


async def test_an_edited_preset_misses(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        assert (await rig.chat())[0] == "miss"
        assert (await rig.chat())[0] == "hit"
        rig.service.models.save_preset(
            rig.model, {"tool_format": "hermes"}
        )  # changes what it writes
        assert (await rig.chat())[0] == "miss"
        assert (await rig.chat())[0] == "hit"
    finally:
        await rig.service.close()


async def test_non_deterministic_requests_bypass_unless_forced(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    hot = SamplingParams(temperature=0.8)
    try:
        for _ in range(2):
            assert (await rig.chat(sampling=hot))[0] == "bypass"
        assert rig.submits == 2 and rig.store.stats()["entries"] == 0
        force = RequestContext(cache="force")
        assert (await rig.chat(sampling=hot, context=force))[0] == "miss"
        assert (await rig.chat(sampling=hot, context=force))[0] == "hit"
        assert rig.submits == 3
        # the client opts a deterministic request out
        assert (await rig.chat(context=RequestContext(cache="bypass")))[0] == "bypass"
        assert rig.store.stats()["bypasses"] == 3
    finally:
        await rig.service.close()


async def test_entries_expire_after_the_ttl(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ttl_s=60.0)
    try:
        assert (await rig.chat())[0] == "miss"
        rig.clock.now += 59
        assert (await rig.chat())[0] == "hit"
        rig.clock.now += 2  # 61 s after it was stored: a use does not extend its life
        assert (await rig.chat())[0] == "miss"
        assert rig.submits == 2
    finally:
        await rig.service.close()


async def test_the_least_recently_used_entry_goes_past_the_bound(tmp_path: Path) -> None:
    rig = Rig(tmp_path, max_entries=2)
    asks = [(ChatMessage("user", f"question {i}"),) for i in range(3)]
    try:
        for i in (0, 1):
            rig.clock.now += 1
            assert (await rig.chat(messages=asks[i]))[0] == "miss"
        rig.clock.now += 1
        assert (await rig.chat(messages=asks[0]))[0] == "hit"  # 0 is now the most recent
        rig.clock.now += 1
        assert (await rig.chat(messages=asks[2]))[0] == "miss"  # 1 goes
        assert rig.store.stats()["entries"] == 2
        assert (await rig.chat(messages=asks[0]))[0] == "hit"
        assert (await rig.chat(messages=asks[2]))[0] == "hit"
        assert (await rig.chat(messages=asks[1]))[0] == "miss"
    finally:
        await rig.service.close()


async def test_a_failed_generation_is_not_stored(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        await rig.service.models.load(rig.model)
        rig.runtime.models[0].engine.fail_step.add("boom")
        result, out = await rig.chat(request_id="boom")
        assert result == "miss" and out[0][-1].finish_reason == "error"
        assert rig.store.stats()["entries"] == 0
        rig.runtime.models[0].engine.fail_step.clear()
        assert (await rig.chat())[0] == "miss"  # asked again: generated, then stored
        assert (await rig.chat())[0] == "hit"
    finally:
        await rig.service.close()


async def test_a_cancelled_generation_is_not_stored(tmp_path: Path) -> None:
    rig = Rig(tmp_path, hold_at=1)  # the second piece waits until the request is cancelled
    try:
        choices = await rig.service.chat(rig.chat_req())
        gen = choices.first
        deltas = []
        async for d in gen:
            deltas.append(d)
            if d.text:
                gen.cancel()  # what a client going away or the time limit does
        assert deltas[-1].finish_reason == "cancelled"
        assert rig.store.stats()["entries"] == 0
    finally:
        await rig.service.close()


async def test_a_stream_abandoned_midway_is_not_stored(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        choices = await rig.service.chat(rig.chat_req())
        it = aiter(choices.first)
        await anext(it)  # the client went away after the first piece: nobody reads on
        choices.cancel()
        assert rig.store.stats()["entries"] == 0
        assert (await rig.chat())[0] == "miss"
    finally:
        await rig.service.close()


async def test_completions_are_cached_per_prompt_list(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:

        async def complete(*prompts: str | tuple[int, ...]) -> tuple[str | None, list[str]]:
            req = CompletionRequest(rig.model, tuple(prompts), GREEDY, n=2)
            choices = await rig.service.complete(req)
            return choices.cache, [text(ds) for ds in await drain(choices)]

        first = await complete("Once upon", (11, 12, 13))
        assert first[0] == "miss" and len(first[1]) == 4 and rig.submits == 4
        assert await complete("Once upon", (11, 12, 13)) == ("hit", first[1])
        assert rig.submits == 4
        assert (await complete("Once upon"))[0] == "miss"
    finally:
        await rig.service.close()


async def test_semantic_without_an_embedding_model_acts_as_exact_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(tmp_path)
    rig.config = CacheConfig(mode="semantic")
    try:
        with caplog.at_level("WARNING", logger="app.core.gateway.cache.replay"):
            assert (await rig.chat())[0] == "miss"
            assert (await rig.chat())[0] == "hit"
            other = (ChatMessage("user", "What is two plus two?"),)
            assert (await rig.chat(messages=other))[0] == "miss"
        warnings = [r for r in caplog.records if "embedding_model" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        await rig.service.close()


async def test_a_clear_is_seen_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        assert (await rig.chat())[0] == "miss"
        other = CacheStore(rig.store.path)  # what `hearth cache clear` opens
        assert other.clear() == 1
        other.close()
        assert (await rig.chat())[0] == "miss"
        assert rig.submits == 2
    finally:
        await rig.service.close()


def test_stored_deltas_come_back_whole() -> None:
    """Every field a delta carries survives the store: text, think text, tool-call fragments,
    logprobs with their alternatives, the final's usage, timings and stop string."""
    deltas = (
        Delta(text="Hi", token_count=1, reasoning="hm", logprobs=(
            TokenLogprob("Hi", -0.5, (72, 105), (("Hi", -0.5, (72, 105)), ("Ho", -1.5, (72, 111)))),
        )),
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "get"), ToolCallDelta(0, arguments='{"a":'))),
        Delta(
            finish_reason="tool_calls",
            usage=Usage(7, 3, 2, 1),
            timings=Timings(prompt_n=7, prompt_ms=1.5, predicted_n=3, cache_n=2, cpu_busy=True),
            stop_string="</s>",
        ),
    )  # fmt: skip
    answer = CachedAnswer("m", (deltas, deltas[-1:]))
    assert decode(encode(answer)) == answer


def test_an_unknown_directive_counts_as_none(tmp_path: Path) -> None:
    assert directive("sometimes") is None
    assert directive(None) is None
    assert directive(" Force ") == "force"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"mode": "sometimes"}, "cache.mode must be one of off, exact, semantic"),
        ({"max_entries": 0}, "cache.max_entries must be at least 1"),
        ({"ttl_s": 0}, "cache.ttl_s must be a positive number"),
        ({"semantic_threshold": 1.5}, "cache.semantic_threshold must be in (0, 1]"),
        ({"embedding_model": 3}, "cache.embedding_model must be a string"),
    ],
)
def test_invalid_cache_settings_are_refused(raw: dict[str, Any], message: str) -> None:
    from app.errors import ConfigError
    from app.settings import settings_from_dict

    assert settings_from_dict({}).cache == CacheConfig()  # off unless set
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings_from_dict({"cache": raw})


@pytest.mark.parametrize("embedder", ["no-such-embedder", "the chat model"])
async def test_a_failing_embedding_model_acts_as_exact_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, embedder: str
) -> None:
    rig = Rig(tmp_path)
    name = rig.model if embedder == "the chat model" else embedder  # not an embedding model
    rig.config = CacheConfig(mode="semantic", embedding_model=name)
    try:
        with caplog.at_level("WARNING", logger="app.core.gateway.cache.replay"):
            assert (await rig.chat())[0] == "miss"
            assert (await rig.chat())[0] == "hit"
            other = (ChatMessage("user", "What is two plus two?"),)
            assert (await rig.chat(messages=other))[0] == "miss"
        warnings = [r for r in caplog.records if "cannot embed" in r.getMessage()]
        assert len(warnings) == 1 and name in warnings[0].getMessage()
    finally:
        await rig.service.close()
