// Package polyglot holds the tests that use the service the way people and
// other languages do, each against a ledgerd binary of its own on the
// embedded engine: the README's grpcurl walkthrough, run command by command
// as written and compared with the outputs it shows (also against a ledgerd
// on a redis-server of its own), and the Python and Node examples
// (examples/python, examples/node) through their generated or loaded stubs.
// Beside them, the checks of what the documentation says about the
// repository itself: the README's Layout table, and the tests the docs name
// as their evidence.
//
// `make test` installs what they need (the pinned grpcurl, Debian's
// python3-grpcio and jq, the examples' npm packages) and sets
// LEDGER_TEST_POLYGLOT=require, so that a missing tool fails the run; a plain
// `go test ./...` skips the tests whose tools are missing.
package polyglot
