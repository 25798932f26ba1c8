"""Render the corpus through the project's chat template, train the tokenizer, tokenize.

One training example is one assistant turn exactly as the app would produce it: the prompt is
the conversation so far rendered with ``add_generation_prompt=True`` (the template pre-opens
``<think>`` when thinking is on), the completion is what the assistant writes after it, ending
with ``<|im_end|>``. The loss covers the completion only. Prompt and completion are encoded
separately, as the app encodes the prompt and the model then emits the completion tokens.

Runs on CPU with the main venv (it imports ``app.chat.tools`` for tool results).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tools.demo_pair.corpus import Chat, Generator

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_PATH = REPO / "resources" / "chat_template.jinja"

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
"""Special tokens (skipped when decoding with ``skip_special_tokens``); ids 0..3."""
MARKUP = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
          "</tool_response>"]
"""Added tokens that stay visible in decoded text (the parsers need them); ids 4..9."""
VOCAB_SIZE = 4096


def chat_template() -> str:
    """The project's chat template text."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def render(messages: list[dict], tools: list[dict] | None, enable_thinking: bool,
           add_generation_prompt: bool) -> str:
    """Render with transformers' own Jinja renderer (what ``apply_chat_template`` uses)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    out = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=chat_template(),
        add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
    )
    text = out[0] if isinstance(out, tuple) else out
    return text[0] if isinstance(text, list) else text


def _strip_reasoning(m: dict) -> dict:
    return {k: v for k, v in m.items() if k != "reasoning_content"}


def prompt_messages(history: list[dict]) -> list[dict]:
    """The messages the app renders for ``history`` (stored chat-template dicts, as
    ``Store.prompt_for_reply`` gives them): :func:`app.chat.history.fit_history` with no
    context pressure, which drops earlier turns' reasoning and keeps every tool call and
    result."""
    from app.chat.history import fit_history

    return fit_history(history, lambda _m: 0, 1 << 30).messages


def render_prompt_text(history: list[dict], tools: list[dict] | None,
                       enable_thinking: bool) -> str:
    """The generation prompt the app builds for ``history`` (the corpus renderer; a test
    compares it with the app's own path through ``Store`` and ``render_prompt``)."""
    return render(prompt_messages(history), tools, enable_thinking, True)


def chat_examples(chat: Chat, tool_defs: list[dict]) -> list[tuple[str, str]]:
    """(prompt text, completion text) for every assistant message of ``chat``: first rounds,
    rounds after tool results and follow-up turns, each prompt rendered from the history as
    the app would send it."""
    tools = tool_defs if chat.tools else None
    think = chat.enable_thinking
    msgs = chat.messages()
    if not think:
        msgs = [_strip_reasoning(m) for m in msgs]
    out = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        hist = prompt_messages(msgs[:k])
        prompt = render(hist, tools, think, True)
        full = render(hist + [m], tools, think, False)
        head = "<|im_start|>assistant\n"
        tail = full[full.rindex(head) + len(head):]
        if think:
            assert tail.startswith("<think>\n"), tail[:40]
            tail = tail[len("<think>\n"):]
            assert full.startswith(prompt), "template is not prefix-consistent"
        end = tail.rindex("<|im_end|>") + len("<|im_end|>")
        out.append((prompt, tail[:end]))
    return out


CONTEXT = 4096
"""The demo target's context (``max_position_embeddings``) in tokens."""
REPLY_RESERVE = 512
"""Tokens the app keeps free for the reply when it fits a prompt: ``min(max_tokens,
context // 2)`` (``ChatSession._fit``) at the default Max tokens, 512 (``app.chat.settings``)."""
FIT_TOKENIZER = REPO / "resources" / "models" / "demo-target" / "tokenizer.json"
"""The tokenizer prompts are measured with when fitting (the shipped target's: corpus v6 is
for training on from the shipped pair)."""
CORPUS_VERSIONS = ("v5e", "v6")
"""Generators ``generate_texts`` knows: ``v5e`` (``corpus.Generator``, the v9 pair's stage 14)
and ``v6`` (``corpus6.GeneratorV6``: generalisation and long chats, fitted as the app fits)."""
LONG_KEEP = (12, 0.1, 0.35)
"""Corpus v6: a long chat's (20 turns and more) turns whose assistant messages become
examples: every one of the last turn, and each other turn with probability 0.1 before turn
12 and 0.35 from it on (the later turns, near a full context, matter most; each costs a prompt
of up to 3,584 tokens)."""


class PromptFitter:
    """Fits a history into the context as the app does before a reply
    (``ChatSession._fit``: :func:`app.chat.history.fit_history` with ``limit``, ``reserve``
    and the app's ``LEAVE_OUT_STEP``), measuring prompts with the tokenizer at ``tokenizer_path`` rendered by
    :func:`render`.

    Raises ``app.chat.history.ContextOverflowError`` when even the current turn does not fit.
    """

    def __init__(self, tokenizer_path: Path = FIT_TOKENIZER, limit: int = CONTEXT,
                 reserve: int = REPLY_RESERVE):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_path))
        self.limit, self.reserve = limit, reserve
        self.fits = self.left_out = 0  # replies fitted, and those with turns left out

    def count(self, text: str) -> int:
        """Tokens of ``text`` (no special tokens added, as ``apply_chat_template`` does)."""
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def fit(self, history: list[dict], tools: list[dict] | None, think: bool):
        """``app.chat.history.FittedHistory`` for ``history`` (ending with the user message
        a reply answers). A prompt whose UTF-8 bytes fit the budget is not measured (a
        byte-level token is at least one byte)."""
        from app.chat.history import LEAVE_OUT_STEP, FittedHistory, fit_history

        budget = self.limit - self.reserve
        self.fits += 1
        text = render(prompt_messages(history), tools, think, True)
        if len(text.encode("utf-8")) <= budget:
            return FittedHistory(messages=prompt_messages(history), prompt_tokens=-1,
                                 budget=budget)
        fitted = fit_history(history, lambda msgs: self.count(render(msgs, tools, think, True)),
                             self.limit, reserve=self.reserve, step=LEAVE_OUT_STEP)
        self.left_out += fitted.left_out_turns > 0
        return fitted


