'use strict';
// The decision flow of Ledger.callTool against a real ledgerd, counting
// effects at fake destinations; each test is named by the contract's
// conformance scenario it covers (docs/contract.md §9).

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { test } = require('node:test');
const grpc = require('@grpc/grpc-js');
const client = require('../dist');
const { addr, ids, Destination, dropper, beforeCall } = require('./helpers');

function setup() {
  const dest = new Destination();
  const drop = dropper();
  const ledger = new client.Ledger(addr(), {
    interceptors: [drop.interceptor],
    reconcilers: { 'short.refund': dest.reconciler, 'payments.refund': dest.reconciler, 'appointments.create': dest.reconciler },
  });
  return { dest, drop, ledger, id: ids() };
}

const refund = (dest) => async (a) => dest.apply(a.idempotencyKey);

test('S2: the effect applied, its answer lost, then a replay', async (t) => {
  const { dest, drop, ledger, id } = setup();
  t.after(() => ledger.close());
  const call = { operationId: id('refund'), tool: 'payments.refund', params: { amount: 10 }, permitId: 'p-1' };
  drop.armed.Complete = 1;
  const first = await ledger.callTool(call, refund(dest));
  const again = await ledger.callTool(call, refund(dest));
  assert.deepEqual(drop.dropped, ['Complete']);
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.equal(again.resourceId, first.resourceId);
  assert.equal(dest.total(), 1);
});

test('params are fingerprinted as JSON.stringify writes them', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const operationId = id('refund');
  const call = (params) => ledger.callTool({ operationId, tool: 'payments.refund', params, permitId: 'p-1' }, refund(dest));
  const first = await call({ amount: 10, note: undefined, tags: ['a', undefined] });
  const again = await call({ amount: 10, tags: ['a', null] }); // the same request, as another language sends it
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.equal(dest.total(), 1);
  const want = crypto.createHash('sha256').update('{"amount":10,"tags":["a",null]}').digest();
  assert.deepEqual(Buffer.from((await ledger.lookup(operationId)).params_sha256), want);
});

test('S3: the worker died after the effect', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const op = id('refund');
  const resp = await ledger.rpc('Reserve', { operation_id: op, tool: 'short.refund', holder: 'h-dead', params: client.toStruct({ amount: 7 }) });
  assert.equal(resp.decision, 'DECISION_EXECUTE');
  dest.apply(op); // and then the worker dies, before Complete
  await new Promise((r) => setTimeout(r, 600)); // past the 400 ms lease
  const out = await ledger.callTool({ operationId: op, tool: 'short.refund', params: { amount: 7 } }, refund(dest));
  assert.equal(out.replayed, true);
  assert.equal(out.resourceId, 'R-1');
  assert.equal((await ledger.lookup(op)).state, 'STATE_SUCCEEDED');
  assert.equal(dest.total(), 1);
});

for (const applied of [true, false]) {
  test(`S5: a timeout, then reconciliation (${applied ? 'the effect exists' : 'it does not'})`, async (t) => {
    const { dest, ledger, id } = setup();
    t.after(() => ledger.close());
    const call = { operationId: id('refund'), tool: 'payments.refund', params: { amount: 10 }, permitId: 'p-1' };
    dest.faults = applied ? ['after-write'] : [];
    await assert.rejects(ledger.callTool({ ...call, toolTimeoutMs: 300 }, async (a) => {
      if (applied) return dest.apply(a.idempotencyKey);
      return new Promise(() => {}); // hangs past the tool timeout, nothing written
    }), applied ? /timed out after the write/ : client.ToolTimedOutError);
    assert.equal((await ledger.lookup(call.operationId)).state, 'STATE_UNKNOWN');
    const out = await ledger.callTool(call, refund(dest));
    assert.equal(out.replayed, applied);
    assert.equal((await ledger.lookup(call.operationId)).state, 'STATE_SUCCEEDED');
    assert.equal(dest.total(), 1);
  });
}

