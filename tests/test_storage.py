"""Conversation storage: round trip, migrations, crash safety, versions and branches."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from app.chat.storage import (
    SCHEMA_VERSION,
    ConversationNotFoundError,
    SchemaTooNewError,
    StorageError,
    Store,
    _prompt_dicts,
    auto_title,
    default_db_path,
)
from app.engine.events import Summary

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "data" / "conversations.db"


def _summary() -> dict:
    return Summary(
        mode="dflash",
        prompt_tokens=31,
        generated_tokens=5,
        ttft_s=0.25,
        tok_per_s=42.5,
        cycles=2,
        drafted=14,
        accepted=3,
        acceptance_rate=3 / 14,
        tau=2.5,
        replays=1,
        stop_cause="end_token",
        accepted_lengths=[2, 1],
    ).to_dict()


def test_every_field_survives_a_reopen(db):
    with Store(db) as s:
        conv = s.new_conversation(
            target_path="mlx-community/Qwen3.5-4B-4bit",
            drafter_path="/models/Qwen3.5-4B-DFlash",
            settings={"temperature": 0.0, "enable_thinking": False, "context_limit": 4096},
            system_prompt="You are terse.",
        )
        user = s.add_message(conv.id, "user", "What time is it in Paris?")
        reply = s.add_message(
            conv.id,
            "assistant",
            "Let me check.",
            reasoning="The user wants the time; call the tool.",
            tool_calls=[{"id": "call_0", "name": "current_time",
                         "arguments": {"timezone": "Europe/Paris"}}],
            mode="dflash",
            block_size=8,
            rollback="tape",
            generation={"max_tokens": 256, "temperature": 0.0},
            summary=_summary(),
            token_ids=[11, 22, 33, 44, 55],
            from_draft=[False, True, True, False, True],
            finish_reason="tool_calls",
            status="stopped",
            compare_group="g1",
        )
        tool = s.add_message(
            conv.id, "tool", "14:05", tool_call_id="call_0", name="current_time"
        )
        failed = s.add_message(
            conv.id, "assistant", "", mode="plain", status="error", error="out of memory"
        )
        ids = (user.id, reply.id, tool.id, failed.id)

    with Store(db) as s:
        c = s.get_conversation(conv.id)
        assert c.title == "What time is it in Paris?"
        assert (c.target_path, c.drafter_path) == (
            "mlx-community/Qwen3.5-4B-4bit", "/models/Qwen3.5-4B-DFlash"
        )
        assert c.settings == {"temperature": 0.0, "enable_thinking": False, "context_limit": 4096}
        path = s.active_path(conv.id)
        assert [m.role for m in path] == ["system", "user", "assistant", "tool", "assistant"]
        assert path[0].content == "You are terse."
        assert [m.id for m in path[1:]] == list(ids)
        r = path[2]
        assert r.content == "Let me check."
        assert r.reasoning == "The user wants the time; call the tool."
        assert r.tool_calls == [{"id": "call_0", "name": "current_time",
                                 "arguments": {"timezone": "Europe/Paris"}}]
        assert (r.mode, r.block_size, r.rollback) == ("dflash", 8, "tape")
        assert r.generation == {"max_tokens": 256, "temperature": 0.0}
        assert r.summary["acceptance_rate"] == pytest.approx(3 / 14)
        assert r.summary["accepted_lengths"] == [2, 1]
        assert r.summary["stop_cause"] == "end_token"
        assert r.token_ids == [11, 22, 33, 44, 55]
        assert r.from_draft == [False, True, True, False, True]
        assert (r.finish_reason, r.status, r.compare_group) == ("tool_calls", "stopped", "g1")
        t = path[3]
        assert (t.content, t.tool_call_id, t.name) == ("14:05", "call_0", "current_time")
        f = path[4]
        assert (f.status, f.error, f.mode) == ("error", "out of memory", "plain")
        assert r.parent_id == path[1].id and t.parent_id == r.id
        assert path[0].created_at <= r.created_at <= f.created_at

        prompt = _prompt_dicts(s.active_path(conv.id))
        # the failed reply is not sent; tool calls are in the chat-template form
        assert [m["role"] for m in prompt] == ["system", "user", "assistant", "tool"]
        assert prompt[2]["reasoning_content"] == "The user wants the time; call the tool."
        assert prompt[2]["tool_calls"] == [{
            "id": "call_0", "type": "function",
            "function": {"name": "current_time", "arguments": {"timezone": "Europe/Paris"}},
        }]
        assert prompt[3] == {"role": "tool", "content": "14:05", "tool_call_id": "call_0",
                             "name": "current_time"}


def test_wal_mode_and_schema_version(db):
    with Store(db) as s:
        assert s.schema_version == SCHEMA_VERSION == 3
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(3,)]
    con.close()


V1_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (1);
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL, updated_at REAL NOT NULL, target_path TEXT, drafter_path TEXT,
    settings TEXT NOT NULL DEFAULT '{}');
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL, content TEXT NOT NULL DEFAULT '', reasoning TEXT NOT NULL DEFAULT '',
    tool_calls TEXT NOT NULL DEFAULT '[]', tool_call_id TEXT, name TEXT, mode TEXT,
    block_size INTEGER, rollback TEXT, summary TEXT, token_ids TEXT NOT NULL DEFAULT '[]',
    from_draft TEXT NOT NULL DEFAULT '', finish_reason TEXT,
    status TEXT NOT NULL DEFAULT 'complete', created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE INDEX messages_conversation ON messages(conversation_id, id);
INSERT INTO conversations VALUES (1, 'Old chat', 100.0, 200.0, '/t', '/d', '{"top_p": 0.9}');
INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, updated_at)
    VALUES (1, 1, NULL, 'user', 'hello there', 100.0, 100.0);
INSERT INTO messages (id, conversation_id, parent_id, role, content, mode, token_ids,
    from_draft, status, summary, created_at, updated_at)
    VALUES (2, 1, 1, 'assistant', 'first answer', 'plain', '[5,6]', '00', 'complete',
    '{"tok_per_s": 10.0}', 110.0, 110.0);
INSERT INTO messages (id, conversation_id, parent_id, role, content, mode, block_size,
    rollback, token_ids, from_draft, status, created_at, updated_at)
    VALUES (3, 1, 1, 'assistant', 'second answer', 'dflash', 16, 'replay', '[7,8,9]', '011',
    'generating', 120.0, 130.0);
INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, updated_at)
    VALUES (4, 1, 3, 'user', 'thanks', 140.0, 140.0);
"""


