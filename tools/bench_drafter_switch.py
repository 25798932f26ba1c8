"""Time to first token of a DFlash reply right after a DFlash2 one, on the bundled demo pair.

    python tools/bench_drafter_switch.py

The pair's two drafters each keep a context of the conversation (``PromptCache.switch_drafter``
/ ``update_kept``); this prints how many prompt tokens the DFlash reply reused and its time to
first token, on a chat whose first message is long (~700 tokens). A benchmark, not a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from app.chat.session import ChatSession, PairSpec
    from app.paths import demo_dflash2_dir, demo_pair_dirs

    t, d = demo_pair_dirs()
    session = ChatSession()
    session.load(PairSpec(target=str(t), drafter=str(d), drafter2=str(demo_dflash2_dir())))
    settings = {"max_tokens": 48, "use_tools": False, "temperature": 0.0}

    def turn(messages, mode):
        return list(session.reply(messages, {**settings, "mode": mode}))[-1].reply

    names = ["Chile", "Peru", "Japan", "France", "Kenya", "Brazil", "Canada", "Norway"] * 40
    chat = [{"role": "user", "content": "Tell me about these countries: " + ", ".join(names)}]
    first = turn(chat, "dflash")
    chat = chat + first.messages + [{"role": "user", "content": "And the capital of Peru?"}]
    turn(chat, "dflash2")
    again = turn(chat, "dflash")
    s = again.summary
    print(f"prompt {s.prompt_tokens} tokens; DFlash after DFlash2: reused {s.reused_tokens}, "
          f"time to first token {s.ttft_s:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
