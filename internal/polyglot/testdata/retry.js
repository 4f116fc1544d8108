'use strict';
// Retries, from TypeScript, operations the Go SDK ran: each request written
// as JavaScript writes it (an undefined member, keys in another order, -0).
//
// Usage: node retry.js ADDR PREFIX. Prints one line per operation and
// "PASS: typescript retries" when every one was replayed, the tool never run.

const path = require('node:path');
const client = require(path.join(__dirname, '..', '..', '..', 'clients', 'typescript', 'dist'));

const requests = {
  order: { items: [{ qty: 2, sku: 'A-1' }, { sku: 'B-2', qty: 1 }], note: null, amount: 10.5, currency: 'EUR', coupon: undefined },
  numbers: { whole: 2, float_whole: 2.0, tenth: 0.1, large: 1e21, round: 1e20, zero: -0, tiny: 1.5e-7, negative: -40 },
  text: { line: 'a\nb\t"q"', a: 'ascii', '\u00e9': 'accent key', name: 'Zo\u00eb \u{1F680}' },
  empty: { text: '', flag: false, object: {}, list: [] },
};

async function main(addr, prefix) {
  const ledger = new client.Ledger(addr);
  const ran = [];
  let replayed = 0;
  for (const [name, params] of Object.entries(requests)) {
    try {
      const out = await ledger.callTool({ operationId: prefix + name, tool: 'payments.refund', params, permitId: 'p-1' },
        async (a) => { ran.push(a.operationId); return { resource_id: 'typescript', data: {} }; });
      console.log(`${name}: replayed=${out.replayed} resource=${out.resourceId}`);
      if (out.replayed && out.resourceId === 'go') replayed += 1;
    } catch (err) {
      console.log(`${name}: ${err.reason || err.message}`);
    }
  }
  ledger.close();
  const total = Object.keys(requests).length;
  if (ran.length || replayed !== total) {
    console.log(`FAIL: the tool ran for ${JSON.stringify(ran)}; ${replayed} of ${total} replayed Go's result`);
    process.exit(1);
  }
  console.log('PASS: typescript retries');
}

main(process.argv[2], process.argv[3]).catch((err) => { console.error(err); process.exit(1); });
