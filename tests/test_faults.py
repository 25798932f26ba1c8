"""Faults a user meets (issue 47), injected on purpose: a damaged database, a drafter that
fails mid-reply, a data folder that cannot be written, a full disk, and the figures of a
reply cut by an end token, a stop string, Max tokens or Stop.

Each case checks what the user is told and that nothing already stored is lost.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from PySide6.QtCore import QUrl  # noqa: E402

from app.chat.scripted import ScriptedSession  # noqa: E402

PROMPT = "What is the capital of France?"


# ------------------------------------------------------------------ helpers
def make_window(qtbot, qs, backend, store=None):
    from app.ui.window import MainWindow

    win = MainWindow(backend=backend, store=store, qsettings=qs, auto_load=False)
    qtbot.addWidget(win)
    win.show()
    return win


def shown_messages(win) -> list[str]:
    """The text of every message banner the window shows now."""
    from PySide6.QtWidgets import QLabel

    return [b.text() for b in win.findChildren(QLabel, "banner")
            if b.isVisibleTo(win) and b.text()]


def load_scripted(qtbot, win):
    win.load_model("scripted-target", "scripted-drafter")
    qtbot.waitUntil(lambda: win.model is not None, timeout=10_000)


def send_and_wait(qtbot, win, text=PROMPT, mode="dflash"):
    win.composer.set_mode(mode)
    with qtbot.waitSignal(win.replyFinished, timeout=30_000) as blocker:
        assert win.send(text)
    return blocker.args[0]


# ------------------------------------------------------------------ a damaged database
def _damage(path, how: str) -> None:
    """Leave ``path`` as a database the app cannot use, in one of the ways users meet."""
    from app.chat.storage import Store

    if how == "random bytes":
        path.write_bytes(os.urandom(16_384))
        return
    if how == "not ours":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        db.commit()
        db.close()
        return
    with Store(path) as s:  # a real database with a chat in it
        conv = s.new_conversation()
        s.add_message(conv.id, "user", "an earlier chat " * 400)
    for suffix in ("-wal", "-shm"):
        (path.parent / (path.name + suffix)).unlink(missing_ok=True)
    if how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif how == "a damaged page":  # the header intact: it opens, and some reads fail
        with Store(path) as s:
            for i in range(6):
                conv = s.new_conversation()
                for j in range(4):
                    s.add_message(conv.id, "user", f"chat {i} message {j} " * 60)
        for suffix in ("-wal", "-shm"):
            (path.parent / (path.name + suffix)).unlink(missing_ok=True)
        pages = path.stat().st_size // 4096
        with open(path, "r+b") as f:  # the middle of every page after the first four
            for page in range(4, pages):
                f.seek(page * 4096 + 2000)
                f.write(b"\x07" * 1500)
        db = sqlite3.connect(path)
        assert db.execute("SELECT count(*) FROM schema_version").fetchone() == (1,)  # opens
        with pytest.raises(sqlite3.DatabaseError):  # and a read of the chats fails
            db.execute("SELECT * FROM messages").fetchall()
        db.close()
    elif how == "a damaged index":  # quick_check fails, every table row still reads
        with Store(path) as s:
            for i in range(30):
                conv = s.new_conversation(f"chat {i}")
                for j in range(10):
                    s.add_message(conv.id, "user", f"chat {i} message {j} " * 20)
        for suffix in ("-wal", "-shm"):
            (path.parent / (path.name + suffix)).unlink(missing_ok=True)
        db = sqlite3.connect(path)
        root = db.execute("SELECT rootpage FROM sqlite_master "
                          "WHERE name = 'messages_conversation'").fetchone()[0]
        db.close()
        with open(path, "r+b") as f:  # the middle of the index's root page
            f.seek((root - 1) * 4096 + 2000)
            f.write(b"\x07" * 1500)
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA quick_check").fetchone()[0] != "ok"
        assert db.execute("SELECT count(*) FROM (SELECT * FROM messages)").fetchone() == (301,)
        db.close()
    elif how == "schema 99":
        db = sqlite3.connect(path)
        db.execute("UPDATE schema_version SET version = 99")
        db.commit()
        db.close()


@pytest.mark.parametrize("how", ["truncated", "random bytes", "schema 99", "not ours",
                                 "a damaged page", "a damaged index"])
def test_a_damaged_database_keeps_its_banner_until_the_user_dismisses_it(qtbot, qs, tmp_path,
                                                                         how):
    """Chats kept in memory only are said so at start, and still after the model has loaded,
    a reply has run and another chat was opened: only the user's dismissal hides it."""
    from app.chat.turns import open_store

    db = tmp_path / "conversations.db"
    _damage(db, how)
    before = db.read_bytes()
    store = open_store(tmp_path)
    assert store.problem
    win = make_window(qtbot, qs, ScriptedSession(cycles=2), store)
    try:
        def memory_only() -> bool:
            return any("kept in memory only" in t for t in shown_messages(win))

        assert memory_only()
        load_scripted(qtbot, win)
        assert memory_only(), "the storage banner went when the model loaded"
        send_and_wait(qtbot, win)
        assert memory_only(), "the storage banner went when a reply ran"
        win.new_chat()
        assert memory_only(), "the storage banner went with a new chat"
        win.messages.show_banner("Could not load the model: a test failure")
        win.models.on_loaded(win.model)  # a later load succeeds: "an earlier failure is over"
        assert memory_only()
        win.store_banner_close.click()
        assert not memory_only()
        # the status bar still says so, for as long as the window runs
        assert win.store_label.isVisibleTo(win) and win.store_label.text() == "Chats not saved"
        assert store.problem in win.store_label.toolTip()
    finally:
        win.shutdown()
    assert db.read_bytes() == before  # the damaged file was left as it was


def test_a_page_damaged_after_the_check_is_a_typed_error(tmp_path, monkeypatch):
    """Damage that the open-time check did not see (the file damaged while the app runs):
    reads raise StorageError, which callers handle, not sqlite3's error."""
    from app.chat.storage import StorageError, Store

    db = tmp_path / "conversations.db"
    _damage(db, "a damaged page")
    monkeypatch.setattr(Store, "_check_intact", lambda self: None)  # as if damaged later
    with Store(db) as store:
        with pytest.raises(StorageError, match="could not read"):
            store._q("SELECT * FROM messages")  # what every read goes through


