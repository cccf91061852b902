"""Markdown rendering for the Chat page (no window): what it renders, what it refuses, and that
the streamed (incremental) render ends equal to a one-shot render with flat work per append."""

from __future__ import annotations

import random
import re

import pytest

from app.gui.views.chat.markdown_render import (
    IncrementalMarkdown,
    MarkdownRenderer,
    render_markdown,
    safe_link,
)

# inputs where a wrong block split would show: lists, tables and fences across blank lines
CORPUS = {
    "nested lists": "- a\n  - b\n    - c\n\n  more of a\n- d\n\n1. x\n2. y\n\n   in y\n3. z\n",
    "loose by continuation": "- a\n- b\n\n  c\n\nafter\n",
    "ordered list trap": "1. a\n\n2\n\n2. b\n\n3) c\n\n10. d\n",
    # "2" alone closes the list; "2. b" joins it (and makes it loose): decided on a whole line
    "ordered list continues": "1. a\n\n2. b\n\n10. c\n",
    "list markers change": "- a\n\n\n- b\n\n* c\n+ d\n\n-\n--\n---\n",
    "tables": "| a | b |\n|:--|--:|\n| 1 | 2 |\n| 3 | 4 |\n\nafter\n\n| x |\n|---|\n",
    "table after a paragraph": "para\n| a | b |\n|---|---|\n| 1 | 2 |\nrow?\n\nend\n",
    "fence with blank lines": "```python\ndef f():\n\n    return 1\n\n\n```\ntext\n",
    "``` inside ~~~": "~~~\n```\nnot closed by this\n```\n~~~\n\n~~~md\n~~~~\nx\n",
    "unclosed fence": "intro\n\n```js\nlet x = 1;\n\nlet y = 2;\n",
    "fence in a list": "- item\n\n  ```\n  code\n\n  more\n  ```\n- next\n",
    "setext headings": "Title\n=====\n\npara\n---\n\n***\n\nx\n-\n",
    "blockquotes": "> q1\n> q2\n\n> - a\n>\n> b\nlazy\n\nout\n",
    "indented code": "    code1\n\n    code2\n\npara\n\n    code3\n",
    "html and links": "<div>\n*x*\n</div>\n\n[a](https://a.b) <https://c.d> [j](javascript:x)\n",
    "crlf": "a\r\n\r\n- b\r\n- c\r\n\r\n```\r\nk\r\n```\r\n",
    "blank only": "\n\n  \n",
    "reference-like": "[x]: https://x.y\n\n[x]\n",
    "emphasis over blocks": "**bold\n\nstill**\n\n~~gone~~\n",
}


def chunkings(text: str) -> list[list[str]]:
    """The same text cut several ways: whole, per character, fixed sizes, random sizes."""
    rng = random.Random(len(text))
    out = [[text], list(text)]
    for size in (2, 3, 7):
        out.append([text[i : i + size] for i in range(0, len(text), size)])
    for _ in range(3):
        cuts, i = [], 0
        while i < len(text):
            n = rng.randint(1, 12)
            cuts.append(text[i : i + n])
            i += n
        out.append(cuts)
    return out


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_streamed_render_ends_equal_to_a_one_shot_render(name: str) -> None:
    text = CORPUS[name]
    renderer = MarkdownRenderer()
    whole = renderer.render(text)
    for pieces in chunkings(text):
        inc = IncrementalMarkdown(renderer)
        for p in pieces:
            inc.append(p)
            inc.update()  # every append: the most freeze decisions, on every half-written line
        inc.update(final=True)  # the answer ended (the view's flush)
        assert inc.html == whole.html, (name, pieces)
        assert inc.codes == whole.codes
        assert inc.markdown == text


def test_blocks_freeze_as_the_answer_streams() -> None:
    inc = IncrementalMarkdown(MarkdownRenderer())
    table = "| x |\n|---|\n| 1 |\n\n"
    for p in ("# Head\n", "\n", "para one\n\n", "- a\n- b\n\n", table, "tail"):
        inc.append(p)
        inc.update()
    # heading, paragraph and list can no longer change: only the table (until the line after it
    # is complete, it might still join it) and "tail" are parsed again
    assert inc.frozen_blocks == 3
    before = inc.parsed_chars
    inc.append(" more")
    inc.update()
    assert inc.parsed_chars - before == len(table + "tail more")
    inc.append("\nnext")  # the line after the table is complete: the table freezes
    inc.update()
    assert inc.frozen_blocks == 4
    before = inc.parsed_chars
    inc.append(" words")
    inc.update()
    assert inc.parsed_chars - before == len("tail more\nnext words")


