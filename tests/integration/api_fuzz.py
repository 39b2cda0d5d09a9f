"""The query API under a schema-driven fuzzer (issue 18): schemathesis generates requests for
every operation of a real `projector api`'s /openapi.json (valid and invalid ones, and stateful
sequences along the description's links), sent with the real tokens of two users over the real
servers.

Checked on every response: no 5xx; it conforms to the description (status, content type,
headers, body schema: schemathesis's checks); and no cross-user read: a response to user X never
holds a conversation of the other user that X does not have, X's session rows and stream name X
only, X's badge is X's own, and the member directory answers X only about groups X is an active
member of.

Used by the integration suite at a CI size and by `make chaos-api` (behind the chaos marker) at
full size.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.core.failures import FailureGroup
from schemathesis.generation.stateful.state_machine import APIStateMachine
from schemathesis.specs.openapi.checks import ignored_auth, positive_data_acceptance

from app.api.tokens import TokenSigner
from tests.integration.stack import PROJECTOR, ROOT, Stack, free_port, read_jsonl

SECRET = "fuzz-secret-" + "k" * 32
STREAM_OPERATION = "stream"


@dataclass
class User:
    user_id: int
    token: str
    conversations: set[str]  # every conversation the user has (rows of the projection)
    active_groups: set[str]  # where the user is an active member
    badge: dict[str, int]


@dataclass
class FuzzReport:
    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    stateful_steps: int = 0

    def line(self) -> str:
        statuses = dict(sorted(self.by_status.items()))
        return (
            f"{self.requests} requests ({self.stateful_steps} in stateful sequences) over "
            f"{len(self.by_operation)} operations; statuses {statuses}; {len(self.failures)} failures"
        )


class ApiProcess:
    def __init__(self, stack: Stack, tmp: Path, **env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "api.log"
        full_env = {
            **stack.env,
            "PROJECTOR_API_SECRET": SECRET,
            "PROJECTOR_API_PORT": str(self.port),
            "PROJECTOR_API_RATE_LIMIT_PER_S": "0",  # the fuzzer's volume is not what is tested here
            **env,
        }
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*PROJECTOR, "api"], cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )

    def alive(self) -> None:
        if self.proc.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-60:])
            raise AssertionError(f"projector api exited {self.proc.returncode}:\n{tail}")

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.alive()
            try:
                if requests.get(f"{self.base}/readyz", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"projector api not ready after {timeout}s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def project_two_users(stack: Stack, tmp: Path, seed: int = 5) -> tuple[User, User]:
    """A simulated stream projected by a real worker; two users that share some conversations
    and each have some of their own."""
    stream = tmp / "stream.jsonl"
    stack.run(
        "simulate",
        *("--users", "30", "--conversations", "12", "--group-size", "12", "--messages", "300"),
        *("--rate", "0", "--seed", str(seed), "--lanes", str(stack.settings.processing.lanes)),
        *("--out", str(stream), "--progress", "never"),
    )
    out = tmp / "replay"
    lanes = str(stack.settings.processing.lanes)
    stack.run("replay", "--input", str(stream), "--out", str(out), "--lanes", lanes, "--progress", "never")
    rows = read_jsonl(out / "projections.jsonl")
    badges = {b["user_id"]: b for b in read_jsonl(out / "badges.jsonl")}
    stack.start_worker()
    versions = {u: b["projection_mailbox_seq"] for u, b in badges.items()}
    await stack.wait_for_versions(versions, timeout=300, alive=stack.alive())

    convs: dict[int, set[str]] = {}
    active: dict[int, set[str]] = {}
    for row in rows:
        convs.setdefault(row["user_id"], set()).add(row["conversation_id"])
        if row["membership"] == "active":
            active.setdefault(row["user_id"], set()).add(row["conversation_id"])
    # The pair with the most conversations of their own on both sides, sharing at least one.
    best = max(
        ((a, b) for a in convs for b in convs if a < b and convs[a] & convs[b]),
        key=lambda p: min(len(convs[p[0]] - convs[p[1]]), len(convs[p[1]] - convs[p[0]])),
    )
    signer = TokenSigner(SECRET)
    expires = int(time.time()) + 3600

    def user(user_id: int) -> User:
        badge = {k: badges[user_id][k] for k in ("total_unread", "total_mention", "muted_unread")}
        return User(user_id, signer.mint(user_id, expires), convs[user_id], active.get(user_id, set()), badge)

    a, b = user(best[0]), user(best[1])
    assert a.conversations - b.conversations and b.conversations - a.conversations
    return a, b


# --------------------------------------------------------------------------- checks


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


_CHECKED = frozenset(
    {
        "listSessions",
        "getBadge",
        STREAM_OPERATION,
        "createStreamTicket",
        "membersPage",
        "membersByUserIds",
        "messageReaders",
    }
)


def cross_user_problems(
    operation: str, caller: User, other: User, status: int, body: Any, group: str | None
) -> list[str]:
    """What this 2xx response shows the caller that belongs to the other user only."""
    if not 200 <= status < 300:
        return []
    problems = []
    foreign = other.conversations - caller.conversations
    leaked = foreign & set(_strings(body))
    if leaked:
        problems.append(f"{operation}: user {caller.user_id} was shown {sorted(leaked)[:3]} of the other")
    if operation not in _CHECKED:
        return problems
    if not isinstance(body, dict):
        return [*problems, f"{operation}: a {status} without a JSON object: {body!r:.200}"]
    if operation == "listSessions":
        for item in body.get("items", []):
            mine = item.get("user_id") == str(caller.user_id)
            if not mine or item["conversation_id"] not in caller.conversations:
                problems.append(f"listSessions: a row not of user {caller.user_id}: {item}")
    if operation == "getBadge":
        got = {k: body.get(k) for k in caller.badge}
        if got != caller.badge:
            problems.append(f"getBadge: user {caller.user_id} got {got}, their badge is {caller.badge}")
    if operation == STREAM_OPERATION:
        if body.get("user_id") != str(caller.user_id):
            problems.append(f"stream: hello of user {body.get('user_id')} to user {caller.user_id}")
        got = {k: body.get("badge", {}).get(k) for k in caller.badge}
        if got != caller.badge:
            problems.append(f"stream: hello badge {got} to user {caller.user_id}, theirs is {caller.badge}")
    if operation == "createStreamTicket" and body.get("user_id") != str(caller.user_id):
        problems.append(f"createStreamTicket: a ticket for {body.get('user_id')} to user {caller.user_id}")
    members = ("membersPage", "membersByUserIds", "messageReaders")
    if operation in members and group not in caller.active_groups:
        problems.append(f"{operation}: user {caller.user_id} read group {group}, not an active member")
    return problems


def _group_of(case: Any) -> str | None:
    body = case.body if isinstance(case.body, dict) else {}
    group = (case.path_parameters or {}).get("chat_session_uid") or body.get("chat_session_uid")
    return str(group).lower() if isinstance(group, str) else None


# --------------------------------------------------------------------------- requests


class Caller:
    """Sends a generated case as one user, validates it, records what happened."""

    def __init__(self, base: str, users: tuple[User, User], report: FuzzReport) -> None:
        self.base = base
        self.users = users
        self.report = report
        self.session = requests.Session()
        self.lock = threading.Lock()
        # Opaque values only this server can issue (HMAC-signed cursors and tickets): a generated
        # one is schema-valid but not valid, and its 400/401 is right. Those the server issued
        # (followed along a link) must be accepted.
        self.issued: set[str] = set()
        self.ticket_owner: dict[str, str] = {}
        # A cursor is bound to the user it was issued to: another user's sending it (a link
        # followed with the other token) is rightly a 400, not a valid request refused.
        self.cursor_owner: dict[str, int] = {}
        # Member page references (opaque, issue 34): what each was bound to when issued.
        self.page_ref_binding: dict[str, tuple[object, ...]] = {}

    def _real_group(self, case: Any) -> None:
        """Random UUIDs name no group (always 403): half of the member cases ask about a real
        one instead, the caller's or the other user's, so the access check is really tried."""
        groups = sorted(self.users[0].conversations | self.users[1].conversations)
        digest = zlib.crc32(repr((case.path_parameters, case.body)).encode())
        if digest % 2:
            return
        group = groups[(digest // 2) % len(groups)]
        if isinstance(case.body, dict) and isinstance(case.body.get("chat_session_uid"), str):
            case.body["chat_session_uid"] = group
        if case.path_parameters and "chat_session_uid" in case.path_parameters:
            case.path_parameters["chat_session_uid"] = group

    @staticmethod
    def _page_ref(case: Any) -> tuple[object, tuple[object, ...]]:
        """The request's member page reference and what a valid one must be bound to."""
        body, query = case.body, case.query or {}
        if isinstance(body, dict) and "page_ref" in body:
            binding = ("page", body.get("chat_session_uid"), body.get("active_only", False))
            return body["page_ref"], binding
        path = case.path_parameters or {}
        return query.get("page_ref"), ("readers", path.get("chat_session_uid"))

    def _excluded_checks(self, case: Any, caller: User) -> list[Any]:
        query = case.query or {}
        excluded: list[Any] = []
        ref, binding = self._page_ref(case)
        if isinstance(ref, str) and self.page_ref_binding.get(ref) != (caller.user_id, *binding):
            # A generated reference, or a real one replayed into another account, group or walk:
            # refused (400) by design, as a foreign session cursor is.
            excluded.append(positive_data_acceptance)
        cursor = query.get("cursor")
        if any(isinstance(v, str) and v not in self.issued for v in (cursor, query.get("access_token"))) or (
            isinstance(cursor, str) and self.cursor_owner.get(cursor, caller.user_id) != caller.user_id
        ):
            excluded.append(positive_data_acceptance)
        token = query.get("access_token")
        # The fuzzer may send any JSON there (a dict is unhashable): only a string can be ours.
        if isinstance(token, str) and token in self.issued:
            # A real ticket, followed along the OpenStream link, is no generated credential: the
            # stream rightly opens with it.
            excluded.append(ignored_auth)
        return excluded

    def _remember(self, body: Any, caller: User, status: int, case: Any) -> None:
        if isinstance(body, dict) and status == 200 and isinstance(body.get("next_page_ref"), str):
            request_body = case.body if isinstance(case.body, dict) else {}
            path = case.path_parameters or {}
            binding: tuple[object, ...] = (
                ("page", request_body.get("chat_session_uid"), request_body.get("active_only", False))
                if "chat_session_uid" in request_body
                else ("readers", path.get("chat_session_uid"))
            )
            self.page_ref_binding[body["next_page_ref"]] = (caller.user_id, *binding)
        if isinstance(body, dict):
            for name in ("next_cursor", "ticket"):
                if isinstance(body.get(name), str):
                    self.issued.add(body[name])
            if status == 200 and isinstance(body.get("next_cursor"), str):
                self.cursor_owner[body["next_cursor"]] = caller.user_id
            if isinstance(body.get("ticket"), str):
                # Issued to the caller, whatever the body says: the schema check reports a
                # missing or wrong `user_id`; following the ticket must not fail on it.
                self.ticket_owner[body["ticket"]] = str(caller.user_id)

    def send(self, case: Any, who: int, own_token: bool = True) -> Any:
        """`own_token`: the caller's real token replaces whatever Authorization the case has;
        otherwise the generated one (mostly garbage: the 401 paths) is sent as is."""
        operation = case.operation.definition.raw.get("operationId", case.operation.label)
        ticket = (case.query or {}).get("access_token")
        if not own_token and ticket in self.ticket_owner:
            # Only the ticket speaks for this request: its owner is the caller.
            who = next(i for i, u in enumerate(self.users) if str(u.user_id) == self.ticket_owner[ticket])
        caller, other = self.users[who], self.users[1 - who]
        headers = {"Authorization": f"Bearer {caller.token}"} if own_token else {}
        self._real_group(case)
        if operation == STREAM_OPERATION:
            status, body, response = self._stream(case, headers)
        else:
            response = case.call(base_url=self.base, session=self.session, headers=headers, timeout=30)
            status = response.status_code
            body = _json(response.content)
        problems: list[str] = []
        if status >= 500 and status != 503:
            problems.append(f"{operation}: {status} for {case.as_curl_command(headers=headers)}")
        self._remember(body, caller, status, case)
        if response is not None:
            try:
                case.validate_response(
                    response, headers=headers, excluded_checks=self._excluded_checks(case, caller)
                )
            except FailureGroup as exc:  # the checks that failed (a BaseExceptionGroup)
                problems.append(f"{operation}: {str(exc)[:1500]}")
        problems += cross_user_problems(operation, caller, other, status, body, _group_of(case))
        with self.lock:
            self.report.requests += 1
            self.report.by_status[status] += 1
            self.report.by_operation[operation] += 1
            self.report.failures += problems
        return response

    def _stream(self, case: Any, headers: dict[str, str]) -> tuple[int, Any, Any]:
        """The stream never ends: read up to its hello event, then hang up. An error answer is
        an ordinary JSON body and is validated as such."""
        kwargs = case.as_transport_kwargs(base_url=self.base, headers=headers)
        with requests.request(**kwargs, stream=True, timeout=(10, 30)) as response:
            if response.status_code != 200:
                response.content  # noqa: B018  (read it: a finite JSON body)
                return response.status_code, _json(response.content), response
            assert response.headers["Content-Type"].startswith("text/event-stream"), response.headers
            data = b""
            for chunk in response.iter_content(chunk_size=None):
                data += chunk
                if b"event: hello" in data and data.endswith(b"\n\n"):  # the hello event is whole
                    break
            # What was read stands for the body (the rest never comes): the checks see a
            # complete response (status, headers, content type) and links can follow from it.
            response._content = data
            response._content_consumed = True
        hello = next((line[5:].strip() for line in data.splitlines() if line.startswith(b"data:")), b"{}")
        return 200, _json(hello), response


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def load_schema(base: str) -> Any:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    return schema


