"""The asyncio client: AsyncLedger.call_tool, the decision flow of Ledger.call_tool on grpc.aio.

    ledger = AsyncLedger("127.0.0.1:50051")
    outcome = await ledger.call_tool(operation_id=f"{run_id}:{call_id}", tool="tickets.create",
                                     params={"title": "Printer on fire"}, permit_id=approval_id,
                                     fn=create_ticket)   # async def create_ticket(attempt) -> dict

fn is a coroutine function. A cancelled task (asyncio.CancelledError) is
handled as Ledger.call_tool handles its cancel event: before fn starts, no
claim is left behind; while fn runs, fn is cancelled too and the attempt is
marked UNKNOWN (nobody knows how far it got); once fn has returned or raised,
how it ended is recorded before the cancellation is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import inspect
import secrets
import time
from typing import Any, Awaitable, Callable

import grpc
from grpc import aio

from opledger._gen.ledger.v1 import ledger_pb2 as pb
from opledger._gen.ledger.v1 import ledger_pb2_grpc
from opledger.client import (  # noqa: I001
    CALLER_GAVE_UP,
    DEFAULT_FAILURE_CODE,
    RETRYABLE_FAILURE_CODE,
    RUN_REASONS,
    _UNANSWERED_CODES,
    _ClaimGone,
    Attempt,
    ConflictingOutcome,
    FinalToolError,
    Finding,
    LedgerError,
    LeaseEndedOnTheWay,
    NeedsReconciliation,
    NotRecorded,
    Outcome,
    RetryableToolError,
    RunEnded,
    ToolFailed,
    ToolTimedOut,
    Ledger,
    WaitBudgetSpent,
    _lease,
    _lease_end,
    _repeatable,
    check_call,
    check_options,
    check_transport,
    code_refused,
    conflicting,
    data_struct,
    error_info,
    final_failure,
    in_progress_delay,
    lease_margin,
    params_struct,
    reconcile_request,
    tool_result,
)

# An async reconciler: asks the destination whether an UNKNOWN operation's effect exists.
AsyncReconciler = Callable[[pb.Operation], Awaitable[Finding]]


class _BearerKey(aio.UnaryUnaryClientInterceptor):
    """Sends the API key with every call, as "authorization: Bearer <key>"."""

    def __init__(self, key: str):
        self._metadata = (("authorization", "Bearer " + key),)

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        details = client_call_details._replace(
            metadata=aio.Metadata(*(tuple(client_call_details.metadata or ()) + self._metadata)))
        return await continuation(details, request)


class AsyncLedger:
    """A grpc.aio client of ledger.v1.LedgerService, for agent runtimes on asyncio.

    Options mean what they mean for Ledger; reconcilers may be coroutine
    functions or plain functions. Create it inside the running loop.
    """

    def __init__(self, target: str, *, channel: aio.Channel | None = None, call_timeout: float = 5.0,
                 ledger_retries: int = 3, log: Callable[[str], None] | None = None,
                 reconcilers: dict[str, Callable[[pb.Operation], Any]] | None = None, api_key: str = "",
                 interceptors: list[aio.ClientInterceptor] | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        check_transport(target, api_key, channel, credentials)
        check_options(call_timeout, ledger_retries, reconcilers)
        chain: list[aio.ClientInterceptor] = ([_BearerKey(api_key)] if api_key else []) + list(interceptors or [])
        if channel is not None and chain:
            # An aio channel takes its interceptors when it is made.
            raise TypeError("api_key and interceptors go on the channel AsyncLedger makes: with channel=, "
                            "make the channel with them, or pass credentials= instead")
        if channel is None and credentials is not None:
            channel = aio.secure_channel(target, credentials, interceptors=chain or None)
        self.channel = channel or aio.insecure_channel(target, interceptors=chain or None)
        self.stub = ledger_pb2_grpc.LedgerServiceStub(self.channel)
        self.call_timeout = call_timeout
        self.ledger_retries = ledger_retries
        self.log = log or (lambda _msg: None)
        self.reconcilers = dict(reconcilers or {})

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def rpc(self, method: str, request, until: float | None = None):
        """Calls one ledger RPC, repeating it while the ledger is unavailable or asks to back off.

        Any other error becomes a LedgerError with its ErrorInfo reason. until
        (time.monotonic()'s clock) cuts the call and its repeats there.
        """
        call = getattr(self.stub, method)
        lost = False
        for attempt in range(self.ledger_retries + 1):
            timeout = self.call_timeout if until is None else min(self.call_timeout, until - time.monotonic())
            if timeout <= 0:
                raise LedgerError(grpc.StatusCode.DEADLINE_EXCEEDED, "no time left for the call", None, None, lost)
            try:
                return await call(request, timeout=timeout)
            except grpc.RpcError as err:
                lost = lost or err.code() in _UNANSWERED_CODES
                info, retry_after = error_info(err)
                if _repeatable(err.code(), info.reason if info else "", info.domain if info else "") \
                        and attempt < self.ledger_retries:
                    pause = retry_after or 0.1 * 2 ** attempt
                    if until is not None:
                        pause = max(min(pause, until - time.monotonic()), 0)
                    await asyncio.sleep(pause)
                    continue
                raise LedgerError(err.code(), err.details() or "", info, retry_after, lost) from None
        raise AssertionError("unreachable")

    async def lookup(self, operation_id: str) -> pb.Operation:
        return (await self.rpc("Lookup", pb.LookupRequest(operation_id=operation_id))).operation

    async def start_run(self, run_id: str, *, max_steps: int = 0, deadline: float = 0.0, max_repeats: int = 0,
                        max_irreversible: int = 0) -> pb.Run:
        """Starts run_id in the ledger (see Ledger.start_run)."""
        limits = pb.RunLimits(max_steps=max_steps, max_repeats=max_repeats, max_irreversible=max_irreversible)
        if deadline:
            limits.deadline.FromTimedelta(datetime.timedelta(seconds=deadline))
        return (await self.rpc("StartRun", pb.StartRunRequest(run_id=run_id, limits=limits))).run

    async def get_run(self, run_id: str) -> pb.Run:
        return (await self.rpc("GetRun", pb.GetRunRequest(run_id=run_id))).run

    async def end_run(self, run_id: str, state: int = pb.RUN_STATE_DONE, reason: str = "") -> pb.Run:
        return (await self.rpc("EndRun", pb.EndRunRequest(run_id=run_id, state=state, reason=reason))).run

    async def call_tool(self, *, operation_id: str, tool: str, params: dict[str, Any], permit_id: str,
                        fn: Callable[[Attempt], Awaitable[dict[str, Any]]], effect: int = pb.EFFECT_UNSPECIFIED,
                        wait: float = 30.0, tool_timeout: float = 10.0, run_id: str = "",
                        compensates: str = "") -> Outcome:
        """Runs fn at most once for operation_id, whoever retries it and however often (see Ledger.call_tool)."""
        check_call(fn, wait, tool_timeout)
        holder = secrets.token_hex(16)
        deadline = time.monotonic() + wait
        request = pb.ReserveRequest(operation_id=operation_id, tool=tool, params=params_struct(params),
                                    permit_id=permit_id, holder=holder, effect=effect, run_id=run_id,
                                    compensates=compensates)
        waits = reconciled = 0
        while True:
            asked = time.monotonic()
            try:
                resp = await self.rpc("Reserve", request)
            except LedgerError as err:
                if err.reason in RUN_REASONS:
                    raise RunEnded(err) from None
                if err.answer_lost:
                    await self._return_lost_claim(request)
                raise
            except asyncio.CancelledError:
                await _finish(self._return_lost_claim(request))
                raise
            op = resp.operation
            if resp.decision == pb.DECISION_REPLAY:
                if op.state == pb.STATE_SUCCEEDED:
                    return Ledger._outcome(op, replayed=True, receipt=resp.receipt)
                raise ToolFailed.recorded(op.failure, replayed=True, receipt=resp.receipt)
            if resp.decision == pb.DECISION_IN_PROGRESS:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitBudgetSpent(operation_id, wait, held=True)
                waits += 1
                await asyncio.sleep(min(in_progress_delay(waits, resp.retry_after.ToTimedelta().total_seconds()), left))
                continue
            if resp.decision == pb.DECISION_RECONCILE:
                reconciled += 1
                if reconciled > 3:
                    raise NeedsReconciliation(op, resp.receipt)
                done = await self._reconcile(tool, op, resp.receipt)
                if done is None:
                    continue
                return done
            if resp.decision != pb.DECISION_EXECUTE:
                raise LedgerError(grpc.StatusCode.UNKNOWN, f"unexpected decision {resp.decision}", None)
            if deadline - time.monotonic() <= 0:
                raise WaitBudgetSpent(operation_id, wait, returned=await self._return_claim(op))
            if _lease(op) > 0 and time.monotonic() >= _lease_end(op, asked) - lease_margin(_lease(op)):
                await self._return_claim(op, RETRYABLE_FAILURE_CODE)
                raise LeaseEndedOnTheWay(operation_id)
            try:
                return await self._execute(op, fn, tool_timeout, asked)
            except _ClaimGone:
                continue  # the record says how it ended: Reserve again (see Ledger.call_tool)

    async def _reconcile(self, tool: str, op: pb.Operation, receipt: str = "") -> Outcome | None:
        """Asks tool's reconciler about op and records its finding (see Ledger._reconcile)."""
        reconciler = self.reconcilers.get(tool)
        if reconciler is None or op.needs_review:
            # Once a human was asked (ESCALATE), a human settles it.
            raise NeedsReconciliation(op, receipt)
        try:
            found = reconciler(op)
            if inspect.isawaitable(found):
                found = await found
        except Exception as err:  # noqa: BLE001 - a reconciler that fails decides nothing
            self.log(f"reconciler of {tool} for {op.operation_id}: {err!r}")
            raise NeedsReconciliation(op, receipt) from err
        try:
            request = reconcile_request(op, found)
        except (AttributeError, TypeError, ValueError) as err:
            self.log(f"reconciler of {tool} for {op.operation_id}: a finding that cannot be sent: {err}")
            raise NeedsReconciliation(op, receipt) from err
        try:
            got = await self.rpc("Reconcile", request)
        except LedgerError as err:
            if err.code == grpc.StatusCode.INVALID_ARGUMENT:
                # The ledger will not take the finding (data over 64 KiB, an id over 256 bytes): it decides nothing.
                self.log(f"reconciler of {tool} for {op.operation_id}: the ledger refused its finding: {err}")
                raise NeedsReconciliation(op, receipt) from err
            if err.reason not in ("ALREADY_RESOLVED", "STALE_FENCING_TOKEN"):
                raise
            got = await self.rpc("Lookup", pb.LookupRequest(operation_id=op.operation_id))
        return Ledger._settled(got.operation, got.receipt)

    async def _read(self, operation_id: str) -> pb.Operation | None:
        """The operation's record, or None when it cannot be read."""
        try:
            return await _finish(self.lookup(operation_id))
        except LedgerError as err:
            self.log(f"Lookup {operation_id}: {err.code.name} {err.reason}")
            return None

    async def _return_claim(self, op: pb.Operation, code: str = CALLER_GAVE_UP) -> bool:
        """Completes an unused claim as a retryable failure proven not applied; whether the ledger took it."""
        try:
            await _finish(self.rpc("Complete", pb.CompleteRequest(
                operation_id=op.operation_id, fencing_token=op.fencing_token, outcome=pb.OUTCOME_FAILED_RETRYABLE,
                failure=pb.Failure(code=code))))
        except LedgerError as err:
            self.log(f"returning the claim of {op.operation_id}: {err.code.name} {err.reason}")
            return False
        return True

    async def _return_lost_claim(self, request: pb.ReserveRequest) -> None:
        """Returns the claim a Reserve without an answer may have been granted (see Ledger._return_lost_claim)."""
        with contextlib.suppress(grpc.RpcError, asyncio.TimeoutError):
            async with asyncio.timeout(self.call_timeout) if hasattr(asyncio, "timeout") else _nullcontext():
                rec = (await self.stub.Lookup(pb.LookupRequest(operation_id=request.operation_id),
                                              timeout=self.call_timeout)).operation
                if rec.state != pb.STATE_RUNNING:
                    return
                resp = await self.stub.Reserve(request, timeout=self.call_timeout)
                if resp.decision == pb.DECISION_EXECUTE:
                    await self.stub.Complete(pb.CompleteRequest(
                        operation_id=request.operation_id, fencing_token=resp.operation.fencing_token,
                        outcome=pb.OUTCOME_FAILED_RETRYABLE, failure=pb.Failure(code=CALLER_GAVE_UP)),
                        timeout=self.call_timeout)

    async def _execute(self, op: pb.Operation, fn: Callable[[Attempt], Awaitable[dict[str, Any]]],
                       tool_timeout: float, asked: float) -> Outcome:
        attempt = Attempt(operation_id=op.operation_id, idempotency_key=op.operation_id,
                          attempt=op.attempt, fencing_token=op.fencing_token)
        claim = {"operation_id": op.operation_id, "fencing_token": op.fencing_token}
        renewing = asyncio.ensure_future(self._keep_leased(op, attempt, asked))
        tool = asyncio.ensure_future(fn(attempt))
        try:
            try:
                produced = await self._await_tool(tool, attempt, tool_timeout)
            finally:
                renewing.cancel()
        except RetryableToolError as err:
            await self._report_failure(pb.CompleteRequest(**claim, outcome=pb.OUTCOME_FAILED_RETRYABLE,
                                                          failure=pb.Failure(code=RETRYABLE_FAILURE_CODE)), err)
            raise
        except FinalToolError as err:
            request = final_failure(claim, err)
            try:
                done = await self._report_failure(request, err)
            except NotRecorded as not_recorded:
                if not code_refused(not_recorded, request):
                    raise
                done = await self._report_failure(final_failure(claim, err, DEFAULT_FAILURE_CODE), err)
            raise ToolFailed.recorded(done.operation.failure, replayed=False, receipt=done.receipt) from err
        except BaseException as err:
            # A timeout, a crash, a cancelled task: nobody knows whether it applied.
            attempt.cancelled.set()
            tool.cancel()
            reason = (f"no answer within the tool timeout ({tool_timeout}s)" if isinstance(err, ToolTimedOut)
                      else "the tool ended without an answer")
            await self._report("MarkUnknown", pb.MarkUnknownRequest(**claim, reason=reason), err)
            raise
        ran = None
        try:
            rid, data = tool_result(produced)
            ran = Outcome(resource_id=rid, data=data, replayed=False, operation=op)
            result = pb.Result(resource_id=ran.resource_id, data=data_struct(ran.data))
        except (AttributeError, TypeError, ValueError) as err:
            with contextlib.suppress(NotRecorded):
                await self._report("MarkUnknown", pb.MarkUnknownRequest(**claim, reason="the result cannot be encoded"))
            raise NotRecorded(err, result=ran) from err
        try:
            done = await self._report("Complete", pb.CompleteRequest(**claim, outcome=pb.OUTCOME_SUCCEEDED,
                                                                     result=result), result=ran)
        except NotRecorded as err:
            if conflicting(err):
                raise ConflictingOutcome(ran, await self._read(op.operation_id), op) from err.__cause__
            cause = err.__cause__
            if isinstance(cause, LedgerError) and cause.code == grpc.StatusCode.INVALID_ARGUMENT:
                with contextlib.suppress(NotRecorded):
                    await self._report("MarkUnknown", pb.MarkUnknownRequest(
                        **claim, reason="result data refused by the ledger"))
            raise
        return Ledger._outcome(done.operation, replayed=False, receipt=done.receipt)

    @staticmethod
    async def _await_tool(tool: asyncio.Future, attempt: Attempt, timeout: float) -> dict[str, Any]:
        """Awaits the tool; at the timeout, or when the claim is lost, it is cancelled and ToolTimedOut raised."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                attempt.cancelled.set()
                tool.cancel()
                raise ToolTimedOut(attempt.operation_id, timeout)
            done, _ = await asyncio.wait({tool}, timeout=min(left, 0.05))
            if done:
                return tool.result()
            if attempt.cancelled.is_set():  # the claim is gone, or its lease ends with no renewal through
                tool.cancel()
                with contextlib.suppress(BaseException):
                    await tool
                raise ToolTimedOut(attempt.operation_id, timeout)

    async def _report(self, method: str, request, tool_error: BaseException | None = None,
                      result: Outcome | None = None):
        """Records how the tool ended (Complete or MarkUnknown), as Ledger._report does, to the end (see _finish)."""
        try:
            return await _finish(self.rpc(method, request))
        except LedgerError as err:
            raise NotRecorded(err, result=result, tool_error=tool_error) from err

    async def _report_failure(self, request: pb.CompleteRequest, err: Exception):
        """Records a failed attempt (see _report); raises _ClaimGone when the claim was gone by then."""
        try:
            return await self._report("Complete", request, err)
        except NotRecorded as not_recorded:
            if conflicting(not_recorded):
                raise _ClaimGone() from err
            raise

    async def _keep_leased(self, op: pb.Operation, attempt: Attempt, asked: float) -> None:
        """Renews the claim while the tool runs, as Ledger._keep_leased does; cancelled when the tool ends."""
        lease = _lease(op)
        if lease <= 0:
            return
        margin, period = lease_margin(lease), max(lease / 3, 0.01)
        end = _lease_end(op, asked)
        wait = min(max(end - time.monotonic() - lease * 2 / 3, 0), period)
        while True:
            await asyncio.sleep(wait)
            sent = time.monotonic()
            try:
                now = await self.rpc("Renew", pb.RenewRequest(**{"operation_id": op.operation_id,
                                                                 "fencing_token": op.fencing_token}),
                                     until=end - margin)
                end = sent + lease
                if now.operation.HasField("lease_expires_at"):
                    end = min(end, _lease_end(now.operation, sent))
            except LedgerError as err:
                if not _repeatable(err.code, err.reason, err.domain):
                    attempt.claim_lost.set()
                    attempt.cancelled.set()
                    return
                if time.monotonic() >= end - margin:
                    attempt.cancelled.set()
                    return
            wait = min(period, max(end - margin - time.monotonic(), 0))


async def _finish(call: Awaitable[Any]) -> Any:
    """Awaits a ledger call that records what happened (a report, a claim returned) to its end.

    A cancelled task does not cut it off: the cancellation is raised once
    the call has ended, so that an effect that happened is never left to
    expire into UNKNOWN, nor an attempt that never ran.
    """
    job = asyncio.ensure_future(call)
    job.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved, whoever waits
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):  # cancelled again: the call goes on all the same
            await job
        raise


@contextlib.asynccontextmanager
async def _nullcontext():
    yield
