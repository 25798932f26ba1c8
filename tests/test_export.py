"""Markdown and JSON export, JSON import: import(export(x)) == x."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from app.chat.export import (
    ImportFormatError,
    export_json,
    export_json_text,
    export_markdown,
    import_json,
    parse_json,
    write_export,
)
from app.chat.storage import Store
from app.engine.events import Summary


def build(store: Store) -> int:
    """A conversation using every feature: system prompt, tools, reasoning, regenerated and
    compared replies, an edited user message with its old branch, statuses."""
    conv = store.new_conversation(
        target_path="/models/target",
        drafter_path="/models/drafter",
        settings={"temperature": 0.7, "system_prompt": "Be kind.", "nested": {"a": [1, 2]}},
        system_prompt="Be kind.",
    )
    u1 = store.add_message(conv.id, "user", "What time is it in Tōkyō? 🙂")
    r1 = store.begin_reply(conv.id, mode="dflash", block_size=8, rollback="tape",
                           generation={"max_tokens": 128})
    store.update_partial(r1.id, content="Let me", token_ids=[1, 2], from_draft=[False, True])
    store.finish_reply(
        r1.id,
        content="Let me check.",
        reasoning="Need the clock tool.",
        tool_calls=[{"id": "call_0", "name": "current_time",
                     "arguments": {"timezone": "Asia/Tokyo"}}],
        token_ids=[1, 2, 3],
        from_draft=[False, True, True],
        summary=Summary(mode="dflash", generated_tokens=3, tok_per_s=12.5, cycles=1,
                        drafted=7, accepted=2, acceptance_rate=2 / 7, tau=3.0).to_dict(),
        finish_reason="tool_calls",
    )
    store.add_message(conv.id, "tool", '{"time": "21:00"}', tool_call_id="call_0",
                      name="current_time")
    plain, dflash = store.begin_compare(conv.id, block_size=8, rollback="replay")
    store.finish_reply(plain.id, content="It is 21:00.", token_ids=[9, 10])
    store.finish_reply(dflash.id, content="It is 21:00.", token_ids=[9, 10],
                       from_draft=[False, True], status="stopped", finish_reason="cancelled")
    store.set_active(plain.id)
    u2 = store.add_message(conv.id, "user", "Thanks")
    bad = store.begin_reply(conv.id, mode="plain")
    store.finish_reply(bad.id, status="error", error="GenerationError: boom")
    again = store.regenerate(bad.id, mode="plain")
    store.finish_reply(again.id, content="You're welcome!", token_ids=[42])
    store.edit_user_message(u2.id, "Thanks a lot")
    store.begin_reply(conv.id, mode="dflash", block_size=4, rollback="tape")  # left generating
    assert u1.id < u2.id
    return conv.id


def _strip_ids(store: Store, cid: int):
    """Conversation and messages with database ids replaced by creation ranks."""
    conv = store.get_conversation(cid)
    msgs = store.messages(cid)
    rank = {m.id: i for i, m in enumerate(msgs)}
    conv = replace(conv, id=0, active_root_id=rank.get(conv.active_root_id))
    msgs = [
        replace(m, id=rank[m.id], conversation_id=0, parent_id=rank.get(m.parent_id),
                active_child_id=rank.get(m.active_child_id))
        for m in msgs
    ]
    return conv, msgs


def test_import_of_export_equals_original(tmp_path):
    with Store(tmp_path / "a.db") as a, Store(tmp_path / "b.db") as b:
        cid = build(a)
        exported = export_json(a, cid)
        imported = import_json(b, json.loads(json.dumps(exported)))
        # the only change: a reply that was generating when exported comes back interrupted
        generating = [
            i for i, m in enumerate(exported["messages"]) if m["status"] == "generating"
        ]
        assert len(generating) == 1
        exported["messages"][generating[0]]["status"] = "interrupted"
        assert export_json(b, imported.id) == exported
        conv_a, msgs_a = _strip_ids(a, cid)
        conv_b, msgs_b = _strip_ids(b, imported.id)
        assert conv_b == conv_a
        msgs_a[generating[0]].status = "interrupted"
        assert msgs_b == msgs_a
        assert b.messages_for_prompt(imported.id) == a.messages_for_prompt(cid)
        assert [m.content for m in b.active_path(imported.id)] == [
            m.content for m in a.active_path(cid)
        ]
        # and a second round trip changes nothing at all
        again = import_json(b, export_json_text(b, imported.id))
        assert export_json(b, again.id) == exported


def test_export_holds_every_field(tmp_path):
    with Store(tmp_path / "a.db") as s:
        data = export_json(s, build(s))
    assert data["format"] == "dflash-chat.conversation" and data["format_version"] == 1
    c = data["conversation"]
    assert (c["target_path"], c["drafter_path"]) == ("/models/target", "/models/drafter")
    assert c["settings"]["nested"] == {"a": [1, 2]}
    assert c["title"] == "What time is it in Tōkyō? 🙂" and c["title_auto"] is True
    msgs = data["messages"]
    assert [m["id"] for m in msgs] == list(range(1, len(msgs) + 1))
    first_reply = msgs[2]
    assert first_reply["parent"] == 2 and first_reply["reasoning"] == "Need the clock tool."
    assert first_reply["from_draft"] == "011" and first_reply["token_ids"] == [1, 2, 3]
    assert first_reply["summary"]["acceptance_rate"] == pytest.approx(2 / 7)
    assert first_reply["generation"] == {"max_tokens": 128}
    tool = msgs[3]
    assert (tool["role"], tool["tool_call_id"], tool["name"]) == ("tool", "call_0", "current_time")
    plain, dflash = msgs[4], msgs[5]
    assert plain["compare_group"] == dflash["compare_group"] is not None
    assert tool["active_child"] == plain["id"]  # the conversation continues from plain
    assert (dflash["status"], dflash["rollback"]) == ("stopped", "replay")
    errors = [m for m in msgs if m["status"] == "error"]
    assert [m["error"] for m in errors] == ["GenerationError: boom"]


def test_markdown_shows_the_active_path(tmp_path):
    with Store(tmp_path / "a.db") as s:
        cid = build(s)
        md = export_markdown(s, cid)
    assert md.startswith("# What time is it in Tōkyō? 🙂\n")
    assert "target `/models/target`" in md and "drafter `/models/drafter`" in md
    assert "## System\n\nBe kind." in md
    assert "<details><summary>Reasoning</summary>\n\nNeed the clock tool." in md
    assert "**Tool call** `current_time`" in md and '"timezone": "Asia/Tokyo"' in md
    assert "## Tool result · current_time" in md
    assert "DFlash (block 8, tape rollback)" in md
    assert "3 tokens · 12.5 tok/s · acceptance 29% · 3.00 tokens per cycle" in md
    assert "2 of 3 tokens from the drafter" in md
    # the Compare turn shows both replies, the continued one first
    assert md.index("plain decoding · version 1 of 2 · continued") < md.index(
        "DFlash (block 8, replay rollback) · version 2 of 2 · compared"
    )
    assert "stopped" in md
    # the edited message is shown, the branch it replaced is not
    assert "Thanks a lot" in md and "You're welcome!" not in md
    assert "generating" in md  # the reply still running is marked as such


def test_markdown_fences_survive_backticks(tmp_path):
    with Store(tmp_path / "a.db") as s:
        conv = s.new_conversation("code")
        s.add_message(conv.id, "tool", "```\nnested fence\n```", name="t")
        md = export_markdown(s, conv.id)
    assert "````\n```\nnested fence\n```\n````" in md


def test_write_export_picks_the_format_and_imports_from_a_file(tmp_path):
    with Store(tmp_path / "a.db") as s:
        cid = build(s)
        j = write_export(s, cid, tmp_path / "out.json")
        m = write_export(s, cid, tmp_path / "out.md")
        assert json.loads(j.read_text(encoding="utf-8")) == export_json(s, cid)
        assert m.read_text(encoding="utf-8") == export_markdown(s, cid)
        assert not list(tmp_path.glob("*.part"))
        back = import_json(s, j)
        assert export_json(s, back.id)["messages"][0]["content"] == "Be kind."


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: "{not json", "not a JSON file"),
        (lambda d: {**d, "format": "other"}, "not a DFlash Chat conversation export"),
        (lambda d: {**d, "format_version": 7}, "newer DFlash Chat"),
        (lambda d: {**d, "messages": None}, "no 'messages' list"),
        (lambda d: _msg(d, 2, token_ids=[1, "x"]), "message 3: 'token_ids' must be a list"),
        (lambda d: _msg(d, 2, from_draft="01x"), "message 3: 'from_draft'"),
        (lambda d: _msg(d, 0, role=5), "message 1: 'role' should be str, not int"),
        (lambda d: _msg(d, 1, parent=99), "does not come before it"),
        (lambda d: _msg(d, 1, role="wizard"), "unknown role 'wizard'"),
        (lambda d: _msg(d, 1, id=1), "appears twice"),
        (lambda d: {**d, "conversation": {**d["conversation"], "active_root": 99}},
         "active first message 99"),
    ],
)
def test_bad_imports_are_refused_and_store_nothing(tmp_path, mutate, message):
    with Store(tmp_path / "a.db") as s:
        good = export_json(s, build(s))
        before = len(s.list_conversations())
        with pytest.raises(ImportFormatError, match=message):
            import_json(s, mutate(copy.deepcopy(good)))
        assert len(s.list_conversations()) == before


def _msg(data: dict, index: int, **changes) -> dict:
    data["messages"][index].update(changes)
    return data


def test_parse_json_reads_without_storing():
    data = {
        "format": "dflash-chat.conversation",
        "format_version": 1,
        "conversation": {"title": "t", "created_at": 1.0, "updated_at": 2.0},
        "messages": [{"id": 1, "role": "user", "content": "hi"}],
    }
    conv, msgs = parse_json(json.dumps(data))
    assert (conv.title, conv.title_auto, conv.settings) == ("t", False, {})
    assert (msgs[0].role, msgs[0].content, msgs[0].created_at) == ("user", "hi", 1.0)
    assert msgs[0].status == "complete" and msgs[0].parent_id is None


def test_markdown_of_a_tool_reply_has_every_round_and_the_tool_result(tmp_path):
    """A reply that called a tool is stored as one row whose ``rounds`` hold the first round
    (its reasoning and call) and whose ``tool_calls`` carry the results: the Markdown shows the
    reasoning of both rounds, the call's result, and says which figures are the last round's
    (found exporting a demo-pair chat: only the last round's reasoning, no result, and "55 of 59
    tokens from the drafter" under "110 tokens")."""
    first = "I need the clock in Anchorage, so I call current_time."
    last = "I report the time and date from the result."
    result = {"timezone": "America/Anchorage", "time": "06:39:34"}
    with Store(tmp_path / "a.db") as s:
        conv = s.new_conversation("tools")
        s.add_message(conv.id, "user", "What is the local time in Anchorage?")
        r = s.begin_reply(conv.id, mode="dflash", block_size=16, rollback="tape")
        s.finish_reply(
            r.id, content="It is 06:39:34 in Anchorage.", reasoning=last,
            tool_calls=[{"id": "call_0", "name": "current_time",
                         "arguments": {"timezone": "America/Anchorage"}, "result": result,
                         "error": None, "duration_s": 0.008}],
            token_ids=[1, 2, 3, 4], from_draft=[False, True, True, True],
            summary=Summary(mode="dflash", generated_tokens=9, tok_per_s=300.0, cycles=2,
                            drafted=30, accepted=7, acceptance_rate=7 / 30, tau=4.0).to_dict(),
            rounds=[{"role": "assistant", "content": "", "reasoning_content": first,
                     "tool_calls": [{"id": "call_0", "type": "function", "function": {
                         "name": "current_time",
                         "arguments": {"timezone": "America/Anchorage"}}}]},
                    {"role": "tool", "tool_call_id": "call_0", "name": "current_time",
                     "content": json.dumps({"ok": True, "result": result})},
                    {"role": "assistant", "content": "It is 06:39:34 in Anchorage.",
                     "reasoning_content": last}])
        md = export_markdown(s, conv.id)
    assert f"<details><summary>Reasoning</summary>\n\n{first}\n\n{last}\n\n</details>" in md
    assert "**Tool call** `current_time`" in md and '"timezone": "America/Anchorage"' in md
    assert "**Result**" in md and '"time": "06:39:34"' in md
    assert "9 tokens · 300.0 tok/s" in md
    assert "last round: 3 of 4 tokens from the drafter" in md
    assert "3 of 4 tokens from the drafter" not in md.replace("last round: 3 of 4", "")
