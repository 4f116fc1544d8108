"""The decision flow of opledger.Ledger against a real ledgerd, counting effects at fake destinations.

Each test is named by the contract's conformance scenario it covers
(docs/contract.md §9).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import json
import threading
import time

import grpc
import pytest

import opledger
from opledger import pb


def typed(v):
    """v with each number paired with its type, so that 2 and 2.0 differ."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [typed(x) for x in v]
    return (type(v).__name__, v)


def lost_answer(dest):
    """A tool that applies its effect and loses its answer."""
    def lost(a):
        dest.apply(a.idempotency_key)
        raise TimeoutError("the answer was lost")
    return lost


def refund(dest, amount=10):
    return lambda a: dest.apply(a.idempotency_key, amount=amount)


def test_s2_effect_applied_response_lost_then_replay(ledger, dest, dropper, ids):
    op = ids("refund")
    dropper.arm("Complete")  # the ledger records the outcome; its answer is lost, and Complete is repeated
    first = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                             fn=refund(dest))
    again = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                             fn=refund(dest))
    assert dropper.dropped == ["Complete"]
    assert not first.replayed and again.replayed
    assert again.resource_id == first.resource_id == "R-1"
    assert dest.total() == 1


def test_s3_worker_died_after_the_effect(ledger, dest, ids):
    op = ids("refund")
    # A worker reserves, applies the effect, and dies before Complete.
    resp = ledger.rpc("Reserve", pb.ReserveRequest(operation_id=op, tool="short.refund", permit_id="p-1",
                                                   holder="h-dead", params=opledger.client.params_struct({"amount": 7})))
    assert resp.decision == pb.DECISION_EXECUTE
    dest.apply(op, amount=7)
    time.sleep(0.6)  # past the 400 ms lease: UNKNOWN
    out = ledger.call_tool(operation_id=op, tool="short.refund", params={"amount": 7}, permit_id="p-1",
                           fn=refund(dest, 7))
    assert out.replayed and out.resource_id == "R-1"
    assert ledger.lookup(op).state == pb.STATE_SUCCEEDED
    assert dest.total() == 1


@pytest.mark.parametrize("applied", [True, False], ids=["the effect exists", "the effect does not exist"])
def test_s5_timeout_then_reconciliation(ledger, dest, ids, applied):
    op = ids("refund")
    dest.faults = ["after-write"] if applied else []

    def timed_out(a):
        if not applied:
            raise TimeoutError("no answer, nothing written")
        return dest.apply(a.idempotency_key)

    with pytest.raises(TimeoutError):
        ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=timed_out)
    assert ledger.lookup(op).state == pb.STATE_UNKNOWN
    out = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                           fn=refund(dest))
    assert out.replayed is applied  # found by the reconciler, or run again after NOT_APPLIED
    assert ledger.lookup(op).state == pb.STATE_SUCCEEDED
    assert dest.total() == 1


@pytest.mark.parametrize("data", [
    {"id": 2**53 + 1},
    {"ids": [1, -(2**53 + 1)]},
    {"rate": float("nan")},
    {"nested": {"limit": float("inf")}},
], ids=["an integer beyond 2^53", "one in a list", "NaN", "an infinity"])
def test_result_data_the_wire_would_change_is_not_recorded(ledger, dest, ids, data):
    # The wire's doubles would record 2^53+1 as 2^53: a replay would name
    # another resource than the one the tool made. The effect is left to
    # reconciliation at once, and the tool is not run again.
    op = ids("refund")

    def made(a):
        dest.apply(a.idempotency_key)
        return {"resource_id": "R-1", "data": data}

    with pytest.raises(opledger.NotRecorded) as err:
        ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=made)
    assert err.value.result.data is data
    recorded = ledger.lookup(op)
    assert recorded.state == pb.STATE_UNKNOWN and not recorded.HasField("result")
    again = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=made)
    assert again.replayed and again.data == {"receipt": "R-1"}  # the reconciler's finding
    assert dest.total() == 1


