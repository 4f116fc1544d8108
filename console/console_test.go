package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/opledger/ledger/console"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// ledger is ledgerd's HTTP listener in front of a ledger service on a real
// redis-server: the console and the JSON API, with one key per scope.
type ledger struct {
	url  string
	keys map[string]string // scope -> key
}

func start(t *testing.T) *ledger {
	t.Helper()
	st := servicetest.StartHTTP(t, redistest.Shared(t).Client(t), servicetest.Options{Policy: ledgertest.Policy},
		fmt.Sprintf("console-%d", time.Now().UnixNano()), "ops", map[string]http.Handler{console.Path: console.Handler()})
	return &ledger{url: st.URL, keys: st.Keys}
}

// call sends a JSON API call with scope's key; it returns the status and
// the body.
func (l *ledger) call(t *testing.T, scope, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var in io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		in = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, l.url+path, in)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+l.keys[scope])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// operation reads id's record through the JSON API.
func (l *ledger) operation(t *testing.T, id string) map[string]any {
	t.Helper()
	code, body := l.call(t, "reconciler", "GET", "/v1/operations:lookup?operation_id="+id, nil)
	if code != 200 {
		t.Fatalf("Lookup(%s): %d %v", id, code, body)
	}
	return body["operation"].(map[string]any)
}

// claim reserves id as an agent; it returns the fencing token (EXECUTE) or
// fails the test.
func (l *ledger) claim(t *testing.T, id, tool, holder string, extra map[string]any) string {
	t.Helper()
	req := map[string]any{"operationId": id, "tool": tool, "params": map[string]any{"amount": 25}, "holder": holder}
	for k, v := range extra {
		req[k] = v
	}
	code, body := l.call(t, "agent", "POST", "/v1/operations:reserve", req)
	if code != 200 || body["decision"] != "DECISION_EXECUTE" {
		t.Fatalf("Reserve(%s): %d %v", id, code, body)
	}
	return body["operation"].(map[string]any)["fencingToken"].(string)
}

// unknown claims id (with the extra Reserve fields) and reports its outcome
// unknown (a timeout).
func (l *ledger) unknown(t *testing.T, id, tool string, extra map[string]any) string {
	t.Helper()
	tok := l.claim(t, id, tool, "h-"+id, extra)
	if code, body := l.call(t, "agent", "POST", "/v1/operations:markUnknown", map[string]any{
		"operationId": id, "fencingToken": tok, "reason": "deadline exceeded"}); code != 200 {
		t.Fatalf("MarkUnknown(%s): %d %v", id, code, body)
	}
	return tok
}

// browser is one headless Chromium for the test, with a tab per call of
// tab. Without Chromium the test is skipped, or fails when make test runs
// it (LEDGER_TEST_POLYGLOT=require, and make test installs it).
func browser(t *testing.T) func(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		msg := "no Chromium on PATH (Debian: apt-get install chromium)"
		if os.Getenv("LEDGER_TEST_POLYGLOT") == "require" {
			t.Fatalf("%s (LEDGER_TEST_POLYGLOT=require: make test installs it)", msg)
		}
		t.Skip(msg)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 860), chromedp.Flag("disable-dev-shm-usage", true))
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	root, cancelRoot := chromedp.NewContext(alloc)
	t.Cleanup(cancelRoot)
	if err := chromedp.Do(root); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", path, err)
	}
	return func(t *testing.T) context.Context {
		tab, cancelTab := chromedp.NewContext(root)
		ctx, cancelTime := context.WithTimeout(tab, 90*time.Second)
		t.Cleanup(func() { cancelTime(); cancelTab() })
		return ctx
	}
}

// run runs browser actions, failing the test on an error.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// into is a, storing its value in dst.
func into[T any](dst *T, a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		v, err := a(ctx, tg)
		*dst = v
		return chromedp.Void{}, err
	}
}

// typeKey opens the console and signs in with key.
func typeKey(url, key string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(url+console.Path),
		chromedp.WaitVisible(chromedp.CSS("#key")),
		chromedp.SendKeys(chromedp.CSS("#key"), key),
		chromedp.Click(chromedp.CSS(`#login-form button[type=submit]`)))
}

// signIn opens the console and signs in with key; the queue shows.
func signIn(url, key string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		typeKey(url, key),
		chromedp.WaitVisible(chromedp.CSS("#queue")),
		chromedp.WaitNotPresent(chromedp.CSS(`#queue-status:not(:empty)`)),
	)
}

// row selects the queue's row of id.
func row(id string) string { return `#queue-table tr[data-id="` + id + `"]` }

