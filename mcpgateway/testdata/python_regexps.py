"""Compiles each pattern of the JSON array on stdin ({pattern}) with re,
as the Python client's validator does, and prints a JSON array of
whether it compiles."""
import json
import re
import sys


def compiles(pattern):
    try:
        re.compile(pattern)
        return True
    except re.error:
        return False


print(json.dumps([compiles(row["pattern"]) for row in json.load(sys.stdin)]))
