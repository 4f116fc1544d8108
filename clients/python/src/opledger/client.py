"""The synchronous client: Ledger.call_tool runs a side-effecting tool at most once per operation.

    ledger = Ledger("127.0.0.1:50051")
    outcome = ledger.call_tool(
        operation_id=f"{run_id}:{call_id}",   # minted once, reused by every retry
        tool="tickets.create",
        params={"title": "Printer on fire", "priority": 2},
        permit_id=approval_id,
        fn=lambda attempt: tickets.create(..., idempotency_key=attempt.idempotency_key),
    )

call_tool reserves the operation, runs fn only when the ledger says
DECISION_EXECUTE, records the outcome with the attempt's fencing token, and
otherwise replays the recorded result, waits for another caller's live claim,
asks the tool's reconciler (reconcilers=...) or stops for reconciliation.
Refusals arrive as LedgerError with the google.rpc.ErrorInfo reason the
service attached (IDEMPOTENCY_KEY_REUSED, ...). With run_id=..., each call is
a step of an agent run the ledger guards (start_run): the call past the run's
limit raises RunEnded, and fn does not run.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import decimal
import ipaddress
import math
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import grpc
from google.protobuf import json_format, struct_pb2

from opledger._gen.google.rpc import error_details_pb2, status_pb2
from opledger._gen.ledger.v1 import ledger_pb2 as pb
from opledger._gen.ledger.v1 import ledger_pb2_grpc

DOMAIN = "ledger.v1"

# Status codes after which the same ledger call may simply be repeated: every
# ledger RPC is safe to retry with the same arguments.
_RETRYABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# The ledger's ErrorInfo reasons of a RESOURCE_EXHAUSTED that mean "back off
# (the RetryInfo says how long) and repeat": the tenant is over its rate.
# UNRESOLVED_LIMIT (the tenant holds as many unresolved operations as it may)
# is not among them: a repeat a second later rarely finds one resolved, so it
# is raised at once, as the Go SDK returns it (ErrQuotaExceeded).
_BACK_OFF_REASONS = ("RATE_LIMITED",)

# The codes of a call that may have reached the ledger and got no answer back:
# it may have done what was asked.
_UNANSWERED_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)

# The failure code of a claim returned unused by a caller that gave up: waiting
# for the Reserve that granted it (see Ledger._return_lost_claim), or on the
# claim itself, which came after its wait budget (see Ledger._return_claim).
CALLER_GAVE_UP = "caller_gave_up"

# The failure code recorded for a FinalToolError without a code (None or
# empty), or whose code the ledger refuses (over 128 bytes, or with a control
# character) or that cannot be sent (not a str, a lone surrogate), as in the
# Go SDK.
DEFAULT_FAILURE_CODE = "tool_failed"

# The failure code recorded for a retryable failure proven not applied: a
# RetryableToolError from the tool, or a claim returned because its lease ended
# on the way (LeaseEndedOnTheWay), as in the Go SDK.
RETRYABLE_FAILURE_CODE = "retryable"

# The ledger's limit on a failure's detail, in bytes of UTF-8.
MAX_FAILURE_DETAIL = 64 << 10


def _repeatable(code: grpc.StatusCode, reason: str, domain: str) -> bool:
    """Whether a call that failed with code and the ErrorInfo's reason and domain may be repeated as it is.

    A RESOURCE_EXHAUSTED without one of the ledger's reasons is gRPC's own
    refusal (a message over the size limit): the same call would be refused again.
    """
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return domain == DOMAIN and reason in _BACK_OFF_REASONS
    return code in _RETRYABLE_CODES


class LedgerError(Exception):
    """The ledger refused a call: the gRPC code and the ErrorInfo it carried.

    reason is the ErrorInfo reason (IDEMPOTENCY_KEY_REUSED, STALE_FENCING_TOKEN,
    NOT_FOUND, ...) and metadata its metadata (for IDEMPOTENCY_KEY_REUSED,
    metadata["differs"] names what changed: tool, params and/or permit).
    answer_lost says whether this call, or a try of it that Ledger.rpc
    repeated, got no answer (_UNANSWERED_CODES): the ledger may have done
    what was asked.
    """

    def __init__(self, code: grpc.StatusCode, message: str, info: error_details_pb2.ErrorInfo | None,
                 retry_after: float | None = None, answer_lost: bool = False):
        self.code = code
        self.answer_lost = answer_lost or code in _UNANSWERED_CODES
        self.message = message
        self.info = info
        self.reason = info.reason if info else ""
        self.domain = info.domain if info else ""
        self.metadata = dict(info.metadata) if info else {}
        self.retry_after = retry_after
        super().__init__(f"{code.name} {self.reason or '(no ErrorInfo)'}: {message}")


# The ErrorInfo reasons of a Reserve the ledger's run guard refused.
RUN_REASONS = ("RUN_STEP_LIMIT", "RUN_DEADLINE", "RUN_REPETITION", "RUN_ENDED")


class RunEnded(LedgerError):
    """The ledger's run guard refused a new tool call: the run has ended.

    run_state is the run's state (RUN_STATE_STEP_LIMIT, RUN_STATE_DEADLINE,
    RUN_STATE_REPETITION, RUN_STATE_DONE, RUN_STATE_CANCELLED) and limit the
    limit this call reached ("max_steps", ...; empty when the run had ended
    before). fn did not run. Stop the run: it is no failure of the tool.
    """

    def __init__(self, err: LedgerError):
        super().__init__(err.code, err.message, err.info, err.retry_after, err.answer_lost)
        self.run_state = err.metadata.get("run_state", "")
        self.limit = err.metadata.get("limit", "")

    @property
    def status(self) -> str:
        """The run's end as an agent runtime names it: step_limit, deadline, repetition, done or cancelled."""
        return self.run_state.removeprefix("RUN_STATE_").lower()


class ToolFailed(Exception):
    """The operation failed for good (this call, or an earlier one replayed).

    detail is what the destination answered, as a FinalToolError gave it; str()
    leaves it out, so that logging the error does not log it.
    """

    def __init__(self, code: str, message: str, replayed: bool, receipt: str = "", detail: str = ""):
        # receipt: the ledger's signed receipt of the failure, when it signs receipts (docs/receipts.md).
        self.code, self.replayed, self.receipt, self.detail = code, replayed, receipt, detail
        super().__init__(f"tool failed ({code}): {message}")

    @classmethod
    def recorded(cls, failure: pb.Failure, replayed: bool, receipt: str) -> "ToolFailed":
        """The ToolFailed of a failure the ledger recorded."""
        return cls(failure.code, failure.message, replayed=replayed, receipt=receipt, detail=failure.detail)


class NeedsReconciliation(Exception):
    """Nobody knows whether the effect happened: ask the destination, then Reconcile."""

    def __init__(self, operation: pb.Operation, receipt: str = ""):
        # receipt: the ledger's signed receipt of the UNKNOWN state, when it signs receipts.
        self.operation, self.receipt = operation, receipt
        super().__init__(f"operation {operation.operation_id} needs reconciliation ({operation.reason})")