const finding = (f) => async () => f;
for (const [name, reconciler, cause] of [
  ['a reconciler that throws', async () => { throw new Error('the destination is down'); }, /the destination is down/],
  ['a finding with a BigInt, which cannot be sent', finding({ kind: 'FINDING_APPLIED', resourceId: 'R-1', data: { amount: 10n } }), /BigInt|bigint/],
  // What the ledger refuses is sent and refused: INVALID_ARGUMENT about the
  // finding, not about the call.
  ['a finding with data over 64 KiB', finding({ kind: 'FINDING_APPLIED', resourceId: 'R-1', data: { blob: 'x'.repeat(70 << 10) } }), /INVALID_ARGUMENT/],
  ['a finding with a resource id over 256 bytes', finding({ kind: 'FINDING_APPLIED', resourceId: 'R-' + '1'.repeat(300) }), /INVALID_ARGUMENT/],
]) {
  test(`${name} decides nothing`, async (t) => {
    const dest = new Destination();
    const ledger = new client.Ledger(addr(), { reconcilers: { 'payments.refund': reconciler } });
    t.after(() => ledger.close());
    const call = { operationId: ids()('refund'), tool: 'payments.refund', params: { amount: 10 }, permitId: 'p-1' };
    dest.faults = ['after-write'];
    await assert.rejects(ledger.callTool(call, refund(dest)), /timed out after the write/);
    await assert.rejects(ledger.callTool(call, refund(dest)), (err) => {
      assert.ok(err instanceof client.NeedsReconciliationError, `${err}`);
      assert.match(String(err.cause), cause);
      return true;
    });
    assert.equal((await ledger.lookup(call.operationId)).state, 'STATE_UNKNOWN');
    assert.equal(dest.total(), 1);
  });
}

test('an escalated operation waits for a human', async (t) => {
  // Once the reconciler escalated, a later call does not ask it again: a
  // finding then would take the question from the human who was asked, and
  // this one (not applied) would run the tool a second time.
  const dest = new Destination();
  const answers = [{ kind: 'FINDING_ESCALATE', note: 'the bank does not say' }, { kind: 'FINDING_NOT_APPLIED', note: 'not found' }];
  let asked = 0;
  const ledger = new client.Ledger(addr(), { reconcilers: { 'payments.refund': async () => answers[asked++] } });
  t.after(() => ledger.close());
  const call = { operationId: ids()('refund'), tool: 'payments.refund', params: { amount: 10 }, permitId: 'p-1' };
  dest.faults = ['after-write'];
  await assert.rejects(ledger.callTool(call, refund(dest)), /timed out after the write/);
  for (let i = 0; i < 2; i++) await assert.rejects(ledger.callTool(call, refund(dest)), client.NeedsReconciliationError);
  const rec = await ledger.lookup(call.operationId);
  assert.equal(asked, 1);
  assert.equal(rec.state, 'STATE_UNKNOWN');
  assert.equal(rec.needs_review, true);
  assert.equal(dest.total(), 1);
});

// takenOver returns a Ledger whose first Complete goes out only once another
// caller, past the 400 ms lease of call's operation, has found nothing at
// the destination and run the operation to success.
function takenOver(t, dest, call) {
  const other = new client.Ledger(addr(), { reconcilers: { 'short.refund': async () => ({ kind: 'FINDING_NOT_APPLIED', note: 'not found' }) } });
  t.after(() => other.close());
  const takesOver = async () => {
    await new Promise((resolve) => setTimeout(resolve, 600));
    await other.callTool(call, refund(dest));
  };
  const late = new client.Ledger(addr(), { interceptors: [beforeCall('Complete', takesOver)] });
  t.after(() => late.close());
  return late;
}

test('an effect the ledger records another outcome for', async (t) => {
  // The tool's result reaches the ledger after the claim's lease ended, and
  // by then another caller found nothing at the destination and ran the tool
  // again: the ledger records that attempt. callTool rejects with
  // ConflictingOutcomeError and the record that stands, never
  // NotRecordedError, which says the effect will be reconciled as applied.
  const dest = new Destination();
  const call = { operationId: ids()('refund'), tool: 'short.refund', params: { amount: 1 }, permitId: 'p-1' };
  await assert.rejects(takenOver(t, dest, call).callTool(call, refund(dest)), (err) => {
    assert.ok(err instanceof client.ConflictingOutcomeError, `${err}`);
    assert.ok(err instanceof client.NeedsReconciliationError && !(err instanceof client.NotRecordedError));
    assert.equal(err.result.resourceId, 'R-1');
    assert.equal(err.attempt, 1);
    assert.equal(err.cause.reason, 'STALE_FENCING_TOKEN');
    assert.ok(err.recordRead);
    assert.equal(err.operation.state, 'STATE_SUCCEEDED');
    assert.equal(err.operation.attempt, 2);
    assert.equal(err.operation.result.resource_id, 'R-2');
    return true;
  });
  assert.equal(dest.total(), 2); // the case to report
});

