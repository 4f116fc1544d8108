"""guarded under a framework-shaped fake: a tool node that retries a tool call as agent frameworks do."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

import grpc
import pytest

import opledger


class FakeToolNode:
    """Runs a model's tool calls as LangGraph's ToolNode and the OpenAI Agents SDK do.

    Each call carries the framework's id of the call; a call that raises is
    retried up to retries times, and the whole step may be replayed after a
    checkpoint restore (invoke again with the same calls).
    """

    def __init__(self, tools: dict[str, Callable[..., Any]], retries: int = 3):
        self.tools, self.retries = tools, retries

    def invoke(self, calls: list[dict[str, Any]]) -> list[Any]:
        out = []
        for call in calls:
            for attempt in range(self.retries + 1):
                try:
                    out.append(self.tools[call["name"]](**call["args"], tool_call_id=call["id"]))
                    break
                except (TimeoutError, opledger.RetryableToolError):
                    if attempt == self.retries:
                        raise
        return out


def test_guarded_tool_runs_once_however_often_the_framework_calls_it(ledger, dest, ids):
    booked: list[dict[str, Any]] = []
    keys: list[str] = []

    @opledger.guarded(ledger, tool="appointments.create", operation_id="tool_call_id", permit_id="p-1",
                      resource_id="appointment_id")
    def create_appointment(patient: str, slot: str, idempotency_key: str) -> dict[str, Any]:
        """Books a slot (the docstring and signature stay the tool's, for the framework's schema)."""
        keys.append(idempotency_key)
        fault = dest.faults.pop(0) if dest.faults else ""
        if fault == "before-write":
            raise opledger.RetryableToolError("503 before the write")
        booked.append({"patient": patient, "slot": slot})
        return {"appointment_id": f"A-{len(booked)}", "slot": slot}

    assert create_appointment.__doc__.startswith("Books a slot")
    node = FakeToolNode({"create_appointment": create_appointment})
    call = {"name": "create_appointment", "id": ids("call_7"), "args": {"patient": "p-42", "slot": "09:30"}}
    dest.faults = ["before-write"]
    first = node.invoke([call])  # refused once before the write, retried by the node
    again = node.invoke([call, call])  # the step replayed after a restore, the call twice
    assert first == again[:1] == again[1:] == [{"appointment_id": "A-1", "slot": "09:30"}]
    assert len(booked) == 1 and set(keys) == {call["id"]}
    rec = ledger.lookup(call["id"])
    assert rec.result.resource_id == "A-1" and rec.attempt == 2

    with pytest.raises(opledger.LedgerError) as changed:
        node.invoke([{**call, "args": {"patient": "p-42", "slot": "10:00"}}])
    assert changed.value.reason == "IDEMPOTENCY_KEY_REUSED"
    with pytest.raises(ValueError):
        create_appointment(patient="p-1", slot="11:00")  # no tool call id: refused before the ledger is asked
    assert len(booked) == 1


@pytest.mark.parametrize("given, recorded", [(17, "17"), ("A-1", "A-1"), (None, ""), ("absent", "")],
                         ids=["an int", "a str", "None", "no such key"])
def test_guarded_resource_ids(ledger, ids, given, recorded):
    # The id is read from the result as call_tool reads a tool's: None and a
    # missing key are no id, not the text "None".
    @opledger.guarded(ledger, tool="appointments.create", operation_id="tool_call_id", permit_id="p-1",
                      resource_id="appointment_id")
    def create(slot: str) -> dict[str, Any]:
        return {"slot": slot} if given == "absent" else {"appointment_id": given, "slot": slot}

    op = ids("call")
    create(slot="09:30", tool_call_id=op)
    assert ledger.lookup(op).result.resource_id == recorded


@pytest.mark.parametrize("result, want", [
    ({"ticket": "T-1", "n": 2}, {"ticket": "T-1", "n": 2}),
    ({}, {}),
    ("booked T-1", "booked T-1"),
    (42, 42),
    (["T-1", "T-2"], ["T-1", "T-2"]),
    (("T-1", 2), ["T-1", 2]),
    (None, None),
], ids=["a dict", "an empty dict", "a str", "an int", "a list", "a tuple, as a list", "None"])
def test_guarded_tool_returns_what_it_returned(ledger, ids, result, want):
    # A framework's tool often returns a str: it is recorded, and replayed,
    # as the TypeScript package's guardTool records it ({"$value": ...}).
    runs = []

    @opledger.guarded(ledger, tool="tickets.create", operation_id="tool_call_id", permit_id="p-1")
    def create(title: str) -> Any:
        runs.append(title)
        return result

    op = ids("call")
    first, again = create(title="x", tool_call_id=op), create(title="x", tool_call_id=op)
    assert first == again == want and type(first) is type(want)
    assert len(runs) == 1


def refund_tool(ledger: opledger.Ledger, currency: Any, runs: list[dict[str, Any]]) -> Callable[..., Any]:
    """A refund tool whose currency defaults to currency, as one deploy declares it."""
    @opledger.guarded(ledger, tool="payments.refund", operation_id="tool_call_id", permit_id="p-1")
    def refund(amount: int, currency: Any = currency) -> dict[str, Any]:
        runs.append({"amount": amount, "currency": currency})
        return {"refund": f"R-{len(runs)}", "currency": currency}

    return refund


@pytest.mark.parametrize("calls, refused", [
    ([("EUR", {}), ("EUR", {"currency": "EUR"})], False),
    ([("EUR", {"currency": "EUR"}), ("EUR", {})], False),
    ([("EUR", {}), ("USD", {})], True),
    ([("EUR", {}), ("EUR", {"currency": "USD"})], True),
], ids=["the default spelled out", "the default left out", "the default changed by a deploy",
        "another value given"])
def test_guarded_fingerprints_declared_defaults(ledger, ids, calls, refused):
    # The default is part of what the tool does: a retry made after a deploy
    # changed it is a changed request, not a replay of the old receipt.
    runs: list[dict[str, Any]] = []
    op = ids("call")
    (default, kwargs), (default2, kwargs2) = calls
    first = refund_tool(ledger, default, runs)(amount=10, tool_call_id=op, **kwargs)
    assert first == {"refund": "R-1", "currency": "EUR"}
    retry = refund_tool(ledger, default2, runs)
    if refused:
        with pytest.raises(opledger.LedgerError) as err:
            retry(amount=10, tool_call_id=op, **kwargs2)
        assert err.value.reason == "IDEMPOTENCY_KEY_REUSED"
    else:
        assert retry(amount=10, tool_call_id=op, **kwargs2) == first
    assert runs == [{"amount": 10, "currency": "EUR"}]


def test_guarded_refuses_a_default_with_no_json_form(ledger, ids):
    runs: list[dict[str, Any]] = []
    op = ids("call")
    with pytest.raises(ValueError, match="params/currency: object has no JSON form"):
        refund_tool(ledger, object(), runs)(amount=10, tool_call_id=op)
    assert runs == []
    with pytest.raises(opledger.LedgerError) as err:
        ledger.lookup(op)
    assert err.value.code == grpc.StatusCode.NOT_FOUND


class AsyncFakeToolNode(FakeToolNode):
    """FakeToolNode for async tools, as the OpenAI Agents SDK and LangGraph's ainvoke run them."""

    async def ainvoke(self, calls: list[dict[str, Any]]) -> list[Any]:
        async def one(call: dict[str, Any]) -> Any:
            for attempt in range(self.retries + 1):
                try:
                    return await self.tools[call["name"]](**call["args"], tool_call_id=call["id"])
                except opledger.RetryableToolError:
                    if attempt == self.retries:
                        raise

        return list(await asyncio.gather(*(one(call) for call in calls)))  # parallel tool calls