class NotRecorded(Exception):
    """The tool ran (it returned result, or raised tool_error) but the ledger did not record how it ended.

    The effect may exist. Use the result; never run the tool again under a new
    operation id. A retry under the same id waits for the claim's lease to end;
    an irreversible tool is then reconciled first. When the result cannot be
    encoded, or the ledger refuses it (the cause, __cause__, is a LedgerError
    INVALID_ARGUMENT: data over 64 KiB as JSON, a resource id over 256 bytes),
    the attempt is marked UNKNOWN at once: a retry is told to reconcile without
    waiting for the lease.
    """

    def __init__(self, cause: Exception, result: Outcome | None = None, tool_error: BaseException | None = None):
        self.result, self.tool_error = result, tool_error
        super().__init__(f"the ledger did not record how the tool ended: {cause}")


class ConflictingOutcome(NeedsReconciliation):
    """The tool applied its effect, but the ledger records another outcome for the operation.

    The claim was gone when the tool's result came (STALE_FENCING_TOKEN: its
    lease ended while renewals did not get through, and a reconciler, an
    operator or another attempt settled the operation since), or another
    outcome was recorded with its token (COMPLETION_CONFLICT). Unlike
    NotRecorded, nothing will reconcile this effect as applied: another
    attempt may have applied it again, and a retry may replay an outcome
    that is not this effect's. result is what the tool returned, attempt
    its attempt; operation is the record that stands, read after the
    refusal (record_read), or the claim as it was granted when that read
    failed; __cause__ is the refusal. Never retry: a human compares the
    destination with the record.
    """

    def __init__(self, result: Outcome, stands: pb.Operation | None, claim: pb.Operation):
        self.result, self.attempt, self.record_read = result, claim.attempt, stands is not None
        self.operation, self.receipt = stands if stands is not None else claim, ""
        records = (f"records {pb.State.Name(stands.state)} (attempt {stands.attempt})" if stands is not None
                   else "holds another outcome (the record could not be read)")
        Exception.__init__(self, f"attempt {claim.attempt} applied the effect of operation {claim.operation_id}, but "
                                 f"the ledger {records}: a human compares the destination with the record")


class _ClaimGone(Exception):
    """A failed attempt was refused because the claim was gone: the ledger's record says how the operation ended."""


# The refusals of a Complete that say the ledger holds another outcome.
_CONFLICT_REASONS = ("STALE_FENCING_TOKEN", "COMPLETION_CONFLICT")


def conflicting(err: NotRecorded) -> bool:
    """Whether a report was refused because the ledger holds another outcome (_CONFLICT_REASONS)."""
    cause = err.__cause__
    return isinstance(cause, LedgerError) and cause.reason in _CONFLICT_REASONS


class ToolTimedOut(Exception):
    """The tool did not return within its timeout (tool_timeout): it may still apply its effect.

    The attempt is marked UNKNOWN and left to reconciliation; whatever the
    tool returns later is discarded.
    """

    def __init__(self, operation_id: str, timeout: float):
        super().__init__(f"the tool did not return within {timeout}s: "
                         f"operation {operation_id} may have applied its effect")


class WaitBudgetSpent(TimeoutError):
    """call_tool's wait budget (wait) was spent before the tool could start.

    Another caller still held the claim (held), or the claim came too late and
    was returned unused (returned; False when the ledger could not take it
    back, and it lapses with its lease). The tool did not run: the operation
    may be retried under the same operation id.
    """

    def __init__(self, operation_id: str, wait: float, *, held: bool = False, returned: bool = False):
        self.operation_id, self.held, self.returned = operation_id, held, returned
        if held:
            what = f"operation {operation_id} is still held by another caller"
        else:
            what = (f"the claim on operation {operation_id} came too late: the tool did not run, and the claim "
                    + ("is returned unused" if returned else "could not be returned (it lapses with its lease)"))
        super().__init__(f"wait budget spent ({wait}s): {what}; it may be retried under the same operation id")


class Cancelled(Exception):
    """The caller cancelled call_tool (its cancel event was set) before the tool started.

    The tool did not run, and a claim the ledger granted all the same is
    returned unused: the operation may be retried under the same operation id.
    """

    def __init__(self, operation_id: str):
        self.operation_id = operation_id
        super().__init__(f"cancelled before the tool started: operation {operation_id} "
                         "may be retried under the same operation id")


class RetryableToolError(Exception):
    """Raise from fn only when the failure proves nothing was applied (HTTP 429, a refused connection).

    An HTTP 503 or a gRPC RESOURCE_EXHAUSTED or ABORTED may come after the
    effect: let those propagate (UNKNOWN), unless the destination guarantees
    they mean refused before processing.
    """


class LeaseEndedOnTheWay(RetryableToolError):
    """The claim's lease ended, or came within its margin of its end (see lease_margin), before the Reserve answer
    granting it arrived.

    The tool did not run: the claim is returned as a retryable attempt,
    proven not applied (failure code RETRYABLE_FAILURE_CODE; or, if the ledger
    cannot be reached, lapses with its lease), and the operation may be
    retried under the same id.
    """

    def __init__(self, operation_id: str):
        super().__init__(f"the claim's lease on operation {operation_id} ended, or was about to, before the answer "
                         "granting it arrived: the tool did not run; it may be retried under the same operation id")
        self.operation_id = operation_id


class FinalToolError(Exception):
    """Raise from fn when the tool failed for good (HTTP 400, a declined card).

    code is recorded as the operation's failure code, or "tool_failed" when
    it is missing (None) or empty, when the ledger refuses it (over 128 bytes,
    or with a control character) or when it cannot be sent, as in the Go SDK:
    the ToolFailed that call_tool raises carries the code recorded. The
    message is not sent to the ledger.

    detail, what the destination answered (its error body, which may quote
    the request), is recorded as the failure's detail: replays return it in
    ToolFailed.detail, and the ledger keeps it as result data, out of pages
    and logs. It is cut to the ledger's 64 KiB; one that is not a str is not
    recorded.
    """

    def __init__(self, code: str | None = "", message: str = "", detail: str = ""):
        self.code, self.detail = code, detail
        super().__init__(message or code or "")


def final_failure(claim: dict[str, Any], err: FinalToolError, code: str | None = None) -> pb.CompleteRequest:
    """The Complete that records err as the claim's final failure, under code (err.code when None).

    A code that is missing (None) or empty, or that cannot be sent (not a
    str, a lone surrogate), is recorded as DEFAULT_FAILURE_CODE, as in the
    Go SDK: the attempt still failed for good, and the claim is not left to
    expire into UNKNOWN.
    """
    detail = failure_detail(err.detail)
    code = err.code if code is None else code
    try:
        return pb.CompleteRequest(**claim, outcome=pb.OUTCOME_FAILED_FINAL,
                                  failure=pb.Failure(code=code or DEFAULT_FAILURE_CODE, detail=detail))
    except (TypeError, ValueError):
        return pb.CompleteRequest(**claim, outcome=pb.OUTCOME_FAILED_FINAL,
                                  failure=pb.Failure(code=DEFAULT_FAILURE_CODE, detail=detail))


