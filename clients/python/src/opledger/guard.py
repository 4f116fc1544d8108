"""guarded: a decorator that turns a plain function into a ledger-guarded tool."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from opledger._gen.ledger.v1 import ledger_pb2 as pb
from opledger.client import Attempt, Ledger


# A result that is not a dict (a str, a list) is recorded under this key, as
# the TypeScript package's guardTool records one.
VALUE = "$value"


def guarded(ledger: Ledger, *, tool: str, operation_id: str | Callable[[dict[str, Any]], str],
            permit_id: str = "", effect: int = pb.EFFECT_UNSPECIFIED, run_id: str | Callable[[dict[str, Any]], str] = "",
            resource_id: str | Callable[[dict[str, Any]], str] = "", **call_options: Any) -> Callable:
    """Wraps fn(**params) so that it runs at most once per operation, however often it is called.

    The wrapped function takes fn's keyword arguments. Its operation id is
    operation_id(params), or, when operation_id is a string, the keyword
    argument of that name (a framework's tool call id, say), which is taken
    out of the parameters. The other keyword arguments, with the defaults fn
    declares for those not given, are the parameters the ledger
    fingerprints: a call that spells a default out is the same request, and
    one made after the default changed is not. A default with no JSON form
    is refused as a given value would be. run_id works the same way ("" for
    no run).
    fn gets the parameters, and idempotency_key= and attempt= when it
    declares them; what it returns is recorded as the result data (a value
    that is not a dict, such as the str a framework's tool often returns, as
    {"$value": value}), with resource_id(result) (or result[resource_id] for
    a string) as the resource id: a str, or an int recorded as its digits.
    Every later call of the same operation returns the recorded result
    without calling fn.
    call_options (wait, tool_timeout, compensates, ...) go to
    Ledger.call_tool; errors are call_tool's. An AsyncLedger, or a coroutine
    function, is refused with a TypeError when decorating, before any call.
    """

    def pick(spec: str | Callable[[dict[str, Any]], str], params: dict[str, Any]) -> str:
        if callable(spec):
            return spec(params)
        if spec in params:
            return str(params.pop(spec))
        return ""

    if not isinstance(ledger, Ledger):
        raise TypeError(f"{tool}: guarded takes an opledger.Ledger (for asyncio, await AsyncLedger.call_tool)")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(f"{tool}: guarded wraps a plain function; a coroutine function is run by "
                            "AsyncLedger.call_tool")
        accepts = inspect.signature(fn).parameters
        defaults = declared_defaults(accepts, {s for s in (operation_id, run_id) if isinstance(s, str)})

        @functools.wraps(fn)
        def call(**kwargs: Any) -> Any:
            params = {**defaults, **kwargs}
            op_id = pick(operation_id, params)
            run = pick(run_id, params) if run_id else ""
            if not op_id:
                raise ValueError(f"{tool}: no operation id (give the keyword argument {operation_id!r})")

            def run_fn(a: Attempt) -> dict[str, Any]:
                extra: dict[str, Any] = {}
                if "idempotency_key" in accepts:
                    extra["idempotency_key"] = a.idempotency_key
                if "attempt" in accepts:
                    extra["attempt"] = a
                data = fn(**params, **extra)
                if callable(resource_id):
                    rid = resource_id(data)
                else:
                    rid = data.get(resource_id) if resource_id and isinstance(data, dict) else None
                return {"resource_id": rid, "data": data if isinstance(data, dict) else {VALUE: data}}

            out = ledger.call_tool(operation_id=op_id, tool=tool, params=params, permit_id=permit_id, fn=run_fn,
                                   effect=effect, run_id=run, **call_options)
            return out.data[VALUE] if list(out.data) == [VALUE] else out.data

        return call

    return decorate


def declared_defaults(accepts: Any, ids: set[str]) -> dict[str, Any]:
    """Returns the defaults of fn's keyword parameters, but for those guarded fills in or takes out."""
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {name: p.default for name, p in accepts.items()
            if p.kind in keyword and p.default is not inspect.Parameter.empty
            and name not in ids | {"idempotency_key", "attempt"}}
