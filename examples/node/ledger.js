'use strict';
// Wires the operation ledger into a Node.js agent runtime's side-effecting
// tool calls. Route every tool call that changes the world through
// Ledger.callTool:
//
//   const ledger = new Ledger('127.0.0.1:50051');
//   const outcome = await ledger.callTool({
//     operationId: `${runId}:${callId}`, // minted once, reused by every retry
//     tool: 'tickets.create',
//     params: { title: 'Printer on fire', priority: 2 },
//     permitId: approvalId,
//   }, (attempt) => tickets.create({ ..., idempotencyKey: attempt.idempotencyKey }));
//
// callTool reserves the operation, runs fn only when the ledger says
// DECISION_EXECUTE, records the outcome with the attempt's fencing token, and
// otherwise replays the recorded result, waits for another caller's live
// claim, or stops for reconciliation. Refusals arrive as LedgerError with the
// google.rpc.ErrorInfo reason the service attached (IDEMPOTENCY_KEY_REUSED, ...).
//
// The service is loaded at run time from proto/ledger/v1/ledger.proto with
// @grpc/proto-loader; the error details (google.rpc.Status, ErrorInfo,
// RetryInfo) from third_party/googleapis with protobufjs.

const crypto = require('node:crypto');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const REPO = path.resolve(__dirname, '..', '..');

const ledgerProto = grpc.loadPackageDefinition(protoLoader.loadSync('ledger/v1/ledger.proto', {
  // google/protobuf/*.proto come with proto-loader; google/api (the HTTP
  // mapping's options) is in third_party.
  includeDirs: [path.join(REPO, 'proto'), path.join(REPO, 'third_party', 'googleapis')],
  keepCase: true, // fields keep their wire names: operation_id, fencing_token, ...
  longs: String, // uint64 fencing tokens as decimal strings: no precision lost
  enums: String,
  defaults: true,
  oneofs: true,
})).ledger.v1;

const rpcTypes = new protobuf.Root();
rpcTypes.resolvePath = (origin, target) => (target.startsWith('google/protobuf/')
  ? target // protobufjs has the well-known types built in
  : path.join(REPO, 'third_party', 'googleapis', target));
rpcTypes.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
const Status = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfo = rpcTypes.lookupType('google.rpc.ErrorInfo');
const RetryInfo = rpcTypes.lookupType('google.rpc.RetryInfo');

const DOMAIN = 'ledger.v1';

