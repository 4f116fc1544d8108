// Package faults is the fault suite of the ledger: it runs the service under
// the faults real deployments see (Redis and ledgerd killed, network faults,
// SCRIPT FLUSH, Sentinel and Cluster failovers, resharding, several
// instances) and checks that nothing is applied twice and no acknowledged
// record is lost.
//
// Every test drives the service with client.Do against a fake destination
// that is not idempotent and counts its effects, and checks the history of
// every call for linearizability against a model of the contract
// (model_test.go). docs/failure-model.md has what each test does, the
// figures and what they mean. LEDGER_TEST_FAULTS=long runs the long form.
package faults
