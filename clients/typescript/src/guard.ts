// guardTool: a tool's execute function made to run at most once per operation.

import { Attempt, Ledger, ToolCall } from './ledger';

/** How guardTool names and records each call. */
export interface GuardOptions<A, C extends unknown[]> {
  tool: string;
  /** The operation id of a call: the framework's tool call id, say ('' refuses the call). */
  operationId: (args: A, ...context: C) => string;
  permitId?: string;
  effect?: ToolCall['effect'];
  runId?: (args: A, ...context: C) => string;
  /** The resource id of a result (recorded beside it). */
  resourceId?: (result: unknown) => string;
  /** The abort signal of a call, when the framework gives one. */
  signal?: (args: A, ...context: C) => AbortSignal | undefined;
  waitMs?: number;
  toolTimeoutMs?: number;
}

// A result that is not a JSON object (a string, a list) is recorded under this key.
const VALUE = '$value';

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null
  && !Array.isArray(v) && [Object.prototype, null].includes(Object.getPrototypeOf(v));

/**
 * Wraps execute(args, attempt, ...context) so that each operation runs at most once,
 * however often the framework calls the wrapper with it: later calls get the
 * recorded result. args are the parameters the ledger fingerprints; the
 * result is any JSON value (one that is not an object is recorded as
 * {"$value": result}, undefined as null). Errors are callTool's.
 */
export function guardTool<A extends Record<string, unknown>, R, C extends unknown[] = unknown[]>(
  ledger: Ledger, options: GuardOptions<A, C>, execute: (args: A, attempt: Attempt, ...context: C) => R | Promise<R>,
): (args: A, ...context: C) => Promise<R> {
  return async (args: A, ...context: C): Promise<R> => {
    const operationId = options.operationId(args, ...context);
    if (!operationId) throw new TypeError(`${options.tool}: no operation id for this call`);
    const out = await ledger.callTool({
      operationId, tool: options.tool, params: args, permitId: options.permitId, effect: options.effect,
      runId: options.runId ? options.runId(args, ...context) : '', signal: options.signal?.(args, ...context),
      waitMs: options.waitMs, toolTimeoutMs: options.toolTimeoutMs,
    }, async (attempt) => {
      const result = await execute(args, attempt, ...context);
      // undefined is recorded as null, which JSON has: a member left undefined would be left out.
      const data = isPlainObject(result) ? result : { [VALUE]: result === undefined ? null : result as unknown };
      return { resource_id: options.resourceId ? options.resourceId(result) : '', data };
    });
    const keys = Object.keys(out.data);
    return (keys.length === 1 && keys[0] === VALUE ? out.data[VALUE] : out.data) as R;
  };
}