// A ledger call refused by the service: its gRPC code, and the ErrorInfo it
// carried. reason is IDEMPOTENCY_KEY_REUSED, STALE_FENCING_TOKEN, NOT_FOUND,
// ...; for IDEMPOTENCY_KEY_REUSED, metadata.differs names what changed.
// answerLost says whether this call, or a try of it that rpc repeated, got
// no answer (UNANSWERED): the ledger may have done what was asked.
class LedgerError extends Error {
  constructor(err, info, retryAfterMs, answerLost = false) {
    const codeName = Object.keys(grpc.status).find((k) => grpc.status[k] === err.code) || String(err.code);
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

// The ErrorInfo reasons of a Reserve the ledger's run guard refused.
const RUN_REASONS = new Set(['RUN_STEP_LIMIT', 'RUN_DEADLINE', 'RUN_REPETITION', 'RUN_ENDED']);

// The ledger's run guard refused a new tool call: the run has ended.
// runState is the run's state (RUN_STATE_STEP_LIMIT, ...), limit the limit
// this call reached (empty when the run had ended before), status the end as
// an agent runtime names it (step_limit, deadline, repetition, done,
// cancelled). fn did not run. Stop the run: it is no failure of the tool.
class RunEndedError extends LedgerError {
  constructor(err) {
    super({ code: err.code, details: err.details }, err.info, err.retryAfterMs, err.answerLost);
    this.name = 'RunEndedError';
    this.runState = err.metadata.run_state || '';
    this.limit = err.metadata.limit || '';
    this.status = this.runState.replace(/^RUN_STATE_/, '').toLowerCase();
  }
}

// The operation failed for good (this call, or an earlier one replayed).
class ToolFailedError extends Error {
  constructor(failure, replayed) {
    super(`tool failed (${failure.code}): ${failure.message}`);
    this.name = 'ToolFailedError';
    this.failureCode = failure.code;
    this.replayed = replayed;
  }
}

// Nobody knows whether the effect happened: ask the destination, then Reconcile.
class NeedsReconciliationError extends Error {
  constructor(operation) {
    super(`operation ${operation.operation_id} needs reconciliation (${operation.reason})`);
    this.name = 'NeedsReconciliationError';
    this.operation = operation;
  }
}

// The tool ran (it returned result, or threw toolError) but the ledger did
// not record how it ended: the effect may exist. Use the result; never run the
// tool again under a new operation id. A retry under the same id waits for
// the claim's lease to end; an irreversible tool is then reconciled first.
// When the result cannot be encoded, or the ledger refuses it (cause is a
// LedgerError INVALID_ARGUMENT: data over 64 KiB as JSON, a resource id over
// 256 bytes), the attempt is marked UNKNOWN at once: a retry is told to
// reconcile without waiting for the lease.
class NotRecordedError extends Error {
  constructor(cause, { result, toolError } = {}) {
    super(`the ledger did not record how the tool ended: ${cause.message}`, { cause });
    this.name = 'NotRecordedError';
    this.result = result;
    this.toolError = toolError;
  }
}

// The tool did not return within its timeout (toolTimeoutMs): it may still
// apply its effect, so the attempt is marked UNKNOWN and left to
// reconciliation; whatever the tool returns later is discarded.
class ToolTimedOutError extends Error {
  constructor(operationId, timeoutMs) {
    super(`the tool did not return within ${timeoutMs} ms: operation ${operationId} may have applied its effect`);
    this.name = 'ToolTimedOutError';
  }
}

// callTool's wait budget (waitMs) was spent before the tool could start:
// another caller still held the claim, or the claim came too late and was
// returned unused (returned; false when the ledger could not take it back,
// and it lapses with its lease). The tool did not run: the operation may be
// retried under the same operation id.
class WaitBudgetSpentError extends Error {
  constructor(operationId, waitMs, { held = false, returned = false } = {}) {
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

// Throw from fn only when the failure proves nothing was applied (HTTP 429, a
// refused connection); callTool records it as a retryable failure (failure
// code RETRYABLE_FAILURE_CODE), as the Go SDK does. An HTTP 503 or a gRPC
// RESOURCE_EXHAUSTED or ABORTED may come after the effect: let those
// propagate (UNKNOWN), unless the destination guarantees they mean refused
// before processing.
class RetryableToolError extends Error {}

// The claim's lease ended, or came within its margin of its end (see
// leaseMarginMs), before the Reserve answer granting it arrived. The tool
// did not run: the claim is returned as a retryable attempt, proven not
// applied (failure code RETRYABLE_FAILURE_CODE; or, if the ledger cannot be
// reached, lapses with its lease), and the operation may be retried under
// the same operation id.
class LeaseEndedOnTheWayError extends RetryableToolError {
  constructor(operationId) {
    super(`the claim's lease on operation ${operationId} ended, or was about to, before the answer granting it `
      + 'arrived: the tool did not run; it may be retried under the same operation id');
    this.name = 'LeaseEndedOnTheWayError';
    this.operationId = operationId;
  }
}

// Throw from fn when the tool failed for good (HTTP 400, a declined card).
// code is recorded as the operation's failure code, or tool_failed when it
// is missing or empty, or when the ledger refuses it (over 128 bytes, with a
// control character, or a lone surrogate, which protobufjs sends as invalid
// UTF-8), as in the Go SDK: the ToolFailedError callTool throws carries the
// code recorded. The message is not sent to the ledger.
class FinalToolError extends Error {
  constructor(code, message) {
    super(message || code);
    this.failureCode = code;
  }
}

// Decodes the google.rpc.Status in a gRPC error's grpc-status-details-bin
// trailer: the ErrorInfo (null when none) and the RetryInfo delay in ms.
function errorDetails(err) {
  const out = { info: null, retryAfterMs: null };
  const raw = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (raw.length === 0) return out;
  for (const any of Status.decode(raw[0]).details) {
    if (any.type_url === `type.googleapis.com/${ErrorInfo.fullName.slice(1)}`) {
      out.info = ErrorInfo.toObject(ErrorInfo.decode(any.value), { defaults: true });
    } else if (any.type_url === `type.googleapis.com/${RetryInfo.fullName.slice(1)}`) {
      const d = RetryInfo.decode(any.value).retry_delay;
      if (d) out.retryAfterMs = Number(d.seconds || 0) * 1000 + (d.nanos || 0) / 1e6;
    }
  }
  return out;
}

// google.protobuf.Struct <-> plain JSON objects, in proto-loader's shape. The
// well-known types come from protobufjs's built-in copies, whose field names
// are camelCase (numberValue, structValue, ...) whatever keepCase says.
//
// Only what JSON can carry is sent: a value that has no JSON form (a BigInt,
// NaN, a Map, a class instance) is refused with a TypeError rather than sent
// as {} or null, where two different requests would share a fingerprint and
// the second would replay the first's result. A Date is sent as its ISO
// string (toJSON).
function toValue(v) {
  if (v === null || v === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof v === 'number' && Number.isFinite(v)) return { numberValue: v };
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  if (typeof v === 'object' && typeof v.toJSON === 'function') return toValue(v.toJSON());
  if (typeof v === 'object' && [Object.prototype, null].includes(Object.getPrototypeOf(v))) {
    return { structValue: { fields: Object.fromEntries(Object.entries(v).map(([k, x]) => [k, toValue(x)])) } };
  }
  const what = typeof v === 'object' ? `a ${v.constructor?.name || 'object'}` : `${typeof v} ${String(v)}`;
  throw new TypeError(`no JSON value for ${what}`);
}
function toStruct(obj) {
  const v = toValue(obj);
  if (!v.structValue) throw new TypeError('params and result data must be JSON objects');
  return v.structValue;
}
function fromValue(v) {
  switch (v.kind) {
    case 'numberValue': return v.numberValue;
    case 'stringValue': return v.stringValue;
    case 'boolValue': return v.boolValue;
    case 'listValue': return (v.listValue.values || []).map(fromValue);
    case 'structValue': return fromStruct(v.structValue);
    default: return null;
  }
}
function fromStruct(s) {
  return Object.fromEntries(Object.entries((s && s.fields) || {}).map(([k, v]) => [k, fromValue(v)]));
}

// Waits ms; an abort of signal (optional) ends the wait at once, rejecting
// with its reason.
const sleep = (ms, signal) => new Promise((resolve, reject) => {
  let timer;
  const stop = () => {
    clearTimeout(timer);
    reject(signal.reason);
  };
  timer = setTimeout(() => {
    signal?.removeEventListener('abort', stop);
    resolve();
  }, ms);
  signal?.addEventListener('abort', stop, { once: true });
});
const timeMs = (t) => (t ? Number(t.seconds || 0) * 1000 + (t.nanos || 0) / 1e6 : 0);
// How long (ms) before its lease's end, as this process tells it, an attempt
// whose renewals do not get through is stopped: a tenth of the lease (ms), at
// most 1 s, as in the Go SDK. The ledger lets another holder claim the
// operation once the lease has ended on the store's clock, a timer may fire
// late on a busy machine, and the tool takes a moment to see its signal
// aborted: stopping it early keeps it from running on a claim that is
// someone else's.
function leaseMarginMs(leaseMs) {
  return Math.min(leaseMs / 10, 1000);
}

// The length (ms) of the claim's lease in op; 0 when op has none.
const leaseOf = (op) => (op.lease_expires_at && op.updated_at
  ? timeMs(op.lease_expires_at) - timeMs(op.updated_at) : 0);

// When the claim in op, asked for at asked, ends at the latest, on
// performance.now()'s clock: the earlier of the end the ledger reported (on
// the store's clock) and a lease after the claim (or its renewal) was asked
// for, since the store's clock may be ahead of this one, and the lease never
// began before it was asked for.
const leaseEnd = (op, asked) => Math.min(
  timeMs(op.lease_expires_at) - Date.now() + performance.now(), asked + leaseOf(op));

const durationMs = (d) => (d ? Number(d.seconds || 0) * 1000 + (d.nanos || 0) / 1e6 : 0);

// The backoff between Reserves while another caller holds the claim.
const WAIT_BACKOFF_BASE_MS = 100;
const WAIT_BACKOFF_MAX_MS = 5000;

// How long callTool waits before its next Reserve after the nth (n ≥ 1)
// DECISION_IN_PROGRESS, whose retry_after was retryAfterMs: the ledger's
// retry_after or a backoff doubling from 100 ms up to 5 s, whichever is
// longer, plus up to half of that again at random (random() in [0, 1)), so
// that callers waiting on one claim spread out instead of asking together.
function inProgressDelay(n, retryAfterMs, random = Math.random) {
  const backoff = Math.min(WAIT_BACKOFF_BASE_MS * 2 ** Math.min(Math.max(n, 1) - 1, 30), WAIT_BACKOFF_MAX_MS);
  const delay = Math.max(retryAfterMs, backoff);
  return delay + (random() * delay) / 2;
}

// Every ledger RPC is safe to repeat with the same arguments: UNAVAILABLE
// and DEADLINE_EXCEEDED mean "repeat the same call".
const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED]);

// The ledger's ErrorInfo reasons of a RESOURCE_EXHAUSTED that mean "back off
// (the RetryInfo says how long) and repeat": the tenant is over its rate.
// UNRESOLVED_LIMIT (the tenant holds as many unresolved operations as it
// may) is not among them: a repeat a second later rarely finds one resolved,
// so it is thrown at once, as the Go SDK returns it (ErrQuotaExceeded).
const BACK_OFF_REASONS = new Set(['RATE_LIMITED']);

// The codes of a call that may have reached the ledger and got no answer
// back: it may have done what was asked.
const UNANSWERED = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]);