@pytest.mark.parametrize("params, message", [
    ({"amount": 2**53 + 1}, "params/amount: an integer beyond 2^53 that no double spells cannot be sent exactly; "
     "send it as a string"),
    ({"ids": [2**60]}, "params/ids/0: an integer beyond 2^53 that no double spells cannot be sent exactly; "
     "send it as a string"),
    ({"rates": [1.5, float("nan")]}, "params/rates/1: NaN and infinities have no JSON form"),
    ({"when": datetime.datetime(2026, 12, 1)},
     "params/when: datetime has no JSON form; send it as a string or a number"),
    ({"amount": decimal.Decimal("10.50")}, "params/amount: Decimal has no JSON form; send it as a string or a number"),
    ({"tags": {"a", "b"}}, "params/tags: set has no JSON form; send it as a string or a number"),
    ({"by_id": {1: "x"}}, "params/by_id: a key that is not a string (int) has no JSON form"),
    ({"raw": b"12345"}, "params/raw: bytes has no JSON form; send it as a string or a number"),
    ([10, "EUR"], "params: list; params and result data are dicts (JSON objects)"),
    (None, "params: NoneType; params and result data are dicts (JSON objects)"),
], ids=["an integer beyond 2^53", "2^60, whose double is written 1152921504606847000", "NaN", "a datetime", "a Decimal",
        "a set", "an int key", "bytes", "a list", "None"])
def test_params_without_an_exact_json_form_are_refused(ledger, dest, ids, params, message):
    # Refused before anything is sent, naming where and the kind, never the value.
    op = ids("refund")
    with pytest.raises(ValueError) as err:
        ledger.call_tool(operation_id=op, tool="payments.refund", params=params, permit_id="p-1", fn=refund(dest))
    assert str(err.value) == message
    with pytest.raises(opledger.LedgerError) as missing:
        ledger.lookup(op)
    assert missing.value.reason == "NOT_FOUND" and dest.total() == 0


@pytest.mark.parametrize("given, error, message", [
    ({"fn": None}, TypeError, "fn: NoneType is not callable; call_tool runs fn(attempt)"),
    ({"fn": "refund"}, TypeError, "fn: str is not callable; call_tool runs fn(attempt)"),
    ({"wait": 0}, ValueError, "wait: a positive number of seconds is required"),
    ({"wait": -5.0}, ValueError, "wait: a positive number of seconds is required"),
    ({"wait": float("nan")}, ValueError, "wait: a positive number of seconds is required"),
    ({"tool_timeout": 0}, ValueError, "tool_timeout: a positive number of seconds is required"),
    ({"tool_timeout": "10"}, ValueError, "tool_timeout: a positive number of seconds is required"),
], ids=["fn None", "fn a str", "no wait", "a negative wait", "a NaN wait", "no tool timeout", "a tool timeout in a str"])
def test_a_call_that_cannot_run_is_refused(ledger, dest, ids, given, error, message):
    # Refused before anything is sent: a claim with no tool to run would be
    # left UNKNOWN, though nothing ran.
    op = ids("refund")
    call = {"operation_id": op, "tool": "payments.refund", "params": {"amount": 5}, "permit_id": "p-1",
            "fn": refund(dest)}
    with pytest.raises(error) as err:
        ledger.call_tool(**(call | given))
    assert str(err.value) == message
    with pytest.raises(opledger.LedgerError) as missing:
        ledger.lookup(op)
    assert missing.value.reason == "NOT_FOUND" and dest.total() == 0


@pytest.mark.parametrize("target, options, refused", [
    ("ledger.example:443", {"api_key": "k.s"}, ValueError),
    ("10.0.0.5:50051", {"api_key": "k.s"}, ValueError),
    ("dns:///ledger.example:443", {"api_key": "k.s"}, ValueError),
    ("127.0.0.1:50051", {"api_key": "k.s"}, None),
    ("[::1]:50051", {"api_key": "k.s"}, None),
    ("localhost:50051", {"api_key": "k.s"}, None),
    ("unix:/run/ledger.sock", {"api_key": "k.s"}, None),
    ("ledger.example:443", {}, None),
    ("ledger.example:443", {"api_key": "k.s", "credentials": "tls"}, None),
    ("ledger.example:443", {"api_key": "k.s", "channel": "own"}, None),
    ("ledger.example:443", {"credentials": "tls", "channel": "own"}, TypeError),
], ids=["a host name", "an address", "a dns target", "127.0.0.1", "[::1]", "localhost", "a Unix socket", "no key",
        "TLS", "the caller's own channel", "both a channel and credentials"])