def test_a_window_whose_chats_cannot_be_read_starts_and_says_so(qtbot, qs, tmp_path,
                                                                monkeypatch):
    """Damage found by a read, not at open: the window crashed at start (the traceback
    ended in "database disk image is malformed"); it starts, lists what it can, and says so
    in the storage banner."""
    from app.chat.storage import Store
    from app.chat.turns import ViewStore

    db = tmp_path / "conversations.db"
    _damage(db, "a damaged page")
    monkeypatch.setattr(Store, "_check_intact", lambda self: None)  # as if damaged later
    store = ViewStore(db)
    qs.setValue("last_conversation", 1)
    real = Store.list_conversations

    def damaged(self, *a, **k):  # the conversations' own table damaged too
        self._q("SELECT * FROM messages")
        return real(self, *a, **k)

    monkeypatch.setattr(Store, "list_conversations", damaged)
    win = make_window(qtbot, qs, ScriptedSession(cycles=2), store)
    try:
        assert any("Some saved chats could not be read" in t and
                   _advised_command(t)[2] == ".dump" for t in shown_messages(win))
        assert store.search("chat") == []  # a read that fails answers "nothing", says so
        assert win.isVisible()
    finally:
        win.shutdown()


def _advised_command(text: str) -> list[str]:
    """The sqlite3 command line the app's advice gives (``sqlite3 conversations.db ...``)."""
    import re

    found = re.search(r"sqlite3 conversations\.db (\.\w+) > rescued\.sql", text)
    assert found, f"no sqlite3 command in: {text}"
    return ["sqlite3", "conversations.db", found.group(1)]


@pytest.mark.parametrize("how", ["truncated", "a damaged index"])
def test_the_rescue_the_app_advises_works_with_this_systems_sqlite3(tmp_path, how):
    """The advice names ``.dump``, which every sqlite3 has (Debian 12's 3.40.1 answers
    ``.recover`` with "SQL logic error", even on a healthy file), and ``.recover`` only as the
    deeper option; run as advised, it rescues the rows."""
    import shutil
    import subprocess

    from app.chat.storage import StorageError, Store

    db = tmp_path / "conversations.db"
    _damage(db, how)
    with pytest.raises(StorageError) as caught:
        Store(db)
    advice = str(caught.value)
    command = _advised_command(advice)
    assert command[2] == ".dump" and ".recover" in advice.split(".dump", 1)[1]
    if shutil.which("sqlite3") is None:
        pytest.skip("no sqlite3 command-line tool here")
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rescued = sqlite3.connect(":memory:")
    rescued.executescript(done.stdout.replace("ROLLBACK; -- due to errors", "COMMIT;"))
    counts = [rescued.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
              for table in ("conversations", "messages")]
    # every row; of the truncated file what is left: its chat, not the page of its message
    assert counts == ([31, 301] if how == "a damaged index" else [1, 0])


def test_chats_behind_a_damaged_index_are_shown_from_a_copy_in_memory(qtbot, qs, tmp_path):
    """Only an index is damaged (quick_check fails, every row reads): the window still keeps
    chats in memory only and says so, but shows every saved chat, whole and in order, from a
    copy rebuilt in memory; the damaged file is not written."""
    from app.chat.turns import open_store

    db = tmp_path / "conversations.db"
    _damage(db, "a damaged index")
    before = db.read_bytes()
    store = open_store(tmp_path)
    assert "damaged" in store.problem and "31 saved chats" in store.problem
    assert len(store.list()) == 31
    chat = next(c for c in store.list() if c.title == "chat 3")
    shown = store.get(chat.id)
    assert [t.content for t in shown.messages] == [f"chat 3 message {j} " * 20 for j in range(10)]
    win = make_window(qtbot, qs, ScriptedSession(cycles=2), store)
    try:
        assert any("kept in memory only" in t and ".dump" in t for t in shown_messages(win))
        load_scripted(qtbot, win)
        send_and_wait(qtbot, win)  # a new turn goes to the copy
    finally:
        win.shutdown()
    assert db.read_bytes() == before


# ------------------------------------------------------------------ a read-only database file
@pytest.fixture(params=["opened read-only", "read-only bind mount"])
def read_only_db(request, tmp_path, monkeypatch):
    """A ``conversations.db`` holding one chat, that cannot be written though its folder can:
    SQLite opens it read-only (as a root test cannot make with chmod), or a read-only bind
    mount of the file alone (skipped where it cannot be mounted). Yields (file, its bytes)."""
    import subprocess

    from app.chat.storage import Store

    folder = tmp_path / "data"
    db = folder / "conversations.db"
    with Store(db) as s:
        conv = s.new_conversation("An earlier chat")
        s.add_message(conv.id, "user", "What is the capital of France?")
        reply = s.begin_reply(conv.id, mode="plain")
        s.finish_reply(reply.id, content="Paris.", token_ids=[1, 2])
    before = db.read_bytes()
    if request.param == "opened read-only":
        real = sqlite3.connect

        def connect(database, *args, **kwargs):
            if str(database) == str(db):  # the app's own connection to the file
                kwargs["uri"] = True
                return real(db.as_uri() + "?mode=ro", *args, **kwargs)
            return real(database, *args, **kwargs)

        monkeypatch.setattr(sqlite3, "connect", connect)
        yield db, before
        return
    done = subprocess.run(f"mount --bind '{db}' '{db}' && mount -o remount,ro,bind '{db}'",
                          shell=True, capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["umount", str(db)], capture_output=True)
        pytest.skip(f"cannot bind-mount a file here ({done.stderr.strip() or 'not root'})")
    try:
        yield db, before
    finally:
        subprocess.run(["umount", "-l", str(db)], capture_output=True)


def test_a_read_only_database_file_is_found_when_the_store_opens(read_only_db):
    """It was opened as usual and every later write failed; now the open says so, naming
    the file (its folder can be written), and leaves the file as it was."""
    from app.chat.storage import Store, StoreWriteError

    db, before = read_only_db
    with pytest.raises(StoreWriteError) as caught:
        Store(db)
    assert caught.value.cause == "readonly"
    assert f"{db} cannot be written" in str(caught.value)
    assert f"{db.parent} cannot be written" not in str(caught.value)
    assert db.read_bytes() == before