// The failure code of a claim returned unused by a caller that gave up:
// waiting for the Reserve that granted it (see returnLostClaim), or on the
// claim itself, which came after its wait budget (see returnClaim).
const CALLER_GAVE_UP = 'caller_gave_up';

// The failure code recorded for a FinalToolError without a code (missing or
// empty), or whose code the ledger refuses (over 128 bytes, or with a
// control character), as in the Go SDK.
const DEFAULT_FAILURE_CODE = 'tool_failed';

// The failure code recorded for a retryable failure proven not applied: a
// RetryableToolError from the tool, or a claim returned because its lease
// ended on the way (LeaseEndedOnTheWayError), as in the Go SDK.
const RETRYABLE_FAILURE_CODE = 'retryable';

// Whether a call that failed with code, and the ErrorInfo (or LedgerError)
// info, may be repeated as it is. A RESOURCE_EXHAUSTED without one of the
// ledger's reasons is gRPC's own refusal (a message over the size limit):
// the same call would be refused again.
function repeatable(code, info) {
  if (code === grpc.status.RESOURCE_EXHAUSTED) {
    return Boolean(info) && info.domain === DOMAIN && BACK_OFF_REASONS.has(info.reason);
  }
  return RETRYABLE.has(code);
}

class Ledger {
  // now and sleep are the clock of the waits between ledger calls (tests
  // pass their own; sleep(ms, signal) may ignore signal); call deadlines,
  // leases and the tool timeout keep the real one.
  constructor(address, {
    credentials = grpc.credentials.createInsecure(), callTimeoutMs = 5000, ledgerRetries = 3, log = () => {},
    now = Date.now, sleep: wait = sleep,
  } = {}) {
    this.client = new ledgerProto.LedgerService(address, credentials);
    this.callTimeoutMs = callTimeoutMs;
    this.ledgerRetries = ledgerRetries;
    this.log = log;
    this.now = now;
    this.sleep = wait;
  }

