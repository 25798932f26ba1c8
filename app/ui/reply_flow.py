"""The window's reply flow: starting a reply (send, compare, regenerate, edit), stopping it,
rendering the worker's event batches and showing the stored result.

:class:`ReplyController` is the generation half of the window's controllers (given the
widgets and the worker it uses). Each event type has one handler, picked with
``isinstance`` (:attr:`ReplyController._HANDLERS`); the request's state is a typed
:class:`~app.ui.run_state.ReplyRun`. The window writes nothing of a reply: it sends a
:class:`~app.chat.stored_turn.TurnRequest` and the worker stores the turn and builds the prompt
from the stored rows (``app.chat.stored_turn.run_turn``); when ``TurnStored`` arrives the
view reads the turn back (``ViewStore.reload_turn``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from PySide6.QtCore import QElapsedTimer, QEventLoop, QObject
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.chat.baseline import (
    PlainSample,
    SlowStreak,
    SpeedUp,
    long_context,
    unfit_drafter_note,
)
from app.chat.conversation import all_reasoning
from app.chat.events import (
    ContentDelta,
    CycleEvent,
    Done,
    Notice,
    PipelineWarning,
    ReasoningDelta,
    ReplyFailed,
    ReplyFinished,
    RoundResumed,
    RoundStarted,
    SaveFailed,
    TokenEvent,
    ToolCallDelta,
    ToolResultEvent,
    TurnBegun,
    TurnNotStarted,
    TurnNotStored,
    TurnRefused,
    TurnStored,
    tool_call_dict,
)
from app.chat.settings import SettingError
from app.chat.stored_turn import TurnRequest
from app.chat.turns import ReplyResult, Turn, version_key
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, Mode
from app.ui import settings as settings_mod
from app.ui.banners import Priority
from app.ui.chat import ChatView, Composer
from app.ui.compare import CompareView
from app.ui.conversation_list import ConversationList
from app.ui.details import DetailsPanel
from app.ui.messages import MessageBar
from app.ui.run_state import ReplyRun, SideRun
from app.ui.state import WindowState
from app.ui.text import mode_label
from app.ui.transcript import TranscriptController
from app.ui.worker import UiEvent, Worker

log = logging.getLogger("app.ui.window")

BENCH_WAIT = ("The short benchmark is still running: this reply starts when it ends "
              "(its results open in a window)")
"""The note shown for a reply sent while the short benchmark runs."""


def edit_message_text(parent, text: str) -> tuple[str, bool]:
    """Ask for the edited text of a message: (text, accepted). The box wraps long lines at
    its width and Tab moves the focus on (to the buttons), as in a form, instead of typing
    a tab character."""
    dlg = QDialog(parent)
    dlg.setWindowTitle("Edit message")
    layout = QVBoxLayout(dlg)
    label = QLabel("Message")
    layout.addWidget(label)
    box = QPlainTextEdit(text)
    box.setTabChangesFocus(True)
    box.setLineWrapMode(QPlainTextEdit.WidgetWidth)
    box.setWordWrapMode(QTextOption.WrapAtWordBoundaryOrAnywhere)
    box.setAccessibleName("Message")
    label.setBuddy(box)
    layout.addWidget(box)
    buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
    buttons.accepted.connect(dlg.accept)
    buttons.rejected.connect(dlg.reject)
    layout.addWidget(buttons)
    dlg.resize(520, 300)
    box.setFocus()
    ok = dlg.exec() == QDialog.Accepted
    text = box.toPlainText()
    dlg.deleteLater()
    return text, ok


class ReplyController(QObject):
    """Send / compare / regenerate / edit / continue, the render tick and the end of a reply
    (see the module doc).

    Args:
        state: the window's state (``model``, ``conv``, ``busy``, ``defaults``, ...).
        worker: the window's :class:`app.ui.worker.Worker`: takes each ``TurnRequest`` and
            sends the reply's events back.
        messages: where the window says things.
        transcript: the shown conversation (a new chat, showing a turn, saving choices).
        conv_side: the chat list (locked while a reply is written).
        chat: the conversation view (the reply streams into it).
        composer: the composer (its mode, its message, Send and Stop).
        compare_view: the Compare view (a Compare turn's sides as they run).
        centre_split: the splitter holding the chat and the Compare view.
        details: the side panel (reasoning, tool calls, live figures).
        parent: the window, parent of the edit dialog.
        finished: called with the finished :class:`~app.chat.turns.Turn` once it is read
            back from the store.

    Attributes:
        run: the running reply's state (:class:`~app.ui.run_state.ReplyRun`), None when none.
        pending: the events received since the last render tick.
    """

    def __init__(self, state: WindowState, worker: Worker, messages: MessageBar,
                 transcript: TranscriptController, conv_side: ConversationList,
                 chat: ChatView, composer: Composer, compare_view: CompareView,
                 centre_split: QSplitter, details: DetailsPanel, parent: QWidget,
                 finished: Callable[[Turn], None]) -> None:
        super().__init__(parent)  # a QObject of the GUI thread: worker signals queue
        self.state = state
        self.worker = worker
        self.messages = messages
        self.transcript = transcript
        self.conv_side = conv_side
        self.chat = chat
        self.composer = composer
        self.compare_view = compare_view
        self.centre_split = centre_split
        self.details = details
        self.host = parent
        self._finished = finished
        self.req = 0
        self.run: ReplyRun | None = None
        self.pending: list[UiEvent] = []
        self._event_at = 0.0
        self._details_changed = False
        worker.events.connect(self.on_events)
        worker.finished.connect(self.on_finished)
        composer.send.connect(self.send)
        composer.compare.connect(self.compare)
        composer.stop.connect(self.stop)
        composer.modeChanged.connect(self.on_mode_changed)

    def send(self, text: str) -> bool:
        """Send ``text`` as a user message and generate a reply in the selected mode.
        Returns False (with a message) when it cannot start; a turn the worker then cannot
        store ends at once with a banner and the chat as it was (``TurnNotStarted``)."""
        return self._start(text, [""])

    def compare(self, text: str) -> bool:
        """Run ``text`` plain then with each drafter the pair has (DFlash, then DFlash2; the
        one it has when it has one), each from the same prompt; show them side by side."""
        modes = set(self.state.model.modes) if self.state.model is not None else set()
        drafters = tuple(m for m in DRAFTER_MODES if m in modes) or (Mode.DFLASH,)
        sides = (Mode.PLAIN, *drafters)
        return self._start(text, [str(m) for m in sides])

    def regenerate(self) -> bool:
        """Generate a new version of the last reply in the selected mode; the earlier
        versions stay and can be switched back to (links under the reply)."""
        conv = self.state.conv
        if conv is None or len(conv.messages) < 2 or conv.messages[-1].role != "assistant":
            self.messages.show_banner("There is no reply to regenerate yet.")
            return False
        if conv.messages[-1].compare:  # the menu item is disabled then (its tooltip says why)
            self.messages.show_note("A Compare turn cannot be regenerated: its sides are its "
                                    "versions. Pick one with “continue from … instead”.")
            return False
        return self._start(conv.messages[-2].content, [""], again=conv.messages[-1])

    def edit_message(self, index: int, text: str | None = None) -> bool:
        """Replace the user message at ``index`` by an edited version and re-run from there.

        The later turns leave the conversation view and the prompt; the database keeps them
        on the earlier branch (``Store.edit_user_message``). ``text`` None asks for it."""
        conv = self.state.conv
        if self.state.busy or conv is None or not 0 <= index < len(conv.messages) or \
                conv.messages[index].role != "user":
            return False
        old = conv.messages[index]
        if text is None:
            text, ok = edit_message_text(self.host, old.content)
            if not ok:
                return False
        if not text.strip():
            return False
        if self.state.model is None:
            self._say_no_model()
            return False
        if "" not in old.ids:
            return False
        return self._start(text, [""], edited=(index, old))

    CONTINUE_COMPARE = ("A Compare turn is not continued: its sides are compared as they "
                        "ran. Raise Max tokens in File › Settings and send the prompt again.")
    """Why Continue is not offered on a Compare turn (the footer's tooltip says it too)."""

    def continue_reply(self) -> bool:
        """Continue the last reply where Max tokens cut it (the footer's Continue link): the
        same reply goes on, in the mode it was made in and with the current settings (Max
        tokens more), and its bubble grows; no user message is added. The worker resumes
        from the reply's token ids (``TurnRequest.continue_of``) and stores the whole reply
        in the same row. Returns False (with a message) when it cannot start; a reply the
        worker cannot continue (its model is not loaded, ...) ends at once with a banner
        and the reply as it was."""
        conv = self.state.conv
        last = conv.messages[-1] if conv is not None and conv.messages else None
        v = last.version if last is not None and last.role == "assistant" else None
        if self.state.busy or v is None:
            return False
        if last.compare:
            self.messages.show_note(self.CONTINUE_COMPARE)
            return False
        if v.stopped or v.error or v.result.finish_reason != "length":
            self.messages.show_note("Only a reply that Max tokens ended can be continued.")
            return False
        if last.chosen not in last.ids:
            return False
        return self._start("", [""], continued=last)

    def _say_no_model(self) -> None:
        """Why nothing can be sent: a load is running, or nothing is loaded at all."""
        if self.state.loading is not None:
            self.messages.show_note("No model is loaded yet: wait for loading to finish.")
        else:
            self.messages.show_banner("No model is loaded: pick one with File › Models…, or "
                                      "File › Use default model for the bundled demo.")

    def _start(self, text: str, tags: list[str], again: Turn | None = None,
               edited: tuple[int, Turn] | None = None,
               continued: Turn | None = None) -> bool:
        """Show the new turn and ask the worker to store and generate it (a
        :class:`~app.chat.stored_turn.TurnRequest`); the window writes nothing of it.
        ``again``: the reply to regenerate; ``edited``: (index, user turn) being edited;
        ``continued``: the last reply, to continue where Max tokens cut it (its chosen
        version, in the mode that made it)."""
        if self.state.busy:
            return False
        if len(self.state.pending_writes):  # kept writes first: the turns stay in order
            self.messages.retry_saves()
        if self.state.model is None:
            self._say_no_model()
            if again is None and continued is None:
                self.composer.edit.setPlainText(text)
            return False
        before = continued.version.result if continued is not None else None
        mode = before.mode if before is not None else self.composer.mode()
        if before is None and mode == Mode.DFLASH2 and "dflash2" not in self.state.model.modes \
                and tags == [""]:
            mode = "dflash" if self.state.model.drafter_name else "plain"
        if before is None and (mode == Mode.DFLASH or tags != [""]) and \
                not self.state.model.drafter_name:
            if tags != [""]:
                self.messages.show_banner("Compare needs a DFlash drafter for this target.")
                return False
            mode = "plain"
        try:  # the one typed record the worker, the store and the session take
            conv = self.state.conv
            rs = settings_mod.reply_record(self.state.defaults, conv.settings if conv else {},
                                           mode)
        except SettingError as exc:  # e.g. a hand-edited chat override out of range
            self.messages.show_banner(f"Could not start the reply: {exc}. Change it in File › "
                                      "Settings…")
            if again is None and continued is None:
                self.composer.edit.setPlainText(text)
            return False
        if self.state.conv is None and self.transcript.new_chat() is None:
            return False  # the store could not make one (its banner says why)
        conv = self.state.conv
        key = mode
        shown = again or continued
        previous = (list(conv.messages), shown.chosen if shown is not None else "")
        if edited is not None:  # the turns after the edited message leave the view
            conv.messages = conv.messages[:edited[0]] + [Turn("user", text)]
        if continued is not None:
            reply = continued
            key = reply.chosen
            reply.chosen = ""  # the reply streams in its own place, growing from its text
        elif again is None:
            if edited is None:
                conv.messages.append(Turn("user", text))
            reply = Turn("assistant", compare=tags != [""])
            conv.messages.append(reply)
        else:
            reply = again
            reply.chosen = ""  # the new version streams in place of the shown one
            key = version_key(mode, reply.versions)
        request = TurnRequest(
            conv.id, text, rs, tuple(tags), key if tags == [""] else "",
            rs.system_prompt,
            regenerate_of=next(iter(again.ids.values())) if again is not None else None,
            edit_of=edited[1].ids[""] if edited is not None else None,
            continue_of=continued.ids[key] if continued is not None else None)
        self.transcript.refresh_list()
        self.req += 1
        self.run = ReplyRun.start(self.req, conv, reply, tags, mode, key, rs,
                                  self.state.model.context_length)
        self.run.previous = previous
        self.run.text = text if again is None and continued is None else ""
        self.run.system_prompt = rs.system_prompt
        self.run.continued = before
        for side in self.run.sides.values():
            side.stats.mode = side.tag or mode
        self.pending = []
        self.state.busy = True
        self.composer.set_busy(True)
        self.conv_side.set_busy(True)
        self.messages.clear_banner()
        self.details.clear()
        if before is not None:  # the reply so far, until the worker says where it resumes
            side = self.run.sides[""]
            side.text, side.reasoning = before.content, before.all_reasoning()
            for call in before.tool_calls:
                side.merge_call(tool_call_dict(call), is_result=True)
            self.details.append_reasoning(side.reasoning)
            self.details.tools.set_calls(list(side.calls.values()))
        self.state.shown_message = reply
        self.chat.follow = True
        self.chat.render(conv, streaming=True)
        if tags != [""]:
            self.compare_view.show()
            total = sum(self.centre_split.sizes()) or 600
            self.centre_split.setSizes([int(total * 0.45), int(total * 0.55)])
            self.compare_view.set_results(None, None, sides=tuple(tags))
            self.compare_view.show_running(tags[0])
        else:  # the view shows the last turn's comparison, and the last turn is not one now
            self.compare_view.hide()
        if self.state.benchmarking:  # the worker runs one job at a time: say why nothing comes yet
            self.messages.show_note(BENCH_WAIT)
        self.worker.replyRequested.emit(self.req, request)
        return True

    def wait_until_idle(self, timeout_ms: int = 15000) -> bool:
        """Stop the running reply and wait (events keep flowing) until it has ended and is
        stored; True when it did within ``timeout_ms``."""
        self.stop()
        loop = QEventLoop()
        clock = QElapsedTimer()
        clock.start()
        while self.state.busy and clock.elapsed() < timeout_ms:
            loop.processEvents(QEventLoop.AllEvents, 50)
            time.sleep(0.005)
        return not self.state.busy

    def send_example(self, index: int) -> bool:
        """Send the loaded model's example ``index`` (tools turned on for this chat when the
        example needs them and they are off, saying so)."""
        m = self.state.model
        if m is None or not 0 <= index < len(m.examples):
            return False
        ex = m.examples[index]
        turned_on = ex.needs_tools and not self.state.current_settings().get("use_tools", True)
        if turned_on:
            if self.state.conv is None and self.transcript.new_chat() is None:
                return False  # the store could not make one (its banner says why)
            self.state.conv.settings = dict(self.state.conv.settings, use_tools=True)
            self.transcript.save(self.state.conv)
        sent = self.send(ex.prompt)
        if turned_on:  # after the reply started (starting clears the banner)
            self.messages.show_note("Tools are on for this chat: this example needs them.")
        return sent

    def on_mode_changed(self, mode: str) -> None:
        """The switch moved: the settings line follows; mid-reply, say it is for the next."""
        self.transcript.update_settings_note()
        run = self.run
        if self.state.busy and run is not None and not run.compare:
            now, new = mode_label(run.mode), mode_label(mode)
            self.composer.mode_note.setText(
                "" if new == now else f"{new} applies to the next reply; this one stays {now}.")

    STOPPING = "Stopping…"
    """The status message from Stop until the reply has ended."""

    def stop(self) -> None:
        """Stop the running reply (takes effect within one cycle or token)."""
        if self.state.busy and self.run is not None:
            self.worker.cancel(self.run.id, interrupted=self.run.interrupted)
            self.messages.flash(self.STOPPING, 3000)

    def on_events(self, req_id: int, batch: list) -> None:
        """``Worker.events``: keep the batch of :class:`~app.ui.worker.UiEvent` of the running
        request ``req_id`` for the next render tick (another request's are dropped)."""
        if self.run is not None and req_id == self.run.id:
            self.pending.extend(batch)

    def render_pending(self) -> None:
        """Apply the events received since the last tick (the render timer's slot): each
        event goes to its handler, found by type (:attr:`_HANDLERS`)."""
        run = self.run
        if run is None or not self.pending:
            return
        batch, self.pending = self.pending, []
        self._details_changed = False
        for ui in batch:
            side = run.side(ui.tag)
            self._event_at = ui.at  # when the worker had it (first token, tok/s clocks)
            if side.tag != run.current:
                run.current = side.tag
                side.stats.started = ui.at  # this side's clock starts with it, not the turn's
                if self._shown(run):
                    self.details.reasoning.clear()
                    self.compare_view.show_running(side.tag)
            for cls, handler in self._HANDLERS:
                if isinstance(ui.event, cls):
                    handler(self, side, ui.event)
                    break
        self._show_progress(run)

    @property
    def writing(self) -> bool:
        """True while a side of the running request has not finished its reply (no
        ``ReplyFinished`` yet). After that the worker only stores and measures it, which
        quitting waits for, so nothing written is lost then."""
        run = self.run
        return run is not None and any(side.result is None for side in run.sides.values())

    def _shown(self, run: ReplyRun | None) -> bool:
        """Whether ``run`` fills the conversation on screen (True without a run: nothing
        else to show it for). A reply keeps running (or finishing, after Stop) while the user
        looks at another chat, e.g. a new one: its events then update the reply's own state,
        not the views, which show that chat."""
        return run is None or run.conv is self.state.conv

    def _show_progress(self, run: ReplyRun) -> None:
        """Stream text, tool calls and figures of the side running now (the worker saves
        its growth)."""
        if not self._shown(run):
            return
        if not run.compare:
            side = run.sides[""]
            shown = side.text
            if not shown and side.reasoning:
                shown = "*Thinking… (the reasoning pane shows it live)*"
            self.chat.set_stream(shown)
        cur = run.sides[run.current]
        if run.compare and cur.result is None:
            self.compare_view.stream(cur.tag, cur.text)
        if self._details_changed:
            self.details.tools.set_calls(list(cur.calls.values()))
        self.details.live.show_stats(cur.stats, self.state.block_for(cur.tag or run.mode,
                                                                     run.settings.block_size))

    # one handler per event type
    def _on_token(self, side: SideRun, ev: TokenEvent) -> None:
        side.stats.on_token(self._event_at)
        side.tokens.append(ev.token_id)
        side.flags.append(ev.from_draft)

    def _on_cycle(self, side: SideRun, ev: CycleEvent) -> None:
        side.stats.on_cycle(ev)

    def _on_content(self, side: SideRun, ev: ContentDelta) -> None:
        side.text += ev.text

    def _on_reasoning(self, side: SideRun, ev: ReasoningDelta) -> None:
        side.reasoning += ev.text
        if self._shown(self.run):
            self.details.append_reasoning(ev.text)

    def _on_tool_call(self, side: SideRun, ev: ToolCallDelta) -> None:
        side.merge_call(tool_call_dict(ev.call), is_result=False)
        self._details_changed = True

    def _on_tool_result(self, side: SideRun, ev: ToolResultEvent) -> None:
        side.merge_call(tool_call_dict(ev.run), is_result=True)
        self._details_changed = True

    def _on_engine_done(self, side: SideRun, ev: Done) -> None:
        side.stats.on_done(ev.summary)  # one round; the reply's total comes at its end

    def _on_round(self, side: SideRun, ev: RoundStarted) -> None:
        side.stats.on_round(ev.index, ev.prompt_tokens, self._event_at)
        if ev.index > 0 and side.reasoning and not side.reasoning.endswith("\n\n"):
            side.reasoning += "\n\n"  # the next round thinks anew: its own paragraph
            if self._shown(self.run):
                self.details.append_reasoning("\n\n")

    def _on_resumed(self, side: SideRun, ev: RoundResumed) -> None:
        """A continued reply's cut round as the worker's pipeline read it again: the bubble
        and the reasoning pane go on from exactly these texts (the earlier rounds' reasoning
        first, for a tool reply)."""
        before = self.run.continued if self.run is not None else None
        earlier = ""
        if before is not None and before.rounds > 1:
            earlier = all_reasoning(before.messages[:-1], "")
        side.text = ev.content
        side.reasoning = earlier + ("\n\n" if earlier else "") + ev.reasoning
        side.tokens, side.flags = list(ev.tokens), list(ev.from_draft)
        side.stats.continues_after = (before.summary.generated_tokens
                                      if before is not None and before.summary is not None
                                      else len(ev.tokens))
        if self._shown(self.run):
            self.details.reasoning.setPlainText(side.reasoning)

    def _on_warning(self, side: SideRun, ev: PipelineWarning) -> None:
        if ev.message and self._shown(self.run):
            self.messages.flash(ev.message, 8000)

    def _on_notice(self, side: SideRun, ev: Notice) -> None:
        """The prompt was fitted to the context: said above lesser notes (the reply's footer
        keeps it too, ``ReplyResult.context_note``)."""
        if self._shown(self.run):
            self.messages.show_note(ev.message, Priority.WARNING)

    def _on_failed(self, side: SideRun, ev: ReplyFailed) -> None:
        side.error = ev.message  # stored with the reply, shown when its chat is
        if self._shown(self.run):
            self.messages.show_banner(ev.message, chat=self.run.conv.id)

    def _on_reply_finished(self, side: SideRun, ev: ReplyFinished) -> None:
        self._finish_side(side, ev.result)

    def _on_begun(self, side: SideRun, ev: TurnBegun) -> None:
        run = self.run
        run.msg.ids.update(ev.reply_ids)
        if ev.user_id is not None and len(run.conv.messages) > 1:
            run.conv.messages[-2].ids[""] = ev.user_id
        try:  # the title comes with the first message
            run.conv.title = self.state.store.db.get_conversation(ev.conversation_id).title or \
                run.conv.title
        except Exception:
            log.exception("reading the conversation's title")
        self.transcript.refresh_list()

    def _on_not_started(self, side: SideRun, ev: TurnNotStarted) -> None:
        self.run.not_started = ev.message
        self.run.refused = isinstance(ev, TurnRefused)
        self.run.not_stored = isinstance(ev, TurnNotStored)

    def _on_save_failed(self, side: SideRun, ev: SaveFailed) -> None:
        """A write of the running reply failed: said at once in the storage banner (the
        reply goes on, on screen; whatever it is shown in)."""
        self.run.save_failed = True
        self.messages.show_store_problem(
            f"The reply being written is not being saved: {ev.message}. It stays on screen "
            "(copy it, or export the chat), and it is saved when it ends if there is room "
            "then, else as soon as there is")

    def _on_stored(self, side: SideRun, ev: TurnStored) -> None:
        self.run.stored = ev

    _HANDLERS = (
        (TokenEvent, _on_token),
        (CycleEvent, _on_cycle),
        (ContentDelta, _on_content),
        (ReasoningDelta, _on_reasoning),
        (ToolCallDelta, _on_tool_call),
        (ToolResultEvent, _on_tool_result),
        (Done, _on_engine_done),
        (RoundStarted, _on_round),
        (RoundResumed, _on_resumed),
        (PipelineWarning, _on_warning),
        (Notice, _on_notice),
        (ReplyFailed, _on_failed),
        (ReplyFinished, _on_reply_finished),
        (TurnBegun, _on_begun),
        (TurnNotStarted, _on_not_started),
        (SaveFailed, _on_save_failed),
        (TurnStored, _on_stored),
    )
    """(event type, handler) pairs: each event goes to the first type it is an instance of."""

    def _finish_side(self, side: SideRun, result: ReplyResult) -> None:
        if result.mode in DRAFTING_MODES and not result.block_size and self.state.model:
            result.block_size = (DEFAULT_BLOCK if result.mode == Mode.LOOKUP
                                 else self.state.model.drafter_block_size)
        side.result = result
        if result.summary is not None:
            side.stats.apply_summary(result.summary, result.round_summaries or
                                     side.stats.round_summaries)
        calls_of_result = bool(result.tool_calls)  # else the pane has shown them live
        if not calls_of_result and side.calls:
            result.tool_calls = list(side.calls.values())
        if not self._shown(self.run):
            return
        if result.note and not side.error:  # a failure's banner stays; the note repeats it
            self.messages.show_note(result.note)
        if calls_of_result:
            self.details.tools.set_calls(result.tool_calls)
        if self.run is not None and self.run.compare:  # its figures while the next side runs
            self.compare_view.show_side(side.tag, result)

    def on_finished(self, req_id: int) -> None:
        """The worker is done with the request: the turn is stored (``TurnStored``), so the
        view reads it back (``ViewStore.reload_turn``) keeping the results streamed live."""
        run = self.run
        if run is None or req_id != run.id:
            return
        self.render_pending()
        msg: Turn = run.msg
        self.state.busy = False
        self.run = None
        if self.messages.flash_label.text().endswith(self.STOPPING):  # not "Stopping…" now
            self.messages.flash("", 0)
        self.composer.set_busy(False)
        self.conv_side.set_busy(False)
        if run.not_started is not None or run.stored is None:
            self._not_started(run)
            return
        if run.stored.pending is not None:  # kept, and tried again until the store takes it
            self.messages.keep_unsaved(run.stored.pending, run.stored.error)
        elif run.stored.error:  # the reply stays on screen (live); the store says why
            self.messages.show_store_problem(
                f"Could not save the reply: {run.stored.error}. It stays on screen until you "
                "quit: copy what you want to keep")
        elif run.save_failed:  # its growth was not saved, but its final state is
            self.messages.say_saved("Saved: the reply is stored now, whole")
        live = {run.version_key(t): sd.result for t, sd in run.sides.items()
                if sd.result is not None}
        try:
            self.state.store.reload_turn(run.conv, msg, live)
        except Exception as exc:
            log.exception("reading the stored turn back")
            self.messages.show_banner(f"Could not read the conversation back: {exc}")
        if run.compare and run.conv is self.state.conv:
            result = {k: side.result for k, side in run.sides.items()}
            self.compare_view.set_results(result["plain"], result.get("dflash"), msg.chosen,
                                          result.get("dflash2"), sides=tuple(run.sides))
        self._measure_speed(run)
        self.transcript.refresh_list()
        if not run.compare and not run.interrupted and not run.stored.error:
            # while the user reads and writes: the next turn then prefills only its message
            self.worker.prefillRequested.emit(run.conv.id, run.settings,
                                              run.system_prompt)
        if run.conv is self.state.conv:
            self.chat.render(self.state.conv)
            self.transcript.show_message_details(msg)
            # a Compare turn: the figures of the side the chat continues from (the one shown)
            key = msg.chosen if run.compare and msg.chosen in run.sides else run.current
            last = run.sides.get(key)
            if last is not None:
                block = self.state.block_for(key or run.mode, run.settings.block_size)
                self.details.live.show_stats(last.stats, block)
                self.details.say_continued(last.result)
        self._finished(msg)

    def _not_started(self, run: ReplyRun) -> None:
        """The turn could not be stored, or its prompt does not fit the context
        (``TurnRefused``): the view and the figures go back to what they were, the message
        goes back to the composer, and the banner says why."""
        chat = run.conv.id
        if run.refused:
            self.messages.show_banner(run.not_started, chat=chat)
        elif run.not_stored:  # a store that cannot write: its banner stays
            self.messages.show_store_problem(
                "Could not save this turn, so no reply was started (your message is back in "
                f"the box): {run.not_started}")
        elif run.continued is not None:
            self.messages.show_banner("Could not continue the reply, so it is kept as it was: "
                                      f"{run.not_started or 'the worker stopped'}", chat=chat)
        else:
            self.messages.show_banner("Could not save this turn, so no reply was started: "
                                      f"{run.not_started or 'the worker stopped'}", chat=chat)
        run.conv.messages, chosen = run.previous
        if run.msg.versions:  # a regenerated reply shows its earlier version again
            run.msg.chosen = chosen if chosen in run.msg.versions else next(iter(run.msg.versions))
        if run.text and not self.composer.edit.toPlainText().strip():
            self.composer.edit.setPlainText(run.text)
        if run.conv is self.state.conv:
            self.chat.render(self.state.conv)
            # the Compare view as it was: the (restored) last turn's comparison, or none
            last = next((m for m in reversed(self.state.conv.messages) if m.role == "assistant"),
                        None)
            self.transcript.show_compare_of(last)
            self.transcript.show_message_details(last)  # not the figures of a run that never ran
        elif run.compare:
            self.compare_view.hide()

    def _measure_speed(self, run: ReplyRun) -> None:
        """Plain sides become baselines; DFlash sides get their speed-up against one (in
        run order, so a Compare's DFlash side is measured against its own plain side)."""
        if self.state.model is None:
            return
        own_plain = None  # a Compare's plain side: its drafting sides' baseline
        for tag, side in run.sides.items():
            r = side.result
            # a side the user's Stop cut is partial; one that had finished is measured
            if r is None or r.summary is None or side.error or r.finish_reason == "cancelled":
                continue
            s = r.summary
            key = (self.state.pair_key(), self.state.model.dtype, run.settings.max_tokens,
                   int(s.prompt_tokens))
            if r.mode == Mode.PLAIN:
                sample = PlainSample(*key, s.tok_per_s,
                                     "Compare" if run.compare else "plain reply")
                self.state.baselines.add(sample)
                own_plain = sample if run.compare else None
            elif r.mode in DRAFTING_MODES:
                r.speedup = (SpeedUp.paired(s.tok_per_s, own_plain) if own_plain is not None
                             else self.state.baselines.speedup(s.tok_per_s, *key))
                r.speed_checked = True
                self._store_speedup(run.msg.ids.get(run.version_key(tag)), r.speedup)
                note = r.context_note
                long = long_context(s.prompt_tokens, self.state.model.context_length,
                                    getattr(self.state.model, "trained_chat_length", None),
                                    note is not None and note.left_out_turns > 0)
                self.state.slow_streak.add(r.speedup.ratio if r.speedup else None, long)
                unfit = unfit_drafter_note(s, self.state.model.drafter_name,
                                           run.settings.sampling.greedy)
                if unfit and not long:  # in a long chat low acceptance is the chat's doing
                    self.messages.show_note(unfit)
                elif self.state.slow_streak.slow:  # below a note on this reply's prompt
                    advice = self.state.slow_streak.advice()
                    self.messages.show_note(advice, Priority.TIP if advice == SlowStreak.NOTE
                                            else Priority.NOTE)

    def _store_speedup(self, row_id: int | None, speedup) -> None:
        """Keep a reply's speed-up with its stored row (a reloaded footer shows it too)."""
        if row_id is None:
            return
        try:
            self.state.store.set_speedup(row_id, speedup)
        except Exception:
            log.exception("storing the speed-up of reply %s", row_id)