@pytest.mark.parametrize("client", ["Ledger", "AsyncLedger"])
def test_an_api_key_goes_in_clear_only_to_this_machine(client, target, options, refused):
    # As the Go SDK: a key without TLS goes only to this machine, refused
    # before any channel is made.
    async def make():
        given = dict(options)
        if given.get("credentials") == "tls":
            given["credentials"] = grpc.ssl_channel_credentials()
        if given.get("channel") == "own":
            given["channel"] = (grpc.aio.insecure_channel(target) if client == "AsyncLedger"
                                else grpc.insecure_channel(target))
            if client == "AsyncLedger" and "api_key" in given:
                given.pop("api_key")  # an aio channel takes its key when it is made
        lg = getattr(opledger, client)(target, **given)
        if client == "AsyncLedger":
            await lg.close()
        else:
            lg.close()

    if refused is None:
        asyncio.run(make())
    else:
        with pytest.raises(refused):
            asyncio.run(make())


@pytest.mark.parametrize("options, message", [
    ({"call_timeout": 0}, "call_timeout: a positive number of seconds is required"),
    ({"call_timeout": "5"}, "call_timeout: a positive number of seconds is required"),
    ({"ledger_retries": -1}, "ledger_retries: a whole number, 0 or more, is required"),
    ({"ledger_retries": 1.5}, "ledger_retries: a whole number, 0 or more, is required"),
    ({"reconcilers": {"tickets.create": "find_ticket"}}, "reconcilers['tickets.create']: str is not callable"),
], ids=["no call timeout", "a call timeout in a str", "negative retries", "fractional retries",
        "a reconciler that is not callable"])
@pytest.mark.parametrize("client", ["Ledger", "AsyncLedger"])
def test_options_every_call_would_fail_for_are_refused(client, options, message):
    async def make():
        getattr(opledger, client)("127.0.0.1:1", **options)

    with pytest.raises((ValueError, TypeError)) as err:
        asyncio.run(make())
    assert str(err.value) == message


def test_an_async_channel_of_the_callers_takes_no_key():
    # An aio channel takes its interceptors when it is made: a key given
    # beside one would never be sent.
    async def make():
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        try:
            opledger.AsyncLedger("127.0.0.1:1", channel=channel, api_key="k.s")
        finally:
            await channel.close()

    with pytest.raises(TypeError, match="with channel=, make the channel with them"):
        asyncio.run(make())


@pytest.mark.parametrize("given, recorded",
                         [(4711, "4711"), ("TCK-1", "TCK-1"), (None, ""), (4711.0, None), (True, None)],
                         ids=["an int", "a str", "None", "a float", "a bool"])
def test_resource_ids_recorded_as_str(ledger, dest, ids, given, recorded):
    # An int id (a database key) is recorded as its digits, as the
    # TypeScript package records a number; a float or a bool, which has no
    # one spelling, leaves the effect to reconciliation.
    op = ids("refund")

    def made(a):
        dest.apply(a.idempotency_key)
        return {"resource_id": given, "data": {}}

    call = dict(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=made)
    if recorded is None:
        with pytest.raises(opledger.NotRecorded):
            ledger.call_tool(**call)
        assert ledger.lookup(op).state == pb.STATE_UNKNOWN
    else:
        out, again = ledger.call_tool(**call), ledger.call_tool(**call)
        assert (out.resource_id, again.resource_id, again.replayed) == (recorded, recorded, True)
    assert dest.total() == 1