  close() {
    this.client.close();
  }

  // Calls one ledger RPC, repeating it while the ledger is unavailable or
  // asks to back off (see repeatable); any other error becomes a LedgerError
  // with its ErrorInfo reason. An abort of signal (optional) ends the wait
  // before a repeat, with its reason; a call on its way is not cut off.
  // until (optional, on performance.now()'s clock) cuts the calls and their
  // repeats there: a call still unanswered then fails with DEADLINE_EXCEEDED.
  async rpc(method, request, signal, until) {
    let lost = false; // a try got no answer: the ledger may have done what was asked
    for (let attempt = 0; ; attempt += 1) {
      const timeoutMs = until === undefined ? this.callTimeoutMs : Math.min(this.callTimeoutMs, until - performance.now());
      if (timeoutMs <= 0) {
        throw new LedgerError({ code: grpc.status.DEADLINE_EXCEEDED, details: 'no time left for the call' }, null, undefined, lost);
      }
      try {
        return await this.call(method, request, Date.now() + timeoutMs);
      } catch (err) {
        if (err.code === undefined) throw err;
        lost = lost || UNANSWERED.has(err.code);
        const { info, retryAfterMs } = errorDetails(err);
        if (repeatable(err.code, info) && attempt < this.ledgerRetries) {
          let pauseMs = retryAfterMs ?? 100 * 2 ** attempt;
          if (until !== undefined) pauseMs = Math.max(Math.min(pauseMs, until - performance.now()), 0);
          await this.pause(pauseMs, signal);
          continue;
        }
        throw new LedgerError(err, info, retryAfterMs, lost);
      }
    }
  }

  // Waits ms on this.sleep's clock. When signal (optional) is aborted,
  // before or during the wait, it rejects with the signal's reason.
  async pause(ms, signal) {
    if (!signal) return this.sleep(ms);
    signal.throwIfAborted();
    let stop;
    const aborted = new Promise((resolve, reject) => {
      stop = () => reject(signal.reason);
      signal.addEventListener('abort', stop, { once: true });
    });
    try {
      await Promise.race([this.sleep(ms, signal), aborted]);
    } finally {
      signal.removeEventListener('abort', stop);
    }
    return signal.throwIfAborted();
  }

