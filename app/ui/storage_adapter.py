"""The window's conversation store on top of ``app.chat.storage`` (SQLite, issue 8).

Maps the window's flat view of a conversation (:class:`app.ui.store.Conversation`: the active
path, each assistant turn with its versions) onto the storage's message tree:

* a user message is one row; an ordinary reply is one row (``mode`` plain/dflash);
* a Compare turn is two rows sharing a ``compare_group``; the chosen one is on the active path;
* a reply is stored as ``generating`` when it starts (:meth:`SqliteStore.begin_reply`), grows
  through the storage's throttled ``update_partial`` (:meth:`SqliteStore.progress`) and is
  finished (``complete``/``stopped``/``error``) when the window saves the conversation.
  A crash leaves it ``interrupted`` with its text, and reopening shows it as stopped.

Qt-free; all calls come from the GUI thread (no MLX here).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from app.engine.events import Summary
from app.ui.store import Conversation, Message, Version
from app.ui.worker import ReplyResult

log = logging.getLogger(__name__)

_SUMMARY_FIELDS = {f.name for f in dataclasses.fields(Summary)}


def summary_from_dict(d: dict | None) -> Summary | None:
    """A :class:`Summary` from its stored dict (unknown keys ignored; None stays None)."""
    if not d:
        return None
    return Summary(**{k: v for k, v in d.items() if k in _SUMMARY_FIELDS})


def result_from_row(m) -> ReplyResult:
    """A :class:`ReplyResult` from a stored ``app.chat.conversation.Message``."""
    return ReplyResult(
        content=m.content,
        reasoning=m.reasoning,
        tool_calls=[dict(c) for c in (m.tool_calls or [])],
        finish_reason=m.finish_reason or ("cancelled" if m.status in ("stopped", "interrupted")
                                          else "stop"),
        tokens=list(m.token_ids or []),
        from_draft=list(m.from_draft or []),
        pieces=[],
        summary=summary_from_dict(m.summary),
        mode=m.mode or "plain",
        block_size=m.block_size,
        rollback=m.rollback or "tape",
        error=m.error,
    )


class SqliteStore:
    """:class:`app.ui.store.ConversationStore` over :class:`app.chat.storage.Store`.

    Raises ``app.chat.storage.StorageError`` from the constructor when the database cannot be
    used (the caller falls back to memory and says so)."""

    def __init__(self, path: Path | str) -> None:
        from app.chat.storage import Store

        self.db = Store(path)

    # ---- conversations
    def list(self) -> list[Conversation]:
        """Every conversation (titles only; messages load with :meth:`get`), newest first."""
        return [Conversation(id=c.id, title=c.title or "New chat", settings=dict(c.settings),
                             updated=c.updated_at) for c in self.db.list_conversations()]

    def new(self, title: str = "New chat") -> Conversation:
        """A new, empty conversation (auto-titled by its first prompt)."""
        c = self.db.new_conversation()
        return Conversation(id=c.id, title=title, updated=c.updated_at)

    def get(self, conv_id: int) -> Conversation | None:
        """The conversation's active path as window messages (None when it does not exist)."""
        from app.chat.storage import StorageError

        try:
            c = self.db.get_conversation(conv_id)
            path = self.db.active_path(conv_id)
        except StorageError:
            return None
        conv = Conversation(id=c.id, title=c.title or "New chat", settings=dict(c.settings),
                            updated=c.updated_at)
        for m in path:
            if m.role == "user":
                conv.messages.append(Message("user", m.content, ids={"": m.id}))
            elif m.role == "assistant":
                msg = Message("assistant")
                partner = self.db.compare_partner(m.id)
                if partner is not None:
                    msg.compare = True
                    rows = [(m.mode or "plain", m), (partner.mode or "plain", partner)]
                else:
                    rows = []
                    for row in self.db.versions(m.id):
                        if row.role != "assistant" or row.compare_group:
                            continue
                        key, n = row.mode or "plain", 1
                        while key in dict(rows):
                            n += 1
                            key = f"{row.mode or 'plain'}#{n}"
                        rows.append((key, row))
                for key, row in rows:
                    msg.versions[key] = Version(
                        result_from_row(row),
                        stopped=row.status in ("stopped", "interrupted"),
                        error=row.error if row.status == "error" else None,
                        saved=row.status != "generating",
                        interrupted=row.status == "interrupted",
                    )
                    msg.ids[key] = row.id
                    if row.id == m.id:
                        msg.chosen = key
                conv.messages.append(msg)
        return conv

    def save(self, conv: Conversation) -> None:
        """Write what changed: new user messages, finished reply versions, the version a
        Compare turn continues from, the per-conversation settings."""
        self.db.update_conversation(conv.id, settings=dict(conv.settings))
        for msg in conv.messages:
            if msg.role == "user" and "" not in msg.ids:
                row = self.db.add_message(conv.id, "user", msg.content)
                msg.ids[""] = row.id
            elif msg.role == "assistant":
                for key, v in msg.versions.items():
                    if v.saved or key not in msg.ids:
                        continue
                    self._finish(msg.ids[key], v)
                    v.saved = True
                if len(msg.ids) > 1 and msg.chosen in msg.ids:
                    self.db.set_active(msg.ids[msg.chosen])
        stored = self.db.get_conversation(conv.id)
        if stored.title:
            conv.title = stored.title

    def _finish(self, row_id: int, v: Version) -> None:
        r = v.result
        status = "error" if v.error else ("stopped" if v.stopped else "complete")
        self.db.finish_reply(
            row_id, status=status, content=r.content, reasoning=r.reasoning,
            tool_calls=[{k: c.get(k) for k in ("id", "name", "arguments", "result", "error",
                                                "duration_s")} for c in r.tool_calls],
            token_ids=list(r.tokens), from_draft=list(r.from_draft),
            summary=r.summary.to_dict() if r.summary is not None else None,
            finish_reason=r.finish_reason, error=v.error)

    def edit_user(self, old: Message, new: Message) -> None:
        """Store ``new`` as an edited version of the user message ``old`` (a sibling made
        active; the turns after ``old`` stay stored on the earlier branch)."""
        if "" not in old.ids:
            return
        row = self.db.edit_user_message(old.ids[""], new.content)
        new.ids[""] = row.id

    def rename(self, conv_id: int, title: str) -> None:
        """Set a conversation's title (raises ValueError when empty)."""
        self.db.rename(conv_id, title)

    def export(self, conv_id: int, path: Path) -> Path:
        """Write the conversation to ``path`` (``.json``: JSON, else Markdown)."""
        from app.chat.export import write_export

        return write_export(self.db, conv_id, Path(path))

    def import_file(self, path: Path) -> Conversation:
        """Import a JSON export as a new conversation and return it (window form).

        Raises ``app.chat.export.ImportFormatError`` or OSError."""
        from app.chat.export import import_json

        c = import_json(self.db, Path(path))
        return self.get(c.id)

    def search(self, text: str) -> list[int]:
        """Ids of conversations whose messages or title contain ``text``."""
        ids = []
        for hit in self.db.search(text):
            cid = getattr(hit, "conversation_id", None)
            if cid is not None and cid not in ids:
                ids.append(cid)
        return ids

    def delete(self, conv_id: int) -> None:
        """Delete a conversation and its messages."""
        from app.chat.storage import ConversationNotFoundError

        try:
            self.db.delete_conversation(conv_id)
        except ConversationNotFoundError:
            pass

    # ---- a reply being generated
    def begin_reply(self, conv: Conversation, msg: Message, keys: list[str],
                    settings: dict) -> None:
        """Store the reply rows as ``generating`` before generation starts. ``keys`` is
        ``[mode]`` or ``["plain", "dflash"]`` for Compare."""
        self.save(conv)  # the user message first
        block = settings.get("block_size")
        rollback = settings.get("rollback") or "tape"
        generation = {k: settings.get(k) for k in ("max_tokens", "temperature", "top_p",
                                                    "top_k", "min_p", "seed",
                                                    "enable_thinking")}
        if keys == ["plain", "dflash"]:
            plain, dflash = self.db.begin_compare(conv.id, block_size=block, rollback=rollback,
                                                  generation=generation)
            msg.ids.update(plain=plain.id, dflash=dflash.id)
        else:
            mode = settings.get("mode") or "plain"
            kwargs = {"block_size": block if mode == "dflash" else None,
                      "rollback": rollback if mode == "dflash" else None,
                      "generation": generation}
            if msg.ids:  # a new version of a stored reply: a sibling row
                row = self.db.regenerate(next(iter(msg.ids.values())), mode=mode, **kwargs)
            else:
                row = self.db.begin_reply(conv.id, mode=mode, **kwargs)
            msg.ids[keys[0]] = row.id

    def progress(self, msg: Message, key: str, content: str, reasoning: str,
                 tokens: list[int], from_draft: list[bool]) -> None:
        """Save the growing reply (the storage throttles writes to one per 0.5 s)."""
        if key in msg.ids:
            self.db.update_partial(msg.ids[key], content=content, reasoning=reasoning,
                                   token_ids=list(tokens), from_draft=list(from_draft))

    def close(self) -> None:
        """Flush held-back writes and close the database."""
        self.db.close()


def open_store(data_dir: Path):
    """The SQLite store in ``data_dir`` (``conversations.db``); on a database error the
    in-memory store, with the reason logged (the window then says so)."""
    from app.chat.storage import DB_FILENAME, StorageError

    try:
        return SqliteStore(Path(data_dir) / DB_FILENAME)
    except StorageError as exc:
        log.error("conversation database unusable, keeping chats in memory: %s", exc)
        from app.ui.store import MemoryStore

        store = MemoryStore()
        store.problem = str(exc)
        return store
