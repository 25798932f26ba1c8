"""Conversation storage on SQLite (standard ``sqlite3``), safe against crashes.

One database file, by default ``app.paths.default_data_dir() / "conversations.db"`` (the
global ``--data-dir`` sets ``DFLASH_DATA_DIR``, which moves it). The file is opened in WAL
mode (readers in other connections never block the writer and see only committed rows) with
``synchronous=NORMAL``: a killed process loses at most its last uncommitted write, never the
file (https://sqlite.org/wal.html).

Schema (see ``docs/storage.md``): ``schema_version`` (one row), ``conversations``, ``messages``.
Messages form a tree per conversation (siblings are versions of one turn); see
:mod:`app.chat.conversation`. The schema moves forward only, through :data:`MIGRATIONS`;
a file written by a newer app is refused (:class:`SchemaTooNewError`) and left untouched.

A file that cannot be written (read-only, though its folder may be writable) is refused at
open (:class:`StoreWriteError`, cause ``readonly``, naming the file), found by a write inside a
transaction that is rolled back. :func:`readable_copy` copies every row of a file the app
cannot use (damaged, read-only) into memory through a read-only connection, by table scans
(a damaged index is not read) into fresh tables; the window shows the saved chats from it.

A reply being generated is stored at once with status ``generating`` and the writer's process
id; :meth:`Store.update_partial` saves its growth at most every ``partial_interval_s`` seconds
(0.5 s by default). When a store is opened, ``generating`` rows whose writer process is gone
become ``interrupted`` and keep the text they had.

Thread safety: one :class:`Store` may be shared between threads, as the window does (the GUI
thread reads conversations and writes titles, settings and version choices; the worker thread
that owns MLX writes replies, ``app.chat.stored_turn``). Its one connection is opened with
``check_same_thread=False`` (sqlite3 refuses a connection used from a second thread
otherwise), and every call holds the store's re-entrant lock for as long as it uses the
connection, a whole transaction included (:meth:`Store.transaction`), so two threads never
interleave statements and a reader never sees half a transaction. Other processes may open the
same file at the same time (WAL, ``busy_timeout``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from app.chat.conversation import (
    ROLES,
    STATUSES,
    Conversation,
    Message,
    SearchHit,
)
from app.engine.modes import MODES, ROLLBACKS, Mode

DB_FILENAME = "conversations.db"
SCHEMA_VERSION = 3
DEFAULT_PARTIAL_INTERVAL_S = 0.5
TITLE_MAX_CHARS = 60
WAL_LIMIT_BYTES = 1 << 20
"""The write-ahead log is cut back to this size after a checkpoint (``journal_size_limit``)."""

_LEAF = object()  # add_message default: append to the active path's last message


class StorageError(Exception):
    """A conversation database cannot be used (unreadable file, unknown row, bad value)."""


class StoreReadError(StorageError):
    """A read met a damaged database (``sqlite3.DatabaseError`` once the file was open:
    damage the open-time check did not find, or that came later)."""


_CORRUPT, _NOTADB = 11, 26  # SQLite's primary result codes (sqlite.org, "Result Codes")


def _damaged(exc: sqlite3.Error) -> bool:
    """True for SQLite's "the file is damaged" errors: result codes ``SQLITE_CORRUPT`` (11)
    and ``SQLITE_NOTADB`` (26), extended codes included (their low byte; sqlite.org's
    "Result and Error Codes"); not a lock, a full disk or an error in the statement."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (_CORRUPT, _NOTADB)


RESCUE_ADVICE = ("SQLite's command-line tool can rescue what is readable: sqlite3 "
                 "conversations.db .dump > rescued.sql (.recover, where your sqlite3 has it, "
                 "digs deeper)")
"""What the app advises for a damaged file. ``.dump`` works in every sqlite3; ``.recover``
needs the ``sqlite_dbpage`` table, which some builds leave out (Debian 12's 3.40.1 answers
"SQL logic error", even on a healthy file)."""


class StoreWriteError(StorageError):
    """A write to the conversation database failed: nothing of that write was stored, and
    what was stored before stays as it was (SQLite rolls the transaction back).

    Attributes:
        cause: ``full`` (no space left on the disk), ``io`` (the disk reported an I/O
            error), ``locked`` (another program held the database for longer than the busy
            timeout), ``readonly`` (the file or its folder cannot be written; the message
            names the one that is), ``damaged`` (the file is damaged) or ``other``.
        folder: the folder that holds the database.
    """

    def __init__(self, message: str, cause: str, folder: Path):
        super().__init__(message)
        self.cause = cause
        self.folder = folder


_WRITE_CAUSES = {"SQLITE_FULL": "full", "SQLITE_IOERR": "io", "SQLITE_BUSY": "locked",
                 "SQLITE_LOCKED": "locked", "SQLITE_READONLY": "readonly",
                 "SQLITE_CANTOPEN": "readonly", "SQLITE_CORRUPT": "damaged",
                 "SQLITE_NOTADB": "damaged"}


def write_error(exc: sqlite3.Error, folder: Path, busy_timeout_s: float = 10.0,
                path: Path | None = None) -> StoreWriteError:
    """The :class:`StoreWriteError` for an SQLite error raised by a write: its cause (from
    the SQLite result code, e.g. ``SQLITE_FULL``, ``SQLITE_IOERR_WRITE``) and a message
    that names it and ``folder``, the database's folder, or ``path``, the database file,
    when that is what cannot be written (plain ``SQLITE_READONLY``: SQLite holds the file
    read-only, while ``folder`` can be written)."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    cause = next((c for code, c in _WRITE_CAUSES.items()
                  if name == code or name.startswith(code + "_")), None)
    if cause is None:  # an older SQLite module: its message says it
        text = str(exc).lower()
        cause = ("full" if "full" in text else "locked" if "locked" in text else
                 "io" if "i/o" in text else "readonly" if "readonly" in text else
                 "damaged" if "malformed" in text else "other")
    why = {
        "full": f"the disk holding {folder} is full (free some space there)",
        "io": f"the disk holding {folder} reported an I/O error",
        "locked": f"another program kept the database in {folder} locked for more than "
                  f"{busy_timeout_s:g} s",
        "readonly": f"{_read_only_part(exc, folder, path)} cannot be written (read-only)",
        "damaged": f"the database in {folder} is damaged",
    }.get(cause, f"the database in {folder} failed ({exc})")
    return StoreWriteError(why, cause, folder)


def _read_only_part(exc: sqlite3.Error, folder: Path, path: Path | None) -> Path:
    """``path`` when SQLite's error says the database itself is read-only (plain
    ``SQLITE_READONLY``, "attempt to write a readonly database"; not ``SQLITE_CANTOPEN`` or
    ``SQLITE_READONLY_DIRECTORY``, which are about the folder) and ``folder`` can be
    written; else ``folder`` (a read-only disk makes both read-only: the folder is named)."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    plain = name == "SQLITE_READONLY" or (not name and "readonly database" in str(exc))
    if path is not None and plain and os.access(folder, os.W_OK):
        return path
    return folder


