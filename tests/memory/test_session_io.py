"""A session store that waits (a lock, a slow disk, the network) stalls only its own run: the
agent loads and appends sessions in a thread, off the event loop every run and request shares
(``memory.session.off_the_loop``), except for stores that answer at once (in memory)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from hermes_agent import Agent, Message, ScriptedModel
from hermes_agent.memory.session import InMemorySessionStore, off_the_loop
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.storage.in_memory import InMemoryStorage
from server_harness import only_run_id, post_in_background, serve


class GatedStore(InMemorySessionStore):
    """Sessions in memory whose ``load``/``append`` of ``stuck`` wait for ``gate`` (a store
    waiting on its database); it does not claim to answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.waiting = threading.Event()
        self.threads: list[int] = []
        self.stuck = "stuck"
        self.stuck_on = "load"

    def answers_at_once(self, session_id: str, *, append: bool) -> bool:
        return False

    def _wait(self, session_id: str, what: str) -> None:
        self.threads.append(threading.get_ident())
        if self.stuck in session_id and what == self.stuck_on:  # the service prefixes ids
            self.waiting.set()
            assert self.gate.wait(10)

    def load(self, session_id: str) -> list[Message]:
        self._wait(session_id, "load")
        return super().load(session_id)

    def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self._wait(session_id, "append")
        super().append(session_id, messages)