def test_a_read_only_database_file_keeps_chats_in_memory_and_shows_the_saved_ones(
        qtbot, qs, read_only_db):
    """The window starts with the storage banner naming the file, lists the saved chat (from
    a copy in memory), and a new turn runs (in memory) instead of "Could not save this
    turn: <folder> cannot be written"; the file is left as it was."""
    from app.chat.turns import open_store

    db, before = read_only_db
    store = open_store(db.parent)
    assert f"{db} cannot be written" in store.problem
    assert "1 saved chat " in store.problem
    assert [c.title for c in store.list()] == ["An earlier chat"]
    win = make_window(qtbot, qs, ScriptedSession(cycles=2), store)
    try:
        assert any("kept in memory only" in t and str(db) in t for t in shown_messages(win))
        assert [t.text() for t in win.conv.messages] == ["What is the capital of France?",
                                                          "Paris."]
        load_scripted(qtbot, win)
        send_and_wait(qtbot, win)
        assert not any("Could not save" in t for t in shown_messages(win))
        assert len(win.conv.messages) == 4
        win.conversations.rename_conversation("Renamed")  # refused before, as every write
        assert not any("Could not rename" in t for t in shown_messages(win))
        assert [c.title for c in store.list()] == ["Renamed"]
    finally:
        win.shutdown()
    assert db.read_bytes() == before


def test_a_file_that_turns_read_only_while_the_app_runs_is_named_in_the_write_error(tmp_path):
    """A write refused because the file (not its folder) is read-only names the file."""
    from app.chat.storage import Store, StoreWriteError

    db = tmp_path / "conversations.db"
    store = Store(db)
    conv = store.new_conversation("A chat")
    writable = store._db
    store._db = sqlite3.connect(db.as_uri() + "?mode=ro", uri=True, isolation_level=None,
                                check_same_thread=False)
    try:
        with pytest.raises(StoreWriteError) as caught:
            store.add_message(conv.id, "user", "hello")
    finally:
        store._db.close()
        store._db = writable
    assert caught.value.cause == "readonly"
    assert f"{db} cannot be written" in str(caught.value)
    assert f"{tmp_path} cannot be written" not in str(caught.value)
    assert store.messages(conv.id) == []
    store.close()


# ------------------------------------------------------------------ a drafter that fails
class DrafterFault(RuntimeError):
    """What the failing drafter raises."""


