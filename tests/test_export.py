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
from app.chat.storage import Store, _prompt_dicts
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
        assert _prompt_dicts(b.active_path(imported.id)) == _prompt_dicts(a.active_path(cid))
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


def test_a_markdown_export_given_to_import_says_to_use_json(tmp_path):
    with Store(tmp_path / "a.db") as s:
        md = export_markdown(s, build(s))
        before = len(s.list_conversations())
        for data in (md, md.encode("utf-8")):
            with pytest.raises(ImportFormatError, match="Markdown export.*JSON export"):
                import_json(s, data)
        assert len(s.list_conversations()) == before


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


def assert_refused(tmp_path, mutate, message: str) -> None:
    """Importing ``mutate`` (a function of a copy of a good export) raises ImportFormatError
    matching ``message`` and stores nothing."""
    with Store(tmp_path / "a.db") as s:
        good = export_json(s, build(s))
        before = len(s.list_conversations())
        with pytest.raises(ImportFormatError, match=message):
            import_json(s, mutate(copy.deepcopy(good)))
        assert len(s.list_conversations()) == before


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
        # JSON allows NaN and Infinity: they are no time (SQLite refused them, in its words)
        (lambda d: {**d, "conversation": {**d["conversation"], "created_at": float("nan")}},
         "conversation: 'created_at' should be a time in seconds, not NaN"),
        (lambda d: {**d, "conversation": {**d["conversation"], "updated_at": float("inf")}},
         "conversation: 'updated_at' should be a time in seconds, not inf"),
        (lambda d: _msg(d, 1, created_at=float("nan")),
         "message 2: 'created_at' should be a time in seconds, not NaN"),
        (lambda d: json.dumps(_msg(d, 1, updated_at=float("-inf"))),
         "message 2: 'updated_at' should be a time in seconds, not -inf"),
    ],
)
def test_bad_imports_are_refused_and_store_nothing(tmp_path, mutate, message):
    assert_refused(tmp_path, mutate, message)


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


def _tool_reply(s: Store, first: str = "ROUND-1-REASONING", text: str = "ROUND-1-TEXT",
                last: str = "ROUND-2-REASONING", **figures) -> int:
    """A conversation whose reply ran a tool: round 1 reasoning ``first``, a line of
    ``text`` and a call, the tool's result, round 2 reasoning ``last`` and the answer (stored
    as the app stores it; ``figures``: more of the reply's Summary fields). Its id."""
    result = {"timezone": "America/Anchorage", "time": "06:39:34"}
    conv = s.new_conversation("tools")
    s.add_message(conv.id, "user", "What is the local time in Anchorage?")
    r = s.begin_reply(conv.id, mode="dflash", block_size=16, rollback="tape")
    s.finish_reply(
        r.id, content="It is 06:39:34 in Anchorage.", reasoning=last,
        tool_calls=[{"id": "call_0", "name": "current_time",
                     "arguments": {"timezone": "America/Anchorage"}, "result": result,
                     "error": None, "duration_s": 0.008}],
        token_ids=[1, 2, 3, 4], from_draft=[False, True, True, True],
        summary=Summary(mode="dflash", generated_tokens=9, tok_per_s=300.0,
                        **figures).to_dict(),
        rounds=[{"role": "assistant", "content": text, "reasoning_content": first,
                 "tool_calls": [{"id": "call_0", "type": "function", "function": {
                     "name": "current_time",
                     "arguments": {"timezone": "America/Anchorage"}}}]},
                {"role": "tool", "tool_call_id": "call_0", "name": "current_time",
                 "content": json.dumps({"ok": True, "result": result})},
                {"role": "assistant", "content": "It is 06:39:34 in Anchorage.",
                 "reasoning_content": last}])
    return conv.id


