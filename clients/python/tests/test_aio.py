"""The decision flow of opledger.AsyncLedger (grpc.aio) against a real ledgerd, counting effects."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import grpc
import pytest
from grpc import aio

import opledger
from opledger import pb
from test_client import FAILURE_CODES, FAILURES, UNRECORDABLE_FINDINGS


def method_name(details) -> str:
    method = details.method.decode() if isinstance(details.method, bytes) else details.method
    return method.rsplit("/", 1)[-1]


class AioDropper(aio.UnaryUnaryClientInterceptor):
    """Lets a call reach the ledger, then loses its response, for the methods armed."""

    def __init__(self):
        self.armed: dict[str, int] = {}
        self.dropped: list[str] = []

    async def intercept_unary_unary(self, continuation, details, request):
        method = method_name(details)
        call = await continuation(details, request)
        if self.armed.get(method, 0) > 0:
            self.armed[method] -= 1
            await call  # the ledger did what was asked; only its answer is lost
            self.dropped.append(method)
            raise aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, aio.Metadata(), aio.Metadata(), "the response was lost")
        return call


class AioHold(aio.UnaryUnaryClientInterceptor):
    """Holds each call of one method a while before sending it, and says when one is held."""

    def __init__(self, method: str, seconds: float):
        self.method, self.seconds = method, seconds
        self.held = asyncio.Event()

    async def intercept_unary_unary(self, continuation, details, request):
        if method_name(details) == self.method:
            self.held.set()
            await asyncio.sleep(self.seconds)
        return await continuation(details, request)


class AioBeforeCall(aio.UnaryUnaryClientInterceptor):
    """Awaits hook once, before the first call of method goes out."""

    def __init__(self, method: str, hook):
        self.method, self.hook = method, hook

    async def intercept_unary_unary(self, continuation, details, request):
        if method_name(details) == self.method and self.hook is not None:
            hook, self.hook = self.hook, None
            await hook()
        return await continuation(details, request)


def lost_answer(dest):
    """A tool that applies its effect and loses its answer."""
    async def lost(a):
        dest.apply(a.idempotency_key)
        raise TimeoutError("the answer was lost")
    return lost


def run(coro):
    return asyncio.run(coro)


def test_s2_and_s10_lost_answers(addr, dest, ids):
    async def scenario():
        drop = AioDropper()
        async with opledger.AsyncLedger(addr, interceptors=[drop]) as lg:
            op = ids("refund")
            drop.armed = {"Reserve": 1, "Complete": 1}

            async def refund(a):
                await asyncio.sleep(0)
                return dest.apply(a.idempotency_key)

            first = await lg.call_tool(operation_id=op, tool="payments.refund", params={"amount": 3},
                                       permit_id="p-1", fn=refund)
            again = await lg.call_tool(operation_id=op, tool="payments.refund", params={"amount": 3},
                                       permit_id="p-1", fn=refund)
            rec = await lg.lookup(op)
            return drop.dropped, first, again, rec

    dropped, first, again, rec = run(scenario())
    assert dropped == ["Reserve", "Complete"]
    assert not first.replayed and again.replayed and again.resource_id == first.resource_id
    assert [h.reason for h in rec.history] == ["RESERVED", "SUCCEEDED"]
    assert dest.total() == 1


@pytest.mark.parametrize("applied", [True, False], ids=["the effect exists", "the effect does not exist"])
def test_s5_timeout_then_reconciliation(addr, dest, ids, applied, claims):
    async def reconciler(op):
        return dest.reconciler(op)

    async def scenario():
        async with opledger.AsyncLedger(addr, reconcilers={"payments.refund": reconciler}) as lg:
            op = ids("refund")

            async def hangs(a):
                if applied:
                    dest.apply(a.idempotency_key)
                await asyncio.sleep(10)

            with pytest.raises(opledger.ToolTimedOut):
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p-1",
                                   fn=hangs, tool_timeout=0.2)
            unknown = (await lg.lookup(op)).state

            async def refund(a):
                return dest.apply(a.idempotency_key)

            out = await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p-1", fn=refund)
            return unknown, out, (await lg.lookup(op)).state

    unknown, out, state = run(scenario())
    assert unknown == pb.STATE_UNKNOWN and state == pb.STATE_SUCCEEDED
    assert out.replayed is applied
    assert claims(out.receipt)["state"] == "STATE_SUCCEEDED"  # the finding's, or the second attempt's
    assert dest.total() == 1


def test_concurrent_calls_of_one_operation_run_it_once(addr, dest, ids):
    async def scenario():
        async with opledger.AsyncLedger(addr) as lg:
            op = ids("ticket")

            async def slow(a):
                await asyncio.sleep(0.2)
                return dest.apply(a.idempotency_key)

            return await asyncio.gather(*(lg.call_tool(operation_id=op, tool="tickets.create", params={"t": 1},
                                                       permit_id="p-1", fn=slow) for _ in range(5)))

    outs = run(scenario())
    assert {o.resource_id for o in outs} == {"R-1"} and sum(not o.replayed for o in outs) == 1
    assert dest.total() == 1


def test_run_guard_and_final_failure(addr, dest, ids):
    async def scenario():
        async with opledger.AsyncLedger(addr) as lg:
            run_id = ids("run")
            await lg.start_run(run_id, max_steps=1)

            async def ok(a):
                return dest.apply(a.idempotency_key)

            await lg.call_tool(operation_id=ids("a"), tool="tickets.create", params={}, permit_id="p", fn=ok,
                               run_id=run_id)
            with pytest.raises(opledger.RunEnded) as ended:
                await lg.call_tool(operation_id=ids("b"), tool="tickets.create", params={}, permit_id="p", fn=ok,
                                   run_id=run_id)

            async def declined(a):
                raise opledger.FinalToolError("card_declined", "declined", detail="card 4242 declined")

            with pytest.raises(opledger.ToolFailed) as failed:
                await lg.call_tool(operation_id=ids("c"), tool="payments.charge", params={}, permit_id="p",
                                   fn=declined)
            return ended.value, failed.value

    ended, failed = run(scenario())
    assert ended.reason == "RUN_STEP_LIMIT" and failed.code == "card_declined" and failed.detail == "card 4242 declined"
    assert dest.total() == 1


def test_a_cancelled_task_leaves_the_attempt_unknown(addr, dest, ids):
    async def scenario():
        async with opledger.AsyncLedger(addr) as lg:
            op = ids("refund")
            started, stopped = asyncio.Event(), asyncio.Event()

            async def slow(a):
                started.set()
                try:
                    dest.apply(a.idempotency_key)
                    await asyncio.sleep(10)
                finally:
                    stopped.set()

            task = asyncio.ensure_future(lg.call_tool(operation_id=op, tool="payments.refund", params={},
                                                      permit_id="p", fn=slow))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(stopped.wait(), 5)
            return (await lg.lookup(op)).state

    assert run(scenario()) == pb.STATE_UNKNOWN
    assert dest.total() == 1


def test_data_the_wire_would_change_is_not_recorded(addr, dest, ids):
    # As in the blocking client: the tool's result with an id beyond 2^53
    # is not recorded rounded (UNKNOWN at once), and a reconciler's finding
    # with one decides nothing.
    def found_rounded(rec):
        return opledger.Finding(opledger.Finding.APPLIED, resource_id="R-1", data={"id": 2**53 + 1})

    async def scenario():
        async with opledger.AsyncLedger(addr, reconcilers={"payments.refund": found_rounded}) as lg:
            op = ids("refund")

            async def made(a):
                dest.apply(a.idempotency_key)
                return {"resource_id": "R-1", "data": {"id": 2**53 + 1}}

            with pytest.raises(opledger.NotRecorded) as not_recorded:
                await lg.call_tool(operation_id=op, tool="payments.refund", params={"amount": 3}, permit_id="p-1",
                                   fn=made)
            with pytest.raises(opledger.NeedsReconciliation) as needs:
                await lg.call_tool(operation_id=op, tool="payments.refund", params={"amount": 3}, permit_id="p-1",
                                   fn=made)
            return not_recorded.value, needs.value, await lg.lookup(op)

    not_recorded, needs, rec = run(scenario())
    assert not_recorded.result.data == {"id": 2**53 + 1}
    assert isinstance(needs.__cause__, ValueError)
    assert rec.state == pb.STATE_UNKNOWN and not rec.HasField("result")
    assert dest.total() == 1


def test_a_call_that_cannot_run_is_refused(addr, dest, ids):
    # As in the blocking client: refused before anything is sent.
    async def scenario():
        async with opledger.AsyncLedger(addr) as lg:
            op = ids("refund")
            with pytest.raises(TypeError):
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p-1", fn=None)
            with pytest.raises(ValueError):
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p-1", fn=settles,
                                   tool_timeout=-1)
            with pytest.raises(opledger.LedgerError) as missing:
                await lg.lookup(op)
            return missing.value.reason

    assert run(scenario()) == "NOT_FOUND"


async def settles(a):
    return {"resource_id": "R-1"}


async def declines(a):
    raise opledger.FinalToolError("card_declined", "declined")


async def breaks(a):
    raise RuntimeError("connection reset")


@pytest.mark.parametrize("fn, wait, method, state, effects, raised", [
    (settles, 30, "Complete", pb.STATE_SUCCEEDED, 1, asyncio.CancelledError),
    (declines, 30, "Complete", pb.STATE_FAILED_FINAL, 1, asyncio.CancelledError),
    (breaks, 30, "MarkUnknown", pb.STATE_UNKNOWN, 1, asyncio.CancelledError),
    pytest.param(settles, 30, "Complete", pb.STATE_SUCCEEDED, 1, TimeoutError,
                 marks=pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is Python 3.11's")),
    (settles, 1e-9, "Complete", pb.STATE_PENDING, 0, asyncio.CancelledError),
], ids=["succeeded", "failed for good", "unknown", "asyncio.timeout", "a claim returned unused"])
def test_a_task_cancelled_while_recording_still_records(addr, dest, ids, fn, wait, method, state, effects, raised):
    # The tool has ended (or will not run: its claim came after the wait
    # budget), and the task is cancelled while the ledger call that records
    # it is on its way. The cancellation waits for the record, so a retry
    # replays the outcome (or runs the tool) instead of finding the claim
    # RUNNING, then UNKNOWN.
    async def scenario():
        hold = AioHold(method, 0.3)
        async with opledger.AsyncLedger(addr, interceptors=[hold]) as lg:
            op = ids("refund")

            async def counted(a):
                dest.apply(a.idempotency_key)
                return await fn(a)

            def call():
                return lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p", fn=counted,
                                    wait=wait)

            timer = []

            async def bounded():
                async with asyncio.timeout(None) as cm:
                    timer.append(cm)
                    await call()

            task = asyncio.ensure_future(bounded() if raised is TimeoutError else call())
            await hold.held.wait()
            if timer:
                timer[0].reschedule(asyncio.get_running_loop().time())
            else:
                task.cancel()
            with pytest.raises(raised):
                await task
            return (await lg.lookup(op)).state

    assert run(scenario()) == state
    assert dest.total() == effects


@pytest.mark.parametrize("code, recorded", FAILURE_CODES)
def test_final_failure_code_recorded(addr, ids, code, recorded):
    async def scenario():
        async with opledger.AsyncLedger(addr) as lg:
            op = ids("refund")

            async def declines(a):
                raise opledger.FinalToolError(code, "declined")

            with pytest.raises(opledger.ToolFailed) as failed:
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p", fn=declines)
            return failed.value, await lg.lookup(op)

    failed, rec = run(scenario())
    assert failed.code == recorded and rec.state == pb.STATE_FAILED_FINAL and rec.failure.code == recorded


@pytest.mark.parametrize("found, cause, says", UNRECORDABLE_FINDINGS)
def test_a_finding_that_cannot_be_recorded_decides_nothing(addr, dest, ids, found, cause, says):
    async def reconciler(op):
        return found

    async def scenario():
        async with opledger.AsyncLedger(addr, reconcilers={"payments.refund": reconciler}) as lg:
            op = ids("refund")

            lost = lost_answer(dest)

            with pytest.raises(TimeoutError):
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p", fn=lost)
            with pytest.raises(opledger.NeedsReconciliation) as err:
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p", fn=lost)
            return err.value, await lg.lookup(op)

    err, rec = run(scenario())
    assert isinstance(err.__cause__, cause) and says in str(err.__cause__)
    assert rec.state == pb.STATE_UNKNOWN and dest.total() == 1


def test_an_escalated_operation_waits_for_a_human(addr, dest, ids):
    # As in the blocking client: once the reconciler escalated, it is not
    # asked again, and the tool does not run a second time.
    answers = [opledger.Finding(opledger.Finding.ESCALATE, note="the bank does not say"),
               opledger.Finding(opledger.Finding.NOT_APPLIED, note="not found")]
    asked = []

    async def reconciler(rec):
        asked.append(rec.operation_id)
        return answers[len(asked) - 1]

    async def scenario():
        async with opledger.AsyncLedger(addr, reconcilers={"payments.refund": reconciler}) as lg:
            op = ids("refund")

            lost = lost_answer(dest)

            async def refund(a):
                return dest.apply(a.idempotency_key)

            with pytest.raises(TimeoutError):
                await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p", fn=lost)
            for _ in range(2):
                with pytest.raises(opledger.NeedsReconciliation):
                    await lg.call_tool(operation_id=op, tool="payments.refund", params={}, permit_id="p", fn=refund)
            return await lg.lookup(op)

    rec = run(scenario())
    assert len(asked) == 1 and rec.state == pb.STATE_UNKNOWN and rec.needs_review
    assert dest.total() == 1


@contextlib.asynccontextmanager
async def taken_over(addr, dest, call):
    """An AsyncLedger whose first Complete goes out only once another caller, past the 400 ms lease
    of call's operation, has found nothing at the destination and run the operation to success."""
    async def not_found(rec):
        return opledger.Finding(opledger.Finding.NOT_APPLIED, note="not found")

    async def refund(a):
        return dest.apply(a.idempotency_key)

    async with opledger.AsyncLedger(addr, reconcilers={"short.refund": not_found}) as other:
        async def takes_over():
            await asyncio.sleep(0.6)
            await other.call_tool(**call, fn=refund)

        async with opledger.AsyncLedger(addr, interceptors=[AioBeforeCall("Complete", takes_over)]) as late:
            yield late


