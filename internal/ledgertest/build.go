package ledgertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// raceEnabled is set when this binary is built with -race (race.go).
var raceEnabled bool

var (
	buildOnce  sync.Once
	ledgerdBin string
	buildErr   error
)

// LedgerdBinary builds cmd/ledgerd into dir once per test binary and returns
// its path: with -race when the tests run with it, so the build cache is
// shared with the rest of the suite and ledgerd reports its own races.
func LedgerdBinary(tb testing.TB, dir string) string {
	tb.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		mod := strings.TrimSpace(string(out))
		if err != nil || mod == "" || mod == os.DevNull {
			buildErr = fmt.Errorf("go env GOMOD: not in the module (%v)", err)
			return
		}
		ledgerdBin = filepath.Join(dir, "ledgerd")
		args := []string{"build"}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "-o", ledgerdBin, "./cmd/ledgerd")
		cmd := exec.Command("go", args...)
		cmd.Dir = filepath.Dir(mod)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return ledgerdBin
}
