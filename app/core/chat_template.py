"""Chat templates: the model's own Jinja template, rendered in a sandbox with size and time bounds.

A model without a template gets ``FALLBACK_TEMPLATE``: a plain transcript ("User: ...",
"Assistant: ...") that base models continue naturally; ``FALLBACK_STOPS`` end the turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.core.types import ChatMessage
from app.errors import TemplateError

MAX_OUTPUT_CHARS = 4 * 1024 * 1024
MAX_RENDER_SECONDS = 5.0

FALLBACK_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}Assistant: {{ m['content'] }}\n"
    "{% else %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_STOPS = ("\nUser:", "\nAssistant:")


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """OpenAI history carries arguments as a JSON string; templates iterate them as a mapping."""
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return dict(call)
    try:
        return {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
    except ValueError:
        return dict(call)


def _raise(msg: str) -> None:
    raise TemplateError(f"chat template: {msg}", param="messages")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    # HF templates expect json.dumps semantics (no HTML escaping), unlike Jinja's built-in.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


MAX_BINOP_LEN = 1024 * 1024  # no single value a template builds may exceed this


def _too_big(n: int) -> TemplateError:
    return TemplateError(f"chat template tried to build a value of {n} items", param="messages")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, plus bounds on the operators and filters that can allocate without limit."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and len(seq) * n > MAX_BINOP_LEN
                ):
                    raise _too_big(len(seq) * n)
        if operator == "**" and isinstance(right, int) and abs(right) > 4096:
            raise _too_big(right)
        return super().call_binop(context, operator, left, right)


def _bounded_width(name: str, fn: Any) -> Any:
    def wrapper(value: Any, width: Any = 80, *args: Any, **kwargs: Any) -> Any:
        if isinstance(width, int) and width > MAX_BINOP_LEN:
            raise _too_big(width)
        return fn(value, width, *args, **kwargs)

    wrapper.__name__ = name
    return wrapper


def _make_env() -> ImmutableSandboxedEnvironment:
    env = _BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, autoescape=False, undefined=jinja2.Undefined
    )
    env.filters["tojson"] = _tojson
    for name in ("center", "indent", "wordwrap", "truncate"):
        env.filters[name] = _bounded_width(name, env.filters[name])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_ENV = _make_env()
_CACHE: dict[str, jinja2.Template] = {}


class ChatTemplate:
    """A compiled template plus the special tokens it refers to."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.is_fallback = not (source and source.strip())
        self.source = FALLBACK_TEMPLATE if self.is_fallback else str(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        tpl = _CACHE.get(self.source)
        if tpl is None:
            try:
                tpl = _ENV.from_string(self.source)
            except (
                Exception,
                RecursionError,
                MemoryError,
            ) as e:  # compile-time folding can raise anything
                raise TemplateError(f"the model's chat template does not compile: {e}") from e
            _CACHE[self.source] = tpl
        self._tpl = tpl

    @property
    def default_stops(self) -> tuple[str, ...]:
        return FALLBACK_STOPS if self.is_fallback else ()

    def render(
        self,
        messages: Sequence[ChatMessage],
        /,
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render ``messages`` to the prompt text. ``extra`` holds any names (``self`` too: a
        request's template variables arrive here), so the first two are positional-only.

        Raises:
            TemplateError: the template raised, escaped the sandbox, or produced too much.
        """
        msgs = []
        for m in messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.name:
                d["name"] = m.name
            if m.tool_calls:
                d["tool_calls"] = [_template_call(t) for t in m.tool_calls]
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            msgs.append(d)
        ctx = {
            "messages": msgs,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        out: list[str] = []
        size = 0
        deadline = time.monotonic() + MAX_RENDER_SECONDS
        try:
            for chunk in self._tpl.generate(ctx):  # a mapping: any names, 'self' too
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateError(
                        "chat template output is larger than the bound", param="messages"
                    )
                if time.monotonic() > deadline:
                    raise TemplateError("chat template took too long to render", param="messages")
                out.append(chunk)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template tried an unsafe operation: {e}") from e
        except (Exception, RecursionError, MemoryError) as e:  # a template is untrusted input
            raise TemplateError(f"chat template failed to render: {e}", param="messages") from e
        return "".join(out)