def test_migration_from_v1(db):
    db.parent.mkdir(parents=True)
    con = sqlite3.connect(db)
    con.executescript(V1_SCHEMA)
    con.commit()
    con.close()

    with Store(db) as s:
        assert s.schema_version == SCHEMA_VERSION
        c = s.get_conversation(1)
        assert (c.title, c.created_at, c.updated_at) == ("Old chat", 100.0, 200.0)
        assert (c.target_path, c.drafter_path, c.settings) == ("/t", "/d", {"top_p": 0.9})
        assert c.title_auto is True and c.active_root_id == 1
        # v1 always followed the newest version: the migration stores that choice
        assert [m.id for m in s.active_path(1)] == [1, 3, 4]
        second = s.get_message(3)
        assert (second.mode, second.block_size, second.rollback) == ("dflash", 16, "replay")
        assert second.token_ids == [7, 8, 9] and second.from_draft == [False, True, True]
        # a v1 row left generating has no writer: it is interrupted, its text kept
        assert second.status == "interrupted" and second.content == "second answer"
        assert s.get_message(2).summary == {"tok_per_s": 10.0}
        assert [v.id for v in s.versions(3)] == [2, 3]
        s.set_active(2)
        assert [m.id for m in s.active_path(1)] == [1, 2]
        # the new columns work on migrated rows
        s.add_message(1, "user", "again")
    with Store(db) as s:
        assert [m.content for m in s.active_path(1)] == ["hello there", "first answer", "again"]