for (const [name, failure] of [
  ['final', () => new client.FinalToolError('card_declined')], ['retryable', () => new client.RetryableToolError('429')],
]) {
  test(`a ${name} failure after the claim was gone`, async (t) => {
    // The tool fails, but its claim's lease ended first and another caller
    // ran the operation to success. The refused failure is not the record:
    // callTool reserves again and replays the outcome that stands, as the Go
    // SDK does, instead of rejecting with NotRecordedError.
    const dest = new Destination();
    const call = { operationId: ids()('refund'), tool: 'short.refund', params: { amount: 1 }, permitId: 'p-1' };
    const late = takenOver(t, dest, call);
    const out = await late.callTool(call, async () => { throw failure(); });
    assert.equal(out.replayed, true);
    assert.equal(out.resourceId, 'R-1');
    const rec = await late.lookup(call.operationId);
    assert.equal(rec.state, 'STATE_SUCCEEDED');
    assert.equal(rec.attempt, 2);
    assert.equal(dest.total(), 1);
  });
}

for (const [name, given, recorded] of [
  ['an integer', 4711, '4711'], ['a string', 'TCK-1', 'TCK-1'], ['none', undefined, ''],
  ['a BigInt', 2n ** 63n + 1n, '9223372036854775809'],
  ['a fraction', 4711.5, null], ['an object', { id: 1 }, null], ['an integer past 2^53', 2 ** 53 + 2, null],
]) {
  test(`a resource id given as ${name}`, async (t) => {
    // An integer id is recorded as its digits; a fraction or an object, which
    // has no one spelling ("[object Object]"), or a number that may have been
    // rounded, leaves the effect to reconciliation.
    const { dest, ledger, id } = setup();
    t.after(() => ledger.close());
    const call = { operationId: id('refund'), tool: 'short.refund', params: { amount: 10 } };
    const made = async (a) => { dest.apply(a.idempotencyKey); return { resource_id: given, data: {} }; };
    if (recorded === null) {
      await assert.rejects(ledger.callTool(call, made), client.NotRecordedError);
      assert.equal((await ledger.lookup(call.operationId)).state, 'STATE_UNKNOWN');
    } else {
      const out = await ledger.callTool(call, made);
      const again = await ledger.callTool(call, made);
      assert.deepEqual([out.resourceId, again.resourceId, again.replayed], [recorded, recorded, true]);
    }
    assert.equal(dest.total(), 1);
  });
}

for (const [name, produced, error] of [
  ['a string', 'TCK-1', /fn returned a string; return \{ resource_id, data \}/],
  ['data a list', { resource_id: 'TCK-1', data: ['a'] }, /data: params and result data must be JSON objects/],
  ['undefined, an empty result', undefined, null],
]) {
  test(`fn returning ${name}`, async (t) => {
    // What fn returns is recorded, or refused with its kind named: never
    // dropped. The effect has happened either way.
    const { dest, ledger, id } = setup();
    t.after(() => ledger.close());
    const call = { operationId: id('refund'), tool: 'short.refund', params: { amount: 10 } };
    const made = async (a) => { dest.apply(a.idempotencyKey); return produced; };
    if (error) {
      await assert.rejects(ledger.callTool(call, made), (err) => err instanceof client.NotRecordedError && error.test(err.cause.message));
      assert.equal((await ledger.lookup(call.operationId)).state, 'STATE_UNKNOWN');
    } else {
      const out = await ledger.callTool(call, made);
      assert.deepEqual([out.resourceId, out.data], ['', {}]);
    }
    assert.equal(dest.total(), 1);
  });
}

