// Ledger.callTool: a side-effecting tool run at most once per operation id,
// with the decision flow of the Go SDK's Do.

import * as crypto from 'node:crypto';
import * as net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import {
  CallError, ConflictingOutcomeError, DOMAIN, ErrorInfo, FinalToolError, LeaseEndedOnTheWayError, LedgerError,
  NeedsReconciliationError, NotRecordedError, RetryableToolError, RUN_REASONS, RunEndedError, ToolFailedError,
  ToolTimedOutError, UNANSWERED, WaitBudgetSpentError, errorDetails,
} from './errors';
import { LedgerServiceClient, Operation, Run, timeMs } from './proto';
import { JSONValue, fromStruct, toStruct } from './struct';

/** What fn gets: the key to hand to the destination, and the claim it runs under. */
export interface Attempt {
  operationId: string;
  idempotencyKey: string;
  attempt: number;
  fencingToken: string;
  /** Aborted at the tool timeout, when the claim is lost, or the caller cancels: stop if you can. */
  signal: AbortSignal;
}

/** What fn returns: the resource it created and the result data, recorded and replayed. */
export interface ToolResult {
  /** The resource the effect made: a string, or an integer (a safe number or a BigInt) recorded as its digits. */
  resource_id?: string | number | bigint;
  data?: Record<string, unknown>;
}

/**
 * What callTool returns. replayed: an earlier call produced it. receipt: the
 * ledger's signed receipt of it ('' when the ledger signs none; docs/receipts.md).
 */
export interface Outcome {
  resourceId: string;
  data: { [key: string]: JSONValue };
  replayed: boolean;
  operation: Operation;
  receipt: string;
}

/** What a reconciler found at the destination about an operation whose outcome is unknown. */
export interface Finding {
  kind: 'FINDING_APPLIED' | 'FINDING_NOT_APPLIED' | 'FINDING_ABANDON' | 'FINDING_ESCALATE';
  resourceId?: string;
  data?: Record<string, unknown>;
  note?: string;
}

/** Asks the destination whether the effect of an UNKNOWN operation exists. It only reads. */
export type Reconciler = (op: Operation) => Finding | Promise<Finding>;

/** The options of a Ledger. */
export interface LedgerOptions {
  credentials?: grpc.ChannelCredentials;
  /** Sent as "authorization: Bearer <key>" on every call (use TLS beyond this machine). */
  apiKey?: string;
  callTimeoutMs?: number;
  ledgerRetries?: number;
  log?: (msg: string) => void;
  /** Reconcilers by tool: callTool asks them instead of throwing NeedsReconciliationError. */
  reconcilers?: Record<string, Reconciler>;
  /** grpc-js client interceptors (tests lose answers with them). */
  interceptors?: grpc.Interceptor[];
  /** The clock of the waits between ledger calls (tests pass their own). */
  now?: () => number;
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
}

/** One call of callTool. */
export interface ToolCall {
  /** Minted once for the intent, reused by every retry. */
  operationId: string;
  tool: string;
  /** The consequential parameters: fingerprinted, never stored. */
  params: Record<string, unknown>;
  permitId?: string;
  effect?: 'EFFECT_UNSPECIFIED' | 'EFFECT_READ_ONLY' | 'EFFECT_IDEMPOTENT' | 'EFFECT_IRREVERSIBLE';
  waitMs?: number;
  toolTimeoutMs?: number;
  signal?: AbortSignal;
  runId?: string;
  /** The SUCCEEDED operation this one reverses; refused (NOT_COMPENSABLE) otherwise. */
  compensates?: string;
}

/** The failure code of a claim returned unused by a caller that gave up. */
export const CALLER_GAVE_UP = 'caller_gave_up';
/**
 * A result's resource id as the ledger records it: a string as it is, an
 * integer as its digits (a number up to 2^53, past which it may already be
 * another integer, or a BigInt, as a database driver gives a 64-bit id),
 * none as ''. Anything else (a fraction, an object, which String() would
 * write as "[object Object]") is a TypeError.
 */
function resourceIdOf(v: unknown): string {
  if (v === undefined || v === null) return '';
  if (typeof v === 'string') return v;
  if (typeof v === 'number' && Number.isSafeInteger(v)) return String(v);
  if (typeof v === 'bigint') return v.toString();
  throw new TypeError(`resource_id: ${typeof v === 'number' ? 'a number that is not an integer' : `a ${typeof v}`} is not an id; return a string or an integer`);
}

