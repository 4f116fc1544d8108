#!/usr/bin/python3
"""The failure paths of the opledger package (clients/python), against a running ledgerd whose policy
gives tickets.slow a lease of 2s and tickets.flaky two attempts (README.md
shows it; internal/polyglot starts one so):

    /usr/bin/python3 examples/python/faults.py [ADDRESS]    (default $LEDGER_ADDR or 127.0.0.1:50051)

Each scenario counts how often the fake destination applied the effect.
Faults in the ledger's answers are injected by wrapping the stub's method;
everything else is the real service. It exits non-zero when any check fails.
"""

from __future__ import annotations

import datetime
import faulthandler
import itertools
import os
import signal
import sys
import threading
import time
import traceback
import uuid

sys.dont_write_bytecode = True  # leave no __pycache__ in the repository
# The package from this repository, unless it is installed (pip install ./clients/python).
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))

import grpc  # noqa: E402

from opledger.client import (  # noqa: E402
    DOMAIN, Attempt, Cancelled, FinalToolError, LeaseEndedOnTheWay, Ledger, LedgerError, RetryableToolError, RunEnded,
    ToolFailed, WaitBudgetSpent, in_progress_delay, params_struct, pb)
from opledger._gen.google.rpc import error_details_pb2, status_pb2  # noqa: E402


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)
    print(f"ok: {what}")


class Injected(grpc.RpcError):
    """A failed call with code; with reason, it carries the ledger's ErrorInfo."""

    def __init__(self, code: grpc.StatusCode, reason: str = ""):
        super().__init__(f"injected {code.name}")
        self._code, self._reason = code, reason

    def code(self):
        return self._code

    def details(self):
        return "injected"

    def trailing_metadata(self):
        if not self._reason:
            return ()
        status = status_pb2.Status(code=self._code.value[0], message="injected")
        status.details.add().Pack(error_details_pb2.ErrorInfo(reason=self._reason, domain=DOMAIN))
        return (("grpc-status-details-bin", status.SerializeToString()),)


def inject(ledger: Ledger, method: str, code: grpc.StatusCode, times: float = float("inf"),
           reason: str = "") -> list[int]:
    """The next `times` calls of method fail with code (and reason) before they reach the ledger.

    Returns the count of the calls of method that go out from now on, failed
    or not (in the returned list's one element).
    """
    real = getattr(ledger.stub, method)
    left, calls = [times], [0]

    def call(request, **kwargs):
        calls[0] += 1
        if left[0] <= 0:
            return real(request, **kwargs)
        left[0] -= 1
        raise Injected(code, reason)

    setattr(ledger.stub, method, call)
    return calls


def lose(ledger: Ledger, method: str, code: grpc.StatusCode, times: int) -> None:
    """The next `times` calls of method reach the ledger, but their answers are lost: the caller gets code."""
    real = getattr(ledger.stub, method)
    left = [times]

    def call(request, **kwargs):
        if left[0] <= 0:
            return real(request, **kwargs)
        left[0] -= 1
        real(request, **kwargs)
        raise Injected(code)

    setattr(ledger.stub, method, call)


def count(ledger: Ledger, method: str) -> list[int]:
    """Counts the calls of method that go out (in the returned list's one element)."""
    real = getattr(ledger.stub, method)
    calls = [0]

    def call(request, **kwargs):
        calls[0] += 1
        return real(request, **kwargs)

    setattr(ledger.stub, method, call)
    return calls


class Destination:
    """The fake destination: every ticket it created, by idempotency key."""

    def __init__(self):
        self.tickets: list[str] = []
        self.lock = threading.Lock()

    def create(self, attempt: Attempt) -> dict:
        with self.lock:
            self.tickets.append(attempt.idempotency_key)
            ticket_id = f"TCK-{len(self.tickets)}"
        return {"resource_id": ticket_id, "data": {"url": f"https://tickets.example/{ticket_id}"}}

    def applied(self, key: str) -> int:
        with self.lock:
            return self.tickets.count(key)


def reconcile(ledger: Ledger, key: str, applied: bool, token: int) -> pb.Operation:
    """Reports what the destination holds about the attempt with token, and returns the record.

    ALREADY_RESOLVED or STALE_FENCING_TOKEN: someone settled the operation meanwhile (the
    attempt's own report, another reconciler; perhaps with another result than the one found
    here, which stands) or another attempt claimed it. Nothing was recorded: the record read
    after the refusal says what stands, and a retry under the same id replays it or waits.
    """
    try:
        return ledger.rpc("Reconcile", pb.ReconcileRequest(
            operation_id=key, finding=pb.FINDING_APPLIED if applied else pb.FINDING_NOT_APPLIED,
            fencing_token=token)).operation
    except LedgerError as err:
        if err.reason not in ("ALREADY_RESOLVED", "STALE_FENCING_TOKEN"):
            raise
        return ledger.lookup(key)


def outcome(call, **kwargs):
    try:
        return call(**kwargs), None
    except Exception as err:  # noqa: BLE001 - the scenario looks at it
        return None, err


