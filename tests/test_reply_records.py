"""A stored reply is one record, ``ReplyResult``: its row's status comes back with it, and the
window's ``Version`` only reads that record (no flags of its own to fall out of step)."""

from __future__ import annotations

import dataclasses

import pytest

from app.chat.conversation import STATUSES, Message
from app.chat.turns import ReplyResult, Version


@pytest.mark.parametrize(("status", "stopped", "interrupted", "error"), [
    ("complete", False, False, None),
    ("generating", False, False, None),
    ("stopped", True, False, None),
    ("interrupted", True, True, None),
    ("error", False, False, "the drafter raised"),
])
def test_a_version_reads_its_flags_from_the_records_status(status, stopped, interrupted, error):
    row = Message(role="assistant", content="Paris", mode="dflash", status=status,
                  error="the drafter raised", token_ids=[5, 6], from_draft=[False, True],
                  finish_reason="cancelled" if stopped else "stop")
    result = ReplyResult.from_row(row)
    assert result.status == status and result.content == "Paris"
    v = Version(result)
    assert (v.stopped, v.interrupted, v.error) == (stopped, interrupted, error)
    assert not v.never_ran  # it has tokens and text
    assert [f.name for f in dataclasses.fields(Version)] == ["result"]


def test_every_stored_status_reads_back_and_a_live_result_says_complete():
    for status in STATUSES:
        assert ReplyResult.from_row(Message(role="assistant", status=status)).status == status
    assert ReplyResult().status == "complete"
    empty = Version(ReplyResult(mode="dflash", finish_reason="cancelled", status="stopped"))
    assert empty.never_ran and empty.stopped and empty.error is None