  // Calls one ledger RPC once, with deadline (ms since the epoch); the error
  // is grpc-js's own.
  call(method, request, deadline) {
    return new Promise((resolve, reject) => {
      this.client[method](request, { deadline }, (err, resp) => (err ? reject(err) : resolve(resp)));
    });
  }

  async lookup(operationId) {
    return (await this.rpc('Lookup', { operation_id: operationId })).operation;
  }

  // Starts runId in the ledger, whose run guard then counts the run's tool
  // calls. Limits left at 0 are the tenant policy's; maxRepeats bounds the
  // calls of one tool with the same parameters (2 refuses the third). A
  // repeat with the same limits returns the run. callTool({ runId }) throws
  // RunEndedError for the call past a limit.
  async startRun(runId, { maxSteps = 0, deadlineMs = 0, maxRepeats = 0, maxIrreversible = 0 } = {}) {
    const limits = { max_steps: maxSteps, max_repeats: maxRepeats, max_irreversible: maxIrreversible };
    if (deadlineMs) {
      limits.deadline = { seconds: String(Math.floor(deadlineMs / 1000)), nanos: (deadlineMs % 1000) * 1e6 };
    }
    return (await this.rpc('StartRun', { run_id: runId, limits })).run;
  }

  async getRun(runId) {
    return (await this.rpc('GetRun', { run_id: runId })).run;
  }

  // Ends runId as RUN_STATE_DONE or RUN_STATE_CANCELLED: the ledger admits no
  // new call in it.
  async endRun(runId, state = 'RUN_STATE_DONE', reason = '') {
    return (await this.rpc('EndRun', { run_id: runId, state, reason })).run;
  }