def fuzz_stateless(schema: Any, caller: Caller, examples: int, seed: int) -> None:
    """Every operation, `examples` generated cases each (valid and invalid), as either user."""
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        strategy = operation.as_strategy()

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=False,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy, who=st.integers(0, 1), own_token=st.integers(0, 9).map(bool))
        def run(case: Any, who: int, own_token: bool) -> None:
            caller.send(case, who, own_token)

        random.seed(seed)
        run()


def fuzz_stateful(schema: Any, caller: Caller, steps: int, seed: int) -> None:
    """Sequences along the description's links (a page's next_cursor into the next page, a
    ticket into the stream, next_page_ref into the next member page)."""
    base_machine = schema.as_state_machine()

    def who(case: Any) -> tuple[int, bool]:
        # From the case itself, not a random source of its own: hypothesis replays a sequence and
        # must get the same answers (statuses decide which links can be followed).
        key = repr((case.operation.label, case.path_parameters, case.query, case.body)).encode()
        digest = zlib.crc32(key)
        return digest % 2, digest % 10 != 0

    class Machine(base_machine):  # type: ignore[misc,valid-type]
        def step(self, input: Any) -> Any:
            caller.report.stateful_steps += 1
            return super().step(input)

        def call(self, case: Any, **kwargs: Any) -> Any:
            user, own_token = who(case)
            return schemathesis.Response.from_any(caller.send(case, user, own_token=own_token))

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            return None  # done in `caller.send`, with the cross-user checks

    assert issubclass(Machine, APIStateMachine)
    Machine.run(
        settings=settings(
            max_examples=max(1, steps // 8),
            stateful_step_count=8,
            deadline=None,
            phases=[Phase.generate],  # a live server's answers: nothing to shrink reliably
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )


def run_api_fuzz(base: str, users: tuple[User, User], examples: int, steps: int, seed: int) -> FuzzReport:
    report = FuzzReport()
    caller = Caller(base, users, report)
    schema = load_schema(base)
    fuzz_stateless(schema, caller, examples, seed)
    fuzz_stateful(schema, caller, steps, seed)
    return report


def env_examples(default: int) -> int:
    return int(os.environ.get("API_FUZZ_EXAMPLES", default))