def test_markdown_of_a_tool_reply_has_every_round_and_the_tool_result(tmp_path):
    """A reply that called a tool is stored as one row whose ``rounds`` hold the first round
    (its reasoning and call) and whose ``tool_calls`` carry the results: the Markdown shows the
    reasoning of both rounds, the call's result, and says which figures are the last round's
    (found exporting a demo-pair chat: only the last round's reasoning, no result, and "55 of 59
    tokens from the drafter" under "110 tokens")."""
    first = "I need the clock in Anchorage, so I call current_time."
    last = "I report the time and date from the result."
    with Store(tmp_path / "a.db") as s:
        conv_id = _tool_reply(s, first, "", last, cycles=2, drafted=30, accepted=7,
                              acceptance_rate=7 / 30, tau=4.0)
        md = export_markdown(s, conv_id)
    assert f"<details><summary>Reasoning (round 1)</summary>\n\n{first}\n\n</details>" in md
    assert f"<details><summary>Reasoning (round 2)</summary>\n\n{last}\n\n</details>" in md
    assert "**Tool call** `current_time`" in md and '"timezone": "America/Anchorage"' in md
    assert "**Result**" in md and '"time": "06:39:34"' in md
    assert "9 tokens · 300.0 tok/s" in md
    assert "last round: 3 of 4 tokens from the drafter" in md
    assert "3 of 4 tokens from the drafter" not in md.replace("last round: 3 of 4", "")


def _reply(data: dict) -> dict:
    """The first reply (message 3) of an export of :func:`build`."""
    return data["messages"][2]


def _set(path: str, value):
    """A mutation setting ``path`` (keys and list indexes joined by dots) of message 3."""
    def mutate(data: dict) -> dict:
        obj = _reply(data)
        *head, last = path.split(".")
        for key in head:
            obj = obj[int(key)] if isinstance(obj, list) else obj.setdefault(key, {})
        obj[int(last) if isinstance(obj, list) else last] = value
        return data
    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        # the new user's file: the window crashed formatting "fast" as a float
        (_set("summary.tok_per_s", "fast"),
         r"""message 3: 'summary.tok_per_s' should be a number, not "fast\""""),
        (_set("summary.generated_tokens", 2.5), "'summary.generated_tokens' should be a whole"),
        (_set("summary.acceptance_rate", [1]), "'summary.acceptance_rate' should be a number "
                                               "or null"),
        (_set("summary.mode", "turbo"), "'summary.mode' should be one of 'plain', 'dflash'"),
        (_set("summary.accepted_lengths", [1, "a"]), "'summary.accepted_lengths' should be a "
                                                     "list of whole numbers"),
        (_set("summary.round_summaries", [{"tau": "x"}]),
         r"message 3: 'summary.round_summaries\[0\].tau' should be a number or null"),
        (_set("summary", [1, 2]), "message 3: 'summary' should be dict, not list"),
        (_set("generation.continued", [{"after_tokens": "many"}]),
         r"'generation.continued\[0\].after_tokens' should be a whole number"),
        (_set("generation.speedup", {"ratio": 2.0, "baseline": {"tok_per_s": "x"}}),
         "'generation.speedup.baseline.tok_per_s' should be a number"),
        (_set("generation.top2_gap", "?"), "'generation.top2_gap' should be a number or null"),
        (_set("generation.resume", {"prompt_ids": [1, "x"]}),
         "'generation.resume.prompt_ids' should be a list of whole numbers"),
        (_set("generation.max_tokens", "lots"), "'generation.max_tokens' should be a whole"),
        (_set("tool_calls.0.duration_s", "slow"), r"'tool_calls\[0\].duration_s' should be"),
        (_set("tool_calls.0.arguments", 5), r"'tool_calls\[0\].arguments' should be an object "
                                            "or a string"),
        (_set("rounds", [{"role": "assistant", "content": 5}]),
         r"'rounds\[0\].content' should be a string or null"),
        (_set("rounds", [{"role": "assistant", "tool_calls": [{"function": "f"}]}]),
         r"'rounds\[0\].tool_calls\[0\].function' should be an object"),
        (_set("rounds", [{"role": "wizard"}]), r"'rounds\[0\].role' should be one of"),
    ],
)
def test_mistyped_structured_fields_are_refused_naming_message_and_field(tmp_path, mutate,
                                                                         message):
    """An export whose reply figures have the wrong type imported, and the window then
    crashed rendering it ("Unknown format code 'f' for object of type 'str'") and could never
    show that chat. Import checks the stored records against the app's types and stores
    nothing."""
    assert_refused(tmp_path, mutate, message)


