"""The drafter fit probe after a load (app.chat.drafter_probe): the bundled demo pair fits, a
random drafter does not; ``models --json --probe`` carries the verdict; the window names an
unfit drafter as soon as its pair is loaded; the Models window says a probed pair's verdict."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.chat.baseline import UNFIT_ACCEPTANCE, UNFIT_MIN_CYCLES, fit_verdict  # noqa: E402
from app.chat.drafter_probe import (  # noqa: E402
    PROBE_CYCLES,
    DrafterProbe,
    pair_key,
    probe_drafter,
)


@pytest.fixture(scope="module")
def demo_pair():
    from app.models.loader import check_pair, load_drafter, load_target
    from app.paths import bundled_pair

    pair = bundled_pair()
    if pair is None:
        pytest.skip("the demo pair is not bundled in this checkout")
    target, drafter = load_target(pair[0]), load_drafter(pair[1])
    check_pair(target, drafter)
    return target, drafter


@pytest.fixture(scope="module")
def unfit_dirs(tmp_path_factory):
    """A tiny random dense pair (its drafter has untrained weights: it does not fit)."""
    from app.models.tiny import build_tiny_pair

    return build_tiny_pair(tmp_path_factory.mktemp("probe_tiny"), "qwen3", seed=0,
                           block_size=8)


def test_fit_verdict_is_the_live_checks_rule():
    assert fit_verdict(None, 10) == "unknown"
    assert fit_verdict(0.0, UNFIT_MIN_CYCLES - 1) == "unknown"
    assert fit_verdict(UNFIT_ACCEPTANCE / 2, UNFIT_MIN_CYCLES) == "unfit"
    assert fit_verdict(UNFIT_ACCEPTANCE, UNFIT_MIN_CYCLES) == "fits"


def test_the_bundled_demo_pair_probes_as_fit(demo_pair):
    target, drafter = demo_pair
    probe = probe_drafter(target, drafter)
    assert probe.verdict == "fits", probe
    assert probe.cycles == PROBE_CYCLES and probe.error == ""
    assert probe.acceptance_rate >= 0.5  # trained for this target: most drafts accepted
    assert probe.accepted <= probe.drafted and probe.tau > 2
    assert probe.label() == f"drafter fit: {probe.acceptance_rate * 100:.0f}% accepted on a probe"
    assert probe.note() is None
    assert probe.key == pair_key(target.path, drafter.path)


def test_a_random_drafter_probes_as_unfit_with_the_live_checks_note(unfit_dirs):
    from app.models.loader import load_drafter, load_target

    target, drafter = load_target(unfit_dirs[0]), load_drafter(unfit_dirs[1])
    probe = probe_drafter(target, drafter)
    assert probe.verdict == "unfit", probe
    assert probe.cycles == PROBE_CYCLES and probe.tau == pytest.approx(1.0)
    assert probe.accepted == 0 and probe.drafted == PROBE_CYCLES * 7  # block 8: 7 drafts each
    assert probe.tokens == 1 + PROBE_CYCLES  # one token a cycle: bounded, quick
    assert probe.label() == "does not fit this target: 0% accepted on a probe"
    note = probe.note()
    assert note.startswith(f"The drafter {drafter.name} had 0% of its drafts accepted on a "
                           "short probe after loading (0 of 21 over 3 cycles)")
    assert "does not fit this target" in note and "Choose a drafter made for this" in note
    # a probe cut short says nothing
    short = probe_drafter(target, drafter, cycles=UNFIT_MIN_CYCLES - 1)
    assert short.verdict == "unknown" and short.note() is None
    assert short.label() == "fit unknown: the probe ended after 2 cycles"
    d = probe.to_dict()
    assert d["verdict"] == "unfit" and d["label"] == probe.label()
    assert json.loads(json.dumps(d))["drafted"] == 21


def test_models_json_probe_carries_the_verdicts(unfit_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    from app.cli import main

    folder = unfit_dirs[0].parent
    assert main(["models", "--add-folder", str(folder)]) == 0
    capsys.readouterr()
    assert main(["models", "--json"]) == 0  # no probe: nothing loaded, the field is empty
    listed = {t["name"]: t for t in json.loads(capsys.readouterr().out)["targets"]}
    assert listed[unfit_dirs[0].name]["drafter_probes"] == []
    assert main(["models", "--json", "--probe", unfit_dirs[0].name]) == 0
    out = capsys.readouterr()
    report = {t["name"]: t for t in json.loads(out.out)["targets"]}
    probes = report[unfit_dirs[0].name]["drafter_probes"]
    assert [(p["drafter_name"], p["verdict"]) for p in probes] == [(unfit_dirs[1].name,
                                                                     "unfit")]
    assert probes[0]["acceptance_rate"] == 0.0 and probes[0]["cycles"] == PROBE_CYCLES
    assert probes[0]["label"] == "does not fit this target: 0% accepted on a probe"
    assert "drafters" in report[unfit_dirs[0].name]  # the existing fields stay
    others = [t for n, t in report.items() if n != unfit_dirs[0].name]
    assert all(t["drafter_probes"] == [] for t in others)  # only the named target is probed
    assert f"probing {unfit_dirs[0].name}" in out.err
    assert main(["models", "--probe", unfit_dirs[0].name]) == 0
    text = capsys.readouterr().out
    assert (f"probe with {unfit_dirs[1].name}: does not fit this target: 0% accepted on a "
            "probe (tau 1.0, 3 cycles") in text
    # a name that matches no target is an error, not a silent listing
    assert main(["models", "--json", "--probe", unfit_dirs[0].name, "nosuch"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "--probe: no target named 'nosuch'" in out.err
    assert "probing" not in out.err


def test_the_window_names_an_unfit_drafter_once_its_pair_loads(qtbot, qs, unfit_dirs,
                                                                tmp_path):
    from test_ui_window import make_window

    from app.chat.session import ChatSession
    from app.ui.models_dialog import ModelsDialog

    win = make_window(qtbot, qs, ChatSession())
    try:
        # the pair is ready first; the probe's verdict follows
        with qtbot.waitSignal(win.modelLoaded, timeout=60_000) as blocker:
            win.load_model(str(unfit_dirs[0]), str(unfit_dirs[1]))
        info = blocker.args[0]
        qtbot.waitUntil(lambda: bool(win.state.drafter_probes), timeout=60_000)
        probes = list(win.state.drafter_probes.values())
        assert [p.verdict for p in probes] == ["unfit"]
        assert win.messages.banner_kind == "note"
        text = win.banner.text()
        assert f"The drafter {info.drafter_name} had 0% of its drafts accepted on a short " \
               "probe after loading" in text
        assert "does not fit this target" in text
        key = pair_key(unfit_dirs[0], unfit_dirs[1])
        assert win.state.drafter_probes[key].verdict == "unfit"
        # the Models window says the probed pair's verdict
        from app.models.catalog import Catalog

        catalog = Catalog(data_dir=tmp_path / "data", bundled=())
        catalog.add_folder(unfit_dirs[0].parent)
        dlg = ModelsDialog(None, catalog, lambda spec: None, probes=win.state.drafter_probes)
        qtbot.addWidget(dlg)
        assert dlg.select_target(str(unfit_dirs[0]))
        assert dlg.targets.currentItem().text(3) == (
            f"{unfit_dirs[1].name} (does not fit this target: 0% accepted on a probe)")
        assert "does not fit this target: 0% accepted on a probe" in \
            dlg.drafter_combo.currentText()
        assert dlg.probe_label.text().startswith(
            f"{unfit_dirs[1].name}: does not fit this target: 0% accepted on a probe")
    finally:
        win.shutdown()


def test_models_window_without_a_probe_says_nothing_of_fit(qtbot, tmp_path, unfit_dirs):
    from app.models.catalog import Catalog
    from app.ui.models_dialog import ModelsDialog

    catalog = Catalog(data_dir=tmp_path / "data", bundled=())
    catalog.add_folder(unfit_dirs[0].parent)
    fits = DrafterProbe(*pair_key("/elsewhere/t", "/elsewhere/d"), "d", "fits", 3, 21, 15,
                        15 / 21, 6.0, 19, 0.1)
    dlg = ModelsDialog(None, catalog, lambda spec: None, probes={fits.key: fits})
    qtbot.addWidget(dlg)
    assert dlg.select_target(str(unfit_dirs[0]))
    assert dlg.targets.currentItem().text(3) == unfit_dirs[1].name
    assert "probe" not in dlg.drafter_combo.currentText()
    assert dlg.probe_label.text() == ""
    assert fits.label() == "drafter fit: 71% accepted on a probe"
