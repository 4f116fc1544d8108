package polyglot

import (
	"strings"
	"testing"
)

// A README in the shape of the real one, and what a service answers to it:
// the checker's own test, with no ledgerd and no grpcurl.
const fakeReadme = "# x\n\n## Quick start with grpcurl\n\nText.\n\n```console\n" +
	"$ grpcurl -plaintext 127.0.0.1:50051 list\n" +
	"a.v1.A\n" +
	"b.v1.B\n" +
	"```\n\n```console\n" +
	"$ grpcurl -plaintext -d '{\"operation_id\":\"op-1\",\n" +
	"    \"params\":{\"n\":2}}' \\\n" +
	"    127.0.0.1:50051 ledger.v1.LedgerService/Reserve\n" +
	"{\n" +
	"  \"decision\": \"DECISION_EXECUTE\",\n" +
	"  \"operation\": {\n" +
	"    \"fencingToken\": \"100\",\n" +
	"    \"createdAt\": \"2026-11-30T00:23:39.280Z\",\n" +
	"    \"maxAttempts\": 5\n" +
	"  }\n" +
	"}\n" +
	"```\n\n```console\n" +
	"$ grpcurl -plaintext -d '{\"operation_id\":\"op-1\",\"fencing_token\":\"'\"$(jq -r .operation.fencingToken reserve.json)\"'\"}' \\\n" +
	"    127.0.0.1:50051 ledger.v1.LedgerService/Complete\n" +
	"{\n" +
	"  \"operation\": {\n" +
	"    \"fencingToken\": \"100\",\n" +
	"    \"history\": [{\"fencingToken\": \"100\", \"time\": \"2026-11-30T00:23:39.280Z\"}]\n" +
	"  }\n" +
	"}\n" +
	"$ grpcurl -plaintext -d '{\"operation_id\":\"op-1\"}' 127.0.0.1:50051 ledger.v1.LedgerService/Reserve\n" +
	"ERROR:\n" +
	"  Code: FailedPrecondition\n" +
	"  Message: the operation_id is bound to another request (params differ)\n" +
	"  Details:\n" +
	"  1)\t{\n" +
	"    \t  \"@type\": \"type.googleapis.com/google.rpc.ErrorInfo\",\n" +
	"    \t  \"metadata\": {\n" +
	"    \t    \"differs\": \"params\"\n" +
	"    \t  },\n" +
	"    \t  \"reason\": \"IDEMPOTENCY_KEY_REUSED\"\n" +
	"    \t}\n" +
	"```\n\n" +
	"Health: `grpcurl -plaintext -d '{\"service\":\"ledger.v1.LedgerService\"}' 127.0.0.1:50051 grpc.health.v1.Health/Check`\n" +
	"answers `{\"status\": \"SERVING\"}`. To see more: `grpcurl -plaintext -d '{}' 127.0.0.1:50051 ledger.v1.LedgerService/ListUnresolved`.\n\n" +
	"## Next\n\n```console\n$ grpcurl never-run\n```\n"

func fakeAnswers() []answer {
	return []answer{
		{stdout: "a.v1.A\nb.v1.B\n"},
		{stdout: `{"decision": "DECISION_EXECUTE", "operation": {"fencingToken": "777", "createdAt": "2027-01-01T10:00:00.001Z", "maxAttempts": 5}}`},
		{stdout: `{"operation": {"fencingToken": "777", "history": [{"fencingToken": "777", "time": "2027-01-01T10:00:00.001Z"}]}}`},
		{err: errExit, stderr: "ERROR:\n  Code: FailedPrecondition\n  Message: the operation_id is bound to another request (params differ)\n  Details:\n  1)\t{\n    \t  \"@type\": \"type.googleapis.com/google.rpc.ErrorInfo\",\n    \t  \"metadata\": {\n    \t    \"differs\": \"params\"\n    \t  },\n    \t  \"reason\": \"IDEMPOTENCY_KEY_REUSED\"\n    \t}\n"},
		{stdout: "{\n  \"status\": \"SERVING\"\n}\n"},
		{stdout: "{}\n"},
	}
}

type exitError struct{}

func (exitError) Error() string { return "exit status 73" }

var errExit error = exitError{}

func TestWalkthroughParser(t *testing.T) {
	steps, err := parseWalkthrough("README.md", fakeReadme, walkthroughSection)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 6 {
		t.Fatalf("%d steps, want 6: %+v", len(steps), steps)
	}
	if want := "grpcurl -plaintext -d '{\"operation_id\":\"op-1\",\n    \"params\":{\"n\":2}}' \\\n    127.0.0.1:50051 ledger.v1.LedgerService/Reserve"; steps[1].command != want {
		t.Errorf("multi-line command:\n%s\nwant\n%s", steps[1].command, want)
	}
	if steps[4].expected != `{"status": "SERVING"}` || !steps[4].hasOut {
		t.Errorf("inline command's output: %+v", steps[4])
	}
	if steps[5].hasOut || !strings.HasSuffix(steps[5].command, "ListUnresolved") {
		t.Errorf("inline command without output: %+v", steps[5])
	}
	for _, s := range steps {
		if strings.Contains(s.command, "never-run") {
			t.Errorf("a command outside the section was taken: %+v", s)
		}
	}
}

