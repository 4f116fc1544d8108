// The ledger's wire: ledger.v1.LedgerService loaded at run time from the
// package's proto/ directory (make generate copies it), and the
// google.rpc error details decoded with protobufjs.

import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import * as protobuf from 'protobufjs';

const PROTO = path.resolve(__dirname, '..', 'proto');

const definition = protoLoader.loadSync('ledger/v1/ledger.proto', {
  includeDirs: [PROTO],
  keepCase: true, // fields keep their wire names: operation_id, fencing_token, ...
  longs: String, // uint64 fencing tokens as decimal strings: no precision lost
  enums: String,
  defaults: true,
  oneofs: true,
});

// The service's client constructor.
export const LedgerServiceClient = (grpc.loadPackageDefinition(definition) as any).ledger.v1
  .LedgerService as grpc.ServiceClientConstructor;

const rpcTypes = new protobuf.Root();
rpcTypes.resolvePath = (_origin: string, target: string) => (target.startsWith('google/protobuf/')
  ? target // protobufjs has the well-known types built in
  : path.join(PROTO, target));
rpcTypes.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
export const Status = rpcTypes.lookupType('google.rpc.Status');
export const ErrorInfoType = rpcTypes.lookupType('google.rpc.ErrorInfo');
export const RetryInfoType = rpcTypes.lookupType('google.rpc.RetryInfo');

/** A google.protobuf.Timestamp or Duration as proto-loader gives it. */
export interface Time {
  seconds?: string | number;
  nanos?: number;
}

/** A google.protobuf.Struct in proto-loader's shape. */
export interface Struct {
  fields?: Record<string, unknown>;
}

/** A recorded result. */
export interface Result {
  data?: Struct | null;
  resource_id?: string;
}

/** A recorded failure. */
export interface Failure {
  code?: string;
  message?: string;
}

/** One transition of an operation. */
export interface HistoryEntry {
  time?: Time | null;
  from_state: string;
  to_state: string;
  attempt: number;
  principal: string;
  reason: string;
  fencing_token: string;
  detail: string;
}

/** The snapshot of one operation's record (ledger.v1.Operation). */
export interface Operation {
  operation_id: string;
  tool: string;
  effect: string;
  state: string;
  attempt: number;
  fencing_token: string;
  params_sha256?: Buffer;
  permit_id: string;
  run_id: string;
  step: number;
  result?: Result | null;
  failure?: Failure | null;
  reason: string;
  needs_review: boolean;
  created_at?: Time | null;
  updated_at?: Time | null;
  lease_expires_at?: Time | null;
  unknown_since?: Time | null;
  recovery_deadline?: Time | null;
  retain_until?: Time | null;
  expires_at?: Time | null;
  max_attempts: number;
  history: HistoryEntry[];
  compensates: string;
  compensated_by: string[];
  /** The history chain's values before the first entry and after the last (Lookup, Reconcile). */
  history_base: string;
  history_head: string;
}

/** An agent run (ledger.v1.Run). */
export interface Run {
  run_id: string;
  state: string;
  limits?: { max_steps: number; deadline?: Time | null; max_repeats: number; max_irreversible: number } | null;
  steps: number;
  irreversible_steps: number;
  most_repeats: number;
  open_operations: number;
  started_at?: Time | null;
  deadline_at?: Time | null;
  ended_at?: Time | null;
  end_reason: string;
  implicit: boolean;
  started_by: string;
}

/** Milliseconds of a Timestamp or Duration (0 when unset). */
export const timeMs = (t: Time | null | undefined): number => (t ? Number(t.seconds || 0) * 1000 + (t.nanos || 0) / 1e6 : 0);
