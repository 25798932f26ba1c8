"""Conversations as the window holds them, behind a small store interface.

:class:`MemoryStore` keeps everything in memory; when ``app.chat.storage`` (issue 8, SQLite)
lands, an adapter with the same methods replaces it without touching the window.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Version:
    """One generated version of an assistant turn.

    ``result`` is the worker's :class:`app.ui.worker.ReplyResult`; ``stopped`` is True when
    the reply is partial (Stop, or ``interrupted``: the app ended while it was written);
    ``error`` holds a generation error message.
    """

    result: Any
    stopped: bool = False
    error: str | None = None
    saved: bool = False
    interrupted: bool = False


@dataclass
class Message:
    """A chat message. ``role`` is "system", "user" or "assistant".

    Assistant turns keep every version: a Compare turn (``compare``) has "plain" and
    "dflash"; regenerated replies add "<mode>#<n>". ``chosen`` is the key of the version the
    conversation continues from (DFlash's by default).
    """

    role: str
    content: str = ""
    versions: dict[str, Version] = field(default_factory=dict)
    chosen: str = ""
    created: float = field(default_factory=time.time)
    compare: bool = False
    ids: dict[str, int] = field(default_factory=dict)
    """Storage row ids: "" for a user message, the version key for each reply version."""

    @property
    def version(self) -> Version | None:
        """The chosen version (None for user messages or a turn still being generated)."""
        return self.versions.get(self.chosen)

    @property
    def is_compare(self) -> bool:
        """True for a Compare turn (plain and DFlash versions of one prompt)."""
        return self.compare

    def text(self) -> str:
        """The text the conversation continues from."""
        v = self.version
        return v.result.content if v is not None else self.content


@dataclass
class Conversation:
    """A conversation: ``settings`` holds per-conversation overrides of the app defaults."""

    id: int
    title: str
    messages: list[Message] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    updated: float = field(default_factory=time.time)

    def history(self) -> list[dict]:
        """Messages in chat-template form ([{role, content}]) from the chosen versions."""
        out = []
        for m in self.messages:
            if m.role == "assistant" and m.version is None:
                continue
            out.append({"role": m.role, "content": m.text()})
        return out


class ConversationStore(Protocol):
    """What the window needs from storage."""

    def list(self) -> list[Conversation]:
        """Conversations, most recently updated first (messages may be left unloaded)."""

    def new(self, title: str = "New chat") -> Conversation:
        """Create an empty conversation."""

    def get(self, conv_id: int) -> Conversation | None:
        """A conversation with its messages, or None."""

    def save(self, conv: Conversation) -> None:
        """Store what changed in ``conv`` (new messages, finished versions, choices)."""

    def delete(self, conv_id: int) -> None:
        """Delete a conversation."""

    def begin_reply(self, conv: Conversation, msg: Message, keys: list[str],
                    settings: dict) -> None:
        """A reply (or both sides of a Compare turn, ``keys``) starts generating."""

    def progress(self, msg: Message, key: str, content: str, reasoning: str,
                 tokens: list[int], from_draft: list[bool]) -> None:
        """The reply ``key`` grew (whole values; the store may throttle writes)."""

    def close(self) -> None:
        """Flush and release the store."""


class MemoryStore:
    """In-memory :class:`ConversationStore` (newest conversation first in :meth:`list`)."""

    def __init__(self) -> None:
        self._convs: dict[int, Conversation] = {}
        self._ids = itertools.count(1)

    def list(self) -> list[Conversation]:
        """All conversations, most recently updated first."""
        return sorted(self._convs.values(), key=lambda c: (c.updated, c.id), reverse=True)

    def new(self, title: str = "New chat") -> Conversation:
        """Create and return an empty conversation."""
        conv = Conversation(id=next(self._ids), title=title)
        self._convs[conv.id] = conv
        return conv

    def get(self, conv_id: int) -> Conversation | None:
        """The conversation with ``conv_id`` or None."""
        return self._convs.get(conv_id)

    def save(self, conv: Conversation) -> None:
        """Store ``conv`` (updates its timestamp)."""
        conv.updated = time.time()
        self._convs[conv.id] = conv

    def delete(self, conv_id: int) -> None:
        """Remove a conversation (no error when it does not exist)."""
        self._convs.pop(conv_id, None)

    def begin_reply(self, conv: Conversation, msg: Message, keys: list[str],
                    settings: dict) -> None:
        """A reply started (nothing to do in memory)."""

    def progress(self, msg: Message, key: str, content: str, reasoning: str,
                 tokens: list[int], from_draft: list[bool]) -> None:
        """A reply grew (nothing to do in memory)."""

    def close(self) -> None:
        """Nothing to release."""
