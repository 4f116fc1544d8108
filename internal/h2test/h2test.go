// Package h2test holds what the tests that speak raw HTTP/2 to a server
// share: the client preface and a frame reader (RFC 9113). Those tests play
// peers no gRPC client would be (one that stops halfway through the
// preface, one that never answers a ping) and read what the server sends
// them frame by frame.
package h2test

import "io"

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
