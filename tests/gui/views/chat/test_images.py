"""Images on the Chat page, with the real llama.cpp runtime on SmolLM2 and the tiny
real projector (tests/support/vision_gguf.py): dropped, pasted (a screenshot) or attached with the
button, an image becomes a chip with its thumbnail; sent, its pixels reach libmtmd (the slot's
prompt holds the image's positions, keyed on the digest of the decoded pixels); saved, it comes
back as a thumbnail on reopen and goes back to the model with the history. A model without
vision refuses images; a bomb or a corrupt file is refused with the reason, no chip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from app.core.inference.images import decode_image
from app.core.service import Hearth
from app.core.types import Runtime
from app.core.workspace.conversations import ConversationStore
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.views.chat.page import ChatPage
from app.runtimes.llama.runtime import LlamaCppModel, LlamaCppRuntime
from app.runtimes.llama.vision import image_tokens
from tests.core.workspace.test_chat_images import bomb_png, noise_png
from tests.gui.helpers import SLOW
from tests.gui.views.chat.test_attachments import drop
from tests.support.gguf_files import write_model
from tests.support.vision_gguf import IMAGE_SIZE, N_IMAGE_TOKENS, image_rgb, write_projector


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("proj") / "mmproj-test.gguf")


@pytest.fixture
def gui_runtimes(probe_file: Path) -> dict[str, Runtime]:
    return {"gguf": LlamaCppRuntime(probe_file=probe_file)}


def import_with_projector(service: Hearth, path: Path, projector: Path | None) -> str:
    """Import ``path``; give it ``projector`` by hand (pairing on import is another part)."""
    model, _ = service.models.import_path(path)
    if projector is not None:
        index = service.models._library.index_file
        data = json.loads(index.read_text())
        for m in data["models"]:
            if m["id"] == model.id:
                m.setdefault("extra", {})["projector"] = str(projector)
        index.write_text(json.dumps(data))
        service.models._library._index.invalidate()  # the library caches the index
    return model.id


def new_page(qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge, db: Path) -> ChatPage:
    p = ChatPage(gui_ctx.service, bridge, conversations=ConversationStore(db))
    qtbot.addWidget(p)
    p.show()
    return p


def ready(page: ChatPage, qtbot: QtBot, model_id: str) -> None:
    page.refresh_models()
    qtbot.waitUntil(lambda: page.model_combo.findData(model_id) >= 0, timeout=10_000)
    page.select_model(model_id)


def png_file(path: Path, seed: int, fmt: str = "PNG") -> Path:
    Image.frombytes("RGB", (IMAGE_SIZE, IMAGE_SIZE), image_rgb(seed)).save(path, fmt)
    return path


def holds(kv: list[int], run: list[int]) -> bool:
    return any(kv[i : i + len(run)] == run for i in range(len(kv) - len(run) + 1))


def slot_prompts(gui_ctx: GuiContext, model_id: str) -> list[list[int]]:
    """What each KV slot of the loaded model holds (the tokens its cells were decoded from)."""
    lm = gui_ctx.loop.call(gui_ctx.service.models.load(model_id))
    assert isinstance(lm, LlamaCppModel)
    return [list(kv) for kv in lm.engine.slots.kv]


def test_images_are_attached_sent_saved_and_sent_again_on_reopen(
    qtbot: QtBot,
    gui_ctx: GuiContext,
    bridge: Bridge,
    tmp_path: Path,
    smollm2_path: Path,
    projector: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mid = import_with_projector(gui_ctx.service, smollm2_path, projector)
    db = tmp_path / "data" / "conversations.sqlite"
    db.parent.mkdir()
    page = new_page(qtbot, gui_ctx, bridge, db)
    ready(page, qtbot, mid)
    page.max_tokens_spin.setValue(2)
    page.temperature_spin.setValue(0.0)
    bar = page.attachments
    # dropped, pasted (a screenshot on the clipboard), and picked with the Attach button
    drop(page, png_file(tmp_path / "one.png", 1))
    qtbot.waitUntil(lambda: len(bar.image_chips) == 1, timeout=10_000)
    shot = QImage(str(png_file(tmp_path / "two.png", 2)))
    mime = QMimeData()
    mime.setImageData(shot)
    page.prompt_edit.insertFromMimeData(mime)
    qtbot.waitUntil(lambda: len(bar.image_chips) == 2, timeout=10_000)
    three = png_file(tmp_path / "three.jpg", 3, "JPEG")
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(three)], ""))
    qtbot.mouseClick(bar.attach_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(bar.image_chips) == 3, timeout=10_000)
    names = [c.image.name for c in bar.image_chips]
    assert (
        names == ["one.png", "pasted-image-1.png", "three.jpg"]
        and page.prompt_edit.toPlainText() == ""
    )
    for c in bar.image_chips:  # each chip shows its thumbnail
        pm = c.thumb_label.pixmap()
        assert not pm.isNull() and 0 < pm.height() <= 40
    qtbot.mouseClick(bar.image_chips[2].remove_button, Qt.MouseButton.LeftButton)
    sent = bar.images
    assert [i.name for i in sent] == ["one.png", "pasted-image-1.png"]

    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        assert page.send("What is in these pictures?")
    assert done.args[0] in ("stop", "length") and bar.image_chips == []  # they went with it
    # the decoded pixels reached the model: each image's positions, keyed on its digest
    digests = [decode_image(i.data, where=i.name).digest for i in sent]
    runs = [image_tokens(d, N_IMAGE_TOKENS) for d in digests]
    first = slot_prompts(gui_ctx, mid)
    assert any(holds(kv, runs[0]) and holds(kv, runs[1]) for kv in first)
    # the question shows the images as thumbnails; a click opens one larger
    question = page.transcript.messages()[0]
    strip = question.image_strip
    assert strip is not None and len(strip.buttons) == 2
    assert "[image: one.png]" in question.plain_text()
    qtbot.mouseClick(strip.buttons[0], Qt.MouseButton.LeftButton)
    assert strip.dialog is not None and strip.dialog.isVisible()
    assert strip.dialog.image_label.pixmap().width() >= IMAGE_SIZE
    strip.dialog.close()
    # saved: small rows referencing content-addressed files beside the conversations
    assert page.session is not None and page.session.conversation is not None
    conv_id = page.session.conversation.id
    saved = ConversationStore(db).load(conv_id).path()[0]
    refs = saved.extras["images"]
    assert [r["name"] for r in refs] == ["one.png", "pasted-image-1.png"]
    assert saved.content == "What is in these pictures?"  # no markers in the saved text
    for r, img in zip(refs, sent, strict=True):
        assert (db.parent / "chat-images" / r["file"]).read_bytes() == img.data

    # a restart: a new page on the same store shows them again and sends them again
    page.close()
    again = new_page(qtbot, gui_ctx, bridge, db)
    ready(again, qtbot, mid)
    assert again.session is not None
    again.session.open(conv_id)
    reopened = again.transcript.messages()[0]
    assert reopened.image_strip is not None and len(reopened.image_strip.buttons) == 2
    assert [len(m.image_sources) for m in again.history] == [2, 0]
    again.max_tokens_spin.setValue(2)
    with qtbot.waitSignal(again.answer_finished, timeout=SLOW):
        assert again.send("And now?")
    later = slot_prompts(gui_ctx, mid)
    # the slot that answered holds the longer prompt: both images, then the new turn
    grown = [kv for kv in later if len(kv) > max(len(k) for k in first)]
    assert grown and all(holds(kv, runs[0]) and holds(kv, runs[1]) for kv in grown)


def test_a_model_without_vision_refuses_and_bad_images_say_why(
    qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge, tmp_path: Path, projector: Path
) -> None:
    # two tiny models that never load here: one with a projector, one without
    vision = import_with_projector(
        gui_ctx.service, write_model(tmp_path / "Eye-Q8_0.gguf"), projector
    )
    plain = import_with_projector(gui_ctx.service, write_model(tmp_path / "Text-Q8_0.gguf"), None)
    page = new_page(qtbot, gui_ctx, bridge, tmp_path / "conversations.sqlite")
    bar = page.attachments
    ready(page, qtbot, plain)
    drop(page, png_file(tmp_path / "cat.png", 7))
    qtbot.waitUntil(lambda: bar.error_label.isVisible(), timeout=10_000)
    assert "cannot see images" in bar.error_label.text() and "vision" in bar.error_label.text()
    assert bar.image_chips == []
    # a bomb (its header claims 100000x100000) and a corrupt file: refused, with the reason
    ready(page, qtbot, vision)
    (tmp_path / "bomb.png").write_bytes(bomb_png())
    drop(page, tmp_path / "bomb.png")
    qtbot.waitUntil(lambda: "bomb.png" in bar.error_label.text(), timeout=10_000)
    assert "pixels" in bar.error_label.text() and bar.image_chips == []
    (tmp_path / "broken.png").write_bytes(noise_png()[:1500])
    drop(page, tmp_path / "broken.png")
    qtbot.waitUntil(lambda: "broken.png" in bar.error_label.text(), timeout=10_000)
    assert "corrupt" in bar.error_label.text() and bar.image_chips == []
    # attached for the vision model, then the model switched: not sent, nothing lost
    drop(page, tmp_path / "cat.png")
    qtbot.waitUntil(lambda: len(bar.image_chips) == 1, timeout=10_000)
    page.select_model(plain)
    page.prompt_edit.setPlainText("What is this?")
    qtbot.mouseClick(page.send_button, Qt.MouseButton.LeftButton)
    assert "cannot see images" in bar.error_label.text()
    assert page.prompt_edit.toPlainText() == "What is this?" and len(bar.image_chips) == 1
    assert page.history == [] and not page.streaming