const EFFECTS = ['EFFECT_UNSPECIFIED', 'EFFECT_READ_ONLY', 'EFFECT_IDEMPOTENT', 'EFFECT_IRREVERSIBLE'];
const STRING_FIELDS = ['operationId', 'tool', 'permitId', 'runId', 'compensates'] as const;

/**
 * Refuses, with a TypeError before anything is sent, a call that cannot run
 * as given: an fn that is not a function (its claim would be left UNKNOWN,
 * though nothing ran), an id or name that is not a string (protobufjs would
 * send an object as "[object Object]", one id for every such call), an
 * effect it would send as unspecified, and a wait or tool timeout that is
 * not a positive number of milliseconds.
 */
function checkCall(call: ToolCall, fn: unknown): void {
  if (typeof fn !== 'function') throw new TypeError(`fn: ${kindOf(fn)} is not a function; callTool runs fn(attempt)`);
  for (const k of STRING_FIELDS) {
    if (call[k] !== undefined && typeof call[k] !== 'string') throw new TypeError(`${k}: ${kindOf(call[k])}, not a string`);
  }
  if (call.effect !== undefined && !EFFECTS.includes(call.effect)) throw new TypeError(`effect: not one of ${EFFECTS.join(', ')}`);
  for (const k of ['waitMs', 'toolTimeoutMs'] as const) milliseconds(k, call[k]);
}

/** Throws a TypeError unless v is undefined or a positive, finite number (of milliseconds). */
function milliseconds(name: string, v: unknown): void {
  if (v !== undefined && !(typeof v === 'number' && Number.isFinite(v) && v > 0)) {
    throw new TypeError(`${name}: a positive number of milliseconds is required`);
  }
}

/** Whether a gRPC target names this machine: a Unix socket, or a host on loopback. */
function loopbackTarget(target: string): boolean {
  if (/^unix(-abstract)?:/.test(target)) return true;
  const rest = target.includes(':///') ? target.slice(target.indexOf(':///') + 4) : target.replace(/^(dns|ipv4|ipv6):/, '');
  let host = rest;
  if (rest.startsWith('[')) host = rest.slice(1, rest.indexOf(']'));
  else if (rest.split(':').length === 2) host = rest.split(':')[0];
  if (host === 'localhost') return true;
  if (net.isIPv4(host)) return host.startsWith('127.');
  return net.isIPv6(host) && new URL(`http://[${host}]`).hostname === '[::1]';
}

/** The kind of v an error may name: its type, never its value. */
function kindOf(v: unknown): string {
  return v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
}

/** The failure code of a FinalToolError without a code, or with one the ledger refuses. */
export const DEFAULT_FAILURE_CODE = 'tool_failed';
/** The failure code of a retryable failure proven not applied. */
export const RETRYABLE_FAILURE_CODE = 'retryable';

const RETRYABLE = new Set<number>([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);
const BACK_OFF_REASONS = new Set(['RATE_LIMITED']);
// The refusals of a Complete that say the ledger holds another outcome.
const CONFLICT_REASONS = new Set(['STALE_FENCING_TOKEN', 'COMPLETION_CONFLICT']);
const WAIT_BACKOFF_BASE_MS = 100;
const WAIT_BACKOFF_MAX_MS = 5000;

/** A failed attempt was refused because the claim was gone: the ledger's record says how the operation ended. */
class ClaimGone extends Error {}

/** Whether a call that failed with code and info may be repeated as it is. */
export function repeatable(code: number, info: { domain: string; reason: string } | null): boolean {
  if (code === grpc.status.RESOURCE_EXHAUSTED) {
    return Boolean(info) && info!.domain === DOMAIN && BACK_OFF_REASONS.has(info!.reason);
  }
  return RETRYABLE.has(code);
}

/** How long before its lease's end an attempt whose renewals fail is stopped: a tenth, at most 1 s. */
export function leaseMarginMs(leaseMs: number): number {
  return Math.min(leaseMs / 10, 1000);
}

/** The wait before the next Reserve after the nth DECISION_IN_PROGRESS, with jitter. */
export function inProgressDelay(n: number, retryAfterMs: number, random: () => number = Math.random): number {
  const backoff = Math.min(WAIT_BACKOFF_BASE_MS * 2 ** Math.min(Math.max(n, 1) - 1, 30), WAIT_BACKOFF_MAX_MS);
  const delay = Math.max(retryAfterMs, backoff);
  return delay + (random() * delay) / 2;
}

const leaseOf = (op: Operation): number => (op.lease_expires_at && op.updated_at
  ? timeMs(op.lease_expires_at) - timeMs(op.updated_at) : 0);

// When the claim in op, asked for at asked (performance.now()), ends at the latest.
const leaseEnd = (op: Operation, asked: number): number => Math.min(
  timeMs(op.lease_expires_at) - Date.now() + performance.now(), asked + leaseOf(op));

function defaultSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const stop = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', stop);
      resolve();
    }, ms);
    signal?.addEventListener('abort', stop, { once: true });
  });
}