def test_a_long_open_code_block_is_highlighted_once_when_it_closes() -> None:
    """Highlighting a code block costs a pass over all of it: while the fence is open its code
    is shown plain, and it is highlighted once, when it closes (or the answer ends)."""
    renderer = MarkdownRenderer()
    inc = IncrementalMarkdown(renderer)
    code = "".join(f"def f_{i}(x):\n    return x * {i}  # note\n" for i in range(300))
    inc.append("Here:\n\n```python\n")
    inc.update()
    for line in code.splitlines(keepends=True):
        inc.append(line)
        before = inc.parsed_chars
        inc.update()
        # no parse at all while the block stays open: only the new line is added to it
        assert inc.parsed_chars - before <= len(line)
    assert renderer.highlighted_chars == 0
    # and what it shows is what the parser makes of the open block
    whole = "Here:\n\n```python\n" + code
    assert inc.html == MarkdownRenderer().render(whole, final=False).html
    assert "def f_299(x):" in inc.html and "<pre" in inc.html  # shown, plain, as it streams
    inc.append("```\n\nAfter.")
    inc.update()
    inc.update()
    assert renderer.highlighted_chars == len(code)  # once, when it closed
    assert inc.html == render_markdown("Here:\n\n```python\n" + code + "```\n\nAfter.").html

    # an answer that ends inside a fence: highlighted by the final render
    left_open = IncrementalMarkdown(MarkdownRenderer())
    left_open.append("```python\nx = 1\n")
    assert 'style="color: #' not in left_open.update().tail  # Pygments' inline styles
    assert 'style="color: #' in left_open.update(final=True).tail


def _section(i: int) -> str:
    return (
        f"## Part {i}\n\nParagraph {i} with **bold** words, `inline code` and a "
        f"[link](https://example.org/{i}). "
        + "Lorem ipsum dolor sit amet, consectetur. "
        * 4
        + f"\n\n- item one of {i}\n- item two with *emphasis*\n  - nested {i}\n\n"
        f"| col a | col b |\n|---|---:|\n| {i} | {i * 2} |\n| x | y |\n\n"
        f"```python\ndef f_{i}(x):\n    return x * {i}  # note\n```\n\n"
    )


def test_work_per_appended_token_stays_flat_over_10k_tokens() -> None:
    """Characters handed to the parser per append: the last 1,000 of 10,000 tokens cost no more
    than the first 1,000 (a whole re-render would cost ~40x more by then)."""
    text = "".join(_section(i) for i in range(400))
    tokens = re.findall(r"\s*\S+", text)[:10_000]
    assert len(tokens) == 10_000
    inc = IncrementalMarkdown(MarkdownRenderer())
    work: list[int] = []
    for k, tok in enumerate(tokens):
        before = inc.parsed_chars
        inc.append(tok)
        if k % 5 == 4:  # the view coalesces appends between renders; 5 per render here
            inc.update()
        work.append(inc.parsed_chars - before)
    first, last = sum(work[:1000]), sum(work[-1000:])
    assert first > 0
    assert last <= 1.5 * first
    shown = len("".join(tokens))
    assert last / 1000 < shown / 20  # far below re-parsing the whole text per append
    assert inc.frozen_blocks > 500


def test_tables_code_lists_headings_and_links_render_for_qt() -> None:
    r = render_markdown(
        "# H\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- x\n- y\n\n"
        "```python\ndef f(x):\n    return x  # hi\n```\n\n[site](https://example.org) ~~s~~\n"
    )
    assert "<h1>H</h1>" in r.html
    assert '<table border="1"' in r.html and "<td>1</td>" in r.html
    assert "<ul>" in r.html and "<li>x</li>" in r.html
    assert '<a href="https://example.org">site</a>' in r.html and "<s>s</s>" in r.html
    assert r.codes == ("def f(x):\n    return x  # hi\n",)
    assert '<a href="copy:0">Copy</a>' in r.html
    # Pygments' inline styles: keyword, name and comment each in a colour of their own
    colours = set(re.findall(r"color: (#[0-9A-Fa-f]{3,6})", r.html))
    assert len(colours) >= 3


def test_code_styles_follow_the_theme() -> None:
    code = "```python\nimport os\n```\n"
    light, dark = render_markdown(code).html, render_markdown(code, dark=True).html
    bg = re.compile(r"background-color:(#[0-9a-fA-F]+)")
    light_bg, dark_bg = bg.search(light), bg.search(dark)
    assert light_bg and dark_bg and light_bg.group(1) != dark_bg.group(1)
    assert int(dark_bg.group(1)[1:3], 16) < 0x60 < int(light_bg.group(1)[1:3], 16)


def test_copy_links_count_across_the_answer() -> None:
    r = render_markdown("```\na\n```\n\ntext\n\n~~~sh\nb\n~~~\n\n    c\n")
    assert r.codes == ("a\n", "b\n", "c\n")
    assert all(f'href="copy:{i}"' in r.html for i in range(3))


def test_raw_html_is_escaped_never_rendered() -> None:
    r = render_markdown('<script>alert(1)</script>\n\nhi <img src="x" onerror="y"> <b>b</b>\n')
    assert "<script>" not in r.html and "<img" not in r.html and "<b>" not in r.html
    assert "&lt;script&gt;" in r.html and "&lt;b&gt;b&lt;/b&gt;" in r.html


def test_only_http_https_and_mailto_links_are_links() -> None:
    r = render_markdown(
        "[j](javascript:alert(1)) [d](data:text/html,x) [f](file:///etc/passwd) [r](/etc/x) "
        "[v](vbscript:x) [ok](https://a.b) [m](mailto:a@b.c) <javascript:alert(2)>\n\n"
        "![pic](/home/me/secret.png) ![web](https://a.b/p.png)\n"
    )
    hrefs = re.findall(r'href="([^"]*)"', r.html)
    assert hrefs == ["https://a.b", "mailto:a@b.c", "https://a.b/p.png"]
    assert "<img" not in r.html  # images are links: nothing is loaded from disk or the web
    assert safe_link("HTTPS://x") and not safe_link("javascript:x") and not safe_link("x")
