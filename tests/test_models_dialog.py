"""The Models dialog, offscreen: lists, pairing, load callback, folders, download, delete."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QDialog, QMessageBox  # noqa: E402
from test_download import COMMIT, REPO, FakeHub, _repo_files  # noqa: E402

from app.models.catalog import KNOWN_PAIRS, Catalog  # noqa: E402
from app.models.tiny import drafter_config, target_config  # noqa: E402
from app.ui.models_dialog import ModelsDialog, format_duration, progress_text  # noqa: E402


def _write_model(folder, config: dict, nbytes: int = 64):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * nbytes)
    return folder


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Empty HF cache, a bundled pair that fits, and a user folder whose drafter does not."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    t = target_config("qwen3_5", vocab_size=300, eos_id=299)
    d = drafter_config(t, mask_id=298, block_size=8, taps=[1, 3], sliding=False)
    demo_t = _write_model(tmp_path / "res" / "demo-target", t)
    demo_d = _write_model(tmp_path / "res" / "demo-dflash", d)
    other = tmp_path / "other"
    _write_model(other / "big-target", {**t, "vocab_size": 1000})
    _write_model(other / "wrong-dflash", {**d, "vocab_size": 1000, "num_target_layers": 9})
    catalog = Catalog(data_dir=tmp_path / "data", bundled=(demo_t, demo_d))
    return catalog, demo_t, demo_d, other


@pytest.fixture
def loads():
    return []


loaded_specs: list = []


@pytest.fixture
def dialog(qtbot, env, loads):
    loaded_specs.clear()
    catalog = env[0]
    dlg = ModelsDialog(None, catalog, lambda spec: (loads.append((spec.target, spec.drafter)),
                                                    loaded_specs.append(spec)))
    qtbot.addWidget(dlg)
    return dlg


def test_lists_bundled_pair_and_loads_it(dialog, env, loads):
    _, demo_t, demo_d, _ = env
    assert dialog.targets.topLevelItemCount() == 1
    row = dialog.targets.topLevelItem(0)
    assert [row.text(i) for i in (0, 1, 3, 4)] == ["demo-target", "bundled", "demo-dflash",
                                                    str(demo_t)]
    size = sum(f.stat().st_size for f in demo_t.iterdir())
    assert row.text(2) == f"{size} B"
    assert dialog.drafters.topLevelItemCount() == 1
    assert dialog.known.topLevelItemCount() == len(KNOWN_PAIRS)
    assert dialog.known.topLevelItem(0).text(6) == "not downloaded"
    assert dialog.dflash_available()
    assert dialog.selected_drafter().name == "demo-dflash"
    assert "Memory:" in dialog.memory_label.text()
    dialog.show()
    dialog.load_button.click()
    assert loads == [(str(demo_t), str(demo_d))]
    assert loaded_specs[0].display_name == "demo-target" and loaded_specs[0].repo_id is None
    assert dialog.result() == QDialog.DialogCode.Accepted and not dialog.isVisible()
    # plain decoding is always offered
    dialog.drafter_combo.setCurrentIndex(dialog.drafter_combo.count() - 1)
    assert dialog.selected_drafter() is None
    dialog.load_button.click()
    assert loads[-1] == (str(demo_t), None)


def test_added_folder_with_mismatched_drafter_disables_dflash_with_reason(dialog, env, loads):
    _, _, _, other = env
    assert dialog.add_folder(other)
    assert dialog.targets.topLevelItemCount() == 2
    assert dialog.select_target("big-target")
    assert not dialog.dflash_available()
    assert dialog.drafter_combo.count() == 1 and dialog.selected_drafter() is None
    reason = dialog.dflash_reason.text()
    assert reason.startswith("DFlash is off") and "num_target_layers" in reason
    assert dialog.targets.currentItem().text(3) == "plain only"
    dialog.load_button.click()
    assert loads == [(str(other / "big-target"), None)]
    # the bundled target does not offer the wrong drafter and says why
    assert dialog.select_target("demo-target")
    assert [dialog.drafter_combo.itemText(i) for i in range(dialog.drafter_combo.count())] == [
        "demo-dflash (DFlash)", "None: plain decoding"]
    assert "wrong-dflash: " in dialog.dflash_reason.text()
    assert "vocab_size" in dialog.dflash_reason.text()
    # Remove folder forgets it
    assert dialog.select_target("big-target")
    dialog.remove_folder_button.click()
    assert dialog.targets.topLevelItemCount() == 1


def test_a_folder_whose_models_are_listed_from_another_source_can_be_removed(
        dialog, env, tmp_path):
    """A new user's pass: a folder added with Add folder… whose model was already listed from
    another source (here the bundled pair, which comes first and keeps its "bundled" row)
    could not be removed again: Remove folder stayed off on that row. It is on for a row that
    an added folder holds, whatever source the row names, also through a link."""
    catalog, demo_t, demo_d, _ = env
    assert dialog.add_folder(demo_t.parent)  # the folder that holds the bundled pair
    assert catalog.folders() == [demo_t.parent.resolve()]
    assert dialog.targets.topLevelItemCount() == 1
    assert dialog.select_target("demo-target")
    assert dialog.targets.currentItem().text(1) == "bundled"
    assert dialog.remove_folder_button.isEnabled()
    dialog.remove_folder_button.click()
    assert catalog.folders() == []
    assert "Removed" in dialog.status_label.text()
    assert dialog.targets.topLevelItemCount() == 1  # still listed, as bundled
    assert not dialog.remove_folder_button.isEnabled()
    # a folder whose model is a link to the bundled one
    links = tmp_path / "links"
    links.mkdir()
    (links / "my-drafter").symlink_to(demo_d, target_is_directory=True)
    assert dialog.add_folder(links)
    assert dialog.drafters.topLevelItemCount() == 1
    row = dialog.drafters.topLevelItem(0)
    dialog.drafters.setCurrentItem(row)
    dialog.drafters.itemClicked.emit(row, 0)  # a click on the row
    assert dialog.drafters.currentItem().text(1) == "bundled"
    assert dialog.remove_folder_button.isEnabled()
    dialog.remove_folder_button.click()
    assert catalog.folders() == []


def test_an_added_folder_no_longer_on_disk_has_a_row_that_removes_it(dialog, env, tmp_path):
    """A new user's pass: a folder added with Add folder… on a drive that was later unplugged
    (or deleted) had no row in the Models window, so only ``models --remove-folder`` could
    forget it. It now has a row in the targets list saying "folder not found", that loads
    nothing and whose Remove folder forgets that folder alone: the other folders, their
    order in the file and the selected target stay as they were."""
    import shutil

    catalog, demo_t, demo_d, other = env
    drive = tmp_path / "drive"
    usb = drive / "models"
    shutil.copytree(demo_t, usb / "usb-target")
    later = tmp_path / "later"
    shutil.copytree(demo_d, later / "later-dflash")
    for folder in (other, usb, later):
        assert dialog.add_folder(folder)
    assert dialog.select_target("big-target")
    listed = [dialog.targets.topLevelItem(i).text(0)
              for i in range(dialog.targets.topLevelItemCount())]
    assert "usb-target" in listed
    drive.rename(tmp_path / "unplugged")  # the drive is gone
    dialog.refresh()
    rows = [dialog.targets.topLevelItem(i) for i in range(dialog.targets.topLevelItemCount())]
    missing = [r for r in rows if r.text(4) == str(usb.resolve())]
    assert len(missing) == 1, [r.text(4) for r in rows]
    row = missing[0]
    assert row.text(0) == "models" and "folder not found" in row.text(3)
    targets = [r.text(0) for r in rows if r is not row]
    assert targets == [n for n in listed if n != "usb-target"]
    assert rows.index(row) == len(rows) - 1  # after the models
    assert dialog.selected_target().name == "big-target"  # the selection stays
    def drafters():
        return [dialog.drafters.topLevelItem(i).text(4)
                for i in range(dialog.drafters.topLevelItemCount())]

    kept_drafters = drafters()
    assert str(later / "later-dflash") in kept_drafters
    # selecting it: nothing to load or delete, Remove folder is on and says which
    dialog.targets.setCurrentItem(row)
    dialog.targets.itemClicked.emit(row, 0)
    assert dialog.selected_target() is None
    assert not dialog.load_button.isEnabled() and not dialog.delete_button.isEnabled()
    assert not dialog.load_selected()
    assert "not found" in dialog.dflash_reason.text()
    assert dialog.remove_folder_button.isEnabled()
    dialog.remove_folder_button.click()
    assert catalog.folders() == [other.resolve(), later.resolve()]
    assert json.loads(catalog.folders_file.read_text()) == {
        "folders": [str(other.resolve()), str(later.resolve())]}
    assert not catalog.folders_file.with_suffix(".json.bad").exists()
    assert f"Removed {usb.resolve()}" in dialog.status_label.text()
    rows = [dialog.targets.topLevelItem(i) for i in range(dialog.targets.topLevelItemCount())]
    assert [r.text(0) for r in rows] == targets
    assert drafters() == kept_drafters
    assert dialog.selected_target() is not None
    # the drive comes back: its folder stays forgotten
    (tmp_path / "unplugged").rename(drive)
    dialog.refresh()
    assert not dialog.select_target("usb-target")
    assert catalog.folders() == [other.resolve(), later.resolve()]


def test_add_folder_error_is_shown_not_raised(dialog, tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *a: shown.append(a[2]))
    assert not dialog.add_folder(tmp_path / "missing")
    assert shown and "not a folder" in shown[0]


def test_memory_warning_asks_before_loading(dialog, loads, monkeypatch):
    import app.ui.models_dialog as md
    from app.models import catalog as cat

    real = cat.estimate_memory
    monkeypatch.setattr(md, "estimate_memory",
                        lambda t, d=None: real(t, d, machine_bytes=100))
    asked = []
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *a: asked.append(a[2]) or QMessageBox.StandardButton.No)
    assert dialog.load_selected() is False
    assert loads == [] and "above 75%" in asked[0]
    monkeypatch.setattr(QMessageBox, "question", lambda *a: QMessageBox.StandardButton.Yes)
    assert dialog.load_selected() is True and len(loads) == 1


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    server = FakeHub(_repo_files(), slow_file="model-00002-of-00002.safetensors")
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    yield server
    server.close()


def test_download_progress_then_delete(dialog, hub, qtbot, tmp_path, monkeypatch):
    labels = []
    dialog.runner.progress.connect(lambda r, p: labels.append(progress_text(p)))
    dialog.repo_edit.setText(REPO)
    assert not dialog.progress_bar.isVisibleTo(dialog)  # no idle "0%" bar
    with qtbot.waitSignal(dialog.runner.finished, timeout=30000):
        dialog.download_button.click()
        assert dialog.cancel_button.isEnabled() and not dialog.download_button.isEnabled()
        assert dialog.progress_bar.isVisibleTo(dialog)
    qtbot.waitUntil(lambda: dialog.download_button.isEnabled(), timeout=5000)
    assert dialog.status_label.text() == f"Downloaded {REPO}."
    assert dialog.progress_bar.value() == 1000
    assert any(" of " in t and "/s" in t and "left" in t for t in labels)
    assert dialog.select_target(REPO)
    entry = dialog.selected_target()
    assert entry.source == "cache" and entry.revision == COMMIT
    assert dialog.targets.currentItem().text(1) == "HF cache"

    asked = []
    monkeypatch.setattr(QMessageBox, "question",
                        lambda *a: asked.append(a[2]) or QMessageBox.StandardButton.Yes)
    assert dialog.delete_button.isEnabled()
    dialog.delete_button.click()
    size = sum(len(d) for n, d in hub.files.items() if n != "README.md")
    assert "This frees" in asked[0] and f"{size / 1e6:.1f} MB" in asked[0]
    assert not dialog.select_target(REPO)
    assert "Deleted" in dialog.status_label.text()


def test_cancel_download_registers_nothing(dialog, hub, qtbot):
    hub.delay_s = 0.05  # the big file takes ~1 s: time to press Cancel in the middle
    dialog.repo_edit.setText(REPO)
    with qtbot.waitSignal(dialog.runner.finished, timeout=30000) as blocker:
        dialog.download_button.click()
        qtbot.waitUntil(lambda: 300 < dialog.progress_bar.value() < 900, timeout=10000)
        assert "left" in dialog.progress_label.text()
        dialog.cancel_button.click()
    qtbot.waitUntil(lambda: dialog.download_button.isEnabled(), timeout=5000)
    assert blocker.args[0] is None
    assert "cancelled" in dialog.status_label.text()
    assert not dialog.select_target(REPO)
    assert hub.gets["model-00002-of-00002.safetensors"] == 1


def test_unreachable_hub_message(dialog, qtbot, monkeypatch):
    import socket

    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    dialog.repo_edit.setText(REPO)
    with qtbot.waitSignal(dialog.runner.finished, timeout=30000):
        dialog.download_button.click()
    qtbot.waitUntil(lambda: dialog.download_button.isEnabled(), timeout=5000)
    assert dialog.status_label.text().startswith("Download failed: cannot reach")


def test_known_pair_selection_fills_both_repos(dialog):
    dialog.known.setCurrentItem(dialog.known.topLevelItem(0))
    p = KNOWN_PAIRS[0]
    assert dialog.repo_edit.text() == f"{p.target_repo} + {p.drafter_repo}"


def test_formatting():
    assert format_duration(95) == "1 min 35 s"
    assert format_duration(7300) == "2 h 1 min"
    assert format_duration(None) == "?"


def test_the_known_pairs_show_whole_and_a_status_sits_under_the_fields(dialog, qtbot):
    """A new user's pass: "Known pairs" showed 3 of its 7 rows and a scroll bar while empty
    room sat above Close, and a bad repo id's message appeared at the far bottom. All rows
    now fit, and the status line comes right after the download row."""
    from app.models.catalog import KNOWN_PAIRS

    dialog.show()
    qtbot.waitExposed(dialog)
    known = dialog.known
    assert known.topLevelItemCount() == len(KNOWN_PAIRS) > 3
    last = known.visualItemRect(known.topLevelItem(known.topLevelItemCount() - 1))
    assert known.viewport().rect().contains(last), (last, known.viewport().rect())
    assert known.verticalScrollBar().maximum() == 0
    layout = dialog.layout()
    order = [layout.itemAt(i).widget() for i in range(layout.count())]
    assert order.index(dialog.status_label) < order.index(dialog.progress_bar)


def test_targets_show_whole_at_the_smallest_size_and_empty_notes_take_no_room(
        dialog, env, qtbot, tmp_path):
    """With five targets and the dialog at its smallest, the targets list showed three and a
    half rows beside empty note lines: every target row now fits (up to ``TARGET_ROWS``), and
    a note with no text is hidden."""
    from app.ui.models_dialog import TARGET_ROWS

    catalog, demo_t = env[0], env[1]
    folder = tmp_path / "more"
    for name in ("alpha", "beta", "gamma", "delta"):
        _write_model(folder / name, json.loads((demo_t / "config.json").read_text()))
    catalog.add_folder(folder)
    dialog.refresh()
    dialog.show()
    dialog.resize(dialog.minimumSizeHint())
    qtbot.waitExposed(dialog)
    targets = dialog.targets
    assert 5 <= targets.topLevelItemCount() <= TARGET_ROWS
    last = targets.visualItemRect(targets.topLevelItem(targets.topLevelItemCount() - 1))
    assert targets.viewport().rect().contains(last), (last, targets.viewport().rect())
    assert targets.verticalScrollBar().maximum() == 0
    assert dialog.probe_label.text() == "" and not dialog.probe_label.isVisible()
    dialog.status_label.setText("Added a folder")
    assert dialog.status_label.isVisible()