def code_refused(err: NotRecorded, request: pb.CompleteRequest) -> bool:
    """Whether the ledger refused request's failure code (INVALID_ARGUMENT: over 128 bytes, a control character),
    so that the failure is recorded again under DEFAULT_FAILURE_CODE."""
    cause = err.__cause__
    return (isinstance(cause, LedgerError) and cause.code == grpc.StatusCode.INVALID_ARGUMENT
            and request.failure.code != DEFAULT_FAILURE_CODE)


def failure_detail(detail: object) -> str:
    """A FinalToolError's detail as the ledger takes it: valid UTF-8 of at most 64 KiB; '' when not a str."""
    if not isinstance(detail, str):
        return ""
    return detail.encode("utf-8", "replace")[:MAX_FAILURE_DETAIL].decode("utf-8", "ignore")


@dataclass
class Attempt:
    """What fn gets: the key to hand to the destination and the claim it runs under."""

    operation_id: str
    idempotency_key: str
    attempt: int
    fencing_token: int
    # Set at the tool timeout, when the claim is lost, when its lease is about to end with no renewal getting
    # through (see lease_margin) or when the caller cancels: stop the tool if you can.
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    # Set when the ledger says the claim is gone (its lease renewed too late).
    claim_lost: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class Finding:
    """What a reconciler learned from the destination about an operation whose outcome is unknown.

    kind is APPLIED (the effect exists: resource_id and data are its result),
    NOT_APPLIED (it does not: the operation may run again), ABANDON (it does
    not, and must not run again) or ESCALATE (the destination cannot tell: a
    human decides). note goes into the operation's history.
    """

    APPLIED: ClassVar[int] = pb.FINDING_APPLIED
    NOT_APPLIED: ClassVar[int] = pb.FINDING_NOT_APPLIED
    ABANDON: ClassVar[int] = pb.FINDING_ABANDON
    ESCALATE: ClassVar[int] = pb.FINDING_ESCALATE

    kind: int
    resource_id: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    note: str = ""


# A reconciler asks the destination whether the effect of an UNKNOWN operation exists. It only reads.
Reconciler = Callable[[pb.Operation], Finding]


@dataclass
class Outcome:
    """What call_tool returns: the recorded result, whether an earlier call produced it, and the
    ledger's signed receipt of it ("" when the ledger signs none; docs/receipts.md)."""

    resource_id: str
    data: dict[str, Any]
    replayed: bool
    operation: pb.Operation = field(repr=False)
    receipt: str = field(default="", repr=False)


def error_info(err: grpc.RpcError) -> tuple[error_details_pb2.ErrorInfo | None, float | None]:
    """Decodes the google.rpc.Status in the grpc-status-details-bin trailer.

    Returns the ErrorInfo (None when there is none) and the RetryInfo delay in
    seconds (None when there is none).
    """
    info, retry_after = None, None
    for key, value in err.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after = retry.retry_delay.ToTimedelta().total_seconds()
    return info, retry_after