def test_a_tool_reply_with_every_record_round_trips(tmp_path):
    """The checks accept what the app itself stores: round summaries, a speed-up, a resume
    record, continuations, tool calls with results, rounds."""
    from app.chat.baseline import PlainSample, SpeedUp

    with Store(tmp_path / "a.db") as a, Store(tmp_path / "b.db") as b:
        cid = _tool_reply(a)
        row = a.active_path(cid)[-1]
        r1 = Summary(mode="dflash", generated_tokens=5, tok_per_s=100.0, accepted_lengths=[2])
        r2 = Summary(mode="dflash", generated_tokens=4, tok_per_s=120.0)
        total = Summary.reply_total([r1, r2]).to_dict()
        total["round_summaries"] = [r1.to_dict(), r2.to_dict()]
        a.finish_reply(row.id, summary=total, content=row.content, reasoning=row.reasoning,
                       tool_calls=row.tool_calls, rounds=row.rounds, token_ids=row.token_ids,
                       from_draft=row.from_draft, finish_reason="length")
        speed = SpeedUp(1.9, PlainSample("t|d", "bfloat16", 512, 40, 52.5, "Compare"))
        a.update_generation(row.id, {
            "max_tokens": 512, "temperature": 0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
            "seed": None, "enable_thinking": True, "speedup": speed.to_dict(), "top2_gap": None,
            "resume": {"prompt_ids": [1, 2], "starts_in_reasoning": False,
                       "target": "/t", "drafter": None},
            "continued": [{"after_tokens": 4, "tokens": 5, "max_tokens": 512}],
            "something_newer": {"kept": True}})
        exported = export_json(a, cid)
        back = import_json(b, json.loads(json.dumps(exported)))
        assert export_json(b, back.id) == exported


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # the new user's file: it imported, showed "T 99 · ≤-5 tok", and every Send failed
        ({"max_tokens": -5, "block_size": 0, "temperature": 99, "top_p": 7},
         # every bad one is named (block_size 0 is fine: the drafter's own)
         r"^conversation settings: (?=.*max_tokens -5 is out of range: it must be between 1 "
         r"and 131072)(?=.*temperature 99\.0 is out of range)(?=.*top_p 7\.0 is out of range)"
         r"(?!.*block_size)"),
        ({"temperature": 99}, r"temperature 99\.0 is out of range: it must be between 0 and 2"),
        ({"top_p": 7}, r"top_p 7\.0 is out of range: it must be between 0\.01 and 1"),
        ({"seed": 1.5}, "'seed' should be a whole number, not 1.5"),
        ({"rollback": "sideways"}, "rollback must be one of tape, replay"),
        ({"thinking": "yes"}, "conversation settings: 'thinking' should be true or false, not "
                              '"yes"'),
        ({"temperature": "0.7"}, "'temperature' should be a number, not \"0.7\""),
        ({"max_tokens": None}, "'max_tokens' should be a whole number, not null"),
        ({"stop_strings": ["</s>", 3]}, "'stop_strings' should be a list of strings"),
        ({"system_prompt": 5}, "'system_prompt' should be a string, not 5"),
    ],
)
def test_out_of_range_settings_are_refused(tmp_path, settings, message):
    def mutate(d):
        d["conversation"]["settings"] = {**d["conversation"]["settings"], **settings}
        return d

    assert_refused(tmp_path, mutate, message)


def test_valid_settings_import_and_unknown_keys_are_kept():
    data = {
        "format": "dflash-chat.conversation", "format_version": 1,
        "conversation": {"created_at": 1.0, "updated_at": 2.0, "settings": {
            "max_tokens": 64, "block_size": 0, "temperature": 1, "top_p": 0.9, "seed": -1,
            "thinking": False, "stop_strings": ["END"], "rollback": "replay",
            "from_a_newer_version": [1]}},
        "messages": [],
    }
    conv, _ = parse_json(data)
    assert conv.settings == {"max_tokens": 64, "block_size": 0, "temperature": 1.0,
                             "top_p": 0.9, "seed": -1, "thinking": False,
                             "stop_strings": ["END"], "rollback": "replay",
                             "from_a_newer_version": [1]}
    assert isinstance(conv.settings["temperature"], float)