def test_newer_schema_and_foreign_files_are_left_untouched(db, tmp_path):
    with Store(db) as s:
        s.new_conversation("keep me")
    con = sqlite3.connect(db)
    con.execute("UPDATE schema_version SET version = 99")
    con.commit()
    con.close()
    before = db.read_bytes()
    with pytest.raises(SchemaTooNewError, match="newer DFlash Chat"):
        Store(db)
    assert db.read_bytes() == before

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StorageError, match="cannot use .*junk.db as the conversation database"):
        Store(junk)
    assert junk.read_bytes() == b"this is not sqlite at all" * 100

    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    before = foreign.read_bytes()
    with pytest.raises(StorageError, match="not a DFlash Chat database"):
        Store(foreign)
    assert foreign.read_bytes() == before


_WRITER = textwrap.dedent(
    """
    import sys, time
    from app.chat.storage import Store
    s = Store(sys.argv[1], partial_interval_s=0.0)
    c = s.new_conversation()
    s.add_message(c.id, "user", "Write forever")
    r = s.begin_reply(c.id, mode="dflash", block_size=8, rollback="tape")
    text, ids, flags = "", [], []
    for i in range(100000):
        text += f"w{i} "
        ids.append(i)
        flags.append(i % 2 == 1)
        s.update_partial(r.id, content=text, token_ids=ids, from_draft=flags)
        print(i + 1, flush=True)
        time.sleep(0.005)
    """
)


def test_writer_killed_mid_reply_leaves_interrupted_partial(db):
    db.parent.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        written = 0
        deadline = time.monotonic() + 60
        while written < 8 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            written = int(line)
        assert written >= 8, "the writer process did not write its partials"
        # while it runs, another store sees the reply as generating (its writer is alive)
        with Store(db) as live:
            conv = live.list_conversations()[0]
            assert live.active_path(conv.id)[-1].status == "generating"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    with Store(db) as s:
        conv = s.list_conversations()[0]
        reply = s.active_path(conv.id)[-1]
        assert reply.status == "interrupted"
        n = len(reply.token_ids)
        assert n >= written  # everything reported as written is there
        assert reply.token_ids == list(range(n))
        assert reply.from_draft == [i % 2 == 1 for i in range(n)]
        assert reply.content == "".join(f"w{i} " for i in range(n))
        # an interrupted reply is still part of the prompt, as far as it got
        assert _prompt_dicts(s.active_path(conv.id))[-1]["content"] == reply.content


def test_reader_in_another_connection_sees_only_whole_writes(db):
    s = Store(db, partial_interval_s=0.0)
    conv = s.new_conversation()
    s.add_message(conv.id, "user", "count")
    reply = s.begin_reply(conv.id, mode="plain")
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def read():
        con = sqlite3.connect(db, timeout=10)
        try:
            while not stop.is_set():
                content, ids = con.execute(
                    "SELECT content, token_ids FROM messages WHERE id = ?", (reply.id,)
                ).fetchone()
                n = len(json.loads(ids))
                if content != "x" * n:
                    raise AssertionError(f"torn read: {len(content)} chars, {n} tokens")
                seen.append(n)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            con.close()

    reader = threading.Thread(target=read)
    reader.start()
    for n in range(1, 151):
        s.update_partial(reply.id, content="x" * n, token_ids=list(range(n)))
    s.finish_reply(reply.id, content="x" * 151, token_ids=list(range(151)))
    time.sleep(0.05)
    stop.set()
    reader.join(10)
    s.close()
    assert not errors, errors
    assert len(seen) > 1
    assert seen == sorted(seen)  # never goes backwards
    assert seen[-1] == 151


def test_partials_are_throttled_and_flushed(db):
    s = Store(db, partial_interval_s=60.0)
    conv = s.new_conversation()
    s.add_message(conv.id, "user", "hi")
    reply = s.begin_reply(conv.id, mode="plain")
    other = sqlite3.connect(db)

    def stored() -> str:
        return other.execute("SELECT content FROM messages WHERE id = ?", (reply.id,)).fetchone()[0]

    assert s.update_partial(reply.id, content="a") is True
    assert s.update_partial(reply.id, content="ab") is False
    assert s.update_partial(reply.id, content="abc") is False
    assert stored() == "a"
    assert s.update_partial(reply.id, content="abcd", force=True) is True
    assert stored() == "abcd"
    s.update_partial(reply.id, content="abcde", token_ids=[1, 2])
    assert stored() == "abcd"
    s.close()  # flushes what was held back; the unfinished reply is interrupted
    row = other.execute(
        "SELECT content, token_ids, status FROM messages WHERE id = ?", (reply.id,)
    ).fetchone()
    assert row == ("abcde", "[1,2]", "interrupted")
    other.close()