def test_a_dflash_reply_that_fails_midway_is_stored_as_failed_in_its_mode(tiny_hybrid,
                                                                          monkeypatch):
    """A drafter that raises on its third call: the reply keeps its partial text and tokens,
    is stored ``error`` with the cause, in DFlash with the two cycles it ran, and shows as
    failed when the chat is opened again."""
    from app.chat.session import ChatSession
    from app.chat.storage import Store
    from app.chat.turns import ViewStore
    from app.engine.errors import EngineError
    from app.engine.threads import allow_engine_on_current_thread

    allow_engine_on_current_thread()
    target, drafter = tiny_hybrid
    real = drafter.model.draft
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise DrafterFault("the drafter broke on its third call")
        return real(*args, **kwargs)

    monkeypatch.setattr(drafter.model, "draft", failing)
    store = Store(":memory:")
    session = ChatSession(store)
    session.target, session.drafter = target, drafter
    conv = store.new_conversation()
    settings = {"mode": "dflash", "block_size": 4, "max_tokens": 64, "temperature": 0.0,
                "use_tools": False, "enable_thinking": False}
    events = []
    with pytest.raises(EngineError, match="third call"):
        for ev in session.send(conv.id, PROMPT, settings):
            events.append(ev)
    assert len(calls) == 3
    from app.engine.events import TokenEvent

    streamed = [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert streamed, "the two cycles before the failure streamed their tokens"
    row = store.get_message(session.last_reply_id)
    assert row.status == "error"
    assert row.error and "third call" in row.error
    assert row.mode == "dflash"
    assert row.summary["mode"] == "dflash" and row.summary["cycles"] == 2
    assert row.summary["stop_cause"] == "error"
    assert row.token_ids == streamed and row.content  # the partial reply is kept
    # reopened, the chat says the reply failed
    view = ViewStore.__new__(ViewStore)
    view.db = store
    shown = view.get(conv.id).messages[-1].version
    assert shown.error and "third call" in shown.error
    assert shown.result.mode == "dflash" and shown.result.summary.mode == "dflash"
    store.close()


# ------------------------------------------------------------------ a data folder not writable
def _mount_tmpfs(path, options: str) -> None:
    """Mount a tmpfs at ``path`` (skips the test where that cannot be done)."""
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'})")


def _umount(path) -> None:
    import subprocess

    subprocess.run(["umount", "-l", str(path)], capture_output=True)  # -l: even if busy


@pytest.fixture(params=["under a file", "read-only mount"])
def unwritable_dir(request, tmp_path):
    """A data folder the app cannot write: one under a file (it can never be made), or a
    read-only filesystem (root cannot write it either)."""
    if request.param == "under a file":
        (tmp_path / "file").write_text("x")
        yield tmp_path / "file" / "data"
        return
    ro = tmp_path / "ro"
    _mount_tmpfs(ro, "ro,size=1m")
    try:
        yield ro
    finally:
        _umount(ro)


@pytest.mark.parametrize("how", ["--data-dir", "DFLASH_DATA_DIR"])
def test_the_window_says_in_one_line_that_its_data_folder_cannot_be_written(unwritable_dir,
                                                                            how):
    import subprocess
    import sys

    from tests.conftest import REPO

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-m", "app", "--gui"]
    if how == "--data-dir":
        argv[3:3] = ["--data-dir", str(unwritable_dir)]
        env.pop("DFLASH_DATA_DIR", None)
    else:
        env["DFLASH_DATA_DIR"] = str(unwritable_dir)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {how} {unwritable_dir} ")
    assert "cannot be created" in lines[0] or "is not writable" in lines[0]


# ------------------------------------------------------------------ figures of a cut reply
MSGS = [{"role": "user", "content": "What is the capital of France? Think first."}]


def _tiny_reply(target, drafter, settings, cancel_after: int | None = None):
    """Events and the Reply of ``run_reply`` on the tiny pair; with ``cancel_after`` Stop
    is pressed once that many tokens have arrived."""
    import threading

    from app.chat.reply import ReplyDone, run_reply
    from app.engine.events import TokenEvent

    cancel = threading.Event()
    events, seen = [], 0
    for ev in run_reply(target, drafter, MSGS, settings, cancel):
        events.append(ev)
        if isinstance(ev, TokenEvent):
            seen += 1
            if cancel_after is not None and seen >= cancel_after:
                cancel.set()
    assert isinstance(events[-1], ReplyDone)
    return events, events[-1].reply


@pytest.mark.parametrize("cause", ["end token", "stop string", "max tokens", "user stop"])
def test_acceptance_and_tau_count_only_the_tokens_kept(tiny_hybrid, monkeypatch, cause):
    """However a DFlash reply ends, its figures (the reply's Summary and the live panel's,
    from the cycles the reply passed on) are those of the tokens it kept: accepted = the
    drafted tokens among them (their per-token flags), tau = kept tokens after the first per
    cycle, acceptance = accepted / drafted, where a cycle the end cut counts only the drafts
    before the cut."""
    from app.chat.reply import ReplySettings, RoundStarted
    from app.engine.events import CycleEvent, TokenEvent
    from app.engine.threads import allow_engine_on_current_thread
    from app.ui.panels import LiveStats
    from tests.engine_fixtures import OracleDrafter

    allow_engine_on_current_thread()
    target, real = tiny_hybrid
    base = {"enable_thinking": False, "max_tokens": 48}
    events, plain = _tiny_reply(target, None, ReplySettings(mode="plain", **base))
    reference = plain.tokens
    prompt_len = next(e.prompt_tokens for e in events if isinstance(e, RoundStarted))
    assert len(reference) == 48, "the tiny target ended early: the cases need 48 tokens"
    block = 8
    schedule = [None] if cause == "end token" else [None, 2, None, 5]
    oracle = OracleDrafter(reference, prompt_len, target.vocab_size, block,
                           real.config.target_layer_ids, schedule=schedule)
    settings = dict(base, block_size=block)
    cancel_after = None
    if cause == "end token":  # an accepted draft inside the second block ends the reply
        cut = next(i for i in range(block + 2, 2 * block) if reference[i] not in reference[:i])
        monkeypatch.setattr(target, "eos_token_ids", {reference[cut]})
    elif cause == "stop string":  # text that first shows inside the third cycle's block
        decode = target.tokenizer.decode
        for i in range(13, 19):
            before, upto = decode(reference[:i]), decode(reference[: i + 1])
            stop = upto[len(before) - 1:]
            if len(stop) >= 2 and stop not in before:
                break
        else:
            pytest.skip("no stop string found inside the block")
        settings["stop"] = [stop]
    elif cause == "max tokens":
        settings["max_tokens"] = 2 * block + 3
    else:
        cancel_after = block + 3
    events, rep = _tiny_reply(target, oracle, ReplySettings(mode="dflash", **settings),
                              cancel_after)
    want = {"end token": "stop", "stop string": "stop", "max tokens": "length",
            "user stop": "cancelled"}[cause]
    assert rep.finish_reason == want
    s = rep.rounds[0].summary
    tokens, flags = rep.tokens, rep.rounds[0].from_draft
    assert [e.token_id for e in events if isinstance(e, TokenEvent)] == tokens
    assert len(flags) == len(tokens) == s.generated_tokens
    cycles = [e for e in events if isinstance(e, CycleEvent)]
    # the Summary is what the kept tokens' flags say
    assert s.accepted == sum(flags)
    assert s.cycles == len(cycles) > 0
    assert s.tau == pytest.approx((len(tokens) - 1) / s.cycles)
    assert s.drafted >= s.accepted and s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.accepted_lengths == [c.accepted for c in cycles]
    if cause != "max tokens":  # the last block was cut: only its drafts before the cut count
        assert cycles[-1].committed == cycles[-1].accepted == cycles[-1].drafted
    # and so are the cycles the live panel counts
    assert sum(c.accepted for c in cycles) == s.accepted
    assert sum(c.drafted for c in cycles) == s.drafted
    assert sum(c.committed for c in cycles) == len(tokens) - 1
    live = LiveStats(mode="dflash")
    for e in events:
        if isinstance(e, TokenEvent):
            live.on_token()
        elif isinstance(e, CycleEvent):
            live.on_cycle(e)
    shown = live.values()
    assert shown["acceptance"] == pytest.approx(s.acceptance_rate)
    assert shown["tau"] == pytest.approx(s.tau)
    assert shown["cycles"] == s.cycles and shown["tokens"] == len(tokens)
    # the reply's figures, as stored and shown when the reply is reopened
    assert rep.summary is s


# ------------------------------------------------------------------ store writes that fail
def _fill(folder) -> None:
    """Fill the filesystem holding ``folder`` to the last byte (with a file ``filler``)."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (65_536, 4096, 512, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:  # ENOSPC: on to smaller pieces
                pass
    finally:
        os.close(fd)


def _integrity(path) -> str:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs data folder (skipped where it cannot be mounted)."""
    folder = tmp_path / "data"
    _mount_tmpfs(folder, "size=2m")
    try:
        yield folder
    finally:
        _umount(folder)


def test_a_full_disk_is_a_typed_error_naming_the_cause_and_the_folder(small_disk):
    from app.chat.storage import Store, StoreWriteError

    db = small_disk / "conversations.db"
    store = Store(db)
    conv = store.new_conversation("Earlier chat")
    store.add_message(conv.id, "user", "What is the capital of France?")
    reply = store.begin_reply(conv.id, mode="plain")
    store.finish_reply(reply.id, content="Paris.", token_ids=[1, 2])
    before = [(m.id, m.role, m.content, m.status) for m in store.messages(conv.id)]
    _fill(small_disk)
    with pytest.raises(StoreWriteError) as caught:
        other = store.new_conversation("A new chat")
        for _ in range(200):  # the first write may still fit in the space SQLite holds
            store.add_message(other.id, "user", "x" * 20_000)
    err = caught.value
    assert err.cause == "full" and err.folder == small_disk
    assert "full" in str(err) and str(small_disk) in str(err)
    # the store still reads, and a write that failed took nothing with it
    assert [(m.id, m.role, m.content, m.status) for m in store.messages(conv.id)] == before
    store.close()
    (small_disk / "filler").unlink()
    assert _integrity(db) == "ok"
    with Store(db) as again:
        assert [(m.id, m.role, m.content, m.status)
                for m in again.messages(conv.id)] == before


def test_a_database_locked_beyond_the_timeout_is_a_typed_error(tmp_path):
    from app.chat.storage import Store, StoreWriteError

    db = tmp_path / "conversations.db"
    store = Store(db, busy_timeout_s=0.2)
    conv = store.new_conversation("Earlier chat")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another program holds the write lock
    try:
        with pytest.raises(StoreWriteError) as caught:
            store.add_message(conv.id, "user", "hello")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert caught.value.cause == "locked"
    assert "locked" in str(caught.value) and str(tmp_path) in str(caught.value)
    store.add_message(conv.id, "user", "hello")  # once it is free, writes work again
    assert [m.content for m in store.messages(conv.id)] == ["hello"]
    store.close()


def test_a_write_that_fails_inside_a_transaction_stays_a_write_error(tmp_path):
    """add_message's own UPDATE of the chat's time runs through the read helper inside the
    write transaction: a full disk there is a StoreWriteError (the window keeps the write to
    retry), not a "could not read" error."""
    from app.chat.storage import Store, StoreReadError, StoreWriteError

    class FullOnTouch:  # the connection, failing the UPDATE as a full disk would
        def __init__(self, db):
            self.db = db

        def execute(self, sql, *args):
            if sql.startswith("UPDATE conversations SET updated_at"):
                exc = sqlite3.OperationalError("database or disk is full")
                exc.sqlite_errorcode, exc.sqlite_errorname = 13, "SQLITE_FULL"
                raise exc
            return self.db.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.db, name)

    store = Store(tmp_path / "conversations.db")
    conv = store.new_conversation("A chat")
    real = store._db
    store._db = FullOnTouch(real)
    try:
        with pytest.raises(StoreWriteError) as caught:
            store.add_message(conv.id, "user", "hello")
        assert not isinstance(caught.value, StoreReadError) and caught.value.cause == "full"
    finally:
        store._db = real
    assert store.messages(conv.id) == []  # rolled back whole
    store.close()