// open clicks id in the queue and waits for its page.
func open(id string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Click(chromedp.CSS(row(id)+` button`)),
		chromedp.WaitVisible(chromedp.CSS("#operation")),
		chromedp.WaitVisible(chromedp.CSS("#op-token")),
	)
}

// decide chooses a finding on the operation's page, fills fields, sends it
// and confirms; the answer shows.
func decide(finding string, fields map[string]string) chromedp.Action[chromedp.Void] {
	tasks := []chromedp.Action[chromedp.Void]{chromedp.Click(chromedp.CSS(`input[name=finding][value=` + finding + `]`))}
	for sel, v := range fields {
		tasks = append(tasks, chromedp.SendKeys(chromedp.CSS(sel), v))
	}
	return chromedp.Steps(append(tasks,
		chromedp.Click(chromedp.CSS(`#act-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS("#confirm-send")),
		chromedp.Click(chromedp.CSS("#confirm-send")),
		chromedp.WaitVisible(chromedp.CSS("#answer")))...)
}

// unknownPage starts a ledger with id UNKNOWN and opens its page in a
// reconciler's tab; it returns the ledger, the tab and the record.
func unknownPage(t *testing.T, tab func(t *testing.T) context.Context, id string) (*ledger, context.Context, map[string]any) {
	t.Helper()
	l := start(t)
	l.unknown(t, id, "payments.refund", nil)
	ctx := tab(t)
	run(t, ctx, "open", signIn(l.url, l.keys["reconciler"]), chromedp.WaitVisible(chromedp.CSS(row(id))), open(id))
	return l, ctx, l.operation(t, id)
}

// clearAnswer hides the last answer and, with form, resets the form.
func clearAnswer(form bool) chromedp.Action[chromedp.Void] {
	js := `document.getElementById("answer").hidden = true;`
	if form {
		js += `document.getElementById("act-form").reset();`
	}
	return chromedp.Evaluate[chromedp.Void](js)
}

// refusedOnPage submits the form, which the page refuses before any
// dialog; it stores the answer and its class.
func refusedOnPage(answer, class *string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Click(chromedp.CSS(`#act-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS("#answer")),
		into(answer, chromedp.Text(chromedp.CSS("#answer"))),
		into(class, chromedp.Evaluate[string](`document.getElementById("answer").className`)))
}

// screenshot writes the page to name in LEDGER_CONSOLE_SCREENSHOTS (the
// docs' images, by make screenshots), when it is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("LEDGER_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	var png []byte
	run(t, ctx, "screenshot", into(&png, chromedp.FullScreenshot(100)))
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConsoleInABrowser: in headless Chromium, an operator finds an UNKNOWN
// operation in the queue, opens it and resolves it as applied; it leaves the
// queue and the agent's retry replays instead of applying the effect again.
// A viewer sees no actions and a forged one is refused by the API; a stale
// page's action is refused with the reason shown; the key is kept nowhere
// but the tab's memory.
func TestConsoleInABrowser(t *testing.T) {
	tab := browser(t)

	t.Run("resolve an UNKNOWN operation as applied", func(t *testing.T) {
		l := start(t)
		charge := l.claim(t, "wf-8470:charge", "payments.charge", "h-charge", nil)
		if code, body := l.call(t, "agent", "POST", "/v1/operations:complete", map[string]any{"operationId": "wf-8470:charge",
			"fencingToken": charge, "outcome": "OUTCOME_SUCCEEDED", "result": map[string]any{"resourceId": "ch_1"}}); code != 200 {
			t.Fatalf("Complete: %d %v", code, body)
		}
		if code, body := l.call(t, "agent", "POST", "/v1/runs/wf-8472:start", map[string]any{"limits": map[string]any{"maxSteps": 20}}); code != 200 {
			t.Fatalf("StartRun: %d %v", code, body)
		}
		l.unknown(t, "wf-8472:refund", "payments.refund", map[string]any{"compensates": "wf-8470:charge", "runId": "wf-8472", "step": 4})
		l.unknown(t, "wf-8473:ticket", "overdue.ticket", nil)
		l.claim(t, "wf-8474:charge", "payments.charge", "h-live", nil) // a live claim: not listed
		esc := l.unknown(t, "wf-8475:booking", "payments.booking", nil)
		if code, body := l.call(t, "reconciler", "POST", "/v1/operations:reconcile", map[string]any{
			"operationId": "wf-8475:booking", "finding": "FINDING_ESCALATE", "note": "the API times out", "fencingToken": esc}); code != 200 {
			t.Fatalf("escalate: %d %v", code, body)
		}
		effects := 1 // the first attempt applied the refund at the destination, then timed out
		ctx := tab(t)
		run(t, ctx, "sign in", signIn(l.url, l.keys["reconciler"]), chromedp.WaitVisible(chromedp.CSS(row("wf-8472:refund"))))
		var listed, unknown, flagged string
		run(t, ctx, "counts",
			into(&listed, chromedp.Text(chromedp.CSS(`[data-count=Listed] dd`))),
			into(&unknown, chromedp.Text(chromedp.CSS(`[data-count=UNKNOWN] dd`))),
			into(&flagged, chromedp.Text(chromedp.CSS(`[data-count=Flagged] dd`))))
		if listed != "3" || unknown != "3" || flagged != "1" {
			t.Fatalf("counts: listed %q, UNKNOWN %q, flagged %q; want 3, 3 and 1", listed, unknown, flagged)
		}
		screenshot(t, ctx, "console-queue.png")

		var token, state, runText, compensates string
		run(t, ctx, "open", open("wf-8472:refund"),
			into(&token, chromedp.Text(chromedp.CSS("#op-token"))),
			into(&state, chromedp.Text(chromedp.CSS("#op-fields .state"))),
			into(&runText, chromedp.Text(chromedp.CSS("#op-run"))),
			into(&compensates, chromedp.Text(chromedp.CSS("#op-compensates"))))
		if want := l.operation(t, "wf-8472:refund")["fencingToken"]; token != want || state != "UNKNOWN" {
			t.Fatalf("the page shows token %q, state %q; want %v, UNKNOWN", token, state, want)
		}
		if runText != "wf-8472 step 4 — RUNNING, 1 step" || compensates != "wf-8470:charge" {
			t.Fatalf("the links: run %q, compensates %q", runText, compensates)
		}
		run(t, ctx, "fill", chromedp.Click(chromedp.CSS(`input[name=finding][value=FINDING_APPLIED]`)),
			chromedp.SendKeys(chromedp.CSS("#act-resource"), "re_3141"),
			chromedp.SendKeys(chromedp.CSS("#act-note"), "INC-88: the refund exists in the refunds API"))
		screenshot(t, ctx, "console-operation.png")

		var answer string
		var shown, dataLine string
		run(t, ctx, "resolve", decide("FINDING_APPLIED", map[string]string{"#act-data": `{"refund":"re_3141","card":"visa-4242"}`}),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))),
			into(&dataLine, chromedp.Evaluate[string](`document.getElementById("op-data")?.textContent ?? ""`)),
			into(&shown, chromedp.Evaluate[string](`document.documentElement.outerHTML + document.body.innerText`)))
		if !strings.Contains(answer, "Recorded. The operation is SUCCEEDED") {
			t.Fatalf("the answer: %q", answer)
		}
		// The record's page names its resource, never the result's data.
		if strings.Contains(shown, "visa-4242") || !strings.Contains(dataLine, "not shown here") {
			t.Fatalf("the recorded page shows the result data (%q)", dataLine)
		}
		op := l.operation(t, "wf-8472:refund")
		hist := op["history"].([]any)
		last := hist[len(hist)-1].(map[string]any)
		if op["state"] != "STATE_SUCCEEDED" || op["result"].(map[string]any)["resourceId"] != "re_3141" ||
			op["result"].(map[string]any)["data"].(map[string]any)["card"] != "visa-4242" ||
			last["principal"] != "ops-reconciler" || last["fencingToken"] != token {
			t.Fatalf("the record after the console's finding: %v", op)
		}
		// The agent's retry replays the recorded refund.
		code, body := l.call(t, "agent", "POST", "/v1/operations:reserve", map[string]any{
			"operationId": "wf-8472:refund", "tool": "payments.refund", "params": map[string]any{"amount": 25}, "holder": "h-retry",
			"compensates": "wf-8470:charge", "runId": "wf-8472"})
		if body["decision"] == "DECISION_EXECUTE" {
			effects++ // the agent would refund again
		}
		if code != 200 || body["decision"] != "DECISION_REPLAY" || effects != 1 {
			t.Fatalf("the retry: %d %v; the refund applied %d times", code, body, effects)
		}
		var by string
		var hiddenActions bool
		run(t, ctx, "the compensated charge", chromedp.Click(chromedp.CSS("#op-compensates button")),
			chromedp.WaitVisible(chromedp.CSS("#op-compensated-by")),
			into(&by, chromedp.Text(chromedp.CSS("#op-compensated-by"))),
			into(&hiddenActions, chromedp.Evaluate[bool](`document.getElementById("actions").hidden`)))
		if by != "wf-8472:refund" || !hiddenActions {
			t.Fatalf("the charge's page: compensated by %q, actions hidden %v (it is SUCCEEDED)", by, hiddenActions)
		}
		run(t, ctx, "back", chromedp.Click(chromedp.CSS("#back")), chromedp.WaitVisible(chromedp.CSS("#queue")),
			chromedp.WaitNotPresent(chromedp.CSS(row("wf-8472:refund"))),
			chromedp.WaitVisible(chromedp.CSS(row("wf-8473:ticket"))))

		// The filters: past the recovery window, then flagged.
		run(t, ctx, "filter overdue", chromedp.Click(chromedp.CSS("#f-overdue")), chromedp.Click(chromedp.CSS(`#filters button`)),
			chromedp.WaitNotPresent(chromedp.CSS(row("wf-8475:booking"))), chromedp.WaitVisible(chromedp.CSS(row("wf-8473:ticket"))))
		run(t, ctx, "filter flagged", chromedp.Click(chromedp.CSS("#f-overdue")), chromedp.Click(chromedp.CSS("#f-review")),
			chromedp.Click(chromedp.CSS(`#filters button`)),
			chromedp.WaitNotPresent(chromedp.CSS(row("wf-8473:ticket"))), chromedp.WaitVisible(chromedp.CSS(row("wf-8475:booking"))))

		// Nothing of the key is kept where it outlives the tab.
		var kept string
		run(t, ctx, "storage", into(&kept, chromedp.Evaluate[string](`JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie + location.href + document.documentElement.outerHTML`)))
		secret := l.keys["reconciler"][strings.IndexByte(l.keys["reconciler"], '.')+1:]
		if strings.Contains(kept, secret) {
			t.Fatal("the key is in the page, its URL or the browser's storage")
		}
	})

	t.Run("a viewer sees no actions, and a forged one is refused", func(t *testing.T) {
		l := start(t)
		l.unknown(t, "wf-9:refund", "payments.refund", nil)
		before := l.operation(t, "wf-9:refund")
		// An agent's key signs in, but may not list the queue.
		var refused string
		run(t, tab(t), "agent", typeKey(l.url, l.keys["agent"]),
			into(&refused, chromedp.Poll[string](`(() => { const s = document.getElementById("queue-status").textContent;
				return s.startsWith("Refused") ? s : false; })()`)))
		if refused != "Refused: this key may not do this (it needs the reconciler or viewer scope)." {
			t.Fatalf("an agent's key at the queue: %q", refused)
		}
		ctx := tab(t)
		var hidden bool
		var who string
		run(t, ctx, "viewer", signIn(l.url, l.keys["viewer"]), chromedp.WaitVisible(chromedp.CSS(row("wf-9:refund"))),
			open("wf-9:refund"),
			into(&hidden, chromedp.Evaluate[bool](`document.getElementById("actions").hidden`)),
			into(&who, chromedp.Text(chromedp.CSS("#who"))))
		if !hidden || !strings.Contains(who, "read only") {
			t.Fatalf("a viewer's page: actions hidden %v, %q", hidden, who)
		}
		type answer struct {
			Status int    `json:"status"`
			Body   string `json:"body"`
		}
		var forged answer
		js := `fetch("/v1/operations:reconcile", {method: "POST", headers: {"Authorization": "Bearer ` + l.keys["viewer"] + `",
			"Content-Type": "application/json"}, body: JSON.stringify({operationId: "wf-9:refund", finding: "FINDING_ABANDON"})})
			.then(async (r) => ({status: r.status, body: await r.text()}))`
		run(t, ctx, "forge", into(&forged, chromedp.Evaluate[answer](js, chromedp.EvalAwaitPromise)))
		if forged.Status != http.StatusForbidden || !strings.Contains(forged.Body, "PERMISSION_DENIED") {
			t.Fatalf("a viewer's forged Reconcile: %d %s", forged.Status, forged.Body)
		}
		if after := l.operation(t, "wf-9:refund"); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("the forged call changed the record:\n%v\n%v", before, after)
		}
	})

	t.Run("a stale page's action is refused with the reason", func(t *testing.T) {
		l := start(t)
		first := l.unknown(t, "wf-10:refund", "payments.refund", nil)
		ctx := tab(t)
		run(t, ctx, "open", signIn(l.url, l.keys["reconciler"]), chromedp.WaitVisible(chromedp.CSS(row("wf-10:refund"))),
			open("wf-10:refund"))
		// Behind the page: another operator finds it not applied, and the
		// agent's next attempt times out too.
		if code, body := l.call(t, "reconciler", "POST", "/v1/operations:reconcile", map[string]any{
			"operationId": "wf-10:refund", "finding": "FINDING_NOT_APPLIED", "fencingToken": first, "note": "no refund found"}); code != 200 {
			t.Fatalf("not applied: %d %v", code, body)
		}
		second := l.unknown(t, "wf-10:refund", "payments.refund", nil)
		var answer, class string
		run(t, ctx, "stale action", decide("FINDING_APPLIED", map[string]string{"#act-resource": "re_1"}),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))),
			into(&class, chromedp.Evaluate[string](`document.getElementById("answer").className`)))
		if class != "refused" || !strings.Contains(answer, "another attempt holds the operation now (the operation is UNKNOWN now)") ||
			!strings.Contains(answer, "The page now shows the operation as it is: decide again.") {
			t.Fatalf("the stale page's answer: %q (%s)", answer, class)
		}
		op := l.operation(t, "wf-10:refund")
		if op["state"] != "STATE_UNKNOWN" || op["fencingToken"] != second || op["result"] != nil {
			t.Fatalf("the stale action changed the record: %v", op)
		}
		// The page was read again: it shows the new attempt, whose decision is recorded.
		var token string
		run(t, ctx, "decide again", into(&token, chromedp.Text(chromedp.CSS("#op-token"))),
			clearAnswer(false),
			decide("FINDING_APPLIED", map[string]string{"#act-resource": "re_2"}),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))))
		op = l.operation(t, "wf-10:refund")
		if token != second || !strings.Contains(answer, "Recorded. The operation is SUCCEEDED") ||
			op["result"].(map[string]any)["resourceId"] != "re_2" {
			t.Fatalf("deciding again: token %q (want %v), %q, the record %v", token, second, answer, op)
		}
	})

	t.Run("a resolved operation opens by its id, without its failure's detail", func(t *testing.T) {
		l := start(t)
		// The tool's error text, which quotes the card, is the failure's detail.
		tok := l.claim(t, "wf-12:refund", "payments.refund", "h-12", nil)
		if code, body := l.call(t, "agent", "POST", "/v1/operations:complete", map[string]any{
			"operationId": "wf-12:refund", "fencingToken": tok, "outcome": "OUTCOME_FAILED_FINAL",
			"failure": map[string]any{"code": "tool_error", "detail": "card visa-4242 declined"}}); code != 200 {
			t.Fatalf("Complete: %d %v", code, body)
		}
		l.unknown(t, "wf-13:refund", "payments.refund", nil) // the queue lists only this one
		ctx := tab(t)
		var status string
		run(t, ctx, "no such operation", signIn(l.url, l.keys["viewer"]), chromedp.WaitVisible(chromedp.CSS(row("wf-13:refund"))),
			chromedp.SendKeys(chromedp.CSS("#find-id"), "wf-12:nothing"), chromedp.Click(chromedp.CSS(`#find button`)),
			into(&status, chromedp.Poll[string](`(() => { const s = document.getElementById("queue-status").textContent;
				return s.startsWith("Refused") ? s : false; })()`)))
		if status != "Refused: there is no such operation." {
			t.Fatalf("the status for an id no operation has: %q", status)
		}
		var shown, outcome, state string
		run(t, ctx, "open", chromedp.SetValue(chromedp.CSS("#find-id"), "wf-12:refund"), chromedp.Click(chromedp.CSS(`#find button`)),
			chromedp.WaitVisible(chromedp.CSS("#op-token")),
			into(&state, chromedp.Text(chromedp.CSS("#op-fields .state"))),
			into(&outcome, chromedp.Text(chromedp.CSS("#op-outcome"))),
			into(&shown, chromedp.Evaluate[string](`document.documentElement.outerHTML + document.body.innerText`)))
		if state != "FAILED_FINAL" || strings.Contains(shown, "visa-4242") || !strings.Contains(outcome, "tool_error") ||
			!strings.Contains(outcome, "Detail: recorded, not shown here") {
			t.Fatalf("the failed operation's page: %s, %q", state, outcome)
		}
		if f := l.operation(t, "wf-12:refund")["failure"].(map[string]any); f["detail"] != "card visa-4242 declined" {
			t.Fatalf("the recorded failure: %v", f)
		}
	})

	t.Run("a link to an operation that expired says so on the page", func(t *testing.T) {
		l := start(t)
		tok := l.claim(t, "wf-14:charge", "brief.charge", "h-14", nil) // retention 1s
		if code, body := l.call(t, "agent", "POST", "/v1/operations:complete", map[string]any{"operationId": "wf-14:charge",
			"fencingToken": tok, "outcome": "OUTCOME_SUCCEEDED", "result": map[string]any{"resourceId": "ch_14"}}); code != 200 {
			t.Fatalf("Complete: %d %v", code, body)
		}
		l.unknown(t, "wf-14:refund", "payments.refund", map[string]any{"compensates": "wf-14:charge"})
		ctx := tab(t)
		run(t, ctx, "open", signIn(l.url, l.keys["reconciler"]), chromedp.WaitVisible(chromedp.CSS(row("wf-14:refund"))),
			open("wf-14:refund"), chromedp.WaitVisible(chromedp.CSS("#op-compensates button")))
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, _ := l.call(t, "viewer", "GET", "/v1/operations:lookup?operation_id=wf-14:charge", nil)
			if code != 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the charge's record did not expire")
			}
		}
		var answer, title string
		run(t, ctx, "the expired charge", chromedp.Click(chromedp.CSS("#op-compensates button")),
			chromedp.WaitVisible(chromedp.CSS("#answer")),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))),
			into(&title, chromedp.Text(chromedp.CSS("#op-title"))))
		if title != "Operation wf-14:refund" ||
			answer != "Operation wf-14:charge: Refused: the operation's record has expired (it ended SUCCEEDED). Only how it ended is kept." {
			t.Fatalf("the page %q after the expired link: %q", title, answer)
		}
	})

	t.Run("a slow answer does not replace the page opened after it", func(t *testing.T) {
		l := start(t)
		l.unknown(t, "wf-15:slow", "payments.refund", nil)
		quick := l.unknown(t, "wf-16:quick", "payments.refund", nil)
		ctx := tab(t)
		// The first operation's Lookup is held until the test lets it go;
		// slowDone is set once the console has read its answer.
		hold := `(() => {
			const real = window.fetch;
			window.fetch = (url, init) => {
				if (!String(url).includes("operation_id=wf-15")) return real(url, init);
				return new Promise((go) => { window.releaseSlow = go; }).then(() => real(url, init)).then((resp) => {
					const json = resp.json.bind(resp);
					resp.json = () => json().then((v) => { setTimeout(() => { window.slowDone = true; }, 0); return v; });
					return resp;
				});
			};
		})()`
		var title, token string
		var done bool
		run(t, ctx, "open two", signIn(l.url, l.keys["reconciler"]), chromedp.WaitVisible(chromedp.CSS(row("wf-16:quick"))),
			chromedp.Evaluate[chromedp.Void](hold),
			chromedp.Click(chromedp.CSS(row("wf-15:slow")+` button`)),
			into(&done, chromedp.Poll[bool](`typeof window.releaseSlow === "function"`)),
			open("wf-16:quick"),
			chromedp.Evaluate[chromedp.Void](`window.releaseSlow()`),
			into(&done, chromedp.Poll[bool](`window.slowDone === true`)),
			into(&title, chromedp.Text(chromedp.CSS("#op-title"))),
			into(&token, chromedp.Text(chromedp.CSS("#act-token"))))
		if title != "Operation wf-16:quick" || token != quick {
			t.Fatalf("after the slow answer the page shows %q, token %q; want wf-16:quick, %s", title, token, quick)
		}
	})

	t.Run("a decision whose answer is lost is shown as it stands", func(t *testing.T) {
		l, ctx, _ := unknownPage(t, tab, "wf-18:refund")
		// The Reconcile reaches the ledger; its answer does not reach the page.
		lose := `(() => {
			const real = window.fetch;
			window.fetch = async (url, init) => {
				const resp = await real(url, init);
				if (String(url).includes(":reconcile")) throw new TypeError("Failed to fetch");
				return resp;
			};
		})()`
		var answer, state string
		var hidden bool
		run(t, ctx, "decide", chromedp.Evaluate[chromedp.Void](lose), decide("FINDING_APPLIED", map[string]string{"#act-resource": "re_18"}),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))),
			into(&state, chromedp.Text(chromedp.CSS("#op-fields .state"))),
			into(&hidden, chromedp.Evaluate[bool](`document.getElementById("actions").hidden`)))
		want := "The ledger did not answer: the network failed (Failed to fetch). Whether the decision was recorded is not known." +
			" The page now shows the operation as it is: if its timeline lacks the decision, send it again."
		if answer != want || state != "SUCCEEDED" || !hidden {
			t.Fatalf("after a lost answer: %q, the page shows %s (actions hidden %v)", answer, state, hidden)
		}
		op := l.operation(t, "wf-18:refund")
		if op["state"] != "STATE_SUCCEEDED" || op["result"].(map[string]any)["resourceId"] != "re_18" {
			t.Fatalf("the record: %v", op)
		}
	})

	t.Run("an operation that does not open leaves the queue loading", func(t *testing.T) {
		l := start(t)
		l.unknown(t, "wf-19:refund", "payments.refund", nil)
		ctx := tab(t)
		// The queue's first page is held until the test lets it go.
		hold := `(() => {
			const real = window.fetch;
			window.fetch = (url, init) => {
				if (!String(url).includes("operations:unresolved") || window.releaseQueue) return real(url, init);
				return new Promise((go) => { window.releaseQueue = go; }).then(() => real(url, init));
			};
		})()`
		var status string
		var held bool
		run(t, ctx, "sign in, then open an id with no record", chromedp.Navigate(l.url+console.Path), chromedp.WaitVisible(chromedp.CSS("#key")),
			chromedp.Evaluate[chromedp.Void](hold), chromedp.SendKeys(chromedp.CSS("#key"), l.keys["reconciler"]),
			chromedp.Click(chromedp.CSS(`#login-form button[type=submit]`)),
			into(&held, chromedp.Poll[bool](`typeof window.releaseQueue === "function"`)),
			chromedp.SendKeys(chromedp.CSS("#find-id"), "wf-19:nothing"), chromedp.Click(chromedp.CSS(`#find button`)),
			into(&status, chromedp.Poll[string](`(() => { const s = document.getElementById("queue-status").textContent;
				return s.startsWith("Refused") ? s : false; })()`)),
			chromedp.Evaluate[chromedp.Void](`window.releaseQueue()`),
			chromedp.WaitVisible(chromedp.CSS(row("wf-19:refund"))))
		if status != "Refused: there is no such operation." {
			t.Fatalf("the status for an id with no record: %q", status)
		}
	})

	t.Run("text past the ledger's limits is refused on the page, counted in bytes", func(t *testing.T) {
		l, ctx, before := unknownPage(t, tab, "wf-17:refund")
		persian := func(n int) string { return strings.Repeat("د", n) } // two bytes each in UTF-8
		for _, c := range []struct {
			finding string
			fields  map[string]string
			says    string
		}{
			{"FINDING_ESCALATE", map[string]string{"#act-note": persian(129)}, "The note is 258 bytes in UTF-8; the ledger keeps at most 256."},
			{"FINDING_APPLIED", map[string]string{"#act-resource": persian(129)}, "The resource id is 258 bytes"},
			{"FINDING_ABANDON", map[string]string{"#act-fcode": persian(65)}, "The failure code is 130 bytes"},
			{"FINDING_ABANDON", map[string]string{"#act-fmsg": persian(513)}, "The failure message is 1026 bytes"},
		} {
			steps := []chromedp.Action[chromedp.Void]{clearAnswer(true), chromedp.Click(chromedp.CSS(`input[name=finding][value=` + c.finding + `]`))}
			for sel, v := range c.fields {
				steps = append(steps, chromedp.SetValue(chromedp.CSS(sel), v))
			}
			var answer, class string
			run(t, ctx, c.says, append(steps, refusedOnPage(&answer, &class))...)
			if class != "refused" || !strings.Contains(answer, c.says) {
				t.Errorf("the answer %q (%s), want it refused on the page: %q", answer, class, c.says)
			}
		}
		if after := l.operation(t, "wf-17:refund"); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("a refused finding changed the record:\n%v\n%v", before, after)
		}
		// At each limit a text is sent and kept, so the page's limits are
		// the ledger's. 128 Persian letters are 256 bytes: the note.
		var answer string
		run(t, ctx, "a note at the limit", clearAnswer(true), chromedp.SetValue(chromedp.CSS("#act-note"), persian(128)),
			decide("FINDING_ESCALATE", nil), into(&answer, chromedp.Text(chromedp.CSS("#answer"))))
		hist := l.operation(t, "wf-17:refund")["history"].([]any)
		if !strings.Contains(answer, "Recorded.") || hist[len(hist)-1].(map[string]any)["detail"] != persian(128) {
			t.Fatalf("a 256-byte note: %q, the last entry %v", answer, hist[len(hist)-1])
		}
		// A failure's code and message at their limits (128 and 1,024 bytes).
		run(t, ctx, "a failure at the limits", clearAnswer(true),
			decide("FINDING_ABANDON", map[string]string{"#act-fcode": persian(64), "#act-fmsg": persian(512)}),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))))
		f, _ := l.operation(t, "wf-17:refund")["failure"].(map[string]any)
		if !strings.Contains(answer, "Recorded. The operation is FAILED_FINAL") || f["code"] != persian(64) || f["message"] != persian(512) {
			t.Fatalf("a failure at the limits: %q, recorded %v", answer, f)
		}
		// A resource id at its limit (256 bytes), on another operation.
		l.unknown(t, "wf-20:refund", "payments.refund", nil)
		run(t, ctx, "a resource id at the limit", chromedp.SetValue(chromedp.CSS("#find-id"), "wf-20:refund"),
			chromedp.Click(chromedp.CSS("#back")), chromedp.Click(chromedp.CSS(`#find button`)),
			chromedp.WaitVisible(chromedp.CSS("#op-token")), clearAnswer(true),
			decide("FINDING_APPLIED", map[string]string{"#act-resource": persian(128)}),
			into(&answer, chromedp.Text(chromedp.CSS("#answer"))))
		r, _ := l.operation(t, "wf-20:refund")["result"].(map[string]any)
		if !strings.Contains(answer, "Recorded. The operation is SUCCEEDED") || r["resourceId"] != persian(128) {
			t.Fatalf("a 256-byte resource id: %q, recorded %v", answer, r)
		}
	})

	t.Run("result data a double would change is refused on the page", func(t *testing.T) {
		l, ctx, before := unknownPage(t, tab, "wf-11:refund")
		run(t, ctx, "applied", chromedp.Click(chromedp.CSS(`input[name=finding][value=FINDING_APPLIED]`)))
		for _, data := range []string{
			`{"refund_id": 9007199254740993}`, // JSON.parse reads ...992
			`{"ids": [1, -9007199254740993]}`, // in a list, negative
			`{"n": 123456789012345678901234}`, // beyond 2^53, not a double's digits
			`{"nested": {"x": 1e400}}`,        // beyond a double's range: sent as null
		} {
			var answer, class string
			run(t, ctx, data, clearAnswer(false), chromedp.SetValue(chromedp.CSS("#act-data"), data), refusedOnPage(&answer, &class))
			if class != "refused" || !strings.Contains(answer, "would be recorded as another number") {
				t.Errorf("%s: the answer %q (%s), want it refused on the page", data, answer, class)
			}
		}
		if after := l.operation(t, "wf-11:refund"); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("a refused finding changed the record:\n%v\n%v", before, after)
		}
		// Numbers a double holds as typed are sent, however large.
		var answer string
		run(t, ctx, "exact", clearAnswer(false), chromedp.SetValue(chromedp.CSS("#act-data"), `{"big": 100000000000000000000, "edge": 9007199254740992, "f": 1.5e300}`),
			decide("FINDING_APPLIED", nil), into(&answer, chromedp.Text(chromedp.CSS("#answer"))))
		result, _ := l.operation(t, "wf-11:refund")["result"].(map[string]any)
		data, _ := result["data"].(map[string]any)
		if !strings.Contains(answer, "Recorded. The operation is SUCCEEDED") || data["big"] != 1e20 || data["edge"] != float64(1<<53) || data["f"] != 1.5e300 {
			t.Fatalf("exact numbers: the answer %q, the data recorded %v", answer, data)
		}
	})
}

// TestHandler: the console's files, with headers that keep the page to
// itself; anything but GET and HEAD is refused.
func TestHandler(t *testing.T) {
	srv := httptest.NewServer(console.Handler())
	t.Cleanup(srv.Close)
	cases := []struct {
		method, path string
		status       int
		contentType  string
	}{
		{"GET", "/console/", 200, "text/html; charset=utf-8"},
		{"GET", "/console/console.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/console/console.css", 200, "text/css; charset=utf-8"},
		{"HEAD", "/console/", 200, "text/html; charset=utf-8"},
		{"GET", "/console/nothing", 404, ""},
		{"POST", "/console/", 405, ""},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, srv.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.status || c.contentType != "" && resp.Header.Get("Content-Type") != c.contentType {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Content-Type"), c.status, c.contentType)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s %s: Content-Security-Policy %q", c.method, c.path, csp)
		}
		if resp.Header.Get("Referrer-Policy") != "no-referrer" || resp.StatusCode == 200 && resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: headers %v", c.method, c.path, resp.Header)
		}
	}
}
