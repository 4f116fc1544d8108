#!/usr/bin/python3
"""The operation ledger from Python, end to end, against a running ledgerd.

    /usr/bin/python3 examples/python/demo.py [ADDRESS]    (default $LEDGER_ADDR or 127.0.0.1:50051)

One tool call of an agent run ("open a ticket") goes through the ledger:
Reserve -> the fake tool runs -> Complete; a retry replays the recorded
result without running the tool; the same operation_id with changed
parameters is refused with IDEMPOTENCY_KEY_REUSED; Lookup shows the history.
It exits non-zero when any of that does not hold.
"""

from __future__ import annotations

import os
import sys
import uuid

sys.dont_write_bytecode = True  # leave no __pycache__ in the repository
# The package from this repository, unless it is installed (pip install ./clients/python).
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))

import grpc  # noqa: E402

from opledger import Attempt, Ledger, LedgerError, pb  # noqa: E402


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main() -> None:
    address = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LEDGER_ADDR", "127.0.0.1:50051")
    ledger = Ledger(address, log=lambda msg: print(f"  {msg}"))

    # The agent minted the operation id once, when the intent was confirmed:
    # workflow run + step. Every retry of this step reuses it.
    run_id = f"py-{uuid.uuid4().hex[:12]}"
    operation_id = f"{run_id}:create-ticket"

    tickets: list[dict] = []  # the fake destination: every ticket it created

    def create_ticket(attempt: Attempt) -> dict:
        tickets.append({"key": attempt.idempotency_key, "token": attempt.fencing_token})
        ticket_id = f"TCK-{1041 + len(tickets)}"
        return {"resource_id": ticket_id, "data": {"url": f"https://tickets.example/{ticket_id}"}}

    def no_second_run(attempt: Attempt) -> dict:
        raise AssertionError(f"the tool ran again (attempt {attempt.attempt})")

    print(f"1. Reserve -> run the tool -> Complete ({operation_id})")
    first = ledger.call_tool(operation_id=operation_id, tool="tickets.create",
                             params={"title": "Printer on fire", "priority": 2},
                             permit_id="approval-77", fn=create_ticket)
    check(not first.replayed, "the first call ran the tool (DECISION_EXECUTE)")
    check(first.resource_id == "TCK-1042", f"the result is recorded: {first.resource_id} {first.data}")
    check(first.operation.state == pb.STATE_SUCCEEDED, "the operation SUCCEEDED")
    check(len(tickets) == 1, "the destination applied the effect once")

    print("2. the agent never saw that answer and retries: same request, keys in another order")
    again = ledger.call_tool(operation_id=operation_id, tool="tickets.create",
                             params={"priority": 2, "title": "Printer on fire"},
                             permit_id="approval-77", fn=no_second_run)
    check(again.replayed, "the retry got DECISION_REPLAY")
    check((again.resource_id, again.data) == (first.resource_id, first.data),
          "the replay carries the same result")
    check(len(tickets) == 1, "the destination still applied the effect once")

    print("3. the same operation_id with a changed request (priority 1)")
    try:
        ledger.call_tool(operation_id=operation_id, tool="tickets.create",
                         params={"title": "Printer on fire", "priority": 1},
                         permit_id="approval-77", fn=no_second_run)
        check(False, "the conflicting Reserve was refused")
    except LedgerError as err:
        print(f"  refused: {err}")
        check(err.code == grpc.StatusCode.FAILED_PRECONDITION, "code FAILED_PRECONDITION")
        check(err.domain == "ledger.v1" and err.reason == "IDEMPOTENCY_KEY_REUSED",
              "ErrorInfo reason IDEMPOTENCY_KEY_REUSED (domain ledger.v1)")
        check(err.metadata.get("differs") == "params", "ErrorInfo metadata differs=params")
        # The client stops here: it never mints a new key on its own.
    check(len(tickets) == 1, "nothing ran")

    print("4. Lookup")
    op = ledger.lookup(operation_id)
    steps = [(pb.State.Name(h.from_state), pb.State.Name(h.to_state), h.reason) for h in op.history]
    for step in steps:
        print(f"  history: {step[0]} -> {step[1]} ({step[2]})")
    check(op.state == pb.STATE_SUCCEEDED and op.attempt == 1, "the record is SUCCEEDED after one attempt")
    check(op.result.resource_id == first.resource_id, "the record keeps the result")
    check(steps == [("STATE_UNSPECIFIED", "STATE_RUNNING", "RESERVED"),
                    ("STATE_RUNNING", "STATE_SUCCEEDED", "SUCCEEDED")],
          "the history is RESERVED, SUCCEEDED")

    print("5. Lookup of an operation nobody reserved")
    try:
        ledger.lookup(f"{run_id}:never-reserved")
        check(False, "an unknown operation is NOT_FOUND")
    except LedgerError as err:
        check(err.code == grpc.StatusCode.NOT_FOUND and err.reason == "NOT_FOUND",
              "an unknown operation is NOT_FOUND (ErrorInfo reason NOT_FOUND)")

    ledger.close()
    print("PASS: python example")


if __name__ == "__main__":
    main()
