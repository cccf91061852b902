"""Every documented request field of every protocol, classified once: ``honoured`` (it shapes
the answer), ``accepted`` (it cannot change the output, by design; the reason says why) or
``refused`` (it would change the output and Hearth cannot do it: a 400 ``unsupported_parameter``
naming it, unless its value asks for nothing, such as ``false`` or the default).

The parsers call :func:`refuse_unhonoured` with their table; the field walk in
tests/server/protocols/test_fields_registry.py sends each field to the real server and holds
the tables to what happens, so a field cannot be added without being classified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.errors import UnsupportedParameter

How = Literal["honoured", "accepted", "refused"]


@dataclass(frozen=True, slots=True)
class Field:
    how: How
    why: str = ""
    # values of a refused field that ask for nothing (besides null, false, 0, "", [] and {})
    harmless: tuple[Any, ...] = ()


Table = Mapping[str, Field]

HONOURED = Field("honoured")


def honoured(*names: str) -> dict[str, Field]:
    return dict.fromkeys(names, HONOURED)


def accepted(why: str, *names: str) -> dict[str, Field]:
    return dict.fromkeys(names, Field("accepted", why))


def refused(why: str, *names: str, harmless: tuple[Any, ...] = ()) -> dict[str, Field]:
    return dict.fromkeys(names, Field("refused", why, harmless))


def asks(field: Field, value: Any) -> bool:
    """Whether ``value`` asks a refused field for something (null, false, 0, "", [] and {}
    never do; nor its listed harmless values)."""
    if value is None or value is False or value in ("", 0, [], {}):
        return False
    return not any(value == h and type(value) is type(h) for h in field.harmless)


def refuse_unhonoured(data: Mapping[str, Any], table: Table, *, prefix: str = "") -> None:
    """A 400 naming the first refused field that asks for something; the rest pass through."""
    for key, value in data.items():
        field = table.get(key)
        if field is not None and field.how == "refused" and asks(field, value):
            raise UnsupportedParameter(
                f"'{prefix}{key}' is not supported: {field.why}", param=f"{prefix}{key}"
            )


# -- shared groups -----------------------------------------------------------------------------
_NO_EFFECT = "bookkeeping for the client's provider; it cannot change the output"
_TRACKING = accepted(_NO_EFFECT, "user", "metadata", "safety_identifier", "service_tier")
_CACHE = accepted(
    "Hearth reuses prompt caches on its own; the key cannot change the output",
    "prompt_cache_key",
    "cache_salt",
)
_SCHED = {
    **accepted("a backend hint: the answer is the same", "guided_decoding_backend"),
    # lower is served first (read before others' long prompts); the answer is the same
    **honoured("priority"),
}
_SAMPLING = honoured(
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "logit_bias",
    "stop",
    "max_tokens",
    "n",
    "stream",
    "stream_options",
    "model",
    "ttl",
    "keep_alive",
    "response_format",
    "logprobs",
)
# vLLM's sampling and output extras Hearth's runtimes have no counterpart for
_VLLM_REFUSED = {
    **refused(
        "no guided decoding by that name; send response_format (json_schema) instead",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
    ),
    **refused("there is no minimum output length", "min_tokens"),
    **refused("generation always stops at the end of the text", "ignore_eos"),
    **refused(
        "special tokens are always left out of the text",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        harmless=(True,),
    ),
    **refused("stop strings never reach the client", "include_stop_str_in_output"),
    **refused(
        "Hearth never truncates a prompt; one over the context is a 400", "truncate_prompt_tokens"
    ),
    **refused(
        "no token allow-list, ban list or stop ids; use logit_bias and stop",
        "allowed_token_ids",
        "bad_words",
        "stop_token_ids",
    ),
    **refused("no beam search", "use_beam_search", "length_penalty", harmless=(1, 1.0)),
    **refused("tokens are answered as text", "return_tokens_as_token_ids"),
    **refused(
        "no per-request engine arguments",
        "logits_processors",
        "vllm_xargs",
        "kv_transfer_params",
        "mm_processor_kwargs",
    ),
}
# the scoring fields (prompt logprobs, echoing the prompt) are the scoring path's
_SCORING = honoured("echo", "prompt_logprobs")

OPENAI_CHAT: Table = {
    **_SAMPLING,
    **_TRACKING,
    **_CACHE,
    **_SCHED,
    **_VLLM_REFUSED,
    **honoured(
        "messages",
        "max_completion_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "top_logprobs",
        "reasoning_effort",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "prompt_logprobs",
    ),
    **accepted("OpenAI's storing for its dashboard; Hearth keeps no chat completions", "store"),
    **accepted("a predicted output only saves time; the answer is the same", "prediction"),
    **refused("audio output is not available", "audio"),
    **refused("only text output is available", "modalities", harmless=(["text"],)),
    **refused("web search is not available", "web_search_options"),
    **refused("the model's length cannot be steered", "verbosity"),
    **refused(
        "the legacy functions API is not taken; send tools and tool_choice",
        "functions",
        "function_call",
    ),
    **refused("echoing the last message is not implemented in chat", "echo"),
    **refused("the model's own chat template renders the messages", "chat_template", "documents"),
}

OPENAI_COMPLETIONS: Table = {
    **_SAMPLING,
    **_TRACKING,
    **_CACHE,
    **_SCHED,
    **_VLLM_REFUSED,
    **_SCORING,
    **honoured("prompt", "max_completion_tokens", "suffix"),
    **refused("only best_of=1", "best_of", harmless=(1,)),
    **refused(
        "special tokens are always parsed in a text prompt", "add_special_tokens", harmless=(True,)
    ),
}

OPENAI_EMBEDDINGS: Table = {
    **honoured("model", "input", "encoding_format", "dimensions", "ttl", "keep_alive"),
    **accepted(_NO_EFFECT, "user"),
    **refused(
        "Hearth never truncates an input; one over the context is a 400", "truncate_prompt_tokens"
    ),
}

OPENAI_RESPONSES: Table = {
    **_TRACKING,
    **_CACHE,
    **honoured(
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "reasoning",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "include",
        "top_logprobs",
        "store",
        "previous_response_id",
        "stream",
        "chat_template_kwargs",
        "reasoning_effort",
        "ttl",
        "keep_alive",
    ),
    **accepted("it only shapes how the events are framed", "stream_options"),
    **refused("background responses are not supported: leave 'background' out", "background"),
    **refused(
        "conversations are not supported: continue with 'previous_response_id'", "conversation"
    ),
    **refused("stored prompt templates are not available; send the input itself", "prompt"),
    **refused("there is no cap on tool calls per response", "max_tool_calls"),
    **refused(
        "Hearth never drops input to fit; one over the context is a 400",
        "truncation",
        harmless=("disabled",),
    ),
}

ANTHROPIC_MESSAGES: Table = {
    **honoured(
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "ttl",
        "keep_alive",
    ),
    **accepted(_NO_EFFECT, "metadata", "service_tier"),
    **refused("no code execution container is available", "container"),
    **refused("MCP servers are not connected from the server side", "mcp_servers"),
    **accepted(
        "its edits clear earlier thinking and tool results to save context; the chat templates "
        "already leave earlier thinking out, and a conversation over the context is a 400",
        "context_management",
    ),
}
ANTHROPIC_COUNT_TOKENS: Table = ANTHROPIC_MESSAGES

# /api/chat and /api/generate's ``options``
OLLAMA_OPTIONS: Table = {
    **honoured(
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
        "num_predict",
        "stop",
    ),
    **accepted(
        "load and speed settings: they change how fast, not what, the model answers (the "
        "context is set when the model loads, and a prompt over it is a 400, never cut)",
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "num_thread",
        "numa",
        "use_mmap",
        "use_mlock",
        "low_vram",
        "f16_kv",
        "vocab_only",
        "logits_all",
        "embedding_only",
        "num_keep",
    ),
    **accepted("Ollama itself no longer reads it", "penalize_newline"),
    **accepted("read only with mirostat, which is refused", "mirostat_tau", "mirostat_eta"),
    **refused("mirostat sampling is not available", "mirostat"),
    **refused("tail-free sampling is not available", "tfs_z", harmless=(1, 1.0)),
    **refused("typical sampling is not available", "typical_p", harmless=(1, 1.0)),
    **refused(
        "the repeat penalty looks back over Ollama's default 64 tokens only",
        "repeat_last_n",
        harmless=(64,),
    ),
}

_OLLAMA_COMMON = {
    **honoured("model", "stream", "format", "think", "keep_alive", "options", "logprobs"),
    **honoured("top_logprobs"),
    **refused("the deprecated token context is not taken", "context"),
}
OLLAMA_CHAT: Table = {
    **_OLLAMA_COMMON,
    **honoured("messages", "tools", "tool_choice", "parallel_tool_calls"),
}
OLLAMA_GENERATE: Table = {
    **_OLLAMA_COMMON,
    **honoured("prompt", "system", "raw", "images", "suffix"),
    **refused("a custom template is not supported; use raw", "template"),
    **refused("tools need /api/chat", "tools"),
}
OLLAMA_EMBED: Table = {
    **honoured("model", "input", "keep_alive", "dimensions"),
    **accepted(
        "Hearth never truncates: an input over the context is a 400 whatever it says", "truncate"
    ),
    **accepted("embedding has no sampling options", "options"),
}

# llama-server's /infill (its /completion fields, llama.vscode's and Twinny's requests)
LLAMA_INFILL: Table = {
    **honoured(
        "model",
        "input_prefix",
        "input_suffix",
        "input_extra",
        "prompt",
        "n_predict",
        "max_tokens",
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "stop",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "n_indent",
        "samplers",
        "t_max_predict_ms",
        "t_max_prompt_ms",
        "ttl",
        "keep_alive",
    ),
    **accepted(
        "Hearth reuses the prompt cache on its own and picks the sequence itself; neither can "
        "change the output",
        "cache_prompt",
        "id_slot",
        "n_cache_reuse",
    ),
    **accepted(
        "Hearth never shifts the context (a prompt over it is a 400), so what to keep does not "
        "arise",
        "n_keep",
        "n_discard",
    ),
    **accepted("timings come on the final answer", "timings_per_token"),
    **refused("LoRA adapters are not applied per request", "lora"),
    **refused("token probabilities are not given on /infill", "n_probs", "post_sampling_probs"),
    **refused("one completion per request", "n", "n_cmpl", harmless=(1,)),
    **refused("only the answer's own fields are written", "response_fields", "return_tokens"),
    **refused("grammars are not taken on /infill", "grammar", "json_schema"),
    **refused("mirostat sampling is not available", "mirostat"),
    **refused("typical sampling is not available", "typical_p", harmless=(1, 1.0)),
    **refused("DRY sampling is not available", "dry_multiplier"),
    **refused("XTC sampling is not available", "xtc_probability"),
    **refused("dynamic temperature is not available", "dynatemp_range"),
    **refused("top-n-sigma sampling is not available", "top_n_sigma", harmless=(-1, -1.0)),
    **refused("the answer always ends at the end-of-text token", "ignore_eos"),
    **refused("token biases are not taken on /infill", "logit_bias"),
    **refused("the repeat penalty looks back over 64 tokens only", "repeat_last_n", harmless=(64,)),
}

TOKENIZE: Table = {
    **honoured(
        "model",
        "content",
        "add_special",
        "parse_special",
        "with_pieces",
        "prompt",
        "add_special_tokens",
        "return_token_strs",
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "reasoning_effort",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    ),
    **refused("the model's own chat template renders the messages", "chat_template"),
    **refused("no multimodal processor arguments", "mm_processor_kwargs"),
}
DETOKENIZE: Table = honoured("model", "tokens")

# speech to text (multipart forms: ``name[]`` fields are read as ``name``)
OPENAI_TRANSLATIONS: Table = {
    **honoured("file", "model", "prompt", "response_format", "temperature"),
}
OPENAI_TRANSCRIPTIONS: Table = {
    **OPENAI_TRANSLATIONS,
    **honoured("language", "stream", "timestamp_granularities"),
    **refused(
        "Whisper reads the whole file in its own 30-second windows; no server-side chunking",
        "chunking_strategy",
        harmless=("auto",),
    ),
    **refused("token log-probabilities are not returned for speech", "include"),
    **refused(
        "speaker diarization is not available",
        "known_speaker_names",
        "known_speaker_references",
    ),
}

TABLES: Mapping[str, Table] = {
    "openai.chat": OPENAI_CHAT,
    "openai.completions": OPENAI_COMPLETIONS,
    "openai.embeddings": OPENAI_EMBEDDINGS,
    "openai.responses": OPENAI_RESPONSES,
    "anthropic.messages": ANTHROPIC_MESSAGES,
    "anthropic.count_tokens": ANTHROPIC_COUNT_TOKENS,
    "ollama.chat": OLLAMA_CHAT,
    "ollama.generate": OLLAMA_GENERATE,
    "ollama.embed": OLLAMA_EMBED,
    "ollama.options": OLLAMA_OPTIONS,
    "llama.infill": LLAMA_INFILL,
    "tokenize": TOKENIZE,
    "detokenize": DETOKENIZE,
    "openai.audio.transcriptions": OPENAI_TRANSCRIPTIONS,
    "openai.audio.translations": OPENAI_TRANSLATIONS,
}