@pytest.mark.parametrize("produced, error", [
    ("TCK-1", "fn returned str; return {'resource_id': ..., 'data': {...}}"),
    ({"resource_id": "TCK-1", "data": ["a"]}, "data: list; the result data is a dict"),
    (None, None),
], ids=["a str", "data a list", "None, an empty result"])
def test_what_fn_returns(ledger, dest, ids, produced, error):
    # What fn returns is recorded, or refused with its type named: never
    # dropped. The effect has happened either way.
    op = ids("refund")

    def made(a):
        dest.apply(a.idempotency_key)
        return produced

    call = dict(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=made)
    if error:
        with pytest.raises(opledger.NotRecorded) as err:
            ledger.call_tool(**call)
        assert str(err.value.__cause__) == error
        assert ledger.lookup(op).state == pb.STATE_UNKNOWN
    else:
        out = ledger.call_tool(**call)
        assert (out.resource_id, out.data, ledger.lookup(op).state) == ("", {}, pb.STATE_SUCCEEDED)
    assert dest.total() == 1


# Findings the ledger cannot record, what stops them, and what that says.
UNRECORDABLE_FINDINGS = [
    # An id beyond 2^53 would be recorded as another resource: not sent.
    pytest.param(opledger.Finding(opledger.Finding.APPLIED, resource_id="R-1", data={"id": 2**53 + 1}), ValueError,
                 "data/id", id="an id the wire would change"),
    # What the ledger refuses is sent and refused: INVALID_ARGUMENT about the
    # finding, not about the call.
    pytest.param(opledger.Finding(opledger.Finding.APPLIED, resource_id="R-1", data={"blob": "x" * (70 << 10)}),
                 opledger.LedgerError, "INVALID_ARGUMENT", id="data over 64 KiB"),
    pytest.param(opledger.Finding(opledger.Finding.APPLIED, resource_id="R-" + "1" * 300), opledger.LedgerError,
                 "INVALID_ARGUMENT", id="a resource id over 256 bytes"),
]


@pytest.mark.parametrize("found, cause, says", UNRECORDABLE_FINDINGS)
def test_a_finding_that_cannot_be_recorded_decides_nothing(addr, dest, ids, found, cause, says):
    # The reconciler's finding is not recorded, and the operation stays
    # UNKNOWN: call_tool raises NeedsReconciliation, caused by why.
    op = ids("refund")

    lost = lost_answer(dest)

    ledger = opledger.Ledger(addr, reconcilers={"payments.refund": lambda rec: found})
    try:
        with pytest.raises(TimeoutError):
            ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=lost)
        with pytest.raises(opledger.NeedsReconciliation) as err:
            ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1", fn=lost)
        assert isinstance(err.value.__cause__, cause) and says in str(err.value.__cause__)
        assert ledger.lookup(op).state == pb.STATE_UNKNOWN
    finally:
        ledger.close()
    assert dest.total() == 1


