// @opledger/client: the operation ledger's client for Node.js. Ledger.callTool
// runs a side-effecting tool at most once per operation id; guardTool wraps
// a framework tool's execute function the same way. See README.md.

export * from './errors';
export * from './ledger';
export * from './guard';
export { fromStruct, toStruct } from './struct';
export type { JSONValue } from './struct';
export type { Operation, Run, HistoryEntry, Result, Failure, Time } from './proto';
export * from './adapters';
