"""Details the design documents promise and a first reader looks for: the result prints as its
answer, ``DEBUG=1`` works in the library and the CLI alike, hooks see secrets masked (raw only
when they ask), a refused run names its real prompt, ``ctx.output`` answers from ``pre_input``,
an unfilled placeholder warns, the preamble is replaceable and asks for honest errors, and a
failed tool's result says what to do next."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, HookContext, PostExecutionHook, ScriptedModel, parse_config
from hermes_agent.logs import debug_from_environment
from hermes_agent.protocol.prompts import (
    HERMES_ROLE,
    HONEST_ERRORS_RULE,
    TOOL_FAILURE_GUIDANCE,
)
from hermes_agent.storage import InMemoryStorage
from hermes_agent.testing import tool_call as call

SECRET = "sk-SECRET123"
ROOT = Path(__file__).resolve().parents[2]


def _login_agent(model: ScriptedModel, **options: Any) -> Agent:
    agent = Agent(model=model, secrets=[SECRET], **options)

    @agent.tool
    def login(user: str, key: str) -> dict[str, Any]:
        """Log in."""
        seen.append({"user": user, "key": key})
        return {"user": user, "key": key, "ok": True}

    seen: list[dict[str, Any]] = []
    agent.seen = seen  # type: ignore[attr-defined]
    return agent


# -- str(result) ------------------------------------------------------------------------------


def test_str_of_a_result_is_its_answer_and_repr_stays_whole() -> None:
    result = Agent(model=ScriptedModel(["The answer is 42."])).run("?")
    assert str(result) == "The answer is 42."
    assert f"{result}" == "The answer is 42."
    assert repr(result).startswith("RunResult(output='The answer is 42.', status=200")


# -- DEBUG=1 / HERMES_DEBUG=1 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "on"),
    [
        ({}, False),
        ({"DEBUG": "1"}, True),
        ({"HERMES_DEBUG": "1"}, True),
        ({"HERMES_DEBUG": "true"}, True),
        ({"DEBUG": "0", "HERMES_DEBUG": "false"}, False),
        ({"DEBUG": "off"}, False),
    ],
)
def test_either_variable_turns_debug_on(environment: dict[str, str], on: bool) -> None:
    assert debug_from_environment(environment) is on


LIBRARY_RUN = textwrap.dedent(
    """
    import logging
    from hermes_agent import Agent, ScriptedModel
    agent = Agent(model=ScriptedModel(["done"]))
    print(agent.run("hi"))
    logging.getLogger("hermes_agent.demo").warning("a warning shows by default")
    """
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("HERMES_DEBUG", "DEBUG")} | env
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=True,
    )


@pytest.mark.parametrize("variable", ["DEBUG", "HERMES_DEBUG"])
def test_the_library_logs_its_stages_when_asked(variable: str) -> None:
    done = _python(LIBRARY_RUN, **{variable: "1"})
    assert done.stdout.strip() == "done"
    assert "[INFO] InputParser: status=200" in done.stderr
    assert "[INFO] OutputRenderer: status=200" in done.stderr


def test_the_library_prints_only_warnings_by_default() -> None:
    done = _python(LIBRARY_RUN)
    assert done.stdout.strip() == "done"
    assert done.stderr.strip() == "a warning shows by default"


def test_the_cli_honours_debug_too(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("model:\n  provider: scripted\n  responses: ['hello']\n", encoding="utf-8")
    environment = {k: v for k, v in os.environ.items() if k not in ("HERMES_DEBUG", "DEBUG")}
    done = subprocess.run(
        [sys.executable, "-m", "hermes_agent", "run", "--config", str(config), "hi"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=environment | {"DEBUG": "1", "HOME": str(tmp_path)},
        check=True,
    )
    assert done.stdout.strip() == "hello"
    assert "[INFO] InputParser: status=200" in done.stderr


# -- hooks see masked arguments ---------------------------------------------------------------


class Watcher(PostExecutionHook):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def execute(self, context: HookContext) -> None:
        self.seen.append((context.input_params, context.response))
        self.seen.append([(c.arguments, c.result) for c in context.tool_calls])
        self.seen.append([r.content for r in context.results])
        self.seen.append([m.tool_calls for m in context.messages if m.tool_calls])


class RawWatcher(Watcher):
    raw_arguments = True


def test_hooks_see_secrets_masked_as_the_trail_does() -> None:
    model = ScriptedModel([call("login", user="ana", key=SECRET), "in"])
    storage = InMemoryStorage()
    agent = _login_agent(model, storage=storage)
    watcher = Watcher()
    agent.add_hook("post_execution", watcher)
    result = agent.run("log in")
    assert agent.seen == [{"user": "ana", "key": SECRET}]  # type: ignore[attr-defined]
    assert SECRET not in repr(watcher.seen)
    (params, response), *_ = watcher.seen
    assert params == {"user": "ana", "key": "[REDACTED]"}
    assert response["data"] == {"user": "ana", "key": "[REDACTED]", "ok": True}
    trail = "".join(record.content for record in storage.records(result.request_id))
    assert "[REDACTED]" in trail and SECRET not in trail
    # The run's own result is the caller's: unmasked, as before.
    assert result.tool_calls[0].arguments["key"] == SECRET


def test_a_hook_that_asks_for_raw_arguments_gets_them() -> None:
    model = ScriptedModel([call("login", user="ana", key=SECRET), "in"])
    agent = _login_agent(model)
    watcher = RawWatcher()
    agent.add_hook("post_execution", watcher)

    def plain(ctx: HookContext) -> None:
        seen.append(ctx.input_params)

    def raw(ctx: HookContext) -> None:
        seen.append(ctx.input_params)

    raw.raw_arguments = True  # type: ignore[attr-defined]
    seen: list[dict[str, Any]] = []
    agent.add_hook("post_execution", plain)
    agent.add_hook("post_execution", raw)
    agent.run("log in")
    (params, _), *_ = watcher.seen
    assert params["key"] == SECRET
    assert [s["key"] for s in seen] == ["[REDACTED]", SECRET]


def test_a_hook_rewriting_masked_arguments_keeps_the_secret_it_did_not_touch() -> None:
    model = ScriptedModel([call("login", user="ana", key=SECRET), "in"])
    agent = _login_agent(model)
    shown: list[dict[str, Any]] = []

    def rename(ctx: HookContext) -> None:
        for plan in ctx.planned:
            shown.append(dict(plan.arguments))
            plan.arguments["user"] = "bob"

    agent.add_hook("pre_execution", rename)
    result = agent.run("log in")
    assert shown == [{"user": "ana", "key": "[REDACTED]"}]
    assert agent.seen == [{"user": "bob", "key": SECRET}]  # type: ignore[attr-defined]
    assert result.status == 200


def test_a_veto_of_a_masked_plan_refuses_the_call() -> None:
    model = ScriptedModel([call("login", user="ana", key=SECRET), "refused"])
    agent = _login_agent(model)
    agent.add_hook("pre_execution", lambda ctx: [ctx.veto(p, "no") for p in ctx.planned])
    result = agent.run("log in")
    assert agent.seen == []  # type: ignore[attr-defined]
    assert result.tool_calls[0].status_code == 403


def test_a_pre_selection_hook_sees_masked_calls_and_may_still_adjust_them() -> None:
    model = ScriptedModel([call("login", user="ana", key=SECRET), "in"])
    agent = _login_agent(model)
    shown: list[Any] = []

    def adjust(ctx: HookContext) -> None:
        shown.append(dict(ctx.completion.tool_calls[0].arguments))
        ctx.completion.tool_calls[0].arguments["user"] = "eve"

    agent.add_hook("pre_selection", adjust)
    agent.run("log in")
    assert shown == [{"user": "ana", "key": "[REDACTED]"}]
    assert agent.seen == [{"user": "eve", "key": SECRET}]  # type: ignore[attr-defined]


# -- a refused run names its real prompt ------------------------------------------------------


def test_a_run_refused_by_a_hook_records_the_real_system_prompt_hash() -> None:
    storage = InMemoryStorage()

    def lookup(city: str) -> str:
        """Weather."""
        return "sunny"

    def agent_with(model: ScriptedModel) -> Agent:
        return Agent(model=model, system_prompt="You help.", tools=[lookup], storage=storage)

    answered = agent_with(ScriptedModel(["hi"])).run("hello")
    refusing = agent_with(ScriptedModel(["never"]))
    refusing.add_hook("pre_input", lambda ctx: ctx.finish("Not today.", status=403))
    refused = refusing.run("hello")
    assert refused.output == "Not today." and refused.status == 403
    hashes = {
        name: {r.system_prompt_sha256 for r in storage.records(result.request_id)}
        for name, result in (("answered", answered), ("refused", refused))
    }
    empty = hashlib.sha256(b"").hexdigest()
    assert len(hashes["refused"]) == 1 and empty not in hashes["refused"]
    assert hashes["refused"] == hashes["answered"]


# -- ctx.output in pre_input ------------------------------------------------------------------


def test_output_set_in_pre_input_answers_without_the_model() -> None:
    model = ScriptedModel(["the model"])
    agent = Agent(model=model)

    def cached(ctx: HookContext) -> None:
        ctx.output = "From the cache."

    agent.add_hook("pre_input", cached)
    result = agent.run("hi")
    assert result.output == "From the cache." and result.status == 200
    assert result.loop_status == "answered_by_hook"
    assert result.answered_by is not None and result.answered_by["point"] == "pre_input"
    assert model.requests == []


def test_output_set_where_it_means_nothing_is_a_clear_error() -> None:
    model = ScriptedModel([call("login", user="ana", key="k"), "in"])
    agent = _login_agent(model)

    def misplaced(ctx: HookContext) -> None:
        ctx.output = "ignored?"

    agent.add_hook("post_execution", misplaced)
    result = agent.run("log in")
    assert result.status == 500
    assert result.error is not None
    assert "ctx.output in pre_output or post_output" in result.error
    assert "not in post_execution" in result.error


# -- an unfilled placeholder warns ------------------------------------------------------------


def test_a_placeholder_without_a_value_warns_and_is_sent_as_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel(["ok", "ok"])
    agent = Agent(model=model, system_prompt="Level: {{ level }}. Name: {{ nmae }}.")
    with caplog.at_level(logging.WARNING, logger="hermes_agent"):
        result = agent.run("hi", variables={"level": "expert"})
    assert model.requests[0].messages[0].content == "Level: expert. Name: {{ nmae }}."
    assert [w for w in result.warnings if "placeholder" in w] == [
        "the system prompt's placeholder {{ nmae }} has no value (no variable 'nmae'); it was "
        "sent as written"
    ]
    assert any("{{ nmae }}" in r.getMessage() for r in caplog.records)
    assert agent.run("again", variables={"level": "x", "nmae": "Ann"}).warnings == []


# -- the preamble -----------------------------------------------------------------------------


def _system_text(agent: Agent, model: ScriptedModel) -> str:
    request = model.requests[0]
    return agent.model.render_prompt(request.messages, request.tools, request.settings)


def test_the_default_preamble_is_hermes_with_the_honest_errors_rule() -> None:
    model = ScriptedModel(["ok"])
    agent = _login_agent(model)
    agent.run("hi")
    prompt = _system_text(agent, model)
    assert f"{HERMES_ROLE} {HONEST_ERRORS_RULE}\nHere are the available tools:" in prompt


def test_the_preamble_is_replaceable_in_code_and_in_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = ScriptedModel(["ok"])
    agent = _login_agent(model, preamble="You are the bank's assistant; call its functions.")
    agent.run("hi")
    prompt = _system_text(agent, model)
    assert "You are the bank's assistant; call its functions.\nHere are the available" in prompt
    assert HERMES_ROLE not in prompt
    config = parse_config(
        {
            "model": {"provider": "scripted", "responses": ["ok"]},
            "prompt": {"preamble": "Short role."},
        }
    )
    configured = Agent.from_settings(config)
    assert configured.preamble == "Short role."


def test_the_embedded_model_keeps_the_text_its_call_bias_was_calibrated_on() -> None:
    pytest.importorskip("llama_cpp")
    from hermes_agent import LlamaCpp
    from hermes_agent.models.base import ModelSettings
    from hermes_agent.types import Message

    model = LlamaCpp.__new__(LlamaCpp)
    model.chat_format = "hermes"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    messages = [Message("user", "hi")]
    default = LlamaCpp.render_prompt(model, messages, tools, ModelSettings())
    assert HERMES_ROLE in default and HONEST_ERRORS_RULE not in default
    replaced = LlamaCpp.render_prompt(model, messages, tools, ModelSettings(preamble="Mine."))
    assert "Mine.\nHere are the available tools" in replaced


# -- a failed tool's result says what to do next ----------------------------------------------


def test_a_failed_call_is_fed_back_with_guidance_and_the_record_keeps_the_bare_error() -> None:
    model = ScriptedModel([call("flaky"), "It failed; sorry."])
    agent = Agent(model=model)

    @agent.tool
    def flaky() -> str:
        """Fails."""
        raise RuntimeError("HTTP 500 from upstream")

    result = agent.run("go")
    (fed,) = model.requests[1].messages[-1].tool_results
    assert fed.status_code == 500
    assert fed.content["error"] == (
        f"tool 'flaky' raised RuntimeError: HTTP 500 from upstream. {TOOL_FAILURE_GUIDANCE}"
    )
    assert result.tool_calls[0].error == "tool 'flaky' raised RuntimeError: HTTP 500 from upstream"


# -- audit status words -----------------------------------------------------------------------


def test_the_audit_page_maps_the_status_words_to_the_seed_s() -> None:
    page = (ROOT / "docs" / "sessions-and-audit.md").read_text(encoding="utf-8")
    assert "`ok` (success" in page and "`error`" in page and "408 timeout" in page


# -- the scratch pad as its own audit item ----------------------------------------------------


@pytest.mark.parametrize(
    ("turn", "planning"),
    [
        (
            "<scratch_pad>Goal: greet. Plan: answer.</scratch_pad>Hello!",
            "Goal: greet. Plan: answer.",
        ),
        ("<think>They said hi; answer briefly.</think>Hello!", "They said hi; answer briefly."),
    ],
)
def test_the_scratch_pad_is_its_own_audit_item(turn: str, planning: str) -> None:
    storage = InMemoryStorage()
    result = Agent(model=ScriptedModel([turn]), storage=storage).run("hi")
    assert result.output == "Hello!"
    records = storage.records(result.request_id)
    pads = [r for r in records if r.role == "scratch_pad"]
    assert [(p.stage, p.step, p.content) for p in pads] == [("ThoughtGenerator", 0, planning)]
    roles = [r.role for r in records if r.stage == "ThoughtGenerator"]
    assert roles.index("scratch_pad") == roles.index("completion") + 1


def test_a_turn_without_planning_records_no_scratch_pad_and_secrets_in_it_are_masked() -> None:
    storage = InMemoryStorage()
    plain = Agent(model=ScriptedModel(["Hello!"]), storage=storage).run("hi")
    assert all(r.role != "scratch_pad" for r in storage.records(plain.request_id))
    leaky = Agent(
        model=ScriptedModel([f"<scratch_pad>use {SECRET}</scratch_pad>Done."]),
        storage=storage,
        secrets=[SECRET],
    ).run("hi")
    (pad,) = [r for r in storage.records(leaky.request_id) if r.role == "scratch_pad"]
    assert SECRET not in pad.content and "use" in pad.content
