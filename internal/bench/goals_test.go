package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestGoals(t *testing.T) {
	reserve := &Summary{Name: reserveName, RatioRPS: 0.31, CPU: CPU{Ledgerd: 60 * time.Microsecond, Redis: 38 * time.Microsecond}}
	cycle := &Summary{Name: cycleName, CPU: CPU{Redis: 44 * time.Microsecond}}
	bare := &Summary{Name: BareName, CPU: CPU{Ledgerd: 30 * time.Microsecond}}
	for _, c := range []struct {
		name string
		rep  *Report
		want []string // "<name>: met" or "<name>: not met", in order
	}{
		{"nothing measured", &Report{}, nil},
		{"memory only", &Report{Memory: &Memory{Records: 10, PerRecord: 377}},
			[]string{"bytes per SUCCEEDED record (100-byte result): met"}},
		{"memory over", &Report{Memory: &Memory{Records: 10, PerRecord: 407}},
			[]string{"bytes per SUCCEEDED record (100-byte result): not met"}},
		{"instructions", &Report{Instructions: &Instructions{Ledger: 317000, Peer: 473000, Ratio: 0.67}},
			[]string{"Redis instructions per cycle, the ledger's ÷ the peer's (callgrind): not met"}},
		{"instructions at the goal", &Report{Instructions: &Instructions{Ledger: 300, Peer: 500, Ratio: 0.6}},
			[]string{"Redis instructions per cycle, the ledger's ÷ the peer's (callgrind): met"}},
		{"instructions without the peer", &Report{Instructions: &Instructions{Ledger: 317000, Unavailable: "the peer: no go.mod"}}, nil},
		{"throughput without the bare server", &Report{Throughput: []*Summary{{Name: "health Check"}, reserve, cycle}}, []string{
			"Redis CPU per new-key Reserve: not met",
			"Redis CPU per Reserve+Complete cycle: met",
			"Reserve throughput ÷ health Check: not met",
		}},
		{"everything", &Report{Throughput: []*Summary{reserve, cycle, bare}, Memory: &Memory{Records: 1, PerRecord: 380}}, []string{
			"Redis CPU per new-key Reserve: not met",
			"Redis CPU per Reserve+Complete cycle: met",
			"ledgerd CPU per new-key Reserve ÷ the bare server's per call: not met",
			"Reserve throughput ÷ health Check: not met",
			"bytes per SUCCEEDED record (100-byte result): met",
		}},
	} {
		var got []string
		for _, g := range goals(c.rep) {
			v := "not met"
			if g.Met() {
				v = "met"
			}
			got = append(got, g.Name+": "+v)
		}
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s: goals\n%s\nwant\n%s", c.name, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
		var out bytes.Buffer
		(&Config{Out: &out}).printGoals(c.rep)
		if lines := strings.Count(out.String(), "(goal "); lines != len(c.want) {
			t.Errorf("%s: printed %d goals, want %d:\n%s", c.name, lines, len(c.want), out.String())
		}
	}
}
