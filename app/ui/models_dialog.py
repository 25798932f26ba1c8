"""The Models dialog: pick a target and drafter, add folders, download, delete.

Qt only, no MLX: it reads the :class:`app.models.catalog.Catalog` (config files and the
Hugging Face cache index) and runs downloads through :mod:`app.models.download` on a plain
Python thread, whose progress reaches the GUI thread through the Qt signals of
:class:`DownloadRunner` (queued across threads). Loading is not done here: *Load* calls
``on_load_pair(PairSpec)`` and the window's worker does the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.chat.session import PairSpec
from app.engine.errors import EngineError
from app.engine.modes import Mode
from app.models import download as dl
from app.models.catalog import (
    KNOWN_PAIRS,
    Catalog,
    KnownPair,
    ModelEntry,
    estimate_memory,
    format_bytes,
    known_pair_for,
)
from app.ui.fit import WrapLabel

ROLE_ENTRY = Qt.ItemDataRole.UserRole
ROLE_MISSING = Qt.ItemDataRole.UserRole + 1
"""A targets row's added folder that is not on disk (the row has no entry)."""
MISSING_TEXT = "folder not found"
TARGET_ROWS = 6
"""Targets the list shows without scrolling (more scroll): the dialog grows to fit them."""
SOURCE_LABELS = {"bundled": "bundled", "folder": "folder", "cache": "HF cache"}


def format_duration(seconds: float | None) -> str:
    """``95`` -> ``1 min 35 s``; ``7300`` -> ``2 h 1 min``; None -> ``?``."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {(s % 3600) // 60} min"


def progress_text(p: dl.DownloadProgress) -> str:
    """``1.2 GB of 4.2 GB · 35.1 MB/s · 1 min 30 s left · file 2 of 5``."""
    parts = [
        f"{format_bytes(p.bytes_done)} of {format_bytes(p.bytes_total)}"
        if p.bytes_total
        else format_bytes(p.bytes_done)
    ]
    parts.append(f"{format_bytes(p.rate_bps)}/s")
    parts.append(f"{format_duration(p.eta_s)} left")
    parts.append(f"file {min(p.files_done + 1, p.files_total)} of {p.files_total}")
    return " · ".join(parts)


class DownloadRunner(QObject):
    """Runs downloads of one or more repos (in order) on a Python thread; Qt signals out.

    Signals (delivered to GUI-thread slots through queued connections):
        progress(str repo_id, object DownloadProgress)
        finished(object paths: list[Path] | None, object error: EngineError | None)
    """

    progress = Signal(str, object)
    finished = Signal(object, object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, repo_ids: list[str]) -> None:
        """Download ``repo_ids`` one after another (target, then drafter)."""
        if self.is_running():
            raise RuntimeError("a download is already running")
        self._cancel = threading.Event()
        cancel = self._cancel
        self._thread = threading.Thread(
            target=self._run, args=(list(repo_ids), cancel), name="models-download",
            daemon=True,
        )
        self._thread.start()

    def cancel(self) -> None:
        """Ask the running download to stop (next chunk or file)."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.is_running()

    def _run(self, repo_ids: list[str], cancel: threading.Event) -> None:
        paths: list[Path] = []
        try:
            for repo in repo_ids:
                paths.append(
                    dl.download_repo(
                        repo,
                        cancel=cancel,
                        on_progress=lambda p, r=repo: self.progress.emit(r, p),
                    )
                )
        except EngineError as exc:
            self.finished.emit(None, exc)
            return
        except Exception as exc:  # a thread must not die silently
            self.finished.emit(None, dl.DownloadError(str(exc)))
            return
        self.finished.emit(paths, None)


def fit_rows(tree: QTreeWidget, most: int = 12) -> None:
    """Make ``tree`` at least as tall as its header and rows (up to ``most``), so a short list
    such as the known pairs shows whole instead of three rows and a scroll bar beside empty
    room."""
    rows = min(tree.topLevelItemCount(), most)
    if rows == 0:
        return
    row = tree.sizeHintForRow(0) or tree.fontMetrics().height() + 4
    tree.setMinimumHeight(tree.header().sizeHint().height() + rows * row
                          + 2 * tree.frameWidth() + 2)


