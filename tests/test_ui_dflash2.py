"""DFlash2 in the window (issue 22): the composer's mode switch offers DFlash2 only when the
loaded pair has a DFlash2 drafter, the Models window offers a DFlash drafter and a DFlash2
drafter together, and a real tiny pair gives the same greedy tokens in all three modes."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from test_dflash2 import dflash2_config, write_checkpoint  # noqa: E402
from test_models_dialog import _write_model  # noqa: E402
from test_ui_window import PROMPT, close_window, make_window, send_and_wait  # noqa: E402

from app.chat.session import ChatSession, ModelInfo, PairSpec  # noqa: E402
from app.models.catalog import Catalog, drafter_kind  # noqa: E402
from app.models.tiny import drafter_config, target_config  # noqa: E402
from app.ui.chat import Composer  # noqa: E402
from app.ui.models_dialog import ModelsDialog  # noqa: E402


def test_model_info_modes():
    assert ModelInfo("t", "t").modes == ("plain", "lookup")  # lookup needs no drafter
    assert ModelInfo("t", "t", drafter_name="d", drafter_kind="dflash").modes == \
        ("plain", "dflash", "lookup")
    assert ModelInfo("t", "t", drafter_name="d", drafter_kind="dflash",
                     drafter2_name="d2").modes == ("plain", "dflash", "dflash2", "lookup")
    assert ModelInfo("t", "t", drafter_name="d2", drafter_kind="dflash2").modes == \
        ("plain", "dflash2", "lookup")


def test_composer_offers_lookup_without_a_drafter(qtbot):
    c = Composer()
    qtbot.addWidget(c)
    c.show()
    seen = []
    c.modeChanged.connect(seen.append)
    c.set_modes(("plain", "lookup"))  # a target alone: plain and lookup
    assert c.mode() == "plain" and c.lookup_btn.isEnabled() and not c.dflash_btn.isEnabled()
    c.lookup_btn.click()
    assert c.mode() == "lookup" and seen[-1] == "lookup"
    assert not c.compare_btn.isEnabled()  # Compare runs drafter modes only
    c.set_modes(("plain", "lookup"))  # offered again (a reload): Lookup is kept
    assert c.mode() == "lookup"
    c.set_modes(("plain", "dflash", "lookup"))
    assert c.mode() == "lookup"  # still offered: kept
    c.set_mode("plain")
    c.set_mode("lookup")
    assert c.lookup_btn.isChecked()
    c.set_modes(("plain",))
    assert c.mode() == "plain" and not c.lookup_btn.isEnabled()


def test_composer_offers_dflash2_only_when_the_pair_has_it(qtbot):
    c = Composer()
    qtbot.addWidget(c)
    c.show()
    assert not c.dflash2_btn.isVisible() and c.mode() == "dflash"
    seen = []
    c.modeChanged.connect(seen.append)
    c.set_modes(("plain", "dflash", "dflash2"))
    assert c.dflash2_btn.isVisible() and c.dflash2_btn.isEnabled()
    assert c.dflash_btn.objectName() == "segMid" and c.mode() == "dflash"
    c.dflash2_btn.click()
    assert c.mode() == "dflash2" and seen[-1] == "dflash2"
    assert c.compare_btn.isEnabled()
    c.set_modes(("plain", "dflash"))  # a pair without DFlash2: back to DFlash
    assert not c.dflash2_btn.isVisible() and c.mode() == "dflash"
    assert c.dflash_btn.objectName() == "segMid"  # Lookup is the right segment
    assert c.lookup_btn.objectName() == "segRight"
    c.set_modes(("plain", "dflash2"))  # only a DFlash2 drafter
    assert c.mode() == "dflash2" and not c.dflash_btn.isEnabled()
    c.set_modes(("plain",))
    assert c.mode() == "plain" and not c.dflash2_btn.isVisible()
    assert not c.compare_btn.isEnabled()
    c.set_mode("dflash2")  # a stored value before a pair is loaded is kept until set_modes
    c.set_modes(("plain", "dflash", "dflash2"))
    assert c.mode() == "dflash2"


@pytest.fixture
def catalog3(tmp_path, monkeypatch):
    """A bundled target, DFlash drafter and DFlash2 drafter (config-only weights)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    t = target_config("qwen3_5", vocab_size=300, eos_id=299)
    d = drafter_config(t, mask_id=298, block_size=8, taps=[1, 3], sliding=False)
    d2 = {**d, "architectures": ["DFlash2DraftModel"], "dflash_backbone": "../demo-dflash"}
    res = tmp_path / "res"
    dirs = (_write_model(res / "demo-target", t), _write_model(res / "demo-dflash", d, 100),
            _write_model(res / "demo-dflash2", d2, 10))
    return Catalog(data_dir=tmp_path / "data", bundled=dirs), dirs


