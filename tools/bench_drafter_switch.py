"""Time to first token of a DFlash reply right after a DFlash2 one, and of a DFlash2 reply
right after two plain ones, on the bundled demo pair.

    python tools/bench_drafter_switch.py

The pair's two drafters each keep a context of the conversation (``PromptCache.switch_drafter``
/ ``update_kept``; the one not running is kept from the first turn, ``keep_context``, plain
turns included); this prints how many prompt tokens each reply reused and its time to first
token, on a chat whose first message is long (~700 tokens). A benchmark, not a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from app.chat.session import ChatSession, PairSpec
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    spec = PairSpec(target=str(t), drafter=str(d), drafter2=str(demo_dflash2_dir()))
    settings = {"max_tokens": 48, "use_tools": False, "temperature": 0.0}
    names = ["Chile", "Peru", "Japan", "France", "Kenya", "Brazil", "Canada", "Norway"] * 40
    opening = [{"role": "user", "content": "Tell me about these countries: " + ", ".join(names)}]

    def run(history: list[str], last: list[str], label: str) -> None:
        """A fresh session: a reply per ``history`` mode, each followed by a question, then a
        reply per ``last`` mode on that chat (a switch of the mode); the last one's figures
        are printed."""
        session = ChatSession()
        session.load(spec)
        chat, questions = list(opening), ["And the capital of Peru?", "And its population?"]
        for mode in history:
            reply = list(session.reply(chat, {**settings, "mode": mode}))[-1].reply
            chat = chat + reply.messages + [{"role": "user", "content": questions.pop(0)}]
        for mode in last:
            reply = list(session.reply(chat, {**settings, "mode": mode}))[-1].reply
        s = reply.summary
        print(f"prompt {s.prompt_tokens} tokens; {label}: reused {s.reused_tokens}, "
              f"time to first token {s.ttft_s:.3f} s")

    run(["dflash"], ["dflash2", "dflash"], "DFlash after DFlash2")
    run(["plain", "plain"], ["dflash2"], "DFlash2 after two plain replies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
