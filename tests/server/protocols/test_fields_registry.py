"""Nothing a client sends is silently ignored: every documented field of every protocol is in
app/server/protocols/fields_registry.py, each refused one is a 400 naming it on the real server,
each honoured or accepted one is taken, and every key a parser reads is classified."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.server.protocols import fields_registry as reg
from app.server.protocols.anthropic.parse import parse_request
from app.server.protocols.llama.parse import parse_infill
from app.server.protocols.ollama.parse import parse_chat as ollama_chat
from app.server.protocols.ollama.parse import parse_embed, parse_generate, parse_options
from app.server.protocols.openai import tokenizer
from app.server.protocols.openai.parse import parse_chat, parse_completion, parse_embeddings
from app.server.protocols.responses.parse import parse_request as parse_responses
from tests.conftest import Served

# the fields each protocol's own reference names (and vLLM's and Ollama's extras)
DOCUMENTED = {
    "openai.chat": "messages model audio frequency_penalty function_call functions logit_bias "
    "logprobs max_completion_tokens max_tokens metadata modalities n parallel_tool_calls "
    "prediction presence_penalty prompt_cache_key reasoning_effort response_format "
    "safety_identifier seed service_tier stop store stream stream_options temperature "
    "tool_choice tools top_logprobs top_p user verbosity web_search_options top_k min_p "
    "repetition_penalty guided_json guided_regex guided_choice guided_grammar "
    "structured_outputs min_tokens ignore_eos skip_special_tokens include_stop_str_in_output "
    "truncate_prompt_tokens allowed_token_ids bad_words prompt_logprobs echo "
    "add_generation_prompt continue_final_message chat_template_kwargs",
    "openai.completions": "model prompt best_of echo frequency_penalty logit_bias logprobs "
    "max_tokens n presence_penalty seed stop stream stream_options suffix temperature top_p "
    "user top_k min_p repetition_penalty guided_json min_tokens ignore_eos prompt_logprobs "
    "truncate_prompt_tokens allowed_token_ids bad_words include_stop_str_in_output",
    "openai.embeddings": "input model dimensions encoding_format user",
    "openai.responses": "background conversation include input instructions max_output_tokens "
    "max_tool_calls metadata model parallel_tool_calls previous_response_id prompt "
    "prompt_cache_key reasoning safety_identifier service_tier store stream stream_options "
    "temperature text tool_choice tools top_logprobs top_p truncation user",
    "anthropic.messages": "model messages max_tokens system stop_sequences stream temperature "
    "top_p top_k tools tool_choice thinking metadata container mcp_servers service_tier",
    "ollama.chat": "model messages tools format options stream keep_alive think",
    "ollama.generate": "model prompt suffix images format options system template stream raw "
    "keep_alive context think",
    "ollama.embed": "model input truncate options keep_alive dimensions",
    "ollama.options": "num_keep seed num_predict top_k top_p min_p typical_p repeat_last_n "
    "temperature repeat_penalty presence_penalty frequency_penalty penalize_newline stop numa "
    "num_ctx num_batch num_gpu main_gpu use_mmap num_thread mirostat mirostat_tau mirostat_eta "
    "tfs_z",
    "llama.infill": "input_prefix input_suffix input_extra prompt n_predict stream "
    "cache_prompt id_slot samplers temperature top_k top_p min_p seed stop repeat_penalty "
    "repeat_last_n presence_penalty frequency_penalty n_probs n_indent t_max_prompt_ms "
    "t_max_predict_ms n_keep typical_p mirostat dry_multiplier xtc_probability lora "
    "response_fields",
    "tokenize": "model prompt add_special_tokens return_token_strs messages "
    "add_generation_prompt continue_final_message chat_template_kwargs tools content",
    "detokenize": "model tokens",
    "openai.audio.transcriptions": "file model chunking_strategy include language prompt "
    "response_format stream temperature timestamp_granularities known_speaker_names "
    "known_speaker_references",
    "openai.audio.translations": "file model prompt response_format temperature",
}
# multipart forms: walked on the real server by tests/server/audio/test_hostile_audio.py
FORMS = {"openai.audio.transcriptions", "openai.audio.translations"}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_every_documented_field_is_classified(name: str) -> None:
    table = reg.TABLES[name]
    assert set(DOCUMENTED[name].split()) <= set(table), name
    for key, field in table.items():
        assert field.how in ("honoured", "accepted", "refused"), key
        assert field.how == "honoured" or field.why, f"{name}.{key} needs its reason"


class Reads(dict):  # type: ignore[type-arg]
    """A body that notes each key a parser reads."""

    read: set[str]

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def _reads(parse: Any, body: dict[str, Any]) -> set[str]:
    data = Reads(body)
    data.read = set()
    parse(data)
    return data.read


MSGS = [{"role": "user", "content": "hi"}]


def ident(name: str) -> str:
    return name


@pytest.mark.parametrize(
    ("name", "parse", "body"),
    [
        ("openai.chat", parse_chat, {"model": "m", "messages": MSGS}),
        ("openai.completions", parse_completion, {"model": "m", "prompt": "hi"}),
        ("openai.embeddings", parse_embeddings, {"model": "m", "input": "hi"}),
        ("openai.responses", parse_responses, {"model": "m", "input": "hi"}),
        ("openai.responses", parse_responses, {"model": "m", "input": MSGS}),
        ("anthropic.messages", parse_request, {"model": "m", "messages": MSGS, "max_tokens": 1}),
        ("ollama.chat", lambda d: ollama_chat(d, ident), {"model": "m", "messages": MSGS}),
        ("ollama.generate", lambda d: parse_generate(d, ident), {"model": "m", "prompt": "hi"}),
        ("ollama.embed", lambda d: parse_embed(d, ident), {"model": "m", "input": "hi"}),
        ("ollama.options", parse_options, {}),
        ("llama.infill", parse_infill, {"input_prefix": "a", "input_suffix": "b"}),
        ("tokenize", tokenizer.parse_tokenize, {"prompt": "hi"}),
        ("tokenize", tokenizer.parse_tokenize, {"messages": MSGS}),
        ("tokenize", tokenizer.parse_tokenize, {"content": "hi"}),
        ("detokenize", tokenizer.parse_detokenize, {"tokens": [1]}),
    ],
)
def test_every_key_a_parser_reads_is_classified(name: str, parse: Any, body: dict) -> None:
    assert _reads(parse, body) <= set(reg.TABLES[name]), name


# -- the walk, on the real server ---------------------------------------------------------------
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# an honoured field's value (with what it needs beside it) where a plain value would not do
SAMPLES: dict[str, dict[str, Any]] = {
    "top_logprobs": {"top_logprobs": 2, "logprobs": True},
    "tools": {"tools": [TOOL]},
    "tool_choice": {"tools": [TOOL], "tool_choice": "auto"},
    "logit_bias": {"logit_bias": {"1": -1}},
    "response_format": {"response_format": {"type": "json_object"}},
    "stream_options": {"stream_options": {"include_usage": True}, "stream": True},
    "stop": {"stop": ["\n\n"]},
    "chat_template_kwargs": {"chat_template_kwargs": {"x": 1}},
    "reasoning_effort": {"reasoning_effort": "low"},
    "add_generation_prompt": {"add_generation_prompt": False},
    "continue_final_message": {"continue_final_message": True},
    "keep_alive": {"keep_alive": "5m"},
    "ttl": {"ttl": 300},
    "seed": {"seed": 3},
    "n": {"n": 2},
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.9},
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.05},
    "repeat_penalty": {"repeat_penalty": 1.1},
    "repetition_penalty": {"repetition_penalty": 1.1},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "parallel_tool_calls": {"parallel_tool_calls": False},
    "thinking": {"thinking": {"type": "disabled"}},
    "system": {"system": "Be brief."},
    "stop_sequences": {"stop_sequences": ["\n\n"]},
    "format": {"format": "json"},
    "think": {"think": False},
    "options": {"options": {"temperature": 0}},
    "logprobs": {"logprobs": True},
    "raw": {"raw": True},
    "encoding_format": {"encoding_format": "float"},
    "dimensions": {"dimensions": 8},
    "num_predict": {"num_predict": 1},
    **{
        flag: {flag: False}
        for flag in (
            "stream",
            "add_special_tokens",
            "add_special",
            "parse_special",
            "with_pieces",
            "return_token_strs",
        )
    },
}
# where one protocol spells a field its own way
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
OWN_SAMPLES = {
    ("openai.completions", "logprobs"): {"logprobs": 2},
    ("openai.responses", "tools"): {"tools": [RESPONSES_TOOL]},
    ("openai.responses", "tool_choice"): {"tools": [RESPONSES_TOOL], "tool_choice": "auto"},
    ("openai.responses", "top_logprobs"): {"top_logprobs": 2},
    ("openai.responses", "text"): {"text": {"format": {"type": "text"}}},
    ("openai.responses", "reasoning"): {"reasoning": {"effort": "low"}},
    ("openai.responses", "include"): {"include": []},
    ("openai.responses", "instructions"): {"instructions": "Be brief."},
    ("openai.responses", "store"): {"store": False},
    ("llama.infill", "prompt"): {"prompt": "x"},
    ("llama.infill", "samplers"): {"samplers": ["top_k", "top_p", "infill"]},
    ("llama.infill", "input_extra"): {"input_extra": [{"filename": "a.py", "text": "x"}]},
}
# what the scoring path implements (prompt logprobs, echoing the prompt): walked there
SCORING = {"echo", "prompt_logprobs"}
# a stored response to continue: walked by tests/server/clients/test_stored_responses.py
# fill-in-the-middle needs a model with FIM tokens: walked by tests/server/fim/
OWN_TESTS = SCORING | {"previous_response_id", "suffix"}
REFUSING = 7  # asks for something of any refused field


def _routes(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    chat = {"model": model, "messages": MSGS, "max_tokens": 1}
    return {
        "openai.chat": ("/v1/chat/completions", chat),
        "openai.completions": (
            "/v1/completions",
            {"model": model, "prompt": "hi", "max_tokens": 1},
        ),
        "openai.embeddings": ("/v1/embeddings", {"model": model, "input": "hi"}),
        "openai.responses": (
            "/v1/responses",
            {"model": model, "input": "hi", "max_output_tokens": 1},
        ),
        "anthropic.messages": ("/v1/messages", chat),
        "anthropic.count_tokens": ("/v1/messages/count_tokens", {"model": model, "messages": MSGS}),
        "ollama.chat": ("/api/chat", {**chat, "stream": False, "options": {"num_predict": 1}}),
        "ollama.generate": (
            "/api/generate",
            {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
        ),
        "ollama.embed": ("/api/embed", {"model": model, "input": "hi"}),
        "ollama.options": (
            "/api/generate",
            {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
        ),
        "llama.infill": (
            "/infill",
            {"model": model, "input_prefix": "a", "input_suffix": "b", "n_predict": 1},
        ),
        "tokenize": ("/tokenize", {"model": model, "prompt": "hi"}),
        "detokenize": ("/detokenize", {"model": model, "tokens": [1]}),
    }


def _param(r: httpx.Response) -> str | None:
    if r.status_code < 400:
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return err.get("param") or err.get("message")
    return str(err)


@pytest.mark.model
@pytest.mark.parametrize("name", sorted(set(reg.TABLES) - FORMS))
def test_the_walk_refused_fields_are_400s_naming_them(served: Served, name: str) -> None:
    path, base = _routes(served.model_id)[name]
    prefix = "options." if name == "ollama.options" else ""
    with httpx.Client(base_url=served.root, timeout=120) as c:
        for key, field in reg.TABLES[name].items():
            if key in OWN_TESTS or key in base or (name == "tokenize" and key in tokenizer.FORMS):
                continue  # the forms are one of three: each is walked by its own tests
            if field.how == "refused":
                extra = {key: REFUSING}
            else:
                extra = OWN_SAMPLES.get((name, key)) or SAMPLES.get(
                    key, {key: "x" if field.how == "accepted" else 1}
                )
            body = (
                {**base, "options": {**base["options"], **extra}} if prefix else {**base, **extra}
            )
            r = c.post(path, json=body)
            said = _param(r)
            if field.how == "refused":
                assert r.status_code == 400, (name, key, r.text)
                # OpenAI's shape names it in param; Anthropic's and Ollama's in the message
                assert said == prefix + key or f"'{prefix}{key}'" in str(said), (name, key, r.text)
                assert field.why in r.text or "unsupported" in r.text
            else:
                # taken: whatever else the answer says, it does not refuse this field
                named = said is not None and said.split(".")[0].split("[")[0] in (key, prefix + key)
                assert not named, (name, key, r.text)


def test_fields_once_dropped_now_reach_the_request() -> None:
    emb = parse_embed({"model": "m", "input": "hi", "dimensions": 8}, ident)
    assert emb.dimensions == 8
    msgs = parse_request(
        {
            "model": "m",
            "messages": MSGS,
            "max_tokens": 1,
            "thinking": {"type": "disabled"},
            "output_config": {"effort": "low"},
        }
    ).request
    assert msgs.template_vars == {"enable_thinking": False, "reasoning_effort": "low"}


@pytest.mark.model
def test_chat_closes_the_prompt_as_vllm_asks(served: Served) -> None:
    def prompt_tokens(**extra: Any) -> int:
        body = {"model": served.model_id, "messages": MSGS, "max_tokens": 1, **extra}
        r = httpx.post(f"{served.base_url}/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens"])

    opened = prompt_tokens()
    assert prompt_tokens(add_generation_prompt=False) < opened
    assert prompt_tokens(continue_final_message=True, add_generation_prompt=False) < opened
