// The errors callTool throws, and the decoding of the ledger's error details.

import * as grpc from '@grpc/grpc-js';
import { ErrorInfoType, Operation, RetryInfoType, Status } from './proto';

/** The ErrorInfo domain of the ledger's errors. */
export const DOMAIN = 'ledger.v1';

/** A google.rpc.ErrorInfo. */
export interface ErrorInfo {
  reason: string;
  domain: string;
  metadata: Record<string, string>;
}

/** The codes of a call that may have reached the ledger and got no answer back. */
export const UNANSWERED = new Set<number>([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]);

/** The ErrorInfo reasons of a Reserve the ledger's run guard refused. */
export const RUN_REASONS = new Set(['RUN_STEP_LIMIT', 'RUN_DEADLINE', 'RUN_REPETITION', 'RUN_ENDED']);

/** What a failed gRPC call carries: its code and message. */
export interface CallError {
  code: number;
  details: string;
}

/**
 * A ledger call refused by the service: its gRPC code and the ErrorInfo it
 * carried. reason is IDEMPOTENCY_KEY_REUSED, STALE_FENCING_TOKEN, NOT_FOUND,
 * ...; for IDEMPOTENCY_KEY_REUSED, metadata.differs names what changed.
 * answerLost says whether this call, or a try of it that was repeated, got
 * no answer: the ledger may have done what was asked.
 */
export class LedgerError extends Error {
  readonly code: number;
  readonly codeName: string;
  readonly info: ErrorInfo | null;
  readonly details: string;
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Record<string, string>;
  readonly retryAfterMs: number | null;
  readonly answerLost: boolean;

  constructor(err: CallError, info: ErrorInfo | null, retryAfterMs: number | null = null, answerLost = false) {
    const codeName = Object.keys(grpc.status).find((k) => (grpc.status as any)[k] === err.code) || String(err.code);
    super(`${codeName} ${info ? info.reason : '(no ErrorInfo)'}: ${err.details}`);
    this.name = 'LedgerError';
    this.code = err.code;
    this.codeName = codeName;
    this.info = info;
    this.details = err.details;
    this.reason = info ? info.reason : '';
    this.domain = info ? info.domain : '';
    this.metadata = info ? { ...info.metadata } : {};
    this.retryAfterMs = retryAfterMs;
    this.answerLost = answerLost || UNANSWERED.has(err.code);
  }
}

/**
 * The ledger's run guard refused a new tool call: the run has ended. status
 * is the end as an agent runtime names it (step_limit, deadline,
 * repetition, done, cancelled). fn did not run.
 */
export class RunEndedError extends LedgerError {
  readonly runState: string;
  readonly limit: string;
  readonly status: string;

  constructor(err: LedgerError) {
    super({ code: err.code, details: err.details }, err.info, err.retryAfterMs, err.answerLost);
    this.name = 'RunEndedError';
    this.runState = err.metadata.run_state || '';
    this.limit = err.metadata.limit || '';
    this.status = this.runState.replace(/^RUN_STATE_/, '').toLowerCase();
  }
}

/** The operation failed for good (this call, or an earlier one replayed). */
export class ToolFailedError extends Error {
  readonly failureCode: string;
  /** What the destination answered, as a FinalToolError gave it; never in the error's message. */
  readonly detail: string;
  readonly replayed: boolean;
  /** The ledger's signed receipt of the failure ('' when it signs none). */
  readonly receipt: string;

  constructor(failure: { code?: string; message?: string; detail?: string }, replayed: boolean, receipt = '') {
    super(`tool failed (${failure.code || ''}): ${failure.message || ''}`);
    this.name = 'ToolFailedError';
    this.failureCode = failure.code || '';
    this.detail = failure.detail || '';
    this.replayed = replayed;
    this.receipt = receipt || '';
  }
}

/**
 * Nobody knows whether the effect happened: ask the destination, then
 * Reconcile. cause, when set, is why the tool's reconciler settled nothing
 * (it threw, or the ledger refused its finding).
 */
export class NeedsReconciliationError extends Error {
  readonly operation: Operation;
  /** The ledger's signed receipt of the UNKNOWN state ('' when it signs none). */
  readonly receipt: string;

  constructor(operation: Operation, receipt = '', cause?: unknown) {
    super(`operation ${operation.operation_id} needs reconciliation (${operation.reason})`, cause === undefined ? undefined : { cause });
    this.name = 'NeedsReconciliationError';
    this.operation = operation;
    this.receipt = receipt || '';
  }
}

/**
 * The tool applied its effect, but the ledger refused its result because it
 * holds another outcome: the claim was gone by then (STALE_FENCING_TOKEN: its
 * lease ended while renewals did not get through, and a reconciler, an
 * operator or another attempt settled the operation) or another outcome was
 * recorded with its token (COMPLETION_CONFLICT). Unlike NotRecordedError,
 * nothing will reconcile this effect as applied: another attempt may have
 * applied it again, and a retry may replay an outcome that is not this
 * effect's. result is what the tool returned, attempt its attempt;
 * operation is the record that stands, read after the refusal (recordRead),
 * or the claim as it was granted when that read failed; cause is the
 * refusal. Never retry: a human compares the destination with the record.
 */
export class ConflictingOutcomeError extends NeedsReconciliationError {
  readonly result: unknown;
  readonly attempt: number;
  readonly recordRead: boolean;

