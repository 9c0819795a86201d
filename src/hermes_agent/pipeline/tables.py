"""Tables of tool data: what the ``table`` and ``markdown`` formats draw.

    from hermes_agent import TableRenderer

    agent.add_renderer("table", TableRenderer(columns={"flight_no": "航班号"}, max_rows=20))

or, in the config::

    output:
      format: table
      table:
        columns: {flight_no: 航班号, delay_minutes: 延误(分钟)}
        max_rows: 20

What is drawn is the latest successful tool result that holds records: a list of objects, or an
object one level up that holds such a list (``{"flights": [...], "summary": {...}}``: the
``flights``). An object inside a record is spread over columns one level deep
(``{"dep": {"time": "15:20"}}`` → a ``dep.time`` column). ``columns`` renames fields (a field it
does not name keeps its name) and, with ``only_mapped``, chooses them and their order. Past
``max_rows`` rows a last line says how many more there are. Cells are padded to the width a
terminal gives them — two columns for East Asian wide and fullwidth characters (``航班号``),
none for combining marks — so a table in Chinese lines up as one in English does. Every cell
is one line, bounded (``max_cell_chars``) and escaped for markdown: tool data is untrusted.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hermes_agent.types import ToolCallRecord


class Rendered(Protocol):
    """What a table renderer reads of ``pipeline.renderers.RenderInput`` (declared here so
    that this module, which the renderers import, imports nothing of theirs)."""

    @property
    def output(self) -> str: ...

    @property
    def tool_calls(self) -> list[ToolCallRecord]: ...


MORE_ROWS = {
    "en": "… {count} more rows not shown",
    "zh": "… 还有 {count} 行未显示",
}
"""The line under a capped table, by language (``{count}`` is the number of rows left out)."""


def display_width(text: str) -> int:
    """The columns ``text`` takes on a terminal: 2 for East Asian wide and fullwidth
    characters, 0 for combining marks and zero-width characters, 1 for the rest."""
    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Cf", "Mn", "Me"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width


def records_in(data: Any) -> list[dict[str, Any]] | None:
    """The records ``data`` holds: itself when it is a non-empty list of objects, else the
    first such list among the values of an object (one level down); ``None`` when none."""
    if _is_records(data):
        return list(data)
    if isinstance(data, Mapping):
        for value in data.values():
            if _is_records(value):
                return list(value)
    return None


def _is_records(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(row, Mapping) for row in value)
    )


def latest_records(tool_calls: Sequence[ToolCallRecord]) -> list[dict[str, Any]] | None:
    """The records of the most recent successful tool call that returned some."""
    for call in reversed(tool_calls):
        if call.error is None:
            found = records_in(call.result)
            if found is not None:
                return found
    return None


@dataclass
class TableRenderer:
    """A renderer (``RenderInput -> str``) drawing the latest tool records as a markdown table.

    ``columns`` maps field names to column headers; ``only_mapped`` shows only the fields it
    names, in its order; ``max_rows`` caps the rows (a line then says how many more there were,
    in ``language``: ``en`` or ``zh``); ``max_cell_chars`` bounds each cell. ``with_answer``
    puts the model's answer above the table (the ``markdown`` format); without records the
    answer is rendered alone either way.
    """

    columns: Mapping[str, str] = field(default_factory=dict)
    max_rows: int = 50
    max_cell_chars: int = 80
    only_mapped: bool = False
    language: str = "en"
    with_answer: bool = False

    def __call__(self, view: Rendered) -> str:
        records = latest_records(view.tool_calls)
        if records is None:
            return view.output
        table = self.table(records)
        return f"{view.output}\n\n{table}" if self.with_answer and view.output else table

    def table(self, records: Sequence[Mapping[str, Any]]) -> str:
        """``records`` as a markdown table, padded by display width and capped."""
        return markdown_table(
            records,
            columns=self.columns,
            max_rows=self.max_rows,
            max_cell_chars=self.max_cell_chars,
            only_mapped=self.only_mapped,
            language=self.language,
        )


def markdown_table(
    records: Sequence[Mapping[str, Any]],
    *,
    columns: Mapping[str, str] | None = None,
    max_rows: int | None = None,
    max_cell_chars: int = 80,
    only_mapped: bool = False,
    language: str = "en",
) -> str:
    """A markdown table of ``records`` (see the module docstring for every option)."""
    mapping = dict(columns or {})
    rows = [_flattened(row) for row in records]
    if only_mapped and mapping:
        fields = list(mapping)
    else:
        fields = []
        for row in rows:
            fields.extend(key for key in row if key not in fields)
    shown = rows if max_rows is None else rows[: max(max_rows, 0)]
    header = [_cell(mapping.get(name, name), max_cell_chars) for name in fields]
    body = [[_cell(row.get(name, ""), max_cell_chars) for name in fields] for row in shown]
    widths = [
        max([display_width(header[i]), 3, *(display_width(line[i]) for line in body)])
        for i in range(len(fields))
    ]
    lines = [_line(header, widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines.extend(_line(line, widths) for line in body)
    hidden = len(rows) - len(shown)
    if hidden > 0:
        lines.append("")
        lines.append(MORE_ROWS.get(language, MORE_ROWS["en"]).format(count=hidden))
    return "\n".join(lines)


def _flattened(row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` with each object value spread one level: ``dep: {time: ..}`` → ``dep.time``."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, Mapping) and value:
            for inner, item in value.items():
                flat[f"{key}.{inner}"] = item
        else:
            flat[str(key)] = value
    return flat


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    pairs = zip(cells, widths, strict=True)
    padded = (cell + " " * (width - display_width(cell)) for cell, width in pairs)
    return "| " + " | ".join(padded) + " |"


def _cell(value: Any, limit: int) -> str:
    """One line of markdown-safe text of at most ``limit`` characters."""
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())  # newlines, tabs and runs of spaces: one space
    if len(text) > limit:
        text = text[: max(limit - 1, 0)] + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|")
