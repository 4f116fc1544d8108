"""Fixtures: a ledger client of the ledgerd at LEDGER_ADDR, and fakes of the destinations.

make test runs these tests against a ledgerd on a real redis-server, with the
policy of internal/polyglot/packages_test.go (packagePolicy): tools matching
"short.*" have a lease of 400 ms.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from typing import Any

import grpc
import pytest

import opledger
from opledger import pb


@pytest.fixture
def addr() -> str:
    value = os.environ.get("LEDGER_ADDR", "")
    if not value:
        pytest.fail("LEDGER_ADDR is not set: run these tests with make test, or against a ledgerd of your own")
    return value


@pytest.fixture
def claims():
    """Reads what a receipt signs (its payload; the Go and jose tests check the signatures)."""

    def read(receipt: str) -> dict[str, Any]:
        assert receipt, "no receipt: make test runs ledgerd with --receipt-keys"
        payload = receipt.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))

    return read


@pytest.fixture
def ids():
    """Mints operation ids that no other test uses."""
    prefix = uuid.uuid4().hex[:10]
    return lambda name: f"py-{prefix}:{name}"


class LostResponse(grpc.RpcError, grpc.Call):
    """A response that never arrived: the call was made, the answer was lost."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the response was lost on the way"

    def trailing_metadata(self):
        return ()

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


class Dropper(grpc.UnaryUnaryClientInterceptor):
    """Lets a call reach the ledger, then loses its response, for the methods armed."""

    def __init__(self):
        self.armed: dict[str, int] = {}
        self.dropped: list[str] = []
        self._lock = threading.Lock()

    def arm(self, method: str, times: int = 1) -> None:
        with self._lock:
            self.armed[method] = self.armed.get(method, 0) + times

    def intercept_unary_unary(self, continuation, details, request):
        method = details.method.rsplit("/", 1)[-1]
        outcome = continuation(details, request)
        with self._lock:
            drop = self.armed.get(method, 0) > 0
            if drop:
                self.armed[method] -= 1
        if drop:
            outcome.result()  # the ledger did what was asked; only its answer is lost
            self.dropped.append(method)
            raise LostResponse()
        return outcome


class Destination:
    """A fake destination system: it counts the effects it applied, by idempotency key."""

    def __init__(self):
        self.applied: dict[str, list[str]] = {}
        self.faults: list[str] = []
        self._lock = threading.Lock()

    def apply(self, key: str, **_params: Any) -> dict[str, Any]:
        with self._lock:
            fault = self.faults.pop(0) if self.faults else ""
            if fault == "before-write":
                raise opledger.RetryableToolError("503 before the write")
            rid = f"R-{self.total() + 1}"
            self.applied.setdefault(key, []).append(rid)
        if fault == "after-write":
            raise TimeoutError("read timed out after the write")
        return {"resource_id": rid, "data": {"receipt": rid}}

    def total(self) -> int:
        return sum(len(v) for v in self.applied.values())

    def reconciler(self, op: pb.Operation) -> opledger.Finding:
        with self._lock:
            found = self.applied.get(op.operation_id)
        if found:
            return opledger.Finding(opledger.Finding.APPLIED, resource_id=found[0], data={"receipt": found[0]},
                                    note="found at the destination")
        return opledger.Finding(opledger.Finding.NOT_APPLIED, note="not at the destination")


@pytest.fixture
def dest() -> Destination:
    return Destination()


@pytest.fixture
def dropper() -> Dropper:
    return Dropper()


@pytest.fixture
def ledger(addr, dest, dropper):
    lg = opledger.Ledger(addr, call_timeout=5.0, interceptors=[dropper],
                         reconcilers={"short.refund": dest.reconciler, "payments.refund": dest.reconciler,
                                      "appointments.create": dest.reconciler})
    yield lg
    lg.close()