def test_live_writer_is_not_marked_interrupted(db):
    a = Store(db)
    conv = a.new_conversation()
    a.add_message(conv.id, "user", "hi")
    reply = a.begin_reply(conv.id, mode="plain")
    with Store(db) as b:  # same process: the writer is alive
        assert b.get_message(reply.id).status == "generating"
    with Store(db) as b:  # closing another store leaves a's reply alone
        assert b.get_message(reply.id).status == "generating"
    final = a.finish_reply(reply.id, content="done", status="stopped", finish_reason="cancelled")
    assert (final.status, final.content, final.finish_reason) == ("stopped", "done", "cancelled")
    a.close()
    with Store(db) as c:
        assert c.get_message(reply.id).status == "stopped"


def test_regenerate_keeps_both_versions_and_switches(db):
    with Store(db) as s:
        conv = s.new_conversation()
        u = s.add_message(conv.id, "user", "Name a colour")
        v1 = s.begin_reply(conv.id, mode="plain")
        s.finish_reply(v1.id, content="red", token_ids=[1])
        v2 = s.regenerate(v1.id, mode="dflash", block_size=4, rollback="replay")
        assert v2.parent_id == u.id and v2.status == "generating"
        # the prompt for the new version ends at the user message
        assert _prompt_dicts(s.active_path(conv.id))[-1] == {"role": "user",
                                                          "content": "Name a colour"}
        s.finish_reply(v2.id, content="blue", token_ids=[2], from_draft=[True])
        assert [m.content for m in s.active_path(conv.id)] == ["Name a colour", "blue"]
        assert [v.content for v in s.versions(v2.id)] == ["red", "blue"]
        s.set_active(v1.id)
    with Store(db) as s:
        assert [m.content for m in s.active_path(conv.id)] == ["Name a colour", "red"]
        blue = s.versions(v1.id)[1]
        assert (blue.mode, blue.block_size, blue.rollback, blue.from_draft) == (
            "dflash", 4, "replay", [True]
        )


def test_edit_and_rerun_drops_later_turns_from_prompt_not_storage(db):
    with Store(db) as s:
        conv = s.new_conversation(system_prompt="sys")
        u1 = s.add_message(conv.id, "user", "first question")
        s.add_message(conv.id, "assistant", "first answer", mode="plain")
        s.add_message(conv.id, "user", "second question")
        a2 = s.add_message(conv.id, "assistant", "second answer", mode="plain")

        edited = s.edit_user_message(u1.id, "first question, edited")
        assert _prompt_dicts(s.active_path(conv.id)) == [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first question, edited"},
        ]
        rerun = s.begin_reply(conv.id, mode="dflash", block_size=8, rollback="tape")
        assert rerun.parent_id == edited.id
        s.finish_reply(rerun.id, content="new answer")
        assert [m["content"] for m in _prompt_dicts(s.active_path(conv.id))] == [
            "sys", "first question, edited", "new answer"
        ]
        # nothing was deleted: the old branch is stored and can be brought back
        contents = [m.content for m in s.messages(conv.id)]
        assert {"first answer", "second question", "second answer"} <= set(contents)
        assert [v.content for v in s.versions(edited.id)] == [
            "first question", "first question, edited"
        ]
        # a reply's own prompt does not depend on the active path
        assert [m["content"] for m in s.prompt_for_reply(a2.id)] == [
            "sys", "first question", "first answer", "second question"
        ]
        s.set_active(a2.id)
        assert [m["content"] for m in _prompt_dicts(s.active_path(conv.id))] == [
            "sys", "first question", "first answer", "second question", "second answer"
        ]
        # the title came from the first prompt and did not follow the edit
        assert s.get_conversation(conv.id).title == "first question"


