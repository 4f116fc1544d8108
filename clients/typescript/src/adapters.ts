// Adapters for the agent frameworks' tools: each wraps a tool's execute
// function with guardTool, taking the operation id from the framework's
// tool call id, and passes the wrapped function the framework's arguments
// (with the attempt's abort signal) and the Attempt last, whose
// idempotencyKey goes to the destination. They use only the frameworks'
// call shapes, so this package does not depend on them.

import { guardTool } from './guard';
import { Attempt, Ledger, ToolCall } from './ledger';

/** What every adapter takes. */
export interface AdapterOptions {
  /** The ledger's name of the tool, e.g. "tickets.create". */
  tool: string;
  permitId?: string;
  effect?: ToolCall['effect'];
  /** The agent run: a step of its run guard, and the prefix of the operation id ("<runId>:<call id>"). */
  runId?: string;
  resourceId?: (result: unknown) => string;
  waitMs?: number;
  toolTimeoutMs?: number;
}

const opId = (o: AdapterOptions, callId: string | undefined) => (callId ? (o.runId ? `${o.runId}:${callId}` : callId) : '');

/** The options the Vercel AI SDK (ai) passes a tool's execute. */
export interface AISDKToolOptions {
  toolCallId: string;
  abortSignal?: AbortSignal;
}

/**
 * The Vercel AI SDK: returns the tool (made with tool() from "ai") with an
 * execute that runs at most once per tool call id.
 */
export function guardAISDKTool<T extends { execute?: (input: any, options: AISDKToolOptions) => unknown }>(
  ledger: Ledger, toolDef: T, options: AdapterOptions,
): T {
  const execute = toolDef.execute;
  if (!execute) throw new TypeError(`${options.tool}: the tool has no execute function`);
  const guarded = guardTool<Record<string, unknown>, unknown, [AISDKToolOptions]>(ledger, {
    ...options,
    operationId: (_input, o) => opId(options, o?.toolCallId),
    runId: () => options.runId ?? '',
    signal: (_input, o) => o?.abortSignal,
  }, (input, attempt, o) => (execute as (i: unknown, o: AISDKToolOptions, a: Attempt) => unknown)
    .call(toolDef, input, { ...o, abortSignal: attempt.signal }, attempt));
  return { ...toolDef, execute: (input: Record<string, unknown>, o: AISDKToolOptions) => guarded(input, o) };
}

/** The details the OpenAI Agents SDK passes a function tool's execute. */
export interface AgentsToolDetails {
  toolCall?: { callId?: string };
  signal?: AbortSignal;
}

/**
 * The OpenAI Agents SDK (@openai/agents): returns an execute for tool({ ...,
 * execute }) that runs the given one at most once per tool call id.
 */
export function guardAgentsExecute<I extends Record<string, unknown>, R>(
  ledger: Ledger, execute: (input: I, context: unknown, details: AgentsToolDetails, attempt: Attempt) => R | Promise<R>,
  options: AdapterOptions,
): (input: I, context?: unknown, details?: AgentsToolDetails) => Promise<R> {
  return guardTool<I, R, [unknown?, AgentsToolDetails?]>(ledger, {
    ...options,
    operationId: (_input, _context, details) => opId(options, details?.toolCall?.callId),
    runId: () => options.runId ?? '',
    signal: (_input, _context, details) => details?.signal,
  }, (input, attempt, context, details) => execute(input, context, { ...details, signal: attempt.signal }, attempt));
}

/** The config LangChain passes a tool's function (ToolNode sets toolCall). */
export interface LangChainToolConfig {
  toolCall?: { id?: string };
  signal?: AbortSignal;
}

/**
 * LangChain and LangGraph (@langchain/core's tool(), run by LangGraph's
 * ToolNode): returns a function for tool(fn, fields) that runs fn at most
 * once per tool call id.
 */
export function guardLangChainTool<I extends Record<string, unknown>, R>(
  ledger: Ledger, fn: (input: I, config: LangChainToolConfig, attempt: Attempt) => R | Promise<R>, options: AdapterOptions,
): (input: I, config?: LangChainToolConfig) => Promise<R> {
  return guardTool<I, R, [LangChainToolConfig?]>(ledger, {
    ...options,
    operationId: (_input, config) => opId(options, config?.toolCall?.id),
    runId: () => options.runId ?? '',
    signal: (_input, config) => config?.signal,
  }, (input, attempt, config) => fn(input, { ...config, signal: attempt.signal }, attempt));
}