def main() -> None:
    # Stopped from outside (SIGTERM: internal/polyglot does so at its time
    # bound), the run first prints where every thread stood.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    address = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LEDGER_ADDR", "127.0.0.1:50051")
    run_id = f"py-faults-{uuid.uuid4().hex[:8]}"
    failed = 0

    def op(step: str, **extra) -> dict:
        return {"operation_id": f"{run_id}:{step}", "tool": "tickets.create",
                "params": {"title": "Printer on fire"}, "permit_id": "approval-77", **extra}

    def unrecorded():
        print("1. the tool ran, then the ledger is unreachable for its Complete")
        ledger, dest = Ledger(address), Destination()
        inject(ledger, "Complete", grpc.StatusCode.UNAVAILABLE)
        _, err = outcome(ledger.call_tool, **op("unrecorded"), fn=dest.create)
        check(dest.applied(f"{run_id}:unrecorded") == 1, "the destination applied the effect once")
        check(type(err).__name__ == "NotRecorded", f"the caller learns the outcome is not recorded (got {err!r})")
        check(err.result is not None and err.result.resource_id == "TCK-1", "and gets the result the tool produced")
        ledger.close()

    def unknown_unrecorded():
        print("2. the tool failed without an answer, then the ledger is unreachable for its MarkUnknown")
        ledger = Ledger(address)
        inject(ledger, "MarkUnknown", grpc.StatusCode.DEADLINE_EXCEEDED)

        def times_out(_attempt):
            raise TimeoutError("read timeout")

        _, err = outcome(ledger.call_tool, **op("unknown-unrecorded"), fn=times_out)
        check(type(err).__name__ == "NotRecorded", f"the caller learns the outcome is not recorded (got {err!r})")
        check(isinstance(err.tool_error, TimeoutError), "with the tool's error")
        ledger.close()

    def rate_limited():
        print("3. the ledger rate-limits the Complete once (RESOURCE_EXHAUSTED, RATE_LIMITED)")
        ledger, dest = Ledger(address), Destination()
        inject(ledger, "Complete", grpc.StatusCode.RESOURCE_EXHAUSTED, times=1, reason="RATE_LIMITED")
        out, err = outcome(ledger.call_tool, **op("rate-limited"), fn=dest.create)
        check(err is None, f"the Complete is repeated after the back-off ({err!r})")
        check(out.operation.state == pb.STATE_SUCCEEDED, "the operation SUCCEEDED")
        check(dest.applied(f"{run_id}:rate-limited") == 1, "the destination applied the effect once")
        ledger.close()

    def unresolved_limit():
        print("3b. the tenant holds as many unresolved operations as it may (RESOURCE_EXHAUSTED, UNRESOLVED_LIMIT):"
              " not repeated")
        pauses: list[float] = []
        ledger, dest = Ledger(address, sleep=pauses.append), Destination()
        limited = op("unresolved-limit")
        key = limited["operation_id"]
        reserves = inject(ledger, "Reserve", grpc.StatusCode.RESOURCE_EXHAUSTED, times=1,
                          reason="UNRESOLVED_LIMIT")
        _, err = outcome(ledger.call_tool, **limited, fn=dest.create)
        check(isinstance(err, LedgerError) and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
              and err.reason == "UNRESOLVED_LIMIT",
              f"the caller gets the refusal at once, as from the Go SDK ({err!r})")
        check(reserves[0] == 1 and not pauses,
              f"the Reserve went out once, with no back-off ({reserves[0]}, {len(pauses)} pauses)")
        check(dest.applied(key) == 0, f"the tool did not run ({dest.applied(key)})")
        _, err = outcome(ledger.lookup, operation_id=key)
        check(isinstance(err, LedgerError) and err.code == grpc.StatusCode.NOT_FOUND, f"nothing is reserved ({err!r})")
        out, err = outcome(ledger.call_tool, **limited, fn=dest.create)
        check(err is None and not out.replayed, f"a later retry under the same id runs the tool ({err!r})")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        ledger.close()

    def oversized():
        print("3c. parameters over gRPC's message size limit: a bare RESOURCE_EXHAUSTED is not repeated")
        ledger, dest = Ledger(address), Destination()
        reserves = count(ledger, "Reserve")
        huge = op("oversized", params={"note": "x" * (5 << 20)})
        _, err = outcome(ledger.call_tool, **huge, fn=dest.create)
        check(isinstance(err, LedgerError) and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not err.reason,
              f"the caller gets the refusal ({err!r})")
        check(reserves[0] == 1, f"the Reserve went out once ({reserves[0]})")
        check(dest.applied(huge["operation_id"]) == 0, "nothing was applied")
        ledger.close()

    def bad_result():
        print("4. the tool ran but its result cannot be encoded")
        ledger, dest = Ledger(address), Destination()
        when = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)

        def create(attempt):
            dest.create(attempt)
            return {"resource_id": "TCK-1", "data": {"when": when}}

        _, err = outcome(ledger.call_tool, **op("bad-result"), fn=create)
        check(type(err).__name__ == "NotRecorded", f"the caller learns the outcome is not recorded (got {err!r})")
        check(err.result is not None and err.result.data == {"when": when}, "and gets the result the tool produced")
        state = ledger.lookup(f"{run_id}:bad-result").state
        check(state == pb.STATE_UNKNOWN, f"the operation is UNKNOWN, to be reconciled ({pb.State.Name(state)})")
        _, err = outcome(ledger.call_tool, **op("bad-result"), fn=dest.create, wait=1.0)
        check(type(err).__name__ == "NeedsReconciliation", f"a retry under the same id is told to reconcile ({err!r})")
        check(dest.applied(f"{run_id}:bad-result") == 1, "the destination applied the effect once")
        ledger.close()

    def refused_result():
        print("4b. the tool ran but the ledger refuses its result (INVALID_ARGUMENT: data over 64 KiB, "
              "an id over 256 bytes)")
        ledger = Ledger(address)
        for step, produced in (("large-data", {"resource_id": "TCK-1", "data": {"blob": "x" * (70 << 10)}}),
                               ("long-id", {"resource_id": "T" * 300, "data": {}})):
            dest = Destination()
            refused = op(step)
            key = refused["operation_id"]

            def create(attempt, produced=produced, dest=dest):
                dest.create(attempt)
                return produced

            _, err = outcome(ledger.call_tool, **refused, fn=create)
            cause = getattr(err, "__cause__", None)
            check(type(err).__name__ == "NotRecorded" and isinstance(cause, LedgerError)
                  and cause.code == grpc.StatusCode.INVALID_ARGUMENT,
                  f"{step}: the caller learns the outcome is not recorded (got {err!r})")
            check(err.result is not None and err.result.resource_id == produced["resource_id"]
                  and err.result.data == produced["data"], f"{step}: and gets the result the tool produced")
            state = ledger.lookup(key).state
            check(state == pb.STATE_UNKNOWN, f"{step}: the operation is UNKNOWN at once, to be reconciled, "
                  f"not RUNNING until its lease ends ({pb.State.Name(state)})")
            _, err = outcome(ledger.call_tool, **refused, fn=dest.create, wait=1.0)
            check(type(err).__name__ == "NeedsReconciliation",
                  f"{step}: a retry under the same id is told to reconcile ({err!r})")
            check(dest.applied(key) == 1, f"{step}: the destination applied the effect once ({dest.applied(key)})")
        ledger.close()

    def recorded_as_tool_failed(ledger, step, make):
        """Runs a tool that fails for good with the error make() returns, and
        checks that the failure is recorded, and replayed, under tool_failed."""
        dest = Destination()
        declined = op(step)
        key = declined["operation_id"]

        def decline(attempt):
            dest.create(attempt)
            raise make()

        _, err = outcome(ledger.call_tool, **declined, fn=decline)
        check(isinstance(err, ToolFailed) and err.code == "tool_failed" and not err.replayed,
              f"{step}: the caller learns the tool failed for good, under the code recorded, tool_failed "
              f"(got {err!r})")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_FAILED_FINAL and record.failure.code == "tool_failed",
              f"{step}: the operation is FAILED_FINAL with tool_failed at once, not RUNNING until its lease "
              f"ends ({pb.State.Name(record.state)}, {record.failure.code!r})")
        _, err = outcome(ledger.call_tool, **declined, fn=decline)
        check(isinstance(err, ToolFailed) and err.replayed and err.code == "tool_failed",
              f"{step}: a retry under the same id replays the failure ({err!r})")
        check(dest.applied(key) == 1, f"{step}: the tool ran once ({dest.applied(key)})")

    def refused_failure_code():
        print("4c. the tool failed for good, with a failure code the ledger refuses (over 128 bytes, "
              "a control character) or that cannot be sent (a lone surrogate)")
        ledger = Ledger(address)
        for step, code in (("long-code", "x" * 200), ("control-code", "declined\n"), ("surrogate-code", "\ud800")):
            recorded_as_tool_failed(ledger, step, lambda code=code: FinalToolError(code))
        ledger.close()

    def missing_failure_code():
        print("4d. the tool failed for good without a failure code: recorded under tool_failed, as in the Go SDK")
        ledger = Ledger(address)
        for step, make in (("no-code", FinalToolError), ("empty-code", lambda: FinalToolError("")),
                           ("none-code", lambda: FinalToolError(None, "card declined"))):
            recorded_as_tool_failed(ledger, step, make)
        ledger.close()

    def slow():
        print("5. a tool that runs 5s under a lease of 2s; a second worker retries the step at 3s")
        first, second, dest = Ledger(address), Ledger(address), Destination()
        slow_op = op("slow", tool="tickets.slow")
        key = slow_op["operation_id"]
        ran: list = []

        def slow_create(attempt):
            time.sleep(5)
            return dest.create(attempt)

        # A daemon, joined with a timeout: a first worker that never ends fails the scenario, and cannot
        # keep the run from exiting.
        worker = threading.Thread(target=lambda: ran.append(outcome(first.call_tool, **slow_op, fn=slow_create)),
                                  daemon=True)
        worker.start()
        time.sleep(3)
        # The second worker has a reconciler: it asks the destination.
        for _ in range(3):
            out, err = outcome(second.call_tool, **slow_op, fn=dest.create)
            if type(err).__name__ != "NeedsReconciliation":
                break
            applied = dest.applied(key) > 0
            print(f"  reconciler: the destination has {'the ticket' if applied else 'no ticket'}")
            reconcile(second, key, applied, err.operation.fencing_token)
        worker.join(60)
        check(not worker.is_alive() and ran, "the first worker's call ended")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        check(ran[0][1] is None, f"the first worker recorded its outcome ({ran[0][1]!r})")
        check(err is None and out.replayed, f"the second worker replayed it ({err!r})")
        first.close()
        second.close()

    def settled_meanwhile():
        print("5b. a reconciler reports the effect found after the worker's own report recorded it with its result")
        worker, reconciler, dest = Ledger(address), Ledger(address), Destination()
        settled = op("settled-meanwhile")
        key = settled["operation_id"]
        out, err = outcome(worker.call_tool, **settled, fn=dest.create)
        check(err is None and out.resource_id == "TCK-1", f"the worker recorded its result ({err!r})")
        # The reconciler saw the attempt unresolved a moment before, and finds a ticket at the
        # destination: it reports it without the worker's result, which it does not know.
        record = reconcile(reconciler, key, True, worker.lookup(key).fencing_token)
        check(record.state == pb.STATE_SUCCEEDED and record.result.resource_id == "TCK-1",
              f"the record read after the refusal holds the worker's result "
              f"({pb.State.Name(record.state)}, {record.result.resource_id!r})")
        out, err = outcome(reconciler.call_tool, **settled, fn=dest.create)
        check(err is None and out.replayed and out.resource_id == "TCK-1",
              f"a retry replays the worker's result ({err!r})")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        worker.close()
        reconciler.close()

    def big_integer():
        print("6. amounts beyond 2^53, which the wire's doubles cannot tell apart")
        ledger, dest = Ledger(address), Destination()
        first = op("big-integer", params={"amount": 2**53 + 1})
        _, err = outcome(ledger.call_tool, **first, fn=dest.create)
        check(isinstance(err, ValueError), f"refused before the ledger is asked (got {err!r})")
        _, err = outcome(ledger.lookup, operation_id=first["operation_id"])
        check(getattr(err, "code", None) == grpc.StatusCode.NOT_FOUND, f"nothing was recorded ({err!r})")
        check(dest.applied(first["operation_id"]) == 0, "nothing was applied")
        ledger.close()

    def exhausted():
        print("7. every attempt is refused (two attempts): the failure names RETRIES_EXHAUSTED")
        ledger = Ledger(address)
        flaky = op("exhausted", tool="tickets.flaky")

        def refused(_attempt):
            raise RetryableToolError("429")

        for _ in range(2):
            _, err = outcome(ledger.call_tool, **flaky, fn=refused)
            check(isinstance(err, RetryableToolError), f"an attempt refused ({err!r})")
            record = ledger.lookup(flaky["operation_id"])
            check(record.state == pb.STATE_PENDING and record.failure.code == "retryable",
                  f"recorded as a retryable failure, as the Go SDK records it "
                  f"({pb.State.Name(record.state)}, {record.failure.code!r})")
        _, err = outcome(ledger.call_tool, **flaky, fn=refused)
        check(isinstance(err, ToolFailed) and err.code == "RETRIES_EXHAUSTED" and err.replayed,
              f"then the call fails for good, saying why ({err!r})")
        ledger.close()

    def hung_tool(dest: Destination, seen: list, release: threading.Event, late: threading.Event):
        """A tool that hangs until release, never looking at attempt.cancelled; late is set when it ends."""
        def hangs(attempt):
            seen.append(attempt)
            release.wait(30)
            try:
                return dest.create(attempt)
            finally:
                late.set()
        return hangs

    def hung():
        print("8. a tool that hangs past a tool timeout of 0.5s (lease 2s); a second worker retries the step")
        first, second, dest = Ledger(address), Ledger(address), Destination()
        hung_op = op("hung", tool="tickets.slow", tool_timeout=0.5)
        key = hung_op["operation_id"]
        seen: list = []
        release, late = threading.Event(), threading.Event()
        _, err = outcome(first.call_tool, **hung_op, fn=hung_tool(dest, seen, release, late))
        check(type(err).__name__ == "ToolTimedOut" and not late.is_set(),
              f"the caller gets a timeout error while the tool still hangs ({err!r})")
        check(seen[0].cancelled.is_set(), "attempt.cancelled is set")
        state = first.lookup(key).state
        check(state == pb.STATE_UNKNOWN, f"the operation is UNKNOWN, to be reconciled ({pb.State.Name(state)})")
        _, err = outcome(second.call_tool, **hung_op, fn=dest.create)
        check(type(err).__name__ == "NeedsReconciliation", f"a second worker is told to reconcile ({err!r})")
        release.set()
        late.wait(10)
        check(dest.applied(key) <= 1, f"the destination applied at most one effect ({dest.applied(key)})")
        state = first.lookup(key).state
        check(state == pb.STATE_UNKNOWN,
              f"what the tool returned late is discarded: still UNKNOWN ({pb.State.Name(state)})")
        first.close()
        second.close()

    def hung_unrecorded():
        print("9. the same, and the ledger is unreachable for the MarkUnknown: the lease lapses")
        first, second, dest = Ledger(address), Ledger(address), Destination()
        inject(first, "MarkUnknown", grpc.StatusCode.UNAVAILABLE)
        hung_op = op("hung-unrecorded", tool="tickets.slow", tool_timeout=0.5)
        key = hung_op["operation_id"]
        release, late = threading.Event(), threading.Event()
        _, err = outcome(first.call_tool, **hung_op, fn=hung_tool(dest, [], release, late))
        check(type(err).__name__ == "NotRecorded" and type(err.tool_error).__name__ == "ToolTimedOut",
              f"the caller learns the timeout is not recorded ({err!r})")
        # The lease is no longer renewed: a second worker waits for it to lapse (2s), while the tool
        # still hangs. Were it renewed, the worker would wait in vain and give up (TimeoutError).
        _, err = outcome(second.call_tool, **{**hung_op, "wait": 10.0}, fn=dest.create)
        check(type(err).__name__ == "NeedsReconciliation" and not late.is_set(),
              f"once the lease has lapsed, a second worker is told to reconcile ({err!r})")
        record = second.lookup(key)
        check(record.state == pb.STATE_UNKNOWN,
              f"the operation is UNKNOWN ({pb.State.Name(record.state)}, {record.reason})")
        release.set()
        late.wait(10)
        check(dest.applied(key) <= 1, f"the destination applied at most one effect ({dest.applied(key)})")
        first.close()
        second.close()

    def lost_reserve():
        print("10. every answer to Reserve is lost (irreversible, lease 2s): the caller gives up, "
              "the claim is returned")
        ledger, dest = Ledger(address), Destination()
        lost = op("lost-reserve", tool="tickets.slow")
        key = lost["operation_id"]
        lose(ledger, "Reserve", grpc.StatusCode.DEADLINE_EXCEEDED, ledger.ledger_retries + 1)
        _, err = outcome(ledger.call_tool, **lost, fn=dest.create)
        check(isinstance(err, LedgerError) and err.code == grpc.StatusCode.DEADLINE_EXCEEDED,
              f"the caller gets the timeout ({err!r})")
        check(dest.applied(key) == 0, "the tool did not run")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_PENDING and record.failure.code == "caller_gave_up",
              f"the claim the ledger granted is returned, proven not applied "
              f"({pb.State.Name(record.state)}, {record.failure.code!r})")
        out, err = outcome(ledger.call_tool, **lost, fn=dest.create)
        check(err is None and not out.replayed, f"a retry runs the tool, with no reconciliation ({err!r})")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        ledger.close()

    def claim_for_another(holder, held):
        """Reserves held as another caller would, and checks it holds the claim."""
        claim = holder.rpc("Reserve", pb.ReserveRequest(
            operation_id=held["operation_id"], tool=held["tool"], params=params_struct(held["params"]),
            permit_id=held["permit_id"], holder="another-caller"))
        check(claim.decision == pb.DECISION_EXECUTE, "another caller holds the claim")

    def waits_back_off():
        print("11. another caller holds the claim (lease 30s): a 20s wait backs off, with jitter, on an injected clock")
        holder = Ledger(address)
        held = op("held")
        claim_for_another(holder, held)
        now, pauses = [0.0], []

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            now[0] += seconds

        waiter, dest = Ledger(address, clock=lambda: now[0], sleep=sleep), Destination()
        reserves = count(waiter, "Reserve")
        _, err = outcome(waiter.call_tool, **held, fn=dest.create, wait=20.0)
        check(isinstance(err, WaitBudgetSpent) and "still held by another caller" in str(err),
              f"the caller gives up waiting ({err!r})")
        check(dest.applied(held["operation_id"]) == 0, "the tool did not run")
        check(reserves[0] <= 10,
              f"at most 10 Reserves in 20s ({reserves[0]}; polling at retry_after, 1s, makes about 20)")
        check(abs(sum(pauses) - 20.0) < 0.001, f"the waits fill the 20s, no more ({sum(pauses):.3f}s)")
        check(all(p >= 1.0 for p in pauses[:-1]),
              f"every wait but the last, cut at the end, is at least retry_after ({[round(p, 3) for p in pauses]})")
        check(len(set(pauses)) > 1, "the waits are not all the same")
        holder.close()
        waiter.close()

    def in_progress_delays():
        print("12. the wait before the nth Reserve of a claim in progress")
        low, high = (lambda: 0.0), (lambda: 0.999)
        check(in_progress_delay(1, 1.0, low) == 1.0, "at least the ledger's retry_after")
        check(in_progress_delay(1, 0.05, low) == 0.1 and in_progress_delay(5, 0.05, low) == 1.6,
              "a backoff doubling from 0.1 s")
        check(in_progress_delay(8, 0.05, low) == 5.0 and in_progress_delay(1000, 0.05, low) == 5.0, "capped at 5 s")
        check(in_progress_delay(1000, 8.0, low) == 8.0, "a longer retry_after wins over the cap")
        jittered = in_progress_delay(3, 0.05, high)
        check(0.4 < jittered < 0.6, f"plus up to half of it again at random ({jittered})")

    def late_claim():
        print("13. the answer to Reserve comes after the wait budget (1s) is spent, on an injected clock")
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds

        ledger, dest = Ledger(address, clock=lambda: now[0], sleep=sleep), Destination()
        real = ledger.stub.Reserve

        def slow_answer(request, **kwargs):
            resp = real(request, **kwargs)
            now[0] += 2.0  # the answer takes 2s to come back
            return resp

        ledger.stub.Reserve = slow_answer
        late = op("late-claim", wait=1.0)
        key = late["operation_id"]
        _, err = outcome(ledger.call_tool, **late, fn=dest.create)
        check(isinstance(err, WaitBudgetSpent) and "may be retried under the same operation id" in str(err),
              f"the caller gets \"wait budget spent\" ({err!r})")
        check(dest.applied(key) == 0, f"the tool did not run ({dest.applied(key)})")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_PENDING and record.failure.code == "caller_gave_up",
              f"the claim is returned unused ({pb.State.Name(record.state)}, {record.failure.code!r})")
        retrier = Ledger(address)
        out, err = outcome(retrier.call_tool, **late, fn=dest.create)
        check(err is None and not out.replayed, f"a retry under the same id runs the tool ({err!r})")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        ledger.close()
        retrier.close()

    def cancel_waiting():
        print("14. the caller cancels while another caller holds the claim, on an injected clock")
        holder = Ledger(address)
        held = op("cancel-waiting")
        claim_for_another(holder, held)
        cancel, now, pauses = threading.Event(), [0.0], [0]

        def sleep(seconds: float) -> None:
            now[0] += seconds
            pauses[0] += 1
            if pauses[0] == 2:
                cancel.set()

        waiter, dest = Ledger(address, clock=lambda: now[0], sleep=sleep), Destination()
        reserves = count(waiter, "Reserve")
        _, err = outcome(waiter.call_tool, **held, fn=dest.create, wait=60.0, cancel=cancel)
        check(isinstance(err, Cancelled), f"the call raises Cancelled ({err!r})")
        check(reserves[0] == 2, f"no Reserve after the cancellation ({reserves[0]})")
        check(dest.applied(held["operation_id"]) == 0, "the tool did not run")
        _, err = outcome(waiter.call_tool, **held, fn=dest.create, cancel=cancel)
        check(isinstance(err, Cancelled) and reserves[0] == 2, f"a call already cancelled asks nothing ({err!r})")
        holder.close()
        waiter.close()

    def cancel_reserving():
        print("15. the caller cancels while the Reserve is on its way; its answer grants the claim all the same")
        ledger, dest, cancel = Ledger(address), Destination(), threading.Event()
        real = ledger.stub.Reserve

        def cancelled_meanwhile(request, **kwargs):
            resp = real(request, **kwargs)
            cancel.set()
            return resp

        ledger.stub.Reserve = cancelled_meanwhile
        cut = op("cancel-reserving")
        key = cut["operation_id"]
        _, err = outcome(ledger.call_tool, **cut, fn=dest.create, cancel=cancel)
        check(isinstance(err, Cancelled), f"the call raises Cancelled ({err!r})")
        check(dest.applied(key) == 0, f"the tool did not run ({dest.applied(key)})")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_PENDING and record.failure.code == "caller_gave_up",
              f"the claim is returned unused ({pb.State.Name(record.state)}, {record.failure.code!r})")
        ledger.close()

    def cancel_running():
        print("16. the caller cancels while the tool runs: the tool sees it, and its outcome is recorded")
        ledger, dest = Ledger(address), Destination()

        class CutOff(Exception):
            pass

        # The tool applies its effect, then its answer is cut off by the cancellation.
        cancel = threading.Event()
        cut = op("cancel-running", tool_timeout=5.0)

        def applied_then_cut(attempt):
            dest.create(attempt)
            cancel.set()
            attempt.cancelled.wait(30)
            raise CutOff("the answer was cut off")

        _, err = outcome(ledger.call_tool, **cut, fn=applied_then_cut, cancel=cancel)
        check(isinstance(err, CutOff), f"the tool sees the cancellation, and the call raises what it raised ({err!r})")
        state = ledger.lookup(cut["operation_id"]).state
        check(state == pb.STATE_UNKNOWN, f"the outcome, unknown, is recorded: UNKNOWN ({pb.State.Name(state)})")
        check(dest.applied(cut["operation_id"]) == 1,
              f"the destination applied the effect once ({dest.applied(cut['operation_id'])})")
        # The tool does not stop: what it returns is recorded and returned.
        late, seen = threading.Event(), []
        done = op("cancel-finishing")

        def finishes(attempt):
            seen.append(attempt)
            late.set()
            attempt.cancelled.wait(30)
            return dest.create(attempt)

        out, err = outcome(ledger.call_tool, **done, fn=finishes, cancel=late)
        check(seen[0].cancelled.is_set(), "attempt.cancelled is set")
        check(err is None and out.resource_id != "" and not out.replayed,
              f"the call returns the tool's result ({err!r})")
        state = ledger.lookup(done["operation_id"]).state
        check(state == pb.STATE_SUCCEEDED, f"the outcome is recorded: SUCCEEDED ({pb.State.Name(state)})")
        check(dest.applied(done["operation_id"]) == 1,
              f"the destination applied the effect once ({dest.applied(done['operation_id'])})")
        ledger.close()

    def lost_then_limited():
        print("17. a Reserve's answer is lost, then its repeats are refused for the rate: the claim is returned")
        ledger, dest = Ledger(address), Destination()
        lost = op("lost-then-limited", tool="tickets.slow")
        key = lost["operation_id"]
        real, calls = ledger.stub.Reserve, [0]

        def reserve(request, **kwargs):
            calls[0] += 1
            if calls[0] == 1:
                real(request, **kwargs)  # granted; the answer is lost
                raise Injected(grpc.StatusCode.DEADLINE_EXCEEDED)
            if calls[0] <= ledger.ledger_retries + 1:
                raise Injected(grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED")
            return real(request, **kwargs)

        ledger.stub.Reserve = reserve
        _, err = outcome(ledger.call_tool, **lost, fn=dest.create)
        check(isinstance(err, LedgerError) and err.reason == "RATE_LIMITED", f"the caller gets the refusal ({err!r})")
        check(dest.applied(key) == 0, "the tool did not run")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_PENDING and record.failure.code == "caller_gave_up",
              f"the claim the first Reserve was granted is returned, proven not applied "
              f"({pb.State.Name(record.state)}, {record.failure.code!r})")
        out, err = outcome(ledger.call_tool, **lost, fn=dest.create)
        check(err is None and not out.replayed, f"a retry runs the tool, with no reconciliation ({err!r})")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        ledger.close()

    def shorten_lease(ledger: Ledger, lease: float, left: float) -> list:
        """The next Reserve's answer says the claim's lease (of lease seconds) has left seconds to run.

        As if the answer came back late in the lease: the ledger's record
        keeps its own. Returns the end the answer reports, on time.time()'s
        clock, once it came (in the returned list).
        """
        real, ends = ledger.stub.Reserve, []

        def answer(request, **kwargs):
            ledger.stub.Reserve = real
            resp = real(request, **kwargs)
            end = time.time() + left
            resp.operation.lease_expires_at.FromNanoseconds(int(end * 1e9))
            resp.operation.updated_at.FromNanoseconds(int((end - lease) * 1e9))
            ends.append(end)
            return resp

        ledger.stub.Reserve = answer
        return ends

    def claim_within_margin():
        print("18. the answer to Reserve comes with less of its lease (10s) left than the margin (1s)")
        ledger, dest = Ledger(address), Destination()
        late = op("claim-within-margin")
        key = late["operation_id"]
        shorten_lease(ledger, 10.0, 0.5)
        _, err = outcome(ledger.call_tool, **late, fn=dest.create)
        check(dest.applied(key) == 0, f"the tool did not run ({dest.applied(key)})")
        check(isinstance(err, LeaseEndedOnTheWay) and isinstance(err, RetryableToolError),
              f"the caller gets a retryable error ({err!r})")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_PENDING and record.failure.code == "retryable",
              f"the claim is returned, proven not applied, as the Go SDK returns it "
              f"({pb.State.Name(record.state)}, {record.failure.code!r})")
        out, err = outcome(ledger.call_tool, **late, fn=dest.create)
        check(err is None and not out.replayed, f"a retry under the same id runs the tool ({err!r})")
        check(dest.applied(key) == 1, f"the destination applied the effect once ({dest.applied(key)})")
        # The claim cannot be returned: it lapses with its lease, and the caller still learns the tool did not run.
        unreturned = op("claim-within-margin-unreturned")
        shorten_lease(ledger, 10.0, 0.5)
        inject(ledger, "Complete", grpc.StatusCode.UNAVAILABLE)
        _, err = outcome(ledger.call_tool, **unreturned, fn=dest.create)
        check(isinstance(err, LeaseEndedOnTheWay),
              f"when the claim cannot be returned, the caller still learns the tool did not run ({err!r})")
        check(dest.applied(unreturned["operation_id"]) == 0,
              f"the tool did not run ({dest.applied(unreturned['operation_id'])})")
        ledger.close()

    def renewal_hung():
        print("19. the renewals hang with 2s of a 10s lease left: the tool is stopped the margin (1s) before its end")
        ledger, dest = Ledger(address), Destination()
        hung_op = op("renewal-hung", tool_timeout=30.0)
        key = hung_op["operation_id"]
        ends = shorten_lease(ledger, 10.0, 2.0)
        renewals, stopped = [], []

        def hangs(request, timeout=None, **_kwargs):
            renewals.append(timeout)
            time.sleep(timeout)  # no answer within the call's deadline
            raise Injected(grpc.StatusCode.DEADLINE_EXCEEDED)

        ledger.stub.Renew = hangs

        def waits(attempt):
            # The destination takes the effect only while the claim is this
            # caller's: until the lease's end, when another holder may claim it.
            if attempt.cancelled.wait(max(ends[0] - time.time(), 0) + 1.0):
                stopped.append(time.time())
                raise RetryableToolError("stopped before applying")
            return dest.create(attempt)

        _, err = outcome(ledger.call_tool, **hung_op, fn=waits)
        check(renewals != [], f"a renewal went out ({len(renewals)})")
        check(stopped != [], "the tool saw its cancellation")
        check(stopped != [] and stopped[0] < ends[0],
              f"before the lease's end ({f'{ends[0] - stopped[0]:.3f}s before it' if stopped else 'never'})")
        check(dest.applied(key) == 0, f"the destination applied nothing ({dest.applied(key)})")
        check(isinstance(err, RetryableToolError), f"the caller gets the tool's error ({err!r})")
        record = ledger.lookup(key)
        check(record.state == pb.STATE_PENDING and record.failure.code == "retryable",
              f"recorded as a retryable failure, as the Go SDK records it "
              f"({pb.State.Name(record.state)}, {record.failure.code!r})")
        ledger.close()

    def agent_loop(ledger: Ledger, dest: Destination, run: str, calls, fn=None) -> tuple[str, RunEnded | None]:
        """A fake agent runtime that calls tools until the ledger's run guard ends its run."""
        for i, params in enumerate(calls):
            try:
                ledger.call_tool(operation_id=f"{run}:call-{i}", tool="tickets.create", params=params,
                                 permit_id="approval-77", fn=fn or dest.create, run_id=run)
            except RunEnded as end:
                return end.status, end
        return "done", None

    def effects(dest: Destination, run: str) -> int:
        with dest.lock:
            return sum(1 for k in dest.tickets if k.startswith(run + ":"))

    def run_guard():
        print("S14. the ledger's run guard ends a looping agent's run: step cap, repetition, deadline")
        ledger, dest = Ledger(address), Destination()
        steps = f"{run_id}-steps"
        ledger.start_run(steps, max_steps=3)
        status, end = agent_loop(ledger, dest, steps, ({"title": f"ticket {i}"} for i in itertools.count()))
        check(status == "step_limit" and end.limit == "max_steps" and end.reason == "RUN_STEP_LIMIT",
              f"new tickets forever end the run with step_limit ({status}, {end!r})")
        check(effects(dest, steps) == 3, f"the destination applied 3 effects, the cap ({effects(dest, steps)})")
        again = ledger.call_tool(operation_id=f"{steps}:call-0", tool="tickets.create", params={"title": "ticket 0"},
                                 permit_id="approval-77", fn=dest.create, run_id=steps)
        check(again.replayed and effects(dest, steps) == 3, "a retry of an admitted call replays, and is not refused")

        loop = f"{run_id}-loop"
        ledger.start_run(loop, max_repeats=2)
        status, end = agent_loop(ledger, dest, loop, ({"title": "Printer on fire"} for _ in itertools.count()))
        check(status == "repetition" and end.limit == "max_repeats",
              f"the same ticket under new call ids ends the run with repetition ({status}, {end!r})")
        check(effects(dest, loop) == 2, f"the destination applied 2 effects ({effects(dest, loop)})")

        timed = f"{run_id}-timed"
        ledger.start_run(timed, deadline=1.0)

        def slow_create(attempt: Attempt) -> dict:
            time.sleep(1.2)  # runs across the run's deadline
            return dest.create(attempt)

        status, end = agent_loop(ledger, dest, timed, ({"title": f"slow {i}"} for i in itertools.count()), fn=slow_create)
        check(status == "deadline" and end.limit == "deadline",
              f"the call after the deadline ends the run with deadline ({status}, {end!r})")
        record = ledger.get_run(timed)
        check(effects(dest, timed) == 1 and record.steps == 1 and record.open_operations == 0,
              f"the call in flight across the deadline completed and was recorded "
              f"({effects(dest, timed)} effects, {record.steps} steps, {record.open_operations} open)")
        check(record.state == pb.RUN_STATE_DEADLINE, f"the run ended DEADLINE ({pb.RunState.Name(record.state)})")
        ledger.close()

    for scenario in (unrecorded, unknown_unrecorded, rate_limited, unresolved_limit, oversized, bad_result,
                     refused_result, refused_failure_code, missing_failure_code, slow, settled_meanwhile, big_integer,
                     exhausted, hung, hung_unrecorded, lost_reserve, waits_back_off, in_progress_delays, late_claim,
                     cancel_waiting, cancel_reserving, cancel_running, lost_then_limited, claim_within_margin,
                     renewal_hung, run_guard):
        try:
            scenario()
        except CheckFailed as err:
            failed += 1
            print(f"FAIL: {err}", file=sys.stderr)
        except Exception:  # noqa: BLE001 - a scenario that breaks fails, not the run
            failed += 1
            print(f"FAIL: {traceback.format_exc()}", file=sys.stderr)
    if failed:
        print(f"FAIL: {failed} scenario(s)", file=sys.stderr)
        sys.exit(1)
    print("PASS: python faults")


if __name__ == "__main__":
    main()
