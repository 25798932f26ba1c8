"""Shared fixtures (keep this file small: fixtures only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The Qwen special tokens, in the order the tiny tokenizers register them.
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<|mask|>",
]

_CORPUS = [
    "The capital of France is Paris, and it uses the euro.",
    "Let me think about this step by step. First, 17 times 23 is 391.",
    "I will call the calculator tool with the expression.",
    '{"name": "calculator", "arguments": {"expression": "2+2"}}',
    "<function=current_time>\n<parameter=timezone>\nEurope/Paris\n</parameter>\n</function>",
    "The weather is nice today. Hello world! How are you?",
    "東京は日本の首都です。北京是中国的首都。🙂🎉👍 naïve café",
]


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory) -> Path:
    """A folder with a small byte-level BPE ``tokenizer.json`` (vocab ~400) carrying the Qwen
    special tokens as added tokens, and the project's chat template; loadable by
    ``mlx_lm.tokenizer_utils.load`` (BPE streaming detokenizer, qwen3_coder tool parser)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("qwen_tok")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=QWEN_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 3, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    template = (REPO / "resources" / "chat_template.jinja").read_text(encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": template,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir):
    """mlx-lm ``TokenizerWrapper`` over :func:`qwen_tokenizer_dir`."""
    from mlx_lm.tokenizer_utils import load

    return load(qwen_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """A session folder for tiny random pairs built by ``app.models.tiny.build_tiny_pair``."""
    return tmp_path_factory.mktemp("tiny_pairs")


@pytest.fixture(scope="session")
def tiny_hybrid(tiny_root):
    """(target, drafter) loaded: a tiny ``qwen3_5`` hybrid target and its random drafter
    (block size 16, one sliding layer)."""
    from app.models.loader import load_drafter, load_target
    from app.models.tiny import build_tiny_pair

    t, d = build_tiny_pair(tiny_root, "qwen3_5", seed=0, block_size=16)
    return load_target(t), load_drafter(d)


@pytest.fixture(scope="session")
def tiny_dense(tiny_root):
    """(target, drafter) loaded: a tiny dense ``qwen3`` target and its random drafter."""
    from app.models.loader import load_drafter, load_target
    from app.models.tiny import build_tiny_pair

    t, d = build_tiny_pair(tiny_root, "qwen3", seed=0, block_size=16)
    return load_target(t), load_drafter(d)


@pytest.fixture(autouse=True)
def _cost_models_in_memory():
    """The commands (chat, compare, serve) and the window point the automatic block size's
    cost-model store (``app.engine.costs.set_store``) at the data folder, and it stays set for
    the process: a later test's auto reply on a tiny pair would then be written to the user's
    real data folder. Every test starts with the store in memory only."""
    import sys

    costs = sys.modules.get("app.engine.costs")
    if costs is not None:
        costs.set_store(None)
    yield


# ------------------------------------------------------------------ the window (pytest-qt)
@pytest.fixture(autouse=True)
def _cli_exports_undone():
    """``app.cli.main`` exports ``--data-dir`` and ``--prefix-cache-mb`` to the environment
    (its children read them); a test that runs ``main`` would otherwise leave them set for
    the later tests of its process (a prefix cache bound of 0 then fails the prefix tests)."""
    import os

    names = ("DFLASH_DATA_DIR", "DFLASH_PREFIX_CACHE_MB")
    before = {n: os.environ.get(n) for n in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _allow_engine_after():
    """A window marks the GUI (main) thread as MLX-free; undo it after every test so the
    next test (a window test or an engine test on the main thread) starts unmarked."""
    yield
    from app.engine.threads import allow_engine_on_current_thread

    allow_engine_on_current_thread()


@pytest.fixture(autouse=True)
def _no_unanswered_dialogs(request, monkeypatch):
    """A message box that a test did not answer itself would wait for a click for ever (CI
    then stops at its time limit with no report). Here it is answered at once: "Quit while a
    reply is written?" with Yes (so a failed test's window still closes), any other question
    with its default; and the test fails, naming the dialog. Tests that expect a dialog patch
    ``QMessageBox`` themselves, which replaces this."""
    import sys

    if "PySide6.QtWidgets" not in sys.modules and "qtbot" not in request.fixturenames:
        yield
        return
    from PySide6.QtWidgets import QMessageBox

    opened = []

    def answer(kind):
        def box(parent, title, text, buttons=None, default=None):
            opened.append(f"{kind} {title!r}: {text}")
            if title.startswith("Quit while"):
                return QMessageBox.StandardButton.Yes
            return default if default is not None else QMessageBox.StandardButton.Ok
        return box

    for kind in ("question", "warning", "critical", "information"):
        monkeypatch.setattr(QMessageBox, kind, answer(kind))
    yield
    assert not opened, f"a message box opened that the test did not answer: {opened}"


@pytest.fixture
def qs(tmp_path):
    """The window's QSettings in a file of the test's own (tools off, short replies, no
    system prompt), so tests never read or write the user's settings."""
    from PySide6.QtCore import QSettings

    s = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    s.beginGroup("generation")
    s.setValue("use_tools", False)
    s.setValue("max_tokens", 12)
    s.setValue("system_prompt", "")
    s.endGroup()
    return s


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    """(target, drafter) folders of a tiny random ``qwen3_5`` pair, block 8, as strings (the
    server tests')."""
    from app.models.tiny import build_tiny_pair

    t, d = build_tiny_pair(tmp_path_factory.mktemp("serve_tiny"), "qwen3_5", seed=0,
                           block_size=8)
    return str(t), str(d)
