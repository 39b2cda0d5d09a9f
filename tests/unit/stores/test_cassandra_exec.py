"""`execute_all` (app/stores/cassandra_exec.py) over a scripted driver session: bounded
concurrency, and a failed call that is over when it says so.

Why the second matters: the mirror retries a failed round later with newer values, and
Cassandra keeps the write with the newest client timestamp, which the driver stamps when a
statement is sent. A statement of the failed round sent after the retry (the driver's
`execute_concurrent` goes on sending the rest of its list after it raised, each time an
earlier statement succeeds) would land an older value over the newer one for good."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from app.stores.cassandra_exec import StoreError, execute_all

BUDGET_S = 20.0


class FakeFuture:
    """The parts of the driver's ResponseFuture that executors use."""

    _col_names = None
    _col_types = None
    has_more_pages = False

    def __init__(self, statement: str) -> None:
        self.statement = statement
        self._callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._errbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._outcome: tuple[bool, Any] | None = None

    def add_callbacks(
        self,
        callback: Callable[..., Any],
        errback: Callable[..., Any],
        callback_args: tuple[Any, ...] = (),
        callback_kwargs: dict[str, Any] | None = None,
        errback_args: tuple[Any, ...] = (),
        errback_kwargs: dict[str, Any] | None = None,
    ) -> None:
        with self._lock:
            outcome = self._outcome
            if outcome is None:
                self._callbacks.append((callback, callback_args))
                self._errbacks.append((errback, errback_args))
                return
        self._call(outcome, [(callback, callback_args)], [(errback, errback_args)])

    def clear_callbacks(self) -> None:
        with self._lock:
            self._callbacks, self._errbacks = [], []

    def succeed(self) -> None:
        self._finish((True, [f"row of {self.statement}"]))

    def fail(self, exc: Exception) -> None:
        self._finish((False, exc))

    def _finish(self, outcome: tuple[bool, Any]) -> None:
        with self._lock:
            self._outcome = outcome
            callbacks, errbacks = self._callbacks, self._errbacks
            self._callbacks, self._errbacks = [], []
        self._call(outcome, callbacks, errbacks)

    @staticmethod
    def _call(
        outcome: tuple[bool, Any],
        callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]],
        errbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]],
    ) -> None:
        ok, value = outcome
        for fn, args in callbacks if ok else errbacks:
            fn(value, *args)

    @property
    def done(self) -> bool:
        return self._outcome is not None

    def result(self) -> Any:
        assert self._outcome is not None
        ok, value = self._outcome
        if not ok:
            raise value
        return value


class ScriptedSession:
    """Every statement sent waits until the test finishes it (from the test's thread, as the
    driver's I/O thread would)."""

    def __init__(self) -> None:
        self.sent: list[FakeFuture] = []
        self.changed = threading.Condition()

    def execute_async(self, statement: str, parameters: Any = None, **_: Any) -> FakeFuture:
        future = FakeFuture(statement)
        with self.changed:
            self.sent.append(future)
            self.changed.notify_all()
        return future

    def wait_sent(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.sent) >= count, BUDGET_S), len(self.sent)


class Call:
    """execute_all in a thread of its own (it blocks, as in the mirror's worker thread)."""

    def __init__(
        self, session: ScriptedSession, statements: list[tuple[str, tuple[Any, ...]]], concurrency: int
    ) -> None:
        self.done = threading.Event()
        self.result: list[Any] | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = execute_all(session, statements, what="test", concurrency=concurrency)
            except BaseException as exc:  # reported to the test
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def statements(count: int) -> list[tuple[str, tuple[Any, ...]]]:
    return [(f"s{i}", ()) for i in range(count)]


def test_at_most_concurrency_statements_in_flight_and_results_in_order() -> None:
    session = ScriptedSession()
    call = Call(session, statements(7), concurrency=3)
    finished = 0
    while finished < 7:
        session.wait_sent(min(finished + 3, 7))
        with session.changed:
            in_flight = [f for f in session.sent if not f.done]
        assert len(in_flight) <= 3
        in_flight[-1].succeed()  # out of order: the results still come back in input order
        finished += 1
    assert call.done.wait(BUDGET_S)
    assert call.error is None
    assert call.result == [[f"row of s{i}"] for i in range(7)]


def test_a_failed_call_sends_nothing_more_and_returns_only_once_nothing_it_sent_is_in_flight() -> None:
    session = ScriptedSession()
    call = Call(session, statements(10), concurrency=2)
    session.wait_sent(2)
    first, second = session.sent
    first.fail(RuntimeError("connection reset"))
    # Not over while `second` may still land: the caller would retry the lot meanwhile.
    assert not call.done.wait(0.3)
    second.succeed()  # with the driver's execute_concurrent, this sent s2 after the raise
    assert call.done.wait(BUDGET_S)
    assert isinstance(call.error, StoreError) and "connection reset" in str(call.error)
    with session.changed:
        assert [f.statement for f in session.sent] == ["s0", "s1"]
    # The call is over: nothing of it is sent any more, whatever completes later.
    call.thread.join(BUDGET_S)
    with session.changed:
        assert len(session.sent) == 2


def test_a_statement_the_session_refuses_at_once_fails_the_call() -> None:
    class Refusing(ScriptedSession):
        def execute_async(self, statement: str, parameters: Any = None, **_: Any) -> FakeFuture:
            if statement == "s1":
                raise RuntimeError("session is shut down")
            return super().execute_async(statement, parameters)

    session = Refusing()
    call = Call(session, statements(5), concurrency=4)
    session.wait_sent(1)
    session.sent[0].succeed()
    assert call.done.wait(BUDGET_S)
    assert isinstance(call.error, StoreError) and "shut down" in str(call.error)
    assert [f.statement for f in session.sent] == ["s0"]


def test_nothing_to_execute_sends_nothing() -> None:
    session = ScriptedSession()
    assert execute_all(session, [], what="test") == []
    assert session.sent == []


@pytest.mark.parametrize("concurrency", [0, -1])
def test_concurrency_must_be_positive(concurrency: int) -> None:
    with pytest.raises(ValueError):
        execute_all(ScriptedSession(), statements(1), what="test", concurrency=concurrency)
