"""Chat templates render in a sandbox with an output bound (SECURITY.md item 9)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.inference.chat_template import FALLBACK_STOPS, ChatTemplate
from app.core.types import ChatMessage, ToolCall
from app.errors import TemplateError
from tests.support.gguf_files import CHATML

REPO = Path(__file__).resolve().parents[3]

# The Hugging Face style: `messages`, `add_generation_prompt`, bos/eos tokens, raise_exception.
HF_CHATML = """\
{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('Unknown role: ' + message['role']) }}
{%- endif %}
{%- if message['role'] != 'system' %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MESSAGES = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", 'Hi <b>there</b> & "you"'),
    ChatMessage("assistant", "Hello!"),
    ChatMessage("user", "2+2?"),
]


def test_chatml_render_with_generation_prompt() -> None:
    out = ChatTemplate(HF_CHATML).render(MESSAGES, add_generation_prompt=True)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        '<|im_start|>user\nHi <b>there</b> & "you"<|im_end|>\n'  # never HTML-escaped
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chatml_render_without_generation_prompt() -> None:
    out = ChatTemplate(HF_CHATML).render(MESSAGES[1:2], add_generation_prompt=False)
    assert out == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        '<|im_start|>user\nHi <b>there</b> & "you"<|im_end|>\n'
    )


def test_the_test_models_chatml_template() -> None:
    out = ChatTemplate(CHATML).render([ChatMessage("user", "hey")])
    assert out == "<|im_start|>user\nhey<|im_end|>\n<|im_start|>assistant\n"


def test_bos_eos_and_extra_variables() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ extra_var }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert t.render([ChatMessage("user", "x")], extra_var="!") == "<s>x</s>!"


def test_tool_fields_reach_the_template() -> None:
    t = ChatTemplate(
        "{% for m in messages %}{{ m.name }}|{{ m.tool_call_id }}|"
        "{{ m.tool_calls | tojson }};{% endfor %}"
    )
    msg = ChatMessage(
        "tool", "42", name="calc", tool_call_id="c1", tool_calls=(ToolCall("c1", "f", '{"x": 1}'),)
    )
    # the transformers convention: arguments as a mapping
    assert t.render([msg]) == (
        'calc|c1|[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}];'
    )


def test_raise_exception_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="Unknown role: robot") as ei:
        ChatTemplate(HF_CHATML).render([ChatMessage("robot", "beep")])
    assert ei.value.status == 400


def test_tojson_does_not_html_escape() -> None:
    t = ChatTemplate("{{ messages | tojson }}")
    out = t.render([ChatMessage("user", "<script>&'\"</script> é")])
    assert out == '[{"role": "user", "content": "<script>&\'\\"</script> é"}]'
    assert json.loads(out)[0]["content"] == "<script>&'\"</script> é"
    assert ChatTemplate("{{ {'a': [1, 2]} | tojson(indent=2) }}").render([]) == (
        '{\n  "a": [\n    1,\n    2\n  ]\n}'
    )


def test_syntax_error_is_a_template_error() -> None:
    with pytest.raises(TemplateError):
        ChatTemplate("{% for %}")
    with pytest.raises(TemplateError):
        ChatTemplate("{{ unclosed")


def test_undefined_variable_use_is_a_template_error() -> None:
    with pytest.raises(TemplateError):
        ChatTemplate("{{ nothing.here }}").render(MESSAGES)


# -- the sandbox -------------------------------------------------------------------------------------

HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ joiner.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ namespace.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['__builtins__']['__import__']('os').system('touch {marker}') }}",
    "{{ strftime_now.__globals__['__builtins__']['exec']('open(\"{marker}\", \"w\")') }}",
    "{% set x = messages.append({'role': 'x'}) %}{{ x }}",
    "{{ messages.pop() }}",
    "{{ ('{0.__class__.__mro__}').format('') }}",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_template_cannot_escape(source: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    t = ChatTemplate(source.replace("{marker}", str(marker)))
    msgs = list(MESSAGES)
    try:
        out = t.render(msgs)
    except TemplateError:
        out = None
    assert not marker.exists(), "template code ran outside the sandbox"
    assert msgs == MESSAGES
    if (
        out is not None
    ):  # where the sandbox renders an undefined instead of raising, it leaks nothing
        assert "subclasses" not in out and "<class" not in out and "function" not in out


@pytest.mark.parametrize("source", HOSTILE[:2])
def test_hostile_template_from_the_brief_raises(source: str, tmp_path: Path) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source.replace("{marker}", str(tmp_path / "x"))).render(MESSAGES)


