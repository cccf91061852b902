"""The Jinja sandbox chat templates render in, with bounds on time and memory.

A chat template comes from a model file: untrusted code. Jinja's sandbox stops it reaching
Python internals; this module also stops it taking the process's time or memory:

- **Time**: a template can only spin in a ``{% for %}`` loop (Jinja has no while; recursion
  hits Python's recursion limit), so every loop's iterable is wrapped to check the render's
  deadline as it goes: a loop that outputs nothing is stopped too (a check between output
  chunks never fires for it). Filters' own loops are bounded by the item bound
  (``MAX_ITEMS``). Compiling runs under a trace-based deadline (once per template).
- **Memory**, checked *before* the work: no single value a template builds (string, list) may
  exceed ``MAX_VALUE_LEN``, and what a render builds in all is charged to a budget
  (``MAX_RENDER_BUILD``): ``*``, ``+``, ``%``, ``~`` (string concatenation), every filter and
  every method call. Operators and filters that expand (``replace``, ``indent``, ``center``,
  ``format``, ``join``, ``batch``, ``ljust``, ``expandtabs``...) have their result size computed
  from their inputs first; a too-large one is refused without being built.

Everything C-level is therefore bounded by size, and everything Python-level by the clock.
Tested by tests/core/inference/test_template_sandbox_frozen.py.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sized
from contextlib import contextmanager
from types import FrameType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.errors import TemplateError

MAX_VALUE_LEN = 8 * 1024 * 1024  # characters in any one string a template builds
MAX_ITEMS = 100_000  # items in any one list a template builds (Jinja's own range() bound)
MAX_RENDER_BUILD = 64 * 1024 * 1024  # characters (items count 8) built in one render
MAX_JSON_INDENT = 64
_BIG_NUMBER = re.compile(r"\d{7,}")  # a width or precision of a million or more in a format
# where Jinja's code objects say they live (the compile deadline traces those frames): taken
# from a code object, not jinja2.__file__, as a PyInstaller bundle compiles them as "jinja2/..."
_JINJA_DIR = os.path.dirname(nodes.Node.__init__.__code__.co_filename)


class _Budget(threading.local):
    """What the render on this thread has built so far, and its deadline (None outside)."""

    used: int | None = None
    deadline: float | None = None
    seconds: float = 0.0


_budget = _Budget()


def _refuse(what: str, n: int) -> TemplateError:
    return TemplateError(
        f"chat template tried to build {what} of {n} items (the bound is {MAX_VALUE_LEN})",
        param="messages",
    )


def _size(v: Any) -> int:
    """The charge for a value: characters of a string, 8 per item of a container."""
    if isinstance(v, str | bytes):
        return len(v)
    if isinstance(v, list | tuple | dict | set | frozenset):
        return 8 * len(v)
    return 0


def _charge(n: int) -> None:
    used = _budget.used
    if used is None:  # compile-time constant folding: values are bounded by the checks alone
        return
    used += n
    if used > MAX_RENDER_BUILD:
        raise TemplateError(
            f"chat template built more than {MAX_RENDER_BUILD} characters while rendering",
            param="messages",
        )
    _budget.used = used


def _check_len(n: int, what: str = "a value") -> None:
    if n > MAX_VALUE_LEN:
        raise _refuse(what, n)


def _check_items(n: int, what: str = "a list") -> None:
    if n > MAX_ITEMS:
        raise TemplateError(
            f"chat template tried to build {what} of {n} items (the bound is {MAX_ITEMS})",
            param="messages",
        )


def _built(result: Any, *inputs: Any) -> Any:
    """Charge what ``result`` adds over the largest of its inputs (a string grown by appending
    pays for the growth, not its whole length again) and bound its size."""
    n = _size(result)
    if n:
        if isinstance(result, str | bytes):
            _check_len(n)
        else:
            _check_items(n // 8)
        _charge(max(0, n - max((_size(i) for i in inputs), default=0)))
    return result


def _ints_bounded(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_VALUE_LEN:
            raise _refuse("a width or count", abs(v))


def _check_format_string(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if _BIG_NUMBER.search(fmt):
        raise TemplateError(
            "chat template used a format width of a million or more", param="messages"
        )
    _ints_bounded(args, kwargs)
    # '*' widths and repeated fields: at most the format's fields times the largest argument
    fields = fmt.count("%") + fmt.count("{")
    biggest = max(
        [_size(v) for v in (*args, *kwargs.values())]
        + [v for v in (*args, *kwargs.values()) if isinstance(v, int) and not isinstance(v, bool)]
        + [0]
    )
    _check_len(len(fmt) + fields * biggest, "a formatted string")


def _expand_estimate(s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The length a growing str method or filter would produce, from its inputs alone."""
    if name == "replace":
        old = args[0] if args else kwargs.get("old", "")
        new = args[1] if len(args) > 1 else kwargs.get("new", "")
        if isinstance(old, str) and isinstance(new, str):
            hits = (len(s) + 1) if old == "" else s.count(old)
            count = args[2] if len(args) > 2 else kwargs.get("count", -1)
            if isinstance(count, int) and count >= 0:
                hits = min(hits, count)
            return len(s) + hits * max(0, len(new) - len(old))
    elif name in ("ljust", "rjust", "center", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        return max(len(s), width if isinstance(width, int) else 0)
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        return len(s) + s.count("\t") * (size if isinstance(size, int) else 8)
    elif name == "indent":
        width = args[0] if args else kwargs.get("width", 4)
        w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 4
        return len(s) + (s.count("\n") + 1) * max(0, w)
    elif name == "join":
        items = args[0] if args else ()
        if isinstance(items, list | tuple):
            total = sum(len(x) if isinstance(x, str) else 16 for x in items)
            return total + len(s) * max(0, len(items) - 1)
    return len(s)


_REFUSED_STR_METHODS = frozenset({"translate", "maketrans"})  # table-driven growth: no estimate


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus size checks on every operation that can allocate."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # every loop checks the deadline as it runs
            loop.iter = nodes.Call(
                nodes.EnvironmentAttribute("timed_iterable"), [loop.iter], [], None, None
            )
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str) and isinstance(n, int):
                    _check_len(len(seq) * max(0, n))
                elif isinstance(seq, list | tuple) and isinstance(n, int):
                    _check_items(len(seq) * max(0, n))
        elif operator == "**":
            if isinstance(right, int) and abs(right) > 4096:
                raise _refuse("a power", abs(right))
        elif operator == "+":
            if isinstance(left, str) and isinstance(right, str):
                _check_len(len(left) + len(right))
            elif isinstance(left, list | tuple) and isinstance(right, list | tuple):
                _check_items(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            args = right if isinstance(right, tuple) else (right,)
            _check_format_string(left, args, right if isinstance(right, dict) else {})
        return _built(super().call_binop(context, operator, left, right), left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        target = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
        owner = getattr(target, "__self__", None)
        name = getattr(target, "__name__", "")
        if isinstance(owner, str):
            if name in _REFUSED_STR_METHODS:
                raise TemplateError(f"chat template called str.{name}", param="messages")
            if name in ("format", "format_map"):
                _check_format_string(owner, args, kwargs)
            else:
                _ints_bounded(args, kwargs)
                _check_len(_expand_estimate(owner, name, args, kwargs), f"str.{name}()")
        else:
            _ints_bounded(args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return _built(result, owner, *args)


# filters that loop over their value in Python, or build a list from it
_ITEM_FILTERS = frozenset(
    {
        "list", "sort", "unique", "reverse", "dictsort", "groupby", "batch", "slice", "map",
        "select", "reject", "selectattr", "rejectattr", "sum", "min", "max", "join",
        "wordwrap", "urlize", "items",
    }
)  # fmt: skip


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that refuses, before running, to build a value over the bound."""
    pass_env = getattr(fn, "jinja_pass_arg", None)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        lead = 1 if pass_env is not None else 0  # the environment/context Jinja passes first
        value, rest = (args[lead], args[lead + 1 :]) if len(args) > lead else (None, ())
        _ints_bounded(rest, kwargs)
        if name in _ITEM_FILTERS and isinstance(value, Sized):
            _check_items(len(value), f"|{name} over a value")  # their loops run per item
        if isinstance(value, str):
            _check_len(_expand_estimate(value, name, rest, kwargs), f"|{name}")
        if name == "join" and isinstance(value, list | tuple):
            sep = rest[0] if rest else kwargs.get("d", "")
            if isinstance(sep, str):
                _check_len(_expand_estimate(sep, "join", (value,), {}), "|join")
        if name == "format" and isinstance(value, str):
            _check_format_string(value, rest, kwargs)
        if name in ("batch", "slice"):
            n = rest[0] if rest else kwargs.get("linecount", kwargs.get("slices", 1))
            if isinstance(n, int):
                _check_items(n, f"|{name}")
        if name == "tojson":
            indent = rest[0] if rest else kwargs.get("indent")
            if isinstance(indent, int) and indent > MAX_JSON_INDENT:
                raise _refuse("a JSON indent", indent)
        result = fn(*args, **kwargs)
        if isinstance(result, Iterator) and not isinstance(result, str):
            return result  # lazy (map, select...): whatever consumes it is bounded
        return _built(result, value)

    wrapper.__name__ = name
    if pass_env is not None:
        wrapper.jinja_pass_arg = pass_env  # type: ignore[attr-defined]
    return wrapper


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles ``a ~ b`` to a bounded join (Jinja's own is a plain ``"".join``)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _bounded_concat(parts: tuple[Any, ...]) -> str:
    strs = [p if isinstance(p, str) else str(p) for p in parts]
    _check_len(sum(len(s) for s in strs), "a string")
    return _built("".join(strs), *strs)


class _Timed:
    """A for-loop's iterable that checks the render's deadline as the loop runs."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:  # loop.length, loop.revindex
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        at = _budget.deadline
        if at is None:
            yield from self.inner
            return
        for i, item in enumerate(self.inner):
            if not i & 63 and time.monotonic() > at:
                raise _too_slow(_budget.seconds)
            yield item


def _too_slow(seconds: float) -> TemplateError:
    return TemplateError(f"chat template took longer than {seconds:g}s to render", param="messages")


class _CompileDeadline:
    """A trace function that stops a compile (Jinja's lexer, parser and constant folding are
    Python) after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self._ticks = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        self._ticks += 1
        if not self._ticks & 63 and time.monotonic() > self.at:
            raise _too_slow(self.seconds)
        return self if frame.f_code.co_filename.startswith(_JINJA_DIR) else None


@contextmanager
def bounded_render(seconds: float) -> Iterator[None]:
    """Run a render on this thread under the time and memory bounds."""
    _budget.used = 0
    _budget.deadline = time.monotonic() + seconds
    _budget.seconds = seconds
    try:
        yield
    finally:
        _budget.used = None
        _budget.deadline = None


@contextmanager
def bounded_compile(seconds: float) -> Iterator[None]:
    """Run a compile on this thread under a time bound."""
    previous = sys.gettrace()
    sys.settrace(_CompileDeadline(seconds))
    try:
        yield
    finally:
        sys.settrace(previous)


def make_environment(
    filters: dict[str, Callable[..., Any]], globals_: dict[str, Any]
) -> BoundedSandbox:
    """The sandbox with Jinja's filters plus ``filters`` (all bounded) and ``globals_``."""
    env = BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, autoescape=False, undefined=jinja2.Undefined
    )
    env.code_generator_class = _BoundedCodeGenerator
    env.bounded_concat = _bounded_concat  # type: ignore[attr-defined]
    env.timed_iterable = _Timed  # type: ignore[attr-defined]
    env.filters.update(filters)
    for name, fn in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, fn)
    # lipsum(n) builds n paragraphs of text: no size estimate, and no chat template uses it
    env.globals.pop("lipsum", None)
    env.globals.update(globals_)
    return env
