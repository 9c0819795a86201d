"""Chinese where users look: the runtime's messages (``Agent(language=...)``, a run's ``lang``
variable, the config), the command line's output, the service's error details
(``Accept-Language``) and the web console's labels; docs/languages.md runs here."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cli_harness import hermes
from hermes_agent import Agent, Budget, ScriptedModel, tool
from hermes_agent.messages import error_detail, preferred_language
from hermes_agent.server import ServiceSettings, create_app
from server_harness import serve

DOCS = Path(__file__).resolve().parents[1] / "docs" / "languages.md"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'


@tool
def calculator(expression: str) -> float:
    """Evaluate an arithmetic expression."""
    return 391.0


def looping_agent(**options: Any) -> Agent:
    """An agent whose model calls the calculator every turn: one step, then a 206."""
    return Agent(ScriptedModel([CALL] * 4), tools=[calculator], max_iterations=1, **options)


# -- the library ---------------------------------------------------------------------------


def test_accept_language_picks_the_preferred_known_language() -> None:
    assert preferred_language("zh-CN,zh;q=0.9,en;q=0.8") == "zh"
    assert preferred_language("en-US,en;q=0.9,zh;q=0.8", "zh") == "en"
    assert preferred_language("fr;q=1, zh-TW;q=0.5, en;q=0.4") == "zh"
    assert preferred_language("zh;q=0, en;q=0.1") == "en"  # q=0: not acceptable
    assert preferred_language("fr-FR", "zh") == "zh"
    assert preferred_language(None) == "en"


def test_an_error_detail_keeps_its_english_after_the_sentence() -> None:
    assert error_detail(404, "no run 'x'", "en") == "no run 'x'"
    assert error_detail(404, "no run 'x'", "zh") == "未找到。详情：no run 'x'"
    assert error_detail(418, "teapot", "zh") == "请求无效。详情：teapot"  # by its class


def test_an_agent_in_chinese_needs_no_hook_and_renders_what_it_says() -> None:
    result = looping_agent(language="zh", output_format="markdown").run("17 * 23?")
    assert result.status == 206 and result.loop_status == "max_iterations"
    assert result.output.splitlines()[:2] == ["已执行 1 步，仍未得到最终答案。", "最近的工具结果："]
    assert result.rendered is not None and result.rendered.content.startswith("已执行 1 步")


def test_a_runs_lang_variable_wins_over_the_agents_language() -> None:
    assert looping_agent().run("?", variables={"lang": "zh-CN"}).output.startswith("已执行")
    assert (
        looping_agent(language="zh")
        .run("?", variables={"lang": "en"})
        .output.startswith("I stopped after 1 steps")
    )


def test_a_budget_that_stops_the_run_says_so_in_chinese() -> None:
    result = looping_agent(budget=Budget(max_run_tokens=1), language="zh").run("17 * 23?")
    assert result.status == 206 and result.loop_status == "budget_exceeded"
    assert re.match(r"在得到最终答案前停止：本次运行已用 \d+ 个 token，预算为 1", result.output)


def test_the_config_language_reaches_an_agent_built_from_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"provider": "scripted", "responses": [CALL]},
                "agent": {"max_iterations": 1, "language": "zh"},
            }
        )
    )
    agent = Agent.from_config(config, tools=[calculator])
    assert agent.language == "zh"
    assert agent.run("17 * 23?").output.startswith("已执行 1 步")


def test_the_languages_page_examples_run() -> None:
    text = DOCS.read_text(encoding="utf-8")
    namespace: dict[str, object] = {"__name__": "docs_languages"}
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S), start=1):
        exec(compile(block, f"languages.md (python block {number})", "exec"), namespace)
    config = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, re.S)[0])
    assert config == {"agent": {"language": "zh"}}


# -- the command line ----------------------------------------------------------------------


def cli_config(folder: Path, *responses: str, language: str | None = None) -> Path:
    agent: dict[str, Any] = {"max_iterations": 1}
    if language is not None:
        agent["language"] = language
    path = folder / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {"model": {"provider": "scripted", "responses": list(responses)}, "agent": agent}
        )
    )
    return path


def test_the_cli_speaks_the_configs_language(tmp_path: Path) -> None:
    done = hermes(tmp_path, "run", "--config", str(cli_config(tmp_path, CALL, language="zh")), "?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["已执行 1 步，仍未得到最终答案。", "最近的工具结果："]
    assert "警告：不完整的回答（状态 206，max iterations）" in done.stderr
    again = hermes(tmp_path, "run", "--lang", "en", "--config", str(tmp_path / "config.yaml"), "?")
    assert again.stdout.startswith("I stopped after 1 steps")
    assert "warning: a partial answer" in again.stderr


def test_the_cli_lang_option_translates_a_failure(tmp_path: Path) -> None:
    config = cli_config(tmp_path)  # no responses: the model fails
    done = hermes(tmp_path, "run", "--lang", "zh-CN", "--config", str(config), "hi")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("错误：502 模型服务暂时出错，请稍后再试。 详情：")
    wrong = hermes(tmp_path, "run", "--lang", "fr", "--config", str(config), "hi")
    assert wrong.returncode == 2 and "--lang fr: use en or zh" in wrong.stderr


def test_a_dry_run_headline_in_chinese(tmp_path: Path) -> None:
    config = cli_config(tmp_path, CALL, language="zh")
    done = hermes(tmp_path, "run", "--dry-run", "--config", str(config), "17 * 23?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "试运行：模型计划了 1 个有效调用；未执行任何工具。"


# -- the service ---------------------------------------------------------------------------


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    """The service with no config: an agent built in code, in English by default."""
    agent = looping_agent(storage=f"sqlite:///{tmp_path / 'state.db'}")
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        yield url


ZH = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"}


def test_service_errors_follow_accept_language(service: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        missing = client.get("/v1/runs/no-such-run", headers=ZH)
        assert missing.status_code == 404
        assert missing.json() == {"detail": "未找到。详情：no run 'no-such-run'"}
        assert client.get("/v1/runs/no-such-run").json() == {"detail": "no run 'no-such-run'"}
        # The OpenAI-compatible shape stays, with its machine-readable fields in English.
        facade = client.post("/v1/chat/completions", json={"model": "x"}, headers=ZH).json()
        assert facade["error"]["message"].startswith("请求无效。详情：")
        assert facade["error"]["code"] == "missing_required_parameter"
        # A schema mismatch stays FastAPI's list of issues.
        issues = client.post("/v1/runs", json={"message": 3}, headers=ZH)
        assert issues.status_code == 422 and isinstance(issues.json()["detail"], list)


def test_a_run_answers_in_the_callers_language(service: str) -> None:
    with httpx.Client(base_url=service, timeout=30) as client:
        by_header = client.post("/v1/runs", json={"message": "17 * 23?"}, headers=ZH)
        assert by_header.json()["status"] == 206
        assert by_header.json()["output"].startswith("已执行 1 步，仍未得到最终答案。")
        by_variable = client.post(
            "/v1/runs", json={"message": "17 * 23?", "variables": {"lang": "zh"}}
        )
        assert by_variable.json()["output"].startswith("已执行 1 步")
        english = client.post("/v1/runs", json={"message": "17 * 23?"})
        assert english.json()["output"].startswith("I stopped after 1 steps")


def test_the_documented_http_example_answers_as_shown(service: str) -> None:
    text = DOCS.read_text(encoding="utf-8")
    command = re.findall(r"```bash\n(.*?)```", text, re.S)[0]
    header = re.search(r"-H '([^:]+): ([^']+)'", command)
    path = re.search(r"http://127\.0\.0\.1:8000(\S+)", command)
    assert header is not None and path is not None
    shown = json.loads(re.findall(r"```json\n(.*?)```", text, re.S)[0])
    answer = httpx.get(service + path[1], headers={header[1]: header[2]}, timeout=30)
    assert answer.json() == shown


def test_a_socket_speaks_its_handshakes_language(service: str) -> None:
    from websockets.sync.client import connect

    ws_url = service.replace("http://", "ws://") + "/v1/ws"
    with connect(ws_url, additional_headers={"Accept-Language": "zh-CN"}) as socket:
        socket.send(json.dumps({"type": "approve", "approval_id": "nope", "approved": True}))
        error = json.loads(socket.recv(timeout=20))
        assert error["type"] == "error" and error["status"] == 404
        assert error["detail"].startswith("未找到。详情：")
        socket.send(json.dumps({"type": "run", "message": "17 * 23?"}))
        while True:
            frame = json.loads(socket.recv(timeout=60))
            if frame["type"] == "event" and frame["event"]["kind"] == "result":
                break
        assert frame["event"]["result"]["output"].startswith("已执行 1 步")


# -- the console ---------------------------------------------------------------------------

CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")
needs_browser = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"needs Chromium at {CHROMIUM}"
)


@needs_browser
@pytest.mark.parametrize(
    ("locale", "runs", "chat"), [("zh-CN", "运行记录", "对话"), ("en-US", "Runs", "Chat")]
)
def test_the_console_labels_follow_the_browser_language(
    service: str, locale: str, runs: str, chat: str
) -> None:
    playwright_api = pytest.importorskip("playwright.sync_api")
    expect = playwright_api.expect
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_context(locale=locale).new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{service}/console/#/runs")
            expect(page.locator("main[data-ready=runs]")).to_have_count(1, timeout=15_000)
            expect(page.locator("nav a[data-route=runs]")).to_have_text(runs)
            expect(page.locator("nav a[data-route=chat]")).to_have_text(chat)
            expect(page.locator("main h1")).to_have_text(runs)
            page.goto(f"{service}/console/#/chat")
            expect(page.locator("main[data-ready=chat] h1")).to_have_text(chat, timeout=15_000)
            if locale.startswith("zh"):
                assert page.evaluate("document.documentElement.lang") == "zh-CN"
                expect(page.locator("form.composer button[type=submit]")).to_have_text("发送")
            # One run's page and the approvals page speak the same language.
            ran = httpx.post(f"{service}/v1/runs", json={"message": "17 * 23?"}, timeout=30)
            page.goto(f"{service}/console/#/runs/{ran.json()['request_id']}")
            expect(page.locator("main[data-ready=runs] dl.facts")).to_have_count(1, timeout=15_000)
            zh = locale.startswith("zh")
            expect(page.locator("dl.facts dt").first).to_have_text("会话" if zh else "Session")
            expect(page.locator("section.output h2")).to_have_text(
                "最终输出" if zh else "Final output"
            )
            expect(page.locator("[data-action=export]")).to_have_text(
                "导出 JSONL" if zh else "Export JSONL"
            )
            page.goto(f"{service}/console/#/approvals")
            expect(page.locator("main[data-ready=approvals] p.empty")).to_have_text(
                "没有等待审批的调用。" if zh else "Nothing waits for an approval.", timeout=15_000
            )
            assert not errors, errors
        finally:
            browser.close()


def test_a_chinese_service_answers_in_chinese_unless_asked_otherwise(tmp_path: Path) -> None:
    agent = looping_agent(storage=f"sqlite:///{tmp_path / 'state.db'}", language="zh")
    app = create_app(agent=agent, settings=ServiceSettings(auth="none"))
    with serve(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/v1/runs/x").json() == {"detail": "未找到。详情：no run 'x'"}
        english = client.get("/v1/runs/x", headers={"Accept-Language": "en-GB"})
        assert english.json() == {"detail": "no run 'x'"}
        run = client.post("/v1/runs", json={"message": "17 * 23?"}).json()
        assert run["output"].startswith("已执行 1 步")