for (const [name, given, message] of [
  ['fn undefined', { fn: undefined }, 'fn: undefined is not a function; callTool runs fn(attempt)'],
  ['fn a string', { fn: 'refund' }, 'fn: string is not a function; callTool runs fn(attempt)'],
  ['an object for an id', { operationId: {} }, 'operationId: object, not a string'],
  ['a number for a tool', { tool: 5 }, 'tool: number, not a string'],
  ['an effect misspelt', { effect: 'idempotent' }, 'effect: not one of EFFECT_UNSPECIFIED, EFFECT_READ_ONLY, EFFECT_IDEMPOTENT, EFFECT_IRREVERSIBLE'],
  ['no wait', { waitMs: 0 }, 'waitMs: a positive number of milliseconds is required'],
  ['a NaN wait', { waitMs: NaN }, 'waitMs: a positive number of milliseconds is required'],
  ['a negative tool timeout', { toolTimeoutMs: -1 }, 'toolTimeoutMs: a positive number of milliseconds is required'],
  ['a tool timeout in a string', { toolTimeoutMs: '1000' }, 'toolTimeoutMs: a positive number of milliseconds is required'],
]) {
  test(`a call with ${name} is refused before anything is sent`, async (t) => {
    // A claim with no tool to run would be left UNKNOWN, though nothing
    // ran; an id sent as "[object Object]" would be one for every call.
    const { dest, ledger, id } = setup();
    t.after(() => ledger.close());
    const { fn, ...fields } = { fn: refund(dest), ...given };
    const call = { operationId: id('refund'), tool: 'payments.refund', params: { amount: 10 }, ...fields };
    await assert.rejects(ledger.callTool(call, fn), { name: 'TypeError', message });
    await assert.rejects(ledger.lookup(String(call.operationId)), (err) => err.reason === 'NOT_FOUND');
    assert.equal(dest.total(), 0);
  });
}

for (const [target, options, refused] of [
  ['ledger.example:443', { apiKey: 'k.s' }, true],
  ['10.0.0.5:50051', { apiKey: 'k.s' }, true],
  ['dns:///ledger.example:443', { apiKey: 'k.s' }, true],
  ['127.0.0.1:50051', { apiKey: 'k.s' }, false],
  ['127.0.0.2:50051', { apiKey: 'k.s' }, false],
  ['[::1]:50051', { apiKey: 'k.s' }, false],
  ['localhost:50051', { apiKey: 'k.s' }, false],
  ['unix:/run/ledger.sock', { apiKey: 'k.s' }, false],
  ['ledger.example:443', {}, false],
  ['ledger.example:443', { apiKey: 'k.s', credentials: grpc.credentials.createSsl() }, false],
]) {
  test(`a client of ${target}${options.apiKey ? ' with a key' : ''}${options.credentials ? ' over TLS' : ''} is ${refused ? 'refused' : 'made'}`, () => {
    // As the Go SDK: a key without TLS goes only to this machine.
    const make = () => new client.Ledger(target, options).close();
    if (refused) assert.throws(make, { name: 'TypeError', message: /^apiKey: refusing to send an API key without TLS/ });
    else make();
  });
}

for (const [name, options, message] of [
  ['no call timeout', { callTimeoutMs: 0 }, 'callTimeoutMs: a positive number of milliseconds is required'],
  ['a call timeout in a string', { callTimeoutMs: '5000' }, 'callTimeoutMs: a positive number of milliseconds is required'],
  ['negative retries', { ledgerRetries: -1 }, 'ledgerRetries: a whole number, 0 or more, is required'],
  ['fractional retries', { ledgerRetries: 1.5 }, 'ledgerRetries: a whole number, 0 or more, is required'],
  ['a reconciler that is no function', { reconcilers: { 'tickets.create': 'findTicket' } }, 'reconcilers["tickets.create"]: string is not a function'],
]) {
  test(`a client with ${name} is refused`, () => {
    // Every call would fail for it ("no time left"), or repeat oddly.
    assert.throws(() => new client.Ledger('127.0.0.1:1', options).close(), { name: 'TypeError', message });
  });
}
test('a client with no ledger retries is made', () => new client.Ledger('127.0.0.1:1', { ledgerRetries: 0 }).close());