def test_an_effect_the_ledger_records_another_outcome_for(addr, dest, ids):
    # As in the blocking client: the result comes after the lease ended and
    # another caller ran the tool again; ConflictingOutcome, not NotRecorded.
    call = dict(operation_id=ids("refund"), tool="short.refund", params={"amount": 1}, permit_id="p-1")

    async def scenario():
        async def refund(a):
            return dest.apply(a.idempotency_key)

        async with taken_over(addr, dest, call) as late:
            with pytest.raises(opledger.ConflictingOutcome) as err:
                await late.call_tool(**call, fn=refund)
        return err.value

    got = run(scenario())
    assert isinstance(got, opledger.NeedsReconciliation) and not isinstance(got, opledger.NotRecorded)
    assert got.result.resource_id == "R-1" and got.__cause__.reason == "STALE_FENCING_TOKEN"
    stands = got.operation
    assert stands.state == pb.STATE_SUCCEEDED and stands.attempt == 2 and stands.result.resource_id == "R-2"
    assert dest.total() == 2


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failure_after_the_claim_was_gone(addr, dest, ids, failure):
    # As in the blocking client: the refused failure is not the record; the
    # outcome that stands is replayed.
    call = dict(operation_id=ids("refund"), tool="short.refund", params={"amount": 1}, permit_id="p-1")

    async def scenario():
        async def fails(a):
            raise failure

        async with taken_over(addr, dest, call) as late:
            return await late.call_tool(**call, fn=fails), await late.lookup(call["operation_id"])

    out, rec = run(scenario())
    assert out.replayed and out.resource_id == "R-1"
    assert rec.state == pb.STATE_SUCCEEDED and rec.attempt == 2 and dest.total() == 1