def to_struct(value: Any, where: str) -> struct_pb2.Struct:
    """value, a dict, as a Struct; raises ValueError naming where and the type for anything else."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {type(value).__name__}; params and result data are dicts (JSON objects)")
    s = struct_pb2.Struct()
    s.update(value)
    return s


def exact_json(value: Any, where: str) -> Any:
    """value as the wire's JSON carries it exactly, tuples as lists.

    Raises ValueError naming where (a JSON pointer after it) and the kind,
    never the value, for what has no JSON form (a datetime, a Decimal, a
    set, a key that is not a string) and for what the wire's doubles would
    carry changed: an integer beyond 2^53 that is not its double's digits
    (2^53+1; 10**20 is) would reach the ledger as another number, as would
    a NaN or an infinity.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if abs(value) > 2**53 and not is_double_digits(value):
            raise ValueError(f"{where}: an integer beyond 2^53 that no double spells cannot be sent exactly; "
                             "send it as a string")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: NaN and infinities have no JSON form")
        return value
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise ValueError(f"{where}: a key that is not a string ({type(k).__name__}) has no JSON form")
        return {k: exact_json(x, f"{where}/{k}") for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [exact_json(x, f"{where}/{i}") for i, x in enumerate(value)]
    raise ValueError(f"{where}: {type(value).__name__} has no JSON form; send it as a string or a number")


def json_int(f: float) -> int:
    """The whole double f as the ledger's canonical JSON writes it below 1e21: its shortest digits (repr's)."""
    return int(decimal.Decimal(repr(f)))


def is_double_digits(n: int) -> bool:
    """Whether n is written as the ledger's canonical JSON writes its double (10**20; not 2**60).

    The Go SDK and the HTTP API take such integers, as the same request.
    """
    if abs(n) >= 10**21:  # the canonical JSON of a double this large has an exponent
        return False
    return json_int(float(n)) == n


def json_numbers(value: Any) -> Any:
    """value with its numbers as json.loads reads the ledger's JSON of them.

    The wire carries every number as a double, so a tool's 2 arrives as 2.0;
    the canonical JSON the ledger holds writes it "2" (and -0.0 "0"), which
    json.loads reads as the int 2. Beyond 2^53 that JSON has the double's
    shortest digits (2^60's double is "1152921504606847000"), and so does
    the int. Doubles of 1e21 and beyond, written with an exponent, stay
    floats.
    """
    if isinstance(value, dict):
        return {k: json_numbers(x) for k, x in value.items()}
    if isinstance(value, list):
        return [json_numbers(x) for x in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return json_int(value)
    return value


def params_struct(params: dict[str, Any]) -> struct_pb2.Struct:
    """The parameters as a Struct, refusing what the wire's doubles would round.

    Two different amounts could otherwise share a fingerprint (exact_json).
    """
    return to_struct(exact_json(params, "params"), "params")


def check_transport(target: str, api_key: str, channel: Any, credentials: Any) -> None:
    """Refuses to send api_key in clear beyond this machine, as the Go SDK does.

    Without channel or credentials (TLS) the channel has none, so a key
    goes only to a target on this machine (loopback_target): else
    ValueError. A channel of the caller's is the caller's to secure;
    channel and credentials together are a TypeError.
    """
    if channel is not None and credentials is not None:
        raise TypeError("give channel or credentials, not both: credentials make the channel")
    if api_key and channel is None and credentials is None and not loopback_target(target):
        raise ValueError(f"api_key: refusing to send an API key without TLS to {target!r}, which is not this machine "
                         "(loopback or a Unix socket); pass credentials=grpc.ssl_channel_credentials(...)")


def loopback_target(target: str) -> bool:
    """Whether a gRPC target names this machine: a Unix socket, or a host on loopback."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    target = target.split(":///", 1)[-1]
    for scheme in ("dns:", "ipv4:", "ipv6:"):
        target = target.removeprefix(scheme)
    if target.startswith("["):
        host = target[1:target.find("]")]
    else:
        host = target.rsplit(":", 1)[0] if target.count(":") == 1 else target
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_call(fn: Any, wait: Any, tool_timeout: Any) -> None:
    """Refuses a call_tool that cannot run, before anything is sent.

    A claim with no tool to run would be left UNKNOWN though nothing ran:
    an fn that is not callable raises TypeError. A wait or tool_timeout
    that is not a positive number of seconds raises ValueError (with no
    wait, every claim comes too late to run fn).
    """
    if not callable(fn):
        raise TypeError(f"fn: {type(fn).__name__} is not callable; call_tool runs fn(attempt)")
    seconds("wait", wait)
    seconds("tool_timeout", tool_timeout)


def seconds(name: str, value: Any) -> None:
    """Raises ValueError unless value is a positive, finite number (of seconds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: a positive number of seconds is required")


def check_options(call_timeout: Any, ledger_retries: Any, reconcilers: Any) -> None:
    """Refuses a client's options that would fail every call (ValueError), or
    every reconciliation (a reconciler that is not callable: TypeError)."""
    seconds("call_timeout", call_timeout)
    if isinstance(ledger_retries, bool) or not isinstance(ledger_retries, int) or ledger_retries < 0:
        raise ValueError("ledger_retries: a whole number, 0 or more, is required")
    for tool, r in (reconcilers or {}).items():
        if not callable(r):
            raise TypeError(f"reconcilers[{tool!r}]: {type(r).__name__} is not callable")


def data_struct(data: dict[str, Any]) -> struct_pb2.Struct:
    """Result data as a Struct, refusing what the wire's doubles would round.

    A replay would otherwise hand on another number than the tool's (an id
    2^53+1 recorded as 2^53), so such a result is not recorded (exact_json).
    """
    return to_struct(exact_json(data, "data"), "data")


def resource_id_of(value: Any) -> str:
    """A result's resource id as the ledger records it: a str as it is, an int as its digits, None as "".

    Raises TypeError for anything else (a float, a bool), which has no one spelling.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"resource_id: {type(value).__name__} is not an id; return a str or an int")


def tool_result(produced: Any) -> tuple[str, dict[str, Any]]:
    """The resource id and data of what fn returned: {"resource_id": ..., "data": {...}}, or None for neither.

    Raises TypeError, naming the type, for anything else: a str fn returned would otherwise be lost.
    """
    if produced is None:
        return "", {}
    if not isinstance(produced, dict):
        raise TypeError(f"fn returned {type(produced).__name__}; return {{'resource_id': ..., 'data': {{...}}}}")
    data = produced.get("data") or {}
    if not isinstance(data, dict):
        raise TypeError(f"data: {type(data).__name__}; the result data is a dict")
    return resource_id_of(produced.get("resource_id")), data


def reconcile_request(op: pb.Operation, found: Finding) -> pb.ReconcileRequest:
    """The Reconcile of op that records found.

    Raises ValueError or TypeError for a finding the wire cannot carry as it is (exact_json, resource_id_of).
    """
    request = pb.ReconcileRequest(operation_id=op.operation_id, finding=found.kind, note=found.note,
                                  fencing_token=op.fencing_token)
    if found.kind == pb.FINDING_APPLIED:
        request.result.CopyFrom(pb.Result(resource_id=resource_id_of(found.resource_id), data=data_struct(found.data)))
    return request


# The backoff between Reserves while another caller holds the claim, in seconds.
_WAIT_BACKOFF_BASE = 0.1
_WAIT_BACKOFF_MAX = 5.0


def lease_margin(lease: float) -> float:
    """How long (seconds) before its lease's end, as this process tells it, an attempt whose renewals do not get
    through is stopped: a tenth of the lease (seconds), at most 1 s, as in the Go SDK.

    The ledger lets another holder claim the operation once the lease has
    ended on the store's clock, a timer may fire late on a busy machine, and
    the tool takes a moment to see attempt.cancelled: stopping it early keeps
    it from running on a claim that is someone else's.
    """
    return min(lease / 10, 1.0)


def _lease(op: pb.Operation) -> float:
    """The length (seconds) of the claim's lease in op; 0 when op has none."""
    if not op.HasField("lease_expires_at") or not op.HasField("updated_at"):
        return 0.0
    return (op.lease_expires_at.ToNanoseconds() - op.updated_at.ToNanoseconds()) / 1e9


def _lease_end(op: pb.Operation, asked: float) -> float:
    """When the claim in op, asked for at asked, ends at the latest, on time.monotonic()'s clock.

    The earlier of the end the ledger reported (on the store's clock) and a
    lease after the claim (or its renewal) was asked for: the store's clock
    may be ahead of this one, and the lease never began before it was asked for.
    """
    reported = op.lease_expires_at.ToNanoseconds() / 1e9 - time.time() + time.monotonic()
    return min(reported, asked + _lease(op))


def in_progress_delay(n: int, retry_after: float, rand: Callable[[], float] = random.random) -> float:
    """How long call_tool waits before its next Reserve after the nth (n >= 1) DECISION_IN_PROGRESS.

    retry_after is that answer's retry_after, in seconds. The wait is the
    ledger's retry_after or a backoff doubling from 0.1 s up to 5 s, whichever
    is longer, plus up to half of that again at random (rand() in [0, 1)), so
    that callers waiting on one claim spread out instead of asking together.
    """
    backoff = min(_WAIT_BACKOFF_BASE * 2 ** min(max(n, 1) - 1, 30), _WAIT_BACKOFF_MAX)
    delay = max(retry_after, backoff)
    return delay + rand() * delay / 2


class _BearerKey(grpc.UnaryUnaryClientInterceptor):
    """Sends the API key with every call, as "authorization: Bearer <key>"."""

    def __init__(self, key: str):
        self._metadata = (("authorization", "Bearer " + key),)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(_CallDetails(client_call_details, self._metadata), request)


class _CallDetails(grpc.ClientCallDetails):
    """A call's details with extra metadata."""

    def __init__(self, d: grpc.ClientCallDetails, extra: tuple):
        self.method, self.timeout, self.credentials = d.method, d.timeout, d.credentials
        self.wait_for_ready, self.compression = getattr(d, "wait_for_ready", None), getattr(d, "compression", None)
        self.metadata = tuple(d.metadata or ()) + extra


class Ledger:
    """A client of ledger.v1.LedgerService for one agent runtime.

    reconcilers maps a tool to the function that asks its destination
    whether an UNKNOWN operation's effect exists (see Finding): call_tool
    asks it instead of raising NeedsReconciliation, and records its finding.
    api_key is sent as "authorization: Bearer <key>"; beyond this machine
    only over TLS: credentials (grpc.ssl_channel_credentials(...)) make the
    channel a TLS one, or channel is one of the caller's (check_transport).

    clock and sleep are the clock of the waits between ledger calls (tests
    pass their own; without one, a wait ends early when the call is
    cancelled); call deadlines, leases and the tool timeout keep the real one.
    """

    def __init__(self, target: str, *, channel: grpc.Channel | None = None, call_timeout: float = 5.0,
                 ledger_retries: int = 3, log: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] | None = None,
                 reconcilers: dict[str, Reconciler] | None = None, api_key: str = "",
                 interceptors: list[grpc.UnaryUnaryClientInterceptor] | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        check_transport(target, api_key, channel, credentials)
        check_options(call_timeout, ledger_retries, reconcilers)
        if channel is None and credentials is not None:
            channel = grpc.secure_channel(target, credentials)
        self.channel = channel or grpc.insecure_channel(target)
        calls = self.channel
        if api_key:
            calls = grpc.intercept_channel(calls, _BearerKey(api_key))
        if interceptors:
            calls = grpc.intercept_channel(calls, *interceptors)
        self.stub = ledger_pb2_grpc.LedgerServiceStub(calls)
        self.reconcilers = dict(reconcilers or {})
        self.call_timeout = call_timeout
        self.ledger_retries = ledger_retries
        self.log = log or (lambda _msg: None)
        self.clock = clock
        self.sleep = sleep

    def close(self) -> None:
        self.channel.close()

    def _pause(self, seconds: float, cancel: threading.Event | None, operation_id: str) -> None:
        """Waits seconds on this ledger's clock.

        Raises Cancelled (for operation_id) when cancel is set, before or during the wait.
        """
        if cancel is not None and cancel.is_set():
            raise Cancelled(operation_id)
        if self.sleep is not None:
            self.sleep(seconds)
        elif cancel is not None:
            cancel.wait(seconds)
        else:
            time.sleep(seconds)
        if cancel is not None and cancel.is_set():
            raise Cancelled(operation_id)

    def rpc(self, method: str, request, cancel: threading.Event | None = None, until: float | None = None):
        """Calls one ledger RPC, repeating it while the ledger is unavailable or asks to back off.

        Any other error becomes a LedgerError carrying its ErrorInfo reason.
        When cancel (optional) is set, the wait before a repeat ends with
        Cancelled; a call on its way is not cut off. until (optional, on
        time.monotonic()'s clock) cuts the calls and their repeats there: a
        call still unanswered then fails with DEADLINE_EXCEEDED.
        """
        call = getattr(self.stub, method)
        lost = False  # a try got no answer: the ledger may have done what was asked
        for attempt in range(self.ledger_retries + 1):
            timeout = self.call_timeout if until is None else min(self.call_timeout, until - time.monotonic())
            if timeout <= 0:
                raise LedgerError(grpc.StatusCode.DEADLINE_EXCEEDED, "no time left for the call", None, None, lost)
            try:
                return call(request, timeout=timeout)
            except grpc.RpcError as err:
                lost = lost or err.code() in _UNANSWERED_CODES
                info, retry_after = error_info(err)
                repeat = _repeatable(err.code(), info.reason if info else "", info.domain if info else "")
                if repeat and attempt < self.ledger_retries:
                    pause = retry_after or 0.1 * 2 ** attempt
                    if until is not None:
                        pause = max(min(pause, until - time.monotonic()), 0)
                    self._pause(pause, cancel, getattr(request, "operation_id", ""))
                    continue
                raise LedgerError(err.code(), err.details() or "", info, retry_after, lost) from None
        raise AssertionError("unreachable")

    def lookup(self, operation_id: str) -> pb.Operation:
        return self.rpc("Lookup", pb.LookupRequest(operation_id=operation_id)).operation

    def start_run(self, run_id: str, *, max_steps: int = 0, deadline: float = 0.0, max_repeats: int = 0,
                  max_irreversible: int = 0) -> pb.Run:
        """Starts run_id in the ledger, whose run guard then counts the run's tool calls.

        Limits left at 0 are the tenant policy's. max_repeats bounds the calls
        of one tool with the same parameters (2 refuses the third); deadline
        is in seconds from now. A repeat with the same limits returns the run.
        call_tool(run_id=...) raises RunEnded for the call past a limit.
        """
        limits = pb.RunLimits(max_steps=max_steps, max_repeats=max_repeats, max_irreversible=max_irreversible)
        if deadline:
            limits.deadline.FromTimedelta(datetime.timedelta(seconds=deadline))
        return self.rpc("StartRun", pb.StartRunRequest(run_id=run_id, limits=limits)).run

    def get_run(self, run_id: str) -> pb.Run:
        return self.rpc("GetRun", pb.GetRunRequest(run_id=run_id)).run

    def end_run(self, run_id: str, state: int = pb.RUN_STATE_DONE, reason: str = "") -> pb.Run:
        """Ends run_id as RUN_STATE_DONE or RUN_STATE_CANCELLED: the ledger admits no new call in it."""
        return self.rpc("EndRun", pb.EndRunRequest(run_id=run_id, state=state, reason=reason)).run

    def call_tool(self, *, operation_id: str, tool: str, params: dict[str, Any], permit_id: str,
                  fn: Callable[[Attempt], dict[str, Any]], effect: int = pb.EFFECT_UNSPECIFIED,
                  wait: float = 30.0, tool_timeout: float = 10.0, cancel: threading.Event | None = None,
                  run_id: str = "", compensates: str = "") -> Outcome:
        """Runs fn at most once for operation_id, whoever retries it and however often.

        fn returns {"resource_id": str, "data": dict}. It raises
        RetryableToolError when nothing was applied (recorded as a retryable
        failure, code RETRYABLE_FAILURE_CODE), FinalToolError when the
        tool failed for good, and anything else when it cannot tell (a
        timeout): the ledger then records UNKNOWN and the operation must be
        reconciled before an irreversible tool runs again.
        fn runs on a thread of its own and has tool_timeout seconds to return:
        then attempt.cancelled is set, the lease is no longer renewed, the
        attempt is marked UNKNOWN and call_tool raises ToolTimedOut without
        waiting for fn.
        attempt.cancelled is also set lease_margin before the claim's lease
        ends while no renewal gets through (see _keep_leased); a Reserve
        answer that arrives within that margin does not start fn: the claim
        is returned as a retryable attempt, proven not applied, and call_tool
        raises LeaseEndedOnTheWay.
        When the ledger cannot record how fn ended, call_tool raises
        NotRecorded: fn ran, and must not run again under a new operation id.
        When it refuses fn's result because it holds another outcome (the
        claim was gone by then), call_tool raises ConflictingOutcome: stop,
        a human compares the destination with the record. A failure
        (final or retryable) refused so is not the record either: call_tool
        reserves again and answers as the record says.
        A result the ledger refuses (INVALID_ARGUMENT: over its size limits)
        or that cannot be encoded is never recorded: the attempt is marked
        UNKNOWN, and call_tool raises NotRecorded with it.
        While another caller holds the claim, call_tool reserves again after
        a backoff (see in_progress_delay) until wait seconds are up, then
        raises WaitBudgetSpent (a TimeoutError). wait bounds the time from the
        call to the start of fn: a claim that comes when it is up (a Reserve
        answered late, or the last one, at the end of a wait) is returned
        unused (caller_gave_up) and call_tool raises WaitBudgetSpent; fn does
        not run.
        When a Reserve gets no answer (UNAVAILABLE, DEADLINE_EXCEEDED after
        the repeats, or before repeats refused for the rate), call_tool raises
        its LedgerError, fn does not run, and a claim the ledger granted all
        the same is returned (see _return_lost_claim). A Reserve refused
        because the tenant holds as many unresolved operations as it may
        (RESOURCE_EXHAUSTED, reason UNRESOLVED_LIMIT) is not repeated:
        call_tool raises its LedgerError at once, and fn does not run; retry
        later under the same operation id, once operations are resolved.
        cancel (a threading.Event, optional) cancels the call when it is set.
        Before fn starts, call_tool raises Cancelled: no further Reserve goes
        out, waits end at once, fn does not run, and a claim that comes all
        the same (a Reserve on its way is not cut off) is returned unused, as
        above. While fn runs, attempt.cancelled is set; call_tool still waits
        for fn (at most tool_timeout) and records how it ended, as without a
        cancellation: what fn returns is returned, what it raises is raised.
        Parameters the wire would round (an integer beyond 2^53) raise
        ValueError before the ledger is asked, as do a wait or tool_timeout
        that is not positive; an fn that is not callable raises TypeError.
        With run_id, the call is a step of that run: when the ledger's run
        guard refuses it (the run started with start_run, or governed by the
        tenant's policy, has ended or this call would pass its limit),
        call_tool raises RunEnded and fn does not run. A retry of a call the
        run admitted is never refused.
        With compensates, the call reverses that operation (a refund of a
        charge): the ledger links both records, and refuses (LedgerError,
        reason NOT_COMPENSABLE) before fn runs when that operation did not
        succeed.
        When the outcome of an earlier attempt is unknown (DECISION_RECONCILE),
        the tool's reconciler (reconcilers=...) is asked, unless a human was
        (an earlier finding escalated it: NeedsReconciliation, and a human
        settles it): APPLIED records its result and call_tool returns it
        (replayed: this call did not run fn); NOT_APPLIED records that and
        reserves again, so fn may run; ABANDON records it and raises
        ToolFailed; ESCALATE, a reconciler that fails, a finding the ledger
        cannot record (its __cause__ says why), or no reconciler, raise
        NeedsReconciliation.
        """
        check_call(fn, wait, tool_timeout)
        holder = secrets.token_hex(16)  # one per call, never a hostname or pid
        deadline = self.clock() + wait
        waits = 0
        request = pb.ReserveRequest(operation_id=operation_id, tool=tool, params=params_struct(params),
                                    permit_id=permit_id, holder=holder, effect=effect, run_id=run_id,
                                    compensates=compensates)
        reconciled = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled(operation_id)
            asked = time.monotonic()
            try:
                resp = self.rpc("Reserve", request, cancel)
            except LedgerError as err:
                if err.reason in RUN_REASONS:
                    raise RunEnded(err) from None
                # The caller gives up on a Reserve that got no answer (the
                # last try, or one before repeats refused for the rate): the
                # ledger may have granted the claim all the same.
                if err.answer_lost:
                    self._return_lost_claim(request)
                raise
            except Cancelled:
                # The caller cancelled while the Reserve was repeated: the
                # ledger may have granted the claim all the same.
                self._return_lost_claim(request)
                raise
            op = resp.operation
            self.log(f"Reserve {operation_id}: {pb.Decision.Name(resp.decision)} "
                     f"({pb.State.Name(op.state)}, attempt {op.attempt}, fencing token {op.fencing_token})")
            if cancel is not None and cancel.is_set():
                # The caller cancelled while the Reserve was on its way: the
                # tool does not run, and a claim the answer brings is returned.
                if resp.decision == pb.DECISION_EXECUTE:
                    self._return_claim(op)
                raise Cancelled(operation_id)

            if resp.decision == pb.DECISION_REPLAY:
                if op.state == pb.STATE_SUCCEEDED:
                    return self._outcome(op, replayed=True, receipt=resp.receipt)
                raise ToolFailed.recorded(op.failure, replayed=True, receipt=resp.receipt)
            if resp.decision == pb.DECISION_IN_PROGRESS:
                # Another caller's live claim: Reserve again after a backoff
                # (see in_progress_delay), the last time when wait is up.
                left = deadline - self.clock()
                if left <= 0:
                    raise WaitBudgetSpent(operation_id, wait, held=True)
                waits += 1
                self._pause(min(in_progress_delay(waits, resp.retry_after.ToTimedelta().total_seconds()), left),
                            cancel, operation_id)
                continue
            if resp.decision == pb.DECISION_RECONCILE:
                reconciled += 1
                if reconciled > 3:  # each NOT_APPLIED met UNKNOWN again: leave it to a human
                    raise NeedsReconciliation(op, resp.receipt)
                done = self._reconcile(tool, op, resp.receipt)
                if done is None:
                    continue  # not applied: reserve again
                return done
            if resp.decision != pb.DECISION_EXECUTE:
                raise LedgerError(grpc.StatusCode.UNKNOWN, f"unexpected decision {resp.decision}", None)
            if deadline - self.clock() <= 0:
                # The caller's wait is over: the tool does not run behind its
                # back. The claim is returned, rather than left to expire into
                # UNKNOWN.
                raise WaitBudgetSpent(operation_id, wait, returned=self._return_claim(op))
            if _lease(op) > 0 and time.monotonic() >= _lease_end(op, asked) - lease_margin(_lease(op)):
                # The answer took longer than the lease, less its margin: the
                # claim may be someone else's already, or the tool would be
                # stopped at once. It does not run; the claim is returned as a
                # retryable attempt, proven not applied (when that fails, it
                # lapses with its lease: the tool did not run all the same).
                try:
                    self.rpc("Complete", pb.CompleteRequest(
                        operation_id=op.operation_id, fencing_token=op.fencing_token,
                        outcome=pb.OUTCOME_FAILED_RETRYABLE, failure=pb.Failure(code=RETRYABLE_FAILURE_CODE)))
                except LedgerError as err:
                    self.log(f"returning the claim of {op.operation_id}: {err.code.name} {err.reason}")
                raise LeaseEndedOnTheWay(operation_id)
            try:
                return self._execute(op, fn, tool_timeout, cancel, asked)
            except _ClaimGone:
                # Reserve again: it replays the outcome that stands, waits for
                # the attempt that holds the operation, or claims it anew.
                continue

    def _reconcile(self, tool: str, op: pb.Operation, receipt: str = "") -> Outcome | None:
        """Asks tool's reconciler about op and records its finding.

        Returns the recorded outcome (APPLIED), None (NOT_APPLIED: reserve
        again), or raises ToolFailed (ABANDON) or NeedsReconciliation.
        """
        reconciler = self.reconcilers.get(tool)
        if reconciler is None or op.needs_review:
            # Once a human was asked (ESCALATE), a human settles it.
            raise NeedsReconciliation(op, receipt)
        try:
            found = reconciler(op)
        except Exception as err:  # noqa: BLE001 - a reconciler that fails decides nothing
            self.log(f"reconciler of {tool} for {op.operation_id}: {err!r}")
            raise NeedsReconciliation(op, receipt) from err
        try:
            request = reconcile_request(op, found)
        except (AttributeError, TypeError, ValueError) as err:
            self.log(f"reconciler of {tool} for {op.operation_id}: a finding that cannot be sent: {err}")
            raise NeedsReconciliation(op, receipt) from err
        try:
            got = self.rpc("Reconcile", request)
        except LedgerError as err:
            if err.code == grpc.StatusCode.INVALID_ARGUMENT:
                # The ledger will not take the finding (data over 64 KiB, an id over 256 bytes): it decides nothing.
                self.log(f"reconciler of {tool} for {op.operation_id}: the ledger refused its finding: {err}")
                raise NeedsReconciliation(op, receipt) from err
            if err.reason not in ("ALREADY_RESOLVED", "STALE_FENCING_TOKEN"):
                raise
            # someone else resolved it: what stands is the answer
            got = self.rpc("Lookup", pb.LookupRequest(operation_id=op.operation_id))
        rec = got.operation
        self.log(f"Reconcile {op.operation_id}: {pb.Finding.Name(found.kind)} -> {pb.State.Name(rec.state)}")
        return self._settled(rec, got.receipt)

    @staticmethod
    def _settled(rec: pb.Operation, receipt: str) -> Outcome | None:
        """The answer of a reconciled operation: its outcome, its failure or UNKNOWN raised, None for PENDING."""
        if rec.state == pb.STATE_SUCCEEDED:
            return Ledger._outcome(rec, replayed=True, receipt=receipt)
        if rec.state == pb.STATE_FAILED_FINAL:
            raise ToolFailed.recorded(rec.failure, replayed=True, receipt=receipt)
        if rec.state == pb.STATE_UNKNOWN:
            raise NeedsReconciliation(rec, receipt)
        return None

    def _return_claim(self, op: pb.Operation) -> bool:
        """Returns a claim the caller will not use.

        The claim is completed as a retryable failure proven not applied
        (caller_gave_up), so the operation is PENDING, free for a retry.
        Returns whether the ledger took it back; when it did not, the claim
        lapses with its lease.
        """
        try:
            self.rpc("Complete", pb.CompleteRequest(
                operation_id=op.operation_id, fencing_token=op.fencing_token,
                outcome=pb.OUTCOME_FAILED_RETRYABLE, failure=pb.Failure(code=CALLER_GAVE_UP)))
        except LedgerError as err:
            self.log(f"returning the claim of {op.operation_id}: {err.code.name} {err.reason}")
            return False
        self.log(f"Complete {op.operation_id}: the claim is returned unused")
        return True

    def _read(self, operation_id: str) -> pb.Operation | None:
        """The operation's record, or None when it cannot be read."""
        try:
            return self.lookup(operation_id)
        except LedgerError as err:
            self.log(f"Lookup {operation_id}: {err.code.name} {err.reason}")
            return None

    def _return_lost_claim(self, request: pb.ReserveRequest) -> None:
        """Returns the claim a Reserve (request) may have been granted though its answer never came back.

        Left alone, the claim would run until its lease ends and then turn an
        irreversible operation UNKNOWN, calling for the reconciliation of an
        attempt that never ran. Only a RUNNING record is touched: Reserve
        again under the same holder recovers this call's claim
        (DECISION_EXECUTE, same fencing token) or says another caller holds
        it; the recovered claim is completed as a retryable failure proven not
        applied (caller_gave_up), and the operation is PENDING, free for a
        retry. A record that does not exist (the Reserve never arrived) is not
        created. Best effort, each call once, all within one call timeout: a
        failure leaves the claim to its lease, as before.
        """
        end = time.monotonic() + self.call_timeout

        def left() -> float:
            return max(end - time.monotonic(), 0.001)

        try:
            record = self.stub.Lookup(pb.LookupRequest(operation_id=request.operation_id), timeout=left()).operation
            if record.state != pb.STATE_RUNNING:
                return
            resp = self.stub.Reserve(request, timeout=left())
            if resp.decision != pb.DECISION_EXECUTE:
                return
            self.stub.Complete(pb.CompleteRequest(
                operation_id=request.operation_id, fencing_token=resp.operation.fencing_token,
                outcome=pb.OUTCOME_FAILED_RETRYABLE, failure=pb.Failure(code=CALLER_GAVE_UP)), timeout=left())
            self.log(f"Complete {request.operation_id}: the claim granted to a Reserve without an answer "
                     "is returned unused")
        except grpc.RpcError as err:
            self.log(f"returning the claim of {request.operation_id}: {err.code().name}")

    def _execute(self, op: pb.Operation, fn: Callable[[Attempt], dict[str, Any]], tool_timeout: float,
                 cancel: threading.Event | None, asked: float) -> Outcome:
        attempt = Attempt(operation_id=op.operation_id, idempotency_key=op.operation_id,
                          attempt=op.attempt, fencing_token=op.fencing_token)
        claim = {"operation_id": op.operation_id, "fencing_token": op.fencing_token}
        stop_renewing = self._keep_leased(op, attempt, asked)
        try:
            try:
                produced = self._run(fn, attempt, tool_timeout, cancel)
            finally:
                stop_renewing.set()  # fn returned, or the timeout passed: the lease then lapses on its own
        except RetryableToolError as err:
            self._report_failure(pb.CompleteRequest(**claim, outcome=pb.OUTCOME_FAILED_RETRYABLE,
                                                    failure=pb.Failure(code=RETRYABLE_FAILURE_CODE)), err)
            raise
        except FinalToolError as err:
            request = final_failure(claim, err)
            try:
                done = self._report_failure(request, err)
            except NotRecorded as not_recorded:
                if not code_refused(not_recorded, request):
                    raise
                done = self._report_failure(final_failure(claim, err, DEFAULT_FAILURE_CODE), err)
            raise ToolFailed.recorded(done.operation.failure, replayed=False, receipt=done.receipt) from err
        except BaseException as err:
            # A timeout, a crash of the tool: nobody knows whether it applied.
            reason = (f"no answer within the tool timeout ({tool_timeout}s)" if isinstance(err, ToolTimedOut)
                      else "the tool ended without an answer")
            self._report("MarkUnknown", pb.MarkUnknownRequest(**claim, reason=reason), tool_error=err)
            raise
        ran = None
        try:
            rid, data = tool_result(produced)
            ran = Outcome(resource_id=rid, data=data, replayed=False, operation=op)
            result = pb.Result(resource_id=ran.resource_id, data=data_struct(ran.data))
        except (AttributeError, TypeError, ValueError) as err:
            # The effect happened but its result cannot be sent: leave it to
            # reconciliation rather than record a result that is not the tool's.
            with contextlib.suppress(NotRecorded):
                self._report("MarkUnknown", pb.MarkUnknownRequest(**claim, reason="the result cannot be encoded"))
            raise NotRecorded(err, result=ran) from err
        try:
            done = self._report("Complete", pb.CompleteRequest(**claim, outcome=pb.OUTCOME_SUCCEEDED, result=result),
                                result=ran)
        except NotRecorded as err:
            if conflicting(err):
                raise ConflictingOutcome(ran, self._read(op.operation_id), op) from err.__cause__
            cause = err.__cause__
            if isinstance(cause, LedgerError) and cause.code == grpc.StatusCode.INVALID_ARGUMENT:
                # The ledger refused the result (data over its 64 KiB limit as
                # JSON, a resource id over 256 bytes): it will not take it on a
                # repeat either. Leave the effect to reconciliation now, rather
                # than when the lease ends.
                refused = pb.MarkUnknownRequest(**claim, reason="result data refused by the ledger")
                with contextlib.suppress(NotRecorded):
                    self._report("MarkUnknown", refused)
            raise
        self.log(f"Complete {op.operation_id}: {pb.State.Name(done.operation.state)}")
        return self._outcome(done.operation, replayed=False, receipt=done.receipt)

    # How often _run looks at the caller's cancel event while the tool runs, in seconds.
    _CANCEL_POLL = 0.05

    @staticmethod
    def _run(fn: Callable[[Attempt], dict[str, Any]], attempt: Attempt, timeout: float,
             cancel: threading.Event | None = None) -> dict[str, Any]:
        """Runs fn(attempt) on a thread of its own and returns what it returns, or raises what it raises.

        A hung tool is not waited for: at the timeout attempt.cancelled is set
        and ToolTimedOut raised; what fn returns after that is discarded. When
        cancel is set first, attempt.cancelled is set and fn is still waited
        for, until the timeout.
        """
        ended, box = threading.Event(), {}

        def run() -> None:
            try:
                box["result"] = fn(attempt)
            except BaseException as err:  # noqa: BLE001 - raised again on the caller's thread
                box["error"] = err
            ended.set()

        # The tool sees the caller's context variables (a tracing span, say), as if run in place.
        ctx = contextvars.copy_context()
        threading.Thread(target=ctx.run, args=(run,), name=f"tool {attempt.operation_id}", daemon=True).start()
        end = time.monotonic() + timeout
        while not ended.is_set():
            left = end - time.monotonic()
            if left <= 0:
                attempt.cancelled.set()
                raise ToolTimedOut(attempt.operation_id, timeout)
            if cancel is not None and cancel.is_set():
                attempt.cancelled.set()  # passed on to the tool; its outcome is still awaited
                cancel = None
            ended.wait(left if cancel is None else min(left, Ledger._CANCEL_POLL))
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _report(self, method: str, request, result: Outcome | None = None, tool_error: BaseException | None = None):
        """Records how the tool ended (Complete or MarkUnknown, repeated like every ledger call).

        When that fails, the effect may exist but the ledger does not say so:
        NotRecorded, with what the tool returned or raised.
        """
        try:
            return self.rpc(method, request)
        except LedgerError as err:
            raise NotRecorded(err, result=result, tool_error=tool_error) from err

    def _report_failure(self, request: pb.CompleteRequest, err: Exception):
        """Records a failed attempt (see _report); raises _ClaimGone when the claim was gone by then."""
        try:
            return self._report("Complete", request, tool_error=err)
        except NotRecorded as not_recorded:
            if conflicting(not_recorded):
                raise _ClaimGone() from err
            raise

    def _keep_leased(self, op: pb.Operation, attempt: Attempt, asked: float) -> threading.Event:
        """Renews the claim in op, asked for at asked (time.monotonic()), while the tool runs, until the returned
        event is set.

        Two thirds of the lease are always left, so nobody else finds it
        expired (and reconciles it, or runs the tool again) while the tool is
        still at work: first when the lease is down to two thirds, which is at
        once for a claim recovered late in its lease, then every third of the
        lease after each renewal. attempt.claim_lost and attempt.cancelled are
        set when the ledger says the claim is gone. attempt.cancelled is also
        set when the lease nears its end (see _lease_end) while no renewal
        gets through (the ledger unreachable, or a renewal still unanswered
        then, which is cut there): lease_margin before that end, as in the Go
        SDK, because the claim may be someone else's once it ends.
        """
        stop = threading.Event()
        lease = _lease(op)
        if lease <= 0:
            return stop
        margin, period = lease_margin(lease), max(lease / 3, 0.01)
        end = _lease_end(op, asked)

        def renew() -> None:
            nonlocal end
            wait = min(max(end - time.monotonic() - lease * 2 / 3, 0), period)
            while not stop.wait(wait):
                sent = time.monotonic()
                try:
                    now = self.rpc("Renew", pb.RenewRequest(operation_id=op.operation_id,
                                                            fencing_token=op.fencing_token), until=end - margin)
                    end = sent + lease
                    if now.operation.HasField("lease_expires_at"):
                        end = min(end, _lease_end(now.operation, sent))
                except LedgerError as err:
                    self.log(f"Renew {op.operation_id}: {err}")
                    if not _repeatable(err.code, err.reason, err.domain):  # STALE_FENCING_TOKEN, NOT_FOUND: gone
                        attempt.claim_lost.set()
                        attempt.cancelled.set()
                        return
                    if time.monotonic() >= end - margin:
                        self.log(f"Renew {op.operation_id}: the lease is about to end with no renewal getting "
                                 "through: the tool is stopped")
                        attempt.cancelled.set()
                        return
                # After a failed renewal, try again by the time the tool must stop at the latest.
                wait = min(period, max(end - margin - time.monotonic(), 0))

        threading.Thread(target=renew, name=f"renew {op.operation_id}", daemon=True).start()
        return stop

    @staticmethod
    def _outcome(op: pb.Operation, replayed: bool, receipt: str = "") -> Outcome:
        return Outcome(resource_id=op.result.resource_id,
                       data=json_numbers(json_format.MessageToDict(op.result.data)),
                       replayed=replayed, operation=op, receipt=receipt)