def test_an_escalated_operation_waits_for_a_human(addr, dest, ids):
    # Once the reconciler escalated, a later call does not ask it again: a
    # finding then would take the question from the human who was asked,
    # and this one (NOT_APPLIED) would run the tool a second time.
    op = ids("refund")
    answers = [opledger.Finding(opledger.Finding.ESCALATE, note="the bank does not say"),
               opledger.Finding(opledger.Finding.NOT_APPLIED, note="not found")]
    asked = []

    def reconciler(rec):
        asked.append(rec.operation_id)
        return answers[len(asked) - 1]

    lost = lost_answer(dest)

    ledger = opledger.Ledger(addr, reconcilers={"payments.refund": reconciler})
    call = dict(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1")
    try:
        with pytest.raises(TimeoutError):
            ledger.call_tool(**call, fn=lost)
        for _ in range(2):
            with pytest.raises(opledger.NeedsReconciliation):
                ledger.call_tool(**call, fn=refund(dest))
        rec = ledger.lookup(op)
    finally:
        ledger.close()
    assert len(asked) == 1 and rec.state == pb.STATE_UNKNOWN and rec.needs_review
    assert dest.total() == 1


class BeforeCall(grpc.UnaryUnaryClientInterceptor):
    """Runs hook once, before the first call of method goes out."""

    def __init__(self, method: str, hook):
        self.method, self.hook = method, hook

    def intercept_unary_unary(self, continuation, details, request):
        if details.method.rsplit("/", 1)[-1] == self.method and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return continuation(details, request)


@contextlib.contextmanager
def taken_over(addr, dest, call):
    """A Ledger whose first Complete goes out only once another caller, past the 400 ms lease of
    call's operation, has found nothing at the destination and run the operation to success."""
    not_found = opledger.Finding(opledger.Finding.NOT_APPLIED, note="not found")
    other = opledger.Ledger(addr, reconcilers={"short.refund": lambda rec: not_found})

    def takes_over():
        time.sleep(0.6)
        other.call_tool(**call, fn=refund(dest))

    late = opledger.Ledger(addr, interceptors=[BeforeCall("Complete", takes_over)])
    try:
        yield late
    finally:
        late.close()
        other.close()


def test_an_effect_the_ledger_records_another_outcome_for(addr, dest, ids):
    # The tool's result reaches the ledger after the claim's lease ended,
    # and by then another caller found nothing at the destination and ran
    # the tool again: the ledger records that attempt. call_tool raises
    # ConflictingOutcome with the record that stands, never NotRecorded,
    # which says the effect will be reconciled as applied.
    call = dict(operation_id=ids("refund"), tool="short.refund", params={"amount": 1}, permit_id="p-1")
    with taken_over(addr, dest, call) as late, pytest.raises(opledger.ConflictingOutcome) as err:
        late.call_tool(**call, fn=refund(dest))
    got = err.value
    assert isinstance(got, opledger.NeedsReconciliation) and not isinstance(got, opledger.NotRecorded)
    assert got.result.resource_id == "R-1" and got.attempt == 1 and got.record_read
    assert got.__cause__.reason == "STALE_FENCING_TOKEN"
    stands = got.operation
    assert stands.state == pb.STATE_SUCCEEDED and stands.attempt == 2 and stands.result.resource_id == "R-2"
    assert dest.total() == 2  # the case to report


# Failed attempts, proven to have applied nothing.
FAILURES = [
    pytest.param(opledger.FinalToolError("card_declined"), id="final"),
    pytest.param(opledger.RetryableToolError("429"), id="retryable"),
]


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failure_after_the_claim_was_gone(addr, dest, ids, failure):
    # The tool fails, but its claim's lease ended first and another caller
    # ran the operation to success. The refused failure is not the record:
    # call_tool reserves again and replays the outcome that stands, as the Go
    # SDK does, instead of raising NotRecorded.
    call = dict(operation_id=ids("refund"), tool="short.refund", params={"amount": 1}, permit_id="p-1")

    def fails(a):
        raise failure

    with taken_over(addr, dest, call) as late:
        out = late.call_tool(**call, fn=fails)
        rec = late.lookup(call["operation_id"])
    assert out.replayed and out.resource_id == "R-1"
    assert rec.state == pb.STATE_SUCCEEDED and rec.attempt == 2 and dest.total() == 1


@pytest.mark.parametrize("data, want", [
    ({"id": 2**53, "low": -(2**53), "rate": 1.5, "ok": True, "none": None}, None),
    ({"pair": (1, "a"), "nested": [{"t": (2,)}]}, {"pair": [1, "a"], "nested": [{"t": [2]}]}),
    ({"qty": 2, "items": [1, 2], "zero": 0, "count": -3, "big": 10**15, "round": 10**20, "low": -(10**20),
      "near_2_60": 1152921504606847000}, None),
    # The wire's doubles do not tell 2.0 from 2: data comes back as its
    # JSON is read (json.loads of "2", "-0" and "1e+21").
    ({"whole": 2.0, "negative_zero": -0.0, "huge": 1e21}, {"whole": 2, "negative_zero": 0, "huge": 1e21}),
], ids=["exact numbers", "tuples, as lists", "integers stay integers", "integral doubles, as JSON reads them"])
def test_result_data_recorded_as_json_writes_it(ledger, dest, ids, data, want):
    want = data if want is None else want
    op = ids("refund")
    call = dict(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                fn=lambda a: {"resource_id": "R-1", "data": data})
    out, again = ledger.call_tool(**call), ledger.call_tool(**call)
    assert not out.replayed and again.replayed
    for got in (out.data, again.data):
        assert typed(got) == typed(want)  # 2, not 2.0
    assert ledger.lookup(op).state == pb.STATE_SUCCEEDED


def test_s9_appointment_with_faults(ledger, dest, ids):
    op = ids("appointment")
    params = {"patient": "p-42", "slot": "2026-12-03T09:30"}

    def book(a):
        return dest.apply(a.idempotency_key, **params)

    def call(p=params, op_id=op):
        return ledger.call_tool(operation_id=op_id, tool="appointments.create", params=p, permit_id="p-1", fn=book)

    dest.faults = ["before-write"]  # refused before the write: proven not applied, retried
    with pytest.raises(opledger.RetryableToolError):
        call()
    dest.faults = ["after-write"]  # written, then the answer timed out: UNKNOWN
    with pytest.raises(TimeoutError):
        call()
    ids_seen = [call().resource_id]  # the reconciler finds it; after this the agent "crashes" before saving
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(call().resource_id)) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ids_seen += results + [call().resource_id, call().resource_id]
    assert len(ids_seen) == 5 and set(ids_seen) == {"R-1"}
    assert dest.total() == 1
    with pytest.raises(opledger.LedgerError) as refused:
        call({**params, "slot": "2026-12-03T10:00"})
    assert refused.value.reason == "IDEMPOTENCY_KEY_REUSED" and refused.value.metadata["differs"] == "params"
    assert call(op_id=ids("appointment-2")).resource_id == "R-2"
    assert dest.total() == 2


