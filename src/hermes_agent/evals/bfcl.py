"""The Berkeley Function Calling Leaderboard (BFCL) through the real Agent pipeline.

    from hermes_agent.evals.bfcl import load_cases, BfclHarness, oracle_model_for

    cases = load_cases("simple_python", limit=20)
    harness = BfclHarness(model_for=oracle_model_for)
    report = harness.run(cases)
    assert report.accuracy == 1.0

Each case becomes an ``Agent`` whose tools are the case's BFCL function docs, converted to JSON
Schema (``convert_parameters``). Single-turn cases run as a dry run — prompt, model, parser,
ToolSelector — and the calls the pipeline accepted are scored by BFCL's own ``ast_checker``
(``irrelevance``: correct when the model made no call). Multi-turn cases run turn by turn in one
session; the tools are the methods of fresh instances of BFCL's backend classes
(GorillaFileSystem, TradingBot, ...), executed by our ToolExecutor one at a time in the order the
model wrote them, and the executed calls are scored by BFCL's ``multi_turn_checker``.

Questions, possible answers and function docs come from the installed ``bfcl_eval`` package;
see ``bfcl_compat`` for how its imports are kept small.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from hermes_agent.agent import Agent
from hermes_agent.errors import HermesAgentError
from hermes_agent.evals import bfcl_compat, bfcl_languages
from hermes_agent.evals.oracle import (
    method_signatures,
    multi_turn_oracle,
    relevance_oracle,
    single_turn_oracle,
)
from hermes_agent.evals.report import CaseResult, Report, record_run
from hermes_agent.evals.resume import run_cases
from hermes_agent.models.base import ClosesConnections, Model
from hermes_agent.options import Memory, ToolExecution
from hermes_agent.pipeline.status import REFUSED
from hermes_agent.tools.registry import Tool
from hermes_agent.types import RunResult, Step, ToolCallRecord

AST_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
"""Single-turn categories scored by BFCL's ``ast_checker``."""
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
"""Single-turn categories scored on whether the model called at all: ``*irrelevance`` is
correct with no call, ``live_relevance`` with any call (BFCL has no ground truth for it)."""
MULTI_TURN_CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
"""Multi-turn categories scored by BFCL's ``multi_turn_checker``."""
CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
    *MULTI_TURN_CATEGORIES,
)
"""Every category this harness runs: all of BFCL's that run offline. Left out: the agentic
ones (``web_search`` needs the web, ``memory`` its own backends and prerequisite
conversations) and ``format_sensitivity`` (it measures BFCL's prompt formats, not ours)."""

PYTHON_HINT = bfcl_languages.HINTS[bfcl_languages.PYTHON]
"""BFCL appends this to every Python function description before prompting; so do we."""
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""The user message of a ``multi_turn_miss_func`` turn that brings the held-out functions
(BFCL's own text for function-calling models: the new tools arrive with the request)."""

_TYPES = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "float": {"type": "number"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},
    "array": {"type": "array"},
    "tuple": {"type": "array"},
    "dict": {"type": "object"},
    "object": {"type": "object"},
    "any": {},
}
_KEPT = ("description", "enum", "default", "format", "minimum", "maximum", "minItems", "maxItems")


@dataclass
class BfclCase:
    """One BFCL test entry with its possible answer.

    ``turns`` holds the messages of each user turn; ``functions`` the BFCL function docs as
    prompted (with BFCL's language hint; for Java and JavaScript every parameter a string);
    ``checker_functions`` the docs as BFCL's checker reads them (the original types);
    ``ground_truth`` the possible answers (single-turn: ``[{name: {param: [values]}}]``, empty
    for relevance categories; multi-turn: call strings per turn). ``held_out`` maps a turn
    index of a ``multi_turn_miss_func`` case to the function docs that arrive at that turn.
    """

    id: str
    category: str
    turns: list[list[dict[str, str]]]
    functions: list[dict[str, Any]]
    ground_truth: list[Any] = field(default_factory=list)
    initial_config: dict[str, Any] = field(default_factory=dict)
    involved_classes: list[str] = field(default_factory=list)
    entry: dict[str, Any] = field(default_factory=dict, repr=False)
    checker_functions: list[dict[str, Any]] = field(default_factory=list, repr=False)
    held_out: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def multi_turn(self) -> bool:
        return self.category in MULTI_TURN_CATEGORIES

    @property
    def language(self) -> str:
        """``python``, ``java`` or ``javascript``."""
        return bfcl_languages.language_of(self.category)

    @property
    def expects_call(self) -> bool | None:
        """For relevance categories, whether any call is right (``live_relevance``) or none
        (``irrelevance``, ``live_irrelevance``); ``None`` elsewhere."""
        if self.category not in RELEVANCE_CATEGORIES:
            return None
        return self.category == "live_relevance"

    @property
    def long_context(self) -> bool:
        """Whether BFCL loads this case's backends with their long-context data."""
        return "long_context" in self.category


