// google.protobuf.Struct <-> plain JSON objects, in proto-loader's shape (the
// built-in well-known types have camelCase field names: numberValue, ...).

import { Struct } from './proto';

/** A JSON value. */
export type JSONValue = null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };

type Value = Record<string, unknown>;

/**
 * A JSON value as a google.protobuf.Value, as JSON.stringify writes it: a
 * member whose value is undefined is left out, an undefined list item is
 * null, a Date is its ISO string (toJSON). What JSON cannot carry (a BigInt,
 * NaN, a Map, a function, a class instance, a string with a lone surrogate,
 * which has no UTF-8 form) is refused with a TypeError
 * naming where it is (a JSON pointer after where) and what kind it is, never
 * the value, rather than sent as {} or null, where two different requests
 * would share a fingerprint.
 */
function toValue(v: unknown, where: string): Value {
  if (v === null || v === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof v === 'number' && Number.isFinite(v)) return { numberValue: v };
  if (typeof v === 'string') {
    if (!wellFormed(v)) throw new TypeError(`${where}: a string with a lone surrogate has no UTF-8 form`);
    return { stringValue: v };
  }
  if (typeof v === 'boolean') return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map((x, i) => toValue(x, `${where}/${i}`)) } };
  if (typeof v === 'object' && typeof (v as { toJSON?: unknown }).toJSON === 'function') {
    return toValue((v as { toJSON: () => unknown }).toJSON(), where);
  }
  if (typeof v === 'object' && [Object.prototype, null].includes(Object.getPrototypeOf(v))) {
    const members = Object.entries(v as object).filter(([, x]) => x !== undefined);
    const bad = members.find(([k]) => !wellFormed(k));
    if (bad) throw new TypeError(`${where}: a key with a lone surrogate has no UTF-8 form`);
    return { structValue: { fields: Object.fromEntries(members.map(([k, x]) => [k, toValue(x, `${where}/${k}`)])) } };
  }
  throw new TypeError(`${where}: ${kind(v)} has no JSON value`);
}

// A lone surrogate: half of a UTF-16 pair, which UTF-8 cannot encode.
const loneSurrogate = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether s has a UTF-8 form (no lone surrogate), which the wire's strings need. */
function wellFormed(s: string): boolean {
  return !loneSurrogate.test(s);
}

/** What kind of value v is, in words that do not repeat it. */
function kind(v: unknown): string {
  if (typeof v === 'number') return 'a number JSON cannot hold (NaN or an infinity)';
  if (typeof v === 'bigint') return 'a BigInt';
  if (typeof v === 'object') return `a ${(v as object).constructor?.name || 'object'}`;
  return `a ${typeof v}`;
}

/**
 * A JSON object as a Struct; anything else is a TypeError. where names the
 * object in the errors ('params', 'data').
 */
export function toStruct(obj: unknown, where = ''): Struct {
  const v = toValue(obj, where);
  if (!v.structValue) throw new TypeError(`${where || 'the value'}: params and result data must be JSON objects`);
  return v.structValue as Struct;
}

function fromValue(v: Value): JSONValue {
  switch (v.kind) {
    case 'numberValue': return v.numberValue as number;
    case 'stringValue': return v.stringValue as string;
    case 'boolValue': return v.boolValue as boolean;
    case 'listValue': return (((v.listValue as { values?: Value[] }).values) || []).map(fromValue);
    case 'structValue': return fromStruct(v.structValue as Struct);
    default: return null;
  }
}

/** A Struct as a plain object ({} for none). */
export function fromStruct(s: Struct | null | undefined): { [key: string]: JSONValue } {
  return Object.fromEntries(Object.entries((s && s.fields) || {}).map(([k, v]) => [k, fromValue(v as Value)]));
}
