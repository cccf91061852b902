"""The Load dialog: load options with a live memory estimate, keep-alive, pin and presets.
Tested by tests/gui/views/library/test_memory.py."""

from __future__ import annotations

import logging
from typing import Any, cast

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.engine.loaded import LoadedInfo
from app.core.engine.presets import validate_options
from app.core.library.fit import separate_caches
from app.core.service import Hearth
from app.core.types import LoadedModel, LoadOptions, LocalModel
from app.errors import InsufficientMemory, InvalidRequest, ModelBusy
from app.gui.bridge import Bridge, log_failure
from app.gui.units import grouped, human_bytes, human_count
from app.gui.views.common import MessageBanner
from app.gui.views.library.load_options_form import LoadOptionsForm

log = logging.getLogger(__name__)

DEBOUNCE_MS = 150  # estimate once the user pauses editing
FIT_COLORS = {"fits": "#1a7f37", "fits-after-eviction": "#7a4b00", "too-large": "#b3261e"}


def estimate_with_eviction(
    service: Hearth, model_id: str, options: dict[str, Any]
) -> dict[str, Any]:
    """Loop thread: ``service.estimate`` plus ``evictable``, the memory that idle, unpinned
    models hold (the scheduler unloads them to make room before refusing a load)."""
    est = service.models.estimate(model_id, options)
    est["evictable"] = sum(
        m.memory_bytes
        for m in service.models.loaded()
        if not m.pinned and m.pending == 0 and m.model_id != model_id
    )
    return est


def fit_state(est: dict[str, Any]) -> str:
    """fits | fits-after-eviction | too-large, the way the scheduler will decide."""
    if est["fits"]:
        return "fits"
    need = est["calibrated_total"]
    if est["used"] - est["evictable"] + need <= est["budget"]:
        return "fits-after-eviction"
    return "too-large"


def fit_text(est: dict[str, Any]) -> str:
    state = fit_state(est)
    need, budget, used = est["calibrated_total"], est["budget"], est["used"]
    if state == "fits":
        return f"✓ Fits: needs {human_bytes(need)}, {human_bytes(budget - used)} free in the budget"
    if state == "fits-after-eviction":
        return (
            f"✓ Fits after unloading idle models: needs {human_bytes(need)}, "
            f"{human_bytes(budget - used)} free now"
        )
    free = max(0, budget - (used - est["evictable"]))
    return (
        f"✗ Does not fit: needs {human_bytes(need)}, only {human_bytes(free)} of the "
        f"{human_bytes(budget)} budget can be freed"
    )


def refusal_text(exc: InsufficientMemory) -> str:
    return (
        f"Not enough memory: this load needs about {human_bytes(exc.needed)}, and only "
        f"{human_bytes(exc.available)} of the memory budget can be freed (busy and pinned models "
        f"stay). Lower the context or the KV cache type, unload a model, raise the budget in "
        f"Settings — or load anyway."
    )


