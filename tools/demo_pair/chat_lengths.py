"""How long the demo pair's training chats are, in turns and in tokens.

Generates seeded training chats with the corpus generator (``corpus.Generator``, train
split, as ``data.generate_texts`` does), renders every training example (the prompt the app
builds for an assistant message, plus that message) with the chat template, tokenizes it with
the shipped tokenizer (``resources/models/demo-target``) and prints the user turns per chat
and the example lengths in tokens (median, 99th percentile, maximum). The maximum is the
"trained chat length" the model card and ``resources/models/demo-target/dflash_chat.json``
state.

    python -m tools.demo_pair.chat_lengths --chats 3000 --seed 16            # corpus v6 (v10)
    python -m tools.demo_pair.chat_lengths --chats 3000 --seed 12 --corpus v5e  # v9

Corpus v6 fits every prompt into the context as the app does (``data.fitted_chat_examples``),
so its examples are the lengths the model is trained on after fitting.

Never imported by ``app/``.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from tools.demo_pair.corpus import Generator
from tools.demo_pair.data import (
    CORPUS_VERSIONS,
    REPO,
    PromptFitter,
    chat_examples,
    fitted_chat_examples,
)


def main(argv: list[str] | None = None) -> None:
    """Print the figures (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chats", type=int, default=3000, help="chats to generate")
    ap.add_argument("--seed", type=int, default=16, help="the corpus seed (stages 15-16: 16)")
    ap.add_argument("--corpus", choices=CORPUS_VERSIONS, default="v6",
                    help="corpus generator (v6: pair v10; v5e: pair v9)")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer

    from app.chat.tools import tool_schemas

    tok = Tokenizer.from_file(str(REPO / "resources/models/demo-target/tokenizer.json"))
    defs = tool_schemas()
    if args.corpus == "v6":
        from tools.demo_pair.corpus6 import GeneratorV6

        g = GeneratorV6(args.seed, split="train")
        fitter = PromptFitter()

        def examples(chat):
            return fitted_chat_examples(chat, defs, fitter)
    else:
        g = Generator(args.seed, split="train")

        def examples(chat):
            return chat_examples(chat, defs)
    turns: Counter[int] = Counter()
    lengths: list[int] = []
    for _ in range(args.chats):
        chat = g.chat()
        turns[len(chat.turns)] += 1
        for prompt, completion in examples(chat):
            lengths.append(len(tok.encode(prompt + completion, add_special_tokens=False).ids))
    lengths.sort()
    p99 = lengths[min(len(lengths) - 1, int(0.99 * len(lengths)))]
    print(f"chats {args.chats} (corpus {args.corpus}, seed {args.seed}); user turns per chat: "
          + ", ".join(f"{n}: {turns[n]}" for n in sorted(turns)))
    print(f"examples {len(lengths)}; tokens per example (prompt + reply): median "
          f"{statistics.median(lengths):.0f}, 99th percentile {p99}, max {lengths[-1]}")


if __name__ == "__main__":
    main()