  constructor(cause: Error, result: unknown, stands: Operation | null, claim: Operation) {
    super(stands ?? claim, '', cause);
    this.name = 'ConflictingOutcomeError';
    this.result = result;
    this.attempt = claim.attempt;
    this.recordRead = stands !== null;
    const records = stands ? `records ${stands.state} (attempt ${stands.attempt})` : 'holds another outcome (the record could not be read)';
    this.message = `attempt ${claim.attempt} applied the effect of operation ${claim.operation_id}, but the ledger ${records}: ` +
      'a human compares the destination with the record';
  }
}

/**
 * The tool ran (it returned result, or threw toolError) but the ledger did
 * not record how it ended: the effect may exist. Never run the tool again
 * under a new operation id.
 */
export class NotRecordedError extends Error {
  readonly result: unknown;
  readonly toolError: unknown;

  constructor(cause: Error, { result, toolError }: { result?: unknown; toolError?: unknown } = {}) {
    super(`the ledger did not record how the tool ended: ${cause.message}`, { cause });
    this.name = 'NotRecordedError';
    this.result = result;
    this.toolError = toolError;
  }
}

/** The tool did not return within its timeout: the attempt is marked UNKNOWN. */
export class ToolTimedOutError extends Error {
  constructor(operationId: string, timeoutMs: number) {
    super(`the tool did not return within ${timeoutMs} ms: operation ${operationId} may have applied its effect`);
    this.name = 'ToolTimedOutError';
  }
}

/** The wait budget was spent before the tool could start; the tool did not run. */
export class WaitBudgetSpentError extends Error {
  readonly operationId: string;
  readonly returned: boolean;

  constructor(operationId: string, waitMs: number, { held = false, returned = false } = {}) {
    const what = held
      ? `operation ${operationId} is still held by another caller`
      : `the claim on operation ${operationId} came too late: the tool did not run, and the claim ${
        returned ? 'is returned unused' : 'could not be returned (it lapses with its lease)'}`;
    super(`wait budget spent (${waitMs} ms): ${what}; it may be retried under the same operation id`);
    this.name = 'WaitBudgetSpentError';
    this.operationId = operationId;
    this.returned = returned;
  }
}

/**
 * Throw from fn only when the failure proves nothing was applied (HTTP 429,
 * a refused connection): recorded as a retryable failure.
 */
export class RetryableToolError extends Error {
  constructor(message?: string) {
    super(message);
    this.name = 'RetryableToolError';
  }
}

/** The claim's lease ended, or nearly, before the answer granting it arrived: the tool did not run. */
export class LeaseEndedOnTheWayError extends RetryableToolError {
  readonly operationId: string;

  constructor(operationId: string) {
    super(`the claim's lease on operation ${operationId} ended, or was about to, before the answer granting it `
      + 'arrived: the tool did not run; it may be retried under the same operation id');
    this.name = 'LeaseEndedOnTheWayError';
    this.operationId = operationId;
  }
}

/**
 * Throw from fn when the tool failed for good (HTTP 400, a declined card); code is recorded.
 * detail, what the destination answered (its error body, which may quote the request), is
 * recorded as the failure's detail: replays return it in ToolFailedError.detail, and the ledger
 * keeps it as result data, out of pages and logs. It is cut to the ledger's 64 KiB of UTF-8.
 */
export class FinalToolError extends Error {
  readonly failureCode: string;
  readonly detail: string;

  constructor(code: string, message?: string, detail?: string) {
    super(message || code);
    this.name = 'FinalToolError';
    this.failureCode = code;
    this.detail = failureDetail(detail);
  }
}

/** The ledger's limit on a failure's detail, in bytes of UTF-8. */
const MAX_FAILURE_DETAIL = 64 << 10;

/** A detail as the ledger takes it: valid UTF-8 of at most 64 KiB, cut at a character; '' when not a string. */
function failureDetail(detail: unknown): string {
  if (typeof detail !== 'string') return '';
  const b = Buffer.from(detail, 'utf8'); // a lone surrogate becomes U+FFFD
  if (b.length <= MAX_FAILURE_DETAIL) return b.toString('utf8');
  let cut = MAX_FAILURE_DETAIL;
  while (cut > 0 && (b[cut] & 0xc0) === 0x80) cut--;
  return b.subarray(0, cut).toString('utf8');
}

/** Decodes the google.rpc.Status in a gRPC error's trailer: the ErrorInfo and the RetryInfo delay in ms. */
export function errorDetails(err: { metadata?: grpc.Metadata }): { info: ErrorInfo | null; retryAfterMs: number | null } {
  const out: { info: ErrorInfo | null; retryAfterMs: number | null } = { info: null, retryAfterMs: null };
  const raw = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (raw.length === 0) return out;
  const status = Status.decode(raw[0] as Buffer) as unknown as { details: { type_url: string; value: Uint8Array }[] };
  for (const any of status.details) {
    if (any.type_url === `type.googleapis.com/${ErrorInfoType.fullName.slice(1)}`) {
      out.info = ErrorInfoType.toObject(ErrorInfoType.decode(any.value), { defaults: true }) as ErrorInfo;
    } else if (any.type_url === `type.googleapis.com/${RetryInfoType.fullName.slice(1)}`) {
      const d = (RetryInfoType.decode(any.value) as unknown as { retry_delay?: { seconds?: unknown; nanos?: number } }).retry_delay;
      if (d) out.retryAfterMs = Number(d.seconds || 0) * 1000 + (d.nanos || 0) / 1e6;
    }
  }
  return out;
}