@pytest.mark.parametrize("name, cause", [("SQLITE_FULL", "full"), ("SQLITE_IOERR_WRITE", "io"),
                                         ("SQLITE_BUSY", "locked"),
                                         ("SQLITE_READONLY", "readonly"),
                                         ("SQLITE_CORRUPT", "damaged")])
def test_every_write_failure_names_its_cause(tmp_path, name, cause):
    from app.chat.storage import write_error

    exc = sqlite3.OperationalError("low-level text")
    exc.sqlite_errorname = name
    err = write_error(exc, tmp_path)
    assert err.cause == cause and str(tmp_path) in str(err)
    assert "low-level text" not in str(err) or cause == "other"


LONG_ANSWER = "A long answer. " * 4000


def _long_reply_on_a_small_disk(qtbot, qs, small_disk):
    """A window on a store in ``small_disk``: one short chat answered, then a long reply
    started in a new chat. Returns (ViewStore, window, the first chat's id, that chat's
    rows as (id, role, content, status))."""
    from app.chat.scripted import ScriptedTurn
    from app.chat.turns import ViewStore

    store = ViewStore(small_disk / "conversations.db")
    store.db.partial_interval_s = 0.0  # every event saves the growth
    backend = ScriptedSession(turns=[ScriptedTurn("", "Paris."), ScriptedTurn("", LONG_ANSWER)],
                              cycles=None, chunk_chars=600, delay_s=0.01)
    win = make_window(qtbot, qs, backend, store)
    load_scripted(qtbot, win)
    send_and_wait(qtbot, win, mode="plain")
    first = win.conv.id
    before = [(m.id, m.role, m.content, m.status) for m in store.db.messages(first)]
    win.new_chat()
    assert win.send("Tell me a long story.")
    qtbot.waitUntil(lambda: win.replies.run is not None and bool(win.replies.run.msg.ids),
                    timeout=10_000)
    return store, win, first, before


def test_a_disk_that_fills_up_mid_reply_is_said_at_once_and_loses_nothing(qtbot, qs,
                                                                          small_disk):
    """The disk fills while a reply is written: the storage banner says so (the cause and
    the folder) while the reply still runs, the reply's text stays on screen, and the
    earlier chat is intact in the database afterwards."""
    from app.chat.turns import ViewStore

    db = small_disk / "conversations.db"
    store, win, first, before = _long_reply_on_a_small_disk(qtbot, qs, small_disk)
    try:
        _fill(small_disk)

        def said() -> bool:
            return any("full" in t and str(small_disk) in t for t in shown_messages(win))

        qtbot.waitUntil(said, timeout=20_000)
        assert win.busy, "the banner came only after the reply had ended"
        qtbot.waitUntil(lambda: not win.busy, timeout=60_000)
        assert said()  # it stays after the reply ended
        shown = win.chat.toPlainText()
        assert "A long answer. A long answer." in shown  # the reply is still on screen
        assert shown.count("A long answer.") >= 100
        win.new_chat()
        assert said()
    finally:
        win.shutdown()
    (small_disk / "filler").unlink()
    assert _integrity(db) == "ok"
    again = ViewStore(db)
    try:
        assert [(m.id, m.role, m.content, m.status)
                for m in again.db.messages(first)] == before
    finally:
        again.close()