def test_output_bomb_from_nested_loops_is_stopped_quickly() -> None:
    bomb = (
        "{% for i in range(99999) %}{% for j in range(99999) %}xxxxxxxxxx{% endfor %}{% endfor %}"
    )
    t0 = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(bomb).render(MESSAGES)
    assert time.monotonic() - t0 < 3


def test_output_bomb_from_a_huge_range_is_a_template_error() -> None:
    bomb = "{% for i in range(10**7) %}xxxxxxxxxx{% endfor %}"
    t0 = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(bomb).render(MESSAGES)
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize(
    "source",
    [
        "{{ 1 / 0 }}",
        "{{ 1 // 0 }}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
        "{{ 2 ** 100000 }}",
    ],
)
def test_any_failure_inside_a_template_is_a_template_error(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(MESSAGES)


_MEMORY_BOMB = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 * 1024 * 1024, 1536 * 1024 * 1024))
from app.core.inference.chat_template import ChatTemplate
from app.core.types import ChatMessage
from app.errors import TemplateError
try:
    ChatTemplate(sys.argv[1]).render([ChatMessage("user", "hi")])
except TemplateError:
    print("TemplateError")
except BaseException as e:
    print(type(e).__name__)
"""


@pytest.mark.parametrize("source", ["{{ 'x' * 10**10 }}", "{{ 'x' | center(10**10) }}"])
def test_single_expression_memory_bomb_is_a_template_error(source: str) -> None:
    # In a child with a 1.5 GiB address-space limit, so the bomb cannot hurt the test run.
    r = subprocess.run(
        [sys.executable, "-c", _MEMORY_BOMB, source],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "TemplateError", (r.stdout, r.stderr[-2000:])


# -- the fallback ------------------------------------------------------------------------------------


def test_fallback_template() -> None:
    t = ChatTemplate(None)
    assert t.is_fallback
    out = t.render(MESSAGES, add_generation_prompt=True)
    assert out == (
        'Be brief.\n\nUser: Hi <b>there</b> & "you"\nAssistant: Hello!\nUser: 2+2?\nAssistant:'
    )
    assert t.render([ChatMessage("tool", "42")], add_generation_prompt=False) == "Tool: 42\n"


def test_fallback_stops() -> None:
    assert ChatTemplate(None).default_stops == FALLBACK_STOPS
    assert ChatTemplate(None).default_stops  # non-empty: a base model's turn must end
    assert all(s.startswith("\n") for s in FALLBACK_STOPS)
    assert ChatTemplate(CHATML).default_stops == ()


def test_empty_template_string_renders_the_fallback() -> None:
    assert ChatTemplate("").render([ChatMessage("user", "x")]) == "User: x\nAssistant:"


@pytest.mark.parametrize("source", ["", "   \n"])
def test_blank_template_string_is_the_fallback_with_its_stops(source: str) -> None:
    t = ChatTemplate(source)
    assert t.is_fallback
    assert t.default_stops == FALLBACK_STOPS
    assert t.render([ChatMessage("user", "x")]) == "User: x\nAssistant:"


# -- time and memory bounds that hold for any template (items 4 and 5) -------------------

SILENT_LOOPS = [
    # no output at all: a bound checked only between output chunks never fires
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{{ messages[0]['content'] }}",
    "{% for c in 'x' * 1000000 %}{% for d in 'y' * 1000000 %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) recursive %}{% endfor %}{% endfor %}",
    "{% macro spin() %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}{% endmacro %}{{ spin() }}",
    "{% for i in range(100000) %}{% set ns = namespace(x=0) %}{% for j in range(100000) %}"
    "{% set ns.x = ns.x + 1 %}{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("source", SILENT_LOOPS)
def test_the_time_bound_holds_for_a_template_that_outputs_nothing(source: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="took longer than 0.3s"):
        ChatTemplate(source, time_limit=0.3).render(MESSAGES)
    # stopped at its bound; generous slack for a loaded machine
    assert time.monotonic() - t0 < 10


EXPANDING = {
    "replace": "{{ ('x' * 1000000) | replace('x', 'x' * 1000) }}",
    "replace-empty": "{{ ('x' * 1000000) | replace('', 'y' * 10) }}",
    "str.replace": "{{ ('x' * 1000000).replace('x', 'x' * 1000) }}",
    "multiply": "{{ 'x' * 100000000 }}",
    "list multiply": "{{ ([1] * 100000000) | length }}",
    "power": "{{ 10 ** 100000000 }}",
    "concat doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "plus doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "retained copies": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + ['x' * 1000000 ~ i] %}{% endfor %}",
    "ljust": "{{ 'x'.ljust(1000000000) }}",
    "zfill": "{{ 'x'.zfill(1000000000) }}",
    "percent format": "{{ '%01000000000d' % 1 }}",
    "percent star": "{{ '%*s' % (1000000000, 'x') }}",
    "str.format": "{{ '{:>999999999}'.format(1) }}",
    "format filter": "{{ '%1000000000s' | format('x') }}",
    "indent": "{{ ('a\\n' * 1000000) | indent(1000) }}",
    "center": "{{ 'x' | center(1000000000) }}",
    "batch": "{{ [1] | batch(100000000, 0) | list | length }}",
    "slice": "{{ range(10) | slice(100000000) | list | length }}",
    "tojson indent": "{{ messages | tojson(indent=100000) }}",
    "expandtabs": "{{ ('\\t' * 1000000).expandtabs(1000) }}",
    "join": "{{ (['x' * 1000000] * 8) | join('y' * 1000000) }}",
    "list of a string": "{{ ('x' * 8000000) | list | length }}",
    "translate": "{{ ('x' * 1000).translate({120: 'y' * 1000000}) }}",
    "lipsum": "{{ lipsum(8000000, min=100, max=100) }}",
    "output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
}

_EXPANDING_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1536 * 1024 * 1024, 1536 * 1024 * 1024))
from app.core.inference.chat_template import ChatTemplate
from app.core.types import ChatMessage
from app.errors import TemplateError
out = {}
for name, source in json.loads(sys.argv[1]).items():
    t0 = time.monotonic()
    try:
        ChatTemplate(source, time_limit=2.0).render([ChatMessage("user", "hi")])
        out[name] = "rendered"
    except TemplateError as e:
        out[name] = "TemplateError"
    except BaseException as e:
        out[name] = type(e).__name__
    out[name] += f" {time.monotonic() - t0:.2f}s"
# VmHWM is this process's own high-water mark: ru_maxrss keeps the parent's across fork and
# exec, so a child of a big pytest process would report the parent's size
with open("/proc/self/status") as f:
    peak = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) // 1024
print(json.dumps({"results": out, "peak_mib": peak}))
"""


