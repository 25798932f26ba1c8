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


def generate_texts(seed: int, n_chats: int, forbidden: set[str] | None = None
                   ) -> list[tuple[str, str]]:
    """All (prompt, completion) pairs of ``n_chats`` seeded training chats; user texts in
    ``forbidden`` (the held-out sets) never occur."""
    from app.chat.tools import tool_schemas

    defs = tool_schemas()
    g = Generator(seed, split="train")
    g.forbid(forbidden or set())
    pairs: list[tuple[str, str]] = []
    for _ in range(n_chats):
        pairs.extend(chat_examples(g.chat(), defs))
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
