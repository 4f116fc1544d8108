// Package ledgertest holds what the tests of every package share: the test
// policy, a log buffer, the module's binaries, free ports, a certificate
// authority, and client interceptors that fake a failing ledger. It imports
// no package of the ledger, so the ledger's own tests can use it;
// servicetest runs a whole service.
package ledgertest
