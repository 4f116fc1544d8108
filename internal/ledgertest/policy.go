package ledgertest

// Policy is the policy document of the tests: a tool's name says what its
// test needs, and means the same in every package. Other tools have the
// defaults, with at most 3 attempts.
//
//   - expiring.*: a 200ms lease, for a claim whose lease must run out
//     (expiring.idempotent: idempotent too);
//   - leased.*, renewed.*: 1s and 4s leases, for claims that must last
//     while they are renewed;
//   - churn.*: a 300ms lease, for bursts of claims that renew them;
//   - retried.*: 100 attempts;
//   - idempotent.*: idempotent;
//   - brief.*: retention 1s, no grace, tombstone 2s;
//   - compact.*: retention 1s, no grace, tombstone 1h (compact.fields:
//     consequential /amount);
//   - fields.*, picky.*: consequential fields /amount and /currency, and
//     /charge_id too (docs/configuration.md's worked example);
//   - overdue.*, slow.*, patient.*: recovery windows of 1ms, 300ms, 1h;
//   - once.*: a run may call it once with the same parameters.
//
// Runs: a tenant named implicit-* has its runs governed without StartRun
// (5 steps, a 1m deadline, 2 repeats); capped-* may start runs of at most
// 20 steps and a 1h deadline; other tenants' runs have no limits but
// their own.
const Policy = `
defaults:
  max_attempts: 3
tools:
  - match: "expiring.idempotent"
    effect: idempotent
    lease: 200ms
  - match: "expiring.*"
    lease: 200ms
  - match: "leased.*"
    lease: 1s
  - match: "renewed.*"
    lease: 4s
  - match: "churn.*"
    lease: 300ms
  - match: "retried.*"
    max_attempts: 100
  - match: "idempotent.*"
    effect: idempotent
  - match: "brief.*"
    retention: 1s
    retain_grace: 0s
    tombstone_retention: 2s
  - match: "compact.fields"
    retention: 1s
    retain_grace: 0s
    tombstone_retention: 1h
    consequential_fields: ["/amount"]
  - match: "compact.*"
    retention: 1s
    retain_grace: 0s
    tombstone_retention: 1h
  - match: "fields.*"
    consequential_fields: ["/amount", "/currency"]
  - match: "picky.*"
    consequential_fields: ["/amount", "/currency", "/charge_id"]
  - match: "overdue.*"
    recovery_window: 1ms
  - match: "slow.*"
    recovery_window: 300ms
  - match: "patient.*"
    recovery_window: 1h
  - match: "once.*"
    run_max_repeats: 1
runs:
  - tenant: "implicit-*"
    max_steps: 5
    deadline: 1m
    max_repeats: 2
    implicit: true
  - tenant: "capped-*"
    max_steps: 20
    deadline: 1h
`
