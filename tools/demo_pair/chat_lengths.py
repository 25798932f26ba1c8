"""How long the demo pair's training chats are, in turns and in tokens.

Generates seeded training chats with the corpus generator (``corpus.Generator``, train
split, as ``data.generate_texts`` does), renders every training example (the prompt the app
builds for an assistant message, plus that message) with the chat template, tokenizes it with
the shipped tokenizer (``resources/models/demo-target``) and prints the user turns per chat
and the example lengths in tokens (median, 99th percentile, maximum). The maximum is the
"trained chat length" the model card and ``resources/models/demo-target/dflash_chat.json``
state.

    python -m tools.demo_pair.chat_lengths --chats 3000 --seed 12

Never imported by ``app/``.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from tools.demo_pair.corpus import Generator
from tools.demo_pair.data import REPO, chat_examples


def main(argv: list[str] | None = None) -> None:
    """Print the figures (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chats", type=int, default=3000, help="chats to generate")
    ap.add_argument("--seed", type=int, default=12, help="the corpus seed (stage 14: 12)")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    from app.chat.tools import tool_schemas

    tok = Tokenizer.from_file(str(REPO / "resources/models/demo-target/tokenizer.json"))
    defs = tool_schemas()
    g = Generator(args.seed, split="train")
    turns: Counter[int] = Counter()
    lengths: list[int] = []
    for _ in range(args.chats):
        chat = g.chat()
        turns[len(chat.turns)] += 1
        for prompt, completion in chat_examples(chat, defs):
            lengths.append(len(tok.encode(prompt + completion, add_special_tokens=False).ids))
    lengths.sort()
    p99 = lengths[min(len(lengths) - 1, int(0.99 * len(lengths)))]
    print(f"chats {args.chats} (seed {args.seed}); user turns per chat: "
          + ", ".join(f"{n}: {turns[n]}" for n in sorted(turns)))
    print(f"examples {len(lengths)}; tokens per example (prompt + reply): median "
          f"{statistics.median(lengths):.0f}, 99th percentile {p99}, max {lengths[-1]}")


if __name__ == "__main__":
    main()