  // Runs fn at most once for op.operationId, whoever retries it and however
  // often. fn gets { operationId, idempotencyKey, attempt, fencingToken,
  // signal } and returns { resource_id, data }. It throws RetryableToolError
  // when nothing was applied, FinalToolError when the tool failed for good,
  // and anything else when it cannot tell (a timeout): the ledger then
  // records UNKNOWN and the operation must be reconciled before an
  // irreversible tool runs again. fn has toolTimeoutMs to return: then
  // signal is aborted, the lease is no longer renewed, the attempt is marked
  // UNKNOWN and callTool throws ToolTimedOutError without waiting for fn.
  // signal is also aborted leaseMarginMs before the claim's lease ends while
  // no renewal gets through (see keepLeased); a Reserve answer that arrives
  // within that margin does not start fn: the claim is returned as a
  // retryable attempt, proven not applied, and callTool throws
  // LeaseEndedOnTheWayError.
  // When the ledger cannot record how fn ended, callTool throws
  // NotRecordedError: fn ran, and must not run again under a new operation id.
  // A result the ledger refuses (INVALID_ARGUMENT: over its size limits) or
  // that cannot be encoded is never recorded: the attempt is marked UNKNOWN,
  // and callTool throws NotRecordedError with it.
  // While another caller holds the claim, callTool reserves again after a
  // backoff (see inProgressDelay) until waitMs is up, then throws
  // WaitBudgetSpentError. waitMs bounds the time from the call to the start
  // of fn: a claim that comes when it is up (a Reserve answered late, or the
  // last one, at the end of a wait) is returned unused (caller_gave_up) and
  // callTool throws WaitBudgetSpentError; fn does not run.
  // When a Reserve gets no answer (UNAVAILABLE, DEADLINE_EXCEEDED after the
  // repeats, or before repeats refused for the rate), callTool throws its
  // LedgerError, fn does not run, and a claim the ledger granted all the
  // same is returned (see returnLostClaim). A Reserve refused because the
  // tenant holds as many unresolved operations as it may (RESOURCE_EXHAUSTED,
  // reason UNRESOLVED_LIMIT) is not repeated: callTool throws its LedgerError
  // at once, and fn does not run; retry later under the same operation id,
  // once operations are resolved.
  // signal (an AbortSignal, optional) cancels the call. Before fn starts,
  // callTool throws the signal's reason: no further Reserve goes out, waits
  // end at once, fn does not run, and a claim that comes all the same (a
  // Reserve on its way is not cut off) is returned unused, as above. While
  // fn runs, the abort reaches it through attempt.signal; callTool still
  // waits for fn (at most toolTimeoutMs) and records how it ended, as
  // without a cancellation: what fn returns is returned, what it throws is
  // thrown.
  // With runId, the call is a step of that run: when the ledger's run guard
  // refuses it (the run started with startRun, or governed by the tenant's
  // policy, has ended or this call would pass its limit), callTool throws
  // RunEndedError and fn does not run. A retry of a call the run admitted is
  // never refused.
  async callTool({
    operationId, tool, params, permitId, effect = 'EFFECT_UNSPECIFIED', waitMs = 30000, toolTimeoutMs = 10000,
    signal, runId = '',
  }, fn) {
    const holder = crypto.randomBytes(16).toString('hex'); // one per call, never a hostname or pid
    const deadline = this.now() + waitMs;
    let waits = 0;
    const request = {
      operation_id: operationId, tool, params: toStruct(params), permit_id: permitId, holder, effect, run_id: runId,
    };
    for (;;) {
      signal?.throwIfAborted();
      const asked = performance.now();
      let resp;
      try {
        resp = await this.rpc('Reserve', request, signal);
      } catch (err) {
        if (err instanceof LedgerError && RUN_REASONS.has(err.reason)) throw new RunEndedError(err);
        // The caller gives up on a Reserve that got no answer (the last
        // try, or one before repeats refused for the rate), or cancels while
        // it is repeated: the ledger may have granted the claim all the same.
        if (signal?.aborted || (err instanceof LedgerError && err.answerLost)) {
          await this.returnLostClaim(request);
        }
        throw err;
      }
      const op = resp.operation;
      this.log(`Reserve ${operationId}: ${resp.decision} (${op.state}, attempt ${op.attempt}, fencing token ${op.fencing_token})`);
      if (signal?.aborted) {
        // The caller cancelled while the Reserve was on its way: the tool
        // does not run, and a claim the answer brings is returned.
        if (resp.decision === 'DECISION_EXECUTE') await this.returnClaim(op);
        signal.throwIfAborted();
      }
      switch (resp.decision) {
        case 'DECISION_REPLAY':
          if (op.state === 'STATE_SUCCEEDED') return Ledger.outcome(op, true);
          throw new ToolFailedError(op.failure || {}, true);
        case 'DECISION_IN_PROGRESS': {
          // Another caller's live claim: Reserve again after a backoff (see
          // inProgressDelay), the last time when waitMs is up.
          const left = deadline - this.now();
          if (left <= 0) throw new WaitBudgetSpentError(operationId, waitMs, { held: true });
          waits += 1;
          await this.pause(Math.min(inProgressDelay(waits, durationMs(resp.retry_after)), left), signal);
          break;
        }
        case 'DECISION_RECONCILE':
          throw new NeedsReconciliationError(op);
        case 'DECISION_EXECUTE':
          if (deadline - this.now() <= 0) {
            // The caller's wait is over: the tool does not run behind its
            // back. The claim is returned, rather than left to expire into
            // UNKNOWN.
            const returned = await this.returnClaim(op);
            throw new WaitBudgetSpentError(operationId, waitMs, { returned });
          }
          if (leaseOf(op) > 0 && performance.now() >= leaseEnd(op, asked) - leaseMarginMs(leaseOf(op))) {
            // The answer took longer than the lease, less its margin: the
            // claim may be someone else's already, or the tool would be
            // stopped at once. It does not run; the claim is returned as a
            // retryable attempt, proven not applied (when that fails, it
            // lapses with its lease: the tool did not run all the same).
            try {
              await this.rpc('Complete', {
                operation_id: op.operation_id,
                fencing_token: op.fencing_token,
                outcome: 'OUTCOME_FAILED_RETRYABLE',
                failure: { code: RETRYABLE_FAILURE_CODE },
              });
            } catch (err) {
              this.log(`returning the claim of ${op.operation_id}: ${err.message}`);
            }
            throw new LeaseEndedOnTheWayError(operationId);
          }
          return this.execute(op, fn, toolTimeoutMs, signal, asked);
        default:
          throw new Error(`unexpected decision ${resp.decision}`);
      }
    }
  }

  // Returns the claim a Reserve (request) may have been granted though its
  // answer never came back, so that it does not run until its lease ends and
  // then turn an irreversible operation UNKNOWN, calling for the
  // reconciliation of an attempt that never ran. Only a RUNNING record is
  // touched: Reserve again under the same holder recovers this call's claim
  // (DECISION_EXECUTE, same fencing token) or says another caller holds it;
  // the recovered claim is completed as a retryable failure proven not
  // applied (caller_gave_up), and the operation is PENDING, free for a retry.
  // A record that does not exist (the Reserve never arrived) is not created.
  // Best effort, each call once, all within one call timeout: a failure
  // leaves the claim to its lease, as before.
  async returnLostClaim(request) {
    const id = request.operation_id;
    const deadline = Date.now() + this.callTimeoutMs;
    try {
      const { operation } = await this.call('Lookup', { operation_id: id }, deadline);
      if (operation.state !== 'STATE_RUNNING') return;
      const resp = await this.call('Reserve', request, deadline);
      if (resp.decision !== 'DECISION_EXECUTE') return;
      await this.call('Complete', {
        operation_id: id,
        fencing_token: resp.operation.fencing_token,
        outcome: 'OUTCOME_FAILED_RETRYABLE',
        failure: { code: CALLER_GAVE_UP },
      }, deadline);
      this.log(`Complete ${id}: the claim granted to a Reserve without an answer is returned unused`);
    } catch (err) {
      this.log(`returning the claim of ${id}: ${err.message}`);
    }
  }

