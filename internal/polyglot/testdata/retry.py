"""Retries, from Python, operations the Go SDK ran: each request written as
Python writes it (tuples, keys in another order, -0.0, 2.0 for 2).

Usage: retry.py ADDR PREFIX. Prints one line per operation and
"PASS: python retries" when every one was replayed, the tool never run.
"""

from __future__ import annotations

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "clients", "python", "src"))

import opledger  # noqa: E402

REQUESTS = {
    "order": {"currency": "EUR", "amount": 10.5, "note": None,
              "items": ({"sku": "A-1", "qty": 2}, {"qty": 1, "sku": "B-2"})},
    "numbers": {"whole": 2, "float_whole": 2.0, "tenth": 0.1, "large": 1e21, "round": 10**20, "zero": -0.0,
                "tiny": 1.5e-7, "negative": -40},
    "text": {"name": "Zo\u00eb \U0001F680", "\u00e9": "accent key", "a": "ascii", "line": "a\nb\t\"q\""},
    "empty": {"list": (), "object": {}, "flag": False, "text": ""},
}


def main(addr: str, prefix: str) -> int:
    ledger = opledger.Ledger(addr)
    ran = []
    replayed = 0
    for name, params in REQUESTS.items():
        try:
            out = ledger.call_tool(operation_id=prefix + name, tool="payments.refund", params=params, permit_id="p-1",
                                   fn=lambda a: ran.append(a.operation_id) or {"resource_id": "python", "data": {}})
            print(f"{name}: replayed={out.replayed} resource={out.resource_id}")
            replayed += out.replayed and out.resource_id == "go"
        except opledger.LedgerError as err:
            print(f"{name}: {err.reason}")
    ledger.close()
    if ran or replayed != len(REQUESTS):
        print(f"FAIL: the tool ran for {ran}; {replayed} of {len(REQUESTS)} replayed Go's result")
        return 1
    print("PASS: python retries")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
