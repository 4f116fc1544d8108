package server

import (
	"strconv"
	"strings"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the proto codec
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// failureField is the field number under which requestCodec marks a request
// it could not decode (the largest field number protobuf allows; no ledger
// message uses it).
const failureField protowire.Number = protowire.MaxValidNumber

// requestCodec is the service's codec: protobuf, except that a ledger.v1
// request that cannot be decoded (invalid UTF-8 in a string field, malformed
// wire data, more than limit bytes) does not fail the transport. grpc-go
// would answer INTERNAL (or RESOURCE_EXHAUSTED) at once, without the
// contract's ErrorInfo; instead the message is left empty with a mark in its
// unknown fields, and decodeErrors answers INVALID_ARGUMENT.
type requestCodec struct {
	base  encoding.CodecV2
	limit int
}

func newRequestCodec(limit int) *requestCodec {
	return &requestCodec{base: encoding.GetCodecV2("proto"), limit: limit}
}

func (c *requestCodec) Name() string { return "proto" }

func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok || !strings.HasPrefix(string(m.ProtoReflect().Descriptor().FullName()), "ledger.v1.") {
		return c.base.Unmarshal(data, v)
	}
	if data.Len() > c.limit {
		markFailure(m, "larger than the request size limit of "+strconv.Itoa(c.limit)+" bytes")
		return nil
	}
	if err := c.decode(data, m); err != nil {
		markFailure(m, decodeDesc(err, string(m.ProtoReflect().Descriptor().FullName())))
	}
	return nil
}

// decode decodes data into m; a Reserve's params and a Complete's result
// data it leaves encoded (unmarshalReserve, unmarshalComplete).
func (c *requestCodec) decode(data mem.BufferSlice, m proto.Message) error {
	switch req := m.(type) {
	case *ledgerv1.ReserveRequest:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		return unmarshalReserve(buf.ReadOnlyData(), req)
	case *ledgerv1.CompleteRequest:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		return unmarshalComplete(buf.ReadOnlyData(), req)
	}
	return c.base.Unmarshal(data, m)
}

// decodeDesc describes a decoding error of the message type name.
func decodeDesc(err error, name string) string {
	if strings.Contains(err.Error(), "invalid UTF-8") {
		return "a string field is not valid UTF-8"
	}
	return "not a valid " + name + " message"
}

func markFailure(m proto.Message, desc string) {
	proto.Reset(m)
	b := protowire.AppendTag(nil, failureField, protowire.BytesType)
	m.ProtoReflect().SetUnknown(protowire.AppendString(b, desc))
}

// decodeFailure returns the mark markFailure left, if any.
func decodeFailure(m proto.Message) string {
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == failureField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return "not a valid request message"
			}
			return string(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}
