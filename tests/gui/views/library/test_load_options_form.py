"""The Load dialog's option editors come from the load option table: ranges, steps,
the special value of a minimum and the help text all follow it."""

from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QSpinBox
from pytestqt.qtbot import QtBot

from app.core.engine.load_options import SPECS
from app.core.types import LoadOptions
from app.gui.views.library.load_options_form import LoadOptionsForm


def test_editors_take_range_help_and_choices_from_the_table(qtbot: QtBot) -> None:
    form = LoadOptionsForm(trained_context=8192, mlx=False)
    qtbot.addWidget(form)
    e = form.editors
    assert set(e) == set(SPECS)
    parallel = e["parallel"]
    assert isinstance(parallel, QSpinBox)
    assert (parallel.minimum(), parallel.maximum()) == (1, 16)
    assert parallel.toolTip().lower().startswith(SPECS["parallel"].help[:20].lower())
    ctx = e["context_length"]
    assert isinstance(ctx, QSpinBox)
    # the table's range (a longer context than trained is allowed, with a warning); 0 shows
    # the table's special text
    assert (ctx.minimum(), ctx.maximum(), ctx.singleStep()) == (0, 1 << 22, 512)
    assert ctx.specialValueText() == "Auto (fits memory)"
    kv = e["kv_type"]
    assert isinstance(kv, QComboBox)
    assert [kv.itemData(i) for i in range(kv.count())] == list(SPECS["kv_type"].choices)
    assert isinstance(e["use_mmap"], QCheckBox) and isinstance(e["rope_freq_scale"], QDoubleSpinBox)
    # values round-trip through the form, seed None included
    opts = LoadOptions(context_length=1024, parallel=3, kv_type="q8_0", use_mmap=False, seed=None)
    form.show_options(opts)
    shown = form.values()
    assert shown == {f.name: getattr(opts, f.name) for f in dataclasses.fields(LoadOptions)}
    form.show_options(dataclasses.replace(opts, seed=42))
    assert form.values()["seed"] == 42


def test_a_range_change_in_the_table_changes_the_dialogs_maximum(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(SPECS, "parallel", dataclasses.replace(SPECS["parallel"], maximum=3))
    monkeypatch.setitem(
        SPECS, "batch_size", dataclasses.replace(SPECS["batch_size"], maximum=1024, step=64)
    )
    form = LoadOptionsForm(trained_context=0, mlx=False)
    qtbot.addWidget(form)
    parallel, batch = form.editors["parallel"], form.editors["batch_size"]
    assert isinstance(parallel, QSpinBox) and isinstance(batch, QSpinBox)
    assert parallel.maximum() == 3
    assert (batch.maximum(), batch.singleStep()) == (1024, 64)
    ctx = form.editors["context_length"]
    assert isinstance(ctx, QSpinBox) and ctx.maximum() == 1 << 22  # unknown trained context


def test_an_mlx_model_shows_only_what_mlx_reads(qtbot: QtBot) -> None:
    form = LoadOptionsForm(trained_context=2048, mlx=True)
    qtbot.addWidget(form)
    assert set(form.values()) == {s.name for s in SPECS.values() if s.mlx}
    for s in SPECS.values():
        if not s.advanced and s.name != "context_length":  # (its row is a layout, always shown)
            assert form.form.isRowVisible(form.editors[s.name]) is s.mlx, s.name
    assert not form.form.isRowVisible(form.advanced_button)


def test_a_typed_context_length_is_kept_as_typed(qtbot: QtBot) -> None:
    form = LoadOptionsForm(trained_context=8192, mlx=False)
    qtbot.addWidget(form)
    ctx = form.editors["context_length"]
    assert isinstance(ctx, QSpinBox)
    form.show()
    ctx.lineEdit().selectAll()
    qtbot.keyClicks(ctx, "1000000")  # typed, key by key, as a user does
    qtbot.keyClick(ctx, Qt.Key.Key_Return)
    assert ctx.value() == 1_000_000 and form.values()["context_length"] == 1_000_000
    assert "more than the 8,192 tokens it was trained on" in form.context_hint.text()
    ctx.setValue(4096)
    assert form.context_hint.text() == "trained on 8,192 tokens"