def test_compare_turn_stores_both_and_the_choice(db):
    with Store(db) as s:
        conv = s.new_conversation()
        s.add_message(conv.id, "user", "Compare me")
        plain, dflash = s.begin_compare(conv.id, block_size=16, rollback="tape",
                                        generation={"max_tokens": 64})
        assert plain.compare_group == dflash.compare_group is not None
        assert (plain.mode, dflash.mode, dflash.block_size) == ("plain", "dflash", 16)
        assert _prompt_dicts(s.active_path(conv.id))[-1]["role"] == "user"
        assert s.prompt_for_reply(plain.id) == s.prompt_for_reply(dflash.id) == [
            {"role": "user", "content": "Compare me"}
        ]
        s.finish_reply(plain.id, content="P", token_ids=[3, 4])
        s.finish_reply(dflash.id, content="P", token_ids=[3, 4], from_draft=[False, True])
        assert s.active_path(conv.id)[-1].id == dflash.id
        assert [m.id for m in s.compare_siblings(dflash.id)] == [plain.id]
        s.set_active(plain.id)
        follow = s.add_message(conv.id, "user", "go on")
        assert follow.parent_id == plain.id
    with Store(db) as s:
        path = s.active_path(conv.id)
        assert [m.id for m in path[-2:]] == [plain.id, follow.id]
        assert s.get_message(dflash.id).from_draft == [False, True]


def test_update_generation_merges_into_the_record_and_survives_a_reopen(db):
    with Store(db) as s:
        conv = s.new_conversation()
        s.add_message(conv.id, "user", "Hi")
        reply = s.begin_reply(conv.id, mode="dflash", block_size=16,
                              generation={"max_tokens": 64, "temperature": 0.0})
        s.finish_reply(reply.id, content="Hello")
        got = s.update_generation(reply.id, {"speedup": {"ratio": 1.5}})
        assert got.generation == {"max_tokens": 64, "temperature": 0.0,
                                  "speedup": {"ratio": 1.5}}
        assert got.status == "complete" and got.content == "Hello"
    with Store(db) as s:
        assert s.get_message(reply.id).generation["speedup"] == {"ratio": 1.5}
        with pytest.raises(StorageError):
            s.update_generation(reply.id + 100, {"speedup": None})


def test_titles_rename_search_list_delete(db):
    clock = iter(float(t) for t in range(1000, 2000))
    with Store(db, clock=lambda: next(clock)) as s:
        a = s.new_conversation()
        assert s.get_conversation(a.id).title == ""
        s.add_message(a.id, "user", "\n  Plan a   trip to Lyon in spring, with trains\nand more")
        assert s.get_conversation(a.id).title == "Plan a trip to Lyon in spring, with trains"
        s.add_message(a.id, "assistant", "Take the TGV from Paris; 100% worth it.")
        b = s.new_conversation("Explicit title")
        s.add_message(b.id, "user", "Something about 50%_off")
        assert s.get_conversation(b.id).title == "Explicit title"
        assert [c.id for c in s.list_conversations()] == [b.id, a.id]

        hits = s.search("tgv")
        assert [(h.conversation_id, h.role) for h in hits] == [(a.id, "assistant")]
        assert "TGV" in hits[0].snippet
        assert [h.conversation_id for h in s.search("EXPLICIT")] == [b.id]
        assert [h.message_id is None for h in s.search("EXPLICIT")] == [True]
        # LIKE wildcards in the query are literal
        assert [h.conversation_id for h in s.search("%_off")] == [b.id]
        assert s.search("0%_") == [s.search("50%_off")[0]]
        assert s.search("   ") == []

        renamed = s.rename(a.id, "  Lyon   trip ")
        assert (renamed.title, renamed.title_auto) == ("Lyon trip", False)
        with pytest.raises(ValueError, match="empty"):
            s.rename(a.id, "   ")
        s.delete_conversation(b.id)
        assert [c.id for c in s.list_conversations()] == [a.id]
        assert s.search("50%") == []
        with pytest.raises(ConversationNotFoundError, match=f"no conversation with id {b.id}"):
            s.get_conversation(b.id)
        with pytest.raises(ConversationNotFoundError):
            s.delete_conversation(b.id)


