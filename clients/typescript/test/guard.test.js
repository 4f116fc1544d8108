'use strict';
// guardTool: what a guarded tool returns, on its first call and on every
// replay, for each kind of result a framework's tool may return.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const client = require('../dist');
const { addr, ids } = require('./helpers');

for (const [name, result, want] of [
  ['an object', { ticket: 'T-1', n: 2 }, { ticket: 'T-1', n: 2 }],
  ['an empty object', {}, {}],
  ['a string', 'booked T-1', 'booked T-1'],
  ['a number', 42, 42],
  ['a list', ['T-1', 'T-2'], ['T-1', 'T-2']],
  ['null', null, null],
  ['undefined, as null', undefined, null],
]) {
  test(`a guarded tool returning ${name} returns it on every call`, async (t) => {
    const ledger = new client.Ledger(addr());
    t.after(() => ledger.close());
    let runs = 0;
    const guarded = client.guardTool(ledger, { tool: 'tickets.create', operationId: (args) => args.callId },
      async () => { runs += 1; return result; });
    const args = { callId: ids()('call'), title: 'Printer on fire' };
    const first = await guarded(args);
    const again = await guarded(args);
    assert.deepEqual([first, again], [want, want]);
    assert.equal(runs, 1);
  });
}