type Request = Record<string, unknown>;
type Response = Record<string, any>;

/** A client of ledger.v1.LedgerService for one agent runtime. */
export class Ledger {
  readonly client: grpc.Client;
  readonly reconcilers: Record<string, Reconciler>;
  private readonly callTimeoutMs: number;
  private readonly ledgerRetries: number;
  private readonly log: (msg: string) => void;
  private readonly now: () => number;
  private readonly sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  private readonly metadata: grpc.Metadata;

  constructor(address: string, options: LedgerOptions = {}) {
    if (options.apiKey && !options.credentials?._isSecure() && !loopbackTarget(address)) {
      throw new TypeError(`apiKey: refusing to send an API key without TLS to ${address}, which is not this machine`
        + ' (loopback or a Unix socket); pass credentials: grpc.credentials.createSsl(...)');
    }
    milliseconds('callTimeoutMs', options.callTimeoutMs);
    const retries = options.ledgerRetries;
    if (retries !== undefined && !(Number.isInteger(retries) && retries >= 0)) {
      throw new TypeError('ledgerRetries: a whole number, 0 or more, is required');
    }
    for (const [tool, r] of Object.entries(options.reconcilers ?? {})) {
      if (typeof r !== 'function') throw new TypeError(`reconcilers[${JSON.stringify(tool)}]: ${kindOf(r)} is not a function`);
    }
    this.client = new LedgerServiceClient(address, options.credentials ?? grpc.credentials.createInsecure(),
      { interceptors: options.interceptors ?? [] });
    this.callTimeoutMs = options.callTimeoutMs ?? 5000;
    this.ledgerRetries = options.ledgerRetries ?? 3;
    this.log = options.log ?? (() => {});
    this.now = options.now ?? Date.now;
    this.sleep = options.sleep ?? defaultSleep;
    this.reconcilers = { ...(options.reconcilers ?? {}) };
    this.metadata = new grpc.Metadata();
    if (options.apiKey) this.metadata.set('authorization', `Bearer ${options.apiKey}`);
  }

  close(): void {
    this.client.close();
  }

  /**
   * Calls one ledger RPC, repeating it while the ledger is unavailable or
   * asks to back off; any other error becomes a LedgerError. An abort of
   * signal ends the wait before a repeat; until (performance.now()) cuts
   * the calls and their repeats there.
   */
  async rpc(method: string, request: Request, signal?: AbortSignal, until?: number): Promise<Response> {
    let lost = false;
    for (let attempt = 0; ; attempt += 1) {
      const timeoutMs = until === undefined ? this.callTimeoutMs : Math.min(this.callTimeoutMs, until - performance.now());
      if (timeoutMs <= 0) {
        throw new LedgerError({ code: grpc.status.DEADLINE_EXCEEDED, details: 'no time left for the call' }, null, null, lost);
      }
      try {
        return await this.call(method, request, Date.now() + timeoutMs);
      } catch (err) {
        const e = err as CallError & { metadata?: grpc.Metadata };
        if (e.code === undefined) throw err;
        lost = lost || UNANSWERED.has(e.code);
        const { info, retryAfterMs } = errorDetails(e);
        if (repeatable(e.code, info) && attempt < this.ledgerRetries) {
          let pauseMs = retryAfterMs ?? 100 * 2 ** attempt;
          if (until !== undefined) pauseMs = Math.max(Math.min(pauseMs, until - performance.now()), 0);
          await this.pause(pauseMs, signal);
          continue;
        }
        throw new LedgerError(e, info, retryAfterMs, lost);
      }
    }
  }