def fitted_chat_examples(chat: Chat, tool_defs: list[dict], fitter: PromptFitter,
                         keep_turn=None) -> list[tuple[str, str]]:
    """As :func:`chat_examples`, with each reply's prompt fitted into the context as the app
    fits it: at the start of a reply (the history up to its user message) the oldest turns
    are left out until the prompt fits ``limit - reserve``; the reply's own tool rounds then
    extend that fitted prompt. ``keep_turn(index, n_turns) -> bool`` picks the turns whose
    assistant messages become examples (None: all)."""
    tools = tool_defs if chat.tools else None
    think = chat.enable_thinking
    msgs = chat.messages()
    if not think:
        msgs = [_strip_reasoning(m) for m in msgs]
    n_turns = sum(m["role"] == "user" for m in msgs)
    out = []
    turn, start, base = -1, 0, None
    for k, m in enumerate(msgs):
        if m["role"] == "user":
            turn, start, base = turn + 1, k, None
            continue
        if m["role"] != "assistant" or (keep_turn is not None and not keep_turn(turn, n_turns)):
            continue
        if base is None:
            base = fitter.fit(msgs[: start + 1], tools, think).messages
        hist = base + [dict(x) for x in msgs[start + 1 : k]]
        prompt = render(hist, tools, think, True)
        full = render(hist + [m], tools, think, False)
        head = "<|im_start|>assistant\n"
        tail = full[full.rindex(head) + len(head):]
        if think:
            assert tail.startswith("<think>\n"), tail[:40]
            tail = tail[len("<think>\n"):]
        end = tail.rindex("<|im_end|>") + len("<|im_end|>")
        out.append((prompt, tail[:end]))
    return out


