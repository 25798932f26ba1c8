"""The window's reply flow: starting a reply (send, compare, regenerate, edit), stopping it,
rendering the worker's event batches and showing the stored result.

:class:`ReplyFlow` is the generation half of :class:`app.ui.window.MainWindow` (mixed into
it; it uses the window's widgets, store and worker). Each event type has one handler, picked
with ``isinstance`` (:attr:`ReplyFlow._HANDLERS`); the request's state is a typed
:class:`~app.ui.run_state.ReplyRun`. The window writes nothing of a reply: it sends a
:class:`~app.chat.stored_turn.TurnRequest` and the worker stores the turn and builds the prompt
from the stored rows (``app.chat.stored_turn.run_turn``); when ``TurnStored`` arrives the
view reads the turn back (``TurnStore.reload_turn``).
"""

from __future__ import annotations

import logging

from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout

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
    PipelineWarning,
    ReasoningDelta,
    RoundResumed,
    RoundStarted,
    ToolCallDelta,
    ToolResultEvent,
    tool_call_dict,
)
from app.chat.session import Notice
from app.chat.settings import SettingError
from app.chat.storage import StorageError, StoreWriteError
from app.chat.stored_turn import (
    SaveFailed,
    TurnBegun,
    TurnNotStarted,
    TurnNotStored,
    TurnRefused,
    TurnRequest,
    TurnStored,
)
from app.chat.turns import LOAD_TURNS, ConversationView, ReplyResult, Turn, version_key
from app.engine.events import CycleEvent, Done, TokenEvent
from app.engine.lookup import DEFAULT_BLOCK
from app.engine.modes import DRAFTER_MODES, DRAFTING_MODES, Mode
from app.ui import settings as settings_mod
from app.ui.banners import Priority
from app.ui.run_state import ReplyRun, SideRun
from app.ui.worker import ReplyFailed, ReplyFinished

log = logging.getLogger("app.ui.window")


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