  private async pause(ms: number, signal?: AbortSignal): Promise<void> {
    if (!signal) return this.sleep(ms);
    signal.throwIfAborted();
    let stop: () => void = () => {};
    const aborted = new Promise<void>((_resolve, reject) => {
      stop = () => reject(signal.reason);
      signal.addEventListener('abort', stop, { once: true });
    });
    try {
      await Promise.race([this.sleep(ms, signal), aborted]);
    } finally {
      signal.removeEventListener('abort', stop);
    }
    signal.throwIfAborted();
  }

  /** Calls one ledger RPC once, with deadline (ms since the epoch); the error is grpc-js's own. */
  call(method: string, request: Request, deadline: number): Promise<Response> {
    return new Promise((resolve, reject) => {
      (this.client as any)[method](request, this.metadata, { deadline },
        (err: Error | null, resp: Response) => (err ? reject(err) : resolve(resp)));
    });
  }

  async lookup(operationId: string): Promise<Operation> {
    return (await this.rpc('Lookup', { operation_id: operationId })).operation;
  }

  /** Starts runId in the ledger, whose run guard then counts the run's tool calls (0: the policy's limit). */
  async startRun(runId: string, { maxSteps = 0, deadlineMs = 0, maxRepeats = 0, maxIrreversible = 0 } = {}): Promise<Run> {
    const limits: Request = { max_steps: maxSteps, max_repeats: maxRepeats, max_irreversible: maxIrreversible };
    if (deadlineMs) limits.deadline = { seconds: String(Math.floor(deadlineMs / 1000)), nanos: (deadlineMs % 1000) * 1e6 };
    return (await this.rpc('StartRun', { run_id: runId, limits })).run;
  }

  async getRun(runId: string): Promise<Run> {
    return (await this.rpc('GetRun', { run_id: runId })).run;
  }

  /** Ends runId as RUN_STATE_DONE or RUN_STATE_CANCELLED. */
  async endRun(runId: string, state = 'RUN_STATE_DONE', reason = ''): Promise<Run> {
    return (await this.rpc('EndRun', { run_id: runId, state, reason })).run;
  }