def test_catalog_lists_a_dflash2_drafter_as_supported(catalog3, tmp_path):
    catalog, (t, d, d2) = catalog3
    scan = catalog.scan()
    assert [e.name for e in scan.drafters] == ["demo-dflash", "demo-dflash2"]
    assert [e.drafter_kind for e in scan.drafters] == ["dflash", "dflash2"]
    assert scan.drafters[1].to_dict()["drafter_kind"] == "dflash2"
    assert not scan.skipped
    assert [x.name for x in catalog.drafters_for(scan.targets[0])] == \
        ["demo-dflash", "demo-dflash2"]
    assert drafter_kind({"architectures": ["DFlash3DraftModel"]}) is None
    # an adapter whose backbone folder is gone is skipped, saying why
    cfg = json.loads((d2 / "config.json").read_text())
    _write_model(tmp_path / "loose" / "lost-dflash2", {**cfg, "dflash_backbone": "../gone"})
    scan = Catalog(data_dir=tmp_path / "d2", bundled=(t, tmp_path / "loose" / "lost-dflash2"))\
        .scan()
    assert scan.drafters == []
    assert "backbone folder" in scan.skipped[0][1] and "gone" in scan.skipped[0][1]


def test_memory_estimate_counts_the_adapters_backbone(catalog3):
    from app.models.catalog import drafter_weights_size, estimate_memory

    catalog, _ = catalog3
    scan = catalog.scan()
    t, (d, d2) = scan.targets[0], scan.drafters
    assert drafter_weights_size(d) == 100 and drafter_weights_size(d2) == 110
    one = estimate_memory(t, d, machine_bytes=10**12)
    both = estimate_memory(t, d, machine_bytes=10**12, drafter2=d2)
    assert both.drafter_bytes - one.drafter_bytes >= 110


def test_models_window_offers_dflash_and_dflash2_together(qtbot, catalog3):
    catalog, (t, d, d2) = catalog3
    specs = []
    dlg = ModelsDialog(None, catalog, specs.append)
    qtbot.addWidget(dlg)
    combo = dlg.drafter_combo
    labels = [combo.itemText(i) for i in range(combo.count())]
    assert labels == ["demo-dflash + demo-dflash2 (DFlash and DFlash2)",
                      "demo-dflash (DFlash)", "demo-dflash2 (DFlash2)", "None: plain decoding"]
    assert dlg.selected_drafter().name == "demo-dflash"
    assert dlg.selected_drafter2().name == "demo-dflash2"
    kinds = [dlg.drafters.topLevelItem(i).text(5) for i in range(2)]
    assert kinds == ["DFlash", "DFlash2"]
    assert dlg.load_selected()
    assert (specs[0].target, specs[0].drafter, specs[0].drafter2) == (str(t), str(d), str(d2))
    combo.setCurrentIndex(2)
    assert dlg.selected_drafter().name == "demo-dflash2" and dlg.selected_drafter2() is None


