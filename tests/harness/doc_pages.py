"""Reading the code blocks of a docs page: each block with the HTML comment that marks it.

A page marks a block with a comment on the line before it (``<!-- run: bash -->``,
``<!-- file: tools.py -->``); the test of the page runs or checks the block by its mark.
"""

from __future__ import annotations

import re
from pathlib import Path

BLOCK = re.compile(r"(?:<!-- (?P<mark>[^>]*?) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)
"""A fenced block, with the comment on the line before it when there is one."""


def marked_blocks(page: Path) -> list[tuple[str, str, str]]:
    """Every fenced block of ``page``: its mark (``""`` when unmarked), language and body."""
    return [(m["mark"] or "", m["lang"], m["body"]) for m in BLOCK.finditer(page.read_text())]
