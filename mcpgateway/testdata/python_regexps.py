"""Compiles each pattern of the JSON array on stdin ({pattern, value}) with
re, as the Python client's validator does, and searches the value when
there is one. Prints a JSON array of {compiles, matches}."""
import json
import re
import sys


def verdict(row):
    try:
        pattern = re.compile(row["pattern"])
    except re.error:
        return {"compiles": False, "matches": False}
    value = row.get("value")
    return {"compiles": True, "matches": value is not None and pattern.search(value) is not None}


print(json.dumps([verdict(row) for row in json.load(sys.stdin)]))