class ReplyFlow:
    """Send / compare / regenerate / edit, the render tick and the end of a reply (see the
    module doc). Needs the attributes :class:`~app.ui.window.MainWindow` sets up."""

    def send(self, text: str) -> bool:
        """Send ``text`` as a user message and generate a reply in the selected mode.
        Returns False (with a message) when it cannot start; a turn the worker then cannot
        store ends at once with a banner and the chat as it was (``TurnNotStarted``)."""
        return self._start(text, [""])

    def compare(self, text: str) -> bool:
        """Run ``text`` plain then with DFlash (then DFlash2 when the pair has a DFlash2
        drafter too), each from the same prompt; show them side by side."""
        modes = set(self.model.modes) if self.model is not None else set()
        sides = ((Mode.PLAIN, *DRAFTER_MODES) if set(DRAFTER_MODES) <= modes
                 else (Mode.PLAIN, Mode.DFLASH))
        return self._start(text, [str(m) for m in sides])

    def regenerate(self) -> bool:
        """Generate a new version of the last reply in the selected mode; the earlier
        versions stay and can be switched back to (links under the reply)."""
        conv = self.conv
        if conv is None or len(conv.messages) < 2 or conv.messages[-1].role != "assistant":
            self.show_banner("There is no reply to regenerate yet.")
            return False
        if conv.messages[-1].compare:  # the menu item is disabled then (its tooltip says why)
            self.show_note("A Compare turn cannot be regenerated: its sides are its versions. "
                           "Pick one with “continue from … instead”.")
            return False
        return self._start(conv.messages[-2].content, [""], again=conv.messages[-1])

    def edit_message(self, index: int, text: str | None = None) -> bool:
        """Replace the user message at ``index`` by an edited version and re-run from there.

        The later turns leave the conversation view and the prompt; the database keeps them
        on the earlier branch (``Store.edit_user_message``). ``text`` None asks for it."""
        conv = self.conv
        if self.busy or conv is None or not 0 <= index < len(conv.messages) or \
                conv.messages[index].role != "user":
            return False
        old = conv.messages[index]
        if text is None:
            text, ok = edit_message_text(self, old.content)
            if not ok:
                return False
        if not text.strip():
            return False
        if self.model is None:
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
        conv = self.conv
        last = conv.messages[-1] if conv is not None and conv.messages else None
        v = last.version if last is not None and last.role == "assistant" else None
        if self.busy or v is None:
            return False
        if last.compare:
            self.show_note(self.CONTINUE_COMPARE)
            return False
        if v.stopped or v.error or v.result.finish_reason != "length":
            self.show_note("Only a reply that Max tokens ended can be continued.")
            return False
        if last.chosen not in last.ids:
            return False
        return self._start("", [""], continued=last)

    def _say_no_model(self) -> None:
        """Why nothing can be sent: a load is running, or nothing is loaded at all."""
        if getattr(self, "_loading", None) is not None:
            self.show_note("No model is loaded yet: wait for loading to finish.")
        else:
            self.show_banner("No model is loaded: pick one with File › Models…, or File › Use "
                             "default model for the bundled demo.")

    def _start(self, text: str, tags: list[str], again: Turn | None = None,
               edited: tuple[int, Turn] | None = None,
               continued: Turn | None = None) -> bool:
        """Show the new turn and ask the worker to store and generate it (a
        :class:`~app.chat.stored_turn.TurnRequest`); the window writes nothing of it.
        ``again``: the reply to regenerate; ``edited``: (index, user turn) being edited;
        ``continued``: the last reply, to continue where Max tokens cut it (its chosen
        version, in the mode that made it)."""
        if self.busy:
            return False
        if len(self.pending_writes):  # kept writes first: the turns stay in order
            self.retry_saves()
        if self.model is None:
            self._say_no_model()
            if again is None and continued is None:
                self.composer.edit.setPlainText(text)
            return False
        before = continued.version.result if continued is not None else None
        mode = before.mode if before is not None else self.composer.mode()
        if before is None and mode == Mode.DFLASH2 and "dflash2" not in self.model.modes \
                and tags == [""]:
            mode = "dflash" if self.model.drafter_name else "plain"
        if before is None and (mode == Mode.DFLASH or tags != [""]) and \
                not self.model.drafter_name:
            if tags != [""]:
                self.show_banner("Compare needs a DFlash drafter for this target.")
                return False
            mode = "plain"
        try:  # the one typed record the worker, the store and the session take
            rs = settings_mod.reply_record(self.defaults,
                                           self.conv.settings if self.conv else {}, mode)
        except SettingError as exc:  # e.g. a hand-edited chat override out of range
            self.show_banner(f"Could not start the reply: {exc}. Change it in File › "
                             "Settings…")
            if again is None and continued is None:
                self.composer.edit.setPlainText(text)
            return False
        if self.conv is None and self.new_chat() is None:
            return False  # the store could not make one (its banner says why)
        conv = self.conv
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
        self._refresh_list()
        self._req += 1
        self._run = ReplyRun.start(self._req, conv, reply, tags, mode, key, rs,
                                   self.model.context_length)
        self._run.previous = previous
        self._run.text = text if again is None and continued is None else ""
        self._run.system_prompt = rs.system_prompt
        self._run.continued = before
        for side in self._run.sides.values():
            side.stats.mode = side.tag or mode
        self._pending = []
        self.busy = True
        self.composer.set_busy(True)
        self.conv_side.set_busy(True)
        self.clear_banner()
        self.details.clear()
        if before is not None:  # the reply so far, until the worker says where it resumes
            side = self._run.sides[""]
            side.text, side.reasoning = before.content, before.all_reasoning()
            for call in before.tool_calls:
                side.merge_call(tool_call_dict(call), is_result=True)
            self.details.append_reasoning(side.reasoning)
            self.tools.set_calls(list(side.calls.values()))
        self.shown_message = reply
        self.chat.follow = True
        self.chat.render(conv, streaming=True)
        if tags != [""]:
            self.compare_view.show()
            total = sum(self.centre_split.sizes()) or 600
            self.centre_split.setSizes([int(total * 0.45), int(total * 0.55)])
            self.compare_view.set_results(None, None, three=len(tags) > 2)
            self.compare_view.show_running(tags[0])
        else:  # the view shows the last turn's comparison, and the last turn is not one now
            self.compare_view.hide()
        if self.benchmarking:  # the worker runs one job at a time: say why nothing comes yet
            self.show_note(self.BENCH_WAIT)
        self.worker.replyRequested.emit(self._req, request)
        return True

    STOPPING = "Stopping…"
    """The status message from Stop until the reply has ended."""

    def stop(self) -> None:
        """Stop the running reply (takes effect within one cycle or token)."""
        if self.busy and self._run is not None:
            self.worker.cancel(self._run.id, interrupted=self._run.interrupted)
            self.flash(self.STOPPING, 3000)

    def _on_events(self, req_id: int, batch: list) -> None:
        if self._run is not None and req_id == self._run.id:
            self._pending.extend(batch)

    def render_pending(self) -> None:
        """Apply the events received since the last tick (the render timer's slot): each
        event goes to its handler, found by type (:attr:`_HANDLERS`)."""
        run = self._run
        if run is None or not self._pending:
            return
        batch, self._pending = self._pending, []
        self._details_changed = False
        for ui in batch:
            side = run.side(ui.tag)
            self._event_at = ui.at  # when the worker had it (first token, tok/s clocks)
            if side.tag != run.current:
                run.current = side.tag
                side.stats.started = ui.at  # this side's clock starts with it, not the turn's
                if self._shown(run):
                    self.reasoning.clear()
                    self.compare_view.show_running(side.tag)
            for cls, handler in self._HANDLERS:
                if isinstance(ui.event, cls):
                    handler(self, side, ui.event)
                    break
        self._show_progress(run)

    def _shown(self, run: ReplyRun | None) -> bool:
        """Whether ``run`` fills the conversation on screen (True without a run: nothing
        else to show it for). A reply keeps running (or finishing, after Stop) while the user
        looks at another chat, e.g. a new one: its events then update the reply's own state,
        not the views, which show that chat."""
        return run is None or run.conv is self.conv

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
            self.tools.set_calls(list(cur.calls.values()))
        self.live.show_stats(cur.stats, self._block_for(cur.tag or run.mode,
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
        if self._shown(self._run):
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
            if self._shown(self._run):
                self.details.append_reasoning("\n\n")

    def _on_resumed(self, side: SideRun, ev: RoundResumed) -> None:
        """A continued reply's cut round as the worker's pipeline read it again: the bubble
        and the reasoning pane go on from exactly these texts (the earlier rounds' reasoning
        first, for a tool reply)."""
        before = self._run.continued if self._run is not None else None
        earlier = ""
        if before is not None and before.rounds > 1:
            earlier = all_reasoning(before.messages[:-1], "")
        side.text = ev.content
        side.reasoning = earlier + ("\n\n" if earlier else "") + ev.reasoning
        side.tokens, side.flags = list(ev.tokens), list(ev.from_draft)
        side.stats.continues_after = (before.summary.generated_tokens
                                      if before is not None and before.summary is not None
                                      else len(ev.tokens))
        if self._shown(self._run):
            self.details.reasoning.setPlainText(side.reasoning)

    def _on_warning(self, side: SideRun, ev: PipelineWarning) -> None:
        if ev.message and self._shown(self._run):
            self.flash(ev.message, 8000)

    def _on_notice(self, side: SideRun, ev: Notice) -> None:
        """The prompt was fitted to the context: said above lesser notes (the reply's footer
        keeps it too, ``ReplyResult.context_note``)."""
        if self._shown(self._run):
            self.show_note(ev.message, Priority.WARNING)

    def _on_failed(self, side: SideRun, ev: ReplyFailed) -> None:
        side.error = ev.message  # stored with the reply, shown when its chat is
        if self._shown(self._run):
            self.show_banner(ev.message, chat=self._run.conv.id)

    def _on_reply_finished(self, side: SideRun, ev: ReplyFinished) -> None:
        self._finish_side(side, ev.result)

    def _on_begun(self, side: SideRun, ev: TurnBegun) -> None:
        run = self._run
        run.msg.ids.update(ev.reply_ids)
        if ev.user_id is not None and len(run.conv.messages) > 1:
            run.conv.messages[-2].ids[""] = ev.user_id
        try:  # the title comes with the first message
            run.conv.title = self.store.db.get_conversation(ev.conversation_id).title or \
                run.conv.title
        except Exception:
            log.exception("reading the conversation's title")
        self._refresh_list()

    def _on_not_started(self, side: SideRun, ev: TurnNotStarted) -> None:
        self._run.not_started = ev.message
        self._run.refused = isinstance(ev, TurnRefused)
        self._run.not_stored = isinstance(ev, TurnNotStored)

    def _on_save_failed(self, side: SideRun, ev: SaveFailed) -> None:
        """A write of the running reply failed: said at once in the storage banner (the
        reply goes on, on screen; whatever it is shown in)."""
        self._run.save_failed = True
        self.show_store_problem(
            f"The reply being written is not being saved: {ev.message}. It stays on screen "
            "(copy it, or export the chat), and it is saved when it ends if there is room "
            "then, else as soon as there is")

    def _on_stored(self, side: SideRun, ev: TurnStored) -> None:
        self._run.stored = ev

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

    def _block_for(self, mode: str, block_size: int | None = None) -> int | None:
        """Block size for the chart's scale (None for plain): ``block_size`` (a reply's
        ``ReplySettings.block_size`` or a stored row's), else the drafter's."""
        if mode not in DRAFTING_MODES or self.model is None:
            return None
        own = DEFAULT_BLOCK if mode == Mode.LOOKUP else self.model.drafter_block_size
        return block_size or own

    def _finish_side(self, side: SideRun, result: ReplyResult) -> None:
        if result.mode in DRAFTING_MODES and not result.block_size and self.model:
            result.block_size = (DEFAULT_BLOCK if result.mode == Mode.LOOKUP
                                 else self.model.drafter_block_size)
        side.result = result
        if result.summary is not None:
            side.stats.apply_summary(result.summary, result.round_summaries or
                                     side.stats.round_summaries)
        calls_of_result = bool(result.tool_calls)  # else the pane has shown them live
        if not calls_of_result and side.calls:
            result.tool_calls = list(side.calls.values())
        if not self._shown(self._run):
            return
        if result.note and not side.error:  # a failure's banner stays; the note repeats it
            self.show_note(result.note)
        if calls_of_result:
            self.tools.set_calls(result.tool_calls)
        if self._run is not None and self._run.compare:  # its figures while the next side runs
            self.compare_view.show_side(side.tag, result)

    def _on_finished(self, req_id: int) -> None:
        """The worker is done with the request: the turn is stored (``TurnStored``), so the
        view reads it back (``TurnStore.reload_turn``) keeping the results streamed live."""
        run = self._run
        if run is None or req_id != run.id:
            return
        self.render_pending()
        msg: Turn = run.msg
        self.busy = False
        self._run = None
        if self.flash_label.text().endswith(self.STOPPING):  # it has stopped: not "Stopping…"
            self.flash("", 0)
        self.composer.set_busy(False)
        self.conv_side.set_busy(False)
        if run.not_started is not None or run.stored is None:
            self._not_started(run)
            return
        if run.stored.pending is not None:  # kept, and tried again until the store takes it
            self.keep_unsaved(run.stored.pending, run.stored.error)
        elif run.stored.error:  # the reply stays on screen (live); the store says why
            self.show_store_problem(
                f"Could not save the reply: {run.stored.error}. It stays on screen until you "
                "quit: copy what you want to keep")
        elif run.save_failed:  # its growth was not saved, but its final state is
            self.say_saved("Saved: the reply is stored now, whole")
        live = {run.version_key(t): sd.result for t, sd in run.sides.items()
                if sd.result is not None}
        try:
            self.store.reload_turn(run.conv, msg, live)
        except Exception as exc:
            log.exception("reading the stored turn back")
            self.show_banner(f"Could not read the conversation back: {exc}")
        if run.compare and run.conv is self.conv:
            third = run.sides.get("dflash2")
            self.compare_view.set_results(run.sides["plain"].result,
                                          run.sides["dflash"].result, msg.chosen,
                                          third.result if third else None, third is not None)
        self._measure_speed(run)
        self._refresh_list()
        if not run.compare and not run.interrupted and not run.stored.error:
            # while the user reads and writes: the next turn then prefills only its message
            self.worker.prefillRequested.emit(run.conv.id, run.settings,
                                              run.system_prompt)
        if run.conv is self.conv:
            self.chat.render(self.conv)
            self.show_message_details(msg)
            # a Compare turn: the figures of the side the chat continues from (the one shown)
            key = msg.chosen if run.compare and msg.chosen in run.sides else run.current
            last = run.sides.get(key)
            if last is not None:
                self.live.show_stats(last.stats, self._block_for(key or run.mode,
                                                                 run.settings.block_size))
                self.details.say_continued(last.result)
        self.replyFinished.emit(msg)

    def _not_started(self, run: ReplyRun) -> None:
        """The turn could not be stored, or its prompt does not fit the context
        (``TurnRefused``): the view and the figures go back to what they were, the message
        goes back to the composer, and the banner says why."""
        chat = run.conv.id
        if run.refused:
            self.show_banner(run.not_started, chat=chat)
        elif run.not_stored:  # a store that cannot write: its banner stays
            self.show_store_problem("Could not save this turn, so no reply was started "
                                    f"(your message is back in the box): {run.not_started}")
        elif run.continued is not None:
            self.show_banner("Could not continue the reply, so it is kept as it was: "
                             f"{run.not_started or 'the worker stopped'}", chat=chat)
        else:
            self.show_banner("Could not save this turn, so no reply was started: "
                             f"{run.not_started or 'the worker stopped'}", chat=chat)
        run.conv.messages, chosen = run.previous
        if run.msg.versions:  # a regenerated reply shows its earlier version again
            run.msg.chosen = chosen if chosen in run.msg.versions else next(iter(run.msg.versions))
        if run.text and not self.composer.edit.toPlainText().strip():
            self.composer.edit.setPlainText(run.text)
        if run.conv is self.conv:
            self.chat.render(self.conv)
            # the Compare view as it was: the (restored) last turn's comparison, or none
            last = next((m for m in reversed(self.conv.messages) if m.role == "assistant"),
                        None)
            self._show_compare_of(last)
            self.show_message_details(last)  # not the empty figures of the run that never ran
        elif run.compare:
            self.compare_view.hide()

    def _pair_key(self) -> str:
        """The loaded pair, as baselines compare it."""
        m = self.model
        return f"{m.target_path}|{m.drafter_path or ''}" if m else ""

    def _measure_speed(self, run: ReplyRun) -> None:
        """Plain sides become baselines; DFlash sides get their speed-up against one (in
        run order, so a Compare's DFlash side is measured against its own plain side)."""
        if self.model is None:
            return
        own_plain = None  # a Compare's plain side: its drafting sides' baseline
        for tag, side in run.sides.items():
            r = side.result
            # a side the user's Stop cut is partial; one that had finished is measured
            if r is None or r.summary is None or side.error or r.finish_reason == "cancelled":
                continue
            s = r.summary
            key = (self._pair_key(), self.model.dtype, run.settings.max_tokens,
                   int(s.prompt_tokens))
            if r.mode == Mode.PLAIN:
                sample = PlainSample(*key, s.tok_per_s,
                                     "Compare" if run.compare else "plain reply")
                self.baselines.add(sample)
                own_plain = sample if run.compare else None
            elif r.mode in DRAFTING_MODES:
                r.speedup = (SpeedUp.paired(s.tok_per_s, own_plain) if own_plain is not None
                             else self.baselines.speedup(s.tok_per_s, *key))
                r.speed_checked = True
                self._store_speedup(run.msg.ids.get(run.version_key(tag)), r.speedup)
                note = r.context_note
                long = long_context(s.prompt_tokens, self.model.context_length,
                                    getattr(self.model, "trained_chat_length", None),
                                    note is not None and note.left_out_turns > 0)
                self.slow_streak.add(r.speedup.ratio if r.speedup else None, long)
                unfit = unfit_drafter_note(s, self.model.drafter_name)
                if unfit and not long:  # in a long chat low acceptance is the chat's doing
                    self.show_note(unfit)
                elif self.slow_streak.slow:  # below a note on this reply's prompt
                    advice = self.slow_streak.advice()
                    self.show_note(advice, Priority.TIP if advice == SlowStreak.NOTE
                                   else Priority.NOTE)

    def _store_speedup(self, row_id: int | None, speedup) -> None:
        """Keep a reply's speed-up with its stored row (a reloaded footer shows it too)."""
        if row_id is None:
            return
        try:
            self.store.set_speedup(row_id, speedup)
        except Exception:
            log.exception("storing the speed-up of reply %s", row_id)

    def _save(self, conv: ConversationView) -> None:
        try:
            self.store.save(conv)
        except StoreWriteError as exc:
            log.error("saving the conversation: %s", exc)
            self.show_store_problem(f"Could not save the chat's settings and choices: {exc}")
        except Exception as exc:
            log.exception("saving the conversation")
            self.show_banner(f"Could not save the conversation: {exc}")

    def _on_compare_choice(self, key: str) -> None:
        for m in reversed(self.conv.messages if self.conv else []):
            if m.role == "assistant" and m.compare:
                side = m.versions.get(key)
                if side is None or side.never_ran:  # nothing to continue from
                    return
                m.chosen = key
                self._save(self.conv)
                self.chat.render(self.conv)
                self.show_message_details(m)
                return

    def _on_chat_link(self, link: str) -> None:
        if link.startswith("example:"):
            try:
                self.send_example(int(link.split(":", 1)[1]))
            except ValueError:
                return
        elif link.startswith("continue:"):
            self.continue_reply()
        elif link.startswith("earlier:"):
            self.show_earlier()
        elif link.startswith("edit:"):
            try:
                self.edit_message(int(link.split(":", 1)[1]))
            except ValueError:
                return
        elif link.startswith("version:") and self.conv is not None and not self.busy:
            _, idx, key = link.split(":", 2)
            try:
                msg = self.conv.messages[int(idx)]
            except (ValueError, IndexError):
                return
            if key in msg.versions:
                msg.chosen = key
                self._save(self.conv)
                self.chat.render(self.conv)
                self.show_message_details(msg)
        elif link.startswith("prompt:") and self.conv is not None and not self.busy:
            try:  # another version of an edited message, with the replies under it
                conv = self.store.show_prompt_version(self.conv.id, int(link.split(":", 1)[1]))
            except (ValueError, StorageError) as exc:
                self.show_banner(f"Could not show that version: {exc}", chat=self.conv.id)
                return
            self.select_conversation(conv)
        elif link.startswith("choose:"):
            key = link.split(":", 1)[1]
            self.compare_view.set_choice(key)
            self._on_compare_choice(key)
        elif link.startswith("reasoning:") and self.conv is not None:
            try:
                index = int(link.split(":", 1)[1])
                msg = self.conv.messages[index]
            except (ValueError, IndexError):
                return
            # the bubble's reasoning folds open or shut; the pane shows it either way
            self.chat.expanded ^= {index}
            self.reasoning_section.button.setChecked(True)
            self.show_message_details(msg)
            if not self.busy:
                self.chat.render(self.conv)

    def show_earlier(self) -> None:
        """Draw earlier turns of the shown conversation (its "Show earlier messages" link):
        ``app.ui.chat.VIEW_TURNS`` more, loading them from the store when they were not
        loaded (``TurnStore.get`` with a larger ``last``). What was in view stays in view.
        Not while a reply is written."""
        conv = self.conv
        if conv is None or self.busy:
            return
        chat = self.chat
        if chat.first_shown == 0 and conv.earlier:
            more = self.store.get(conv.id, last=len(conv.messages) + LOAD_TURNS)
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

    def _on_colour_toggled(self, on: bool) -> None:
        from app.ui.render import draft_legend_html

        self.chat.colour_drafts = on
        self.legend.setText(draft_legend_html(self.chat.palette_colours) if on else "")
        self.legend.setVisible(on)
        if on:
            self._request_pieces()
        self.chat.render(self.conv, streaming=self.busy)

    def _request_pieces(self, index: int | None = None) -> None:
        """Ask the worker for the token texts of replies loaded without them, or with texts
        that do not spell their stored answer (another model's tokenizer gave them; needs the
        tokenizer, which lives on the worker): every turn's, or only the turn at ``index``."""
        from app.ui.render import spells_its_text

        if self.conv is None or self.model is None:
            return
        jobs = {}
        for i, m in enumerate(self.conv.messages):
            if index is not None and i != index:
                continue
            for key, v in m.versions.items():
                if v.result.tokens and not (v.result.pieces and spells_its_text(v.result)):
                    jobs[(self.conv.id, i, key)] = list(v.result.tokens)
        if jobs:
            self.worker.piecesRequested.emit(jobs)

    def _on_pieces(self, pieces: dict) -> None:
        changed: set[int] = set()
        for (conv_id, i, key), texts in pieces.items():
            if self.conv is None or self.conv.id != conv_id or i >= len(self.conv.messages):
                continue
            v = self.conv.messages[i].versions.get(key)
            if v is not None and len(texts) == len(v.result.tokens):
                v.result.pieces = texts
                changed.add(i)
        if changed and self.chat.colour_drafts and not self.busy:
            self.chat.render(self.conv)
        shown = self._shown_compare()
        if shown is not None and shown[0] in changed:  # its first divergence can be marked
            self.compare_view.show_turn(shown[1])