  /**
   * Runs fn at most once for call.operationId, whoever retries it and however
   * often. fn returns { resource_id, data }; it throws RetryableToolError when
   * nothing was applied, FinalToolError when the tool failed for good, and
   * anything else when it cannot tell (the ledger then records UNKNOWN). fn
   * has toolTimeoutMs; its signal is aborted then, when the claim is lost or
   * its lease is about to end with no renewal through, and when the caller's
   * signal is. A recorded outcome is replayed without running fn; an UNKNOWN
   * one is settled by the tool's reconciler, or throws
   * NeedsReconciliationError. The errors are those of the example module it
   * came from, documented in the README.
   */
  async callTool(call: ToolCall, fn: (a: Attempt) => ToolResult | Promise<ToolResult>): Promise<Outcome> {
    checkCall(call, fn);
    const { operationId, tool, params, permitId = '', effect = 'EFFECT_UNSPECIFIED', waitMs = 30000,
      toolTimeoutMs = 10000, signal, runId = '', compensates = '' } = call;
    const holder = crypto.randomBytes(16).toString('hex');
    const deadline = this.now() + waitMs;
    let waits = 0;
    let reconciled = 0;
    const request: Request = {
      operation_id: operationId, tool, params: toStruct(params, 'params'), permit_id: permitId, holder, effect, run_id: runId, compensates,
    };
    for (;;) {
      signal?.throwIfAborted();
      const asked = performance.now();
      let resp: Response;
      try {
        resp = await this.rpc('Reserve', request, signal);
      } catch (err) {
        if (err instanceof LedgerError && RUN_REASONS.has(err.reason)) throw new RunEndedError(err);
        if (signal?.aborted || (err instanceof LedgerError && err.answerLost)) await this.returnLostClaim(request);
        throw err;
      }
      const op: Operation = resp.operation;
      this.log(`Reserve ${operationId}: ${resp.decision} (${op.state}, attempt ${op.attempt})`);
      if (signal?.aborted) {
        if (resp.decision === 'DECISION_EXECUTE') await this.returnClaim(op, CALLER_GAVE_UP);
        signal.throwIfAborted();
      }
      switch (resp.decision) {
        case 'DECISION_REPLAY':
          if (op.state === 'STATE_SUCCEEDED') return Ledger.outcome(op, true, resp.receipt);
          throw new ToolFailedError(op.failure || {}, true, resp.receipt);
        case 'DECISION_IN_PROGRESS': {
          const left = deadline - this.now();
          if (left <= 0) throw new WaitBudgetSpentError(operationId, waitMs, { held: true });
          waits += 1;
          await this.pause(Math.min(inProgressDelay(waits, timeMs(resp.retry_after)), left), signal);
          break;
        }
        case 'DECISION_RECONCILE': {
          reconciled += 1;
          if (reconciled > 3) throw new NeedsReconciliationError(op, resp.receipt);
          const done = await this.reconcile(tool, op, resp.receipt);
          if (done) return done;
          break; // not applied: reserve again
        }
        case 'DECISION_EXECUTE':
          if (deadline - this.now() <= 0) {
            const returned = await this.returnClaim(op, CALLER_GAVE_UP);
            throw new WaitBudgetSpentError(operationId, waitMs, { returned });
          }
          if (leaseOf(op) > 0 && performance.now() >= leaseEnd(op, asked) - leaseMarginMs(leaseOf(op))) {
            await this.returnClaim(op, RETRYABLE_FAILURE_CODE);
            throw new LeaseEndedOnTheWayError(operationId);
          }
          try {
            return await this.execute(op, fn, toolTimeoutMs, signal, asked);
          } catch (err) {
            if (!(err instanceof ClaimGone)) throw err;
            // Reserve again: it replays the outcome that stands, waits for
            // the attempt that holds the operation, or claims it anew.
            break;
          }
        default:
          throw new Error(`unexpected decision ${resp.decision}`);
      }
    }
  }

  /** Asks tool's reconciler about op and records its finding; null: not applied, reserve again. */
  private async reconcile(tool: string, op: Operation, receipt: string): Promise<Outcome | null> {
    const reconciler = this.reconcilers[tool];
    // Once a human was asked (FINDING_ESCALATE), a human settles it.
    if (!reconciler || op.needs_review) throw new NeedsReconciliationError(op, receipt);
    let found: Finding;
    try {
      found = await reconciler(op);
    } catch (err) {
      this.log(`reconciler of ${tool} for ${op.operation_id}: ${(err as Error).message}`);
      throw new NeedsReconciliationError(op, receipt, err);
    }
    const request: Request = { operation_id: op.operation_id, finding: found.kind, note: found.note || '', fencing_token: op.fencing_token };
    try {
      if (found.kind === 'FINDING_APPLIED') request.result = { resource_id: resourceIdOf(found.resourceId), data: toStruct(found.data || {}, 'data') };
    } catch (err) {
      this.log(`reconciler of ${tool} for ${op.operation_id}: a finding that cannot be sent: ${(err as Error).message}`);
      throw new NeedsReconciliationError(op, receipt, err);
    }
    let got: Response;
    try {
      got = await this.rpc('Reconcile', request);
    } catch (err) {
      if (err instanceof LedgerError && err.code === grpc.status.INVALID_ARGUMENT) {
        // The ledger will not take the finding (data over 64 KiB, an id over 256 bytes): it decides nothing.
        this.log(`reconciler of ${tool} for ${op.operation_id}: the ledger refused its finding: ${err.message}`);
        throw new NeedsReconciliationError(op, receipt, err);
      }
      if (!(err instanceof LedgerError) || !['ALREADY_RESOLVED', 'STALE_FENCING_TOKEN'].includes(err.reason)) throw err;
      // someone else resolved it: what stands is the answer
      got = await this.rpc('Lookup', { operation_id: op.operation_id });
    }
    const rec: Operation = got.operation;
    if (rec.state === 'STATE_SUCCEEDED') return Ledger.outcome(rec, true, got.receipt);
    if (rec.state === 'STATE_FAILED_FINAL') throw new ToolFailedError(rec.failure || {}, true, got.receipt);
    if (rec.state === 'STATE_UNKNOWN') throw new NeedsReconciliationError(rec, got.receipt);
    return null;
  }

