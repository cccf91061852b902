"""Chat templates: the model's own Jinja template, rendered in a sandbox with size and time bounds.

A model without a template gets ``FALLBACK_TEMPLATE``: a plain transcript ("User: ...",
"Assistant: ...") that base models continue naturally; ``FALLBACK_STOPS`` end the turn.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2

from app.core.inference.template_sandbox import (
    MAX_VALUE_LEN,
    bounded_compile,
    bounded_render,
    make_environment,
)
from app.core.types import ChatMessage, ToolCall
from app.core.util import jsonsafe
from app.errors import TemplateError

MAX_OUTPUT_CHARS = MAX_VALUE_LEN
MAX_RENDER_SECONDS = 5.0
MAX_TEMPLATE_CHARS = 256 * 1024  # the largest real templates are tens of kilobytes

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


def _template_call(call: ToolCall) -> dict[str, Any]:
    """A call in the shape HF chat templates read (the transformers convention): arguments as
    a mapping when they parse, else the text as it came."""
    args: Any = call.arguments
    try:
        args = jsonsafe.loads(call.arguments)
    except ValueError:
        pass
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}}


def _raise(msg: str) -> None:
    raise TemplateError(f"chat template: {msg}", param="messages")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    # HF templates expect json.dumps semantics (no HTML escaping), unlike Jinja's built-in.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > 256:
        raise TemplateError("strftime_now takes a short format string", param="messages")
    return datetime.now().strftime(fmt)


_ENV = make_environment(
    {"tojson": _tojson}, {"raise_exception": _raise, "strftime_now": _strftime_now}
)
_CACHE: OrderedDict[str, jinja2.Template] = OrderedDict()
_CACHE_SIZE = 32
_CACHE_LOCK = threading.Lock()


def _compiled(source: str) -> jinja2.Template:
    """The compiled template (cached; compiled under the same bounds as a render)."""
    with _CACHE_LOCK:
        tpl = _CACHE.get(source)
        if tpl is not None:
            _CACHE.move_to_end(source)
            return tpl
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(
            f"the model's chat template is {len(source)} characters; the bound is "
            f"{MAX_TEMPLATE_CHARS}"
        )
    try:
        with bounded_compile(MAX_RENDER_SECONDS):
            tpl = _ENV.from_string(source)
    except TemplateError as e:
        raise TemplateError(f"the model's chat template does not compile: {e.message}") from e
    except (Exception, RecursionError, MemoryError) as e:  # compile-time folding can raise anything
        raise TemplateError(f"the model's chat template does not compile: {e}") from e
    with _CACHE_LOCK:
        _CACHE[source] = tpl
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return tpl


class ChatTemplate:
    """A compiled template plus the special tokens it refers to."""

    def __init__(
        self,
        source: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        time_limit: float = MAX_RENDER_SECONDS,
    ) -> None:
        self.time_limit = time_limit
        self.is_fallback = not (source and source.strip())
        self.source = FALLBACK_TEMPLATE if self.is_fallback else str(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._tpl = _compiled(self.source)  # CPU work too: construct it off the event loop

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

        Blocking and CPU-bound (up to MAX_RENDER_SECONDS): call it off the event loop.

        Raises:
            TemplateError: the template raised, escaped the sandbox, ran over its time or size
                bounds, or did not compile.
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
        try:
            with bounded_render(self.time_limit):
                for chunk in self._tpl.generate(ctx):  # a mapping: any names, 'self' too
                    size += len(chunk)
                    if size > MAX_OUTPUT_CHARS:
                        raise TemplateError(
                            f"chat template output is larger than {MAX_OUTPUT_CHARS} characters",
                            param="messages",
                        )
                    out.append(chunk)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"chat template tried an unsafe operation: {e}") from e
        except (Exception, RecursionError, MemoryError) as e:  # a template is untrusted input
            raise TemplateError(f"chat template failed to render: {e}", param="messages") from e
        return "".join(out)