class LoopThreadStore(InMemorySessionStore):
    """An in-memory store that notes the thread of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def load(self, session_id: str) -> list[Message]:
        self.threads.append(threading.get_ident())
        return super().load(session_id)


class GatedStorage(InMemoryStorage):
    """A store (sessions, trail) whose sessions are a ``GatedStore``."""

    def __init__(self, sessions: GatedStore) -> None:
        super().__init__()
        self.gated = sessions

    @property
    def sessions(self) -> GatedStore:  # type: ignore[override]
        return self.gated


def test_a_store_that_waits_stalls_only_its_own_run() -> None:
    store = GatedStore()
    agent = Agent(model=ScriptedModel(["one", "two"]), session_store=store)

    async def main() -> tuple[str, bool]:
        stuck = asyncio.create_task(agent.arun("hello", session_id="stuck"))
        await asyncio.to_thread(store.waiting.wait, 10)
        # The loop is free while the stuck run's load waits: another run goes through.
        free = await asyncio.wait_for(agent.arun("hi", session_id="free"), 5)
        finished_first = not stuck.done()
        store.gate.set()
        await stuck
        return free.output, finished_first

    loop_thread = threading.get_ident()
    output, finished_first = asyncio.run(main())
    assert finished_first and output in ("one", "two")
    assert loop_thread not in store.threads  # every load and append ran in a thread
    assert [m.role for m in store.load("stuck")] == ["user", "assistant"]


def test_a_store_that_answers_at_once_is_called_on_the_loop() -> None:
    store = LoopThreadStore()
    agent = Agent(model=ScriptedModel(["one"]), session_store=store)

    async def main() -> int:
        await agent.arun("hello", session_id="s")
        return threading.get_ident()

    assert store.threads == [asyncio.run(main())]


def test_a_cancel_during_an_append_waits_for_it_and_the_run_ends_as_it_finished() -> None:
    """The cancel waits for the append in flight; the append went through, so the cancel came
    too late: the run has its answer and its turn is in the session whole (a run that ends
    cancelled after saving its turn would have two endings in its trail)."""
    store = GatedStore()
    store.stuck_on = "append"
    agent = Agent(model=ScriptedModel(["answer"]), session_store=store)

    async def main() -> tuple[bool, str]:
        run = asyncio.create_task(agent.arun("hello", session_id="stuck"))
        await asyncio.to_thread(store.waiting.wait, 10)
        run.cancel()
        # A spell in which the cancel, waiting for the append, must not end the run.
        await asyncio.sleep(0.2)
        waited = not run.done()  # the cancel waits for the append in flight
        store.gate.set()
        result = await run
        return waited, result.output

    assert asyncio.run(main()) == (True, "answer")
    assert [m.content for m in store.load("stuck")] == ["hello", "answer"]


def test_a_timeout_during_an_append_raises_nothing_and_leaves_the_task_usable() -> None:
    """An ``asyncio.timeout`` that expires during an append takes its cancel back: no
    ``TimeoutError`` for a run that finished, and a later timeout in the same task still works."""
    store = GatedStore()
    store.stuck_on = "append"
    agent = Agent(model=ScriptedModel(["answer"]), session_store=store)
    threading.Timer(0.3, store.gate.set).start()

    async def main() -> tuple[str, int, bool]:
        async with asyncio.timeout(0.1):
            result = await agent.arun("hello", session_id="stuck")
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        try:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(5)  # a wait the timeout must cut short
        except TimeoutError:
            return result.output, cancelling, True
        return result.output, cancelling, False

    assert asyncio.run(main()) == ("answer", 0, True)
    assert [m.content for m in store.load("stuck")] == ["hello", "answer"]


def test_the_service_answers_while_a_runs_session_store_waits() -> None:
    store = GatedStore()
    agent = Agent(model=ScriptedModel(["done"] * 2), storage=GatedStorage(store))
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        client = httpx.Client(base_url=url, timeout=30)
        poster, answers = post_in_background(client, {"message": "hello", "session_id": "stuck"})
        assert store.waiting.wait(10)  # its session load waits on the store
        began = time.monotonic()
        other = client.post("/v1/runs", json={"message": "hi", "session_id": "other"})
        assert other.status_code == 200 and other.json()["output"] == "done"
        assert client.get("/healthz").status_code == 200
        assert time.monotonic() - began < 5  # not held up by the stuck run
        assert poster.is_alive()
        store.gate.set()
        poster.join(10)
        assert answers[0].status_code == 200, answers[0].text
        assert answers[0].json()["output"] == "done"


def test_a_clients_cancel_during_the_services_append_leaves_one_ending() -> None:
    """Over HTTP: a cancel that lands while the run's turn is being appended waits for it; the
    run ends completed (its answer given, its turn saved), the cancel answers that it did not
    cancel, and the trail ends once, with the output (no ``stopped`` record after it)."""
    store = GatedStore()
    store.stuck_on = "append"
    storage = GatedStorage(store)
    agent = Agent(model=ScriptedModel(["done"]), storage=storage)
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        client = httpx.Client(base_url=url, timeout=30)
        poster, answers = post_in_background(client, {"message": "hello", "session_id": "stuck"})
        assert store.waiting.wait(10)  # the run's turn is being appended
        request_id = only_run_id(client)
        threading.Timer(0.3, store.gate.set).start()
        cancel = client.post(f"/v1/runs/{request_id}/cancel")
        poster.join(10)
    assert cancel.status_code == 200, cancel.text
    assert cancel.json() == {"request_id": request_id, "cancelled": False, "status": "completed"}
    assert answers[0].status_code == 200 and answers[0].json()["output"] == "done"
    roles = [record.role for record in storage.records(request_id)]
    assert roles.count("output") == 1 and "stopped" not in roles and roles[-1] == "output"
    assert [m.content for m in store.load("local:stuck")] == ["hello", "done"]


def test_sqlite_sessions_are_read_and_appended_on_the_loop(tmp_path: Path) -> None:
    """A SQLite file answers at once (a WAL read takes no lock; an append waits at most for
    the trail's short transactions): both calls are made on the loop, where a thread hop
    would cost more than the call."""
    agent = Agent(model=ScriptedModel(["one"]), storage=f"sqlite:///{tmp_path / 's.db'}")
    sessions = agent.sessions
    calls: list[tuple[str, int]] = []
    load, append = sessions.load, sessions.append

    def noting_load(session_id: str) -> list[Message]:
        calls.append(("load", threading.get_ident()))
        return load(session_id)

    def noting_append(session_id: str, messages: Sequence[Message]) -> None:
        calls.append(("append", threading.get_ident()))
        append(session_id, messages)

    sessions.load, sessions.append = noting_load, noting_append  # type: ignore[method-assign]

    async def main() -> int:
        await agent.arun("hello", session_id="s")
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(main())
        assert [what for what, _ in calls] == ["load", "append"]
        assert [thread for _, thread in calls] == [loop_thread, loop_thread]
        assert [m.content for m in load("s")] == ["hello", "one"]
    finally:
        agent.close()


def test_a_cancel_during_a_load_lands_at_once() -> None:
    """A load nobody needs any more is dropped: a run stuck on its store's read still stops."""
    store = GatedStore()
    agent = Agent(model=ScriptedModel(["answer"]), session_store=store)

    async def main() -> float:
        run = asyncio.create_task(agent.arun("hello", session_id="stuck"))
        await asyncio.to_thread(store.waiting.wait, 10)
        began = time.monotonic()
        run.cancel()
        try:
            await run
        except asyncio.CancelledError:
            return time.monotonic() - began
        finally:
            store.gate.set()
        raise AssertionError("the run was cancelled: it must say so")

    assert asyncio.run(main()) < 2


def test_a_cancel_during_an_append_that_fails_is_a_cancel_chained_to_the_failure() -> None:
    """The append is waited for; when it failed, the cancel says why in its cause (and the
    failure is not left unretrieved)."""
    store = GatedStore()
    store.stuck_on = "append"

    def failing_append() -> None:
        store.append("stuck", [Message("user", "hello")])
        raise OSError("disk full")

    async def main() -> BaseException | None:
        call = asyncio.create_task(off_the_loop(store, "stuck", failing_append, append=True))
        await asyncio.to_thread(store.waiting.wait, 10)
        call.cancel()
        await asyncio.sleep(0.1)  # a spell in which the cancel must not end the call
        assert not call.done()  # the cancel waits for the append
        store.gate.set()
        try:
            await call
        except asyncio.CancelledError as exc:
            return exc.__cause__
        raise AssertionError("the call was cancelled: it must say so")

    cause = asyncio.run(main())
    assert isinstance(cause, OSError) and str(cause) == "disk full"


class Delegating:
    """A wrapper that forwards everything to the store it wraps (``__getattr__``)."""

    def __init__(self, inner: InMemorySessionStore) -> None:
        self.inner = inner
        self.threads: list[int] = []

    def load(self, session_id: str) -> list[Message]:
        self.threads.append(threading.get_ident())
        return self.inner.load(session_id)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_wrapper_does_not_answer_at_once_for_the_store_it_wraps() -> None:
    """Only a store whose class declares ``answers_at_once`` is called on the loop: a wrapper
    delegating through ``__getattr__`` may wait (it is a wrapper for a reason)."""
    wrapper = Delegating(InMemorySessionStore())
    agent = Agent(model=ScriptedModel(["one"]), session_store=wrapper)  # type: ignore[arg-type]

    async def main() -> int:
        await agent.arun("hello", session_id="s")
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert wrapper.threads and wrapper.threads[0] != loop_thread


class CountingStore(InMemorySessionStore):
    """Sessions in memory that count their reads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []

    def load(self, session_id: str) -> list[Message]:
        self.loads.append(session_id)
        return super().load(session_id)


def history_seen(messages: Sequence[Message], _tools: object) -> str:
    """Answers with how many user messages the prompt carries (its history included)."""
    return f"users seen: {sum(1 for m in messages if m.role == 'user')}"


def test_a_run_that_starts_its_own_session_reads_no_history() -> None:
    """A run with no session id starts a session of its own: nothing is read for it (it holds
    nothing), its turn is saved under it, and the next run of that session reads it."""
    store = CountingStore()
    agent = Agent(model=ScriptedModel(history_seen), session_store=store)
    first = agent.run("hello")
    assert store.loads == [] and first.output == "users seen: 1"
    assert [m.content for m in store.load(first.session_id)] == ["hello", "users seen: 1"]
    store.loads.clear()
    second = agent.run("again", session_id=first.session_id)
    assert store.loads == [first.session_id] and second.output == "users seen: 2"


def test_new_session_reads_nothing_for_a_session_id_the_caller_made_up() -> None:
    store = CountingStore()
    agent = Agent(model=ScriptedModel(history_seen), session_store=store)
    made_up = agent.run("hello", session_id="mine")  # a named session is read...
    assert store.loads == ["mine"] and made_up.output == "users seen: 1"
    store.loads.clear()

    async def fresh() -> str:  # ...one the caller says it made up for this run is not
        result = await agent.arun("hi", session_id="made-up-now", new_session=True)
        return result.output

    assert asyncio.run(fresh()) == "users seen: 1" and store.loads == []
    assert [m.content for m in store.load("made-up-now")] == ["hi", "users seen: 1"]


def test_the_service_reads_no_history_for_a_session_it_made_up(tmp_path: Path) -> None:
    """Over HTTP on SQLite: a run that names no session gets one the service makes up, and no
    statement reads its messages; a run that names that session reads them, and the model
    sees the first turn."""
    from sqlalchemy import event

    agent = Agent(model=ScriptedModel(history_seen), storage=f"sqlite:///{tmp_path / 's.db'}")
    assert agent.storage is not None
    reads: list[str] = []

    def note(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM messages" in statement:
            reads.append(statement)

    engine = agent.storage.engine  # type: ignore[attr-defined]
    event.listen(engine, "before_cursor_execute", note)
    try:
        with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
            client = httpx.Client(base_url=url, timeout=30)
            first = client.post("/v1/runs", json={"message": "hello"})
            assert first.status_code == 200, first.text
            assert first.json()["output"] == "users seen: 1" and reads == []
            session_id = first.json()["session_id"]
            second = client.post("/v1/runs", json={"message": "again", "session_id": session_id})
            assert second.status_code == 200, second.text
            assert second.json()["output"] == "users seen: 2" and len(reads) == 1
    finally:
        event.remove(engine, "before_cursor_execute", note)
        agent.close()


def accepted_threads(agent: Agent, url: str) -> list[str]:
    """Post a run to the service at ``url``; the names of the threads that wrote its first
    (``accepted``) record."""
    from hermes_agent.runs.trail import direct_sink

    assert agent.storage is not None
    sink = direct_sink(agent.storage)
    write, names = sink.write, []

    def noting(records: Sequence[Any]) -> None:
        if any(record.role == "accepted" for record in records):
            names.append(threading.current_thread().name)
        write(records)

    sink.write = noting  # type: ignore[method-assign]
    answer = httpx.post(f"{url}/v1/runs", json={"message": "hello"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return names


def test_the_first_record_is_written_on_the_loop_where_the_store_answers_at_once(
    tmp_path: Path,
) -> None:
    """A SQLite file answers at once: the run's first record is written on the service's loop
    (no thread hop), as its turn is appended; a store that may wait gets it from a thread."""
    agent = Agent(model=ScriptedModel(["done"] * 2), storage=f"sqlite:///{tmp_path / 's.db'}")
    try:
        with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
            names = accepted_threads(agent, url)
        assert len(names) == 1 and not names[0].startswith("asyncio_"), names
    finally:
        agent.close()
    waiting = Agent(model=ScriptedModel(["done"] * 2), storage=GatedStorage(GatedStore()))
    with serve(create_app(agent=waiting, settings=ServiceSettings(auth="none"))) as url:
        names = accepted_threads(waiting, url)
    assert len(names) == 1 and names[0].startswith("asyncio_"), names