def test_s10_lost_reserve_response(ledger, dest, dropper, ids):
    op = ids("refund")
    dropper.arm("Reserve")
    out = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                           fn=refund(dest))
    assert dropper.dropped == ["Reserve"] and not out.replayed
    reasons = [h.reason for h in ledger.lookup(op).history]
    assert reasons == ["RESERVED", "SUCCEEDED"]  # the repeat recovered the same claim: one attempt
    assert dest.total() == 1


def test_s12_every_rpc_retried_after_a_lost_response(ledger, dropper, ids):
    op, other, run = ids("refund"), ids("lost"), ids("run")
    calls = [
        ("StartRun", pb.StartRunRequest(run_id=run)),
        ("Reserve", pb.ReserveRequest(operation_id=op, tool="payments.refund", holder="h-1", run_id=run)),
        ("Renew", None),
        ("Complete", None),
        ("Lookup", pb.LookupRequest(operation_id=op)),
        ("GetRun", pb.GetRunRequest(run_id=run)),
        ("EndRun", pb.EndRunRequest(run_id=run, state=pb.RUN_STATE_DONE)),
    ]
    token = 0
    for method, request in calls:
        if method == "Renew":
            request = pb.RenewRequest(operation_id=op, fencing_token=token)
        if method == "Complete":
            request = pb.CompleteRequest(operation_id=op, fencing_token=token, outcome=pb.OUTCOME_SUCCEEDED,
                                         result=pb.Result(resource_id="R-9"))
        dropper.arm(method)
        resp = ledger.rpc(method, request)
        if method == "Reserve":
            assert resp.decision == pb.DECISION_EXECUTE
            token = resp.operation.fencing_token
    assert dropper.dropped == [m for m, _ in calls]
    rec = ledger.lookup(op)
    assert rec.state == pb.STATE_SUCCEEDED and rec.attempt == 1 and rec.result.resource_id == "R-9"
    assert ledger.get_run(run).state == pb.RUN_STATE_DONE and ledger.get_run(run).steps == 1

    claim = ledger.rpc("Reserve", pb.ReserveRequest(operation_id=other, tool="payments.refund", holder="h-2"))
    dropper.arm("MarkUnknown")
    ledger.rpc("MarkUnknown", pb.MarkUnknownRequest(operation_id=other, fencing_token=claim.operation.fencing_token))
    dropper.arm("Reconcile")
    done = ledger.rpc("Reconcile", pb.ReconcileRequest(operation_id=other, finding=pb.FINDING_ABANDON, note="n"))
    assert done.operation.state == pb.STATE_FAILED_FINAL
    assert [h.reason for h in ledger.lookup(other).history] == ["RESERVED", "MARKED_UNKNOWN", "ABANDONED"]


