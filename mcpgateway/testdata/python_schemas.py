"""Checks each value of the JSON array on stdin ({schema, value}) as the
official Python client does (jsonschema.validate, which checks the schema
first), and prints a JSON array of {schema_ok, valid}."""
import json
import sys

import jsonschema

verdicts = []
for row in json.load(sys.stdin):
    try:
        jsonschema.validate(row["value"], row["schema"])
        verdicts.append({"schema_ok": True, "valid": True})
    except jsonschema.SchemaError:
        verdicts.append({"schema_ok": False, "valid": False})
    except jsonschema.ValidationError:
        verdicts.append({"schema_ok": True, "valid": False})
print(json.dumps(verdicts))
