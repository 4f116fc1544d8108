// Package h2test holds what the tests that speak raw HTTP/2 to a server
// share: the client preface and a frame reader (RFC 9113). Those tests play
// peers no gRPC client would be (one that stops halfway through the
// preface, one that never answers a ping) and read what the server sends
// them frame by frame.
package h2test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// Preface is the HTTP/2 client connection preface, then an empty SETTINGS
// frame.
const Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// HTTP/2 frame types, flags and settings (RFC 9113 §6) the tests read.
const (
	FrameSettings               = 0x4
	FramePing                   = 0x6
	FrameGoAway                 = 0x7
	FlagAck                     = 0x1
	SettingMaxConcurrentStreams = 0x3
)

// ReadFrame reads one HTTP/2 frame (RFC 9113 §4.1) from r and returns its
// type, flags and payload.
func ReadFrame(r io.Reader) (typ, flags byte, payload []byte, err error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	payload = make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, 0, nil, err
	}
	return h[3], h[4], payload, nil
}

// Open dials addr, sends the preface and gives the connection a read
// deadline of wait from now: a peer that has finished its part of the
// handshake and from then on only reads.
func Open(addr string, wait time.Duration) (net.Conn, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte(Preface)); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	return conn, nil
}

// MaxConcurrentStreams opens a connection to addr and returns the
// SETTINGS_MAX_CONCURRENT_STREAMS of the server's first SETTINGS frame, and
// whether it has one.
func MaxConcurrentStreams(addr string, wait time.Duration) (uint32, bool, error) {
	conn, err := Open(addr, wait)
	if err != nil {
		return 0, false, err
	}
	defer conn.Close()
	for {
		typ, flags, payload, err := ReadFrame(conn)
		if err != nil {
			return 0, false, fmt.Errorf("no SETTINGS from the server: %w", err)
		}
		if typ != FrameSettings || flags&FlagAck != 0 {
			continue
		}
		for p := payload; len(p) >= 6; p = p[6:] {
			if binary.BigEndian.Uint16(p) == SettingMaxConcurrentStreams {
				return binary.BigEndian.Uint32(p[2:]), true, nil
			}
		}
		return 0, false, nil
	}
}

// GoAwayDebug reads conn until the server sends GOAWAY and returns its debug
// data (after the last stream id and the error code); an error when the
// connection ends or its read deadline passes first.
func GoAwayDebug(conn net.Conn) (string, error) {
	for {
		typ, _, payload, err := ReadFrame(conn)
		if err != nil {
			return "", fmt.Errorf("no GOAWAY: %w", err)
		}
		if typ == FrameGoAway {
			if len(payload) < 8 {
				return "", fmt.Errorf("GOAWAY of %d bytes", len(payload))
			}
			return string(payload[8:]), nil
		}
	}
}

// ReadUntilClosed reads conn, answering nothing, until the server closes
// it, and tells whether the server pinged it and sent GOAWAY meanwhile. The
// error is os.ErrDeadlineExceeded when the read deadline passed first.
func ReadUntilClosed(conn net.Conn) (pinged, goAway bool, err error) {
	for {
		typ, flags, _, err := ReadFrame(conn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return pinged, goAway, err
		}
		if err != nil {
			return pinged, goAway, nil // closed
		}
		switch {
		case typ == FrameGoAway:
			goAway = true
		case typ == FramePing && flags&FlagAck == 0:
			pinged = true
		}
	}
}
