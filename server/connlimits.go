package server

import (
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// The defaults of ConnectionLimits (docs/configuration.md §2 says why each).
const (
	// DefaultHandshakeTimeout bounds a new connection's TLS and HTTP/2
	// handshakes; grpc-go's own is 120s.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxConnectionIdle closes a connection without a call for that
	// long (grpc-go's own: never).
	DefaultMaxConnectionIdle = 5 * time.Minute
	// DefaultKeepaliveTime is how long a connection may be silent before the
	// server pings its peer (grpc-go's own: 2h).
	DefaultKeepaliveTime = time.Minute
	// DefaultKeepaliveTimeout is how long the server waits for the answer to
	// that ping before it closes the connection.
	DefaultKeepaliveTimeout = 20 * time.Second
	// DefaultMaxConcurrentStreams bounds the calls one connection has
	// running at once (grpc-go's own: no bound).
	DefaultMaxConcurrentStreams = 1000
	// DefaultMaxConnectionAge sends GOAWAY to a connection that has lived
	// that long, so that clients spread over instances added since they
	// connected (grpc-go's own: never).
	DefaultMaxConnectionAge = 30 * time.Minute
	// DefaultMaxConnectionAgeGrace is how long the calls running on a
	// connection at its age's GOAWAY may take to finish (grpc-go's own: no
	// bound).
	DefaultMaxConnectionAgeGrace = time.Minute
	// DefaultMaxConnections bounds the client connections one server holds
	// at once (grpc-go's own: no bound).
	DefaultMaxConnections = 10000
	// DefaultMaxHealthWatches bounds the health Watch streams one server
	// holds at once, over all its connections (grpc-go's own: no bound).
	DefaultMaxHealthWatches = 2000
)

// MaxHeaderListSize bounds the header list of one call, as HTTP/2 counts
// it (each field's name and value and 32 bytes): 16 KiB, room for an API
// key, W3C trace context and an 8 KiB baggage, twice gRPC's recommended
// least and far below grpc-go's own 16 MB. The server advertises it in its
// SETTINGS, so that a gRPC client refuses such a call itself; a stream
// whose headers are over it anyway is reset before any handler runs.
const MaxHeaderListSize = 16 << 10

// KeepaliveMinTime is the shortest interval between a client's keepalive
// pings that the server accepts, with or without calls running; a client
// that pings more often is sent GOAWAY ("too_many_pings"). grpc-go clients
// never ping more often than every 10s, whatever they are configured with;
// the clients this project ships send no keepalive pings.
const KeepaliveMinTime = 10 * time.Second

// ConnectionLimits bound the client connections: how many, what each may
// hold and for how long, and how many health watches they hold together. A
// zero field is its default
// (DefaultHandshakeTimeout and the others).
type ConnectionLimits struct {
	// HandshakeTimeout bounds a new connection's handshakes (TLS, then the
	// HTTP/2 preface and settings): a peer that has not finished them by
	// then is disconnected.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes, with GOAWAY, a connection that has had no
	// call running for that long. Clients reconnect on their next call.
	MaxConnectionIdle time.Duration
	// KeepaliveTime and KeepaliveTimeout find dead peers: after
	// KeepaliveTime without any frame from the peer, the server pings it,
	// and closes the connection if no answer comes within KeepaliveTimeout.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// MaxConcurrentStreams bounds the calls running at once on one
	// connection; the client holds further calls until one ends (they
	// wait, they do not fail).
	MaxConcurrentStreams uint32
	// MaxConnectionAge sends GOAWAY to a connection that has lived that
	// long (give or take 10%, so that clients that connected together do
	// not reconnect together): its client's new calls go over a new
	// connection, which behind a load balancer may reach another instance.
	// Negative: never.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long the calls running on a connection
	// at its GOAWAY may take to finish before it is closed, which cuts
	// those still running.
	MaxConnectionAgeGrace time.Duration
	// MaxConnections bounds the client connections open at once, counted
	// from their accept: a connection over it is closed as soon as it is
	// accepted, so that its client's attempt fails (UNAVAILABLE) instead of
	// waiting. Negative: no bound.
	MaxConnections int
	// MaxHealthWatches bounds the grpc.health.v1.Health/Watch streams
	// open at once, over every connection of the server: they need no
	// credentials, and each holds memory until its client ends it. A Watch
	// over it is answered RESOURCE_EXHAUSTED at once; Check is not
	// bounded. Negative: no bound.
	MaxHealthWatches int
}

// withDefaults returns l with each zero field set to its default.
func (l ConnectionLimits) withDefaults() ConnectionLimits {
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.MaxConnectionIdle <= 0 {
		l.MaxConnectionIdle = DefaultMaxConnectionIdle
	}
	if l.KeepaliveTime <= 0 {
		l.KeepaliveTime = DefaultKeepaliveTime
	}
	if l.KeepaliveTimeout <= 0 {
		l.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if l.MaxConnectionAge == 0 {
		l.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if l.MaxConnectionAgeGrace <= 0 {
		l.MaxConnectionAgeGrace = DefaultMaxConnectionAgeGrace
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxHealthWatches == 0 {
		l.MaxHealthWatches = DefaultMaxHealthWatches
	}
	return l
}

// counter returns the counter of a server's connections under l (with its
// defaults), which logs its refusals to log.
func (l ConnectionLimits) counter(log *slog.Logger) *connCounter {
	l = l.withDefaults()
	return &connCounter{max: int64(max(l.MaxConnections, 0)), userTimeout: l.KeepaliveTimeout, log: log,
		lines: logEvery{every: refusalLogEvery, now: time.Now}}
}

// watchGate returns the gate of a server's health Watch streams under l
// (with its defaults), which logs its refusals to log.
func (l ConnectionLimits) watchGate(log *slog.Logger) *watchGate {
	l = l.withDefaults()
	return &watchGate{max: int64(max(l.MaxHealthWatches, 0)), log: log, lines: logEvery{every: refusalLogEvery, now: time.Now}}
}

// serverOptions returns the grpc-go options that apply l (with its
// defaults).
func (l ConnectionLimits) serverOptions() []grpc.ServerOption {
	l = l.withDefaults()
	// grpc-go reads a zero MaxConnectionAge as never.
	age := max(l.MaxConnectionAge, 0)
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     l.MaxConnectionIdle,
			MaxConnectionAge:      age,
			MaxConnectionAgeGrace: l.MaxConnectionAgeGrace,
			Time:                  l.KeepaliveTime,
			Timeout:               l.KeepaliveTimeout,
		}),
		// Pings are allowed on an idle connection too: they do not keep it
		// from being closed after MaxConnectionIdle.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             KeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
	}
}