  // Returns a claim the caller will not use: completes it as a retryable
  // failure proven not applied (caller_gave_up), so the operation is PENDING,
  // free for a retry. Returns whether the ledger took it back; when it did
  // not, the claim lapses with its lease.
  async returnClaim(op) {
    try {
      await this.rpc('Complete', {
        operation_id: op.operation_id,
        fencing_token: op.fencing_token,
        outcome: 'OUTCOME_FAILED_RETRYABLE',
        failure: { code: CALLER_GAVE_UP },
      });
      this.log(`Complete ${op.operation_id}: the claim is returned unused`);
      return true;
    } catch (err) {
      this.log(`returning the claim of ${op.operation_id}: ${err.message}`);
      return false;
    }
  }

  async execute(op, fn, toolTimeoutMs, signal, asked) {
    const claim = { operation_id: op.operation_id, fencing_token: op.fencing_token };
    const renewal = this.keepLeased(op, signal, asked);
    let timer;
    const timedOut = new Promise((resolve, reject) => {
      timer = setTimeout(() => {
        const err = new ToolTimedOutError(op.operation_id, toolTimeoutMs);
        reject(err); // first, so that the race below ends with it
        renewal.stop(err); // no more renewals: the lease lapses on its own
      }, Math.min(toolTimeoutMs, 2 ** 31 - 1)); // setTimeout takes at most 2^31-1 ms
    });
    let produced;
    try {
      // The tool's promise races the timeout: a hung tool is not waited for,
      // and what it returns after the timeout is discarded.
      produced = await Promise.race([fn({
        operationId: op.operation_id,
        idempotencyKey: op.operation_id,
        attempt: op.attempt,
        fencingToken: op.fencing_token,
        signal: renewal.signal, // aborted at the timeout, when the claim is lost or the caller cancels: stop if you can
      }), timedOut]);
    } catch (err) {
      clearTimeout(timer);
      renewal.stop();
      if (err instanceof FinalToolError) {
        const failed = (code) => ({ ...claim, outcome: 'OUTCOME_FAILED_FINAL', failure: { code } });
        // A failure without a code is recorded under the default one, as in
        // the Go SDK, not with an empty code.
        const code = err.failureCode || DEFAULT_FAILURE_CODE;
        let done;
        try {
          done = await this.report('Complete', failed(code), { toolError: err });
        } catch (notRecorded) {
          if (!(notRecorded.cause instanceof LedgerError && notRecorded.cause.code === grpc.status.INVALID_ARGUMENT
            && code !== DEFAULT_FAILURE_CODE)) throw notRecorded;
          // The ledger refuses the code (over 128 bytes, a control
          // character): the attempt still failed for good, under the
          // default code, rather than leave the claim to expire into
          // UNKNOWN.
          done = await this.report('Complete', failed(DEFAULT_FAILURE_CODE), { toolError: err });
        }
        throw new ToolFailedError(done.operation.failure || {}, false);
      }
      if (err instanceof RetryableToolError) {
        await this.report('Complete', {
          ...claim, outcome: 'OUTCOME_FAILED_RETRYABLE', failure: { code: RETRYABLE_FAILURE_CODE },
        }, { toolError: err });
      } else {
        // A timeout, a crash of the tool: nobody knows whether it applied.
        const reason = err instanceof ToolTimedOutError
          ? `no answer within the tool timeout (${toolTimeoutMs} ms)` : 'the tool ended without an answer';
        await this.report('MarkUnknown', { ...claim, reason }, { toolError: err });
      }
      throw err;
    }
    clearTimeout(timer);
    renewal.stop();
    const ran = { result: { resourceId: produced?.resource_id || '', data: produced?.data || {}, replayed: false } };
    let result;
    try {
      result = { resource_id: ran.result.resourceId, data: toStruct(ran.result.data) };
    } catch (err) {
      // The effect happened but its result cannot be sent: leave it to
      // reconciliation rather than record a result that is not the tool's.
      await this.report('MarkUnknown', { ...claim, reason: 'the result cannot be encoded' }, ran).catch(() => {});
      throw new NotRecordedError(err, ran);
    }
    let done;
    try {
      done = await this.report('Complete', { ...claim, outcome: 'OUTCOME_SUCCEEDED', result }, ran);
    } catch (err) {
      if (err.cause instanceof LedgerError && err.cause.code === grpc.status.INVALID_ARGUMENT) {
        // The ledger refused the result (data over its 64 KiB limit as JSON,
        // a resource id over 256 bytes): it will not take it on a repeat
        // either. Leave the effect to reconciliation now, rather than when
        // the lease ends.
        await this.report('MarkUnknown', { ...claim, reason: 'result data refused by the ledger' }, ran).catch(() => {});
      }
      throw err;
    }
    this.log(`Complete ${op.operation_id}: ${done.operation.state}`);
    return Ledger.outcome(done.operation, false);
  }

