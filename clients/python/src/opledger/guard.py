"""guarded: a decorator that turns a plain function into a ledger-guarded tool."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Union

from opledger._gen.ledger.v1 import ledger_pb2 as pb
from opledger.aio import AsyncLedger
from opledger.client import Attempt, Ledger, Outcome


# A result that is not a dict (a str, a list) is recorded under this key, as
# the TypeScript package's guardTool records it.
VALUE = "$value"

Spec = Union[str, Callable[[dict[str, Any]], str]]


def guarded(ledger: Ledger | AsyncLedger, *, tool: str, operation_id: Spec, permit_id: str = "",
            effect: int = pb.EFFECT_UNSPECIFIED, run_id: Spec = "", resource_id: Spec = "",
            **call_options: Any) -> Callable:
    """Wraps fn(**params) so that it runs at most once per operation, however often it is called.

    The wrapped function takes fn's keyword arguments. Its operation id is
    operation_id(params), or, when operation_id is a string, the keyword
    argument of that name (a framework's tool call id, say), which is taken
    out of the parameters. The other keyword arguments, with the defaults fn
    declares for those not given, are the parameters the ledger
    fingerprints: a call that spells a default out is the same request, and
    one made after the default changed is not. A default with no JSON form
    is refused as a given value would be. run_id works the same way ("" for
    no run). An id is a str, or an int taken as its digits; anything else
    (None) raises ValueError before the ledger is asked, as does no
    operation id (a run id of None is no run).
    fn gets the parameters, and idempotency_key= and attempt= when it
    declares them; what it returns is recorded as the result data (a value
    that is not a dict, such as the str a framework's tool often returns, as
    {"$value": value}), with resource_id(result) (or result[resource_id] for
    a string) as the resource id: a str, or an int recorded as its digits.
    Every later call of the same operation returns the recorded result
    without calling fn.
    With a Ledger, fn is a plain function; with an AsyncLedger, a coroutine
    function, and the wrapper is one too. call_options (wait, tool_timeout,
    compensates, ...) go to call_tool; errors are call_tool's. Anything else
    is refused with a TypeError when decorating, before any call.
    """
    if not isinstance(ledger, (Ledger, AsyncLedger)):
        raise TypeError(f"{tool}: guarded takes an opledger.Ledger or an opledger.AsyncLedger")
    is_async = isinstance(ledger, AsyncLedger)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn) != is_async:
            raise TypeError(f"{tool}: guarded wraps a coroutine function (async def) with an AsyncLedger, "
                            "and a plain function with a Ledger")
        accepts = inspect.signature(fn).parameters
        defaults = declared_defaults(accepts, {s for s in (operation_id, run_id) if isinstance(s, str)})

        def request(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
            """Returns the call_tool arguments of a call, but fn, and the parameters fn gets."""
            params = {**defaults, **kwargs}
            op_id = ident(pick(operation_id, params), f"{tool}: the operation id")
            run = pick(run_id, params) if run_id else ""
            run = ident(run, f"{tool}: the run id") if run not in ("", None) else ""
            if not op_id:
                raise ValueError(f"{tool}: no operation id (give the keyword argument {operation_id!r})")
            return dict(operation_id=op_id, tool=tool, params=params, permit_id=permit_id, effect=effect,
                        run_id=run, **call_options), params

        def extra(a: Attempt) -> dict[str, Any]:
            names = {"idempotency_key": a.idempotency_key, "attempt": a}
            return {k: v for k, v in names.items() if k in accepts}

        if is_async:
            @functools.wraps(fn)
            async def acall(**kwargs: Any) -> Any:
                args, params = request(kwargs)

                async def run_fn(a: Attempt) -> dict[str, Any]:
                    return recorded(await fn(**params, **extra(a)), resource_id)

                return returned(await ledger.call_tool(**args, fn=run_fn))

            return acall

        @functools.wraps(fn)
        def call(**kwargs: Any) -> Any:
            args, params = request(kwargs)
            return returned(ledger.call_tool(**args, fn=lambda a: recorded(fn(**params, **extra(a)), resource_id)))

        return call

    return decorate


def pick(spec: Spec, params: dict[str, Any]) -> Any:
    """Returns the id spec names: spec(params), or the parameter spec, taken out of params ("" without it)."""
    if callable(spec):
        return spec(params)
    return params.pop(spec, "")


def ident(value: Any, what: str) -> str:
    """Returns value as an id: a str as it is, an int as its digits.

    Anything else is a ValueError: str() would make every call whose id is
    None the one operation "None".
    """
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{what} is {'None' if value is None else type(value).__name__}; give a string")


def recorded(data: Any, resource_id: Spec) -> dict[str, Any]:
    """Returns what call_tool records of what fn returned."""
    if callable(resource_id):
        rid = resource_id(data)
    else:
        rid = data.get(resource_id) if resource_id and isinstance(data, dict) else None
    return {"resource_id": rid, "data": data if isinstance(data, dict) else {VALUE: data}}


def returned(out: Outcome) -> Any:
    """Returns what fn returned, from its recorded outcome."""
    return out.data[VALUE] if list(out.data) == [VALUE] else out.data


def declared_defaults(accepts: Any, ids: set[str]) -> dict[str, Any]:
    """Returns the defaults of fn's keyword parameters, but for those guarded fills in or takes out."""
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {name: p.default for name, p in accepts.items()
            if p.kind in keyword and p.default is not inspect.Parameter.empty
            and name not in ids | {"idempotency_key", "attempt"}}
