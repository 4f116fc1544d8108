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

const refused = [
  { name: 'a BigInt', in: { a: 1n }, message: /no JSON value for bigint 1/ },
  { name: 'NaN', in: { a: NaN }, message: /no JSON value for number NaN/ },
  { name: 'Infinity in a list', in: { a: [Infinity] }, message: /no JSON value for number Infinity/ },
  { name: 'a Map', in: { a: new Map() }, message: /no JSON value for a Map/ },
  { name: 'a class instance', in: { a: new Money(1) }, message: /no JSON value for a Money/ },
  { name: 'a function', in: { a: () => 1 }, message: /no JSON value for function/ },
  { name: 'a symbol', in: { a: Symbol('s') }, message: /no JSON value for symbol/ },
  { name: 'a list, not an object', in: [1], message: /must be JSON objects/ },
  { name: 'a string, not an object', in: 'x', message: /must be JSON objects/ },
  { name: 'undefined, not an object', in: undefined, message: /must be JSON objects/ },
];

for (const row of refused) {
  test(`toStruct refuses ${row.name}`, () => {
    assert.throws(() => toStruct(row.in), { name: 'TypeError', message: row.message });
  });
}
