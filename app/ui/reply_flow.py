"""The window's reply flow: starting a reply (send, compare, regenerate, edit), stopping it,
rendering the worker's event batches and storing the result.

:class:`ReplyFlow` is the generation half of :class:`app.ui.window.MainWindow` (mixed into
it; it uses the window's widgets, store and worker). Each event type has one handler, picked
with ``isinstance`` (:attr:`ReplyFlow._HANDLERS`); the request's state is a typed
:class:`~app.ui.run_state.ReplyRun`. The prompt is read back from the stored rows
(:func:`app.chat.session.prompt_for`), never rebuilt from the view.
"""

from __future__ import annotations

import logging

from PySide6.QtWidgets import QInputDialog

from app.chat.baseline import PlainSample, SlowStreak
from app.chat.events import (
    ContentDelta,
    PipelineWarning,
    ReasoningDelta,
    RoundStarted,
    ToolCallDelta,
    ToolResultEvent,
    tool_call_dict,
)
from app.chat.session import Notice, prompt_for
from app.chat.turns import ConversationView, ReplyResult, Turn, Version, version_key
from app.engine.events import CycleEvent, Done, TokenEvent
from app.ui import settings as settings_mod
from app.ui.run_state import ReplyRun, SideRun
from app.ui.worker import ReplyFailed, ReplyFinished

log = logging.getLogger("app.ui.window")


