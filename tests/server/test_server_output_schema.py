"""A run asked for an answer matching a JSON Schema (``output_schema``) over the service: the
validated value in ``data``, or 422 with the whole result when the answer never matches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from hermes_agent import Agent, ScriptedModel
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.types import Message
from server_harness import serve

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "delay_min": {"type": "integer"}},
    "required": ["city", "delay_min"],
    "additionalProperties": False,
}


def answers(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """'good' → a matching answer; anything else → prose that never matches."""
    user = next(str(m.content) for m in messages if m.role == "user")
    return '{"city": "Oslo", "delay_min": 25}' if "good" in user else "It is late, sorry."


def test_the_answer_is_validated_against_the_requests_schema(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel(answers), storage=f"sqlite:///{tmp_path / 'state.db'}")
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        client = httpx.Client(base_url=url, timeout=30)
        good = client.post("/v1/runs", json={"message": "good flight", "output_schema": SCHEMA})
        assert good.status_code == 200, good.text
        assert good.json()["data"] == {"city": "Oslo", "delay_min": 25}

        bad = client.post("/v1/runs", json={"message": "bad flight", "output_schema": SCHEMA})
        assert bad.status_code == 422, bad.text
        result = bad.json()
        assert result["status"] == 422 and result["data"] is None
        assert result["output_retries"] >= 1  # the model was asked again before giving up
        # The run went through to its end and failed there: its model never gave a valid
        # answer (not a failure of the service); the result stays with it.
        status = client.get(f"/v1/runs/{result['request_id']}").json()
        assert status["status"] == "failed" and "did not match" in status["error"]
        assert status["result"]["status"] == 422

        plain = client.post("/v1/runs", json={"message": "bad flight"})
        assert plain.status_code == 200 and plain.json()["data"] is None
    agent.close()
