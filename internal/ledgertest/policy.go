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
//   - overdue.*, slow.*, patient.*: recovery windows of 1ms, 300ms, 1h.
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
`