class ReplyFlow:
    """Send / compare / regenerate / edit, the render tick and the end of a reply (see the
    module doc). Needs the attributes :class:`~app.ui.window.MainWindow` sets up."""

    def send(self, text: str) -> bool:
        """Send ``text`` as a user message and generate a reply in the selected mode.
        Returns False (with a message) when it cannot start."""
        return self._start(text, [""])

    def compare(self, text: str) -> bool:
        """Run ``text`` plain then with DFlash; show both side by side."""
        return self._start(text, ["plain", "dflash"])

    def regenerate(self) -> bool:
        """Generate a new version of the last reply in the selected mode; the earlier
        versions stay and can be switched back to (links under the reply)."""
        conv = self.conv
        if conv is None or len(conv.messages) < 2 or conv.messages[-1].role != "assistant":
            self.show_banner("There is no reply to regenerate yet.")
            return False
        if conv.messages[-1].compare:
            self.show_banner("A Compare turn already holds both versions; pick one with "
                             "“continue from …”.")
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
            text, ok = QInputDialog.getMultiLineText(self, "Edit message", "Message",
                                                     old.content)
            if not ok:
                return False
        if not text.strip():
            return False
        if self.model is None:
            self._say_no_model()
            return False
        new = Turn("user", text)
        try:
            self.store.edit_user(old, new)
        except Exception as exc:
            log.exception("editing a message")
            self.show_banner(f"Could not save the edit: {exc}")
            return False
        conv.messages = conv.messages[:index] + [new]
        return self._start(text, [""], edited=new)

    def _say_no_model(self) -> None:
        """Why nothing can be sent: a load is running, or nothing is loaded at all."""
        if getattr(self, "_loading", None) is not None:
            self.show_note("No model is loaded yet: wait for loading to finish.")
        else:
            self.show_banner("No model is loaded: pick one with File › Models…, or File › Use "
                             "default model for the bundled demo.")

    def _start(self, text: str, tags: list[str], again: Turn | None = None,
               edited: Turn | None = None) -> bool:
        if self.busy:
            return False
        if self.model is None:
            self._say_no_model()
            if again is None:
                self.composer.edit.setPlainText(text)
            return False
        mode = self.composer.mode()
        if (mode == "dflash" or tags != [""]) and not self.model.drafter_name:
            if tags != [""]:
                self.show_banner("Compare needs a DFlash drafter for this target.")
                return False
            mode = "plain"
        if self.conv is None:
            self.new_chat()
        conv = self.conv
        values = self.current_settings()
        key = mode
        if edited is not None:  # the edited user message is already the last one
            reply = Turn("assistant", compare=tags != [""])
            conv.messages.append(reply)
        elif again is None:
            conv.messages.append(Turn("user", text))
            reply = Turn("assistant", compare=tags != [""])
            conv.messages.append(reply)
        else:
            reply = again
            reply.chosen = ""  # the new version streams in place of the shown one
            key = version_key(mode, reply.versions)
        rs = settings_mod.reply_settings(values, mode)
        try:
            # the rows first: the prompt is read back from them (tool calls and results of
            # earlier turns included, as they were generated)
            self.store.begin_reply(conv, reply, tags if tags != [""] else [key], rs)
            messages = prompt_for(self.store.db, reply.ids[key if tags == [""] else "plain"],
                                  values["system_prompt"])
        except Exception as exc:
            log.exception("saving the new turn")
            self.show_banner(f"Could not save this turn, so no reply was started: {exc}")
            if reply.versions:
                reply.chosen = next(iter(reply.versions))
            else:
                conv.messages.remove(reply)
                if again is None and edited is None and "" not in conv.messages[-1].ids:
                    conv.messages.pop()  # the user message was not stored either
                    self.composer.edit.setPlainText(text)
            self.chat.render(conv)
            return False
        self._refresh_list()
        self._req += 1
        self._run = ReplyRun.start(self._req, conv, reply, tags, mode, key, rs,
                                   self.model.context_length)
        for side in self._run.sides.values():
            side.stats.mode = side.tag or mode
        self._pending = []
        self.busy = True
        self.composer.set_busy(True)
        self.conv_side.set_busy(True)
        self.clear_banner()
        self.details.clear()
        self.shown_message = reply
        self.chat.follow = True
        self.chat.render(conv, streaming=True)
        if tags != [""]:
            self.compare_view.show()
            total = sum(self.centre_split.sizes()) or 600
            self.centre_split.setSizes([int(total * 0.45), int(total * 0.55)])
            self.compare_view.set_results(None, None)
            self.compare_view.show_running(tags[0])
        self.worker.replyRequested.emit(self._req, messages, rs, tags)
        return True

    def stop(self) -> None:
        """Stop the running reply (takes effect within one cycle or token)."""
        if self.busy and self._run is not None:
            self._run.stopped = True
            self.worker.cancel(self._run.id)
            self.flash("Stopping…", 3000)

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
            if side.tag != run.current:
                run.current = side.tag
                self.reasoning.clear()
                self.compare_view.show_running(side.tag)
            for cls, handler in self._HANDLERS:
                if isinstance(ui.event, cls):
                    handler(self, side, ui.event)
                    break
        self._show_progress(run)

    def _show_progress(self, run: ReplyRun) -> None:
        """Stream text, tool calls and figures of the side running now; save its growth."""
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
        if cur.result is None:
            try:
                self.store.progress(run.msg, run.version_key(cur.tag), cur.text, cur.reasoning,
                                    cur.tokens, cur.flags)
            except Exception:  # the reply keeps streaming; the final save retries
                log.exception("saving a partial reply")
        self.live.show_stats(cur.stats, self._block_for(cur.tag or run.mode, run.settings))

    # one handler per event type
    def _on_token(self, side: SideRun, ev: TokenEvent) -> None:
        side.stats.on_token()
        side.tokens.append(ev.token_id)
        side.flags.append(ev.from_draft)

    def _on_cycle(self, side: SideRun, ev: CycleEvent) -> None:
        side.stats.on_cycle(ev)

    def _on_content(self, side: SideRun, ev: ContentDelta) -> None:
        side.text += ev.text

    def _on_reasoning(self, side: SideRun, ev: ReasoningDelta) -> None:
        side.reasoning += ev.text
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
        side.stats.on_round(ev.index, ev.prompt_tokens)
        if ev.index > 0 and side.reasoning and not side.reasoning.endswith("\n\n"):
            side.reasoning += "\n\n"  # the next round thinks anew: its own paragraph
            self.details.append_reasoning("\n\n")

    def _on_warning(self, side: SideRun, ev: PipelineWarning) -> None:
        if ev.message:
            self.flash(ev.message, 8000)

    def _on_notice(self, side: SideRun, ev: Notice) -> None:
        self.show_note(ev.message)

    def _on_failed(self, side: SideRun, ev: ReplyFailed) -> None:
        side.error = ev.message
        self.show_banner(ev.message)

    def _on_reply_finished(self, side: SideRun, ev: ReplyFinished) -> None:
        self._finish_side(side, ev.result)

    _HANDLERS = (
        (TokenEvent, _on_token),
        (CycleEvent, _on_cycle),
        (ContentDelta, _on_content),
        (ReasoningDelta, _on_reasoning),
        (ToolCallDelta, _on_tool_call),
        (ToolResultEvent, _on_tool_result),
        (Done, _on_engine_done),
        (RoundStarted, _on_round),
        (PipelineWarning, _on_warning),
        (Notice, _on_notice),
        (ReplyFailed, _on_failed),
        (ReplyFinished, _on_reply_finished),
    )
    """(event type, handler) pairs: each event goes to the first type it is an instance of."""

    def _block_for(self, mode: str, rs: dict | None = None) -> int | None:
        """Block size for the chart's scale (None for plain)."""
        if mode != "dflash" or self.model is None:
            return None
        return (rs or {}).get("block_size") or self.model.drafter_block_size

    def _finish_side(self, side: SideRun, result: ReplyResult) -> None:
        if result.mode == "dflash" and not result.block_size and self.model:
            result.block_size = self.model.drafter_block_size
        side.result = result
        if result.summary is not None:
            side.stats.apply_summary(result.summary, result.round_summaries or
                                     side.stats.round_summaries)
        if result.note:
            self.show_note(result.note)
        if result.tool_calls:
            self.tools.set_calls(result.tool_calls)
        elif side.calls:
            result.tool_calls = list(side.calls.values())

    def _on_finished(self, req_id: int) -> None:
        run = self._run
        if run is None or req_id != run.id:
            return
        self.render_pending()
        msg: Turn = run.msg
        for side in run.sides.values():
            if side.result is None:
                continue
            stopped = run.stopped or side.result.finish_reason == "cancelled"
            msg.versions[run.version_key(side.tag)] = Version(
                side.result, stopped=stopped or run.interrupted, error=side.error,
                interrupted=run.interrupted)
        if not run.compare:
            msg.chosen = run.key if run.key in msg.versions else next(iter(msg.versions), "")
        else:
            for side in run.sides.values():  # a side stopped before it ran: empty, stopped
                if side.tag not in msg.versions:
                    msg.versions[side.tag] = Version(
                        ReplyResult(mode=side.tag, finish_reason="cancelled"), stopped=True,
                        error=side.error)
            done = [t for t, sd in run.sides.items() if sd.result is not None]
            msg.chosen = "dflash" if "dflash" in done else (done[0] if done else "dflash")
            self.compare_view.set_results(run.sides["plain"].result,
                                          run.sides["dflash"].result, msg.chosen)
        self._measure_speed(run)
        self.busy = False
        self._run = None
        self.composer.set_busy(False)
        self.conv_side.set_busy(False)
        self._save(run.conv)
        if run.conv is self.conv:
            self.chat.render(self.conv)
            self.show_message_details(msg)
            last = run.sides.get(run.current)
            if last is not None:
                self.live.show_stats(last.stats, self._block_for(run.current or run.mode,
                                                                 run.settings))
        self.replyFinished.emit(msg)

    def _pair_key(self) -> str:
        """The loaded pair, as baselines compare it."""
        m = self.model
        return f"{m.target_path}|{m.drafter_path or ''}" if m else ""

    def _measure_speed(self, run: ReplyRun) -> None:
        """Plain sides become baselines; DFlash sides get their speed-up against one (in
        run order, so a Compare's DFlash side is measured against its own plain side)."""
        if self.model is None:
            return
        for side in run.sides.values():
            r = side.result
            if r is None or r.summary is None or side.error or run.stopped or \
                    r.finish_reason == "cancelled":
                continue
            s = r.summary
            key = (self._pair_key(), self.model.dtype, int(run.settings.get("max_tokens", 0)),
                   int(s.prompt_tokens))
            if r.mode == "plain":
                self.baselines.add(PlainSample(*key, s.tok_per_s,
                                               "Compare" if run.compare else "plain reply"))
            elif r.mode == "dflash":
                r.speedup = self.baselines.speedup(s.tok_per_s, *key)
                r.speed_checked = True
                self.slow_streak.add(r.speedup.ratio if r.speedup else None)
                if self.slow_streak.slow:
                    self.show_note(SlowStreak.NOTE)

    def _save(self, conv: ConversationView) -> None:
        try:
            self.store.save(conv)
        except Exception as exc:
            log.exception("saving the conversation")
            self.show_banner(f"Could not save the conversation: {exc}")

    def _on_compare_choice(self, key: str) -> None:
        for m in reversed(self.conv.messages if self.conv else []):
            if m.role == "assistant" and m.compare:
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
            self.send("Continue from where you stopped.")
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

    def _on_colour_toggled(self, on: bool) -> None:
        from app.ui.render import draft_legend_html

        self.chat.colour_drafts = on
        self.legend.setText(draft_legend_html(self.chat.palette_colours) if on else "")
        self.legend.setVisible(on)
        if on:
            self._request_pieces()
        self.chat.render(self.conv, streaming=self.busy)

    def _request_pieces(self) -> None:
        """Ask the worker for the token texts of replies loaded without them (needs the
        tokenizer, which lives on the worker)."""
        if self.conv is None or self.model is None:
            return
        jobs = {}
        for i, m in enumerate(self.conv.messages):
            for key, v in m.versions.items():
                if v.result.tokens and not v.result.pieces:
                    jobs[(self.conv.id, i, key)] = list(v.result.tokens)
        if jobs:
            self.worker.piecesRequested.emit(jobs)

    def _on_pieces(self, pieces: dict) -> None:
        changed = False
        for (conv_id, i, key), texts in pieces.items():
            if self.conv is None or self.conv.id != conv_id or i >= len(self.conv.messages):
                continue
            v = self.conv.messages[i].versions.get(key)
            if v is not None and len(texts) == len(v.result.tokens):
                v.result.pieces = texts
                changed = True
        if changed and self.chat.colour_drafts and not self.busy:
            self.chat.render(self.conv)