def test_a_reply_the_full_disk_could_not_take_is_saved_when_space_returns(qtbot, qs,
                                                                          small_disk,
                                                                          monkeypatch,
                                                                          tmp_path):
    """The disk fills while a reply is written and its final write fails: the reply stays
    on screen and exports whole, Retry now on a still-full disk says it is still not saved,
    and once space returns the app's own retry stores the row with its whole text, the
    banner says so and then goes; the earlier chat is untouched."""
    from app.chat.turns import ViewStore
    from app.ui import messages as messages_mod

    monkeypatch.setattr(messages_mod, "SAVE_RETRY_MS", 200)
    monkeypatch.setattr(messages_mod, "SAVED_NOTE_MS", 300)
    answer = LONG_ANSWER

    db = small_disk / "conversations.db"
    store, win, first, before = _long_reply_on_a_small_disk(qtbot, qs, small_disk)
    try:
        row_id = win.replies.run.msg.ids[win.replies.run.key]
        _fill(small_disk)
        qtbot.waitUntil(lambda: not win.busy, timeout=60_000)
        assert len(win.state.pending_writes) == 1, "the final write went through on a full disk"
        assert store.db.get_message(row_id).status == "generating"  # not stored yet
        assert any("Could not save the reply" in t and "full" in t and str(small_disk) in t
                   for t in shown_messages(win))
        assert win.store_retry.isVisibleTo(win)
        assert win.chat.toPlainText().count("A long answer.") >= 100  # on screen, to copy
        out = tmp_path / "exported.md"  # another disk: the export holds the whole reply
        assert win.conversations.export_chat(str(out))
        assert answer.strip() in out.read_text(encoding="utf-8")
        win.store_retry.click()  # still full: still kept, and said
        assert len(win.state.pending_writes) == 1 and win.messages.retry_timer.isActive()
        assert any("full" in t for t in shown_messages(win))
        (small_disk / "filler").unlink()  # space returns: the timer's retry saves it
        qtbot.waitUntil(lambda: any(t.startswith("Saved") for t in shown_messages(win)),
                        timeout=10_000)
        assert not len(win.state.pending_writes) and not win.messages.retry_timer.isActive()
        assert not win.store_retry.isVisibleTo(win)
        row = store.db.get_message(row_id)
        assert row.status == "complete" and row.content.strip() == answer.strip()
        qtbot.waitUntil(lambda: not win.store_banner_row.isVisibleTo(win), timeout=5_000)
    finally:
        win.shutdown()
    assert _integrity(db) == "ok"
    again = ViewStore(db)
    try:
        assert [(m.id, m.role, m.content, m.status)
                for m in again.db.messages(first)] == before
        assert again.db.get_message(row_id).content.strip() == answer.strip()
    finally:
        again.close()


def test_a_turn_the_store_cannot_write_says_so_in_the_storage_banner(qtbot, qs, monkeypatch,
                                                                     tmp_path):
    """No room for the new turn's rows: nothing runs, the message goes back to the box, and
    the storage banner names the cause and the folder until it is dismissed."""
    from app.chat.storage import StoreWriteError
    from app.chat.turns import ViewStore

    win = make_window(qtbot, qs, ScriptedSession(cycles=2), ViewStore(tmp_path / "c.db"))
    try:
        load_scripted(qtbot, win)
        send_and_wait(qtbot, win, mode="plain")
        before = [(m.role, m.content) for m in win.store.db.messages(win.conv.id)]

        def full(*args, **kwargs):
            raise StoreWriteError(f"the disk holding {tmp_path} is full", "full", tmp_path)

        monkeypatch.setattr(win.store.db, "begin_reply", full)
        assert win.send("Tell me more.")
        qtbot.waitUntil(lambda: not win.busy, timeout=10_000)
        said = [t for t in shown_messages(win) if "Could not save this turn" in t]
        assert said and "full" in said[0] and str(tmp_path) in said[0]
        assert win.composer.edit.toPlainText() == "Tell me more."
        assert [(m.role, m.content) for m in win.store.db.messages(win.conv.id)] == before
        monkeypatch.undo()
        win.models.on_loaded(win.model)  # a model load does not take it away
        assert any("Could not save this turn" in t for t in shown_messages(win))
    finally:
        win.shutdown()


# ------------------------------------------------------------------ export file names
@pytest.mark.parametrize("title, name", [
    ("Tell me\u202egnp.exe", "Tell megnp.exe"),  # a right-to-left override reverses the name
    ("zero\u200bwidth\u2066isolate\u2069 here", "zerowidthisolate here"),
    ("CON", "CON_"),
    ("con", "con_"),
    ("Nul.md", "Nul_.md"),
    ("COM1", "COM1_"),
    ("lpt9 ", "lpt9_"),
    ("AUX and friends", "AUX and friends"),  # only the whole stem is reserved
    ("Console", "Console"),
])
def test_an_export_file_name_suggested_from_a_title_is_safe(title, name):
    """Invisible format characters leave the name (U+202E shows ``exe.png`` as ``gnp.exe``),
    and a name Windows reserves for a device (``CON``, ``NUL``, ``COM1`` ...) gets a ``_``."""
    from app.ui.text import file_name

    assert file_name(title) == name


# ------------------------------------------------------------------ quitting in every state
_EXIT_SCRIPT = r'''
import os, sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from pathlib import Path
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication
from app.chat.export import write_export
from app.chat.scripted import ScriptedSession
from app.chat.storage import Store
from app.chat.turns import ViewStore
from app.ui.window import MainWindow

data = Path(sys.argv[1])
with Store(data / "exported.db") as src:
    c = src.new_conversation("Exported chat")
    src.add_message(c.id, "user", "What is the capital of France?")
    r = src.begin_reply(c.id, mode="plain")
    src.finish_reply(r.id, content="Paris.", token_ids=[1, 2])
    write_export(src, c.id, data / "chat.json")
app = QApplication([])
win = MainWindow(backend=ScriptedSession(cycles=100_000, delay_s=0.005),
                 store=ViewStore(data / "conversations.db"),
                 qsettings=QSettings(str(data / "settings.ini"), QSettings.IniFormat),
                 auto_load=False)
win.show()
win.load_model("scripted-target", "scripted-drafter")

def step():
    if win.model is None:
        QTimer.singleShot(20, step)
        return
    assert win.conversations.import_chat(str(data / "chat.json"))
    if sys.argv[2] == "mid-reply":
        win.new_chat()
        assert win.send("Tell me a long story.")
        QTimer.singleShot(300, lambda: sys.exit(0))
    else:
        sys.exit(0)  # right after the import, as a script or a slot may end the program

QTimer.singleShot(0, step)
app.exec()
'''


