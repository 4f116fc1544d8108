package server_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/opledger/ledger/internal/redistest"
)

// TestWireNamesOfTheContract: the names contract.md §3 marks (wire), as a client
// with no proto files sees them through the service's reflection: the
// package and service, the RPCs, the fields with their types, and the enum
// values with their zero values.
func TestWireNamesOfTheContract(t *testing.T) {
	e := startEnv(t, redistest.Shared(t).Client(t))
	stream, err := grpc_reflection_v1.NewServerReflectionClient(e.conn).ServerReflectionInfo(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.CloseSend() }()
	if err := stream.Send(&grpc_reflection_v1.ServerReflectionRequest{
		MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "ledger.v1.LedgerService"},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var file *descriptorpb.FileDescriptorProto
	for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatal(err)
		}
		if fd.GetPackage() == "ledger.v1" && len(fd.GetService()) > 0 {
			file = fd
		}
	}
	if file == nil {
		t.Fatal("reflection gave no file of package ledger.v1 with a service")
	}

	var methods []string
	for _, s := range file.GetService() {
		if s.GetName() == "LedgerService" {
			for _, m := range s.GetMethod() {
				methods = append(methods, m.GetName())
			}
		}
	}
	for _, m := range []string{"Reserve", "Complete", "MarkUnknown", "Lookup", "Reconcile", "Renew", "ListUnresolved"} {
		if !slices.Contains(methods, m) {
			t.Errorf("ledger.v1.LedgerService has no RPC %s (it has %v)", m, methods)
		}
	}

	messages := map[string]*descriptorpb.DescriptorProto{}
	for _, m := range file.GetMessageType() {
		messages[m.GetName()] = m
	}
	// field names a field of message, with its type: a scalar's
	// descriptorpb type, or the full name of a message or enum.
	type field struct{ message, name, typ string }
	scalar := func(ty descriptorpb.FieldDescriptorProto_Type) string { return ty.String() }
	for _, f := range []field{
		{"ReserveRequest", "operation_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReserveRequest", "tool", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReserveRequest", "params", ".google.protobuf.Struct"},
		{"ReserveRequest", "params_sha256", scalar(descriptorpb.FieldDescriptorProto_TYPE_BYTES)},
		{"ReserveRequest", "effect", ".ledger.v1.Effect"},
		{"ReserveRequest", "permit_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReserveRequest", "holder", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReserveRequest", "run_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReserveRequest", "step", scalar(descriptorpb.FieldDescriptorProto_TYPE_UINT32)},
		{"ReserveRequest", "retain_until", ".google.protobuf.Timestamp"},
		{"ReserveResponse", "decision", ".ledger.v1.Decision"},
		{"ReserveResponse", "operation", ".ledger.v1.Operation"},
		{"ReserveResponse", "retry_after", ".google.protobuf.Duration"},
		{"CompleteRequest", "operation_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"CompleteRequest", "fencing_token", scalar(descriptorpb.FieldDescriptorProto_TYPE_UINT64)},
		{"CompleteRequest", "result", ".ledger.v1.Result"},
		{"MarkUnknownRequest", "fencing_token", scalar(descriptorpb.FieldDescriptorProto_TYPE_UINT64)},
		{"RenewRequest", "fencing_token", scalar(descriptorpb.FieldDescriptorProto_TYPE_UINT64)},
		{"LookupRequest", "operation_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReconcileRequest", "operation_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"ReconcileRequest", "result", ".ledger.v1.Result"},
		{"Result", "data", ".google.protobuf.Struct"},
		{"Result", "resource_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"Operation", "operation_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"Operation", "tool", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"Operation", "effect", ".ledger.v1.Effect"},
		{"Operation", "state", ".ledger.v1.State"},
		{"Operation", "attempt", scalar(descriptorpb.FieldDescriptorProto_TYPE_UINT32)},
		{"Operation", "fencing_token", scalar(descriptorpb.FieldDescriptorProto_TYPE_UINT64)},
		{"Operation", "result", ".ledger.v1.Result"},
		{"Operation", "history", ".ledger.v1.HistoryEntry"},
		{"Operation", "permit_id", scalar(descriptorpb.FieldDescriptorProto_TYPE_STRING)},
		{"Operation", "retain_until", ".google.protobuf.Timestamp"},
		{"LookupResponse", "operation", ".ledger.v1.Operation"},
	} {
		m := messages[f.message]
		if m == nil {
			t.Errorf("no message %s", f.message)
			continue
		}
		i := slices.IndexFunc(m.GetField(), func(d *descriptorpb.FieldDescriptorProto) bool { return d.GetName() == f.name })
		if i < 0 {
			t.Errorf("%s has no field %s", f.message, f.name)
			continue
		}
		d := m.GetField()[i]
		got := d.GetTypeName()
		if got == "" {
			got = d.GetType().String()
		}
		if got != f.typ {
			t.Errorf("%s.%s is %s, want %s", f.message, f.name, got, f.typ)
		}
	}
	if h := messages["Operation"].GetField(); !slices.ContainsFunc(h, func(d *descriptorpb.FieldDescriptorProto) bool {
		return d.GetName() == "history" && d.GetLabel() == descriptorpb.FieldDescriptorProto_LABEL_REPEATED
	}) {
		t.Error("Operation.history is not repeated")
	}

	enums := map[string]map[string]int32{}
	for _, en := range file.GetEnumType() {
		enums[en.GetName()] = map[string]int32{}
		for _, v := range en.GetValue() {
			enums[en.GetName()][v.GetName()] = v.GetNumber()
		}
	}
	for name, values := range map[string][]string{
		"State":    {"STATE_UNSPECIFIED", "STATE_PENDING", "STATE_RUNNING", "STATE_SUCCEEDED", "STATE_FAILED_FINAL", "STATE_UNKNOWN"},
		"Decision": {"DECISION_UNSPECIFIED", "DECISION_EXECUTE", "DECISION_REPLAY", "DECISION_IN_PROGRESS", "DECISION_RECONCILE"},
		"Effect":   {"EFFECT_UNSPECIFIED", "EFFECT_READ_ONLY", "EFFECT_IDEMPOTENT", "EFFECT_IRREVERSIBLE"},
	} {
		for i, v := range values {
			n, ok := enums[name][v]
			if !ok {
				t.Errorf("enum %s has no value %s", name, v)
			}
			if i == 0 && n != 0 {
				t.Errorf("%s's zero value is not %s", name, v)
			}
		}
	}
}