class SchemaTooNewError(StorageError):
    """The database was written by a newer version of the app (its schema version is higher
    than :data:`SCHEMA_VERSION`); it is not modified."""


class ConversationNotFoundError(StorageError, KeyError):
    """No conversation with this id (deleted, or never stored)."""

    def __str__(self) -> str:  # KeyError would add quotes
        return str(self.args[0]) if self.args else "conversation not found"


class MessageNotFoundError(StorageError, KeyError):
    """No message with this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "message not found"


def default_db_path() -> Path:
    """``default_data_dir() / "conversations.db"``; honours ``DFLASH_DATA_DIR`` at call time."""
    from app.paths import default_data_dir

    return default_data_dir() / DB_FILENAME


# --- schema -------------------------------------------------------------------------------

_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    target_path TEXT,
    drafter_path TEXT,
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL DEFAULT '',
    reasoning TEXT NOT NULL DEFAULT '',
    tool_calls TEXT NOT NULL DEFAULT '[]',
    tool_call_id TEXT,
    name TEXT,
    mode TEXT,
    block_size INTEGER,
    rollback TEXT,
    summary TEXT,
    token_ids TEXT NOT NULL DEFAULT '[]',
    from_draft TEXT NOT NULL DEFAULT '',
    finish_reason TEXT,
    status TEXT NOT NULL DEFAULT 'complete',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX messages_conversation ON messages(conversation_id, id);
"""
# v1 had no stored choice between versions: the newest child was always followed.

_V2 = """
ALTER TABLE conversations ADD COLUMN title_auto INTEGER NOT NULL DEFAULT 1;
ALTER TABLE conversations ADD COLUMN active_root_id INTEGER;
ALTER TABLE messages ADD COLUMN active_child_id INTEGER;
ALTER TABLE messages ADD COLUMN generation TEXT NOT NULL DEFAULT '{}';
ALTER TABLE messages ADD COLUMN error TEXT;
ALTER TABLE messages ADD COLUMN compare_group TEXT;
ALTER TABLE messages ADD COLUMN writer_pid INTEGER;
CREATE INDEX messages_parent ON messages(parent_id);
CREATE INDEX messages_status ON messages(status);
UPDATE messages SET active_child_id =
    (SELECT max(c.id) FROM messages AS c WHERE c.parent_id = messages.id);
UPDATE conversations SET active_root_id =
    (SELECT max(m.id) FROM messages AS m
     WHERE m.conversation_id = conversations.id AND m.parent_id IS NULL);
"""

_V3 = """
ALTER TABLE messages ADD COLUMN rounds TEXT NOT NULL DEFAULT '[]';
"""
# v3: a reply that ran tools keeps the chat-template messages of every round (``rounds``), so
# the next prompt shows its tool calls and results as they were generated.

MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2, 3: _V3}
"""Schema version -> SQL that brings version-1 to it. Append only; never edit a released one."""


def _pid_alive(pid: int | None) -> bool:
    """True when a process with this id exists (POSIX ``kill(pid, 0)``)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def auto_title(text: str, limit: int = TITLE_MAX_CHARS) -> str:
    """A conversation title from a first prompt: its first non-empty line, whitespace collapsed,
    cut at a word boundary to at most ``limit`` characters (an ellipsis marks the cut)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip(" ,.;:") + "\u2026"


def _draft_string(flags: list[bool]) -> str:
    return "".join("1" if f else "0" for f in flags)



def _given(**fields) -> dict:
    """The keyword arguments that were given (not None)."""
    return {k: v for k, v in fields.items() if v is not None}

