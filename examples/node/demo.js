'use strict';
// The operation ledger from Node.js, end to end, against a running ledgerd.
//
//   node examples/node/demo.js [ADDRESS]    (default $LEDGER_ADDR or 127.0.0.1:50051)
//
// One tool call of an agent run ("open a ticket") goes through the ledger:
// Reserve -> the fake tool runs -> Complete; a retry replays the recorded
// result without running the tool; the same operation_id with changed
// parameters is refused with IDEMPOTENCY_KEY_REUSED; Lookup shows the history.
// It exits non-zero when any of that does not hold.

const crypto = require('node:crypto');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
// The package from this repository (clients/typescript, built by make test: npm run build there).
const { Ledger, LedgerError } = require('../../clients/typescript/dist');

function check(ok, what) {
  if (!ok) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
  console.log(`ok: ${what}`);
}

function same(a, b) {
  try {
    assert.deepStrictEqual(a, b);
    return true;
  } catch {
    return false;
  }
}

async function main() {
  const address = process.argv[2] || process.env.LEDGER_ADDR || '127.0.0.1:50051';
  const ledger = new Ledger(address, { log: (msg) => console.log(`  ${msg}`) });

  // The agent minted the operation id once, when the intent was confirmed:
  // workflow run + step. Every retry of this step reuses it.
  const runId = `node-${crypto.randomUUID().slice(0, 12)}`;
  const operationId = `${runId}:create-ticket`;

  const tickets = []; // the fake destination: every ticket it created
  const createTicket = async (attempt) => {
    tickets.push({ key: attempt.idempotencyKey, token: attempt.fencingToken });
    const id = `TCK-${1041 + tickets.length}`;
    return { resource_id: id, data: { url: `https://tickets.example/${id}` } };
  };
  const noSecondRun = async (attempt) => {
    throw new Error(`the tool ran again (attempt ${attempt.attempt})`);
  };
  const op = {
    operationId, tool: 'tickets.create', params: { title: 'Printer on fire', priority: 2 }, permitId: 'approval-77',
  };

  console.log(`1. Reserve -> run the tool -> Complete (${operationId})`);
  const first = await ledger.callTool(op, createTicket);
  check(!first.replayed, 'the first call ran the tool (DECISION_EXECUTE)');
  check(first.resourceId === 'TCK-1042', `the result is recorded: ${first.resourceId} ${JSON.stringify(first.data)}`);
  check(first.operation.state === 'STATE_SUCCEEDED', 'the operation SUCCEEDED');
  check(tickets.length === 1, 'the destination applied the effect once');

  console.log('2. the agent never saw that answer and retries: same request, keys in another order');
  const again = await ledger.callTool({ ...op, params: { priority: 2, title: 'Printer on fire' } }, noSecondRun);
  check(again.replayed, 'the retry got DECISION_REPLAY');
  check(again.resourceId === first.resourceId && same(again.data, first.data), 'the replay carries the same result');
  check(tickets.length === 1, 'the destination still applied the effect once');

  console.log('3. the same operation_id with a changed request (priority 1)');
  try {
    await ledger.callTool({ ...op, params: { title: 'Printer on fire', priority: 1 } }, noSecondRun);
    check(false, 'the conflicting Reserve was refused');
  } catch (err) {
    if (!(err instanceof LedgerError)) throw err;
    console.log(`  refused: ${err.message}`);
    check(err.code === grpc.status.FAILED_PRECONDITION, 'code FAILED_PRECONDITION');
    check(err.domain === 'ledger.v1' && err.reason === 'IDEMPOTENCY_KEY_REUSED',
      'ErrorInfo reason IDEMPOTENCY_KEY_REUSED (domain ledger.v1)');
    check(err.metadata.differs === 'params', 'ErrorInfo metadata differs=params');
    // The client stops here: it never mints a new key on its own.
  }
  check(tickets.length === 1, 'nothing ran');

  console.log('4. Lookup');
  const record = await ledger.lookup(operationId);
  const steps = record.history.map((h) => [h.from_state, h.to_state, h.reason]);
  steps.forEach(([from, to, reason]) => console.log(`  history: ${from} -> ${to} (${reason})`));
  check(record.state === 'STATE_SUCCEEDED' && record.attempt === 1, 'the record is SUCCEEDED after one attempt');
  check(record.result.resource_id === first.resourceId, 'the record keeps the result');
  check(same(steps, [
    ['STATE_UNSPECIFIED', 'STATE_RUNNING', 'RESERVED'],
    ['STATE_RUNNING', 'STATE_SUCCEEDED', 'SUCCEEDED'],
  ]), 'the history is RESERVED, SUCCEEDED');

  console.log('5. Lookup of an operation nobody reserved');
  try {
    await ledger.lookup(`${runId}:never-reserved`);
    check(false, 'an unknown operation is NOT_FOUND');
  } catch (err) {
    if (!(err instanceof LedgerError)) throw err;
    check(err.code === grpc.status.NOT_FOUND && err.reason === 'NOT_FOUND',
      'an unknown operation is NOT_FOUND (ErrorInfo reason NOT_FOUND)');
  }

  ledger.close();
  console.log('PASS: node example');
}

main().catch((err) => {
  console.error(`FAIL: ${err.stack || err}`);
  process.exit(1);
});
