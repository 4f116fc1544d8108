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
 * NaN, a Map, a function, a class instance) is refused with a TypeError
 * rather than sent as {} or null, where two different requests would share a
 * fingerprint.
 */
function toValue(v: unknown): Value {
  if (v === null || v === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof v === 'number' && Number.isFinite(v)) return { numberValue: v };
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  if (typeof v === 'object' && typeof (v as { toJSON?: unknown }).toJSON === 'function') {
    return toValue((v as { toJSON: () => unknown }).toJSON());
  }
  if (typeof v === 'object' && [Object.prototype, null].includes(Object.getPrototypeOf(v))) {
    const members = Object.entries(v as object).filter(([, x]) => x !== undefined);
    return { structValue: { fields: Object.fromEntries(members.map(([k, x]) => [k, toValue(x)])) } };
  }
  const what = typeof v === 'object' ? `a ${(v as object).constructor?.name || 'object'}` : `${typeof v} ${String(v)}`;
  throw new TypeError(`no JSON value for ${what}`);
}

/** A JSON object as a Struct; anything else is a TypeError. */
export function toStruct(obj: unknown): Struct {
  const v = toValue(obj);
  if (!v.structValue) throw new TypeError('params and result data must be JSON objects');
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
