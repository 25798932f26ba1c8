"""The shown conversation: which chat is shown (selecting, a new chat, the unsent draft kept
per chat), what the side panel and the Compare view show of it, its settings line and
dialog, the links in its bubbles, earlier turns and token texts for Colour drafts.
:class:`TranscriptController` is one of the window's controllers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QLabel, QWidget

from app.chat.storage import StorageError, StoreWriteError
from app.chat.turns import LOAD_TURNS, ConversationView, Turn
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, Mode
from app.ui import settings as settings_mod
from app.ui.chat import ChatView, Composer
from app.ui.compare import CompareView
from app.ui.conversation_list import ConversationList
from app.ui.details import DetailsPanel
from app.ui.messages import MessageBar
from app.ui.state import WindowState
from app.ui.worker import Worker

log = logging.getLogger("app.ui.window")

MEASURING = "Measuring the block costs for the automatic block size…"
"""The status line while the worker measures a pair's block costs (``measure_block_costs``)."""


class TranscriptController(QObject):
    """The shown conversation and what the window shows of it (see the module doc).

    Args:
        state: the window's state (``conv``, ``store``, ``defaults``, ``model``, ...).
        worker: the window's worker (token texts of stored replies, ``piecesRequested``).
        messages: where the window says things.
        conv_side: the chat list (selecting a chat shows it).
        chat: the conversation view (its links come here).
        composer: the composer (the draft, the mode switch, the settings line).
        compare_view: the Compare view (a shown Compare turn, its choice).
        details: the side panel (reasoning, tool calls, figures of the shown reply).
        legend: the Colour drafts legend above the chat.
        parent: the window, parent of the settings dialog.

    Attributes:
        stop_reply: stops a running reply and waits up to the given milliseconds until it
            is stored, True when it was (the window sets ``ReplyController.wait_until_idle``;
            a new chat waits for it, so that it is the newest in the list).
        drafts: conversation id -> its unsent message (in memory only).
        settings_dialog: the last settings dialog opened (None before).
    """

    def __init__(self, state: WindowState, worker: Worker, messages: MessageBar,
                 conv_side: ConversationList, chat: ChatView, composer: Composer,
                 compare_view: CompareView, details: DetailsPanel, legend: QLabel,
                 parent: QWidget) -> None:
        super().__init__(parent)  # a QObject of the GUI thread: worker signals queue
        self.state = state
        self.worker = worker
        self.messages = messages
        self.conv_side = conv_side
        self.chat = chat
        self.composer = composer
        self.compare_view = compare_view
        self.details = details
        self.legend = legend
        self.host = parent
        self.stop_reply: Callable[[int], bool] = lambda _timeout_ms: True
        self.drafts: dict[int, str] = {}
        self.settings_dialog = None
        conv_side.selected.connect(self.on_conv_selected)
        conv_side.newRequested.connect(self.new_chat)
        compare_view.chosen.connect(self.on_compare_choice)
        composer.colour_box.toggled.connect(self.on_colour_toggled)
        worker.piecesReady.connect(self.on_pieces)
        worker.blockCostsReady.connect(self.on_block_costs)
        self._costs_model = None  # the loaded pair the rollbacks below were measured for
        self._costs_asked: set[str] = set()

    def refresh_list(self) -> None:
        """Redraw the chat list, the shown conversation selected."""
        self.conv_side.refresh(self.state.conv.id if self.state.conv is not None else None)

    def new_chat(self) -> ConversationView | None:
        """Start a new conversation and show it; an empty one already in the list (no
        messages, no title of its own) is shown instead of adding another "New chat".
        None (the storage banner says why, the shown chat stays) when the store cannot
        write one."""
        if self.state.busy:
            # the reply stops and is stored first (within a cycle, events keep flowing), so
            # the new chat is the newest in the list, not second below the stopped one
            self.stop_reply(5000)
        try:
            conv = self._empty_chat() or self.state.store.new()
        except StorageError as exc:
            log.error("new chat: %s", exc)
            self.messages.show_store_problem(f"Could not start a new chat: {exc}")
            return None
        self.save(conv)
        self.messages.clear_banner()  # a message about the previous chat does not belong here
        self.conv_side.search_box.clear()  # a filter would hide the new chat from the list
        self.select_conversation(conv)
        self.composer.edit.setFocus()
        return conv

    def _empty_chat(self) -> ConversationView | None:
        """The shown conversation when it has no messages and no title of its own, else the
        newest such one in the list (None when there is none)."""
        conv = self.state.conv
        if conv is not None and not conv.messages and conv.title == "New chat" \
                and not self.state.busy:
            return conv
        for c in self.state.store.list():
            if c.title == "New chat":
                full = self.state.store.get(c.id)
                if full is not None and not full.messages:
                    return full
        return None

    def select_conversation(self, conv: ConversationView | None) -> None:
        """Show ``conv`` (None: empty view)."""
        shown = self.state.conv.id if self.state.conv is not None else None
        new = conv.id if conv is not None else None
        # what is said about one chat goes with it: an error about its turn, or a note on
        # its reply or settings (errors about the app stay)
        self.messages.withdraw_banner(lambda e: e.chat not in (None, new) or
                                      (e.kind == "note" and shown not in (None, new)))
        if shown is not None and new not in (None, shown):
            self.swap_draft(shown, new)
        self.state.conv = conv
        self.refresh_list()
        self.chat.expanded = set()
        self.chat.earlier_steps = 0
        self.chat.follow = True
        self.chat.render(conv)
        last = next((m for m in reversed(conv.messages) if m.role == "assistant"), None) \
            if conv else None
        self.show_message_details(last)
        self.show_compare_of(last)
        self.update_settings_note()
        if self.chat.colour_drafts:
            self.request_pieces()
        if conv is not None:
            self.state.qs.setValue("last_conversation", conv.id)

    def swap_draft(self, old: int, new: int) -> None:
        """Keep the message typed but not sent in chat ``old`` with that chat, and put chat
        ``new``'s back in the composer (empty when it has none), the caret at its end. In
        memory only: a draft is not saved across runs."""
        text = self.composer.edit.toPlainText()
        if text.strip():
            self.drafts[old] = text
        else:
            self.drafts.pop(old, None)
        self.composer.edit.setPlainText(self.drafts.pop(new, ""))
        self.composer.edit.moveCursor(QTextCursor.End)

    def show_compare_of(self, last: Turn | None) -> None:
        """The Compare view belongs to the shown chat: its last turn's comparison, shown as
        it looked live (from what is stored, ``CompareView.show_turn``), or hidden."""
        if last is not None and last.is_compare and last.versions:
            self.compare_view.show_turn(last)
            self.request_compare_pieces()
        else:
            self.compare_view.hide()

    def shown_compare(self) -> tuple[int, Turn] | None:
        """(index, turn) of the Compare turn the Compare view shows for the shown chat (its
        last reply), None when the view is hidden or shows a reply being generated."""
        if self.state.conv is None or self.state.busy or self.compare_view.isHidden():
            return None
        for i in range(len(self.state.conv.messages) - 1, -1, -1):
            m = self.state.conv.messages[i]
            if m.role == "assistant":
                return (i, m) if m.is_compare and m.versions else None
        return None

    def request_compare_pieces(self) -> None:
        """Ask the worker for the token texts of the shown Compare turn's sides (read back
        without them), so its first divergence is marked as it was live (with a model
        loaded; :meth:`on_pieces` shows them)."""
        shown = self.shown_compare()
        if shown is not None:
            self.request_pieces(shown[0])

    def update_settings_note(self) -> None:
        """The composer's one-line summary of the settings a reply will use."""
        v = self.state.current_settings()
        block = v.get("block_size") or (
            DEFAULT_BLOCK if self.composer.mode() == Mode.LOOKUP else
            self.state.model.drafter_block_size if self.state.model else None)
        temp = v.get("temperature", 0.0)
        parts = ["greedy" if temp <= 0 else f"T {temp:g}", f"≤{v.get('max_tokens')} tok"]
        if self.composer.mode() in DRAFTING_MODES:
            size = f"block {block}" if block else "block: drafter's"
            if v.get("auto_block") is True and self.composer.mode() in DRAFTER_MODES:
                size = f"block auto ≤{block}" if block else "block auto"  # Lookup ignores it
            parts[:0] = [size, v.get("rollback", "tape")]
            if v.get("fast_verify"):
                parts.append("fast verify")
        if not v.get("thinking", True):
            parts.append("no thinking")
        self.composer.note.setText("Next reply: " + " · ".join(parts))
        self.composer.note.setToolTip("Settings for the next reply: " + ", ".join(parts)
                                      + " (File › Settings…)")

    def on_conv_selected(self, conv_id: int) -> None:
        """The chat list picked conversation ``conv_id``: show it (not while a reply runs)."""
        if self.state.busy:
            return
        conv = self.state.store.get(conv_id)
        if conv is not None and conv is not self.state.conv:
            self.select_conversation(conv)

    def show_message_details(self, msg: Turn | None) -> None:
        """Reasoning, tool calls and figures of ``msg`` in the right-hand panes."""
        self.state.shown_message = msg
        v = msg.version if msg else None
        block = self.state.block_for(v.result.mode, v.result.block_size) if v \
            else None
        model = self.state.model
        self.details.show_turn(msg, model.context_length if model else 0, block)

    def open_settings(self) -> None:
        """The settings dialog (non-blocking)."""
        dlg = settings_mod.SettingsDialog(
            self.state.current_settings(), self.host,
            max_block=self.state.model.drafter_block_size if self.state.model else None)
        dlg.saved.connect(self.on_settings_saved)
        dlg.setModal(True)
        dlg.show()
        self.settings_dialog = dlg

    def on_settings_saved(self, values: dict, where: str) -> None:
        """The settings dialog saved ``values``: as the defaults (``where`` "defaults"; the
        shown chat then follows them too, its own settings dropped) or as the shown chat's
        own settings (every value, so later defaults do not change them)."""
        if where == "defaults":
            self.state.defaults = values
            settings_mod.save_defaults(self.state.qs, values)
            if self.state.conv is not None and self.state.conv.settings:
                self.state.conv.settings = {}
                self.save(self.state.conv)
            self.messages.show_note("Saved as the defaults: this chat and every chat without "
                                    "its own settings use them from the next reply.")
        else:
            if self.state.conv is None and self.new_chat() is None:
                return  # the store could not make one (its banner says why)
            self.state.conv.settings = {k: v for k, v in values.items()
                                        if k in settings_mod.DEFAULTS}
            self.save(self.state.conv)
            self.messages.show_note(f"Saved for “{self.state.conv.title or 'this chat'}”: its "
                                    "next reply uses them.")
        self.update_settings_note()
        self.measure_block_costs()

    def measure_block_costs(self) -> None:
        """With the automatic block size now on and a pair with a drafter loaded, ask the
        worker to measure the pair's block costs now (``Worker.blockCostsRequested``), so
        the next reply does not spend about a second on it; once per load and rollback (a
        load with it on measures them in its warm-up)."""
        v = self.state.current_settings()
        model = self.state.model
        if v.get("auto_block") is not True or model is None or not model.drafter_name:
            return
        rollback = str(v.get("rollback", "tape"))
        if model is not self._costs_model:  # another load: nothing measured for it yet
            self._costs_model, self._costs_asked = model, set()
        if rollback in self._costs_asked:
            return
        self._costs_asked.add(rollback)
        self.messages.flash(MEASURING, 10000)
        self.worker.blockCostsRequested.emit(rollback)

    def on_block_costs(self, seconds: object) -> None:
        """``Worker.blockCostsReady``: say how long the measurement took (nothing when the
        costs were already known)."""
        if isinstance(seconds, float) and seconds >= 0.05:
            self.messages.flash(f"Measured the block costs in {seconds:.1f} s", 5000)
        elif MEASURING in self.messages.flash_label.text():  # not another message since
            self.messages.flash("", 0)

    def save(self, conv: ConversationView) -> None:
        """Store ``conv``'s settings and choices (a failure is said in a banner)."""
        try:
            self.state.store.save(conv)
        except StoreWriteError as exc:
            log.error("saving the conversation: %s", exc)
            self.messages.show_store_problem(
                f"Could not save the chat's settings and choices: {exc}")
        except Exception as exc:
            log.exception("saving the conversation")
            self.messages.show_banner(f"Could not save the conversation: {exc}")

    def on_compare_choice(self, key: str) -> None:
        """The side ``key`` of the last Compare turn is the one the chat continues from."""
        for m in reversed(self.state.conv.messages if self.state.conv else []):
            if m.role == "assistant" and m.compare:
                side = m.versions.get(key)
                if side is None or side.empty:  # nothing to continue from
                    return
                m.chosen = key
                self.save(self.state.conv)
                self.chat.render(self.state.conv)
                self.show_message_details(m)
                return

    def on_link(self, link: str) -> bool:
        """Follow a link of the conversation view that concerns what is shown: "earlier:",
        "version:<index>:<key>", "prompt:<row id>", "choose:<key>", "reasoning:<index>".
        Returns False for a link that is not one of these (the window sends those to the
        reply controller)."""
        conv, idle = self.state.conv, not self.state.busy
        if link.startswith("earlier:"):
            self.show_earlier()
        elif link.startswith("version:"):
            if conv is not None and idle:
                _, idx, key = link.split(":", 2)
                try:
                    msg = conv.messages[int(idx)]
                except (ValueError, IndexError):
                    return True
                if key in msg.versions:
                    msg.chosen = key
                    self.save(conv)
                    self.chat.render(conv)
                    self.show_message_details(msg)
        elif link.startswith("prompt:"):
            if conv is not None and idle:
                try:  # another version of an edited message, with the replies under it
                    shown = self.state.store.show_prompt_version(conv.id,
                                                                 int(link.split(":", 1)[1]))
                except (ValueError, StorageError) as exc:
                    self.messages.show_banner(f"Could not show that version: {exc}",
                                              chat=conv.id)
                    return True
                self.select_conversation(shown)
        elif link.startswith("choose:"):
            key = link.split(":", 1)[1]
            self.compare_view.set_choice(key)
            self.on_compare_choice(key)
        elif link.startswith("reasoning:"):
            if conv is not None:
                try:
                    index = int(link.split(":", 1)[1])
                    msg = conv.messages[index]
                except (ValueError, IndexError):
                    return True
                # the bubble's reasoning folds open or shut; the pane shows it either way
                self.chat.expanded ^= {index}
                self.details.reasoning_section.button.setChecked(True)
                self.show_message_details(msg)
                if idle:
                    self.chat.render(conv)
        else:
            return False
        return True

    def show_earlier(self) -> None:
        """Draw earlier turns of the shown conversation (its "Show earlier messages" link):
        ``app.ui.chat.VIEW_TURNS`` more, loading them from the store when they were not
        loaded (``ViewStore.get`` with a larger ``last``). What was in view stays in view.
        Not while a reply is written."""
        conv = self.state.conv
        if conv is None or self.state.busy:
            return
        chat = self.chat
        if chat.first_shown == 0 and conv.earlier:
            more = self.state.store.get(conv.id, last=len(conv.messages) + LOAD_TURNS)
            if more is None:
                return
            added = len(more.messages) - len(conv.messages)
            chat.expanded = {i + added for i in chat.expanded}
            conv.messages, conv.earlier = more.messages, more.earlier
        chat.earlier_steps += 1
        sb = chat.verticalScrollBar()
        from_bottom = sb.maximum() - sb.value()
        chat.follow = False
        chat.render(conv)
        sb.setValue(max(0, sb.maximum() - from_bottom))

    def on_colour_toggled(self, on: bool) -> None:
        """Colour drafts turned on or off: redraw, asking for token texts when on."""
        from app.ui.render import draft_legend_html

        self.chat.colour_drafts = on
        self.legend.setText(draft_legend_html(self.chat.palette_colours) if on else "")
        self.legend.setVisible(on)
        if on:
            self.request_pieces()
        self.chat.render(self.state.conv, streaming=self.state.busy)

    def request_pieces(self, index: int | None = None) -> None:
        """Ask the worker for the token texts of replies loaded without them, or with texts
        that do not spell their stored answer (another model's tokenizer gave them; needs the
        tokenizer, which lives on the worker): every turn's, or only the turn at ``index``."""
        from app.ui.render import spells_its_text

        if self.state.conv is None or self.state.model is None:
            return
        jobs = {}
        for i, m in enumerate(self.state.conv.messages):
            if index is not None and i != index:
                continue
            for key, v in m.versions.items():
                if v.result.tokens and not (v.result.pieces and spells_its_text(v.result)):
                    jobs[(self.state.conv.id, i, key)] = list(v.result.tokens)
        if jobs:
            self.worker.piecesRequested.emit(jobs)

    def on_pieces(self, pieces: dict) -> None:
        """``Worker.piecesReady``: token texts by (conversation id, turn index, version key);
        the shown chat's replies take the ones that match their tokens, and are redrawn."""
        changed: set[int] = set()
        conv = self.state.conv
        for (conv_id, i, key), texts in pieces.items():
            if conv is None or conv.id != conv_id or i >= len(conv.messages):
                continue
            v = conv.messages[i].versions.get(key)
            if v is not None and len(texts) == len(v.result.tokens):
                v.result.pieces = texts
                changed.add(i)
        if changed and self.chat.colour_drafts and not self.state.busy:
            self.chat.render(self.state.conv)
        shown = self.shown_compare()
        if shown is not None and shown[0] in changed:  # its first divergence can be marked
            self.compare_view.show_turn(shown[1])

