package ledger

import "context"

// compensation is the link a Reserve with Compensates made on the
// compensated record: nothing when added is false.
type compensation struct {
	keys  opKeys
	id    string // the compensation's operation id
	added bool   // this call made the link
}

// linkCompensation links req.OperationID to the operation it compensates,
// before the compensation is reserved, so the compensated record never
// lacks a compensation that exists. It refuses (KindNotCompensable) when
// that operation is not SUCCEEDED, has no record or has MaxCompensations.
func (l *Ledger) linkCompensation(ctx context.Context, op string, who Principal, req ReserveRequest) (compensation, error) {
	if req.Compensates == "" {
		return compensation{}, nil
	}
	k := l.keys.op(who.Tenant, req.Compensates)
	code, aux, rec, _, err := l.run(ctx, op, compensateScript, k, who.ID, req.OperationID, "+")
	if err != nil {
		return compensation{}, err
	}
	e := &Error{Op: op, Kind: KindNotCompensable}
	switch code {
	case codeOK:
		return compensation{keys: k, id: req.OperationID, added: aux == "1"}, nil
	case codeNotFound:
		e.Cause = "not_found"
	case codeExpired:
		e.Cause, e.State = "expired", parseState(aux)
	case codeNotCompensable:
		e.Cause, e.State = "not_succeeded", rec.op.State
		if aux == "limit" {
			e.Cause = "limit"
		}
	default:
		return compensation{}, l.codeError(op, who.Tenant, req.Compensates, code, aux, rec)
	}
	l.emit(Event{Type: EventRefused, Op: "Reserve", Tenant: who.Tenant, Tool: req.Tool, ErrKind: e.Kind})
	return compensation{}, e
}

// unlinkCompensation takes back the link c made when the Reserve that made
// it was refused and so created no compensation. A failure leaves the link
// (a link to an operation that may not exist, never a missing one).
func (l *Ledger) unlinkCompensation(ctx context.Context, c compensation, err error) {
	if !c.added || err == nil {
		return
	}
	switch KindOf(err) {
	case KindKeyReused, KindKeyExpired, KindQuotaExceeded, KindRunEnded:
		_, _, _, _, _ = l.run(ctx, "ledger.Reserve", compensateScript, c.keys, "ledger", c.id, "-")
	}
}