def test_every_expanding_operation_is_refused_before_it_builds() -> None:
    """Each bomb is a TemplateError, none reaches the 1.5 GiB address-space limit of the
    child it runs in (a MemoryError there would mean the value was being built), and the
    child's peak memory stays small."""
    r = subprocess.run(
        [sys.executable, "-c", _EXPANDING_CHILD, json.dumps(EXPANDING)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    for name, outcome in report["results"].items():
        assert outcome.startswith("TemplateError"), (name, outcome)
    assert report["peak_mib"] < 700, report


def test_real_accumulating_templates_still_render() -> None:
    """Templates that build a string message by message pay for the growth, not for the whole
    string again each time: 600 messages of 4 KB accumulate without hitting the budget."""
    source = (
        "{% set ns = namespace(p='') %}{% for m in messages %}"
        "{% set ns.p = ns.p ~ '<|' ~ m['role'] ~ '|>' ~ m['content'] ~ '\\n' %}{% endfor %}"
        "{{ ns.p }}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    msgs = [ChatMessage("user", "y" * 4096) for _ in range(600)]
    out = ChatTemplate(source).render(msgs)
    assert out.count("<|user|>") == 600 and out.endswith("<|assistant|>")


def test_loop_variables_still_work_with_the_deadline_wrapper() -> None:
    source = (
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}/{{ loop.revindex0 }}"
        "{% if loop.last %}!{% endif %};{% endfor %}"
        "{% for x in [[1, [2]], [3]] recursive %}{% if x is iterable %}"
        "{{ loop(x) }}{% else %}{{ x }}{% endif %}{% endfor %}"
    )
    out = ChatTemplate(source).render([ChatMessage("user", "a"), ChatMessage("user", "b")])
    assert out == "1/2/1;2/2/0!;123"


def test_a_huge_template_source_is_refused() -> None:
    with pytest.raises(TemplateError, match="characters"):
        ChatTemplate("x" * (300 * 1024)).render(MESSAGES)