class LoadDialog(QDialog):
    """Opened by the Library's Load button. Load (the default button) uses what the form shows:
    the model's preset over the global defaults unless the user changes something."""

    options_loaded = Signal()  # the form shows the effective options (defaults + preset)
    estimate_updated = Signal(object)  # dict: service.estimate + evictable
    load_finished = Signal(str, int)  # model id, context length
    load_refused = Signal(int, int)  # bytes needed, bytes available
    load_failed = Signal(str)  # message

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        model: LocalModel,
        parent: QWidget | None = None,
        *,
        debounce_ms: int = DEBOUNCE_MS,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.model = model
        self.is_mlx = model.format == "mlx"
        self.is_speech = model.format == "whisper"
        self.loading = False
        self.reloading = False  # the model is loaded: Load reloads it with the form's options
        self.estimate: dict[str, Any] | None = None
        self._estimate_seq = 0
        self._pending = 0  # bridge calls in flight: the dialog outlives them before deletion
        self._closed = False
        self._initial = LoadOptions()
        self._preset: dict[str, Any] = {}
        self._initial_ttl: float | None = None
        self._initial_pinned = False
        self.setWindowTitle(f"Load {model.id}")
        self.setModal(True)

        # -- options (built from the load option table) ------------------------------------------
        gguf = service.runtimes.get("gguf")
        self.option_form = LoadOptionsForm(
            trained_context=model.context_length or 0,
            mlx=self.is_mlx,
            gpu_offload=bool(getattr(gguf, "gpu_offload", True)),
            speech=self.is_speech,
        )
        self.options_form = self.option_form.form
        self.editors = self.option_form.editors
        self.advanced_button = self.option_form.advanced_button
        self.advanced_box = self.option_form.advanced_box
        self.context_hint = self.option_form.context_hint
        e = self.editors
        self.context_spin = cast(QSpinBox, e["context_length"])
        self.gpu_layers_spin = cast(QSpinBox, e["gpu_layers"])
        self.flash_combo = cast(QComboBox, e["flash_attention"])
        self.kv_combo = cast(QComboBox, e["kv_type"])
        self.seed_spin = cast(QSpinBox, e["seed"])
        self.parallel_spin = cast(QSpinBox, e["parallel"])
        self.prompt_cache_combo = cast(QComboBox, e["prompt_cache"])
        self.threads_spin = cast(QSpinBox, e["threads"])
        self.batch_spin = cast(QSpinBox, e["batch_size"])
        self.ubatch_spin = cast(QSpinBox, e["ubatch_size"])
        self.mmap_check = cast(QCheckBox, e["use_mmap"])
        self.mlock_check = cast(QCheckBox, e["use_mlock"])
        self.rope_combo = cast(QComboBox, e["rope_scaling"])
        self.rope_base_spin = cast(QDoubleSpinBox, e["rope_freq_base"])
        self.rope_scale_spin = cast(QDoubleSpinBox, e["rope_freq_scale"])
        options_box = self.option_form

        # -- estimate -------------------------------------------------------------------------
        self.weights_label = QLabel("…")
        self.kv_label = QLabel("…")
        self.idle_label = QLabel("…")  # idle conversations' caches in host memory, at most
        self.compute_label = QLabel("…")
        self.overhead_label = QLabel("…")
        self.total_label = QLabel("…")
        bold = self.total_label.font()
        bold.setBold(True)
        self.total_label.setFont(bold)
        self.budget_label = QLabel("…")
        self.fit_label = QLabel("Estimating…")
        self.fit_label.setWordWrap(True)
        self.fit_label.setMinimumWidth(300)
        # room for two lines from the start: the text arrives later and the dialog must not clip it
        self.fit_label.setMinimumHeight(2 * self.fit_label.fontMetrics().lineSpacing() + 4)
        self.fit_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        estimate_box = QGroupBox("Memory estimate")
        ef = QFormLayout(estimate_box)
        # why the context is what it is (auto-fit's choice: trained length, cap or budget)
        self.context_reason_label = QLabel("")
        self.context_reason_label.setWordWrap(True)
        ef.addRow("Context", self.context_reason_label)
        ef.addRow("Weights", self.weights_label)
        ef.addRow("KV cache", self.kv_label)
        ef.addRow("Idle caches (RAM)", self.idle_label)
        ef.addRow("Compute buffers", self.compute_label)
        ef.addRow("Runtime overhead", self.overhead_label)
        ef.addRow("Total", self.total_label)
        ef.addRow("Budget", self.budget_label)
        ef.addRow(self.fit_label)
        if self.is_speech:
            # a speech model has no prompt context or KV cache: weights plus the audio's work
            for w in (self.context_reason_label, self.kv_label, self.idle_label):
                ef.setRowVisible(w, False)
            label = ef.labelForField(self.compute_label)
            if isinstance(label, QLabel):
                label.setText("Audio and decoding")

        # -- after loading ----------------------------------------------------------------------
        self.ttl_check = QCheckBox("Unload after")
        self.ttl_spin = QSpinBox()
        self.ttl_spin.setRange(0, 7 * 24 * 60)
        self.ttl_spin.setSingleStep(5)
        self.ttl_spin.setSpecialValueText("0 min (as soon as idle)")
        self.ttl_spin.setSuffix(" min idle")
        self.ttl_spin.setMinimumWidth(130)
        self.ttl_spin.setValue(15)
        self.pin_check = QCheckBox("Pin: keep loaded, never unload to make room")
        self.preset_check = QCheckBox("Save as preset for this model")
        self.preset_check.setToolTip(
            "Remember these options: on-demand loads through the API use them too"
        )
        ttl_row = QHBoxLayout()
        ttl_row.addWidget(self.ttl_check)
        ttl_row.addWidget(self.ttl_spin)
        ttl_row.addStretch(1)
        keep_box = QGroupBox("Keep loaded")
        kf = QVBoxLayout(keep_box)
        kf.addLayout(ttl_row)
        kf.addWidget(self.pin_check)

        # -- footer ---------------------------------------------------------------------------
        self.banner = MessageBanner()
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(10)
        self.progress.hide()
        self.load_anyway_button = QPushButton("Load anyway")
        self.load_anyway_button.hide()
        self.cancel_button = QPushButton("Cancel")
        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        buttons = QHBoxLayout()
        buttons.addWidget(self.preset_check)
        buttons.addStretch(1)
        buttons.addWidget(self.load_anyway_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.load_button)

        info = QLabel(f"<b>{model.id}</b><br><span style='color:#6b6b6b'>{_describe(model)}</span>")
        info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        right = QVBoxLayout()
        right.addWidget(estimate_box)
        right.addWidget(keep_box)
        right.addStretch(1)
        columns = QHBoxLayout()
        columns.addWidget(options_box, 3)
        columns.addLayout(right, 2)
        layout = QVBoxLayout(self)
        layout.addWidget(info)
        layout.addLayout(columns, 1)
        layout.addWidget(self.banner)
        layout.addWidget(self.progress)
        layout.addLayout(buttons)

        self.estimate_timer = QTimer(self)
        self.estimate_timer.setSingleShot(True)
        self.estimate_timer.setInterval(debounce_ms)
        self.estimate_timer.timeout.connect(self._on_estimate_timer_timeout)

        self.load_button.clicked.connect(self._on_load_button_clicked)
        self.load_anyway_button.clicked.connect(self._on_load_anyway_button_clicked)
        self.cancel_button.clicked.connect(self.reject)
        self.ttl_check.toggled.connect(self._on_keep_alive_changed)
        self.pin_check.toggled.connect(self._on_keep_alive_changed)
        self.option_form.changed.connect(self._on_option_changed)
        self._on_keep_alive_changed()
        self._set_form_enabled(False)  # until the effective options arrive
        self._call(_effective, service, model.id, on_done=self._on_effective_read)

    # -- the form ------------------------------------------------------------------------------------
    def options(self) -> dict[str, Any]:
        """The options the form shows (only those this model's runtime reads)."""
        return self.option_form.values()

    def ttl_seconds(self) -> float | None:
        """The keep-alive the form asks for: seconds idle, or None for never."""
        if not self.ttl_check.isChecked():
            return None
        minutes = self.ttl_spin.value()
        initial = self._initial_ttl
        if initial is not None and minutes == _minutes(initial):
            return initial  # untouched: keep the preset's exact value
        return minutes * 60.0

    def preset(self) -> dict[str, Any]:
        """What "Save as preset" writes: the preset's keys with the form's values, plus every
        option the user changed (so unchanged global defaults keep following Settings)."""
        out = dict(self._preset)
        for k, v in self.options().items():
            if k in self._preset or v != getattr(self._initial, k):
                out[k] = v
        ttl = self.ttl_seconds()
        if "ttl" in self._preset or ttl != self._initial_ttl:
            out["ttl"] = -1 if ttl is None else ttl
        pinned = self.pin_check.isChecked()
        if "pinned" in self._preset or pinned != self._initial_pinned:
            out["pinned"] = pinned
        return out

    def _show_options(self, o: LoadOptions) -> None:
        self.option_form.show_options(o)

    # -- actions -------------------------------------------------------------------------------------
    def request_estimate(self) -> None:
        """Estimate after the debounce (each change restarts it)."""
        self._estimate_seq += 1  # an estimate in flight is for the old options: drop it
        self.estimate_timer.start()

    def start_load(self, *, force: bool = False) -> None:
        """Save the preset when asked, then load; the dialog closes when the model is loaded."""
        try:
            options = validate_options(self.options())
            preset = validate_options(self.preset()) if self.preset_check.isChecked() else None
        except InvalidRequest as e:
            self.banner.show_message(e.message, "error")
            return
        self.banner.clear_message()
        self.load_anyway_button.hide()
        self._set_loading(True)
        if preset is not None:
            self._call(
                self._service.models.save_preset,
                self.model.id,
                preset,
                on_error=self._on_preset_save_failed,
            )
        self._run(
            self._service.models.load(
                self.model.id,
                options,
                force=force,
                ttl=self.ttl_seconds(),
                pin=self.pin_check.isChecked(),
            ),
            on_done=self._on_load_done,
            on_error=self._on_load_error,
        )

    def done(self, result: int) -> None:  # Qt override: closing (Load finished, Cancel, Esc)
        super().done(result)
        self._closed = True
        self.estimate_timer.stop()
        self._dispose_when_idle()

    # -- slots ---------------------------------------------------------------------------------------
    def _on_effective_read(
        self, result: tuple[LoadOptions, dict[str, Any], LoadedInfo | None]
    ) -> None:
        self._initial, self._preset, loaded = result
        ttl = self._preset.get("ttl")
        self._initial_ttl = None if ttl is None or ttl < 0 else float(ttl)
        self._initial_pinned = bool(self._preset.get("pinned", False))
        self.reloading = loaded is not None
        if loaded is not None:
            # a reload starts from what the model runs with now, not from its preset
            self._initial = loaded.options
            self._initial_ttl, self._initial_pinned = loaded.ttl, loaded.pinned
            self.setWindowTitle(f"Reload {self.model.id} with options")
            self.load_button.setText("Reload")
        self._show_options(self._initial)
        self.ttl_check.setChecked(self._initial_ttl is not None)
        if self._initial_ttl is not None:
            self.ttl_spin.setValue(_minutes(self._initial_ttl))
        self.pin_check.setChecked(self._initial_pinned)
        self.preset_check.setText(
            "Update this model's preset" if self._preset else "Save as preset for this model"
        )
        self._set_form_enabled(True)
        self.load_button.setFocus()
        self.options_loaded.emit()
        self._estimate_now()

    def _on_option_changed(self, *_: object) -> None:
        self.request_estimate()

    def _on_keep_alive_changed(self, *_: object) -> None:
        pinned = self.pin_check.isChecked()
        self.ttl_check.setEnabled(not pinned)
        self.ttl_spin.setEnabled(not pinned and self.ttl_check.isChecked())

    def _on_estimate_timer_timeout(self) -> None:
        self._estimate_now()

    def _on_estimate_done(self, seq: int, options: dict[str, Any], est: dict[str, Any]) -> None:
        if seq != self._estimate_seq:
            return  # the options changed since this estimate was asked for
        self.estimate = est
        kv_type = options.get("kv_type", "f16")  # MLX caches keys and values in f16
        self.weights_label.setText(human_bytes(est["weights"]))
        # a cache stream per request with the per-sequence layout or the exact prompt cache
        separate = separate_caches(
            str(options.get("prompt_cache", "reuse")), str(options.get("kv_layout", "shared"))
        )
        streams = int(options.get("parallel", 1) or 1) if separate else 1
        per = f"{grouped(est['context_length'])} tokens"
        per = f"{streams} × {per}" if streams > 1 else per
        self.kv_label.setText(f"{human_bytes(est['kv_cache'])}  ({per}, {kv_type})")
        idle = int(est.get("prompt_ram", 0))
        self.idle_label.setText(
            f"up to {human_bytes(idle)}  (other conversations' caches)" if idle else "none"
        )
        reason = str(est.get("context_reason", ""))
        self.context_reason_label.setText(
            f"{grouped(est['context_length'])} tokens: {reason}" if reason else ""
        )
        self.compute_label.setText(human_bytes(est["compute"]))
        self.overhead_label.setText(human_bytes(est["overhead"]))
        total = human_bytes(est["calibrated_total"])
        if est["calibrated_total"] > est["total"]:
            total += "  (as measured on an earlier load)"
        self.total_label.setText(total)
        self.budget_label.setText(
            f"{human_bytes(est['used'])} in use of {human_bytes(est['budget'])}"
        )
        state = fit_state(est)
        self.fit_label.setText(fit_text(est))
        self.fit_label.setStyleSheet(f"color:{FIT_COLORS[state]}; font-weight:bold")
        self.estimate_updated.emit(est)

    def _on_estimate_failed(self, seq: int, exc: BaseException) -> None:
        if seq != self._estimate_seq:
            return
        self.estimate = None
        self.fit_label.setText("No estimate: " + log_failure(log, "estimate failed", exc))
        self.fit_label.setStyleSheet(f"color:{FIT_COLORS['too-large']}")

    def _on_load_button_clicked(self) -> None:
        self.start_load()

    def _on_load_anyway_button_clicked(self) -> None:
        self.start_load(force=True)

    def _on_load_done(self, lm: LoadedModel) -> None:
        self._set_loading(False)
        self.load_finished.emit(self.model.id, lm.context_length)
        if not self._closed:
            self.accept()

    def _on_load_error(self, exc: BaseException) -> None:
        self._set_loading(False)
        if isinstance(exc, InsufficientMemory):
            log.info("load of %s refused: %s", self.model.id, exc.message)
            self.banner.show_message(refusal_text(exc), "error")
            self.load_anyway_button.show()
            self.load_refused.emit(exc.needed, exc.available)
            return
        if isinstance(exc, ModelBusy):  # loaded with other options and answering requests
            text = (
                f"{self.model.id} is loaded with other options and answering {exc.pending} "
                f"request(s); load again once they finish to reload it with these."
            )
            self.banner.show_message(text, "error")
            self.load_failed.emit(text)
            return
        text = log_failure(log, f"loading {self.model.id} failed", exc)
        self.banner.show_message(f"Could not load {self.model.id}: {text}", "error")
        self.load_failed.emit(text)

    def _on_preset_save_failed(self, exc: BaseException) -> None:
        text = log_failure(log, "saving the preset failed", exc)
        self.banner.show_message(f"Could not save the preset: {text}", "error")

    # -- helpers -------------------------------------------------------------------------------------
    def _estimate_now(self) -> None:
        self.estimate_timer.stop()
        self._estimate_seq += 1
        seq = self._estimate_seq
        try:
            options = validate_options(self.options())
        except InvalidRequest as e:
            self.fit_label.setText(e.message)
            return
        self._call(
            estimate_with_eviction,
            self._service,
            self.model.id,
            options,
            on_done=lambda est: self._on_estimate_done(seq, options, est),
            on_error=lambda exc: self._on_estimate_failed(seq, exc),
        )

    def _set_loading(self, loading: bool) -> None:
        self.loading = loading
        self._set_form_enabled(not loading)
        self.progress.setVisible(loading)
        self.cancel_button.setText("Close" if loading else "Cancel")
        self.cancel_button.setToolTip(
            "The model keeps loading in the background" if loading else ""
        )

    def _set_form_enabled(self, enabled: bool) -> None:
        self.option_form.set_editable(enabled)
        for w in (self.ttl_check, self.pin_check):
            w.setEnabled(enabled)
        self.ttl_spin.setEnabled(
            enabled and self.ttl_check.isChecked() and not self.pin_check.isChecked()
        )
        self.ttl_check.setEnabled(enabled and not self.pin_check.isChecked())
        self.preset_check.setEnabled(enabled)
        self.load_button.setEnabled(enabled)
        self.load_anyway_button.setEnabled(enabled)

    def _call(self, fn: Any, *args: Any, on_done: Any = None, on_error: Any = None) -> None:
        self._pending += 1
        self._bridge.call(
            fn, *args, on_done=self._settled(on_done), on_error=self._settled(on_error)
        )

    def _run(self, coro: Any, *, on_done: Any, on_error: Any) -> None:
        self._pending += 1
        self._bridge.run(coro, on_done=self._settled(on_done), on_error=self._settled(on_error))

    def _settled(self, callback: Any) -> Any:
        def settle(value: Any) -> None:
            self._pending -= 1
            try:
                if callback is not None:
                    callback(value)
            finally:
                self._dispose_when_idle()

        return settle

    def _dispose_when_idle(self) -> None:
        # a closed dialog waits for its calls in flight before it goes: their callbacks use it
        if self._closed and self._pending == 0:
            self.deleteLater()


def _effective(
    service: Hearth, model_id: str
) -> tuple[LoadOptions, dict[str, Any], LoadedInfo | None]:
    """Loop thread: (defaults + preset, the preset itself, the model's load if it is loaded);
    the first two read files."""
    loaded = next((i for i in service.models.loaded() if i.model_id == model_id), None)
    return service.models.effective_options(model_id), service.models.preset(model_id), loaded


def _minutes(seconds: float) -> int:
    return max(0, round(seconds / 60))


def _describe(model: LocalModel) -> str:
    if model.format == "whisper":
        return f"Whisper · speech to text · {human_bytes(model.size_bytes)}"
    parts = [model.format.upper()]
    if model.parameters:
        parts.append(f"{human_count(model.parameters)} parameters")
    if model.quantization:
        parts.append(model.quantization)
    parts.append(human_bytes(model.size_bytes))
    return " · ".join(parts)
