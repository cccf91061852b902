"""The Chat page's screenshot: ``xvfb-run -a python -m tests.gui.chat_shot OUT.png``.

The real window on a temporary HEARTH_HOME: SmolLM2 imported and loaded, two short chats sent
first (so the sidebar lists saved conversations), then a question whose answer SmolLM2 writes
in markdown with a code block, shown rendered and highlighted, with a text file attached.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from tests.gui.screenshots import settle, smollm2_shot, wait_until  # noqa: E402

CHATS = ["Name three rivers in Europe.", "What is a good name for a cat?"]
QUESTION = "Write a Python function that reverses a string. Use a code block."


def _ask(chat: object, text: str, max_tokens: int) -> None:
    done: list[str] = []
    chat.answer_finished.connect(done.append)  # type: ignore[attr-defined]
    chat.max_tokens_spin.setValue(max_tokens)  # type: ignore[attr-defined]
    assert chat.send(text)  # type: ignore[attr-defined]
    wait_until(lambda: bool(done), 600)  # a busy machine decodes slowly
    chat.answer_finished.disconnect(done.append)  # type: ignore[attr-defined]


def main(out: Path) -> int:
    logging.basicConfig(level=logging.INFO)
    home = Path(tempfile.mkdtemp(prefix="hearth-chat-"))
    os.environ["HEARTH_HOME"] = str(home)

    made = smollm2_shot((1280, 820))
    if made is None:
        return 1
    shot, mid = made
    w = shot.window
    try:
        w.show_page("Chat")
        chat = w.chat_page
        wait_until(lambda: chat.current_model_id() == mid)
        chat.temperature_spin.setValue(0.0)
        for text in CHATS:
            _ask(chat, text, 48)
            chat.new_chat()
        notes = home / "notes.md"
        notes.write_text("# Notes\n\nStrings in Python are immutable; slicing makes a copy.\n")
        chat.attachments.add_paths([notes])
        wait_until(lambda: len(chat.attachments.chips) == 1)
        _ask(chat, QUESTION, 200)
        settle(0.8)
        out.parent.mkdir(parents=True, exist_ok=True)
        w.grab().save(str(out))
        print(out)
    finally:
        shot.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "chat.png")))
