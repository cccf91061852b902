"""A request's prompt, made ready for a loaded model: bounded tokenizing, the chat template
rendered off the event loop, the fit in the context, the constraint checked, and the
:class:`PreparedChat` that each of a request's ``n`` choices is submitted from."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from app.core.inference.chat_template import ChatTemplate
from app.core.inference.generation import Generation
from app.core.inference.images import ImageInput
from app.core.inference.reasoning import reasoning_splitter
from app.core.inference.tools import ToolCallParser, ToolSetup
from app.core.requests import ChatRequest
from app.core.types import Constraint, GenerationRequest, LoadedModel, SamplingParams
from app.errors import ContextLengthExceeded, InvalidRequest, UnsupportedParameter

# what the chat template is given by the service; a request cannot replace them
RESERVED_TEMPLATE_VARS = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


def check_size(lm: LoadedModel, text: str, param: str) -> None:
    """Refuse a text too long to fit the context whatever its tokens (each token is at most
    ``max_token_bytes`` bytes), so a huge input costs no tokenizer time."""
    try:
        n_bytes = len(text.encode("utf-8"))
    except UnicodeEncodeError as e:  # a lone surrogate: not text a tokenizer can read
        raise InvalidRequest(
            f"the text is not valid Unicode ({e.reason} at character {e.start})", param=param
        ) from None
    limit = lm.context_length * max(1, lm.max_token_bytes)
    if n_bytes > limit:
        raise ContextLengthExceeded(
            f"This model's context is {lm.context_length} tokens; a text of {n_bytes} bytes "
            f"cannot fit it (at most {limit} bytes can). Shorten it or load the model with a "
            f"larger context.",
            param=param,
        )


async def tokenize(
    lm: LoadedModel, text: str, param: str, *, parse_special: bool, add_special: bool = True
) -> list[int]:
    """Tokenize off the event loop, after ``check_size``."""
    check_size(lm, text, param)
    return await asyncio.to_thread(
        lm.tokenize, text, add_special=add_special, parse_special=parse_special
    )


async def tokenize_images(lm: LoadedModel, text: str, images: tuple[ImageInput, ...]) -> list[int]:
    """A prompt with images, tokenized by a model that takes them (image positions count)."""
    fn = getattr(lm, "tokenize_images", None)
    if fn is None or "vision" not in lm.capabilities:
        raise UnsupportedParameter("this model does not take images", param=images[0].where)
    return list(await fn(text, images))


def open_final_message(prompt: str, final: str) -> str:
    """The rendered prompt cut just after the last message's text, so the model continues that
    message (the template's end-of-turn marker after it goes)."""
    at = prompt.rfind(final.rstrip()) if final.strip() else -1
    if at < 0:
        raise InvalidRequest(
            "'continue_final_message' needs a last message whose text the chat template keeps",
            param="continue_final_message",
        )
    return prompt[: at + len(final.rstrip())]


def check_fits(lm: LoadedModel, n_prompt: int, param: str) -> None:
    if n_prompt == 0:
        raise InvalidRequest("the prompt is empty", param=param)
    if n_prompt >= lm.context_length:
        raise ContextLengthExceeded(
            f"This model's context is {lm.context_length} tokens; the prompt has {n_prompt} "
            f"tokens and leaves no room to generate. Shorten the prompt or load the model with "
            f"a larger context.",
            param=param,
        )


async def prepare_chat(
    lm: LoadedModel,
    req: ChatRequest,
    call: ToolSetup,
    constraint: Constraint | None,
    *,
    must_fit: bool = True,
) -> PreparedChat:
    t0 = time.perf_counter()
    require(lm, "chat", req.model)
    check_bias(lm, req.sampling)
    special = lm.special_tokens
    extra = dict(req.template_vars)
    reserved = set(extra) & RESERVED_TEMPLATE_VARS
    if reserved:
        raise InvalidRequest(
            f"template variable '{sorted(reserved)[0]}' is set by Hearth itself",
            param="chat_template_kwargs",
        )
    if call.template_tools:
        extra["tools"] = call.template_tools
    messages = call.messages

    images = tuple(im for m in messages for im in m.images)

    def render() -> tuple[ChatTemplate, str, list[int] | None]:
        template = ChatTemplate(
            lm.chat_template,
            bos_token=special.get("bos", ""),
            eos_token=special.get("eos", ""),
        )
        prompt = template.render(
            messages,
            add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
            **extra,
        )
        if req.continue_final_message:
            prompt = open_final_message(prompt, messages[-1].content if messages else "")
        if images:
            return template, prompt, None
        # tokenized in the same thread: one hand-over each way instead of two (a tiny prompt's
        # preparation 0.73 ms before)
        check_size(lm, prompt, "messages")
        return template, prompt, lm.tokenize(prompt, add_special=True, parse_special=True)

    # a template is a model's code: it compiles and renders off the event loop, bounded
    template, prompt, text_tokens = await asyncio.to_thread(render)
    if text_tokens is None:  # the runtime places them (llama.cpp: libmtmd; llama/vision.py)
        tokens = await tokenize_images(lm, prompt, images)
    else:
        tokens = text_tokens
    bos = special.get("bos_id")
    if bos is not None and len(tokens) > 1 and tokens[0] == tokens[1] == int(bos):
        tokens = tokens[1:]  # the template wrote a BOS and the tokenizer added another
    if must_fit:
        check_fits(lm, len(tokens), "messages")
    if constraint is not None:
        await lm.check_constraint(constraint)
    return PreparedChat(
        model_id=req.model,
        template_source=lm.chat_template,
        prompt=prompt,
        base=GenerationRequest(
            prompt_tokens=tuple(tokens),
            max_tokens=req.max_tokens,
            sampling=req.sampling,
            stop=tuple(req.stop) + template.default_stops,
            request_id=req.request_id,
            logprobs=req.logprobs,
            constraint=constraint,
            prepare_ms=(time.perf_counter() - t0) * 1000,
            images=images,
            priority=req.priority,
        ),
        call=call,
    )


def choice_sampling(sampling: SamplingParams, i: int) -> SamplingParams:
    """Choice ``i``'s sampling: its own seed when one is given, so seeded choices differ."""
    if sampling.seed is None or i == 0:
        return sampling
    return replace(sampling, seed=sampling.seed + i)


@dataclass(frozen=True, slots=True)
class PreparedChat:
    """A chat prompt rendered and tokenized once; each :meth:`start` is one more choice."""

    model_id: str
    template_source: str | None
    prompt: str
    base: GenerationRequest
    call: ToolSetup

    def start(self, lm: LoadedModel, sampling: SamplingParams) -> Generation:
        splitter = reasoning_splitter(self.template_source, self.prompt)
        parser = (
            ToolCallParser(
                self.call.family,
                max_calls=self.call.max_calls,
                end_on_repeat=self.call.end_on_repeat,
                names=self.call.names,
            )
            if self.call.active
            else None
        )
        stream = lm.submit(replace(self.base, sampling=sampling))
        return Generation(self.model_id, len(self.base.prompt_tokens), stream, splitter, parser)


def check_bias(lm: LoadedModel, sampling: SamplingParams) -> None:
    vocab = int(lm.special_tokens.get("n_vocab") or 0)
    for tok, _ in sampling.logit_bias:
        if vocab and not 0 <= tok < vocab:
            raise InvalidRequest(
                f"logit_bias token id {tok} is out of this model's vocabulary (0-{vocab - 1})",
                param="logit_bias",
            )


def require(lm: LoadedModel, capability: str, model_id: str) -> None:
    if capability not in lm.capabilities:
        raise InvalidRequest(
            f"'{model_id}' is an embedding model; it cannot do {capability}s (use /v1/embeddings)",
            param="model",
        )
