package server

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/receipt"
)

// receiptOf signs a receipt of o when receipts are on and o is terminal or
// UNKNOWN; "" otherwise. It signs after the script returned, from what it
// returned; a failure to sign is logged and the answer goes out without.
// p is o as the answer carries it: its history head, when it has one, is
// signed as it is, not computed again.
func (h *handler) receiptOf(ctx context.Context, o *ledger.Operation, p *ledgerv1.Operation) string {
	if h.receipts == nil || o == nil || !(o.State.Terminal() || o.State == ledger.StateUnknown) {
		return ""
	}
	c := receipt.Claims{
		Tenant: h.principal(ctx).Tenant, OperationID: o.ID, Tool: o.Tool,
		ParamsSHA256: hex.EncodeToString(o.Fingerprint[:]), PermitID: o.PermitID,
		State: ledgerv1.State(o.State).String(), Attempt: o.Attempt,
		FencingToken: strconv.FormatUint(o.FencingToken, 10),
	}
	if c.HistoryHead = p.GetHistoryHead(); c.HistoryHead == "" {
		_, c.HistoryHead = o.Chain()
	}
	if o.Result != nil {
		sum, err := receipt.ResultSHA256(o.Result.Data, o.Result.ResourceID)
		if err != nil {
			h.receiptFailed(ctx, err)
			return ""
		}
		c.ResultSHA256, c.ResourceID = sum, o.Result.ResourceID
	}
	if o.Failure != nil && o.State == ledger.StateFailedFinal {
		c.FailureCode = o.Failure.Code
		if o.Failure.Detail != "" {
			c.FailureDetailSHA256 = receipt.FailureDetailSHA256(o.Failure.Detail)
		}
	}
	return h.sign(ctx, c)
}

// refusalReceipt signs the receipt of a Reserve refused with
// IDEMPOTENCY_KEY_REUSED onto its error, when receipts are on.
func (h *handler) refusalReceipt(ctx context.Context, req *ledgerv1.ReserveRequest, err error) {
	var e *ledger.Error
	if h.receipts == nil || !errors.As(err, &e) || e.Kind != ledger.KindKeyReused || e.Run != nil {
		return
	}
	e.Receipt = h.sign(ctx, receipt.Claims{
		Tenant: h.principal(ctx).Tenant, OperationID: req.GetOperationId(), Tool: req.GetTool(),
		ParamsSHA256: hex.EncodeToString(e.Fingerprint[:]), PermitID: req.GetPermitId(),
		Refused: ReasonKeyReused, Differs: strings.Join(e.Differs, ","),
	})
}

func (h *handler) sign(ctx context.Context, c receipt.Claims) string {
	jws, err := h.receipts.Sign(c)
	if err != nil {
		h.receiptFailed(ctx, err)
		return ""
	}
	return jws
}

func (h *handler) receiptFailed(ctx context.Context, err error) {
	h.log.ErrorContext(ctx, "receipt not signed", "error", err.Error())
}