  /** Returns the claim a Reserve without an answer may have been granted (best effort, once). */
  private async returnLostClaim(request: Request): Promise<void> {
    const id = request.operation_id as string;
    const deadline = Date.now() + this.callTimeoutMs;
    try {
      const { operation } = await this.call('Lookup', { operation_id: id }, deadline);
      if (operation.state !== 'STATE_RUNNING') return;
      const resp = await this.call('Reserve', request, deadline);
      if (resp.decision !== 'DECISION_EXECUTE') return;
      await this.call('Complete', {
        operation_id: id, fencing_token: resp.operation.fencing_token, outcome: 'OUTCOME_FAILED_RETRYABLE', failure: { code: CALLER_GAVE_UP },
      }, deadline);
    } catch (err) {
      this.log(`returning the claim of ${id}: ${(err as Error).message}`);
    }
  }

  /** Completes an unused claim as a retryable failure proven not applied; whether the ledger took it. */
  private async returnClaim(op: Operation, code: string): Promise<boolean> {
    try {
      await this.rpc('Complete', {
        operation_id: op.operation_id, fencing_token: op.fencing_token, outcome: 'OUTCOME_FAILED_RETRYABLE', failure: { code },
      });
      return true;
    } catch (err) {
      this.log(`returning the claim of ${op.operation_id}: ${(err as Error).message}`);
      return false;
    }
  }

