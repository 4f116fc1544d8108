// Package fingerprint computes what the operation ledger binds to an
// operation instead of its parameters: SHA-256 over the RFC 8785 (JSON
// Canonicalization Scheme) encoding of the consequential parameters.
//
// Canonical encodes JSON-like Go values (map[string]any, []any, string,
// float64, bool, nil; as structpb.Struct.AsMap produces them) exactly as
// RFC 8785 says, so a client in any language with a JCS implementation
// computes the same bytes. Compute hashes them, over every parameter or
// over the members that a policy's JSON pointers (RFC 6901) select.
// Values with no canonical form (NaN, infinities, invalid UTF-8, nesting
// deeper than MaxDepth) are refused with errors that name the JSON pointer
// of the element, never its value.
//
// The package has no dependencies beyond the standard library, so agent
// runtimes can compute params_sha256 themselves.
package fingerprint
