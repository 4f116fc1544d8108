'use strict';
// The failure paths of the @opledger/client package (clients/typescript), against a running ledgerd whose policy
// gives tickets.slow a lease of 2s and tickets.flaky two attempts (README.md
// shows it; internal/polyglot starts one so):
//
//   node examples/node/faults.js [ADDRESS]    (default $LEDGER_ADDR or 127.0.0.1:50051)
//
// Each scenario counts how often the fake destination applied the effect.
// Faults in the ledger's answers are injected by wrapping the client's
// method; everything else is the real service. It exits non-zero when any
// check fails.

const crypto = require('node:crypto');
const path = require('node:path');
const protobuf = require('protobufjs');
const grpc = require('@grpc/grpc-js');
// The package from this repository (clients/typescript, built by make test: npm run build there).
const {
  DOMAIN, FinalToolError, LeaseEndedOnTheWayError, Ledger, LedgerError, RetryableToolError, RunEndedError, ToolFailedError,
  WaitBudgetSpentError, inProgressDelay,
} = require('../../clients/typescript/dist');

const rpcTypes = new protobuf.Root();
rpcTypes.resolvePath = (origin, target) => (target.startsWith('google/protobuf/')
  ? target
  : path.join(__dirname, '..', '..', 'third_party', 'googleapis', target));
rpcTypes.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
const Status = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfo = rpcTypes.lookupType('google.rpc.ErrorInfo');

class CheckFailed extends Error {}

function check(ok, what) {
  if (!ok) throw new CheckFailed(what);
  console.log(`ok: ${what}`);
}

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

// The next `times` calls of method fail with code before they reach the
// ledger; with reason, the error carries the ledger's ErrorInfo. Returns the
// count of the calls of method that go out from now on, failed or not.
function inject(ledger, method, code, times = Infinity, reason = '') {
  const real = ledger.client[method].bind(ledger.client);
  const calls = { n: 0 };
  let left = times;
  ledger.client[method] = (request, md, options, callback) => {
    calls.n += 1;
    if (left <= 0) return real(request, md, options, callback);
    left -= 1;
    const metadata = new grpc.Metadata();
    if (reason) {
      const info = ErrorInfo.encode({ reason, domain: DOMAIN }).finish();
      metadata.set('grpc-status-details-bin', Buffer.from(Status.encode({
        code, message: 'injected', details: [{ type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value: info }],
      }).finish()));
    }
    const err = Object.assign(new Error('injected'), { code, details: 'injected', metadata });
    setImmediate(() => callback(err));
    return undefined;
  };
  return calls;
}

// The next `times` calls of method reach the ledger, but their answers are
// lost: the caller gets code instead.
function lose(ledger, method, code, times) {
  const real = ledger.client[method].bind(ledger.client);
  let left = times;
  ledger.client[method] = (request, md, options, callback) => {
    if (left <= 0) return real(request, md, options, callback);
    left -= 1;
    return real(request, md, options, () => {
      callback(Object.assign(new Error('answer lost'), { code, details: 'answer lost', metadata: new grpc.Metadata() }));
    });
  };
}

// Counts the calls of method that go out.
function count(ledger, method) {
  const real = ledger.client[method].bind(ledger.client);
  const calls = { n: 0 };
  ledger.client[method] = (...args) => {
    calls.n += 1;
    return real(...args);
  };
  return calls;
}

// The fake destination: every ticket it created, by idempotency key.
function destination() {
  const tickets = [];
  return {
    tickets,
    create: async (attempt) => {
      tickets.push(attempt.idempotencyKey);
      const id = `TCK-${tickets.length}`;
      return { resource_id: id, data: { url: `https://tickets.example/${id}` } };
    },
    applied: (key) => tickets.filter((k) => k === key).length,
  };
}

// Reports what the destination holds about the attempt with token, and
// returns the record. ALREADY_RESOLVED or STALE_FENCING_TOKEN: someone
// settled the operation meanwhile (the attempt's own report, another
// reconciler; perhaps with another result than the one found here, which
// stands) or another attempt claimed it. Nothing was recorded: the record
// read after the refusal says what stands, and a retry under the same id
// replays it or waits.
async function reconcile(ledger, operationId, applied, token) {
  try {
    return (await ledger.rpc('Reconcile', {
      operation_id: operationId,
      finding: applied ? 'FINDING_APPLIED' : 'FINDING_NOT_APPLIED',
      fencing_token: token,
    })).operation;
  } catch (err) {
    if (!(err instanceof LedgerError) || !['ALREADY_RESOLVED', 'STALE_FENCING_TOKEN'].includes(err.reason)) throw err;
    return ledger.lookup(operationId);
  }
}

async function outcome(promise) {
  try {
    return { value: await promise };
  } catch (err) {
    return { err };
  }
}

let failed = 0;

// Runs one scenario; a failed check or an exception fails it, not the run.
async function scenario(fn) {
  try {
    await fn();
  } catch (err) {
    failed += 1;
    console.error(`FAIL: ${err instanceof CheckFailed ? err.message : err.stack || err}`);
  }
}

