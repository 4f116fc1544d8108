package server

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
)

// requestErrors collects the violations the gRPC edge finds before the
// ledger sees a request (values a proto can hold that JSON cannot).
type requestErrors []ledger.Violation

func (r *requestErrors) add(field, desc string) {
	*r = append(*r, ledger.Violation{Field: field, Description: desc})
}

func (r requestErrors) err() error {
	if len(r) == 0 {
		return nil
	}
	return &ledger.Error{Kind: ledger.KindInvalid, Violations: r}
}

// canonicalData returns Go values of a Struct as canonical JSON (nil for
// nil values).
func canonicalData(field string, m map[string]any, errs *requestErrors) []byte {
	if m == nil {
		return nil
	}
	b, err := fingerprint.Canonical(m)
	if err != nil {
		errs.add(field, err.Error())
		return nil
	}
	return b
}

// structMap converts a Struct to JSON-like Go values. Unlike
// structpb.Struct.AsMap, which turns NaN and infinities into the strings
// "NaN" and "Infinity" (so they would fingerprint like those strings), it
// refuses them, and values without a kind, naming the path, never the value:
// of several problems, the first in member name order, so that a request
// is refused in the same words every time.
func structMap(field string, s *structpb.Struct, errs *requestErrors) (map[string]any, bool) {
	var w structWalker
	m := w.object(s, 1)
	if w.bad != "" {
		// The walk above went in map order; the refusal goes by name.
		w = structWalker{sorted: true}
		w.object(s, 1)
		var path strings.Builder
		for i := len(w.path) - 1; i >= 0; i-- {
			path.WriteByte('/')
			if t := w.path[i]; t.index < 0 {
				path.WriteString(escapePointer(t.name))
			} else {
				path.WriteString(strconv.Itoa(t.index))
			}
		}
		errs.add(field, w.bad+" at "+strconv.Quote(path.String()))
		return nil, false
	}
	return m, true
}

// structWalker converts a Struct's values. After a refusal, each level on
// the way back up adds its member name or index to path, so that the
// refusal can name its place without every value paying for a path.
type structWalker struct {
	sorted bool        // walk a Struct's members in name order
	bad    string      // the first problem found, without its place
	path   []pathToken // its place, innermost first
}

// pathToken is a member name (index -1) or an index.
type pathToken struct {
	name  string
	index int
}

// object converts a Struct at the given level (the outermost object is level
// 1, as in fingerprint.Canonical).
func (w *structWalker) object(s *structpb.Struct, level int) map[string]any {
	fields := s.GetFields()
	m := make(map[string]any, len(fields))
	names := maps.Keys(fields)
	if w.sorted {
		names = slices.Values(slices.Sorted(names))
	}
	for k := range names {
		if m[k] = w.value(fields[k], level+1); w.bad != "" {
			w.path = append(w.path, pathToken{name: k, index: -1})
			return nil
		}
	}
	return m
}

func (w *structWalker) value(v *structpb.Value, level int) any {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NullValue:
		return nil
	case *structpb.Value_NumberValue:
		if math.IsNaN(k.NumberValue) || math.IsInf(k.NumberValue, 0) {
			w.bad = "number is NaN or infinite"
			return nil
		}
		return k.NumberValue
	case *structpb.Value_StringValue:
		return k.StringValue
	case *structpb.Value_BoolValue:
		return k.BoolValue
	case *structpb.Value_StructValue:
		if w.deep(level) {
			return nil
		}
		return w.object(k.StructValue, level)
	case *structpb.Value_ListValue:
		if w.deep(level) {
			return nil
		}
		l := make([]any, len(k.ListValue.GetValues()))
		for i, e := range k.ListValue.GetValues() {
			l[i] = w.value(e, level+1)
			if w.bad != "" {
				w.path = append(w.path, pathToken{index: i})
				return nil
			}
		}
		return l
	}
	w.bad = "value without a kind"
	return nil
}