def test_auto_title_cuts_long_prompts_at_a_word():
    long = "word " * 40
    title = auto_title(long, limit=30)
    assert len(title) <= 30 and title.endswith("\u2026")
    assert title[:-1].split() == ["word"] * len(title[:-1].split())
    assert auto_title("\n\n  Hello\nworld") == "Hello"


def test_bad_values_are_refused_with_clear_errors(db):
    with Store(db) as s:
        conv = s.new_conversation()
        with pytest.raises(ValueError, match="unknown role 'robot'"):
            s.add_message(conv.id, "robot", "beep")
        with pytest.raises(ValueError, match="2 flags for 3 token ids"):
            s.add_message(conv.id, "assistant", "x", token_ids=[1, 2, 3], from_draft=[True, False])
        with pytest.raises(ValueError, match="unknown mode 'fast'"):
            s.begin_reply(conv.id, mode="fast")
        other = s.new_conversation()
        m = s.add_message(other.id, "user", "elsewhere")
        with pytest.raises(ValueError, match="belongs to conversation"):
            s.add_message(conv.id, "assistant", "x", parent_id=m.id)
        with pytest.raises(ValueError, match="not a reply"):
            s.regenerate(m.id, mode="plain")
        assert s.messages(conv.id) == []


def test_default_path_follows_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_DATA_DIR", str(tmp_path / "elsewhere"))
    assert default_db_path() == tmp_path / "elsewhere" / "conversations.db"
    with Store.open_default() as s:
        s.new_conversation("x")
    assert (tmp_path / "elsewhere" / "conversations.db").is_file()


def test_a_real_generation_round_trips_with_its_highlighting(db, tiny_hybrid):
    """Generate with the engine on a tiny random pair, store each token through
    ``update_partial`` and the end through ``finish_reply``, reopen: token ids, drafter flags and
    figures are those the engine emitted."""
    from app.engine.events import Done, TokenEvent
    from app.engine.generate import GenerationConfig, generate

    target, drafter = tiny_hybrid
    with Store(db, partial_interval_s=0.0) as s:
        conv = s.new_conversation(target_path=str(target.path), drafter_path=str(drafter.path),
                                  system_prompt="You are terse.")
        s.add_message(conv.id, "user", "The capital of France is")
        emitted: dict[str, list] = {}
        for mode in ("dflash", "plain"):
            path = s.active_path(conv.id)
            reply = (s.begin_reply(conv.id, mode=mode, block_size=8, rollback="tape")
                     if path[-1].role == "user" else s.regenerate(path[-1].id, mode=mode))
            prompt = target.tokenizer.apply_chat_template(
                s.prompt_for_reply(reply.id), add_generation_prompt=True, tokenize=True
            )
            config = GenerationConfig(mode=mode, max_tokens=20, block_size=8)
            tokens = []
            for ev in generate(target, prompt, config, drafter if mode == "dflash" else None):
                if isinstance(ev, TokenEvent):
                    tokens.append(ev)
                    s.update_partial(
                        reply.id, content=target.tokenizer.decode([t.token_id for t in tokens]),
                        token_ids=[t.token_id for t in tokens],
                        from_draft=[t.from_draft for t in tokens],
                    )
                elif isinstance(ev, Done):
                    summary = ev.summary
                    s.finish_reply(reply.id, summary=summary.to_dict(),
                                   finish_reason=summary.stop_cause)
            emitted[mode] = tokens
            assert summary.stop_cause in ("end_token", "length")
        dflash_id, plain_id = [v.id for v in s.versions(reply.id)]

    with Store(db) as s:
        d, p = s.get_message(dflash_id), s.get_message(plain_id)
        assert d.token_ids == [e.token_id for e in emitted["dflash"]]
        assert d.from_draft == [e.from_draft for e in emitted["dflash"]]
        assert p.token_ids == [e.token_id for e in emitted["plain"]]
        assert not any(p.from_draft)
        assert d.summary["mode"] == "dflash" and d.summary["cycles"] >= 1
        assert d.summary["generated_tokens"] == len(d.token_ids)
        assert d.status == p.status == "complete"
        # greedy DFlash equals greedy plain, token for token, and both versions are kept
        assert d.token_ids == p.token_ids
        assert s.active_path(conv.id)[-1].id == plain_id
