package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestAppointment runs the seed exercise (contract.md S9) end to end: it fails
// unless exactly one appointment exists for the operation, every retry
// returned its id, the rewritten payload was refused and a new key booked a
// second appointment.
func TestAppointment(t *testing.T) {
	var out bytes.Buffer
	err := run(&out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "PASS:") {
		t.Fatal("the example did not report PASS")
	}
	if n := strings.Count(out.String(), "\n"); n > 40 {
		t.Errorf("the example printed %d lines; keep it under 40", n)
	}
}