def test_compensation(ledger, dest, ids):
    charge, undo = ids("charge"), ids("refund")
    ledger.call_tool(operation_id=charge, tool="payments.charge", params={"amount": 10}, permit_id="p-1",
                     fn=refund(dest))
    for _ in range(2):
        ledger.call_tool(operation_id=undo, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                         fn=refund(dest), compensates=charge)
    assert dest.total() == 2
    assert list(ledger.lookup(charge).compensated_by) == [undo]
    assert ledger.lookup(undo).compensates == charge
    with pytest.raises(opledger.LedgerError) as refused:
        ledger.call_tool(operation_id=ids("refund-2"), tool="payments.refund", params={}, permit_id="p-1",
                         fn=refund(dest), compensates=ids("never"))
    assert refused.value.reason == "NOT_COMPENSABLE" and refused.value.metadata["cause"] == "not_found"
    assert dest.total() == 2


@pytest.mark.parametrize("given, recorded", [
    ("card 4242 declined", "card 4242 declined"),
    ("4242 " + "é" * (40 << 10), "4242 " + "é" * (((64 << 10) - 5) // 2)),  # cut to 64 KiB, on a character
    ("4242 a\ud800b", "4242 a?b"),  # a lone surrogate has no UTF-8
    ({"card": "4242"}, ""),  # not a str: not recorded
], ids=["a str", "over 64 KiB", "a lone surrogate", "a dict"])
def test_final_failure_detail_replayed(ledger, dest, ids, given, recorded):
    # What the destination answered is the failure's detail: recorded, and
    # handed back by the replay, never in the error's text.
    op = ids("refund")

    def declines(a):
        raise opledger.FinalToolError("card_declined", "declined", detail=given)

    for replayed in (False, True):
        with pytest.raises(opledger.ToolFailed) as failed:
            ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                             fn=declines)
        got = failed.value
        assert (got.code, got.detail, got.replayed) == ("card_declined", recorded, replayed)
        assert "4242" not in str(got)
    assert ledger.lookup(op).failure.detail == recorded and dest.total() == 0


# A FinalToolError's code, and the failure code the ledger records: the
# default one when it is missing, refused by the ledger or cannot be sent.
FAILURE_CODES = [
    pytest.param("card_declined", "card_declined", id="a code"),
    pytest.param(None, "tool_failed", id="none"),
    pytest.param("", "tool_failed", id="empty"),
    pytest.param("x" * 200, "tool_failed", id="over 128 bytes"),
    pytest.param("declined\n", "tool_failed", id="a control character"),
    pytest.param("card\ud800", "tool_failed", id="a lone surrogate"),
    pytest.param(42, "tool_failed", id="not a str"),
]


@pytest.mark.parametrize("code, recorded", FAILURE_CODES)
def test_final_failure_code_recorded(ledger, ids, code, recorded):
    op = ids("refund")

    def declines(a):
        raise opledger.FinalToolError(code, "declined")

    with pytest.raises(opledger.ToolFailed) as failed:
        ledger.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p-1", fn=declines)
    rec = ledger.lookup(op)
    assert failed.value.code == recorded and not failed.value.replayed
    assert rec.state == pb.STATE_FAILED_FINAL and rec.failure.code == recorded


def test_receipts_handed_on(ledger, dest, ids, claims):
    # make test runs ledgerd with --receipt-keys: every settled answer carries a receipt.
    op = ids("refund")
    first = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                             fn=refund(dest))
    again = ledger.call_tool(operation_id=op, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                             fn=refund(dest))
    fresh, replayed = claims(first.receipt), claims(again.receipt)
    assert fresh["operation_id"] == op and fresh["state"] == "STATE_SUCCEEDED" and fresh["resource_id"] == "R-1"
    assert replayed["result_sha256"] == fresh["result_sha256"] and len(fresh["history_head"]) == 40
    assert replayed["history_head"] == ledger.lookup(op).history_head
    assert dest.total() == 1

    def declines(a):
        raise opledger.FinalToolError("card_declined")

    declined = ids("declined")
    for _ in range(2):  # the failure recorded, then replayed
        with pytest.raises(opledger.ToolFailed) as failed:
            ledger.call_tool(operation_id=declined, tool="payments.refund", params={"amount": 10}, permit_id="p-1",
                             fn=declines)
        got = claims(failed.value.receipt)
        assert got["state"] == "STATE_FAILED_FINAL" and got["failure_code"] == "card_declined"
