#!/usr/bin/env python3
"""Checks real exchanges with dld against its OpenRPC document (rpc.discover), with the
`jsonschema` package (draft 2020-12; scripts/deps.sh installs it).

    scripts/check-openrpc.py FOLDER

FOLDER holds `openrpc.json` (the document), `calls.json` (a list of {"method", "params",
"result"}: what was sent and what came back) and, optionally, `notifications.json` (a list of
{"method", "params"} that a subscription received). Checks that every schema in the document is
a valid schema, that each call's method is in the document, its params match the method's
params (each param's schema, `required`, no other names, and `x-params-schema`) and its result
the method's result schema, and that each notification's params match its schema in the
subscribe method's `x-notifications`. Prints each failure; exits 1 if there was one.
"""
import json
import sys
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match


def main(folder: Path) -> int:
    doc = json.loads((folder / "openrpc.json").read_text())
    calls = json.loads((folder / "calls.json").read_text())
    notes_file = folder / "notifications.json"
    notifications = json.loads(notes_file.read_text()) if notes_file.exists() else []
    failures = []

    def validator(schema):
        # The schema inside the document, so that "#/components/schemas/…" resolves.
        return Draft202012Validator({"components": doc.get("components", {}), "$ref": "#/x-target", "x-target": schema})

    def check(schema, value, what):
        for error in sorted(validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path)):
            # anyOf/oneOf: the branch's own error that fits best, not the whole instance.
            if error.context:
                error = best_match(error.context)
            path = "/".join(str(p) for p in error.absolute_path)
            failures.append(f"{what}: at /{path}: {error.message[:300]}")

    schemas = dict(doc.get("components", {}).get("schemas", {}))
    methods = {}
    for method in doc["methods"]:
        name = method["name"]
        methods[name] = method
        schemas[f"{name} result"] = method["result"]["schema"]
        schemas[f"{name} x-params-schema"] = method.get("x-params-schema", {})
        for param in method["params"]:
            schemas[f"{name} param {param['name']}"] = param["schema"]
    for what, schema in schemas.items():
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as error:
            failures.append(f"{what}: not a valid schema: {error.message[:300]}")

    for index, call in enumerate(calls):
        name = call["method"]
        what = f"call {index} ({name} {json.dumps(call['params'])[:120]})"
        method = methods.get(name)
        if method is None:
            failures.append(f"{what}: the document has no method {name}")
            continue
        by_name = {
            "type": "object",
            "properties": {p["name"]: p["schema"] for p in method["params"]},
            "required": [p["name"] for p in method["params"] if p.get("required")],
            "additionalProperties": False,
        }
        check(by_name, call["params"], what + " params")
        if "x-params-schema" in method:
            check(method["x-params-schema"], call["params"], what + " params (x-params-schema)")
        check(method["result"]["schema"], call["result"], what + " result")

    kinds = methods.get("subscribe", {}).get("x-notifications", {})
    for index, note in enumerate(notifications):
        what = f"notification {index} ({note['method']})"
        schema = kinds.get(note["method"])
        if schema is None:
            failures.append(f"{what}: the document has no such notification")
            continue
        check(schema, note["params"], what)

    for failure in failures:
        print(failure)
    print(f"{len(calls)} calls, {len(notifications)} notifications, {len(schemas)} schemas: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
