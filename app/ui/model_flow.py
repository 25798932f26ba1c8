"""The window's model handling: loading the last, the default or a chosen pair on the worker,
unloading, the Models dialog, the short benchmark, and the status line that says what is
loaded: :class:`ModelController`, one of the window's controllers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QMessageBox,
    QProgressBar,
    QStatusBar,
    QWidget,
)

from app.chat.session import TINY_PAIR, ModelInfo, PairSpec
from app.chat.settings import SettingError
from app.ui import settings as settings_mod
from app.ui.banners import Priority
from app.ui.chat import ChatView, Composer
from app.ui.messages import MessageBar
from app.ui.reply_flow import BENCH_WAIT, ReplyController
from app.ui.serve_flow import ServeController
from app.ui.state import WindowState
from app.ui.text import sentence
from app.ui.transcript import TranscriptController
from app.ui.worker import Worker

log = logging.getLogger("app.ui.window")


def default_pair() -> PairSpec:
    """The pair the window loads by default: the bundled demo pair, with its DFlash2 drafter
    when bundled (:func:`app.paths.bundled_pair`); its target alone when only that is there;
    else the tiny random pair (``tiny``)."""
    from app.paths import bundled_pair, demo_pair_dirs

    pair = bundled_pair()
    if pair is not None:
        target, drafter, v2 = pair
        return PairSpec(str(target), str(drafter), drafter2=str(v2) if v2 is not None else None)
    target = demo_pair_dirs()[0]
    return PairSpec(str(target)) if (target / "config.json").is_file() else PairSpec(tiny=True)


def last_model_failed(folder: str, message: str) -> str:
    """The start-up banner when the pair used last (its target ``folder``, as saved) fails to
    load with ``message``: a folder that no longer holds a model (no ``config.json``: deleted
    or emptied) is said to be gone; either way it says how to get back. Nothing else is
    loaded in its place."""
    back = ("Use File › Use default model to go back to the bundled demo, or File › Models… "
            "to pick another.")
    if not (Path(folder) / "config.json").is_file():
        return (f"Could not load the model used last: its folder {folder} is gone (there is "
                f"no config.json in it any more). {back}")
    return f"Could not load the model used last: {sentence(message)} {back}"


class ModelController(QObject):
    """Loading, unloading, the Models dialog, the benchmark and the status line (see the
    module doc).

    Args:
        state: the window's state (``model``, ``loading``, ``qs``, ``baselines``, ...).
        worker: the window's :class:`app.ui.worker.Worker` (loads, unloads, benchmarks).
        messages: where the window says things.
        chat: the conversation view (its first screen names the loaded pair).
        composer: the composer (its mode switch offers the loaded pair's modes).
        compare_action: Chat › Compare, named after the modes a Compare runs.
        progress, model_label, memory_label, status_bar: the status bar's load progress,
            loaded pair, MLX memory, and the bar itself (the benchmark's message).
        parent: the window, parent of the dialogs.
        replies: stops a running reply before a load.
        serve: stops serving the previous pair before a load.
        transcript: the shown chat's settings line, side panel and token texts.
        loaded, load_failed, bench_finished: called with a load's ``ModelInfo``, a load's
            failure message, and a benchmark's result dict (None when it failed).
    """

    BENCH_WAIT = BENCH_WAIT

    def __init__(self, state: WindowState, worker: Worker, messages: MessageBar,
                 chat: ChatView, composer: Composer, compare_action: QAction,
                 progress: QProgressBar, model_label: QLabel, memory_label: QLabel,
                 status_bar: QStatusBar, parent: QWidget, replies: ReplyController,
                 serve: ServeController, transcript: TranscriptController,
                 loaded: Callable[[ModelInfo], None], load_failed: Callable[[str], None],
                 bench_finished: Callable[[dict | None], None]) -> None:
        super().__init__(parent)  # a QObject of the GUI thread: worker signals queue
        self.state = state
        self.worker = worker
        self.messages = messages
        self.chat, self.composer, self.compare_action = chat, composer, compare_action
        self.progress, self.model_label = progress, model_label
        self.memory_label, self.status_bar = memory_label, status_bar
        self.host = parent
        self.replies, self.serve, self.transcript = replies, serve, transcript
        self._loaded, self._load_failed = loaded, load_failed
        self._bench_finished = bench_finished
        self.bench_dialog = None
        self.models_dialog = None
        self._restoring: PairSpec | None = None  # the saved pair the start-up load restores
        worker.loading.connect(self.on_loading)
        worker.loaded.connect(self.on_loaded)
        worker.probed.connect(self.on_probed)
        worker.loadFailed.connect(self.on_load_failed)
        worker.memory.connect(self.on_memory)
        worker.benchDone.connect(self.on_bench_done)
        worker.benchFailed.connect(self.on_bench_failed)

    def load_last_or_default(self) -> None:
        """Load the last model used (QSettings) or the default pair."""
        target = str(self.state.qs.value("model/target", "") or "")
        drafter = str(self.state.qs.value("model/drafter", "") or "")
        drafter2 = str(self.state.qs.value("model/drafter2", "") or "")
        if drafter2 and not Path(drafter2).exists():
            drafter2 = ""
        if target == TINY_PAIR:
            self.load_model(PairSpec(tiny=True))
        elif target and Path(target).exists():
            spec = PairSpec(target, drafter or None,
                            display_name=str(self.state.qs.value("model/name", "") or ""),
                            repo_id=str(self.state.qs.value("model/repo_id", "") or "") or None,
                            drafter2=drafter2 or None)
            self.load_model(spec)
            self._restoring = spec  # its failure says how to get back (on_load_failed)
        else:
            self.load_default()

    def load_default(self) -> None:
        """Load the bundled demo pair (or the tiny pair, saying so)."""
        spec = default_pair()
        if spec.tiny:
            self.messages.flash("demo pair not bundled: using a random-weight tiny pair "
                                "(gibberish)", 10000)
        self.load_model(spec)

    def load_model(self, target: PairSpec | str, drafter: str = "") -> None:
        """Ask the worker to load a pair (progress shows; the window stays responsive).

        ``target`` is a :class:`PairSpec` (it keeps the display name and repo id), or a folder
        path with ``drafter`` ("" for none; :data:`TINY_PAIR` for the tiny pair). Serving the
        previous pair stops."""
        self.serve.stop_serving("another model is loading")
        if self.state.busy:
            self.replies.stop()
        if isinstance(target, PairSpec):
            spec = target
        elif target == TINY_PAIR:
            spec = PairSpec(tiny=True)
        else:
            spec = PairSpec(str(target), drafter or None)
        self.state.loading = spec
        if self.state.model is None:
            self.set_intro()
        # with the automatic block size on, the warm-up measures the pair's block costs
        try:
            auto = settings_mod.coerce("auto_block",
                                       self.state.current_settings().get("auto_block", False))
        except SettingError:  # a hand-edited chat override: the reply's banner says so
            auto = False
        self.worker.warm_auto_block = auto
        self.worker.loadRequested.emit(spec)

    def unload_asking(self) -> None:
        """File › Unload model: while a reply is being written, ask first (No by default;
        Yes stops the reply), as Quit and Delete chat do; then :meth:`unload`."""
        if self.state.busy and self.replies.writing:
            answer = QMessageBox.question(
                self.host, "Unload model",
                "A reply is still being written. Stop it and unload the model? What it has "
                "written so far is kept and marked “stopped”.",
                QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
            if answer != QMessageBox.Yes:
                return
        self.unload()

    def unload(self) -> None:
        """Drop the loaded models (and stop serving them)."""
        self.serve.stop_serving("the model was unloaded")
        if self.state.busy:
            self.replies.stop()
        self.state.model = None
        self.model_label.setText("No model loaded")
        self.set_intro()
        self.worker.unloadRequested.emit()

    def run_benchmark(self, max_tokens: int = 48) -> None:
        """Benchmark plain vs DFlash on the loaded pair (on the worker) and show the results.

        ``max_tokens`` must be a positive int (a bool, e.g. a QAction's ``checked``, is not
        a token count and falls back to the default 48)."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            max_tokens = 48
        m = self.state.model
        both = m is not None and "dflash2" in m.modes
        pair = "DFlash and DFlash2" if both else "DFlash"
        self.status_bar.showMessage(f"Benchmarking plain vs {pair} on a few held-out prompts…")
        self.state.benchmarking = True
        self.worker.benchRequested.emit(max_tokens)

    def bench_ended(self) -> None:
        """The benchmark is over: a reply sent meanwhile starts now, so its note goes (a note
        that joined it meanwhile, such as the drafter probe's, stays)."""
        self.state.benchmarking = False
        self.status_bar.clearMessage()
        wait = sentence(self.BENCH_WAIT)
        for entry in [e for e in self.messages.banners.entries.values() if wait in e.text]:
            rest = entry.text.replace(wait, "").strip()
            if rest:  # another note joined it: that one stays
                self.messages.banners.replace(entry, rest)
            else:
                self.messages.banners.drop(lambda e, entry=entry: e is entry)
        self.messages.show_top()

    def on_bench_done(self, result: dict) -> None:
        """``Worker.benchDone``: the benchmark's result dict (``ChatSession.benchmark``):
        its plain rate becomes a baseline and its results open in a window."""
        from app.ui.bench_dialog import BenchDialog

        self.bench_ended()
        plain = result.get("modes", {}).get("plain") or {}
        rate = plain.get("pooled_tok_per_s") or plain.get("tok_per_s")
        if self.state.model is not None and rate:
            from app.chat.baseline import PlainSample

            self.state.baselines.add(PlainSample(
                self.state.pair_key(), self.state.model.dtype, int(result.get("max_tokens", 48)),
                int(result.get("prompt_tokens", 0)), float(rate), "short benchmark"))
        self.bench_dialog = BenchDialog(self.host, result)
        self.bench_dialog.show()
        self._bench_finished(result)

    def on_bench_failed(self, message: str) -> None:
        """``Worker.benchFailed``: the benchmark could not run; the banner says why."""
        self.bench_ended()
        self.messages.show_banner(message)
        self._bench_finished(None)

    def open_models(self) -> None:
        """The Models dialog: pick, download, pair and remove models."""
        from app.models.catalog import Catalog
        from app.ui.models_dialog import ModelsDialog

        try:
            catalog = Catalog(data_dir=self.state.data_dir) if self.state.data_dir else Catalog()
            dlg = ModelsDialog(self.host, catalog, self.load_model,
                               probes=self.state.drafter_probes)
        except Exception as exc:  # the window stays usable whatever the scan hits
            log.exception("models dialog")
            self.messages.show_banner(f"Could not open the models list: {exc}")
            return
        dlg.show()
        self.models_dialog = dlg

    def open_model_dialog(self) -> None:
        """Pick a target folder, then (optionally) a drafter folder."""
        target = QFileDialog.getExistingDirectory(self.host, "Target model folder")
        if not target:
            return
        drafter = QFileDialog.getExistingDirectory(
            self.host, "DFlash drafter folder (cancel for plain decoding only)")
        self.load_model(target, drafter or "")

    def on_loading(self, text: str) -> None:
        """``Worker.loading``: a load is under way; ``text`` says which step."""
        self.progress.show()
        self.model_label.setText(text)

    def on_loaded(self, info: ModelInfo) -> None:
        """``Worker.loaded``: the pair ``info`` is loaded: it is remembered for the next
        start, named in the status bar and offered in the mode switch."""
        self.progress.hide()
        self.state.model = info
        self.state.baselines.clear()  # speed-ups compare with plain replies of this load only
        spec = info.spec or self.state.loading or PairSpec(
            info.target_path, info.drafter_path)
        self.state.qs.setValue("model/target", TINY_PAIR if spec.tiny else spec.target)
        self.state.qs.setValue("model/drafter", spec.drafter or "")
        self.state.qs.setValue("model/drafter2", spec.drafter2 or "")
        self.state.qs.setValue("model/name", spec.display_name)
        self.state.qs.setValue("model/repo_id", spec.repo_id or "")
        self.state.loading = None
        self._restoring = None
        self._show_model_line(info)
        self.set_intro()
        # the load failures are over
        self.messages.withdraw_banner(lambda e: e.kind == "error" and e.chat is None)
        self.composer.set_modes(info.modes, "DFlash needs a drafter for this target.")
        self.compare_action.setText(self.composer.compare_btn.accessibleName())
        if info.note:
            self.messages.show_note(info.note)
        self.on_memory(info.memory_bytes)
        if info.memory_before_bytes or info.memory_bytes:
            self.messages.flash(
                f"Loaded: MLX memory {info.memory_before_bytes / 2**20:,.0f} MiB before, "
                f"{info.memory_bytes / 2**20:,.0f} MiB now", 8000)
        self.transcript.update_settings_note()
        if not self.state.busy:  # the shown reply's figures now know the context length and block
            self.transcript.show_message_details(self.state.shown_message)
            if self.chat.colour_drafts:  # e.g. remembered: colour the chat shown on launch
                self.transcript.request_pieces()
            else:
                # a reopened Compare's token texts, to mark its first divergence
                self.transcript.request_compare_pieces()
        # while the user writes the first message: a new chat's system prompt and tools
        try:
            rs = settings_mod.reply_record(self.state.defaults, {}, self.composer.mode())
        except SettingError:  # a bad stored default: the first reply says so
            rs = None
        if rs is not None:
            self.worker.preambleRequested.emit(rs, rs.system_prompt)
        self._loaded(info)

    def on_load_failed(self, message: str, still_loaded: bool = False) -> None:
        """``Worker.loadFailed``: the load failed with ``message``; ``still_loaded`` when the
        pair loaded before stays in use. The pair used last, restored at start, says how to
        get back (:func:`last_model_failed`)."""
        self.progress.hide()
        restored = self._restoring if self.state.loading is self._restoring else None
        self._restoring = None
        self.state.loading = None
        if still_loaded and self.state.model is not None:
            self._show_model_line(self.state.model)  # the working pair stays in use
            self.messages.show_banner(f"Could not load the model: {sentence(message)} "
                                      f"{self.state.model.target_name} is still loaded.")
        else:
            self.state.model = None
            self.model_label.setText("No model loaded")
            self.set_intro()
            self.messages.show_banner(last_model_failed(restored.target, message)
                                      if restored is not None else
                                      f"Could not load the model: {sentence(message)}")
        self._load_failed(message)

    def set_intro(self) -> None:
        """The empty chat's note on the loaded model and its example prompts."""
        m = self.state.model
        if m is None:
            title = ("Loading the model…" if self.state.loading is not None else
                     "No model loaded: pick one with File › Models…")
            self.chat.set_intro(title, "", [])
        else:
            about = m.about or (
                f"{m.target_name}"
                + (f", with the DFlash drafter {m.drafter_name}." if m.drafter_name
                   else ", plain decoding only (no DFlash drafter).")
                + " Type a message below.")
            self.chat.set_intro(f"{m.target_name} is ready", about, m.examples)
        if self.state.conv is None or not self.state.conv.messages:
            self.chat.render(self.state.conv)

    def on_probed(self, probes: tuple) -> None:
        """The loaded drafters' fit probes (``Worker.probed``, right after a load): the Models
        window shows each pair's verdict, and a drafter that does not fit gets the live
        check's lasting note at once (a note the load left waits behind it)."""
        for probe in probes:
            self.state.drafter_probes[probe.key] = probe
        unfit = next((p.note() for p in probes if p.verdict == "unfit"), None)
        if unfit:  # above a note the load left, which shows again once this one is closed
            self.messages.show_note(unfit, Priority.WARNING)

    def _show_model_line(self, info: ModelInfo) -> None:
        """The status bar's line naming the loaded pair."""
        text = f"Target: {info.target_name}"
        text += f"   ·   Drafter: {info.drafter_name}" if info.drafter_name else \
            "   ·   no drafter (plain only)"
        if info.drafter2_name:
            text += f"   ·   DFlash2 drafter: {info.drafter2_name}"
        if info.context_length:
            text += f"   ·   context {info.context_length:,}"
        self.model_label.setText(text)

    def on_memory(self, n: int) -> None:
        """``Worker.memory``: MLX memory in use, ``n`` bytes (0: not shown)."""
        self.state.memory_bytes = int(n or 0)
        self.memory_label.setText(f"MLX memory {self.state.memory_bytes / 2**20:,.0f} MiB"
                                  if self.state.memory_bytes else "")