class Store:
    """All conversations in one SQLite file.

    Args:
        path: the database file (created with its folder if missing).
        partial_interval_s: least seconds between two writes of one growing reply.
        recover: mark ``generating`` rows of dead writer processes ``interrupted`` on open.
        clock: seconds source for timestamps (``time.time``); tests may pass their own.
        busy_timeout_s: how long a write waits for another program that holds the database
            before it fails (:class:`StoreWriteError`, cause ``locked``).

    Raises:
        StorageError: the file is not an SQLite database, or cannot be opened/created, or
            is damaged (:data:`RESCUE_ADVICE`).
        SchemaTooNewError: the file comes from a newer app version.
        StoreWriteError: the file cannot be written (cause ``readonly``: the file is
            read-only, its folder maybe not) or stays locked by another program.

    Every write that fails (a full disk, an I/O error, the database locked beyond the
    timeout) raises :class:`StoreWriteError` and stores nothing of that write.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        partial_interval_s: float = DEFAULT_PARTIAL_INTERVAL_S,
        recover: bool = True,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 10.0,
    ):
        self.path = Path(path)
        self.busy_timeout_s = float(busy_timeout_s)
        self.partial_interval_s = float(partial_interval_s)
        self._clock = clock
        self._lock = threading.RLock()
        self._depth = 0
        self._pending: dict[int, dict] = {}
        self._last_write: dict[int, float] = {}
        self._generating: set[int] = set()  # replies begun by this store, not finished
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), timeout=self.busy_timeout_s, isolation_level=None,
                check_same_thread=False,
            )
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"cannot open the conversation database {self.path}: {exc}") from exc
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._check_intact()  # before anything reads rows or writes to the file
            self._check_version()
            self._check_writable()  # before the first write (journal mode, migrations)
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            # A growing reply rewrites its row every partial_interval_s, so the WAL grows
            # fast; SQLite's default checkpoint (1000 pages, ~4 MB) never came on a 4 MB
            # disk, which then filled with the WAL alone. Checkpoint at ~1 MB and cut the
            # WAL back to 1 MB after each.
            self._db.execute("PRAGMA wal_autocheckpoint = 256")
            self._db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            self._migrate()
            if recover:
                self.recover_interrupted()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StorageError(
                f"cannot use {self.path} as the conversation database ({exc}); "
                "it was left as it is"
            ) from exc
        except StorageError:
            self._db.close()
            raise

    @classmethod
    def open_default(cls, **kwargs) -> Store:
        """A store on :func:`default_db_path` (``DFLASH_DATA_DIR`` respected)."""
        return cls(default_db_path(), **kwargs)

    # --- plumbing ---------------------------------------------------------------------

    def close(self) -> None:
        """Write what partial updates are still held back, mark the replies this store began
        and did not finish ``interrupted``, and close the connection. Safe to call twice.

        Each step is tried even when an earlier one cannot write (a full disk); the
        connection is closed in any case, then the first write error is raised
        (:class:`StoreWriteError`). Rows left ``generating`` become ``interrupted`` on the
        next open, with the text last saved."""
        with self._lock:
            if self._db is None:
                return
            errors: list[StorageError] = []
            try:
                for mid in list(self._pending):
                    try:
                        self._write_partial(mid)
                    except StorageError as exc:
                        errors.append(exc)
                try:
                    with self._tx():
                        for mid in self._generating:
                            self._db.execute(
                                "UPDATE messages SET status = 'interrupted', writer_pid = NULL, "
                                "finish_reason = coalesce(finish_reason, 'interrupted') "
                                "WHERE id = ? AND status = 'generating'",
                                (mid,),
                            )
                    self._generating.clear()
                except StorageError as exc:
                    errors.append(exc)
            finally:
                self._db.close()
                self._db = None
            if errors:
                raise errors[0]

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``); nested uses join the outer one."""
        with self._lock:
            if self._db is None:
                raise StorageError("the conversation store is closed")
            if self._depth:
                self._depth += 1
                try:
                    yield self._db
                finally:
                    self._depth -= 1
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError as exc:  # locked beyond the timeout, read-only
                raise self._write_error(exc) from exc
            self._depth = 1
            try:
                yield self._db
            except BaseException as exc:
                self._depth = 0
                self._rollback()
                if isinstance(exc, sqlite3.DatabaseError) and not isinstance(
                        exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError)):
                    raise self._write_error(exc) from exc
                raise
            self._depth = 0
            try:
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:  # e.g. the disk filled up at the commit
                self._rollback()
                raise self._write_error(exc) from exc

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not already done it (a failed
        ``COMMIT`` may leave it open); a rollback that fails too leaves the error raised."""
        try:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def _write_error(self, exc: sqlite3.Error) -> StoreWriteError:
        """:func:`write_error` for this store's folder and file ("memory" for a memory-only
        one)."""
        if str(self.path) == ":memory:":
            return write_error(exc, Path("memory"), self.busy_timeout_s)
        return write_error(exc, self.path.parent, self.busy_timeout_s, self.path)

    def _check_writable(self) -> None:
        """Raise :class:`StoreWriteError` when the file cannot be written: a read-only file
        in a writable folder opens and reads as usual, and only writes fail ("attempt to
        write a readonly database"). The probe is a write inside a transaction that is
        rolled back, so nothing reaches the file (SQLite writes pages at the commit); the
        whole file is left as it is when it fails."""
        if str(self.path) == ":memory:":
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("CREATE TABLE dflash_write_probe (x)")
            finally:
                self._rollback()
        except sqlite3.DatabaseError as exc:
            err = self._write_error(exc)
            raise StoreWriteError(f"{err}; it was left as it is", err.cause,
                                  err.folder) from exc

    @contextmanager
    def transaction(self) -> Iterator[Store]:
        """Group several calls into one transaction: all of them are stored, or (on an
        exception, which is raised again) none. Other threads wait until it ends."""
        with self._tx():
            yield self

    def memory_copy(self) -> Store:
        """A copy of the whole database in memory (SQLite's backup API), for reading or
        changing without touching the file: the window exports a conversation from one with
        the writes the file could not take applied (a full disk). Close it when done.

        Raises:
            StorageError: the store is closed, or the copy could not be made (out of memory).
        """
        copy = Store(":memory:", recover=False, partial_interval_s=self.partial_interval_s,
                     clock=self._clock)
        with self._lock:
            if self._db is None:
                copy.close()
                raise StorageError("the conversation store is closed")
            try:
                self._db.backup(copy._db)
            except sqlite3.Error as exc:
                copy.close()
                raise StorageError(f"could not copy the conversation database: {exc}") from exc
        return copy

    def _q(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            if self._db is None:
                raise StorageError("the conversation store is closed")
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                # a page damaged since the file was opened; inside a write transaction the
                # transaction's own handler names the failure (StoreWriteError)
                if self._depth == 0 and _damaged(exc):
                    raise StoreReadError(f"could not read {self.path}: {exc}") from exc
                raise

    def _check_intact(self) -> None:
        """Raise :class:`StorageError` when SQLite's ``PRAGMA quick_check`` finds the file
        damaged (pages overwritten, rows out of order: the header can be intact, so it opens
        and only some reads fail). It reads the whole file: ~120 ms for an 84 MB database on
        this project's CPU, a few ms for a usual one. Nothing is written. A file that is no
        SQLite database at all raises ``sqlite3.DatabaseError`` as before (the caller's
        "cannot use" message)."""
        if str(self.path) == ":memory:":
            return
        try:
            found = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) != _CORRUPT:
                raise  # not an SQLite file at all, or a lock: the caller says so
            found = [str(exc)]
        if found != ["ok"]:
            first = " ".join(str(found[0]).split())[:200] if found else "no answer"
            raise StorageError(
                f"{self.path} is damaged (SQLite's check says: {first}); it was left as it is. "
                f"{RESCUE_ADVICE}")

    @property
    def schema_version(self) -> int:
        """The schema version of the open file (:data:`SCHEMA_VERSION` after opening)."""
        return self._read_version()

    def _read_version(self) -> int:
        rows = self._q(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        )
        if not rows:
            return 0
        row = self._q("SELECT max(version) FROM schema_version")
        return int(row[0][0] or 0)

    def _check_version(self) -> int:
        """The file's schema version; raises when this app must not touch the file."""
        version = self._read_version()
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{self.path} was written by a newer DFlash Chat (schema {version}, this "
                f"version reads up to {SCHEMA_VERSION}); it was left as it is"
            )
        if version == 0:
            tables = self._q(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            if tables:
                raise StorageError(
                    f"{self.path} holds tables but no schema version: not a DFlash Chat "
                    "database; it was left as it is"
                )
        return version

    def _migrate(self) -> None:
        with self._tx() as db:
            version = self._check_version()  # again, now under the write lock
            if version == 0:
                db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                db.execute("INSERT INTO schema_version VALUES (0)")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _statements(MIGRATIONS[target]):
                    db.execute(statement)
                db.execute("UPDATE schema_version SET version = ?", (target,))

    # --- recovery -----------------------------------------------------------------------

    def recover_interrupted(self) -> list[int]:
        """Mark ``generating`` replies whose writer process is gone as ``interrupted``.

        Returns:
            the ids of the messages changed (their text stays as last saved).
        """
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, writer_pid FROM messages WHERE status = 'generating'"
            ).fetchall()
            dead = [mid for mid, pid in rows if not _pid_alive(pid)]
            for mid in dead:
                db.execute(
                    "UPDATE messages SET status = 'interrupted', finish_reason = "
                    "coalesce(finish_reason, 'interrupted') WHERE id = ?",
                    (mid,),
                )
            return dead

    # --- conversations --------------------------------------------------------------------

    def new_conversation(
        self,
        title: str = "",
        *,
        target_path: str | None = None,
        drafter_path: str | None = None,
        settings: dict | None = None,
        system_prompt: str | None = None,
        created_at: float | None = None,
    ) -> Conversation:
        """Create a conversation (and its system message when ``system_prompt`` is given).

        A non-empty ``title`` turns the auto-title off; otherwise the first user message sets it.
        """
        now = self._clock() if created_at is None else float(created_at)
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations (title, title_auto, created_at, updated_at, "
                "target_path, drafter_path, settings) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    title,
                    0 if title else 1,
                    now,
                    now,
                    target_path,
                    drafter_path,
                    _dumps(settings or {}),
                ),
            )
            cid = int(cur.lastrowid)
            if system_prompt is not None:
                self.add_message(cid, "system", system_prompt, parent_id=None)
        return self.get_conversation(cid)

    def get_conversation(self, conversation_id: int) -> Conversation:
        """The conversation's fields. Raises :class:`ConversationNotFoundError`."""
        rows = self._q(f"SELECT {_CONV_COLS} FROM conversations WHERE id = ?", (conversation_id,))
        if not rows:
            raise ConversationNotFoundError(f"no conversation with id {conversation_id}")
        return _conv(rows[0])

    def list_conversations(self) -> list[Conversation]:
        """Every conversation, most recently updated first."""
        rows = self._q(f"SELECT {_CONV_COLS} FROM conversations ORDER BY updated_at DESC, id DESC")
        return [_conv(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> Conversation:
        """Set the title (stripped; must not be empty) and turn the auto-title off.

        Raises:
            ValueError: the title is empty. ConversationNotFoundError: unknown id.
        """
        title = " ".join(title.split())
        if not title:
            raise ValueError("a conversation title cannot be empty")
        with self._tx() as db:
            self.get_conversation(conversation_id)
            db.execute(
                "UPDATE conversations SET title = ?, title_auto = 0 WHERE id = ?",
                (title, conversation_id),
            )
        return self.get_conversation(conversation_id)

    def update_conversation(
        self,
        conversation_id: int,
        *,
        target_path: str | None | object = _LEAF,
        drafter_path: str | None | object = _LEAF,
        settings: dict | object = _LEAF,
    ) -> Conversation:
        """Change the model pair and/or the settings (arguments left out stay as they are)."""
        sets, params = [], []
        if target_path is not _LEAF:
            sets.append("target_path = ?")
            params.append(target_path)
        if drafter_path is not _LEAF:
            sets.append("drafter_path = ?")
            params.append(drafter_path)
        if settings is not _LEAF:
            sets.append("settings = ?")
            params.append(_dumps(settings))
        with self._tx() as db:
            self.get_conversation(conversation_id)
            if sets:
                sets.append("updated_at = ?")
                params.append(self._clock())
                db.execute(
                    f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?",
                    (*params, conversation_id),
                )
        return self.get_conversation(conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation and all its messages (the UI asks for confirmation first).

        Raises ConversationNotFoundError for an unknown id."""
        with self._tx() as db:
            self.get_conversation(conversation_id)
            ids = [r[0] for r in db.execute(
                "SELECT id FROM messages WHERE conversation_id = ?", (conversation_id,)
            )]
            db.execute("UPDATE messages SET parent_id = NULL WHERE conversation_id = ?",
                       (conversation_id,))
            db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        for mid in ids:
            self._pending.pop(mid, None)
            self._last_write.pop(mid, None)
            self._generating.discard(mid)

    def search(self, text: str, limit: int = 50) -> list[SearchHit]:
        """Conversations whose title or any message content contains ``text``
        (case-insensitive for ASCII letters, SQL ``LIKE``); title hits first, then messages in
        conversation order; most recently updated conversations first. Empty text: no hits."""
        text = text.strip()
        if not text:
            return []
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._q(
            "SELECT c.id, c.title, NULL, NULL, c.title, c.updated_at, 0 FROM conversations c "
            "WHERE c.title LIKE ? ESCAPE '\\' "
            "UNION ALL "
            "SELECT m.conversation_id, c.title, m.id, m.role, m.content, c.updated_at, 1 "
            "FROM messages m JOIN conversations c ON c.id = m.conversation_id "
            "WHERE m.content LIKE ? ESCAPE '\\' "
            "ORDER BY 6 DESC, 1 DESC, 7, 3 LIMIT ?",
            (pattern, pattern, int(limit)),
        )
        return [
            SearchHit(
                conversation_id=r[0],
                title=r[1],
                message_id=r[2],
                role=r[3],
                snippet=_snippet(r[4], text),
            )
            for r in rows
        ]

    # --- messages -----------------------------------------------------------------------

    def get_message(self, message_id: int) -> Message:
        """One message. Raises :class:`MessageNotFoundError`."""
        rows = self._q(f"SELECT {_MSG_COLS} FROM messages WHERE id = ?", (message_id,))
        if not rows:
            raise MessageNotFoundError(f"no message with id {message_id}")
        return _msg(rows[0])

    def messages(self, conversation_id: int) -> list[Message]:
        """Every stored message of the conversation, every version and branch, in creation
        order (a parent always comes before its children)."""
        self.get_conversation(conversation_id)
        rows = self._q(
            f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        return [_msg(r) for r in rows]

    def active_path(self, conversation_id: int) -> list[Message]:
        """The messages the conversation currently shows, first to last: from the active root,
        following each message's active child (the newest child when none was chosen)."""
        conv = self.get_conversation(conversation_id)
        msgs = self.messages(conversation_id)
        by_id = {m.id: m for m in msgs}
        children: dict[int | None, list[int]] = {}
        for m in msgs:
            children.setdefault(m.parent_id, []).append(m.id)
        path: list[Message] = []
        current = conv.active_root_id
        if current not in by_id or by_id[current].parent_id is not None:
            roots = children.get(None, [])
            current = roots[-1] if roots else None
        while current is not None:
            node = by_id[current]
            path.append(node)
            kids = children.get(node.id, [])
            nxt = node.active_child_id
            current = nxt if nxt in kids else (kids[-1] if kids else None)
        return path

    def path_outline(self, conversation_id: int) -> tuple[list[tuple[int, str]],
                                                          dict[int | None, list[tuple[int, str]]]]:
        """The conversation's active path as ``(id, role)`` pairs, first to last (as
        :meth:`active_path`), and every message's children as ``(id, role)`` pairs by parent
        id (None: the first messages), oldest first; read from the ids and links only, so
        it costs little however long the messages are.

        Raises:
            ConversationNotFoundError: no such conversation.
        """
        conv = self.get_conversation(conversation_id)
        rows = self._q("SELECT id, parent_id, active_child_id, role FROM messages "
                       "WHERE conversation_id = ? ORDER BY id", (conversation_id,))
        link = {r[0]: (r[1], r[2], r[3]) for r in rows}
        children: dict[int | None, list[tuple[int, str]]] = {}
        for mid, parent, _, role in rows:
            children.setdefault(parent, []).append((mid, role))
        path: list[tuple[int, str]] = []
        current = conv.active_root_id
        if current not in link or link[current][0] is not None:
            roots = children.get(None, [])
            current = roots[-1][0] if roots else None
        while current is not None:
            _, chosen, role = link[current]
            path.append((current, role))
            kids = [k for k, _ in children.get(current, [])]
            current = chosen if chosen in kids else (kids[-1] if kids else None)
        return path, children

    def messages_by_id(self, ids: list[int]) -> list[Message]:
        """The messages ``ids``, in that order (ids with no message are left out)."""
        found: dict[int, Message] = {}
        for start in range(0, len(ids), 500):  # SQLite's host-parameter limit
            chunk = ids[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for r in self._q(f"SELECT {_MSG_COLS} FROM messages WHERE id IN ({marks})",
                             tuple(chunk)):
                found[r[0]] = _msg(r)
        return [found[i] for i in ids if i in found]

    def versions(self, message_id: int) -> list[Message]:
        """The message and its siblings (the versions of its turn), oldest first."""
        m = self.get_message(message_id)
        if m.parent_id is None:
            rows = self._q(
                f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? "
                "AND parent_id IS NULL ORDER BY id",
                (m.conversation_id,),
            )
        else:
            rows = self._q(
                f"SELECT {_MSG_COLS} FROM messages WHERE parent_id = ? ORDER BY id", (m.parent_id,)
            )
        return [_msg(r) for r in rows]

    def update_generation(self, message_id: int, values: dict) -> Message:
        """Merge ``values`` (JSON-ready) into a stored message's generation record
        (``Message.generation``), e.g. a reply's speed-up measured after it finished; the
        other keys stay. Returns the stored message.

        Raises:
            MessageNotFoundError: no message with that id.
        """
        with self._tx() as db:
            m = self.get_message(message_id)
            db.execute("UPDATE messages SET generation = ? WHERE id = ?",
                       (_dumps({**m.generation, **values}), message_id))
        return self.get_message(message_id)

    def set_active(self, message_id: int) -> None:
        """Make the active path go through this message (switch a reply's version, pick which
        reply of a Compare turn the conversation continues from, or go back to an earlier
        branch). Below it, the path follows the choices already stored."""
        with self._tx() as db:
            m = self.get_message(message_id)
            # the links only (a chat of 200,000 messages): each ancestor whose choice differs
            links = {r[0]: (r[1], r[2]) for r in db.execute(
                "SELECT id, parent_id, active_child_id FROM messages WHERE conversation_id = ?",
                (m.conversation_id,))}
            changes, node = [], m.id
            while links[node][0] is not None:
                parent = links[node][0]
                if links[parent][1] != node:
                    changes.append((node, parent))
                node = parent
            db.executemany("UPDATE messages SET active_child_id = ? WHERE id = ?", changes)
            db.execute("UPDATE conversations SET active_root_id = ? WHERE id = ?",
                       (node, m.conversation_id))

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str = "",
        *,
        parent_id: int | None | object = _LEAF,
        activate: bool = True,
        reasoning: str = "",
        tool_calls: list[dict] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
        mode: str | None = None,
        block_size: int | None = None,
        rollback: str | None = None,
        generation: dict | None = None,
        summary: dict | None = None,
        token_ids: list[int] | None = None,
        from_draft: list[bool] | None = None,
        finish_reason: str | None = None,
        status: str = "complete",
        error: str | None = None,
        compare_group: str | None = None,
        rounds: list[dict] | None = None,
        created_at: float | None = None,
        updated_at: float | None = None,
    ) -> Message:
        """Store a message (any role, any field; see :class:`Message`).

        ``parent_id`` defaults to the last message of the active path (None: a new first
        message). With ``activate`` the active path then goes through the new message. The
        first user message sets the title while the auto-title is on.

        Raises:
            ValueError: unknown role/mode/rollback/status, or ``from_draft`` and ``token_ids``
                of different lengths. ConversationNotFoundError / MessageNotFoundError.
        """
        fields = dict(
            reasoning=reasoning, tool_calls=tool_calls, tool_call_id=tool_call_id, name=name,
            mode=mode, block_size=block_size, rollback=rollback, generation=generation,
            summary=summary, token_ids=token_ids, from_draft=from_draft,
            finish_reason=finish_reason, status=status, error=error,
            compare_group=compare_group, rounds=rounds)
        now = self._clock()
        created = now if created_at is None else float(created_at)
        updated = created if updated_at is None else float(updated_at)
        row = _message_row(role, content, created, updated, **fields)  # checks the values
        with self._tx() as db:
            conv = self.get_conversation(conversation_id)
            if parent_id is _LEAF:
                path, _ = self.path_outline(conversation_id)
                parent_id = path[-1][0] if path else None
            if parent_id is not None:
                parent = self.get_message(parent_id)
                if parent.conversation_id != conversation_id:
                    raise ValueError(
                        f"message {parent_id} belongs to conversation {parent.conversation_id}, "
                        f"not {conversation_id}"
                    )
            auto = conv.title_auto and role == "user" and not db.execute(
                "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' LIMIT 1",
                (conversation_id,),
            ).fetchall()
            cur = db.execute(_INSERT_MESSAGE, (conversation_id, parent_id, *row))
            mid = int(cur.lastrowid)
            if status == "generating":
                self._generating.add(mid)
            if activate:
                self.set_active(mid)
            if auto:
                title = auto_title(content)
                if title:
                    db.execute(
                        "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id)
                    )
            self._touch(conversation_id, max(now, updated))
        return self.get_message(mid)

    def _touch(self, conversation_id: int, when: float | None = None) -> None:
        self._q(
            "UPDATE conversations SET updated_at = max(updated_at, ?) WHERE id = ?",
            (self._clock() if when is None else when, conversation_id),
        )

    # --- replies ------------------------------------------------------------------------

    def begin_reply(
        self,
        conversation_id: int,
        *,
        mode: str,
        parent_id: int | None | object = _LEAF,
        block_size: int | None = None,
        rollback: str | None = None,
        generation: dict | None = None,
        compare_group: str | None = None,
        activate: bool = True,
    ) -> Message:
        """Store an empty assistant reply with status ``generating`` (call before generating).

        ``parent_id`` defaults to the active path's last message. Grow it with
        :meth:`update_partial`, end it with :meth:`finish_reply`.
        """
        return self.add_message(
            conversation_id,
            "assistant",
            "",
            parent_id=parent_id,
            activate=activate,
            mode=mode,
            block_size=block_size,
            rollback=rollback,
            generation=generation,
            compare_group=compare_group,
            status="generating",
        )

    def regenerate(self, reply_id: int, *, mode: str, **kwargs) -> Message:
        """Start a new version of a reply: a ``generating`` sibling of ``reply_id`` (same
        parent), made active. The earlier version stays and :meth:`set_active` switches back.
        ``kwargs`` as for :meth:`begin_reply` (block_size, rollback, generation)."""
        old = self.get_message(reply_id)
        if old.role != "assistant":
            raise ValueError(f"message {reply_id} is a {old.role} message, not a reply")
        return self.begin_reply(
            old.conversation_id, mode=mode, parent_id=old.parent_id, **kwargs
        )

    def begin_compare(
        self,
        conversation_id: int,
        *,
        block_size: int | None = None,
        rollback: str | None = None,
        generation: dict | None = None,
        continue_with: str = "dflash",
        parent_id: int | None | object = _LEAF,
        mode: str = "dflash",
    ) -> tuple[Message, Message]:
        """Start a Compare turn: two ``generating`` replies to the same prompt, ``plain`` and
        one in the drafting ``mode`` (``dflash``, or ``dflash2`` for a pair whose one
        drafter is DFlash2), sharing one ``compare_group``. The one named by
        ``continue_with`` is on the active path (switch with :meth:`set_active`).

        Returns:
            (plain reply, drafting reply).
        """
        _check(continue_with, MODES, "continue_with")
        _check(mode, MODES, "mode")
        group = uuid.uuid4().hex
        with self._tx():
            if parent_id is _LEAF:
                path = self.active_path(conversation_id)
                parent_id = path[-1].id if path else None
            plain = self.begin_reply(
                conversation_id, mode="plain", parent_id=parent_id, generation=generation,
                compare_group=group, activate=continue_with == Mode.PLAIN,
            )
            dflash = self.begin_reply(
                conversation_id, mode=mode, parent_id=parent_id, block_size=block_size,
                rollback=rollback, generation=generation, compare_group=group,
                activate=continue_with == mode,
            )
        return self.get_message(plain.id), self.get_message(dflash.id)

    def compare_siblings(self, message_id: int) -> list[Message]:
        """Every other reply of this message's Compare turn, oldest first (the DFlash2 side
        of a three-sided Compare too); [] when it is not one."""
        m = self.get_message(message_id)
        if not m.compare_group:
            return []
        rows = self._q(
            f"SELECT {_MSG_COLS} FROM messages WHERE compare_group = ? AND id != ? ORDER BY id",
            (m.compare_group, message_id),
        )
        return [_msg(r) for r in rows]

    def update_partial(
        self,
        message_id: int,
        *,
        content: str | None = None,
        reasoning: str | None = None,
        tool_calls: list[dict] | None = None,
        token_ids: list[int] | None = None,
        from_draft: list[bool] | None = None,
        force: bool = False,
    ) -> bool:
        """Record the growing state of a ``generating`` reply (whole values, not deltas).

        Written at most every ``partial_interval_s`` seconds per reply (or now with ``force``);
        a held-back state is written by the next call that may write, by :meth:`finish_reply`
        or by :meth:`close`.

        Returns:
            True when this call wrote to the database.
        """
        values = _given(content=content, reasoning=reasoning, tool_calls=tool_calls,
                        token_ids=token_ids, from_draft=from_draft)
        with self._lock:
            self._pending.setdefault(message_id, {}).update(values)
            last = self._last_write.get(message_id)
            now = time.monotonic()
            if force or last is None or now - last >= self.partial_interval_s:
                self._write_partial(message_id)
                return True
            return False

    def _write_partial(self, message_id: int, extra: dict | None = None) -> None:
        values = self._pending.pop(message_id, {})
        if extra:
            values.update(extra)
        self._last_write[message_id] = time.monotonic()
        if not values:
            return
        sets, params = [], []
        if "token_ids" in values or "from_draft" in values:
            ids = values.get("token_ids")
            flags = values.get("from_draft")
            if ids is not None:
                ids = [int(t) for t in ids]
                flags = [False] * len(ids) if flags is None else [bool(f) for f in flags]
                if len(flags) != len(ids):
                    raise ValueError(
                        f"from_draft has {len(flags)} flags for {len(ids)} token ids"
                    )
                values["token_ids"] = ids
            values["from_draft"] = _draft_string(flags or [])
        for key, value in values.items():
            if key in ("tool_calls", "token_ids", "summary", "generation", "rounds"):
                value = None if value is None else _dumps(value)
            sets.append(f"{key} = ?")
            params.append(value)
        sets.append("updated_at = ?")
        now = self._clock()
        params.append(now)
        with self._tx() as db:
            row = db.execute(
                "SELECT conversation_id FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            if row is None:
                raise MessageNotFoundError(f"no message with id {message_id}")
            db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*params, message_id))
            self._touch(row[0], now)

    def finish_reply(
        self,
        message_id: int,
        *,
        status: str = "complete",
        content: str | None = None,
        reasoning: str | None = None,
        tool_calls: list[dict] | None = None,
        token_ids: list[int] | None = None,
        from_draft: list[bool] | None = None,
        summary: dict | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
        rounds: list[dict] | None = None,
    ) -> Message:
        """End a reply: write its final state now (with anything held back by
        :meth:`update_partial`) and set its status (``complete``, ``stopped`` or ``error``).

        ``summary`` is ``Summary.to_dict()``. ``rounds`` are the chat-template messages of a
        reply that ran tools (``app.chat.reply.Reply.messages``; see ``Message.rounds``).
        Returns the stored message.
        """
        _check(status, STATUSES, "status")
        if status == "generating":
            raise ValueError("finish_reply needs a final status, not 'generating'")
        with self._lock:
            pending = self._pending.setdefault(message_id, {})
            pending.update(_given(content=content, reasoning=reasoning, tool_calls=tool_calls,
                                  token_ids=token_ids, from_draft=from_draft))
            extra = {
                "status": status,
                "finish_reason": finish_reason,
                "error": error,
                "writer_pid": None,
            }
            if summary is not None:
                extra["summary"] = summary
            if rounds:
                extra["rounds"] = list(rounds)
            self._write_partial(message_id, extra)
            self._last_write.pop(message_id, None)
            self._generating.discard(message_id)
        return self.get_message(message_id)

    # --- import ---------------------------------------------------------------------------

    def import_conversation(
        self, conversation: Conversation, messages: list[Message]
    ) -> Conversation:
        """Store a whole conversation as given (used by :mod:`app.chat.export`).

        ``messages`` carry ids local to the list (any distinct ints); ``parent_id``,
        ``active_child_id`` and ``conversation.active_root_id`` refer to them, and a parent must
        come before its children. Every field, timestamps included, is kept, except that a
        ``generating`` reply becomes ``interrupted``. New ids are given; all in one transaction.

        Raises:
            ValueError: a parent or active choice names no earlier message, an id repeats, or a
                field value is unknown (nothing is stored then).
        """
        ids: dict[int, int] = {}
        with self._tx() as db:
            created = self.new_conversation(
                conversation.title,
                target_path=conversation.target_path,
                drafter_path=conversation.drafter_path,
                settings=conversation.settings,
                created_at=conversation.created_at,
            )
            cid = created.id
            for m in messages:  # straight INSERTs: 200,000 messages in seconds, not minutes
                if m.id in ids:
                    raise ValueError(f"message id {m.id} appears twice")
                if m.parent_id is not None and m.parent_id not in ids:
                    raise ValueError(
                        f"message {m.id} follows message {m.parent_id}, which does not come "
                        "before it"
                    )
                created_at = float(m.created_at)
                row = _message_row(
                    m.role, m.content, created_at,
                    created_at if m.updated_at is None else float(m.updated_at),
                    reasoning=m.reasoning, tool_calls=m.tool_calls,
                    tool_call_id=m.tool_call_id, name=m.name, mode=m.mode,
                    block_size=m.block_size, rollback=m.rollback, generation=m.generation,
                    summary=m.summary, token_ids=m.token_ids, from_draft=m.from_draft,
                    finish_reason=m.finish_reason,
                    status="interrupted" if m.status == "generating" else m.status,
                    error=m.error, compare_group=m.compare_group, rounds=m.rounds)
                cur = db.execute(_INSERT_MESSAGE, (
                    cid, None if m.parent_id is None else ids[m.parent_id], *row))
                ids[m.id] = int(cur.lastrowid)
            links = []
            for m in messages:
                if m.active_child_id is None:
                    continue
                if m.active_child_id not in ids:
                    raise ValueError(
                        f"message {m.id}'s active child {m.active_child_id} is unknown"
                    )
                links.append((ids[m.active_child_id], ids[m.id]))
            db.executemany("UPDATE messages SET active_child_id = ? WHERE id = ?", links)
            root = conversation.active_root_id
            if root is not None and root not in ids:
                raise ValueError(f"the active first message {root} is unknown")
            db.execute(
                "UPDATE conversations SET title = ?, title_auto = ?, created_at = ?, "
                "updated_at = ?, active_root_id = ? WHERE id = ?",
                (
                    conversation.title,
                    1 if conversation.title_auto else 0,
                    conversation.created_at,
                    conversation.updated_at,
                    None if root is None else ids[root],
                    cid,
                ),
            )
        return self.get_conversation(cid)

    # --- editing ------------------------------------------------------------------------

    def edit_user_message(self, message_id: int, content: str) -> Message:
        """Replace a user message by an edited version: a new sibling with the same parent,
        made active. The turns after the old version leave the active path (so the prompt) but
        stay stored under it; :meth:`set_active` on the old one brings them back. The caller
        then starts a reply (:meth:`begin_reply`) to re-run from there."""
        old = self.get_message(message_id)
        if old.role != "user":
            raise ValueError(f"message {message_id} is a {old.role} message, not a user message")
        return self.add_message(old.conversation_id, "user", content, parent_id=old.parent_id)

    def prompt_for_reply(self, reply_id: int) -> list[dict]:
        """The chat-template messages a reply answers: the messages from the first one down to
        the reply's parent, whatever the active path is (:meth:`Message.to_prompt_dicts`).
        Use it after :meth:`begin_reply`, :meth:`regenerate` or :meth:`begin_compare` to build
        the prompt for that reply.

        Replies still ``generating``, failed replies (``error``) and empty replies are left
        out; ``stopped`` and ``interrupted`` replies are sent as far as they got. Reasoning is
        included as ``reasoning_content``; :func:`app.chat.history.fit_history` drops earlier
        turns' reasoning and trims to the context limit.
        """
        node = self.get_message(reply_id)
        parent_of = dict(self._q("SELECT id, parent_id FROM messages WHERE conversation_id = ?",
                                 (node.conversation_id,)))
        chain: list[int] = []  # the links first, then the rows in one read (a long chat)
        current = node.parent_id
        while current is not None:
            chain.append(current)
            current = parent_of.get(current)
        return self.prompt_for_path(self.messages_by_id(chain[::-1]))

    @staticmethod
    def prompt_for_path(messages: list[Message]) -> list[dict]:
        """The chat-template messages of ``messages`` (a path, first to last), leaving out
        the replies :meth:`prompt_for_reply` leaves out."""
        return _prompt_dicts(messages)


def readable_copy(path: Path | str) -> Store:
    """A memory-only store holding every row of the conversation database at ``path``, to
    show what a file the app cannot use (damaged, read-only) holds. The file is attached
    read-only (``mode=ro``: nothing is written to it) and read by whole-table scans, so a
    damaged index is never used (it answers wrong rows silently), into fresh tables whose
    indexes are built anew; the copy is then migrated to :data:`SCHEMA_VERSION` and its
    dead ``generating`` replies marked ``interrupted``, in memory. All rows or none.

    Raises:
        StorageError: a row could not be read (a damaged table page, a truncated file), or
            the file is no DFlash Chat database this version reads.
    """
    source = Path(path).absolute().as_uri() + "?mode=ro"
    scratch = sqlite3.connect(":memory:", uri=True, isolation_level=None)
    try:
        scratch.execute("ATTACH DATABASE ? AS src", (source,))
        version = scratch.execute(
            "SELECT max(version) FROM src.schema_version NOT INDEXED").fetchone()[0]
        if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise StorageError(f"{path} has schema version {version}, which this app does "
                               "not read")
        scratch.execute("BEGIN")
        scratch.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        scratch.execute("INSERT INTO schema_version VALUES (?)", (version,))
        for step in range(1, version + 1):  # the file's own schema, in memory
            for statement in _statements(MIGRATIONS[step]):
                scratch.execute(statement)
        for table in ("conversations", "messages"):
            cols = ", ".join(r[1] for r in scratch.execute(f"PRAGMA main.table_info({table})"))
            scratch.execute(f"INSERT INTO main.{table} ({cols}) "
                            f"SELECT {cols} FROM src.{table} NOT INDEXED")
        scratch.execute("COMMIT")
        scratch.execute("DETACH DATABASE src")
        copy = Store(":memory:", recover=False)
        try:
            scratch.backup(copy._db)
            copy._migrate()
            copy.recover_interrupted()
        except BaseException:
            copy.close()
            raise
        return copy
    except sqlite3.Error as exc:
        raise StorageError(f"could not copy the chats in {path}: {exc}") from exc
    finally:
        scratch.close()


def _prompt_dicts(messages: list[Message]) -> list[dict]:
    """Chat-template dicts of ``messages``, leaving out unusable replies."""
    return [
        d
        for m in messages
        if not (
            m.role == "assistant"
            and (
                m.status in ("generating", "error")
                or not (m.content or m.reasoning or m.tool_calls or m.rounds)
            )
        )
        for d in m.to_prompt_dicts()
    ]


# --- row helpers --------------------------------------------------------------------------

_CONV_COLS = (
    "id, title, title_auto, created_at, updated_at, target_path, drafter_path, settings, "
    "active_root_id"
)
_MSG_COLS = (
    "id, conversation_id, parent_id, active_child_id, role, content, reasoning, tool_calls, "
    "tool_call_id, name, mode, block_size, rollback, generation, summary, token_ids, from_draft, "
    "finish_reason, status, error, compare_group, created_at, updated_at, rounds"
)


_INSERT_MESSAGE = (
    "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, "
    "tool_calls, tool_call_id, name, mode, block_size, rollback, generation, summary, "
    "token_ids, from_draft, finish_reason, status, error, compare_group, writer_pid, "
    "rounds, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
"""One message row; its values: conversation id, parent id, then :func:`_message_row`."""


def _message_row(role: str, content: str, created: float, updated: float, *,
                 reasoning: str = "", tool_calls: list[dict] | None = None,
                 tool_call_id: str | None = None, name: str | None = None,
                 mode: str | None = None, block_size: int | None = None,
                 rollback: str | None = None, generation: dict | None = None,
                 summary: dict | None = None, token_ids: list[int] | None = None,
                 from_draft: list[bool] | None = None, finish_reason: str | None = None,
                 status: str = "complete", error: str | None = None,
                 compare_group: str | None = None, rounds: list[dict] | None = None) -> tuple:
    """The values of :data:`_INSERT_MESSAGE` after the conversation and parent ids.

    Raises:
        ValueError: unknown role/mode/rollback/status, or ``from_draft`` and ``token_ids``
            of different lengths.
    """
    _check(role, ROLES, "role")
    _check(status, STATUSES, "status")
    if mode is not None:
        _check(mode, MODES, "mode")
    if rollback is not None:
        _check(rollback, ROLLBACKS, "rollback")
    token_ids = [int(t) for t in (token_ids or [])]
    flags = [bool(f) for f in (from_draft or [])]
    if flags and len(flags) != len(token_ids):
        raise ValueError(f"from_draft has {len(flags)} flags for {len(token_ids)} token ids")
    if not flags:
        flags = [False] * len(token_ids)
    return (role, content, reasoning, _dumps(list(tool_calls or [])), tool_call_id, name, mode,
            None if block_size is None else int(block_size), rollback,
            _dumps(generation or {}), None if summary is None else _dumps(summary),
            _dumps(token_ids), _draft_string(flags), finish_reason, status, error,
            compare_group, os.getpid() if status == "generating" else None,
            _dumps(list(rounds or [])), created, updated)


def _conv(r: tuple) -> Conversation:
    return Conversation(
        id=r[0],
        title=r[1],
        title_auto=bool(r[2]),
        created_at=r[3],
        updated_at=r[4],
        target_path=r[5],
        drafter_path=r[6],
        settings=_loads(r[7], {}),
        active_root_id=r[8],
    )


def _msg(r: tuple) -> Message:
    return Message(
        id=r[0],
        conversation_id=r[1],
        parent_id=r[2],
        active_child_id=r[3],
        role=r[4],
        content=r[5],
        reasoning=r[6],
        tool_calls=_loads(r[7], []),
        tool_call_id=r[8],
        name=r[9],
        mode=r[10],
        block_size=r[11],
        rollback=r[12],
        generation=_loads(r[13], {}),
        summary=_loads(r[14], None),
        token_ids=_loads(r[15], []),
        from_draft=[c == "1" for c in (r[16] or "")],
        finish_reason=r[17],
        status=r[18],
        error=r[19],
        compare_group=r[20],
        created_at=r[21],
        updated_at=r[22],
        rounds=_loads(r[23], []),
    )


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None, default):
    if text is None or text == "":
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (no ';' inside the scripts' literals)."""
    return [s.strip() for s in script.split(";") if s.strip()]


def _snippet(text: str, needle: str, width: int = 120) -> str:
    """Up to ``width`` characters of ``text`` around the first case-insensitive ``needle``."""
    flat = " ".join(text.split())
    pos = flat.casefold().find(needle.casefold())
    if len(flat) <= width:
        return flat
    if pos < 0:
        return flat[: width - 1] + "\u2026"
    start = max(0, pos - (width - len(needle)) // 2)
    end = min(len(flat), start + width)
    start = max(0, end - width)
    out = flat[start:end]
    return ("\u2026" if start else "") + out + ("\u2026" if end < len(flat) else "")