func TestWalkthroughCheckerAcceptsTheTruth(t *testing.T) {
	steps, err := parseWalkthrough("README.md", fakeReadme, walkthroughSection)
	if err != nil {
		t.Fatal(err)
	}
	w := &walk{t: t, addr: "127.0.0.1:6000", bound: map[string]string{}}
	answers := fakeAnswers()
	for i, s := range steps {
		// The command is the README's, with this run's address.
		if cmd := w.command(s); cmd != strings.ReplaceAll(s.command, readmeAddr, "127.0.0.1:6000") {
			t.Errorf("step %d: the command is not the README's with this run's address:\n%s", i, cmd)
		}
		w.check(s, answers[i])
	}
	for _, p := range w.problems {
		t.Error(p)
	}
}

func TestWalkthroughCheckerCatchesLies(t *testing.T) {
	steps, err := parseWalkthrough("README.md", fakeReadme, walkthroughSection)
	if err != nil {
		t.Fatal(err)
	}
	for _, lie := range []struct {
		name     string
		step     int
		old, new string
		problem  string
	}{
		{"a value", 1, `"maxAttempts": 5`, `"maxAttempts": 6`, "README shows 6, the service answered 5"},
		{"a missing field", 1, `"maxAttempts": 5`, `"x": 5`, "/operation/maxAttempts: the service answers it (5), README does not show it"},
		{"an extra field", 1, `"maxAttempts": 5`, `"maxAttempts": 5, "needsReview": true`, "/operation/needsReview: README shows it, the service does not answer it"},
		{"another token later", 2, `[{"fencingToken": "100"`, `[{"fencingToken": "101"`, "the README shows 101 here"},
		{"a timestamp", 1, `"createdAt": "2026`, `"createdAt": "yesterday`, "the README's value is not a timestamp"},
		{"a listing", 0, "b.v1.B", "b.v1.C", "lines differ"},
		{"an error detail", 3, `"differs": "params"`, `"differs": "tool"`, "README shows tool, the service answered params"},
		{"an error message", 3, "(params differ)", "(tool differs)", "Message: README shows"},
		{"an error code", 3, "FailedPrecondition", "NotFound", "Code: README shows NotFound"},
		{"an error shown as a success", 3, "ERROR:", "", "grpcurl failed"},
		{"a success shown as an error", 1, "{\n  \"decision\"", "ERROR:\n{\n  \"decision\"", "the README shows an error, grpcurl succeeded"},
		{"an inline answer", 4, "SERVING", "NOT_SERVING", "README shows NOT_SERVING, the service answered SERVING"},
	} {
		changed := append([]step(nil), steps...)
		s := &changed[lie.step]
		if !strings.Contains(s.expected, lie.old) {
			t.Fatalf("%s: step %d does not show %q: %q", lie.name, lie.step, lie.old, s.expected)
		}
		s.expected = strings.Replace(s.expected, lie.old, lie.new, 1)
		w := &walk{t: t, bound: map[string]string{}}
		for i, a := range fakeAnswers() {
			w.check(changed[i], a)
		}
		if got := strings.Join(w.problems, "\n"); !strings.Contains(got, lie.problem) {
			t.Errorf("%s: want a problem with %q, got:\n%s", lie.name, lie.problem, got)
		}
	}
}

// TestWalkthroughCheckerCatchesCopiedTokens: a command that carries a
// fencing token the README showed in an earlier answer fails for every
// reader, whose run has another token: the checker says so.
func TestWalkthroughCheckerCatchesCopiedTokens(t *testing.T) {
	steps, err := parseWalkthrough("README.md", fakeReadme, walkthroughSection)
	if err != nil {
		t.Fatal(err)
	}
	copied := append([]step(nil), steps...)
	copied[2].command = strings.Replace(copied[2].command, `"'"$(jq -r .operation.fencingToken reserve.json)"'"`, `"100"`, 1)
	if copied[2].command == steps[2].command {
		t.Fatalf("the Complete command does not read the token: %q", steps[2].command)
	}
	w := &walk{t: t, addr: "127.0.0.1:6000", bound: map[string]string{}}
	for i, a := range fakeAnswers() {
		w.command(copied[i])
		w.check(copied[i], a)
	}
	if got := strings.Join(w.problems, "\n"); !strings.Contains(got, "the command carries 100, a value of the README's run") {
		t.Errorf("want a problem with the copied token, got:\n%s", got)
	}
}