# -- data -----------------------------------------------------------------------------------


def parse_categories(text: str) -> list[str]:
    """``"simple_python,multiple"`` → the list, checked; ``"all"`` → every category."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return list(CATEGORIES)
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown or not names:
        raise HermesAgentError(
            f"unknown BFCL category {', '.join(unknown) or '(none given)'}; "
            f"choose from: {', '.join(CATEGORIES)} (or all)"
        )
    return names


def load_cases(category: str, limit: int | None = None) -> list[BfclCase]:
    """The first ``limit`` cases of ``category`` (all when ``None``), in the file's order."""
    if category not in CATEGORIES:
        raise HermesAgentError(f"unknown BFCL category {category!r}")
    folder = bfcl_compat.data_folder()
    entries = bfcl_compat.read_jsonl(folder / f"{bfcl_compat.VERSION_PREFIX}_{category}.json")
    if limit is not None:
        entries = entries[:limit]
    answers: dict[str, Any] = {}
    answer_file = folder / "possible_answer" / f"{bfcl_compat.VERSION_PREFIX}_{category}.json"
    if answer_file.is_file():
        answers = {item["id"]: item["ground_truth"] for item in bfcl_compat.read_jsonl(answer_file)}
    language = bfcl_languages.language_of(category)
    docs_by_class: dict[str, list[dict[str, Any]]] = {}
    cases = []
    for entry in entries:
        functions = entry.get("function")
        involved = list(entry.get("involved_classes", []))
        held_out: dict[int, list[dict[str, Any]]] = {}
        if functions is None:  # multi-turn entries name their backend classes instead
            functions = []
            for class_name in involved:
                if class_name not in docs_by_class:
                    docs_by_class[class_name] = bfcl_compat.read_jsonl(
                        bfcl_compat.function_doc_file(class_name)
                    )
                functions.extend(copy.deepcopy(docs_by_class[class_name]))
            held_out = _hold_out(functions, entry.get("missed_function", {}))
        cases.append(
            BfclCase(
                id=entry["id"],
                category=category,
                turns=entry["question"],
                # As BFCL does: the hint goes on the functions of the first prompt only (the
                # held-out ones arrive as they are).
                functions=bfcl_languages.prompt_functions(functions, language),
                ground_truth=answers.get(entry["id"], []),
                initial_config=entry.get("initial_config", {}),
                involved_classes=involved,
                entry=entry,
                checker_functions=functions,
                held_out=held_out,
            )
        )
    return cases


def _hold_out(
    functions: list[dict[str, Any]], missed: Mapping[str, Sequence[str]]
) -> dict[int, list[dict[str, Any]]]:
    """Take the ``missed_function`` docs of a miss_func entry out of ``functions`` (in place),
    by the turn at which they arrive."""
    held_out: dict[int, list[dict[str, Any]]] = {}
    for turn, names in missed.items():
        for name in names:
            index = next(i for i, doc in enumerate(functions) if doc["name"] == name)
            held_out.setdefault(int(turn), []).append(functions.pop(index))
    return held_out


# -- function docs → tools --------------------------------------------------------------------