  private async execute(op: Operation, fn: (a: Attempt) => ToolResult | Promise<ToolResult>, toolTimeoutMs: number,
    signal: AbortSignal | undefined, asked: number): Promise<Outcome> {
    const claim = { operation_id: op.operation_id, fencing_token: op.fencing_token };
    const renewal = this.keepLeased(op, signal, asked);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        const err = new ToolTimedOutError(op.operation_id, toolTimeoutMs);
        reject(err);
        renewal.stop(err);
      }, Math.min(toolTimeoutMs, 2 ** 31 - 1));
    });
    let produced: ToolResult;
    try {
      produced = await Promise.race([Promise.resolve().then(() => fn({
        operationId: op.operation_id, idempotencyKey: op.operation_id, attempt: op.attempt,
        fencingToken: op.fencing_token, signal: renewal.signal,
      })), timedOut]);
    } catch (err) {
      clearTimeout(timer);
      renewal.stop();
      if (err instanceof FinalToolError) {
        const failed = (code: string) => ({ ...claim, outcome: 'OUTCOME_FAILED_FINAL', failure: { code, detail: err.detail } });
        const code = err.failureCode || DEFAULT_FAILURE_CODE;
        let done: Response;
        try {
          done = await this.reportFailure(failed(code), err);
        } catch (notRecorded) {
          const cause = (notRecorded as Error).cause;
          if (!(cause instanceof LedgerError && cause.code === grpc.status.INVALID_ARGUMENT && code !== DEFAULT_FAILURE_CODE)) {
            throw notRecorded;
          }
          done = await this.reportFailure(failed(DEFAULT_FAILURE_CODE), err);
        }
        throw new ToolFailedError(done.operation.failure || {}, false, done.receipt);
      }
      if (err instanceof RetryableToolError) {
        await this.reportFailure({ ...claim, outcome: 'OUTCOME_FAILED_RETRYABLE', failure: { code: RETRYABLE_FAILURE_CODE } }, err);
      } else {
        const reason = err instanceof ToolTimedOutError
          ? `no answer within the tool timeout (${toolTimeoutMs} ms)` : 'the tool ended without an answer';
        await this.report('MarkUnknown', { ...claim, reason }, { toolError: err });
      }
      throw err;
    }
    clearTimeout(timer);
    renewal.stop();
    const ran = { result: { resourceId: produced?.resource_id ?? '', data: produced?.data || {}, replayed: false } };
    let result: Request;
    try {
      if (produced != null && (typeof produced !== 'object' || Array.isArray(produced))) {
        // A string fn returned would otherwise be dropped, recorded as an empty result.
        throw new TypeError(`fn returned ${Array.isArray(produced) ? 'a list' : `a ${typeof produced}`}; return { resource_id, data }`);
      }
      result = { resource_id: resourceIdOf(produced?.resource_id), data: toStruct(ran.result.data, 'data') };
    } catch (err) {
      await this.report('MarkUnknown', { ...claim, reason: 'the result cannot be encoded' }, ran).catch(() => {});
      throw new NotRecordedError(err as Error, ran);
    }
    let done: Response;
    try {
      done = await this.report('Complete', { ...claim, outcome: 'OUTCOME_SUCCEEDED', result }, ran);
    } catch (err) {
      const cause = (err as Error).cause;
      if (cause instanceof LedgerError && CONFLICT_REASONS.has(cause.reason)) {
        throw new ConflictingOutcomeError(cause, ran.result, await this.read(op.operation_id), op);
      }
      if (cause instanceof LedgerError && cause.code === grpc.status.INVALID_ARGUMENT) {
        await this.report('MarkUnknown', { ...claim, reason: 'result data refused by the ledger' }, ran).catch(() => {});
      }
      throw err;
    }
    return Ledger.outcome(done.operation, false, done.receipt);
  }

  /** The operation's record, or null when it cannot be read. */
  private async read(operationId: string): Promise<Operation | null> {
    try {
      return await this.lookup(operationId);
    } catch (err) {
      this.log(`Lookup ${operationId}: ${(err as Error).message}`);
      return null;
    }
  }

  /** Records a failed attempt (see report); throws ClaimGone when the claim was gone by then. */
  private async reportFailure(request: Request, toolError: unknown): Promise<Response> {
    try {
      return await this.report('Complete', request, { toolError });
    } catch (err) {
      const cause = (err as Error).cause;
      if (cause instanceof LedgerError && CONFLICT_REASONS.has(cause.reason)) throw new ClaimGone();
      throw err;
    }
  }

  private async report(method: string, request: Request, ran: { result?: unknown; toolError?: unknown }): Promise<Response> {
    try {
      return await this.rpc(method, request);
    } catch (err) {
      throw new NotRecordedError(err as Error, ran);
    }
  }

  /** Renews the claim while the tool runs, so that two thirds of its lease are always left. */
  private keepLeased(op: Operation, cancelled: AbortSignal | undefined, asked: number) {
    const abort = new AbortController();
    const cancel = () => abort.abort(cancelled!.reason);
    if (cancelled?.aborted) cancel();
    else cancelled?.addEventListener('abort', cancel, { once: true });
    const lease = leaseOf(op);
    const margin = leaseMarginMs(lease);
    const period = Math.max(lease / 3, 10);
    let end = leaseEnd(op, asked);
    let timer: NodeJS.Timeout | undefined;
    let stopped = false;
    const renew = async () => {
      const sent = performance.now();
      try {
        const now = await this.rpc('Renew', { operation_id: op.operation_id, fencing_token: op.fencing_token }, undefined, end - margin);
        end = sent + lease;
        if (now?.operation?.lease_expires_at) end = Math.min(end, leaseEnd(now.operation, sent));
      } catch (err) {
        if (err instanceof LedgerError && !repeatable(err.code, err)) {
          abort.abort(err); // STALE_FENCING_TOKEN, NOT_FOUND: the claim is gone
          return;
        }
        if (performance.now() >= end - margin) {
          abort.abort(new Error(`the lease of operation ${op.operation_id} is about to end with no renewal getting through`));
          return;
        }
      }
      if (!stopped) timer = setTimeout(renew, Math.min(period, Math.max(end - margin - performance.now(), 0)));
    };
    if (lease > 0) timer = setTimeout(renew, Math.min(Math.max(end - performance.now() - (lease * 2) / 3, 0), period));
    return {
      signal: abort.signal,
      stop: (reason?: unknown) => {
        stopped = true;
        clearTimeout(timer);
        cancelled?.removeEventListener('abort', cancel);
        if (reason) abort.abort(reason);
      },
    };
  }

  /** The outcome a record holds. */
  static outcome(op: Operation, replayed: boolean, receipt = ''): Outcome {
    const result = op.result || {};
    return { resourceId: result.resource_id || '', data: fromStruct(result.data), replayed, operation: op, receipt: receipt || '' };
  }
}

export type { ErrorInfo };
