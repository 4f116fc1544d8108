'use strict';
// What the tests share: the ledgerd at LEDGER_ADDR (make test starts one on a
// real redis-server with internal/polyglot's packagePolicy: short.* has a
// 400 ms lease), fake destinations that count their effects, and an
// interceptors that lose answers or hold a call back.

const crypto = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const client = require('../dist');

function addr() {
  const a = process.env.LEDGER_ADDR;
  if (!a) throw new Error('LEDGER_ADDR is not set: run these tests with make test, or against a ledgerd of your own');
  return a;
}

// ids mints operation ids no other test uses.
function ids() {
  const prefix = crypto.randomBytes(5).toString('hex');
  return (name) => `ts-${prefix}:${name}`;
}

// A fake destination: it counts the effects it applied, by idempotency key.
class Destination {
  constructor() {
    this.applied = new Map();
    this.faults = [];
  }

  apply(key) {
    const fault = this.faults.shift() || '';
    if (fault === 'before-write') throw new client.RetryableToolError('503 before the write');
    const rid = `R-${this.total() + 1}`;
    this.applied.set(key, [...(this.applied.get(key) || []), rid]);
    if (fault === 'after-write') throw new Error('read timed out after the write');
    return { resource_id: rid, data: { receipt: rid } };
  }

  total() {
    let n = 0;
    for (const v of this.applied.values()) n += v.length;
    return n;
  }

  reconciler = async (op) => {
    const found = this.applied.get(op.operation_id);
    if (found) return { kind: 'FINDING_APPLIED', resourceId: found[0], data: { receipt: found[0] }, note: 'found' };
    return { kind: 'FINDING_NOT_APPLIED', note: 'not at the destination' };
  };
}

// A client interceptor that lets calls reach the ledger and loses the
// answers of the methods armed (armed[method] times).
function dropper() {
  const armed = {};
  const dropped = [];
  const interceptor = (options, nextCall) => {
    const method = options.method_definition.path.split('/').pop();
    return new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        const drop = (armed[method] || 0) > 0;
        if (drop) armed[method] -= 1;
        next(metadata, {
          onReceiveMetadata: (md, nxt) => nxt(md),
          onReceiveMessage: (msg, nxt) => nxt(msg), // the status below decides what the caller sees
          onReceiveStatus: (status, nxt) => {
            if (!drop || status.code !== grpc.status.OK) return nxt(status);
            dropped.push(method);
            return nxt({ code: grpc.status.UNAVAILABLE, details: 'the response was lost', metadata: new grpc.Metadata() });
          },
        });
      },
    });
  };
  return { armed, dropped, interceptor };
}

// A client interceptor that awaits hook once, before the first call of
// method goes out.
function beforeCall(method, hook) {
  return (options, nextCall) => new grpc.InterceptingCall(nextCall(options), {
    start(metadata, listener, next) {
      if (options.method_definition.path.split('/').pop() !== method || !hook) return next(metadata, listener);
      const h = hook;
      hook = null;
      h().finally(() => next(metadata, listener));
    },
  });
}

module.exports = { addr, ids, Destination, dropper, beforeCall };