async function main() {
  const address = process.argv[2] || process.env.LEDGER_ADDR || '127.0.0.1:50051';
  const runId = `node-faults-${crypto.randomUUID().slice(0, 8)}`;
  const op = (step, extra = {}) => ({
    operationId: `${runId}:${step}`, tool: 'tickets.create', params: { title: 'Printer on fire' }, permitId: 'approval-77', ...extra,
  });

  // A fake agent runtime that calls tools until the ledger's run guard ends
  // its run; params(i) is the i-th call's.
  const agentLoop = async (ledger, run, params, fn) => {
    for (let i = 0; ; i += 1) {
      try {
        await ledger.callTool({
          operationId: `${run}:call-${i}`, tool: 'tickets.create', params: params(i), permitId: 'approval-77', runId: run,
        }, fn);
      } catch (err) {
        if (err instanceof RunEndedError) return err;
        throw err;
      }
    }
  };
  const effects = (dest, run) => dest.tickets.filter((k) => k.startsWith(`${run}:`)).length;

  await scenario(async () => {
    console.log('1. the tool ran, then the ledger is unreachable for its Complete');
    const ledger = new Ledger(address);
    const dest = destination();
    inject(ledger, 'Complete', grpc.status.UNAVAILABLE);
    const { err } = await outcome(ledger.callTool(op('unrecorded'), dest.create));
    check(dest.applied(`${runId}:unrecorded`) === 1, 'the destination applied the effect once');
    check(err && err.name === 'NotRecordedError', `the caller learns the outcome is not recorded (got ${err && err.name})`);
    check(err.result && err.result.resourceId === 'TCK-1', 'and gets the result the tool produced');
    ledger.close();
  });

  await scenario(async () => {
    console.log('2. the tool failed without an answer, then the ledger is unreachable for its MarkUnknown');
    const ledger = new Ledger(address);
    inject(ledger, 'MarkUnknown', grpc.status.DEADLINE_EXCEEDED);
    const { err } = await outcome(ledger.callTool(op('unknown-unrecorded'), async () => { throw new Error('read timeout'); }));
    check(err && err.name === 'NotRecordedError', `the caller learns the outcome is not recorded (got ${err && err.name})`);
    check(err.toolError && err.toolError.message === 'read timeout', 'with the tool\'s error');
    ledger.close();
  });

  await scenario(async () => {
    console.log('3. the ledger rate-limits the Complete once (RESOURCE_EXHAUSTED, RATE_LIMITED)');
    const ledger = new Ledger(address);
    const dest = destination();
    inject(ledger, 'Complete', grpc.status.RESOURCE_EXHAUSTED, 1, 'RATE_LIMITED');
    const { value, err } = await outcome(ledger.callTool(op('rate-limited'), dest.create));
    check(!err, `the Complete is repeated after the back-off (${err ? err.message : 'recorded'})`);
    check(value.operation.state === 'STATE_SUCCEEDED', 'the operation SUCCEEDED');
    check(dest.applied(`${runId}:rate-limited`) === 1, 'the destination applied the effect once');
    ledger.close();
  });

  await scenario(async () => {
    console.log('3b. the tenant holds as many unresolved operations as it may (RESOURCE_EXHAUSTED, UNRESOLVED_LIMIT): not repeated');
    const pauses = [];
    const ledger = new Ledger(address, { sleep: async (ms) => { pauses.push(ms); } });
    const dest = destination();
    const limited = op('unresolved-limit');
    const reserves = inject(ledger, 'Reserve', grpc.status.RESOURCE_EXHAUSTED, 1, 'UNRESOLVED_LIMIT');
    const { err } = await outcome(ledger.callTool(limited, dest.create));
    check(err instanceof LedgerError && err.code === grpc.status.RESOURCE_EXHAUSTED && err.reason === 'UNRESOLVED_LIMIT',
      `the caller gets the refusal at once, as from the Go SDK (${err ? err.message : 'a result'})`);
    check(reserves.n === 1 && pauses.length === 0, `the Reserve went out once, with no back-off (${reserves.n}, ${pauses.length} pauses)`);
    check(dest.applied(limited.operationId) === 0, `the tool did not run (${dest.applied(limited.operationId)})`);
    const record = await outcome(ledger.lookup(limited.operationId));
    check(record.err instanceof LedgerError && record.err.code === grpc.status.NOT_FOUND,
      `nothing is reserved (${record.err ? record.err.message : record.value.state})`);
    const retried = await outcome(ledger.callTool(limited, dest.create));
    check(!retried.err && !retried.value.replayed,
      `a later retry under the same id runs the tool (${retried.err ? retried.err.message : 'SUCCEEDED'})`);
    check(dest.applied(limited.operationId) === 1, `the destination applied the effect once (${dest.applied(limited.operationId)})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('3c. parameters over gRPC\'s message size limit: a bare RESOURCE_EXHAUSTED is not repeated');
    const ledger = new Ledger(address);
    const dest = destination();
    const reserves = count(ledger, 'Reserve');
    const huge = op('oversized', { params: { note: 'x'.repeat(5 << 20) } });
    const { err } = await outcome(ledger.callTool(huge, dest.create));
    check(err instanceof LedgerError && err.code === grpc.status.RESOURCE_EXHAUSTED && err.reason === '',
      `the caller gets the refusal (${err ? err.message : 'a result'})`);
    check(reserves.n === 1, `the Reserve went out once (${reserves.n})`);
    check(dest.applied(huge.operationId) === 0, 'nothing was applied');
    ledger.close();
  });

  await scenario(async () => {
    console.log('4. parameters JSON has no value for: a new date is a new request, a BigInt is refused');
    const ledger = new Ledger(address);
    const dest = destination();
    const when = (day) => op('dated', { params: { title: 'Call back', when: new Date(`2026-12-0${day}T10:00:00Z`) } });
    await ledger.callTool(when(1), dest.create);
    const { err } = await outcome(ledger.callTool(when(2), dest.create));
    check(err && err.reason === 'IDEMPOTENCY_KEY_REUSED', `another date under the same key is refused (got ${err ? err.message : 'a replay'})`);
    const big = await outcome(ledger.callTool(op('bigint', { params: { amount: 10n } }), dest.create));
    check(big.err instanceof TypeError, `a BigInt parameter is refused before Reserve (got ${big.err ? big.err.message : 'a result'})`);
    check(dest.tickets.length === 1, 'the destination applied one effect in all');
    ledger.close();
  });

  await scenario(async () => {
    console.log('5. the tool ran but its result cannot be encoded');
    const ledger = new Ledger(address);
    const dest = destination();
    const { err } = await outcome(ledger.callTool(op('bad-result'), async (a) => {
      await dest.create(a);
      return { resource_id: 'TCK-1', data: { amount: 10n } };
    }));
    check(err && err.name === 'NotRecordedError', `the caller learns the outcome is not recorded (got ${err ? err.message : 'a result'})`);
    check(err.result && err.result.data.amount === 10n, 'and gets the result the tool produced');
    const record = await ledger.lookup(`${runId}:bad-result`);
    check(record.state === 'STATE_UNKNOWN', `the operation is UNKNOWN, to be reconciled (${record.state})`);
    const retried = await outcome(ledger.callTool({ ...op('bad-result'), waitMs: 1000 }, dest.create));
    check(retried.err && retried.err.name === 'NeedsReconciliationError',
      `a retry under the same id is told to reconcile (${retried.err ? retried.err.message : 'a result'})`);
    check(dest.applied(`${runId}:bad-result`) === 1, 'the destination applied the effect once');
    ledger.close();
  });

  await scenario(async () => {
    console.log('5b. the tool ran but the ledger refuses its result (INVALID_ARGUMENT: data over 64 KiB, an id over 256 bytes)');
    const ledger = new Ledger(address);
    for (const [step, produced] of [
      ['large-data', { resource_id: 'TCK-1', data: { blob: 'x'.repeat(70 << 10) } }],
      ['long-id', { resource_id: 'T'.repeat(300), data: {} }],
    ]) {
      const dest = destination();
      const refused = op(step);
      const { err } = await outcome(ledger.callTool(refused, async (a) => {
        await dest.create(a);
        return produced;
      }));
      check(err && err.name === 'NotRecordedError' && err.cause instanceof LedgerError
        && err.cause.code === grpc.status.INVALID_ARGUMENT,
      `${step}: the caller learns the outcome is not recorded (got ${err ? err.message : 'a result'})`);
      check(err.result && err.result.resourceId === produced.resource_id
        && JSON.stringify(err.result.data) === JSON.stringify(produced.data),
      `${step}: and gets the result the tool produced`);
      const record = await ledger.lookup(refused.operationId);
      check(record.state === 'STATE_UNKNOWN',
        `${step}: the operation is UNKNOWN at once, to be reconciled, not RUNNING until its lease ends (${record.state})`);
      const retried = await outcome(ledger.callTool({ ...refused, waitMs: 1000 }, dest.create));
      check(retried.err && retried.err.name === 'NeedsReconciliationError',
        `${step}: a retry under the same id is told to reconcile (${retried.err ? retried.err.message : 'a result'})`);
      check(dest.applied(refused.operationId) === 1,
        `${step}: the destination applied the effect once (${dest.applied(refused.operationId)})`);
    }
    ledger.close();
  });

  // Runs a tool that fails for good with the error make() returns, and
  // checks that the failure is recorded, and replayed, under tool_failed.
  const recordedAsToolFailed = async (ledger, step, make) => {
    const dest = destination();
    const declined = op(step);
    const fn = async (a) => {
      await dest.create(a);
      throw make();
    };
    const { err } = await outcome(ledger.callTool(declined, fn));
    check(err instanceof ToolFailedError && err.failureCode === 'tool_failed' && !err.replayed,
      `${step}: the caller learns the tool failed for good, under the code recorded, tool_failed (got ${err ? err.message : 'a result'})`);
    const record = await ledger.lookup(declined.operationId);
    check(record.state === 'STATE_FAILED_FINAL' && record.failure && record.failure.code === 'tool_failed',
      `${step}: the operation is FAILED_FINAL with tool_failed at once, not RUNNING until its lease ends (${record.state}, ${record.failure ? JSON.stringify(record.failure.code) : 'no failure'})`);
    const retried = await outcome(ledger.callTool(declined, fn));
    check(retried.err instanceof ToolFailedError && retried.err.replayed && retried.err.failureCode === 'tool_failed',
      `${step}: a retry under the same id replays the failure (${retried.err ? retried.err.message : 'a result'})`);
    check(dest.applied(declined.operationId) === 1,
      `${step}: the tool ran once (${dest.applied(declined.operationId)})`);
  };

  await scenario(async () => {
    console.log('5c. the tool failed for good, with a failure code the ledger refuses (over 128 bytes, a control character, a lone surrogate: not UTF-8)');
    const ledger = new Ledger(address);
    for (const [step, code] of [
      ['long-code', 'x'.repeat(200)], ['control-code', 'declined\n'], ['surrogate-code', '\ud800'],
    ]) {
      await recordedAsToolFailed(ledger, step, () => new FinalToolError(code));
    }
    ledger.close();
  });

  await scenario(async () => {
    console.log('5d. the tool failed for good without a failure code: recorded under tool_failed, as in the Go SDK');
    const ledger = new Ledger(address);
    for (const [step, make] of [
      ['no-code', () => new FinalToolError()], ['empty-code', () => new FinalToolError('', 'card declined')],
    ]) {
      await recordedAsToolFailed(ledger, step, make);
    }
    ledger.close();
  });

  await scenario(async () => {
    console.log('6. a tool that runs 5s under a lease of 2s; a second worker retries the step at 3s');
    const first = new Ledger(address);
    const second = new Ledger(address);
    const dest = destination();
    const slow = op('slow', { tool: 'tickets.slow' });
    const running = outcome(first.callTool(slow, async (a) => {
      await sleep(5000);
      return dest.create(a);
    }));
    await sleep(3000);
    // The second worker has a reconciler: it asks the destination.
    let retried;
    for (let round = 0; round < 3; round += 1) {
      retried = await outcome(second.callTool(slow, dest.create));
      if (!(retried.err && retried.err.name === 'NeedsReconciliationError')) break;
      const applied = dest.applied(slow.operationId) > 0;
      console.log(`  reconciler: the destination has ${applied ? 'the ticket' : 'no ticket'}`);
      await reconcile(second, slow.operationId, applied, retried.err.operation.fencing_token);
    }
    const ran = await running;
    check(dest.applied(slow.operationId) === 1, `the destination applied the effect once (${dest.applied(slow.operationId)})`);
    check(!ran.err, `the first worker recorded its outcome (${ran.err ? ran.err.message : 'SUCCEEDED'})`);
    check(!retried.err && retried.value.replayed, `the second worker replayed it (${retried.err ? retried.err.message : 'replayed'})`);
    first.close();
    second.close();
  });

  await scenario(async () => {
    console.log("6b. a reconciler reports the effect found after the worker's own report recorded it with its result");
    const worker = new Ledger(address);
    const reconciler = new Ledger(address);
    const dest = destination();
    const settled = op('settled-meanwhile');
    const first = await outcome(worker.callTool(settled, dest.create));
    check(!first.err && first.value.resourceId === 'TCK-1', `the worker recorded its result (${first.err ? first.err.message : 'recorded'})`);
    // The reconciler saw the attempt unresolved a moment before, and finds a ticket at the
    // destination: it reports it without the worker's result, which it does not know.
    const record = await reconcile(reconciler, settled.operationId, true, (await worker.lookup(settled.operationId)).fencing_token);
    check(record.state === 'STATE_SUCCEEDED' && record.result && record.result.resource_id === 'TCK-1',
      `the record read after the refusal holds the worker's result (${record.state}, ${record.result ? record.result.resource_id : 'no result'})`);
    const retried = await outcome(reconciler.callTool(settled, dest.create));
    check(!retried.err && retried.value.replayed && retried.value.resourceId === 'TCK-1',
      `a retry replays the worker's result (${retried.err ? retried.err.message : 'replayed'})`);
    check(dest.applied(settled.operationId) === 1, `the destination applied the effect once (${dest.applied(settled.operationId)})`);
    worker.close();
    reconciler.close();
  });

  await scenario(async () => {
    console.log('7. every attempt is refused (two attempts): the failure names RETRIES_EXHAUSTED');
    const ledger = new Ledger(address);
    const flaky = op('exhausted', { tool: 'tickets.flaky' });
    const refused = async () => { throw new RetryableToolError('429'); };
    for (let i = 0; i < 2; i += 1) {
      const { err } = await outcome(ledger.callTool(flaky, refused));
      check(err instanceof RetryableToolError, `an attempt refused (${err ? err.message : 'a result'})`);
      const record = await ledger.lookup(flaky.operationId);
      check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'retryable',
        `recorded as a retryable failure, as the Go SDK records it (${record.state}, ${record.failure ? record.failure.code : 'no failure'})`);
    }
    const { err } = await outcome(ledger.callTool(flaky, refused));
    check(err instanceof ToolFailedError && err.failureCode === 'RETRIES_EXHAUSTED' && err.replayed,
      `then the call fails for good, saying why (${err ? err.message : 'a result'})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('8. a tool that hangs past a tool timeout of 0.5s (lease 2s); a second worker retries the step');
    const first = new Ledger(address);
    const second = new Ledger(address);
    const dest = destination();
    const hung = op('hung', { tool: 'tickets.slow', toolTimeoutMs: 500 });
    let signal;
    let late;
    let ended = false;
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    const { err } = await outcome(first.callTool(hung, (a) => {
      signal = a.signal;
      late = held.then(() => { ended = true; return dest.create(a); }); // never looks at the signal
      return late;
    }));
    check(err && err.name === 'ToolTimedOutError' && !ended,
      `the caller gets a timeout error while the tool still hangs (${err ? err.message : 'a result'})`);
    check(signal.aborted, 'the attempt\'s signal is aborted');
    let record = await first.lookup(hung.operationId);
    check(record.state === 'STATE_UNKNOWN', `the operation is UNKNOWN, to be reconciled (${record.state})`);
    const retried = await outcome(second.callTool(hung, dest.create));
    check(retried.err && retried.err.name === 'NeedsReconciliationError',
      `a second worker is told to reconcile (${retried.err ? retried.err.message : 'a result'})`);
    release();
    await late;
    check(dest.applied(hung.operationId) <= 1, `the destination applied at most one effect (${dest.applied(hung.operationId)})`);
    record = await first.lookup(hung.operationId);
    check(record.state === 'STATE_UNKNOWN', `what the tool returned late is discarded: still UNKNOWN (${record.state})`);
    first.close();
    second.close();
  });

  await scenario(async () => {
    console.log('9. the same, and the ledger is unreachable for the MarkUnknown: the lease lapses');
    const first = new Ledger(address);
    const second = new Ledger(address);
    const dest = destination();
    inject(first, 'MarkUnknown', grpc.status.UNAVAILABLE);
    const hung = op('hung-unrecorded', { tool: 'tickets.slow', toolTimeoutMs: 500 });
    let late;
    let ended = false;
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    const { err } = await outcome(first.callTool(hung, (a) => {
      late = held.then(() => { ended = true; return dest.create(a); });
      return late;
    }));
    check(err && err.name === 'NotRecordedError' && err.toolError && err.toolError.name === 'ToolTimedOutError',
      `the caller learns the timeout is not recorded (got ${err ? err.message : 'a result'})`);
    // The lease is no longer renewed: a second worker waits for it to lapse (2s), while the tool
    // still hangs. Were it renewed, the worker would wait in vain and give up.
    const retried = await outcome(second.callTool({ ...hung, waitMs: 10000 }, dest.create));
    check(retried.err && retried.err.name === 'NeedsReconciliationError' && !ended,
      `once the lease has lapsed, a second worker is told to reconcile (${retried.err ? retried.err.message : 'a result'})`);
    const record = await second.lookup(hung.operationId);
    check(record.state === 'STATE_UNKNOWN', `the operation is UNKNOWN (${record.state}, ${record.reason})`);
    release();
    await late;
    check(dest.applied(hung.operationId) <= 1, `the destination applied at most one effect (${dest.applied(hung.operationId)})`);
    first.close();
    second.close();
  });

  await scenario(async () => {
    console.log('10. every answer to Reserve is lost (irreversible, lease 2s): the caller gives up, the claim is returned');
    const ledger = new Ledger(address);
    const dest = destination();
    const lost = op('lost-reserve', { tool: 'tickets.slow' });
    lose(ledger, 'Reserve', grpc.status.DEADLINE_EXCEEDED, ledger.ledgerRetries + 1);
    const { err } = await outcome(ledger.callTool(lost, dest.create));
    check(err instanceof LedgerError && err.code === grpc.status.DEADLINE_EXCEEDED,
      `the caller gets the timeout (${err ? err.message : 'a result'})`);
    check(dest.applied(lost.operationId) === 0, 'the tool did not run');
    const record = await ledger.lookup(lost.operationId);
    check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'caller_gave_up',
      `the claim the ledger granted is returned, proven not applied (${record.state}, ${record.failure && record.failure.code})`);
    const retried = await outcome(ledger.callTool(lost, dest.create));
    check(!retried.err && !retried.value.replayed,
      `a retry runs the tool, with no reconciliation (${retried.err ? retried.err.message : 'SUCCEEDED'})`);
    check(dest.applied(lost.operationId) === 1, `the destination applied the effect once (${dest.applied(lost.operationId)})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('11. another caller holds the claim (lease 30s): a 20s wait backs off, with jitter, on an injected clock');
    const holder = new Ledger(address);
    const held = op('held');
    const claim = await holder.rpc('Reserve', {
      operation_id: held.operationId, tool: held.tool, params: { fields: { title: { stringValue: 'Printer on fire' } } },
      permit_id: held.permitId, holder: 'another-caller', effect: 'EFFECT_UNSPECIFIED',
    });
    check(claim.decision === 'DECISION_EXECUTE', 'another caller holds the claim');
    let now = 0;
    const pauses = [];
    const waiter = new Ledger(address, {
      now: () => now,
      sleep: async (ms) => { pauses.push(ms); now += ms; },
    });
    const reserves = count(waiter, 'Reserve');
    const dest = destination();
    const { err } = await outcome(waiter.callTool({ ...held, waitMs: 20000 }, dest.create));
    check(err instanceof WaitBudgetSpentError && /still held by another caller/.test(err.message),
      `the caller gives up waiting (${err ? err.message : 'a result'})`);
    check(dest.applied(held.operationId) === 0, 'the tool did not run');
    check(reserves.n <= 10, `at most 10 Reserves in 20s (${reserves.n}; polling at retry_after, 1s, makes about 20)`);
    const slept = pauses.reduce((a, b) => a + b, 0);
    check(Math.abs(slept - 20000) < 1, `the waits fill the 20s, no more (${slept} ms)`);
    check(pauses.slice(0, -1).every((ms) => ms >= 1000), `every wait but the last, cut at the end, is at least retry_after (${pauses.map(Math.round)})`);
    check(new Set(pauses).size > 1, 'the waits are not all the same');
    holder.close();
    waiter.close();
  });

  await scenario(async () => {
    console.log('12. the wait before the nth Reserve of a claim in progress');
    const low = () => 0;
    const high = () => 0.999;
    check(inProgressDelay(1, 1000, low) === 1000, 'at least the ledger\'s retry_after');
    check(inProgressDelay(1, 50, low) === 100 && inProgressDelay(5, 50, low) === 1600, 'a backoff doubling from 100 ms');
    check(inProgressDelay(8, 50, low) === 5000 && inProgressDelay(1000, 50, low) === 5000, 'capped at 5 s');
    check(inProgressDelay(1000, 8000, low) === 8000, 'a longer retry_after wins over the cap');
    const jittered = inProgressDelay(3, 50, high);
    check(jittered > 400 && jittered < 600, `plus up to half of it again at random (${jittered})`);
  });

  await scenario(async () => {
    console.log('13. the answer to Reserve comes after the wait budget (1s) is spent, on an injected clock');
    let now = 0;
    const ledger = new Ledger(address, { now: () => now, sleep: async (ms) => { now += ms; } });
    const real = ledger.client.Reserve.bind(ledger.client);
    ledger.client.Reserve = (request, md, options, callback) => real(request, md, options, (err, resp) => {
      now += 2000; // the answer takes 2s to come back
      callback(err, resp);
    });
    const dest = destination();
    const late = op('late-claim', { waitMs: 1000 });
    const { err } = await outcome(ledger.callTool(late, dest.create));
    check(err instanceof WaitBudgetSpentError && /may be retried under the same operation id/.test(err.message),
      `the caller gets "wait budget spent" (${err ? err.message : 'a result'})`);
    check(dest.applied(late.operationId) === 0, `the tool did not run (${dest.applied(late.operationId)})`);
    const record = await ledger.lookup(late.operationId);
    check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'caller_gave_up',
      `the claim is returned unused (${record.state}, ${record.failure && record.failure.code})`);
    const retrier = new Ledger(address);
    const retried = await outcome(retrier.callTool(late, dest.create));
    check(!retried.err && !retried.value.replayed,
      `a retry under the same id runs the tool (${retried.err ? retried.err.message : 'SUCCEEDED'})`);
    check(dest.applied(late.operationId) === 1, `the destination applied the effect once (${dest.applied(late.operationId)})`);
    ledger.close();
    retrier.close();
  });

  await scenario(async () => {
    console.log('14. the caller cancels (signal) while another caller holds the claim, on an injected clock');
    const holder = new Ledger(address);
    const held = op('cancel-waiting');
    const claim = await holder.rpc('Reserve', {
      operation_id: held.operationId, tool: held.tool, params: { fields: { title: { stringValue: 'Printer on fire' } } },
      permit_id: held.permitId, holder: 'another-caller', effect: 'EFFECT_UNSPECIFIED',
    });
    check(claim.decision === 'DECISION_EXECUTE', 'another caller holds the claim');
    const cancel = new AbortController();
    const reason = new Error('the user closed the conversation');
    let now = 0;
    let pauses = 0;
    const waiter = new Ledger(address, {
      now: () => now,
      sleep: async (ms) => {
        now += ms;
        pauses += 1;
        if (pauses === 2) cancel.abort(reason);
      },
    });
    const reserves = count(waiter, 'Reserve');
    const dest = destination();
    const { err } = await outcome(waiter.callTool({ ...held, waitMs: 60000, signal: cancel.signal }, dest.create));
    check(err === reason, `the call ends with the signal's reason (${err ? err.message : 'a result'})`);
    check(reserves.n === 2, `no Reserve after the cancellation (${reserves.n})`);
    check(dest.applied(held.operationId) === 0, 'the tool did not run');
    const already = await outcome(waiter.callTool({ ...held, signal: cancel.signal }, dest.create));
    check(already.err === reason && reserves.n === 2,
      `a call whose signal is already aborted asks nothing (${already.err ? already.err.message : 'a result'})`);
    holder.close();
    waiter.close();
  });

  await scenario(async () => {
    console.log('15. the caller cancels while the Reserve is on its way; its answer grants the claim all the same');
    const ledger = new Ledger(address);
    const cancel = new AbortController();
    const real = ledger.client.Reserve.bind(ledger.client);
    let once = false;
    ledger.client.Reserve = (request, md, options, callback) => real(request, md, options, (err, resp) => {
      if (!once) cancel.abort();
      once = true;
      callback(err, resp);
    });
    const dest = destination();
    const cut = op('cancel-reserving');
    const { err } = await outcome(ledger.callTool({ ...cut, signal: cancel.signal }, dest.create));
    check(err && err.name === 'AbortError',
      `the call ends with the signal's reason (${err ? err.message : 'a result'})`);
    check(dest.applied(cut.operationId) === 0, `the tool did not run (${dest.applied(cut.operationId)})`);
    const record = await ledger.lookup(cut.operationId);
    check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'caller_gave_up',
      `the claim is returned unused (${record.state}, ${record.failure && record.failure.code})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('16. the caller cancels while the tool runs: the tool sees it, and its outcome is recorded');
    const ledger = new Ledger(address);
    const dest = destination();
    // The tool applies its effect, then its answer is cut off by the cancellation.
    const cancel = new AbortController();
    const reason = new Error('the user closed the conversation');
    const cut = op('cancel-running', { toolTimeoutMs: 5000 });
    let seen;
    const { err } = await outcome(ledger.callTool({ ...cut, signal: cancel.signal }, async (a) => {
      await dest.create(a);
      cancel.abort(reason);
      await new Promise((resolve) => {
        if (a.signal.aborted) resolve();
        a.signal.addEventListener('abort', resolve);
      });
      seen = a.signal.reason;
      throw a.signal.reason;
    }));
    check(seen === reason, `the tool's signal is aborted with the caller's reason (${seen && seen.message})`);
    check(err === reason, `the call ends with what the tool threw (${err ? err.message : 'a result'})`);
    let record = await ledger.lookup(cut.operationId);
    check(record.state === 'STATE_UNKNOWN', `the outcome, unknown, is recorded: UNKNOWN (${record.state})`);
    check(dest.applied(cut.operationId) === 1,
      `the destination applied the effect once (${dest.applied(cut.operationId)})`);
    // The tool does not stop: what it returns is recorded and returned.
    const late = new AbortController();
    const done = op('cancel-finishing');
    let signal;
    const ran = await outcome(ledger.callTool({ ...done, signal: late.signal }, async (a) => {
      signal = a.signal;
      late.abort();
      await sleep(10);
      return dest.create(a);
    }));
    check(signal.aborted, 'the tool\'s signal is aborted');
    check(!ran.err && ran.value.resourceId !== '' && !ran.value.replayed,
      `the call returns the tool's result (${ran.err ? ran.err.message : ran.value.resourceId})`);
    record = await ledger.lookup(done.operationId);
    check(record.state === 'STATE_SUCCEEDED', `the outcome is recorded: SUCCEEDED (${record.state})`);
    check(dest.applied(done.operationId) === 1,
      `the destination applied the effect once (${dest.applied(done.operationId)})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('17. a Reserve\'s answer is lost, then its repeats are refused for the rate: the claim is returned');
    const ledger = new Ledger(address);
    const dest = destination();
    const lost = op('lost-then-limited', { tool: 'tickets.slow' });
    // The first Reserve is granted but its answer is lost; the repeats are
    // refused for the rate before they reach the ledger.
    lose(ledger, 'Reserve', grpc.status.DEADLINE_EXCEEDED, 1);
    const lossy = ledger.client.Reserve;
    let calls = 0;
    ledger.client.Reserve = (request, md, options, callback) => {
      calls += 1;
      if (calls === 1) return lossy(request, md, options, callback);
      if (calls <= ledger.ledgerRetries + 1) {
        const info = ErrorInfo.encode({ reason: 'RATE_LIMITED', domain: DOMAIN }).finish();
        const metadata = new grpc.Metadata();
        metadata.set('grpc-status-details-bin', Buffer.from(Status.encode({
          code: grpc.status.RESOURCE_EXHAUSTED,
          message: 'injected',
          details: [{ type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value: info }],
        }).finish()));
        const err = Object.assign(new Error('injected'), { code: grpc.status.RESOURCE_EXHAUSTED, details: 'injected', metadata });
        setImmediate(() => callback(err));
        return undefined;
      }
      return lossy(request, md, options, callback); // the answer lost once: from now on, the ledger's
    };
    const { err } = await outcome(ledger.callTool(lost, dest.create));
    check(err instanceof LedgerError && err.reason === 'RATE_LIMITED', `the caller gets the refusal (${err ? err.message : 'a result'})`);
    check(dest.applied(lost.operationId) === 0, 'the tool did not run');
    const record = await ledger.lookup(lost.operationId);
    check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'caller_gave_up',
      `the claim the first Reserve was granted is returned, proven not applied (${record.state}, ${record.failure && record.failure.code})`);
    const retried = await outcome(ledger.callTool(lost, dest.create));
    check(!retried.err && !retried.value.replayed,
      `a retry runs the tool, with no reconciliation (${retried.err ? retried.err.message : 'SUCCEEDED'})`);
    check(dest.applied(lost.operationId) === 1, `the destination applied the effect once (${dest.applied(lost.operationId)})`);
    ledger.close();
  });

  // The next Reserve's answer says the claim's lease (of leaseMs) has leftMs
  // to run, as if it came back late in the lease: the ledger's record keeps
  // its own. ends gets the end the answer reports (Date.now()'s clock).
  const shortenLease = (ledger, leaseMs, leftMs) => {
    const real = ledger.client.Reserve.bind(ledger.client);
    const ends = [];
    const stamp = (ms) => ({ seconds: String(Math.floor(ms / 1000)), nanos: Math.round((ms % 1000) * 1e6) });
    ledger.client.Reserve = (request, md, options, callback) => {
      ledger.client.Reserve = real;
      return real(request, md, options, (err, resp) => {
        if (!err) {
          const end = Date.now() + leftMs;
          resp.operation.lease_expires_at = stamp(end);
          resp.operation.updated_at = stamp(end - leaseMs);
          ends.push(end);
        }
        callback(err, resp);
      });
    };
    return ends;
  };

  await scenario(async () => {
    console.log('18. the answer to Reserve comes with less of its lease (10s) left than the margin (1s)');
    const ledger = new Ledger(address);
    const dest = destination();
    const late = op('claim-within-margin');
    shortenLease(ledger, 10000, 500);
    const { err } = await outcome(ledger.callTool(late, dest.create));
    check(dest.applied(late.operationId) === 0, `the tool did not run (${dest.applied(late.operationId)})`);
    check(err instanceof LeaseEndedOnTheWayError && err instanceof RetryableToolError,
      `the caller gets a retryable error (${err ? err.message : 'a result'})`);
    const record = await ledger.lookup(late.operationId);
    check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'retryable',
      `the claim is returned, proven not applied, as the Go SDK returns it (${record.state}, ${record.failure ? record.failure.code : 'no failure'})`);
    const retried = await outcome(ledger.callTool(late, dest.create));
    check(!retried.err && !retried.value.replayed,
      `a retry under the same id runs the tool (${retried.err ? retried.err.message : 'SUCCEEDED'})`);
    check(dest.applied(late.operationId) === 1, `the destination applied the effect once (${dest.applied(late.operationId)})`);
    // The claim cannot be returned: it lapses with its lease, and the caller
    // still learns the tool did not run.
    const unreturned = op('claim-within-margin-unreturned');
    shortenLease(ledger, 10000, 500);
    inject(ledger, 'Complete', grpc.status.UNAVAILABLE);
    const lapsed = await outcome(ledger.callTool(unreturned, dest.create));
    check(lapsed.err instanceof LeaseEndedOnTheWayError,
      `when the claim cannot be returned, the caller still learns the tool did not run (${lapsed.err ? lapsed.err.message : 'a result'})`);
    check(dest.applied(unreturned.operationId) === 0, `the tool did not run (${dest.applied(unreturned.operationId)})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('19. the renewals hang with 2s of a 10s lease left: the tool is stopped the margin (1s) before its end');
    const ledger = new Ledger(address);
    const dest = destination();
    const hung = op('renewal-hung', { toolTimeoutMs: 30000 });
    const ends = shortenLease(ledger, 10000, 2000);
    const renewals = [];
    ledger.client.Renew = (request, md, options, callback) => {
      renewals.push(options.deadline);
      // No answer within the call's deadline.
      setTimeout(() => callback(Object.assign(new Error('injected'), {
        code: grpc.status.DEADLINE_EXCEEDED, details: 'injected', metadata: new grpc.Metadata(),
      })), Math.max(options.deadline - Date.now(), 0));
      return undefined;
    };
    const stopped = [];
    // The destination takes the effect only while the claim is this
    // caller's: until the lease's end, when another holder may claim it.
    const waits = (attempt) => new Promise((resolve, reject) => {
      const timer = setTimeout(() => resolve(dest.create(attempt)), Math.max(ends[0] - Date.now(), 0) + 1000);
      attempt.signal.addEventListener('abort', () => {
        stopped.push(Date.now());
        clearTimeout(timer);
        reject(new RetryableToolError('stopped before applying'));
      }, { once: true });
    });
    const { err } = await outcome(ledger.callTool(hung, waits));
    check(renewals.length > 0, `a renewal went out (${renewals.length})`);
    check(stopped.length > 0, 'the tool saw its cancellation');
    check(stopped.length > 0 && stopped[0] < ends[0],
      `before the lease's end (${stopped.length > 0 ? `${ends[0] - stopped[0]} ms before it` : 'never'})`);
    check(dest.applied(hung.operationId) === 0, `the destination applied nothing (${dest.applied(hung.operationId)})`);
    check(err instanceof RetryableToolError, `the caller gets the tool's error (${err ? err.message : 'a result'})`);
    const record = await ledger.lookup(hung.operationId);
    check(record.state === 'STATE_PENDING' && record.failure && record.failure.code === 'retryable',
      `recorded as a retryable failure, as the Go SDK records it (${record.state}, ${record.failure ? record.failure.code : 'no failure'})`);
    ledger.close();
  });

  await scenario(async () => {
    console.log('S14. the ledger\'s run guard ends a looping agent\'s run: step cap, repetition, deadline');
    const ledger = new Ledger(address);
    const dest = destination();
    const steps = `${runId}-steps`;
    await ledger.startRun(steps, { maxSteps: 3 });
    let end = await agentLoop(ledger, steps, (i) => ({ title: `ticket ${i}` }), dest.create);
    check(end.status === 'step_limit' && end.limit === 'max_steps' && end.reason === 'RUN_STEP_LIMIT',
      `new tickets forever end the run with step_limit (${end.status}, ${end.message})`);
    check(effects(dest, steps) === 3, `the destination applied 3 effects, the cap (${effects(dest, steps)})`);
    const again = await ledger.callTool({
      operationId: `${steps}:call-0`, tool: 'tickets.create', params: { title: 'ticket 0' }, permitId: 'approval-77', runId: steps,
    }, dest.create);
    check(again.replayed && effects(dest, steps) === 3, 'a retry of an admitted call replays, and is not refused');

    const loop = `${runId}-loop`;
    await ledger.startRun(loop, { maxRepeats: 2 });
    end = await agentLoop(ledger, loop, () => ({ title: 'Printer on fire' }), dest.create);
    check(end.status === 'repetition' && end.limit === 'max_repeats',
      `the same ticket under new call ids ends the run with repetition (${end.status}, ${end.message})`);
    check(effects(dest, loop) === 2, `the destination applied 2 effects (${effects(dest, loop)})`);

    const timed = `${runId}-timed`;
    await ledger.startRun(timed, { deadlineMs: 1000 });
    const slowCreate = async (attempt) => { await sleep(1200); return dest.create(attempt); }; // across the deadline
    end = await agentLoop(ledger, timed, (i) => ({ title: `slow ${i}` }), slowCreate);
    check(end.status === 'deadline' && end.limit === 'deadline',
      `the call after the deadline ends the run with deadline (${end.status}, ${end.message})`);
    const record = await ledger.getRun(timed);
    check(effects(dest, timed) === 1 && record.steps === 1 && record.open_operations === 0,
      `the call in flight across the deadline completed and was recorded (${effects(dest, timed)} effects, ${record.steps} steps, ${record.open_operations} open)`);
    check(record.state === 'RUN_STATE_DEADLINE', `the run ended DEADLINE (${record.state})`);
    ledger.close();
  });

  if (failed > 0) {
    console.error(`FAIL: ${failed} scenario(s)`);
    process.exit(1);
  }
  console.log('PASS: node faults');
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exit(1);
});