def test_guarded_async_tool_runs_once_however_often_the_framework_calls_it(addr, dest, ids):
    booked: list[str] = []
    keys: set[str] = set()

    async def scenario(lg: opledger.AsyncLedger) -> tuple[list[Any], list[Any], opledger.LedgerError]:
        @opledger.guarded(lg, tool="tickets.create", operation_id="tool_call_id", permit_id="p-1")
        async def create_ticket(title: str, priority: str = "normal", *, idempotency_key: str) -> str:
            """Opens a ticket."""
            keys.add(idempotency_key)
            if dest.faults and dest.faults.pop(0) == "before-write":
                raise opledger.RetryableToolError("503 before the write")
            await asyncio.sleep(0.1)
            booked.append(title)
            return f"T-{len(booked)}"

        assert create_ticket.__doc__ == "Opens a ticket." and inspect.iscoroutinefunction(create_ticket)
        node = AsyncFakeToolNode({"create_ticket": create_ticket})
        call = {"name": "create_ticket", "id": ids("call_9"), "args": {"title": "Printer on fire"}}
        dest.faults = ["before-write"]
        first = await node.ainvoke([call, call, call])  # one retried, all three at once
        again = await node.ainvoke([{**call, "args": {"title": "Printer on fire", "priority": "normal"}}])
        with pytest.raises(opledger.LedgerError) as changed:
            await node.ainvoke([{**call, "args": {"title": "Printer on fire", "priority": "high"}}])
        return first, again, changed.value

    async def main() -> Any:
        async with opledger.AsyncLedger(addr) as lg:
            return await scenario(lg)

    first, again, changed = asyncio.run(main())
    assert first == ["T-1"] * 3 and again == ["T-1"], (first, again)
    assert booked == ["Printer on fire"] and len(keys) == 1
    assert changed.reason == "IDEMPOTENCY_KEY_REUSED"