def test_markdown_of_a_tool_reply_follows_the_order_things_happened(tmp_path):
    """The final answer came before the tool call that preceded it (and both rounds'
    reasoning came first): each round now shows its reasoning, text and call with its
    result, then the next round's reasoning and the answer, then the figures."""
    with Store(tmp_path / "a.db") as s:
        md = export_markdown(s, _tool_reply(s))
    order = ["## Assistant", "ROUND-1-REASONING", "ROUND-1-TEXT",
             "**Tool call** `current_time`", '"timezone": "America/Anchorage"', "**Result**",
             '"time": "06:39:34"', "ROUND-2-REASONING", "It is 06:39:34 in Anchorage.",
             "9 tokens · 300.0 tok/s"]
    at = [md.index(x) for x in order]
    assert at == sorted(at), md
    assert md.count("**Tool call**") == 1 and md.count("**Result**") == 1
    assert md.count("It is 06:39:34 in Anchorage.") == 1
    assert md.count("ROUND-1-REASONING") == md.count("ROUND-2-REASONING") == 1


def test_markdown_names_a_lookup_reply_lookup_and_its_drafts_prompt_lookup(tmp_path):
    """A Lookup reply (no drafter: its drafts are prompt lookup's) is headed with the mode
    table's label and its draft tokens are not said to come from a drafter."""
    with Store(tmp_path / "a.db") as s:
        conv = s.new_conversation("lookup")
        s.add_message(conv.id, "user", "Repeat the list.")
        r = s.begin_reply(conv.id, mode="lookup", block_size=4, rollback="tape")
        s.finish_reply(r.id, content="a, b, c", token_ids=list(range(8)),
                       from_draft=[False, True, True] + [False] * 5,
                       summary=Summary(mode="lookup", generated_tokens=8, cycles=6, drafted=5,
                                       accepted=2, acceptance_rate=0.4, tau=1.33).to_dict(),
                       finish_reason="stop")
        md = export_markdown(s, conv.id)
    assert "## Assistant · Lookup (block 4, tape rollback)\n" in md
    assert "2 of 8 tokens from prompt lookup" in md
    assert "DFlash" not in md and "drafter" not in md


def _ended_reply(s, conv, content: str, tokens: list[int], stop_cause: str,
                 finish: str) -> None:
    """A plain reply of ``tokens`` stored as complete, ended by ``stop_cause``."""
    r = s.begin_reply(conv.id, mode="plain")
    s.finish_reply(r.id, content=content, token_ids=tokens,
                   summary=Summary(mode="plain", generated_tokens=len(tokens), tok_per_s=20.0,
                                   stop_cause=stop_cause).to_dict(),
                   finish_reason=finish)


def test_markdown_says_a_reply_was_cut_at_max_tokens(tmp_path):
    """A complete reply that Max tokens ended (finish reason length) says so in the export,
    as the window's footer does; one that ended by itself says nothing of it."""
    with Store(tmp_path / "a.db") as s:
        conv = s.new_conversation("cut")
        s.add_message(conv.id, "user", "Count to a hundred.")
        _ended_reply(s, conv, "1, 2, 3", [1, 2, 3], "length", "length")
        s.add_message(conv.id, "user", "Thanks.")
        _ended_reply(s, conv, "You're welcome.", [4, 5], "end_token", "stop")
        md = export_markdown(s, conv.id)
    assert "*3 tokens · 20.0 tok/s · cut at max tokens*" in md
    assert "*2 tokens · 20.0 tok/s*" in md
    assert md.count("cut at max tokens") == 1


def test_markdown_says_a_stop_string_ended_the_reply(tmp_path):
    with Store(tmp_path / "a.db") as s:
        conv = s.new_conversation("stop")
        s.add_message(conv.id, "user", "Capital of France?")
        _ended_reply(s, conv, "It is", [1, 2], "stop_string", "stop")
        md = export_markdown(s, conv.id)
    assert "*2 tokens · 20.0 tok/s · ended at a stop string*" in md
