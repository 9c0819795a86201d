"""docs/troubleshooting.md: its examples run, in order, in one namespace, and its checklist
names every symptom users ask about, each with where to look."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
SYMPTOMS = (
    "The model never calls tools",
    "It always calls the same tool",
    "Arguments are missing or invented",
    "The result is not used",
    "The loop never stops",
    "The answer invents data",
    "Sessions got mixed up",
    "Provider rejected the request",
)


def test_the_examples_run() -> None:
    text = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3
    namespace: dict[str, object] = {"__name__": "docs_troubleshooting"}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"troubleshooting.md (python block {number})", "exec"), namespace)


def test_each_symptom_has_a_row_pointing_at_a_diagnosis() -> None:
    rows = {
        line.split("|")[1].strip().strip("*"): line
        for line in PAGE.read_text(encoding="utf-8").splitlines()
        if line.startswith("| **")
    }
    assert sorted(rows) == sorted(SYMPTOMS)
    for symptom, row in rows.items():
        where = row.split("|")[2]
        assert re.search(r"trace show|--debug|status|session", where), symptom


def test_the_page_is_linked_from_the_readme_and_the_guide() -> None:
    for page in ("README.md", "docs/guide.md"):
        assert "troubleshooting.md" in (ROOT / page).read_text(encoding="utf-8"), page
