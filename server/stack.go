package server

// growStack grows the calling goroutine's stack to 16 KiB, if it is
// smaller, while the stack is still shallow.
//
// grpc-go runs a call on one of StreamWorkers' goroutines, whose stack the
// garbage collector may have shrunk while it waited, or on a new goroutine
// when all are busy, which starts with a small stack (8 KiB, or the
// runtime's running average). A ledger call needs
// more than that by the time it is deep in the interceptors, the go-redis
// client and the codec, and growing the stack there copies it and adjusts
// every frame on it: about a tenth of ledgerd's CPU per Reserve
// (docs/benchmarks.md §6.5). Called first thing in each ledger handler,
// the same growth copies a few frames instead, once.
func growStack() {
	_ = stack9k()
}

// stack9k has a 9 KiB frame: calling it on an 8 KiB stack with a few KiB
// in use makes the runtime double the stack to 16 KiB before it runs (the
// frame plus what is in use fits in 16 KiB, so not to 32). It must not be
// inlined, and its array must be used, or the frame would shrink; it is
// zeroed on every call, which costs less than a microsecond.
//
//go:noinline
func stack9k() byte {
	var buf [9 << 10]byte
	for i := 0; i < len(buf); i += 4 << 10 {
		buf[i] = byte(i >> 12)
	}
	return buf[4<<10]
}
