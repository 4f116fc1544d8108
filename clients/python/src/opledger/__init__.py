"""opledger: the operation ledger's Python client.

Ledger.call_tool runs a side-effecting tool at most once per operation id;
guarded wraps a function (a coroutine function, with an
AsyncLedger) the same way; AsyncLedger is the asyncio client. See README.md.
"""

from opledger._gen.ledger.v1 import ledger_pb2 as pb
from opledger.client import (
    CALLER_GAVE_UP,
    DEFAULT_FAILURE_CODE,
    RETRYABLE_FAILURE_CODE,
    Attempt,
    Cancelled,
    ConflictingOutcome,
    FinalToolError,
    Finding,
    Ledger,
    LedgerError,
    LeaseEndedOnTheWay,
    NeedsReconciliation,
    NotRecorded,
    Outcome,
    Reconciler,
    RetryableToolError,
    RunEnded,
    ToolFailed,
    ToolTimedOut,
    WaitBudgetSpent,
)
from opledger.aio import AsyncLedger
from opledger.guard import guarded

__version__ = "0.6.0"

__all__ = [
    "AsyncLedger", "CALLER_GAVE_UP", "DEFAULT_FAILURE_CODE", "RETRYABLE_FAILURE_CODE", "Attempt", "Cancelled",
    "ConflictingOutcome", "FinalToolError", "Finding", "Ledger", "LedgerError", "LeaseEndedOnTheWay",
    "NeedsReconciliation", "NotRecorded", "Outcome", "Reconciler", "RetryableToolError", "RunEnded", "ToolFailed",
    "ToolTimedOut", "WaitBudgetSpent", "guarded", "pb", "__version__",
]