@pytest.mark.parametrize("state", ["after an import", "mid-reply"])
def test_the_program_ending_without_closing_the_window_stops_the_worker_first(tmp_path,
                                                                              state):
    """sys.exit from a slot (nothing closed the window): the worker thread is stopped and
    the store closed before Qt's objects go, instead of Qt aborting with "QThread:
    Destroyed while thread 'mlx-worker' is still running"; a reply cut so is stored
    ``interrupted`` with its text."""
    import subprocess
    import sys

    from app.chat.storage import Store
    from tests.conftest import REPO

    script = tmp_path / "run.py"
    script.write_text(_EXIT_SCRIPT, encoding="utf-8")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(script), str(tmp_path), state], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert "QThread: Destroyed" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    with Store(tmp_path / "conversations.db") as s:
        titles = [c.title for c in s.list_conversations()]
        assert "Exported chat" in titles
        rows = [m for c in s.list_conversations() for m in s.messages(c.id)
                if m.role == "assistant"]
        assert all(m.status != "generating" for m in rows)
        if state == "mid-reply":
            cut = [m for m in rows if m.status == "interrupted"]
            assert cut and cut[0].content


@pytest.mark.parametrize("wait_s", [0.0, pytest.param(1.0, marks=pytest.mark.slow)],
                         ids=["while-the-window-is-built", "running"])
def test_a_terminate_signal_quits_the_window_cleanly(tmp_path, wait_s):
    """SIGTERM (a logout, ``kill``) and Ctrl+C quit like File › Quit: the log says so and
    the process ends with status 0, the worker stopped first; also when the signal comes
    right after the log's first line, while the window is still being built."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "app", "--gui", "--data-dir",
                             str(tmp_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log = tmp_path / "dflash-chat.log"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                log.is_file() and "starting" in log.read_text(encoding="utf-8")):
            time.sleep(0.1)
        time.sleep(wait_s)  # 1 s: the window is up and its event loop runs
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "QThread: Destroyed" not in err and "Traceback" not in err, err
    assert proc.returncode == 0, err
    assert "quit" in log.read_text(encoding="utf-8").splitlines()[-1]


# ------------------------------------------------------------------ integer typed weights
@pytest.fixture
def int32_pair(tiny_root, tmp_path):
    """(tiny target, its drafter, a copy of the target with int32 weights)."""
    import shutil

    import mlx.core as mx

    from app.models.tiny import build_tiny_pair

    t_dir, d_dir = build_tiny_pair(tiny_root, "qwen3", seed=0, block_size=16)
    bad = tmp_path / "int32-target"
    shutil.copytree(t_dir, bad)
    weights = mx.load(str(bad / "model.safetensors"))
    mx.save_safetensors(str(bad / "model.safetensors"),
                        {k: (v * 100).astype(mx.int32) for k, v in weights.items()})
    return t_dir, d_dir, bad


def test_the_cli_exits_2_naming_int32_weights(capsys, int32_pair):
    from app.cli import main

    _, _, bad = int32_pair
    code = main(["chat", "--prompt", "x", "--max-tokens", "2", "--mode", "plain",
                 "--model", str(bad)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    assert "int32 weights" in err and str(bad) in err


def test_the_window_says_int32_weights_failed_to_load_and_keeps_the_pair(qtbot, qs,
                                                                        int32_pair):
    """A failed load: the banner names the folder and the dtype, and the pair loaded before
    still replies."""
    from app.chat.session import ChatSession

    t_dir, d_dir, bad = int32_pair
    win = make_window(qtbot, qs, ChatSession())
    try:
        win.load_model(str(t_dir), str(d_dir))
        qtbot.waitUntil(lambda: win.model is not None, timeout=60_000)
        before = win.model
        with qtbot.waitSignal(win.loadFailed, timeout=60_000) as blocker:
            win.load_model(str(bad), "")
        assert "int32 weights" in blocker.args[0] and str(bad) in blocker.args[0]
        assert any("int32 weights" in t for t in shown_messages(win))
        assert win.model is before
        reply = send_and_wait(qtbot, win, mode="dflash")
        assert reply.version is not None and reply.version.result.tokens
    finally:
        win.shutdown()


# ------------------------------------------------------------------ huge chats in the view
def _export_of(contents: list[str]) -> dict:
    """tools/bench_huge_chat.py's export of one line of turns with ``contents`` as texts."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from bench_huge_chat import export_of

    return export_of(contents)


def test_an_imported_30_mb_line_is_cut_in_the_view_and_kept_whole(qtbot, qs, tmp_path):
    """A reply of 30 MB on one line (and a 1 MB prompt without a line break): the window
    opens with that store and draws the start of each with a note saying how much is not
    shown; the store, Copy all and Export keep every character."""
    import json

    from PySide6.QtGui import QGuiApplication

    from app.chat.turns import ViewStore
    from app.ui.render import VIEW_LINE_CHARS, VIEW_MESSAGE_CHARS

    reply = "word " * 6_000_000  # 30 MB, one line
    prompt = "q" * 1_000_000
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(_export_of([prompt, reply])), encoding="utf-8")
    store = ViewStore(tmp_path / "c.db")
    win = make_window(qtbot, qs, ScriptedSession(), store)
    try:
        assert win.conversations.import_chat(str(path))
    finally:
        win.shutdown()
    store = ViewStore(tmp_path / "c.db")  # a store holding that chat: the window opens
    win = make_window(qtbot, qs, ScriptedSession(), store)
    try:
        assert win.conv is not None and win.conv.title == "Huge"
        doc = win.chat.document()
        assert doc.characterCount() < 2 * VIEW_LINE_CHARS + 3_000  # each line cut in the view
        shown = win.chat.toPlainText()
        assert f"… {len(reply) - VIEW_LINE_CHARS:,} more characters not shown here" in shown
        assert f"… {len(prompt) - VIEW_LINE_CHARS:,} more characters not shown here" in shown
        assert "word word word" in shown and "qqqq" in shown
        rows = store.db.messages(win.conv.id)  # the store keeps every character
        assert [len(m.content) for m in rows] == [len(prompt), len(reply)]
        win.chat._on_anchor(QUrl("copymsg:1"))  # the note's Copy all
        assert QGuiApplication.clipboard().text() == reply
        win.chat._on_anchor(QUrl("copymsg:0"))
        assert QGuiApplication.clipboard().text() == prompt
        out = tmp_path / "out.md"
        assert win.conversations.export_chat(str(out))
        assert reply.strip() in out.read_text(encoding="utf-8")
        assert win.chat.full_text("copymsg:1") == reply and VIEW_MESSAGE_CHARS < len(reply)
    finally:
        win.shutdown()