test('S9: an appointment with faults, sent 5 times, 2 of them at once', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const params = { patient: 'p-42', slot: '2026-12-03T09:30' };
  const book = (p = params, operationId = id('appointment')) => ledger.callTool(
    { operationId, tool: 'appointments.create', params: p, permitId: 'p-1' }, refund(dest));
  dest.faults = ['before-write'];
  await assert.rejects(book(), client.RetryableToolError);
  dest.faults = ['after-write'];
  await assert.rejects(book(), /timed out after the write/);
  const seen = [(await book()).resourceId]; // reconciled; then the agent "crashes" before saving it
  seen.push(...(await Promise.all([book(), book()])).map((o) => o.resourceId));
  seen.push((await book()).resourceId, (await book()).resourceId);
  assert.deepEqual(seen, ['R-1', 'R-1', 'R-1', 'R-1', 'R-1']);
  assert.equal(dest.total(), 1);
  await assert.rejects(book({ ...params, slot: '2026-12-03T10:00' }), (err) => err instanceof client.LedgerError
    && err.reason === 'IDEMPOTENCY_KEY_REUSED' && err.metadata.differs === 'params');
  assert.equal((await book(params, id('appointment-2'))).resourceId, 'R-2');
  assert.equal(dest.total(), 2);
});

test('S10: a lost Reserve answer recovers the same claim', async (t) => {
  const { dest, drop, ledger, id } = setup();
  t.after(() => ledger.close());
  const op = id('refund');
  drop.armed.Reserve = 1;
  const out = await ledger.callTool({ operationId: op, tool: 'payments.refund', params: { amount: 1 } }, refund(dest));
  assert.deepEqual(drop.dropped, ['Reserve']);
  assert.equal(out.replayed, false);
  assert.deepEqual((await ledger.lookup(op)).history.map((h) => h.reason), ['RESERVED', 'SUCCEEDED']);
  assert.equal(dest.total(), 1);
});

test('S12: every RPC retried after a lost answer', async (t) => {
  const { drop, ledger, id } = setup();
  t.after(() => ledger.close());
  const op = id('refund');
  const run = id('run');
  const other = id('lost');
  let token = '';
  const calls = [
    ['StartRun', () => ({ run_id: run })],
    ['Reserve', () => ({ operation_id: op, tool: 'payments.refund', holder: 'h-1', run_id: run })],
    ['Renew', () => ({ operation_id: op, fencing_token: token })],
    ['Complete', () => ({ operation_id: op, fencing_token: token, outcome: 'OUTCOME_SUCCEEDED', result: { resource_id: 'R-9' } })],
    ['Lookup', () => ({ operation_id: op })],
    ['GetRun', () => ({ run_id: run })],
    ['EndRun', () => ({ run_id: run, state: 'RUN_STATE_DONE' })],
  ];
  for (const [method, request] of calls) {
    drop.armed[method] = 1;
    const resp = await ledger.rpc(method, request());
    if (method === 'Reserve') {
      assert.equal(resp.decision, 'DECISION_EXECUTE');
      token = resp.operation.fencing_token;
    }
  }
  assert.deepEqual(drop.dropped, calls.map(([m]) => m));
  const rec = await ledger.lookup(op);
  assert.equal(rec.state, 'STATE_SUCCEEDED');
  assert.equal(rec.attempt, 1);
  assert.equal(rec.result.resource_id, 'R-9');
  const r = await ledger.getRun(run);
  assert.equal(r.state, 'RUN_STATE_DONE');
  assert.equal(r.steps, 1);

  const claim = await ledger.rpc('Reserve', { operation_id: other, tool: 'payments.refund', holder: 'h-2' });
  drop.armed.MarkUnknown = 1;
  await ledger.rpc('MarkUnknown', { operation_id: other, fencing_token: claim.operation.fencing_token });
  drop.armed.Reconcile = 1;
  const done = await ledger.rpc('Reconcile', { operation_id: other, finding: 'FINDING_ABANDON', note: 'n' });
  assert.equal(done.operation.state, 'STATE_FAILED_FINAL');
  assert.deepEqual((await ledger.lookup(other)).history.map((h) => h.reason), ['RESERVED', 'MARKED_UNKNOWN', 'ABANDONED']);
});

test('a compensation names what it reverses; one of nothing is refused', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const charge = id('charge');
  const undo = id('refund');
  await ledger.callTool({ operationId: charge, tool: 'payments.charge', params: { amount: 10 } }, refund(dest));
  for (let i = 0; i < 2; i += 1) {
    await ledger.callTool({ operationId: undo, tool: 'payments.refund', params: { amount: 10 }, compensates: charge }, refund(dest));
  }
  assert.equal(dest.total(), 2);
  assert.deepEqual((await ledger.lookup(charge)).compensated_by, [undo]);
  assert.equal((await ledger.lookup(undo)).compensates, charge);
  await assert.rejects(ledger.callTool({ operationId: id('refund-2'), tool: 'payments.refund', params: {}, compensates: id('never') },
    refund(dest)), (err) => err.reason === 'NOT_COMPENSABLE' && err.metadata.cause === 'not_found');
  assert.equal(dest.total(), 2);
});