  // Records how the tool ended (Complete or MarkUnknown, repeated like every
  // ledger call). When that fails, the effect may exist but the ledger does
  // not say so: NotRecordedError, with what the tool returned or threw.
  async report(method, request, ran) {
    try {
      return await this.rpc(method, request);
    } catch (err) {
      throw new NotRecordedError(err, ran);
    }
  }

  // Renews the claim in op, asked for at asked (performance.now()), while
  // the tool runs, so that two thirds of its lease are always left: nobody
  // else finds it expired (and reconciles it, or runs the tool again) while
  // the tool is still at work. The first renewal comes when the lease is down
  // to two thirds, which is at once for a claim recovered late in its lease,
  // then every third of the lease after each renewal. signal is aborted when
  // the ledger says the claim is gone, when the lease nears its end (see
  // leaseEnd) while no renewal gets through (the ledger unreachable, or a
  // renewal still unanswered then, which is cut there): leaseMarginMs before
  // that end, as in the Go SDK, because the claim may be someone else's once
  // it ends; by stop(reason), or when the caller's cancelled is (with its
  // reason): renewals go on until stop, so that the tool's outcome can still
  // be recorded.
  keepLeased(op, cancelled, asked) {
    const abort = new AbortController();
    const cancel = () => abort.abort(cancelled.reason);
    if (cancelled?.aborted) cancel();
    else cancelled?.addEventListener('abort', cancel, { once: true });
    const lease = leaseOf(op);
    const margin = leaseMarginMs(lease);
    const period = Math.max(lease / 3, 10);
    let end = leaseEnd(op, asked);
    let timer;
    let stopped = false;
    const renew = async () => {
      const sent = performance.now();
      try {
        const now = await this.rpc('Renew', { operation_id: op.operation_id, fencing_token: op.fencing_token }, undefined, end - margin);
        end = sent + lease;
        if (now?.operation?.lease_expires_at) end = Math.min(end, leaseEnd(now.operation, sent));
      } catch (err) {
        this.log(`Renew ${op.operation_id}: ${err.message}`);
        if (err instanceof LedgerError && !repeatable(err.code, err)) {
          abort.abort(err); // STALE_FENCING_TOKEN, NOT_FOUND: the claim is gone
          return;
        }
        if (performance.now() >= end - margin) {
          abort.abort(new Error(`the lease of operation ${op.operation_id} is about to end with no renewal getting through`));
          return;
        }
      }
      // After a failed renewal, try again by the time the tool must stop at the latest.
      if (!stopped) timer = setTimeout(renew, Math.min(period, Math.max(end - margin - performance.now(), 0)));
    };
    if (lease > 0) timer = setTimeout(renew, Math.min(Math.max(end - performance.now() - (lease * 2) / 3, 0), period));
    return {
      signal: abort.signal,
      stop: (reason) => {
        stopped = true;
        clearTimeout(timer);
        cancelled?.removeEventListener('abort', cancel);
        if (reason) abort.abort(reason);
      },
    };
  }

  static outcome(op, replayed) {
    const result = op.result || {};
    return {
      resourceId: result.resource_id || '', data: fromStruct(result.data), replayed, operation: op,
    };
  }
}

module.exports = {
  DOMAIN,
  Ledger,
  LedgerError,
  LeaseEndedOnTheWayError,
  RunEndedError,
  ToolFailedError,
  NeedsReconciliationError,
  NotRecordedError,
  ToolTimedOutError,
  WaitBudgetSpentError,
  RetryableToolError,
  FinalToolError,
  errorDetails,
  inProgressDelay,
  leaseMarginMs,
  toStruct,
  fromStruct,
  grpc,
};
