"""Tables of tool data: field names from the config, one level of nesting flattened, a row cap
with a "more rows" line, and CJK columns that line up."""

from __future__ import annotations

from typing import Any

from hermes_agent import Agent, ScriptedModel, TableRenderer, build_agent
from hermes_agent.config import parse_config
from hermes_agent.pipeline.tables import display_width, markdown_table, records_in

FLIGHTS: dict[str, Any] = {
    "flights": [
        {"flight_no": "MU5101", "dep": {"time": "15:20", "gate": "A3"}, "delay_minutes": 42},
        {"flight_no": "CA1858", "dep": {"time": "15:45", "gate": "B12"}, "delay_minutes": 0},
        {"flight_no": "HO1252", "dep": {"time": "16:05", "gate": "C7"}, "delay_minutes": 18},
    ],
    "summary": {"total": 3, "delayed": 2},
}
CALL = '<tool_call>{"name": "flight_status", "arguments": {"airport": "PVG"}}</tool_call>'


def flight_status(airport: str) -> dict[str, Any]:
    """Departures from an airport this afternoon."""
    return FLIGHTS


def test_display_width_counts_wide_characters_twice() -> None:
    assert display_width("MU5101") == 6
    assert display_width("航班号") == 6
    assert display_width("ＡＢ") == 4  # fullwidth
    assert display_width("e\u0301") == 1  # a combining accent takes no column


def test_records_one_level_down_are_found() -> None:
    assert records_in(FLIGHTS) == FLIGHTS["flights"]
    assert records_in([{"a": 1}]) == [{"a": 1}]
    assert records_in({"summary": {"total": 3}}) is None
    assert records_in({"deep": {"flights": [{"a": 1}]}}) is None  # one level only


def test_mapped_flattened_capped_and_aligned() -> None:
    table = markdown_table(
        FLIGHTS["flights"],
        columns={"flight_no": "航班号", "dep.time": "出发时间", "delay_minutes": "延误(分钟)"},
        only_mapped=True,
        max_rows=2,
        language="zh",
    )
    lines = table.splitlines()
    assert lines[0] == "| 航班号 | 出发时间 | 延误(分钟) |"
    assert lines[2] == "| MU5101 | 15:20    | 42         |"
    assert lines[3] == "| CA1858 | 15:45    | 0          |"
    assert lines[-1] == "… 还有 1 行未显示"
    # Every row of the table takes the same width on a terminal, Chinese header included.
    widths = {display_width(line) for line in lines[:4]}
    assert len(widths) == 1, lines


def test_unmapped_fields_keep_their_names_and_nested_ones_spread() -> None:
    table = markdown_table(FLIGHTS["flights"], columns={"flight_no": "航班号"})
    header = [cell.strip() for cell in table.splitlines()[0].strip("|").split("|")]
    assert header == ["航班号", "dep.time", "dep.gate", "delay_minutes"]
    assert "more rows" not in table


def test_cells_are_one_line_escaped_and_bounded() -> None:
    rows = [{"note": "a|b\nc", "long": "长" * 100, "none": None}]
    line = markdown_table(rows, max_cell_chars=10).splitlines()[2]
    assert "a\\|b c" in line
    assert "长" * 9 + "…" in line and "长" * 10 not in line
    assert line.endswith("|      |")  # None is an empty cell (as wide as its header)


def test_the_config_maps_fields_for_table_and_markdown() -> None:
    config = parse_config(
        {
            "model": {"provider": "scripted", "responses": [CALL, "三个航班，两个延误。"] * 2},
            "agent": {"language": "zh"},
            "output": {
                "format": "table",
                "table": {
                    "columns": {"flight_no": "航班号", "delay_minutes": "延误"},
                    "max_rows": 2,
                },
            },
        }
    )
    agent = build_agent(config, tools=[flight_status])
    result = agent.run("浦东机场下午的航班延误情况，用表格发给我")
    assert result.rendered is not None
    content = result.rendered.content
    assert content.splitlines()[0].startswith("| 航班号 | dep.time | dep.gate | 延误")
    assert content.endswith("… 还有 1 行未显示")
    markdown = agent.run("再来一次", output_format="markdown").rendered
    assert markdown is not None
    assert markdown.content.startswith("三个航班，两个延误。\n\n| 航班号 |")


def test_a_table_renderer_in_code() -> None:
    agent = Agent(ScriptedModel([CALL, "ok"]), tools=[flight_status])
    agent.add_renderer("flights", TableRenderer(columns={"flight_no": "Flight"}, max_rows=1))
    rendered = agent.run("flights?", output_format="flights").rendered
    assert rendered is not None
    assert rendered.content.splitlines()[0].startswith("| Flight ")
    assert rendered.content.endswith("… 2 more rows not shown")


def test_without_records_the_answer_is_rendered_alone() -> None:
    agent = Agent(ScriptedModel(["no tools needed"]))
    rendered = agent.run("hi", output_format="table").rendered
    assert rendered is not None and rendered.content == "no tools needed"