def convert_schema(bfcl: Mapping[str, Any]) -> dict[str, Any]:
    """One BFCL parameter schema → JSON Schema (``dict`` → object, ``float`` → number,
    ``tuple`` → array, ``any`` → no constraint; nested items and properties converted)."""
    kind = str(bfcl.get("type", "any"))
    schema: dict[str, Any] = dict(_TYPES.get(kind, {}))
    for key in _KEPT:
        if key in bfcl:
            schema[key] = bfcl[key]
    if isinstance(bfcl.get("items"), Mapping) and kind in ("array", "tuple"):
        schema["items"] = convert_schema(bfcl["items"])
    enum = schema.get("enum")
    scalar_enum = isinstance(enum, list) and enum and not any(isinstance(v, list) for v in enum)
    if kind in ("array", "tuple") and scalar_enum:
        # An enum of scalars on an array means "each item is one of these".
        schema["items"] = {**schema.get("items", {}), "enum": schema.pop("enum")}
    if isinstance(bfcl.get("properties"), Mapping):
        schema["properties"] = {
            name: convert_schema(value) for name, value in bfcl["properties"].items()
        }
        required = [name for name in bfcl.get("required", []) if name in schema["properties"]]
        if required:
            schema["required"] = required
    return schema


def convert_parameters(bfcl: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function's ``parameters`` → the strict top-level object schema of a ``Tool``:
    listed properties only (``additionalProperties: false``); nested objects stay open, as
    BFCL's checker treats them."""
    schema = convert_schema({**bfcl, "type": "dict"})
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def _plan_only(**arguments: Any) -> None:
    """Single-turn BFCL tools are never executed (the run is a dry run)."""
    return None


def to_tool(function: Mapping[str, Any], implementation: Callable[..., Any] = _plan_only) -> Tool:
    """A BFCL function doc → a ``Tool`` (dotted names such as ``math.factorial`` kept)."""
    return Tool(
        name=function["name"],
        description=function.get("description", ""),
        parameters=convert_parameters(function.get("parameters", {})),
        function=implementation,
    )


def _calling(method: Callable[..., Any]) -> Callable[..., Any]:
    def call(**arguments: Any) -> Any:
        # A copy: backends keep what they are given (a tweet keeps its ``mentions`` list and a
        # later call appends to it), which would rewrite the recorded arguments of this call.
        return method(**copy.deepcopy(arguments))

    return call


# -- models -----------------------------------------------------------------------------------

ModelFactory = Callable[[BfclCase], Model]


def _schemas(case: BfclCase) -> dict[str, Any]:
    return {f["name"]: convert_parameters(f.get("parameters", {})) for f in case.functions}


def oracle_model_for(case: BfclCase) -> Model:
    """The oracle for ``case`` (see ``hermes_agent.evals.oracle``)."""
    if case.multi_turn:
        instances = [bfcl_compat.backend_class(name)() for name in case.involved_classes]
        return multi_turn_oracle(case.ground_truth, method_signatures(instances))
    if case.expects_call is False:
        return single_turn_oracle([], {})
    if case.expects_call:
        first = case.functions[0]["name"]
        return relevance_oracle(first, _schemas(case)[first])
    return single_turn_oracle(case.ground_truth, _schemas(case), _source_encoder(case))


def _source_encoder(case: BfclCase) -> Callable[[str, str, Any], Any] | None:
    """For Java and JavaScript: each value as the source text BFCL's converter reads back."""
    if case.language == bfcl_languages.PYTHON:
        return None
    convert = bfcl_compat.type_converter(case.language)
    parameters = {
        doc["name"]: doc.get("parameters", {}).get("properties", {})
        for doc in case.checker_functions
    }

    def encode(function: str, parameter: str, value: Any) -> Any:
        spec = parameters.get(function, {}).get(parameter, {})
        return bfcl_languages.source_value(value, spec, case.language, convert)

    return encode


def shared_model(model: Model) -> ModelFactory:
    """The same model for every case (a real model: the embedded one, an endpoint)."""
    return lambda case: model


# -- the harness ------------------------------------------------------------------------------


class BfclHarness:
    """Runs BFCL cases through the Agent pipeline and scores them with BFCL's checkers.

    ``model_for`` gives the model for a case (``oracle_model_for`` or ``shared_model(m)``).
    ``max_iterations`` bounds the model turns per user turn of a multi-turn case.
    Each harness has its own ``run_key``, the model name under which BFCL's multi-turn checker
    caches its backend instances, so two runs never share state.
    """

    def __init__(
        self,
        model_for: ModelFactory,
        *,
        tool_choice: str = "auto",
        max_iterations: int = 10,
        system_prompt: str | None = None,
    ) -> None:
        self.model_for = model_for
        self.tool_choice = tool_choice
        self.max_iterations = max_iterations
        self.system_prompt = system_prompt
        self.run_key = f"hermes_eval_{uuid.uuid4().hex[:12]}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._models: dict[int, ClosesConnections] = {}

    def run(
        self,
        cases: Sequence[BfclCase],
        *,
        console: Console | None = None,
        title: str = "BFCL",
        settings: Mapping[str, Any] | None = None,
        workers: int = 1,
        done: Mapping[str, CaseResult] | None = None,
        on_result: Callable[[CaseResult], None] | None = None,
    ) -> Report:
        """Run and score ``cases``; with a ``console``, show a progress bar on it.

        ``workers`` cases run at once, as concurrent runs on one event loop (each with its own
        agent and backends; the model must allow it: an endpoint does, the embedded model
        does not). Cases whose id is in ``done`` are not run again, their results are kept;
        ``on_result`` sees each new result as it finishes (``resume.ReportWriter.add`` writes it
        down). The models' connections are closed at the end.
        """
        try:
            results = run_cases(
                cases,
                self.arun_case,
                self._event_loop(),
                workers=workers,
                done=done,
                on_result=on_result,
                console=console,
                description="BFCL",
            )
        finally:
            self.close()
        return Report(title=title, results=results, settings=dict(settings or {}))

    def run_case(self, case: BfclCase) -> CaseResult:
        """Run one case (sync; ``arun_case`` is the same in async code)."""
        return self._event_loop().run_until_complete(self.arun_case(case))

    async def arun_case(self, case: BfclCase) -> CaseResult:
        """Run one case; a failure of any kind becomes an incorrect result, never a crash."""
        started = time.perf_counter()
        try:
            if case.multi_turn:
                result = await self._multi_turn(case)
            else:
                result = await self._single_turn(case)
        except Exception as exc:  # one broken case must not end a 4,000-case run
            result = CaseResult(
                case.id, case.category, False, error=f"harness error: {type(exc).__name__}: {exc}"
            )
        result.duration_s = round(time.perf_counter() - started, 4)
        return result

    def close(self) -> None:
        """Close the connections the models opened on this harness's event loop, and the loop
        (a later run opens a new one)."""
        loop, self._loop = self._loop, None
        models, self._models = list(self._models.values()), {}
        if loop is None:
            return
        for model in models:
            loop.run_until_complete(model.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop

    def _model(self, case: BfclCase) -> Model:
        model = self.model_for(case)
        if isinstance(model, ClosesConnections):  # an endpoint model: its connections are closed
            self._models.setdefault(id(model), model)
        return model

    # -- single turn --------------------------------------------------------------------------

    def _agent(self, case: BfclCase, tools: Sequence[Tool], system: str | None) -> Agent:
        prompts = [p for p in (self.system_prompt, system) if p]
        return Agent(
            model=self._model(case),
            tools=tools,
            system_prompt="\n\n".join(prompts) or None,
            tool_choice=self.tool_choice,
            max_iterations=self.max_iterations,
            # Stateful backends: run calls in the order they were written.
            tool_execution=ToolExecution(max_concurrency=1),
            memory=Memory(history_window=1000),  # a BFCL conversation is kept whole, as BFCL does
        )

    async def _single_turn(self, case: BfclCase) -> CaseResult:
        system, question = _split_turn(case.turns[0])
        agent = self._agent(case, [to_tool(f) for f in case.functions], system)
        try:
            run = await agent.arun(question, dry_run=True)
        finally:
            agent.close()
        result = _observe(case, [run])
        accepted = [c for c in run.tool_calls if c.status_code == 200]
        if case.expects_call is not None:
            # As BFCL: a call is any call the parser could read, accepted or refused.
            result.correct = bool(result.parsed_calls) == case.expects_call
            result.verdict = {"valid": result.correct}
            if not result.correct:
                result.error = (
                    "no function call where one was expected"
                    if case.expects_call
                    else "the model called a function where none fits"
                )
            return result
        output = [{call.name: call.arguments} for call in accepted]
        verdict = bfcl_compat.ast_checker()(
            case.checker_functions,  # the original types: Java/JS strings are read back by them
            output,
            case.ground_truth,
            bfcl_compat.checker_language(case.language),
            case.category,
            self.run_key,
        )
        result.verdict = _plain_verdict(verdict)
        result.correct = bool(verdict.get("valid"))
        if not result.correct:
            result.error = _first_error(result, verdict)
        return result

    # -- multi turn ---------------------------------------------------------------------------

    async def _multi_turn(self, case: BfclCase) -> CaseResult:
        instances = {name: bfcl_compat.backend_class(name)() for name in case.involved_classes}
        for name, instance in instances.items():
            if not bfcl_compat.is_stateless(name):
                scenario = copy.deepcopy(case.initial_config.get(name, {}))
                instance._load_scenario(scenario, long_context=case.long_context)
        methods = {
            name: getattr(instance, name)
            for instance in instances.values()
            for name in dir(instance)
            if not name.startswith("_") and callable(getattr(instance, name))
        }

        def tools(docs: Sequence[Mapping[str, Any]]) -> list[Tool]:
            return [to_tool(f, _calling(methods[f["name"]])) for f in docs if f["name"] in methods]

        agent = self._agent(case, tools(case.functions), None)
        session = f"{self.run_key}_{case.id}"
        runs: list[RunResult] = []
        try:
            for index, turn in enumerate(case.turns):
                if index in case.held_out:
                    # miss_func: the missing functions arrive, with BFCL's message and no other.
                    for tool in tools(case.held_out[index]):
                        agent.add_tool(tool)
                    question = ADDED_FUNCTIONS_PROMPT
                else:
                    _, question = _split_turn(turn)
                runs.append(await agent.arun(question, session_id=session))
        finally:
            agent.close()
        result = _observe(case, runs)
        decoded = [[calls for step in run.steps if (calls := _executed(step))] for run in runs]
        try:
            verdict = bfcl_compat.multi_turn_checker()(
                decoded, case.ground_truth, case.entry, case.category, self.run_key
            )
        finally:
            bfcl_compat.forget_checker_instances(self.run_key, case.id)
        result.verdict = _plain_verdict(verdict)
        result.correct = bool(verdict.get("valid"))
        if not result.correct:
            result.error = str(verdict.get("error_message") or verdict.get("error_type"))
            if result.refused:
                refused = result.refused[0]
                result.error += f" (refused {refused['name']}: {refused['error']})"
            result.error = result.error[:300]
        return result


def _executed(step: Step) -> list[str]:
    """The calls of one model turn that the pipeline ran, as BFCL call strings."""
    return [_call_string(call) for call in step.tool_calls if call.status_code not in REFUSED]


def _split_turn(turn: Sequence[Mapping[str, str]]) -> tuple[str | None, str]:
    """A BFCL turn → (system text or None, the user message)."""
    system = "\n\n".join(m["content"] for m in turn if m["role"] == "system") or None
    user = "\n\n".join(m["content"] for m in turn if m["role"] != "system")
    return system, user


def _call_string(call: ToolCallRecord) -> str:
    """A call as the Python source BFCL's multi-turn checker executes."""
    arguments = ", ".join(f"{name}={value!r}" for name, value in call.arguments.items())
    return f"{call.name}({arguments})"


def _observe(case: BfclCase, runs: Sequence[RunResult]) -> CaseResult:
    """What the model wrote and what the pipeline made of it."""
    result = CaseResult(case.id, case.category, False)
    for run in runs:
        record_run(result, run)
    return result


def _plain_verdict(verdict: Mapping[str, Any]) -> dict[str, Any]:
    """The checker's verdict, JSON-safe (multi-turn details hold backend state)."""
    keep = ("valid", "error", "error_type", "error_message")
    return {key: _json_safe(verdict[key]) for key in keep if key in verdict}


def _json_safe(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return repr(value)


def _first_error(result: CaseResult, verdict: Mapping[str, Any]) -> str:
    if not result.calls:
        if result.malformed:
            return "malformed <tool_call> output"
        if result.refused:
            return f"refused: {result.refused[0]['error']}"[:300]
        return "no function call"
    errors = verdict.get("error") or [verdict.get("error_type", "incorrect")]
    first = str(errors[0] if isinstance(errors, list) and errors else errors)
    if result.refused:  # the checker missed a call the pipeline refused: say why it was
        first += f" (refused {result.refused[0]['name']}: {result.refused[0]['error']})"
    return first[:300]