@pytest.mark.slow  # left to make test (CI): make test-fast stays under 5 minutes
def test_a_chat_of_200000_messages_opens_with_its_latest_turns(qtbot, qs, tmp_path):
    """The window opens with a store holding a chat of 200,000 messages: it loads the latest
    turns, draws the last ones with a "Show earlier messages" link, and each click draws
    earlier turns, loading them from the store when needed."""
    from app.chat.turns import LOAD_TURNS, ViewStore
    from app.ui.chat import VIEW_TURNS

    n = 200_000
    _long_chat(tmp_path / "c.db", n)
    store = ViewStore(tmp_path / "c.db")
    win = make_window(qtbot, qs, ScriptedSession(), store)

    def drawn(i: int) -> bool:  # a reply's number is shown with thousands separators
        return f"text {i}\n" in win.chat.toPlainText() + "\n" or \
            f"text {i:,}\n" in win.chat.toPlainText() + "\n"

    try:
        assert win.conv.title == "Very long"
        assert len(win.conv.messages) == LOAD_TURNS and win.conv.earlier == n - LOAD_TURNS
        assert drawn(n - 1) and drawn(n - VIEW_TURNS) and not drawn(n - VIEW_TURNS - 1)
        shown = win.chat.toPlainText()
        assert f"{n - VIEW_TURNS:,} earlier messages not shown" in shown
        win._on_chat_link("earlier:")  # loaded already: drawn
        assert win.chat.first_shown == LOAD_TURNS - 2 * VIEW_TURNS
        assert drawn(n - 2 * VIEW_TURNS) and not drawn(n - 2 * VIEW_TURNS - 1)
        assert f"{n - 2 * VIEW_TURNS:,} earlier messages not shown" in win.chat.toPlainText()
        win.chat.earlier_steps = LOAD_TURNS // VIEW_TURNS - 1  # every loaded turn drawn
        win.chat.render(win.conv)
        assert win.chat.first_shown == 0
        win._on_chat_link("earlier:")  # loaded from the store
        assert len(win.conv.messages) == 2 * LOAD_TURNS
        assert win.conv.earlier == n - 2 * LOAD_TURNS
        assert drawn(n - LOAD_TURNS - VIEW_TURNS)
        assert not drawn(n - LOAD_TURNS - VIEW_TURNS - 1)
        shown = win.chat.toPlainText()
        assert f"{n - LOAD_TURNS - VIEW_TURNS:,} earlier messages not shown" in shown
        assert win.chat.document().characterCount() < 60 * (LOAD_TURNS + VIEW_TURNS)
    finally:
        win.shutdown()


def _long_chat(path, n: int) -> None:
    """A database at ``path`` with one chat of ``n`` short messages ("text i"), written
    straight (as an import stores them, only faster)."""
    from app.chat.storage import Store

    with Store(path) as s:
        conv = s.new_conversation("Very long")
        first = s.add_message(conv.id, "user", "text 0").id
        with s.transaction():
            s._db.executemany(
                "INSERT INTO messages (id, conversation_id, parent_id, role, content, mode, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 1.0, 1.0)",
                [(first + i, conv.id, first + i - 1, "user" if i % 2 == 0 else "assistant",
                  f"text {i}", None if i % 2 == 0 else "plain") for i in range(1, n)])


def test_a_reply_in_a_chat_loaded_in_part_keeps_the_view_in_step(qtbot, qs, tmp_path):
    """A chat longer than the turns loaded: a reply adds its two turns to the view, which
    keeps the live result and the turns it had (the store read back as many)."""
    from app.chat.turns import LOAD_TURNS, ViewStore

    _long_chat(tmp_path / "c.db", 2 * LOAD_TURNS + 10)
    win = make_window(qtbot, qs, ScriptedSession(), ViewStore(tmp_path / "c.db"))
    try:
        win._on_chat_link("earlier:")
        load_scripted(qtbot, win)
        before = len(win.conv.messages), win.conv.earlier
        assert before == (LOAD_TURNS, LOAD_TURNS + 10)
        reply = send_and_wait(qtbot, win, mode="plain")
        assert (len(win.conv.messages), win.conv.earlier) == (before[0] + 2, before[1])
        assert win.conv.messages[-1] is reply and reply.version.result.summary is not None
        assert win.conv.messages[-2].content == PROMPT and PROMPT in win.chat.toPlainText()
    finally:
        win.shutdown()


def test_the_view_cuts_only_long_messages_and_long_lines():
    """``cut_for_view``: a usual long reply comes back whole; a long line is cut to its
    first characters and a long message to its start, with the count of those left out."""
    from app.ui.render import VIEW_LINE_CHARS, VIEW_MESSAGE_CHARS, cut_for_view

    usual = "A paragraph of a long reply, as a model writes it.\n\n" * 600  # 31,200 chars
    assert cut_for_view(usual) == (usual, 0)
    line = "x" * (VIEW_LINE_CHARS + 5)
    shown, cut = cut_for_view(f"before\n{line}\nafter")
    assert shown == f"before\n{'x' * VIEW_LINE_CHARS}\nafter" and cut == 5
    many = "y" * 99 + "\n"
    text = many * (2 * VIEW_MESSAGE_CHARS // len(many))
    shown, cut = cut_for_view(text)
    assert VIEW_MESSAGE_CHARS - 1 <= len(shown) <= VIEW_MESSAGE_CHARS  # up to a line's end
    assert text.startswith(shown) and cut == len(text) - len(shown)


def test_a_huge_compare_side_without_token_texts_is_cut_in_the_view():
    """A Compare side shown from its stored text (an imported turn, no token texts): its
    start, with the count of characters not shown."""
    from app.chat.turns import ReplyResult
    from app.ui.compare import text_sections_html
    from app.ui.render import VIEW_LINE_CHARS

    side = ReplyResult(mode="plain", content="z" * 5_000_000)
    out = text_sections_html(side, {})
    assert len(out) < VIEW_LINE_CHARS + 1_000
    assert f"… {5_000_000 - VIEW_LINE_CHARS:,} more characters not shown here" in out