# --- a real tiny pair with both drafters ----------------------------------------------------


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory):
    from app.models.tiny import build_tiny_pair

    root = tmp_path_factory.mktemp("ui_tiny3")
    t, d = build_tiny_pair(root, "qwen3_5", seed=0, block_size=8)
    mask = json.loads((d / "config.json").read_text())["dflash_config"]["mask_token_id"]
    d2 = write_checkpoint(root / "d2", dflash2_config(t, mask, block_size=8), seed=2)
    return t, d, d2


def test_window_runs_plain_dflash_and_dflash2_with_the_same_tokens(qtbot, qs, tiny3):
    t, d, d2 = tiny3
    win = make_window(qtbot, qs, ChatSession())
    try:
        with qtbot.waitSignal(win.modelLoaded, timeout=60_000) as blocker:
            win.load_model(PairSpec(str(t), str(d), drafter2=str(d2)))
        info = blocker.args[0]
        assert info.modes == ("plain", "dflash", "dflash2", "lookup")
        assert info.drafter2_path == str(d2) and info.drafter_kind == "dflash"
        assert win.composer.dflash2_btn.isVisible()
        assert win.qs.value("model/drafter2") == str(d2)
        assert f"DFlash2 drafter: {info.drafter2_name}" in win.model_label.text()
        runs = {}
        for mode in ("dflash2", "plain", "dflash", "dflash2"):
            win.new_chat()
            runs.setdefault(mode, []).append(
                send_and_wait(qtbot, win, PROMPT, mode=mode).version.result)
        plain = runs["plain"][0]
        assert len(plain.tokens) > 0
        for mode, results in runs.items():
            for r in results:
                assert r.tokens == plain.tokens, mode
                assert r.mode == mode
        assert runs["dflash2"][0].summary.cycles > 0
        assert win.live.mode == "dflash2"  # the live panel shows DFlash2's figures, not plain's
        assert win.composer.note.text().startswith("Next reply: block")
        # a second turn in the same chat after switching drafters stays exact
        second = send_and_wait(qtbot, win, "And of Italy?", mode="dflash").version.result
        win.new_chat()
        send_and_wait(qtbot, win, PROMPT, mode="plain")
        again = send_and_wait(qtbot, win, "And of Italy?", mode="plain").version.result
        assert second.tokens == again.tokens
        win.composer.set_mode("dflash2")
    finally:
        close_window(win)
    assert qs.value("composer/mode") == "dflash2"


