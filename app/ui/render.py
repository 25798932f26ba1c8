"""HTML for the chat view: Qt's own Markdown for prose, fenced code blocks with a copy link.

Fenced code (```` ``` ````) is split out before Markdown conversion so each block gets its own
"Copy" anchor (``copy:N``, N indexing the ``codes`` list the caller keeps). Prose goes through
``QTextDocument.setMarkdown`` (CommonMark + GitHub dialect, Qt's md4c) and its HTML body is
reused. Nothing here touches MLX.
"""

from __future__ import annotations

import html
import json
import re

from PySide6.QtGui import QTextDocument

from app.ui.text import group_digits

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)(?:^```[ \t]*$|\Z)", re.S | re.M)
_BODY = re.compile(r"<body[^>]*>(.*)</body>", re.S)


VIEW_MESSAGE_CHARS = 100_000
"""The chat view shows at most this many characters of one message (its reasoning too; about
25,000 tokens, more than a reply's usual Max tokens); the rest is cut in the view only, with a
note saying how much and how to get all of it (the store, Copy all and Export keep every
character). Qt draws 100,000 characters of a message in 0.1 to 0.7 s on a 2-core CPU, a 30 MB
one not in minutes."""
VIEW_LINE_CHARS = 10_000
"""The chat view shows at most this many characters of one line: Qt lays out a long line
without spaces in a time that grows faster than its length (10,000 characters: 0.06 s;
100,000: about 3 s; 300,000: 14 s)."""


def cut_for_view(text: str, max_chars: int = VIEW_MESSAGE_CHARS,
                 max_line: int = VIEW_LINE_CHARS) -> tuple[str, int]:
    """``text`` as the chat view shows it: each line cut to ``max_line`` characters and the
    whole to ``max_chars``; returns (the text shown, the number of characters left out).
    Text within both limits comes back as it is (0 left out)."""
    if len(text) <= max_chars and all(len(line) <= max_line for line in text.split("\n")):
        return text, 0
    head = text[:max_chars + max_line]  # enough for the cut; the rest is left out anyway
    lines, size = [], 0
    for line in head.split("\n"):
        line = line[:max_line]
        room = max_chars - size
        if room <= 0:
            break
        lines.append(line[:room])
        size += min(len(line), room) + 1
    shown = "\n".join(lines)[:max_chars]
    return shown, len(text) - len(shown)


def cut_note_html(hidden: int, copy_link: str, palette: dict) -> str:
    """The note under a message cut in the view (:func:`cut_for_view`): how many characters
    are not shown, a "Copy all" link (``copy_link``, e.g. ``copymsg:3``) and where else to
    find them."""
    muted = palette.get("muted", "#667085")
    return (f'<p style="color:{muted}; font-size:small;">… {hidden:,} '
            f"more character{'s' if hidden != 1 else ''} not shown here, to keep the view "
            f'quick · <a href="{copy_link}" style="color:{palette.get("accent")};">Copy all'
            "</a> · or export the chat (File › Export) to read all of it</p>")


def markdown_html(text: str) -> str:
    """The HTML body Qt makes from Markdown ``text`` (str -> str)."""
    doc = QTextDocument()
    doc.setMarkdown(text, QTextDocument.MarkdownDialectGitHub)
    m = _BODY.search(doc.toHtml())
    return m.group(1) if m else html.escape(text)


def split_fences(text: str) -> list[tuple[str, str, str]]:
    """Split ``text`` into ("prose", "", text) and ("code", language, code) parts, in order.
    An unclosed fence (while streaming) runs to the end of the text."""
    parts: list[tuple[str, str, str]] = []
    pos = 0
    for m in _FENCE.finditer(text):
        if m.start() > pos:
            parts.append(("prose", "", text[pos:m.start()]))
        parts.append(("code", m.group(1).strip(), m.group(2).rstrip("\n")))
        pos = m.end()
    if pos < len(text):
        parts.append(("prose", "", text[pos:]))
    return parts


def code_block_html(code: str, lang: str, index: int, palette: dict) -> str:
    """A code block as an HTML table with a header holding the language and a copy link."""
    return (
        f'<table width="100%" cellspacing="0" cellpadding="8" '
        f'style="background-color:{palette["code_bg"]}; margin-top:6px; margin-bottom:6px;">'
        f'<tr><td style="color:{palette["muted"]}; font-size:small;">{html.escape(lang or "code")}'
        f'&nbsp;&nbsp;<a href="copy:{index}" style="color:{palette["accent"]};">Copy</a></td></tr>'
        f'<tr><td><pre style="font-family:monospace; margin:0;">{html.escape(code)}</pre>'
        f"</td></tr></table>"
    )


def message_html(text: str, codes: list[str], palette: dict,
                 readable_numbers: bool = False, keep_line_breaks: bool = False) -> str:
    """HTML for one message's Markdown ``text``; appends each code block's text to ``codes``
    (the index in the copy anchor is its position there). ``readable_numbers``: whole
    numbers of five or more digits in the prose (not in code) get thousands separators
    (``19600000 people`` -> ``19,600,000 people``), for the model's answers.
    ``keep_line_breaks``: every line break in the prose stays one (Markdown would join two
    lines into one paragraph), for the user's own messages, written with Shift+Enter."""
    out = []
    for kind, lang, body in split_fences(text):
        if kind == "code":
            codes.append(body)
            out.append(code_block_html(body, lang, len(codes) - 1, palette))
        elif body.strip():
            if readable_numbers:
                body = group_digits(body)
            if keep_line_breaks:  # two spaces before a line break: Markdown's hard break
                body = re.sub(r"(?<=\S)[ \t]*\n(?=[ \t]*\S)", "  \n", body)
            out.append(markdown_html(body))
    return "".join(out)


def tokens_html(pieces: list[str], from_draft: list[bool], palette: dict) -> str:
    """Plain text of ``pieces`` with the drafter's accepted tokens on a tinted background
    (one span per run of tokens with the same origin)."""
    out = []
    run: list[str] = []
    cur = None

    def close() -> None:
        if not run:
            return
        body = html.escape("".join(run)).replace("\n", "<br>")
        if cur:
            out.append(f'<span style="background-color:{palette["draft_bg"]};">{body}</span>')
        else:
            out.append(body)

    for piece, flag in zip(pieces, from_draft, strict=False):
        if flag != cur:
            close()
            run = []
            cur = flag
        run.append(piece)
    close()
    return "<p>" + "".join(out) + "</p>"


_MARKER = re.compile(r"</?think>|</?tool_call>")
_AFTER = {"<think>": "reasoning", "</think>": "answer", "<tool_call>": "tools",
          "</tool_call>": "answer"}

SECTION_TITLES = {"reasoning": "Reasoning", "answer": "Answer", "tools": "Tool calls"}
"""The sections a reply's tokens fall into, in display order."""


def split_sections(pieces: list[str], in_reasoning: bool = False) -> list[tuple[str, int, str]]:
    """Where each token's text belongs: ``(section, token index, text)`` in order, section
    "reasoning", "answer" or "tools"; the markers themselves (``<think>``, ``</think>``,
    ``<tool_call>``, ``</tool_call>``) are left out. A reply whose first marker is
    ``</think>`` started inside the reasoning (the chat template opened it); so did one with
    ``in_reasoning`` (:func:`starts_in_reasoning`: one stopped, or still being written,
    before its ``</think>``). A token whose text spans a marker gives one entry per side of
    it."""
    joined = "".join(pieces)
    marks = list(_MARKER.finditer(joined))
    first = marks[0].group() if marks else None
    state = "reasoning" if first == "</think>" or (in_reasoning and first != "<think>") \
        else "answer"
    out: list[tuple[str, int, str]] = []
    pos = 0
    mi = 0
    for i, p in enumerate(pieces):
        start, end = pos, pos + len(p)
        pos = end
        cur = start
        while cur < end:
            while mi < len(marks) and marks[mi].end() <= cur:
                mi += 1
            m = marks[mi] if mi < len(marks) else None
            if m is None or m.start() >= end:
                out.append((state, i, joined[cur:end]))
                break
            if m.start() > cur:
                out.append((state, i, joined[cur:m.start()]))
            state = _AFTER[m.group()]
            cur = min(end, m.end())
            if m.end() <= end:
                mi += 1
    return out


def _section_runs(entries: list[tuple[str, int, str]], section: str):
    """The entries of one section with the section's outer blank lines trimmed."""
    runs = [(i, t) for s, i, t in entries if s == section]
    while runs and not runs[0][1].strip():
        runs.pop(0)
    while runs and not runs[-1][1].strip():
        runs.pop()
    if runs:
        runs[0] = (runs[0][0], runs[0][1].lstrip())
        runs[-1] = (runs[-1][0], runs[-1][1].rstrip())
    return runs


def starts_in_reasoning(result) -> bool:
    """True when a reply's token texts (``result.pieces``) begin inside its reasoning: they
    start with its reasoning's text (``result.reasoning``, up to its first 40 characters)
    and never open it (the chat template wrote ``<think>``). The tokens alone cannot say so
    before their ``</think>``, in a reply stopped (or still being written) inside its
    reasoning."""
    reasoning = result.reasoning.strip()[:40]
    joined = "".join(result.pieces)
    return bool(reasoning) and "<think>" not in joined and joined.lstrip().startswith(reasoning)


def answer_tokens_html(pieces: list[str], from_draft: list[bool], palette: dict,
                       in_reasoning: bool = False) -> str | None:
    """The answer part of a reply's tokens, drafter-accepted ones tinted (:func:`tokens_html`);
    reasoning and tool-call markup are left out (``in_reasoning``: as
    :func:`split_sections`). None when there is no answer text."""
    entries = split_sections(pieces, in_reasoning)
    runs = _section_runs(entries, "answer")
    if not runs:
        return None
    flags = list(from_draft) + [False] * (len(pieces) - len(from_draft))
    return tokens_html([t for _, t in runs], [flags[i] for i, _ in runs], palette)


def spells_its_text(result, answer_only: bool = False) -> bool:
    """True when a reply's token texts (``result.pieces``) spell its stored answer
    (``result.content``): all of them joined (what Compare shows, every section), or with
    ``answer_only`` their answer section (what Colour drafts shows, :func:`answer_text`; a
    malformed tool call the parser kept as text is in the stored answer but not in that
    section). Texts decoded by another model's tokenizer do not; the stored text is shown
    instead."""
    text = answer_text(result.pieces, starts_in_reasoning(result)) if answer_only \
        else "".join(result.pieces)
    return result.content.strip() in text


def answer_text(pieces: list[str], in_reasoning: bool = False) -> str:
    """The answer part of a reply's token texts (what :func:`answer_tokens_html` shows;
    ``in_reasoning``: as :func:`split_sections`)."""
    return "".join(t for _, t in _section_runs(split_sections(pieces, in_reasoning), "answer"))


def draft_legend_html(palette: dict) -> str:
    """The legend of Colour drafts: a tinted sample for a draft token the target accepted,
    an untinted one for a token the target produced itself."""
    return (f'<p style="color:{palette.get("muted", "#667085")}; font-size:small;">'
            f'Colour drafts: <span style="background-color:{palette.get("draft_bg", "#d6f0dd")};'
            f' color:{palette.get("text", "#000")};">&nbsp;accepted draft token&nbsp;</span>'
            f'&nbsp; <span style="color:{palette.get("text", "#000")};">target token</span>'
            " (only the answer is coloured, as the tokens the model wrote: no Markdown, numbers"
            " as written; reasoning is in its pane)</p>")


def call_text(call: dict) -> str:
    """A tool call on one line, ``name({"arg": value})``: its arguments as JSON, as the tool
    pane shows them (arguments that are a string already are kept as they are)."""
    args = call.get("arguments")
    if not isinstance(args, str):
        args = json.dumps({} if args is None else args, ensure_ascii=False, default=str)
    return f"{call.get('name')}({args})"


def earlier_rounds(messages: list[dict]) -> list[dict]:
    """The chat-template messages of a tool reply's rounds before its last one (its calls'
    results included): ``messages`` (``ReplyResult.messages``) up to its last assistant
    message; [] for a reply of one round."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=0)
    return messages[:last]


def earlier_rounds_html(messages: list[dict], palette: dict) -> str:
    """The rounds of a tool reply before its last one (:func:`earlier_rounds`), as one muted
    section: each round's reasoning, its tool calls (``name({...})``) and each result
    ("→ name: content"). "" when there is no earlier round."""
    lines, rounds = [], 0
    for m in earlier_rounds(messages):
        if m.get("role") == "assistant":
            rounds += 1
            if str(m.get("reasoning_content") or "").strip():
                lines.append(html.escape(str(m["reasoning_content"]).strip()))
            for c in m.get("tool_calls") or []:
                f = c.get("function") or c
                lines.append('<span style="font-family:monospace;">'
                             f"{html.escape(call_text(f))}</span>")
        elif m.get("role") == "tool":
            lines.append('<span style="font-family:monospace;">'
                         f"→ {html.escape(str(m.get('name') or 'tool'))}: "
                         f"{html.escape(str(m.get('content') or ''))}</span>")
    if not rounds:
        return ""
    muted = palette.get("muted", "#667085")
    title = "Earlier round" if rounds == 1 else f"Earlier rounds ({rounds})"
    return (f'<p style="color:{muted}; font-size:small; margin-bottom:2px;"><b>{title}</b></p>'
            f'<p style="color:{muted};">{"<br>".join(lines)}</p>')


def sections_html(pieces: list[str], mark: int | None, palette: dict,
                  tool_calls: list[dict] | None = None, in_reasoning: bool = False) -> str:
    """A reply's tokens as separate sections (Reasoning, Answer, Tool calls; empty ones left
    out), the token at index ``mark`` (the first divergence) on the highlight colour in
    whichever section it falls; a mark past the end shows "[ended]". ``tool_calls`` (dicts
    with name and arguments) are listed when the tokens hold no tool-call text;
    ``in_reasoning``: as :func:`split_sections`."""
    entries = split_sections(pieces, in_reasoning)
    hi = palette.get("diff_bg", "#fdd")
    muted = palette.get("muted", "#667085")
    visible = {i for _, i, t in entries if t}
    if mark is not None and mark < len(pieces) and mark not in visible:
        mark = min((i for i in visible if i > mark), default=len(pieces))
    out = []
    for section, title in SECTION_TITLES.items():
        runs = _section_runs(entries, section)
        body = []
        for i, t in runs:
            text = html.escape(t).replace("\n", "<br>")
            if i == mark:
                text = f'<span style="background-color:{hi};">{text or "∅"}</span>'
            body.append(text)
        if section == "tools" and not runs and tool_calls:
            for c in tool_calls:
                body.append(html.escape(call_text(c)) + "<br>")
        if not body:
            continue
        style = f' style="color:{muted};"' if section == "reasoning" else ""
        mono = ' style="font-family:monospace;"' if section == "tools" else style
        out.append(f'<p style="color:{muted}; font-size:small; margin-bottom:2px;">'
                   f"<b>{title}</b></p><p{mono}>{''.join(body)}</p>")
    if mark is not None and mark >= len(pieces):
        out.append(f'<p><span style="background-color:{hi};">[ended]</span></p>')
    return "".join(out) or "<p></p>"


def mark_section(pieces: list[str], mark: int | None, in_reasoning: bool = False) -> str | None:
    """The section ("reasoning", "answer", "tools") of the token at ``mark`` (None when
    there is no such token; ``in_reasoning``: as :func:`split_sections`)."""
    if mark is None:
        return None
    for section, i, t in split_sections(pieces, in_reasoning):
        if i >= mark and t:
            return section
    return None