def generate_texts(seed: int, n_chats: int, forbidden: set[str] | None = None,
                   version: str = "v5e", stats: dict | None = None) -> list[tuple[str, str]]:
    """All (prompt, completion) pairs of ``n_chats`` seeded training chats; user texts in
    ``forbidden`` (the held-out sets) never occur.

    ``version``: one of :data:`CORPUS_VERSIONS`. ``v6`` fits every prompt into the context as
    the app does (:func:`fitted_chat_examples`) and keeps some of a long chat's turns
    (:data:`LONG_KEEP`). ``stats`` (a dict, filled in): ``kinds`` (share of user turns per
    category), ``long_chats``, ``long_examples`` (their examples), and for ``v6``
    ``replies_fitted`` and ``replies_with_turns_left_out`` (replies whose prompt left out the
    oldest turns).

    Raises:
        ValueError: an unknown ``version``.
    """
    import random

    from app.chat.tools import tool_schemas

    if version not in CORPUS_VERSIONS:
        raise ValueError(f"unknown corpus version {version!r}; known: {CORPUS_VERSIONS}")
    defs = tool_schemas()
    if version == "v6":
        from tools.demo_pair.corpus6 import GeneratorV6

        g = GeneratorV6(seed, split="train")
        fitter = PromptFitter()
    else:
        g = Generator(seed, split="train")
    g.forbid(forbidden or set())
    pick = random.Random(seed + 101)

    def keep_long(i: int, n: int) -> bool:
        first, early, late = LONG_KEEP
        return i == n - 1 or pick.random() < (early if i < first else late)

    kinds: dict[str, int] = {}
    n_long = n_long_ex = 0
    pairs: list[tuple[str, str]] = []
    for _ in range(n_chats):
        c = g.chat()
        for t in c.turns:
            kinds[t.category] = kinds.get(t.category, 0) + 1
        if version == "v5e":
            pairs.extend(chat_examples(c, defs))
            continue
        if len(c.turns) >= 20:
            n_long += 1
            ex = fitted_chat_examples(c, defs, fitter, keep_long)
            n_long_ex += len(ex)
            pairs.extend(ex)
        else:
            pairs.extend(fitted_chat_examples(c, defs, fitter))
    if stats is not None:
        total = sum(kinds.values()) or 1
        stats["kinds"] = {k: round(v / total, 4)
                          for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}
        stats["long_chats"] = n_long
        stats["long_examples"] = n_long_ex
        if version == "v6":
            stats["replies_fitted"] = fitter.fits
            stats["replies_with_turns_left_out"] = fitter.left_out
    return pairs


def train_tokenizer(texts: list[str], out_dir: Path) -> None:
    """Train a byte-level BPE (``VOCAB_SIZE`` incl. added tokens) and save it HF-style.

    Writes ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template,
    ``eos_token`` ``<|im_end|>``) and ``special_tokens_map.json`` via
    ``PreTrainedTokenizerFast.save_pretrained``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one (as Qwen's tokenizer does): numbers copied out of tool results
    # are then copied digit by digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t in SPECIAL]
    markup = [AddedToken(t, special=False, normalized=False) for t in MARKUP]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=specials + markup, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    # The markup tokens must not be split by the pre-tokenizer while training.
    tok.add_special_tokens(specials)
    tok.add_tokens(markup)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, bos_token=None,
    )
    fast.chat_template = chat_template()
    fast.model_max_length = 4096
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    # mlx-lm and transformers also read the template from tokenizer_config.json.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = chat_template()
    cfg["add_bos_token"] = False
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # known to transformers 4.x and 5.x
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def tokenize_pairs(tok_dir: Path, pairs: list[tuple[str, str]]) -> dict[str, np.ndarray]:
    """Encode (prompt, completion) pairs: flat int32 ``tokens``, ``offsets`` (n+1),
    ``prompt_lens`` (n)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    enc_p = tok.encode_batch([p for p, _ in pairs], add_special_tokens=False)
    enc_c = tok.encode_batch([c for _, c in pairs], add_special_tokens=False)
    seqs, plens = [], []
    for a, b in zip(enc_p, enc_c):
        seqs.append(a.ids + b.ids)
        plens.append(len(a.ids))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
    return {"tokens": tokens, "offsets": offsets, "prompt_lens": np.asarray(plens, np.int32)}