def test_compare_runs_plain_dflash_and_dflash2_with_the_same_tokens(qtbot, qs, tiny3):
    t, d, d2 = tiny3
    session = ChatSession()
    win = make_window(qtbot, qs, session)
    try:
        with qtbot.waitSignal(win.modelLoaded, timeout=60_000):
            win.load_model(PairSpec(str(t), str(d), drafter2=str(d2)))
        assert "DFlash2" in win.composer.compare_btn.toolTip()
        assert win.compare_action.text() == "Compare plain, DFlash and DFlash2"
        assert win.composer.compare_btn.accessibleName() == win.compare_action.text()
        msg = send_and_wait(qtbot, win, PROMPT, compare=True)
        assert msg.is_compare and msg.chosen == "dflash"
        assert set(msg.versions) == {"plain", "dflash", "dflash2"}
        results = {k: v.result for k, v in msg.versions.items()}
        assert {k: r.mode for k, r in results.items()} == {k: k for k in results}
        assert len(results["plain"].tokens) > 0
        for key in ("dflash", "dflash2"):  # greedy: every side identical to plain
            assert results[key].tokens == results["plain"].tokens, key
            assert results[key].summary.cycles > 0
        view = win.compare_view
        assert view.isVisible() and list(view.results) == ["plain", "dflash", "dflash2"]
        lines = view.header.text().split("\n")
        assert lines[0].startswith("DFlash: identical")
        assert lines[1].startswith("DFlash2: identical")
        assert "τ" in view.figs["dflash2"].text()
        # the live panel shows the figures of the side the chat continues from
        assert win.live.mode == "dflash" and win.live._stats is not None
        assert win.live._stats.summary.generated_tokens == len(results["dflash"].tokens)
        # stored: three sibling versions of one Compare turn, modes plain / dflash / dflash2
        rows = [win.store.db.get_message(i) for i in msg.ids.values()]
        assert sorted(r.mode for r in rows) == ["dflash", "dflash2", "plain"]
        assert len({r.compare_group for r in rows}) == 1 and rows[0].compare_group
        assert all(r.status == "complete" for r in rows)
        # the drafting rows keep the block the drafter ran (the settings left it default)
        blocks = {r.mode: r.block_size for r in rows}
        assert blocks["plain"] is None or blocks["plain"] == blocks["dflash"]
        assert blocks["dflash"] == session.drafter_for("dflash").config.block_size
        assert blocks["dflash2"] == session.drafter_for("dflash2").config.block_size
        # continue from DFlash2: chosen, kept on reload, and the footer links the other two
        view.buttons["dflash2"].click()
        assert msg.chosen == "dflash2"
        reread = win.store.get(win.conv.id).messages[-1]
        assert reread.chosen == "dflash2" and set(reread.versions) == set(results)
        win.select_conversation(win.store.get(win.conv.id))
        assert list(win.compare_view.results) == ["plain", "dflash", "dflash2"]
        text = win.chat.toPlainText()
        assert "continue from Plain instead" in text and "continue from DFlash instead" in text
        assert "block default" not in text and "block 8" in text
    finally:
        close_window(win)


def test_compare_with_only_a_dflash2_drafter_runs_and_names_dflash2(qtbot, qs, tiny3):
    """A pair whose one drafter is a DFlash2 one compares plain with DFlash2: the side runs,
    is stored and is named as DFlash2 (never "DFlash"), live and reopened."""
    t, _d, d2 = tiny3
    win = make_window(qtbot, qs, ChatSession())
    try:
        with qtbot.waitSignal(win.modelLoaded, timeout=60_000) as blocker:
            win.load_model(PairSpec(str(t), str(d2)))
        assert blocker.args[0].modes == ("plain", "dflash2", "lookup")
        assert win.compare_action.text() == "Compare plain and DFlash2"
        assert "then with DFlash2, side by side" in win.composer.compare_btn.toolTip()
        msg = send_and_wait(qtbot, win, PROMPT, compare=True)
        assert msg.is_compare and msg.chosen == "dflash2"
        assert set(msg.versions) == {"plain", "dflash2"}
        rows = {k: win.store.db.get_message(i) for k, i in msg.ids.items()}
        assert {k: r.mode for k, r in rows.items()} == {"plain": "plain", "dflash2": "dflash2"}
        assert rows["dflash2"].summary["mode"] == "dflash2"
        assert msg.versions["dflash2"].result.tokens == msg.versions["plain"].result.tokens
        view = win.compare_view
        assert view.sides == ("plain", "dflash2") and list(view.results) == ["plain", "dflash2"]
        assert view.header.text().startswith("identical, ")
        assert "· DFlash2 " in view.header.text() and "DFlash " not in view.header.text()
        assert view.buttons["dflash2"].text() == "Continue from DFlash2"
        assert view.buttons["dflash2"].isVisible() and not view.buttons["dflash"].isVisible()
        text = win.chat.toPlainText()
        assert "DFlash2 ·" in text and "DFlash ·" not in text
        assert "continue from Plain instead" in text
        win.select_conversation(win.store.get(win.conv.id))  # reopened from storage
        assert win.compare_view.sides == ("plain", "dflash2")
        assert "· DFlash2 " in win.compare_view.header.text()
        assert win.compare_view.missing == ()
    finally:
        close_window(win)