@pytest.mark.parametrize("ids_given, message", [
    ({"tool_call_id": None}, "tickets.create: the operation id is None; give a string"),
    ({"tool_call_id": ["call_1"]}, "tickets.create: the operation id is list; give a string"),
    ({"tool_call_id": ""}, "tickets.create: no operation id (give the keyword argument 'tool_call_id')"),
    ({}, "tickets.create: no operation id (give the keyword argument 'tool_call_id')"),
    ({"tool_call_id": "call_1", "run": 2.5}, "tickets.create: the run id is float; give a string"),
], ids=["None", "a list", "empty", "absent", "a float run id"])
def test_guarded_refuses_an_id_that_is_none(ledger, ids_given, message):
    # Refused before the ledger is asked: str(None) made every call without
    # a tool call id the one operation "None", replaying the first's result.
    ran = []

    @opledger.guarded(ledger, tool="tickets.create", operation_id="tool_call_id", run_id="run")
    def create(title: str) -> str:
        ran.append(title)
        return "T-1"

    with pytest.raises(ValueError) as err:
        create(title="printer", **ids_given)
    assert str(err.value) == message and ran == []
    with pytest.raises(opledger.LedgerError) as missing:
        ledger.lookup("None")
    assert missing.value.reason == "NOT_FOUND"


def test_guarded_refuses_what_it_cannot_run(addr, ledger):
    # Refused when decorating, not after a call has applied an effect.
    def create(title: str) -> dict[str, Any]:
        return {"title": title}

    async def create_async(title: str) -> dict[str, Any]:
        return {"title": title}

    with pytest.raises(TypeError, match="a coroutine function .* with an AsyncLedger"):
        opledger.guarded(ledger, tool="tickets.create", operation_id="tool_call_id")(create_async)
    with pytest.raises(TypeError, match="takes an opledger.Ledger or an opledger.AsyncLedger"):
        opledger.guarded(object(), tool="tickets.create", operation_id="tool_call_id")

    async def with_async_ledger() -> None:
        async with opledger.AsyncLedger(addr) as lg:
            with pytest.raises(TypeError, match="a plain function with a Ledger"):
                opledger.guarded(lg, tool="tickets.create", operation_id="tool_call_id")(create)

    asyncio.run(with_async_ledger())
