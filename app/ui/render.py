"""HTML for the chat view: Qt's own Markdown for prose, fenced code blocks with a copy link.

Fenced code (```` ``` ````) is split out before Markdown conversion so each block gets its own
"Copy" anchor (``copy:N``, N indexing the ``codes`` list the caller keeps). Prose goes through
``QTextDocument.setMarkdown`` (CommonMark + GitHub dialect, Qt's md4c) and its HTML body is
reused. Nothing here touches MLX.
"""

from __future__ import annotations

import html
import re

from PySide6.QtGui import QTextDocument

from app.ui.text import group_digits

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)(?:^```[ \t]*$|\Z)", re.S | re.M)
_BODY = re.compile(r"<body[^>]*>(.*)</body>", re.S)


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
                 readable_numbers: bool = False) -> str:
    """HTML for one message's Markdown ``text``; appends each code block's text to ``codes``
    (the index in the copy anchor is its position there). ``readable_numbers``: whole
    numbers of five or more digits in the prose (not in code) get thousands separators
    (``19600000 people`` -> ``19,600,000 people``), for the model's answers."""
    out = []
    for kind, lang, body in split_fences(text):
        if kind == "code":
            codes.append(body)
            out.append(code_block_html(body, lang, len(codes) - 1, palette))
        elif body.strip():
            out.append(markdown_html(group_digits(body) if readable_numbers else body))
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