// deep reports (and records) a container nested past the limit.
func (w *structWalker) deep(level int) bool {
	if level > fingerprint.MaxDepth {
		w.bad = "nested deeper than " + strconv.Itoa(fingerprint.MaxDepth) + " levels"
		return true
	}
	return false
}

// escapePointer escapes a member name as a JSON pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// fromResult converts the result of a request, msg (its data decoded, or
// kept encoded by unmarshalComplete); bad as keptStruct.
func fromResult(field string, r *ledgerv1.Result, msg string, errs *requestErrors) (*ledger.Result, string) {
	if r == nil {
		return nil, ""
	}
	values, bad := keptStruct(field+".data", r.GetData(), r, resultDataField, msg, errs)
	return &ledger.Result{Data: canonicalData(field+".data", values, errs), ResourceID: r.GetResourceId()}, bad
}

func fromFailure(f *ledgerv1.Failure) *ledger.Failure {
	if f == nil {
		return nil
	}
	return &ledger.Failure{Code: f.GetCode(), Message: f.GetMessage(), Detail: f.GetDetail()}
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// toProto converts a snapshot for the wire. The holder is never shown: it
// would let another caller take over the claim. The result's data is in
// the message as wire bytes only (an unknown field): it is for marshalling.
func toProto(o *ledger.Operation) *ledgerv1.Operation {
	if o == nil {
		return nil
	}
	p := &ledgerv1.Operation{
		OperationId:      o.ID,
		Tool:             o.Tool,
		Effect:           ledgerv1.Effect(o.Effect),
		State:            ledgerv1.State(o.State),
		Attempt:          o.Attempt,
		FencingToken:     o.FencingToken,
		ParamsSha256:     append([]byte(nil), o.Fingerprint[:]...),
		PermitId:         o.PermitID,
		RunId:            o.RunID,
		Step:             o.Step,
		Reason:           o.Reason,
		NeedsReview:      o.NeedsReview,
		Compensates:      o.Compensates,
		CompensatedBy:    o.CompensatedBy,
		CreatedAt:        timestamp(o.CreatedAt),
		UpdatedAt:        timestamp(o.UpdatedAt),
		LeaseExpiresAt:   timestamp(o.LeaseExpiresAt),
		UnknownSince:     timestamp(o.UnknownSince),
		RecoveryDeadline: timestamp(o.RecoveryDeadline),
		RetainUntil:      timestamp(o.RetainUntil),
		ExpiresAt:        timestamp(o.ExpiresAt),
		MaxAttempts:      o.MaxAttempts,
	}
	if o.Result != nil {
		p.Result = &ledgerv1.Result{ResourceId: o.Result.ResourceID}
		if len(o.Result.Data) > 0 {
			// The ledger stored canonical JSON it produced from a Struct;
			// its wire bytes go out as the data field, kept as an unknown
			// field, so that no Struct is built (appendResultData).
			buf := make([]byte, 0, len(o.Result.Data)+len(o.Result.Data)/4+16)
			if data, err := appendResultData(buf, o.Result.Data); err == nil {
				p.Result.ProtoReflect().SetUnknown(data)
			}
		}
	}
	if o.Failure != nil {
		p.Failure = &ledgerv1.Failure{Code: o.Failure.Code, Message: o.Failure.Message, Detail: o.Failure.Detail}
	}
	if o.History != nil {
		p.HistoryBase, p.HistoryHead = o.Chain()
	}
	for _, h := range o.History {
		p.History = append(p.History, &ledgerv1.HistoryEntry{
			Time:         timestamp(h.Time),
			FromState:    ledgerv1.State(h.From),
			ToState:      ledgerv1.State(h.To),
			Attempt:      h.Attempt,
			Principal:    h.Principal,
			Reason:       h.Reason,
			FencingToken: h.FencingToken,
			Detail:       h.Detail,
		})
	}
	return p
}
