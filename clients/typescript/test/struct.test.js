'use strict';
// toStruct and fromStruct: a JSON object as google.protobuf.Struct on the
// wire and back, as JSON.stringify would write it, and refusals of what JSON
// cannot carry.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const protobuf = require('protobufjs');
const { toStruct, fromStruct } = require('../dist');

const Struct = protobuf.Root.fromJSON(protobuf.common.get('google/protobuf/struct.proto')).lookupType('google.protobuf.Struct');

// wire sends a Struct through its encoding, and reads it as the client's
// proto-loader does (oneofs, enums as strings).
function wire(s) {
  const bytes = Struct.encode(Struct.fromObject(s)).finish();
  return Struct.toObject(Struct.decode(bytes), { oneofs: true, enums: String, defaults: true });
}

class Money {
  constructor(n) {
    this.n = n;
  }
}

const sent = [
  { name: 'numbers, strings, booleans and null', in: { a: 1.5, b: 'x', c: true, d: null }, want: { a: 1.5, b: 'x', c: true, d: null } },
  { name: 'nested objects and lists', in: { a: { b: [1, { c: [] }] } }, want: { a: { b: [1, { c: [] }] } } },
  { name: 'an undefined member is left out', in: { amount: 10, note: undefined }, want: { amount: 10 } },
  { name: 'a nested undefined member is left out', in: { a: { b: undefined, c: 1 } }, want: { a: { c: 1 } } },
  { name: 'an undefined list item is null', in: { tags: ['a', undefined] }, want: { tags: ['a', null] } },
  { name: 'a Date is its ISO string', in: { at: new Date(0) }, want: { at: '1970-01-01T00:00:00.000Z' } },
  { name: 'a surrogate pair', in: { s: 'rocket \u{1F680}', '\u{1F680}': 1 }, want: { s: 'rocket \u{1F680}', '\u{1F680}': 1 } },
  { name: 'an object without a prototype', in: Object.assign(Object.create(null), { a: 1 }), want: { a: 1 } },
  { name: 'an empty object', in: {}, want: {} },
];

for (const row of sent) {
  test(`toStruct: ${row.name}`, () => {
    const got = fromStruct(wire(toStruct(row.in)));
    assert.deepEqual(got, row.want);
    assert.equal(JSON.stringify(got), JSON.stringify(row.in), 'the same JSON as JSON.stringify writes');
  });
}

// Each refusal names where, by JSON pointer, and the kind, never the value.
const refused = [
  { name: 'a BigInt', in: { a: 12345n }, message: 'params/a: a BigInt has no JSON value' },
  { name: 'NaN', in: { a: NaN }, message: 'params/a: a number JSON cannot hold (NaN or an infinity) has no JSON value' },
  { name: 'Infinity in a list', in: { a: [1, Infinity] }, message: 'params/a/1: a number JSON cannot hold (NaN or an infinity) has no JSON value' },
  { name: 'a Map', in: { a: new Map([['k', 'v']]) }, message: 'params/a: a Map has no JSON value' },
  { name: 'a class instance', in: { a: { b: new Money(12345) } }, message: 'params/a/b: a Money has no JSON value' },
  { name: 'a function', in: { a: () => 12345 }, message: 'params/a: a function has no JSON value' },
  { name: 'a symbol', in: { a: Symbol('12345') }, message: 'params/a: a symbol has no JSON value' },
  { name: 'a lone surrogate', in: { a: ['x', 'caf\ud800'] }, message: 'params/a/1: a string with a lone surrogate has no UTF-8 form' },
  { name: 'a lone surrogate in a key', in: { 'k\udc00': 1 }, message: 'params: a key with a lone surrogate has no UTF-8 form' },
  { name: 'a list, not an object', in: [1], message: 'params: params and result data must be JSON objects' },
  { name: 'a string, not an object', in: '12345', message: 'params: params and result data must be JSON objects' },
  { name: 'undefined, not an object', in: undefined, message: 'params: params and result data must be JSON objects' },
];

for (const row of refused) {
  test(`toStruct refuses ${row.name}`, () => {
    assert.throws(() => toStruct(row.in, 'params'), { name: 'TypeError', message: row.message });
  });
}
