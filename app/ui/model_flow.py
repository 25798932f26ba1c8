"""The window's model handling: loading the last, the default or a chosen pair on the worker,
unloading, the Models dialog, the short benchmark, and the status line that says what is
loaded. :class:`ModelFlow` is mixed into :class:`app.ui.window.MainWindow`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.chat.settings import SettingError
from app.ui import settings as settings_mod
from app.ui.banners import Priority
from app.ui.text import sentence
from app.ui.worker import TINY_PAIR, ModelInfo, PairSpec

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


class ModelFlow:
    """Loading, unloading, the Models dialog and the benchmark (see the module doc). Needs
    the attributes :class:`~app.ui.window.MainWindow` sets up."""

    def load_last_or_default(self) -> None:
        """Load the last model used (QSettings) or the default pair."""
        target = str(self.qs.value("model/target", "") or "")
        drafter = str(self.qs.value("model/drafter", "") or "")
        drafter2 = str(self.qs.value("model/drafter2", "") or "")
        if drafter2 and not Path(drafter2).exists():
            drafter2 = ""
        if target == TINY_PAIR:
            self.load_model(PairSpec(tiny=True))
        elif target and Path(target).exists():
            self.load_model(PairSpec(target, drafter or None,
                                     display_name=str(self.qs.value("model/name", "") or ""),
                                     repo_id=str(self.qs.value("model/repo_id", "") or "")
                                     or None, drafter2=drafter2 or None))
        else:
            self.load_default()

    def load_default(self) -> None:
        """Load the bundled demo pair (or the tiny pair, saying so)."""
        spec = default_pair()
        if spec.tiny:
            self.flash("demo pair not bundled: using a random-weight tiny pair (gibberish)",
                       10000)
        self.load_model(spec)

    def load_model(self, target: PairSpec | str, drafter: str = "") -> None:
        """Ask the worker to load a pair (progress shows; the window stays responsive).

        ``target`` is a :class:`PairSpec` (it keeps the display name and repo id), or a folder
        path with ``drafter`` ("" for none; :data:`TINY_PAIR` for the tiny pair). Serving the
        previous pair stops."""
        self.stop_serving("another model is loading")
        if self.busy:
            self.stop()
        if isinstance(target, PairSpec):
            spec = target
        elif target == TINY_PAIR:
            spec = PairSpec(tiny=True)
        else:
            spec = PairSpec(str(target), drafter or None)
        self._loading = spec
        if self.model is None:
            self._set_intro()
        self.worker.loadRequested.emit(spec)

    def unload(self) -> None:
        """Drop the loaded models (and stop serving them)."""
        self.stop_serving("the model was unloaded")
        if self.busy:
            self.stop()
        self.model = None
        self.model_label.setText("No model loaded")
        self._set_intro()
        self.worker.unloadRequested.emit()

    BENCH_WAIT = ("The short benchmark is still running: this reply starts when it ends "
                  "(its results open in a window)")
    """The note shown for a reply sent while the short benchmark runs."""

    def run_benchmark(self, max_tokens: int = 48) -> None:
        """Benchmark plain vs DFlash on the loaded pair (on the worker) and show the results.

        ``max_tokens`` must be a positive int (a bool, e.g. a QAction's ``checked``, is not
        a token count and falls back to the default 48)."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            max_tokens = 48
        self.statusBar().showMessage(
            "Benchmarking plain vs " + ("DFlash and DFlash2" if self.model is not None
                                        and "dflash2" in self.model.modes else "DFlash") + " on a few held-out prompts…")
        self.benchmarking = True
        self.worker.benchRequested.emit(max_tokens)

    def _bench_ended(self) -> None:
        """The benchmark is over: a reply sent meanwhile starts now, so its note goes (a note
        that joined it meanwhile, such as the drafter probe's, stays)."""
        self.benchmarking = False
        self.statusBar().clearMessage()
        wait = sentence(self.BENCH_WAIT)
        for entry in [e for e in self.banners.entries.values() if wait in e.text]:
            rest = entry.text.replace(wait, "").strip()
            if rest:  # another note joined it: that one stays
                self.banners.replace(entry, rest)
            else:
                self.banners.drop(lambda e, entry=entry: e is entry)
        self._show_banner_top()

    def _on_bench_done(self, result: dict) -> None:
        from app.ui.bench_dialog import BenchDialog

        self._bench_ended()
        plain = result.get("modes", {}).get("plain") or {}
        rate = plain.get("pooled_tok_per_s") or plain.get("tok_per_s")
        if self.model is not None and rate:
            from app.chat.baseline import PlainSample

            self.baselines.add(PlainSample(
                self._pair_key(), self.model.dtype, int(result.get("max_tokens", 48)),
                int(result.get("prompt_tokens", 0)), float(rate), "short benchmark"))
        self._bench_dialog = BenchDialog(self, result)
        self._bench_dialog.show()
        self.benchFinished.emit(result)

    def _on_bench_failed(self, message: str) -> None:
        self._bench_ended()
        self.show_banner(message)
        self.benchFinished.emit(None)

    def open_models(self) -> None:
        """The Models dialog: pick, download, pair and remove models."""
        from app.models.catalog import Catalog
        from app.ui.models_dialog import ModelsDialog

        try:
            catalog = Catalog(data_dir=self.data_dir) if self.data_dir else Catalog()
            dlg = ModelsDialog(self, catalog, self.load_model, probes=self.drafter_probes)
        except Exception as exc:  # the window stays usable whatever the scan hits
            log.exception("models dialog")
            self.show_banner(f"Could not open the models list: {exc}")
            return
        dlg.show()
        self._models_dialog = dlg

    def open_model_dialog(self) -> None:
        """Pick a target folder, then (optionally) a drafter folder."""
        target = QFileDialog.getExistingDirectory(self, "Target model folder")
        if not target:
            return
        drafter = QFileDialog.getExistingDirectory(
            self, "DFlash drafter folder (cancel for plain decoding only)")
        self.load_model(target, drafter or "")

    def _on_loading(self, text: str) -> None:
        self.progress.show()
        self.model_label.setText(text)

    def _on_loaded(self, info: ModelInfo) -> None:
        self.progress.hide()
        self.model = info
        self.baselines.clear()  # speed-ups compare with plain replies of this load only
        spec = info.spec or getattr(self, "_loading", None) or PairSpec(
            info.target_path, info.drafter_path)
        self.qs.setValue("model/target", TINY_PAIR if spec.tiny else spec.target)
        self.qs.setValue("model/drafter", spec.drafter or "")
        self.qs.setValue("model/drafter2", spec.drafter2 or "")
        self.qs.setValue("model/name", spec.display_name)
        self.qs.setValue("model/repo_id", spec.repo_id or "")
        self._loading = None
        self._show_model_line(info)
        self._set_intro()
        self.withdraw_banner(lambda e: e.kind == "error" and e.chat is None)  # failures over
        self.composer.set_modes(info.modes, "DFlash needs a drafter for this target.")
        self.compare_action.setText(self.composer.compare_btn.accessibleName())
        if info.note:
            self.show_note(info.note)
        self._on_memory(info.memory_bytes)
        if info.memory_before_bytes or info.memory_bytes:
            self.flash(
                f"Loaded: MLX memory {info.memory_before_bytes / 2**20:,.0f} MiB before, "
                f"{info.memory_bytes / 2**20:,.0f} MiB now", 8000)
        self.update_settings_note()
        if not self.busy:  # the shown reply's figures now know the context length and block
            self.show_message_details(self.shown_message)
            if self.chat.colour_drafts:  # e.g. remembered: colour the chat shown on launch
                self._request_pieces()
            else:
                self._request_compare_pieces()  # a reopened Compare's token texts, to mark it
        # while the user writes the first message: a new chat's system prompt and tools
        try:
            rs = settings_mod.reply_record(self.defaults, {}, self.composer.mode())
        except SettingError:  # a bad stored default: the first reply says so
            rs = None
        if rs is not None:
            self.worker.preambleRequested.emit(rs, rs.system_prompt)
        self.modelLoaded.emit(info)

    def _on_load_failed(self, message: str, still_loaded: bool = False) -> None:
        self.progress.hide()
        self._loading = None
        if still_loaded and self.model is not None:
            self._show_model_line(self.model)  # the working pair stays in use
            self.show_banner(f"Could not load the model: {sentence(message)} "
                             f"{self.model.target_name} is still loaded.")
        else:
            self.model = None
            self.model_label.setText("No model loaded")
            self._set_intro()
            self.show_banner(f"Could not load the model: {sentence(message)}")
        self.loadFailed.emit(message)

    def _set_intro(self) -> None:
        """The empty chat's note on the loaded model and its example prompts."""
        m = self.model
        if m is None:
            title = ("Loading the model…" if self._loading is not None else
                     "No model loaded: pick one with File › Models…")
            self.chat.set_intro(title, "", [])
        else:
            about = m.about or (
                f"{m.target_name}"
                + (f", with the DFlash drafter {m.drafter_name}." if m.drafter_name
                   else ", plain decoding only (no DFlash drafter).")
                + " Type a message below.")
            self.chat.set_intro(f"{m.target_name} is ready", about, m.examples)
        if self.conv is None or not self.conv.messages:
            self.chat.render(self.conv)

    def _on_probed(self, probes: tuple) -> None:
        """The loaded drafters' fit probes (``Worker.probed``, right after a load): the Models
        window shows each pair's verdict, and a drafter that does not fit gets the live
        check's lasting note at once (a note the load left waits behind it)."""
        for probe in probes:
            self.drafter_probes[probe.key] = probe
        unfit = next((p.note() for p in probes if p.verdict == "unfit"), None)
        if unfit:  # above a note the load left, which shows again once this one is closed
            self.show_note(unfit, Priority.WARNING)

    def send_example(self, index: int) -> bool:
        """Send the loaded model's example ``index`` (tools turned on for this chat when the
        example needs them and they are off, saying so)."""
        m = self.model
        if m is None or not 0 <= index < len(m.examples):
            return False
        ex = m.examples[index]
        turned_on = ex.needs_tools and not self.current_settings().get("use_tools", True)
        if turned_on:
            if self.conv is None and self.new_chat() is None:
                return False  # the store could not make one (its banner says why)
            self.conv.settings = dict(self.conv.settings, use_tools=True)
            self._save(self.conv)
        sent = self.send(ex.prompt)
        if turned_on:  # after the reply started (starting clears the banner)
            self.show_note("Tools are on for this chat: this example needs them.")
        return sent

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

    def _on_memory(self, n: int) -> None:
        self.memory_bytes = int(n or 0)
        self.memory_label.setText(f"MLX memory {self.memory_bytes / 2**20:,.0f} MiB"
                                  if self.memory_bytes else "")

