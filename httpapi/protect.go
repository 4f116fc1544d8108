package httpapi

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// Protect wraps h. When anonymous (no credentials file: every caller on
// loopback has every scope), it refuses with 403 PERMISSION_DENIED two
// kinds of request that a page of another site can make the operator's
// browser send:
//   - one that reached a loopback listener under a Host that is not
//     loopback: the page's own name, rebound to 127.0.0.1, so that the
//     browser would let it read the answers (DNS rebinding);
//   - a write that a page of another origin sent (net/http's
//     CrossOriginProtection, which passes GET, HEAD and OPTIONS and every
//     request no browser sent).
//
// With credentials it returns h as it is: a browser never sends a key on
// its own, and a proxy in front may pass its own Host on.
func Protect(h http.Handler, anonymous bool) http.Handler {
	if !anonymous {
		return h
	}
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		msg := ""
		if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && isLoopback(local.String()) && !isLoopback(r.Host) {
			msg = "the Host header names no loopback host, on a loopback listener: use 127.0.0.1, [::1] or localhost"
		} else if cop.Check(r) != nil {
			msg = "a write sent by a page of another origin, to a ledger without credentials"
		}
		if msg == "" {
			h.ServeHTTP(w, r)
			return
		}
		refuse(w, msg)
	})
}

// refuse answers 403 with a PERMISSION_DENIED status as JSON, as the API
// answers its other errors.
func refuse(w http.ResponseWriter, msg string) {
	b, _ := protojson.Marshal(withErrorInfo(status.New(codes.PermissionDenied, msg)).Proto())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write(b)
}

// isLoopback reports whether addr (host, or host:port) is localhost or a
// loopback IP.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
