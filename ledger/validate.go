package ledger

import (
	"encoding/json"
	"time"
	"unicode"
	"unicode/utf8"
)

// Size limits on every input field, in bytes. Requests over them are refused
// with KindInvalid and change nothing.
const (
	MaxOperationIDLen = 256
	MaxToolLen        = 128
	MaxPermitIDLen    = 256
	MaxHolderLen      = 128
	MaxRunIDLen       = 256
	MaxResourceIDLen  = 256
	MaxResultDataLen  = 64 << 10
	MaxFailureCodeLen = 128
	MaxFailureMsgLen  = 1024
	MaxFailureDetail  = MaxResultDataLen
	MaxNoteLen        = 256
	MaxTenantLen      = 128
	MaxPrincipalLen   = 256
	// MaxRetainUntil is how far ahead retain_until may be.
	MaxRetainUntil = 10 * 365 * 24 * time.Hour
)

// checkID validates an identifier: 1..max bytes of valid UTF-8 without
// control characters. Any other character ({, }, :, *, spaces, ...) is
// allowed: keys encode it (see keyspace).
func checkID(field, s string, max int, required bool) *Violation {
	switch {
	case s == "" && required:
		return &Violation{field, "required"}
	case len(s) > max:
		return &Violation{field, "longer than " + itoa(int64(max)) + " bytes"}
	case !utf8.ValidString(s):
		return &Violation{field, "not valid UTF-8"}
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return &Violation{field, "contains a control character"}
		}
	}
	return nil
}

// checkTool validates a tool name: 1..MaxToolLen bytes of ASCII letters,
// digits and . _ - : /
func checkTool(field, s string, required bool) *Violation {
	if s == "" {
		if required {
			return &Violation{field, "required"}
		}
		return nil
	}
	if len(s) > MaxToolLen {
		return &Violation{field, "longer than " + itoa(MaxToolLen) + " bytes"}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(unreserved(c) && c != '~' || c == ':' || c == '/') {
			return &Violation{field, "may only hold letters, digits and . _ - : /"}
		}
	}
	return nil
}

// checkText validates free text (notes, messages): valid UTF-8 up to max
// bytes.
func checkText(field, s string, max int) *Violation {
	switch {
	case len(s) > max:
		return &Violation{field, "longer than " + itoa(int64(max)) + " bytes"}
	case !utf8.ValidString(s):
		return &Violation{field, "not valid UTF-8"}
	}
	return nil
}

// violations collects the non-nil violations.
func violations(vs ...*Violation) []Violation {
	var out []Violation
	for _, v := range vs {
		if v != nil {
			out = append(out, *v)
		}
	}
	return out
}

func checkPrincipal(p Principal) []Violation {
	return violations(
		checkID("tenant", p.Tenant, MaxTenantLen, true),
		checkText("principal", p.ID, MaxPrincipalLen),
	)
}

func checkResult(prefix string, r *Result) []Violation {
	if r == nil {
		return nil
	}
	var vs []Violation
	if len(r.Data) > MaxResultDataLen {
		vs = append(vs, Violation{prefix + ".data", "larger than " + itoa(MaxResultDataLen) + " bytes as JSON"})
	} else if len(r.Data) > 0 && (r.Data[0] != '{' || !json.Valid(r.Data)) {
		vs = append(vs, Violation{prefix + ".data", "not a JSON object"})
	} else if !utf8.Valid(r.Data) {
		// JSON text is UTF-8 (RFC 8259), and the stored record relies on
		// it (record.go).
		vs = append(vs, Violation{prefix + ".data", "not valid UTF-8"})
	}
	if v := checkID(prefix+".resource_id", r.ResourceID, MaxResourceIDLen, false); v != nil {
		vs = append(vs, *v)
	}
	return vs
}

func checkFailure(prefix string, f *Failure) []Violation {
	if f == nil {
		return nil
	}
	return violations(
		checkID(prefix+".code", f.Code, MaxFailureCodeLen, false),
		checkText(prefix+".message", f.Message, MaxFailureMsgLen),
		checkText(prefix+".detail", f.Detail, MaxFailureDetail),
	)
}

// ValidateTenant reports whether s is acceptable as a tenant name (the rules
// of an identifier, at most MaxTenantLen bytes), as a *Error of KindInvalid,
// or nil.
func ValidateTenant(s string) error {
	if v := checkID("tenant", s, MaxTenantLen, true); v != nil {
		return invalid("", *v)
	}
	return nil
}

// ValidateResourceID reports whether id is acceptable as a result's
// resource id (empty, or an identifier of at most MaxResourceIDLen bytes),
// as a *Error of KindInvalid, or nil.
func ValidateResourceID(id string) error {
	if v := checkID("resource_id", id, MaxResourceIDLen, false); v != nil {
		return invalid("", *v)
	}
	return nil
}

// ValidateRunID reports whether id is acceptable as a run id, as a *Error
// of KindInvalid, or nil.
func ValidateRunID(id string) error {
	if v := checkID("run_id", id, MaxRunIDLen, true); v != nil {
		return invalid("", *v)
	}
	return nil
}

// ValidateTool reports whether name is acceptable as a tool name, as a
// *Error of KindInvalid, or nil.
func ValidateTool(name string) error {
	if v := checkTool("tool", name, true); v != nil {
		return invalid("", *v)
	}
	return nil
}

// ValidateOperationID reports whether id is acceptable as an operation id,
// as a *Error of KindInvalid, or nil.
func ValidateOperationID(id string) error {
	if v := checkID("operation_id", id, MaxOperationIDLen, true); v != nil {
		return invalid("", *v)
	}
	return nil
}