test('an aborted signal before the tool starts runs nothing', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const signal = AbortSignal.abort(new Error('the user stopped the run'));
  await assert.rejects(ledger.callTool({ operationId: id('x'), tool: 'payments.refund', params: {}, signal }, refund(dest)),
    /the user stopped the run/);
  assert.equal(dest.total(), 0);
});

test('the run guard ends a run at its cap; a final failure is recorded', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const run = id('run');
  await ledger.startRun(run, { maxSteps: 1 });
  await ledger.callTool({ operationId: id('a'), tool: 'tickets.create', params: {}, runId: run }, refund(dest));
  await assert.rejects(ledger.callTool({ operationId: id('b'), tool: 'tickets.create', params: {}, runId: run }, refund(dest)),
    (err) => err instanceof client.RunEndedError && err.status === 'step_limit');
  await assert.rejects(ledger.callTool({ operationId: id('c'), tool: 'payments.charge', params: {} }, async () => {
    throw new client.FinalToolError('card_declined');
  }), (err) => err instanceof client.ToolFailedError && err.failureCode === 'card_declined');
  assert.equal(dest.total(), 1);
});

test('a final failure\'s detail is recorded and replayed, never in the error\'s message', async (t) => {
  const { ledger, id } = setup();
  t.after(() => ledger.close());
  for (const [name, given, recorded] of [
    ['a string', 'card 4242 declined', 'card 4242 declined'],
    ['over 64 KiB', '4242 ' + 'é'.repeat(40 << 10), '4242 ' + 'é'.repeat(((64 << 10) - 5) >> 1)],
    ['a lone surrogate', '4242 a\ud800b', '4242 a\ufffdb'],
    ['not a string', { card: '4242' }, ''],
  ]) {
    const call = { operationId: id(name), tool: 'payments.refund', params: { amount: 10 } };
    for (const replayed of [false, true]) {
      await assert.rejects(ledger.callTool(call, async () => {
        throw new client.FinalToolError('card_declined', 'declined', given);
      }), (err) => {
        assert.ok(err instanceof client.ToolFailedError, `${name}: ${err}`);
        assert.deepEqual([err.failureCode, err.detail, err.replayed], ['card_declined', recorded, replayed], name);
        assert.ok(!err.message.includes('4242'), `${name}: ${err.message}`);
        return true;
      });
    }
    assert.equal((await ledger.lookup(call.operationId)).failure.detail, recorded, name);
  }
});

// What a receipt signs (its payload; the Go and jose tests check the signatures).
const claims = (receipt) => {
  assert.ok(receipt, 'no receipt: make test runs ledgerd with --receipt-keys');
  return JSON.parse(Buffer.from(receipt.split('.')[1], 'base64url').toString('utf8'));
};

test('receipts are handed on: a result, its replay, a final failure', async (t) => {
  const { dest, ledger, id } = setup();
  t.after(() => ledger.close());
  const call = { operationId: id('refund'), tool: 'payments.refund', params: { amount: 10 }, permitId: 'p-1' };
  const first = await ledger.callTool(call, refund(dest));
  const again = await ledger.callTool(call, refund(dest));
  const fresh = claims(first.receipt);
  const replayed = claims(again.receipt);
  assert.equal(fresh.operation_id, call.operationId);
  assert.equal(fresh.state, 'STATE_SUCCEEDED');
  assert.equal(replayed.result_sha256, fresh.result_sha256);
  assert.equal(replayed.history_head, (await ledger.lookup(call.operationId)).history_head);
  assert.equal(dest.total(), 1);
  for (let i = 0; i < 2; i++) { // the failure recorded, then replayed
    await assert.rejects(ledger.callTool({ operationId: id('declined'), tool: 'payments.refund', params: {} }, async () => {
      throw new client.FinalToolError('card_declined');
    }), (err) => err instanceof client.ToolFailedError && claims(err.receipt).failure_code === 'card_declined');
  }
});