class ModelsDialog(QDialog):
    """Targets, drafters and known pairs; Add folder, Download, Delete, Load.

    Args:
        parent: parent widget (or None).
        catalog: the model catalog to show (scanned on open and after every change).
        on_load_pair: called with a :class:`~app.chat.session.PairSpec` (paths, display name,
            repo id) when the user loads;
            ``None`` means plain decoding.
        probes: the drafter fit probes of pairs loaded so far
            (:class:`~app.chat.drafter_probe.DrafterProbe` by
            :func:`~app.chat.drafter_probe.pair_key`; the window's, read live): a probed
            pair's drafter item and the line under the drafter choice say its verdict.
    """

    def __init__(
        self,
        parent: QWidget | None,
        catalog: Catalog,
        on_load_pair: Callable[[PairSpec], None],
        probes: dict | None = None,
    ):
        super().__init__(parent)
        self.probes = probes if probes is not None else {}
        self.setWindowTitle("Models")
        self.resize(960, 680)
        self.catalog = catalog
        self.on_load_pair = on_load_pair
        self.runner = DownloadRunner(self)
        self.runner.progress.connect(self._on_progress)
        self.runner.finished.connect(self._on_download_finished)
        self._downloading: list[str] = []
        self._focused = "targets"
        self._estimate = None
        self._build()
        self.refresh()

    # ---- layout -------------------------------------------------------------------------

    def _build(self) -> None:
        layout = QVBoxLayout(self)

        self.targets = self._tree(["Target", "Source", "Size", "DFlash", "Path"])
        self.targets.currentItemChanged.connect(lambda *_: self._on_target_selected())
        self.targets.itemClicked.connect(lambda *_: self._focus("targets"))
        box = QGroupBox("Targets")
        QVBoxLayout(box).addWidget(self.targets)
        layout.addWidget(box, 3)

        pick = QHBoxLayout()
        pick.addWidget(QLabel("Drafter:"))
        self.drafter_combo = QComboBox()
        self.drafter_combo.currentIndexChanged.connect(lambda *_: self._on_drafter_changed())
        pick.addWidget(self.drafter_combo, 1)
        self.load_button = QPushButton("Load pair")
        self.load_button.clicked.connect(self.load_selected)
        pick.addWidget(self.load_button)
        layout.addLayout(pick)
        # notes take no room while empty, so that room goes to the lists
        self.dflash_reason = WrapLabel(hide_empty=True)
        self.memory_label = WrapLabel(hide_empty=True)
        # the selected pair's drafter fit probe, when probed
        self.probe_label = WrapLabel(hide_empty=True)
        layout.addWidget(self.dflash_reason)
        layout.addWidget(self.probe_label)
        layout.addWidget(self.memory_label)

        self.drafters = self._tree(["Drafter", "Source", "Size", "Block", "Path", "Kind"])
        box = QGroupBox("DFlash and DFlash2 drafters")
        QVBoxLayout(box).addWidget(self.drafters)
        layout.addWidget(box, 2)

        self.known = self._tree(["Known pair", "Target repo", "Drafter repo", "Download",
                                 "Block", "Thinking", "Status"])
        box = QGroupBox("Known pairs (download from the Hugging Face hub)")
        QVBoxLayout(box).addWidget(self.known)
        layout.addWidget(box, 2)

        row = QHBoxLayout()
        self.add_button = QPushButton("Add folder…")
        self.add_button.clicked.connect(self._choose_folder)
        self.remove_folder_button = QPushButton("Remove folder")
        self.remove_folder_button.clicked.connect(self.remove_selected_folder)
        self.delete_button = QPushButton("Delete download…")
        self.delete_button.clicked.connect(self.delete_selected)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        for b in (self.add_button, self.remove_folder_button, self.delete_button,
                  self.refresh_button):
            row.addWidget(b)
        row.addStretch(1)
        layout.addLayout(row)

        row = QHBoxLayout()
        self.repo_edit = QLineEdit()
        self.repo_edit.setPlaceholderText("org/repo (or select a known pair)")
        row.addWidget(self.repo_edit, 1)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download_requested)
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.runner.cancel)
        row.addWidget(self.download_button)
        row.addWidget(self.cancel_button)
        layout.addLayout(row)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        # shown while a download runs (an idle "0%" bar read as a stalled download); its
        # room is kept, so the dialog does not jump when it appears
        keep = self.progress_bar.sizePolicy()
        keep.setRetainSizeWhenHidden(True)
        self.progress_bar.setSizePolicy(keep)
        self.progress_bar.hide()
        self.progress_label = QLabel()
        # what went wrong (a bad repo id, a failed load) right under the fields it is about,
        # not below the download's progress room at the far bottom
        self.status_label = WrapLabel(hide_empty=True)
        layout.addWidget(self.status_label)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.progress_label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

        self.known.currentItemChanged.connect(lambda *_: self._on_known_selected())
        self.drafters.itemClicked.connect(lambda *_: self._focus("drafters"))

    @staticmethod
    def _tree(headers: list[str]) -> QTreeWidget:
        tree = QTreeWidget()
        tree.setHeaderLabels(headers)
        tree.setRootIsDecorated(False)
        tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        tree.header().setStretchLastSection(True)
        return tree

    # ---- contents -----------------------------------------------------------------------

    def refresh(self) -> None:
        """Re-scan the catalog and refill the lists, keeping the selected target (or missing
        folder). An added folder that is not on disk gets a row after the targets, saying
        :data:`MISSING_TEXT`, from which Remove folder forgets it."""
        current = self.selected_target()
        gone = self._selected_missing_folder(focused_only=False)
        keep = current.key if current else str(gone) if gone is not None else None
        scan = self.catalog.refresh()
        self.targets.clear()
        for t in scan.targets:
            fits = self.catalog.drafters_for(t)
            dflash = ", ".join(d.name + self._probe_suffix(t, d) for d in fits) if fits \
                else "plain only"
            item = QTreeWidgetItem([t.name, SOURCE_LABELS[t.source], format_bytes(t.size_bytes),
                                    dflash, str(t.path)])
            item.setData(0, ROLE_ENTRY, t)
            self.targets.addTopLevelItem(item)
            if t.key == keep:
                self.targets.setCurrentItem(item)
        muted = self.palette().color(QPalette.ColorRole.PlaceholderText)
        for folder in self.catalog.missing_folders():
            item = QTreeWidgetItem([folder.name or str(folder), SOURCE_LABELS["folder"], "",
                                    MISSING_TEXT, str(folder)])
            item.setData(0, ROLE_MISSING, folder)
            tip = (f"{folder} is not on disk (deleted, or on a drive that is not connected). "
                   "Remove folder forgets it; Refresh lists its models again once it is "
                   "back.")
            for col in range(item.columnCount()):
                item.setToolTip(col, tip)
                item.setForeground(col, muted)
            self.targets.addTopLevelItem(item)
            if str(folder) == keep:
                self.targets.setCurrentItem(item)
        if self.targets.currentItem() is None and scan.targets:
            self.targets.setCurrentItem(self.targets.topLevelItem(0))
        self.drafters.clear()
        for d in scan.drafters:
            block = d.to_dict().get("block_size")
            item = QTreeWidgetItem([d.name, SOURCE_LABELS[d.source], format_bytes(d.size_bytes),
                                    "" if block is None else str(block), str(d.path),
                                    "DFlash2" if d.drafter_kind == Mode.DFLASH2 else "DFlash"])
            item.setData(0, ROLE_ENTRY, d)
            self.drafters.addTopLevelItem(item)
        cached = {e.repo_id.lower() for e in [*scan.targets, *scan.drafters] if e.repo_id}
        self.known.clear()
        for p in KNOWN_PAIRS:
            have_t = p.target_repo.lower() in cached
            have_d = p.drafter_repo.lower() in cached
            status = ("downloaded" if have_t and have_d else
                      "target only" if have_t else "drafter only" if have_d else "not downloaded")
            item = QTreeWidgetItem([p.label, p.target_repo, p.drafter_repo,
                                    f"~{p.download_gb:.1f} GB", str(p.block_size),
                                    "on" if p.thinking else "off", status])
            item.setData(0, ROLE_ENTRY, p)
            self.known.addTopLevelItem(item)
        fit_rows(self.known)
        fit_rows(self.targets, most=TARGET_ROWS)
        if self.catalog.folders_error:
            self.status_label.setText(self.catalog.folders_error)
        self._on_target_selected()

    def selected_target(self) -> ModelEntry | None:
        item = self.targets.currentItem()
        return item.data(0, ROLE_ENTRY) if item is not None else None

    def selected_drafter(self) -> ModelEntry | None:
        """The drafter chosen in the combo box (None: plain decoding); for a "DFlash and
        DFlash2" item, the DFlash one."""
        data = self.drafter_combo.currentData()
        return data[0] if isinstance(data, tuple) else data

    def selected_drafter2(self) -> ModelEntry | None:
        """The DFlash2 drafter loaded beside the DFlash one ("DFlash and DFlash2" item), else
        None."""
        data = self.drafter_combo.currentData()
        return data[1] if isinstance(data, tuple) else None

    def _on_target_selected(self) -> None:
        target = self.selected_target()
        self.drafter_combo.blockSignals(True)
        self.drafter_combo.clear()
        self.dflash_reason.clear()
        if target is not None:
            checks = self.catalog.pair_checks(target)
            fits = [c.drafter for c in checks if c.fits]
            v1 = [d for d in fits if d.drafter_kind != Mode.DFLASH2]
            v2 = [d for d in fits if d.drafter_kind == Mode.DFLASH2]
            if v1 and v2:  # both kinds: the mode switch offers plain / DFlash / DFlash2
                self.drafter_combo.addItem(
                    f"{v1[0].name} + {v2[0].name} (DFlash and DFlash2)", (v1[0], v2[0]))
            for d in fits:
                kind = "DFlash2" if d.drafter_kind == Mode.DFLASH2 else "DFlash"
                probe = self.probe_for(target, d)
                self.drafter_combo.addItem(
                    f"{d.name} ({kind})" + (f" · {probe.label()}" if probe else ""), d)
            self.drafter_combo.addItem("None: plain decoding", None)
            reason = self.catalog.dflash_unavailable_reason(target)
            refused = [f"{c.drafter.name}: {c.reason}" for c in checks if not c.fits]
            if reason:
                self.dflash_reason.setText(f"DFlash is off: {reason}")
            elif refused:
                self.dflash_reason.setText("Not offered: " + "; ".join(refused))
            pair = known_pair_for(target.repo_id)
            if pair is not None:
                think = "on" if pair.thinking else "off"
                self.dflash_reason.setText(
                    (self.dflash_reason.text() + "\n").lstrip()
                    + f"Recommended: block size {pair.block_size}, thinking {think}."
                )
            self.drafter_combo.setCurrentIndex(0)
        elif (gone := self._selected_missing_folder(focused_only=False)) is not None:
            self.dflash_reason.setText(
                f"{MISSING_TEXT.capitalize()}: {gone} (deleted, or on a drive that is not "
                "connected). Remove folder forgets it; its files, if any, are not touched.")
        self.drafter_combo.blockSignals(False)
        self._on_drafter_changed()
        self._update_buttons()

    def probe_for(self, target: ModelEntry | None, drafter: ModelEntry | None):
        """The fit probe of ``target`` with ``drafter`` (a
        :class:`~app.chat.drafter_probe.DrafterProbe`), or None when that pair was not
        probed (not loaded since the app started)."""
        if target is None or drafter is None:
            return None
        from app.chat.drafter_probe import pair_key

        return self.probes.get(pair_key(target.path, drafter.path))

    def _probe_suffix(self, target: ModelEntry, drafter: ModelEntry) -> str:
        """`` (drafter fit: 100% accepted on a probe)`` after a probed drafter's name in the
        targets list ("" when not probed)."""
        probe = self.probe_for(target, drafter)
        return f" ({probe.label()})" if probe is not None else ""

    def _on_drafter_changed(self) -> None:
        self._update_estimate()
        target = self.selected_target()
        lines = []
        for d in (self.selected_drafter(), self.selected_drafter2()):
            probe = self.probe_for(target, d)
            if probe is not None:
                lines.append(f"{d.name}: {probe.label()} ({probe.tau or 0:.1f} tokens per "
                             f"cycle over {probe.cycles} cycles, when it was loaded).")
        self.probe_label.setText("\n".join(lines))
        unfit = any(self.probe_for(target, d) is not None
                    and self.probe_for(target, d).verdict == "unfit"
                    for d in (self.selected_drafter(), self.selected_drafter2()))
        self.probe_label.setStyleSheet("color: #b00020;" if unfit else "")

    def dflash_available(self) -> bool:
        """True when the combo offers at least one drafter for the selected target."""
        return any(self.drafter_combo.itemData(i) is not None
                   for i in range(self.drafter_combo.count()))

    def _update_estimate(self) -> None:
        target = self.selected_target()
        if target is None:
            self.memory_label.setText("No target selected.")
            return
        d2 = self.selected_drafter2()
        est = estimate_memory(target, self.selected_drafter(),
                              **({"drafter2": d2} if d2 is not None else {}))
        self.memory_label.setText(("Warning: " if est.warn else "Memory: ") + est.message())
        self.memory_label.setStyleSheet("color: #b00020;" if est.warn else "")
        self._estimate = est

    def _update_buttons(self) -> None:
        busy = self.runner.is_running()
        self.load_button.setEnabled(self.selected_target() is not None)
        entry = self._delete_candidate()
        self.delete_button.setEnabled(entry is not None and not busy)
        self.remove_folder_button.setEnabled(self._folder_of_selection() is not None)
        self.download_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)

    def _on_known_selected(self) -> None:
        item = self.known.currentItem()
        if item is not None:
            pair: KnownPair = item.data(0, ROLE_ENTRY)
            self.repo_edit.setText(f"{pair.target_repo} + {pair.drafter_repo}")

    # ---- actions ------------------------------------------------------------------------

    def load_selected(self) -> bool:
        """Call ``on_load_pair`` for the selected target and drafter, then close the dialog;
        True when called. Above 75% of the machine's memory the user is asked first."""
        target = self.selected_target()
        if target is None:
            return False
        drafter, drafter2 = self.selected_drafter(), self.selected_drafter2()
        est = estimate_memory(target, drafter,
                              **({"drafter2": drafter2} if drafter2 is not None else {}))
        if est.warn:
            answer = QMessageBox.question(
                self, "Load anyway?", f"{target.name} {est.message()}.\n\nLoad anyway?"
            )
            if answer != QMessageBox.StandardButton.Yes:
                return False
        self.on_load_pair(PairSpec(str(target.path), str(drafter.path) if drafter else None,
                                   display_name=target.name, repo_id=target.repo_id,
                                   drafter2=str(drafter2.path) if drafter2 else None))
        self.accept()
        return True

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a model folder")
        if folder:
            self.add_folder(folder)

    def add_folder(self, folder: str | Path) -> bool:
        """Add a model folder to the catalog; errors go to a message box. True on success."""
        try:
            found = self.catalog.add_folder(folder)
        except EngineError as exc:
            QMessageBox.warning(self, "Add folder", str(exc))
            return False
        self.status_label.setText(f"Added {folder}: {', '.join(e.name for e in found)}")
        self.refresh()
        return True

    def _focus(self, which: str) -> None:
        self._focused = which
        self._update_buttons()

    def select_target(self, name: str) -> bool:
        """Select the target row whose name, repo id or path is ``name``."""
        for i in range(self.targets.topLevelItemCount()):
            item = self.targets.topLevelItem(i)
            entry = item.data(0, ROLE_ENTRY)
            if entry is not None and name in (entry.name, entry.repo_id, str(entry.path)):
                self.targets.setCurrentItem(item)
                self._focus("targets")
                return True
        return False

    def _selected_entry(self) -> ModelEntry | None:
        if self._focused == "drafters" and self.drafters.currentItem() is not None:
            return self.drafters.currentItem().data(0, ROLE_ENTRY)
        return self.selected_target()

    def _delete_candidate(self) -> ModelEntry | None:
        entry = self._selected_entry()
        return entry if entry is not None and entry.source == "cache" else None

    def _selected_missing_folder(self, focused_only: bool = True) -> Path | None:
        """The added folder not on disk whose targets row is selected (with ``focused_only``,
        only while the targets list, not the drafters list, is the one acted on), else
        None."""
        if focused_only and self._focused == "drafters" and self.drafters.currentItem():
            return None
        item = self.targets.currentItem()
        return item.data(0, ROLE_MISSING) if item is not None else None

    def _folder_of_selection(self) -> Path | None:
        """The added folder that holds the selected model, whatever source its row names
        (the scan lists a model found twice once, from its first source), or the selected
        missing folder's; None when no added folder holds it."""
        gone = self._selected_missing_folder()
        if gone is not None:
            return gone
        entry = self._selected_entry()
        if entry is None:
            return None
        folders = self.catalog.folders_holding(entry)
        return folders[0] if folders else None

    def remove_selected_folder(self) -> None:
        """Forget the folder of the selected entry (its files stay on disk)."""
        folder = self._folder_of_selection()
        if folder is not None and self.catalog.remove_folder(folder):
            self.status_label.setText(f"Removed {folder} from the list (files kept).")
            self.refresh()

    def delete_selected(self, entry: ModelEntry | None = None) -> bool:
        """Delete a downloaded (cache) model after confirming with its size on disk."""
        entry = entry if isinstance(entry, ModelEntry) else self._delete_candidate()
        if entry is None or entry.repo_id is None:
            return False
        size = dl.cached_size(entry.repo_id) or entry.size_bytes
        answer = QMessageBox.question(
            self,
            "Delete download",
            f"Delete {entry.repo_id} from the Hugging Face cache?\n"
            f"This frees {format_bytes(size)} on disk.",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return False
        try:
            freed = dl.delete_cached_repo(entry.repo_id)
        except EngineError as exc:
            QMessageBox.warning(self, "Delete download", str(exc))
            return False
        self.status_label.setText(f"Deleted {entry.repo_id}: freed {format_bytes(freed)}.")
        self.refresh()
        return True

    def download_requested(self) -> None:
        """Download what the repo field names: ``org/repo`` or ``target + drafter``."""
        text = self.repo_edit.text().strip()
        repos = [r.strip() for r in text.split("+") if r.strip()]
        if not repos or any(r.count("/") != 1 for r in repos):
            self.status_label.setText("Type a repo id like org/name, or select a known pair.")
            return
        self.start_download(repos)

    def start_download(self, repo_ids: list[str]) -> None:
        """Start downloading ``repo_ids`` in order on the download thread."""
        self._downloading = list(repo_ids)
        self.progress_bar.setValue(0)
        self.progress_bar.show()
        self.progress_label.setText(f"Contacting the hub for {repo_ids[0]}…")
        self.status_label.clear()
        self.runner.start(repo_ids)
        self._update_buttons()

    def _on_progress(self, repo_id: str, p: dl.DownloadProgress) -> None:
        frac = p.fraction
        if frac is None:
            self.progress_bar.setRange(0, 0)
        else:
            self.progress_bar.setRange(0, 1000)
            self.progress_bar.setValue(int(frac * 1000))
        index = self._downloading.index(repo_id) + 1 if repo_id in self._downloading else 1
        prefix = f"{repo_id} ({index}/{len(self._downloading)}): " if len(
            self._downloading) > 1 else f"{repo_id}: "
        self.progress_label.setText(prefix + progress_text(p))

    def _on_download_finished(self, paths, error) -> None:
        self.runner.wait(5)
        self.progress_bar.setRange(0, 1000)
        if error is None:
            self.progress_bar.setValue(1000)
            self.status_label.setText(f"Downloaded {', '.join(self._downloading)}.")
        else:
            self.progress_bar.setValue(0)
            self.progress_bar.hide()
            if isinstance(error, dl.DownloadCancelled):
                self.status_label.setText(
                    "Download cancelled; files already fetched are kept for the next try."
                )
            else:
                self.status_label.setText(f"Download failed: {error}")
        self.progress_label.clear()
        self.refresh()
        self._update_buttons()

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt name)
        if self.runner.is_running():
            self.runner.cancel()
            self.runner.wait(10)
        super().closeEvent(event)

    def reject(self) -> None:
        if self.runner.is_running():
            self.runner.cancel()
            self.runner.wait(10)
        super().reject()
