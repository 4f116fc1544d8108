// The operator console: the queue of unresolved operations, one
// operation's record, and the findings a reconciler may record, all through
// the ledger's HTTP/JSON API with the key typed in. The key lives in this
// closure only: never in storage, the URL or the page.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const MAX_LISTED = 2000; // the queue reads at most this many operations
  let key = "";
  let caller = null; // GET /v1/caller
  let shown = null; // the operation on the page, as last read
  // asked counts the requests of each view (the queue, an operation's
  // page; signing out ends both): an answer that arrives after a later
  // request of its view is dropped, so a slow Lookup cannot replace the page
  // opened after it, and opening an operation does not stop the queue's
  // loading.
  const asked = { queue: 0, operation: 0 };

  // api calls the JSON API; it resolves to {ok, status, body}.
  async function api(method, path, body) {
    const init = { method, headers: { Authorization: "Bearer " + key }, cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      return { ok: false, status: 0, body: { message: "the network failed (" + e.message + ")" } };
    }
    let parsed = {};
    try {
      parsed = await resp.json();
    } catch (e) {
      parsed = { message: "the answer was not JSON (HTTP " + resp.status + ")" };
    }
    return { ok: resp.ok, status: resp.status, body: parsed };
  }

  // errorInfo returns the ErrorInfo of an error body (reason, metadata).
  function errorInfo(body) {
    for (const d of body.details || []) {
      if (d["@type"] === "type.googleapis.com/google.rpc.ErrorInfo") return d;
    }
    return { reason: "", metadata: {} };
  }

  // explain turns a refusal into a sentence for the operator.
  function explain(body) {
    const info = errorInfo(body);
    if (!info.reason) return "The ledger did not answer: " + (body.message || "no reason given") + ".";
    const md = info.metadata || {};
    const state = md.state ? " (the operation is " + md.state.replace("STATE_", "") + " now)" : "";
    switch (info.reason) {
      case "STALE_FENCING_TOKEN":
        return "Refused: another attempt holds the operation now" + state +
          ". This page showed an older attempt. Nothing was changed.";
      case "ALREADY_RESOLVED":
        return "Refused: the operation was already resolved with another finding" + state + ". Nothing was changed.";
      case "OPERATION_IN_PROGRESS":
        return "Refused: a worker holds a live lease on the operation. Wait for the lease to end, then decide.";
      case "PERMISSION_DENIED":
        return "Refused: this key may not do this" +
          (md.scopes ? " (it needs the " + md.scopes.split(",").join(" or ") + " scope)" : "") + ".";
      case "UNAUTHENTICATED":
        return "Refused: the key is not valid any more. Sign in again.";
      case "NOT_FOUND":
        return "Refused: there is no such operation.";
      case "IDEMPOTENCY_KEY_EXPIRED":
        return "Refused: the operation's record has expired" +
          (md.final_state ? " (it ended " + short(md.final_state) + ")" : "") + ". Only how it ended is kept.";
      case "INVALID_ARGUMENT":
        return "Refused: " + (body.message || "invalid input") + ".";
      case "RATE_LIMITED":
        return "Refused: too many calls for this tenant; try again in a moment.";
      default:
        return "Refused: " + info.reason + ": " + (body.message || "");
    }
  }

  // el builds an element with text (never HTML) and children.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "onclick") e.addEventListener("click", v);
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
    return e;
  }

  const short = (s) => (s || "").replace(/^(STATE|EFFECT|RUN_STATE)_/, "");
  function when(ts) {
    if (!ts) return "–";
    const d = new Date(ts);
    const ago = Math.round((Date.now() - d.getTime()) / 1000);
    const rel = Math.abs(ago) < 90 ? Math.abs(ago) + " s" : Math.abs(ago) < 5400 ? Math.round(Math.abs(ago) / 60) + " min" :
      Math.abs(ago) < 172800 ? Math.round(Math.abs(ago) / 3600) + " h" : Math.round(Math.abs(ago) / 86400) + " d";
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") + (ago >= 0 ? " (" + rel + " ago)" : " (in " + rel + ")");
  }
  const overdue = (op) => op.recoveryDeadline && new Date(op.recoveryDeadline).getTime() <= Date.now();
  const stateCell = (s) => el("span", { class: "state state-" + short(s) }, short(s));

  function show(section) {
    for (const id of ["login", "queue", "operation"]) $(id).hidden = id !== section;
    window.scrollTo(0, 0);
  }

  // Signing in: the key is checked (and its scopes read) by GET /v1/caller.
  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    $("key").value = "";
    const r = await api("GET", "/v1/caller");
    if (!r.ok) {
      key = "";
      $("login-error").textContent = r.status === 401 ? "That key is not valid." : explain(r.body);
      $("login-error").hidden = false;
      return;
    }
    caller = r.body;
    $("login-error").hidden = true;
    $("who").textContent = "tenant " + caller.tenant + " · key " + caller.principal + " · " + (caller.scopes || []).join(", ") +
      (canAct() ? "" : " (read only)");
    $("who").hidden = $("signout").hidden = false;
    show("queue");
    loadQueue();
  });

  $("signout").addEventListener("click", () => {
    asked.queue++;
    asked.operation++;
    key = "";
    caller = shown = null;
    $("who").hidden = $("signout").hidden = true;
    $("queue-table").tBodies[0].replaceChildren();
    show("login");
  });

  const canAct = () => !!caller && (caller.scopes || []).includes("reconciler");

  // The queue: every page of ListUnresolved under the filters, oldest first.
  $("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    loadQueue();
  });

  async function loadQueue() {
    const v = ++asked.queue;
    const q = new URLSearchParams({ page_size: "500" });
    if ($("f-state").value) q.set("states", $("f-state").value);
    if ($("f-tool").value.trim()) q.set("tool", $("f-tool").value.trim());
    if ($("f-overdue").checked) q.set("overdue", "true");
    if ($("f-review").checked) q.set("needs_review", "true");
    $("queue-status").textContent = "Loading…";
    const ops = [];
    let token = "";
    do {
      if (token) q.set("page_token", token);
      const r = await api("GET", "/v1/operations:unresolved?" + q.toString());
      if (v !== asked.queue) return;
      if (!r.ok) {
        $("queue-status").textContent = explain(r.body);
        return;
      }
      ops.push(...(r.body.operations || []));
      token = r.body.nextPageToken || "";
    } while (token && ops.length < MAX_LISTED);
    renderCounts(ops, token !== "");
    const rows = ops.map((op) => el("tr", { "data-id": op.operationId },
      el("td", { class: "mono" }, el("button", { class: "link", type: "button", onclick: () => openOperation(op.operationId) }, op.operationId)),
      el("td", { class: "mono" }, op.tool),
      el("td", {}, stateCell(op.state)),
      el("td", {}, (op.attempt || 0) + " of " + (op.maxAttempts || 0)),
      el("td", {}, when(op.createdAt)),
      el("td", {}, when(op.unknownSince)),
      el("td", {}, when(op.recoveryDeadline), overdue(op) ? el("span", { class: "badge" }, " overdue") : ""),
      el("td", {}, op.needsReview ? el("span", { class: "badge" }, "flagged") : "")));
    $("queue-table").tBodies[0].replaceChildren(...rows);
    $("queue-status").textContent = ops.length ? "" : "Nothing is waiting for a decision.";
  }

  function renderCounts(ops, more) {
    const n = (f) => ops.filter(f).length + (more ? "+" : "");
    const items = [
      ["Listed", ops.length + (more ? "+" : "")],
      ["UNKNOWN", n((o) => o.state === "STATE_UNKNOWN")],
      ["RUNNING", n((o) => o.state === "STATE_RUNNING")],
      ["PENDING", n((o) => o.state === "STATE_PENDING")],
      ["Overdue", n(overdue)],
      ["Flagged", n((o) => o.needsReview)],
    ];
    $("counts").replaceChildren(...items.map(([k, v]) => el("div", { "data-count": k }, el("dt", {}, k), el("dd", {}, v))));
  }

  // One operation: its record, links and timeline, and the actions.
  async function openOperation(id) {
    const v = ++asked.operation;
    $("answer").hidden = true;
    const r = await api("GET", "/v1/operations:lookup?" + new URLSearchParams({ operation_id: id }).toString());
    if (v !== asked.operation) return;
    if (!r.ok) {
      // Said where the operator is: the queue, or the page whose link failed.
      if ($("operation").hidden) $("queue-status").textContent = explain(r.body);
      else answer(false, "Operation " + id + ": " + explain(r.body));
      return;
    }
    if (await renderOperation(r.body.operation, v)) show("operation");
  }

  // renderOperation shows op, unless the operator asked for another page
  // (than request v) while its links were read; it reports whether it did.
  async function renderOperation(op, v) {
    const links = await linkRows(op);
    if (v !== asked.operation) return false;
    shown = op;
    $("op-title").replaceChildren("Operation ", el("code", {}, op.operationId));
    const rows = [
      ["State", stateCell(op.state)],
      ["Reason", op.reason || "–"],
      ["Tool", op.tool],
      ["Effect", short(op.effect)],
      ["Attempt", (op.attempt || 0) + " of " + (op.maxAttempts || 0)],
      ["Fencing token", el("code", { id: "op-token" }, op.fencingToken || "0")],
      ["Permit", op.permitId || "–"],
      ["Flagged for review", op.needsReview ? "yes" : "no"],
      ["Created", when(op.createdAt)],
      ["Updated", when(op.updatedAt)],
      ["Lease expires", when(op.leaseExpiresAt)],
      ["Unknown since", when(op.unknownSince)],
      ["Recovery deadline", overdue(op) ? el("span", {}, when(op.recoveryDeadline), " ", el("span", { class: "badge" }, "overdue")) : when(op.recoveryDeadline)],
      ["Expires", when(op.expiresAt)],
    ];
    $("op-fields").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));

    const out = [];
    if (op.result) {
      out.push(el("h3", {}, "Result"), el("p", {}, "Resource id: ", el("code", {}, op.result.resourceId || "–")));
      // A tool's result is never written into a page; its resource id is.
      if (op.result.data && Object.keys(op.result.data).length) {
        out.push(el("p", { id: "op-data" }, "Data: recorded, not shown here (",
          el("code", {}, "ledgerctl lookup"), " prints it)."));
      }
    }
    if (op.failure) {
      out.push(el("h3", {}, "Failure"), el("p", {}, el("code", {}, op.failure.code || "–"), " ", op.failure.message || ""));
      // Nor is what the destination answered with the failure.
      if (op.failure.detail) {
        out.push(el("p", { id: "op-detail" }, "Detail: recorded, not shown here (",
          el("code", {}, "ledgerctl lookup"), " prints it)."));
      }
    }
    $("op-outcome").replaceChildren(...out);
    $("op-links").replaceChildren(...links.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));

    const hist = (op.history || []).map((h) => el("tr", {},
      el("td", {}, when(h.time)),
      el("td", {}, (h.fromState && h.fromState !== "STATE_UNSPECIFIED" ? short(h.fromState) + " → " : "") + short(h.toState)),
      el("td", {}, h.reason),
      el("td", { class: "mono" }, h.principal),
      el("td", {}, h.attempt || 0),
      el("td", { class: "mono" }, h.fencingToken || "0"),
      el("td", {}, h.detail || "")));
    $("op-history").tBodies[0].replaceChildren(...hist);

    const terminal = op.state === "STATE_SUCCEEDED" || op.state === "STATE_FAILED_FINAL";
    $("actions").hidden = !canAct() || terminal;
    $("act-token").textContent = op.fencingToken || "0";
    $("act-form").reset();
    syncFindingFields();
    return true;
  }

  // linkRows returns the rows of op's links: its run (read by GetRun) and
  // its compensations.
  async function linkRows(op) {
    const link = (id) => el("button", { class: "link", type: "button", onclick: () => openOperation(id) }, id);
    const rows = [];
    if (op.runId) {
      const r = await api("GET", "/v1/runs:get?" + new URLSearchParams({ run_id: op.runId }).toString());
      const run = r.ok ? r.body.run : null;
      const steps = run ? run.steps || 0 : 0;
      const desc = run ? " — " + short(run.state) + ", " + steps + (steps === 1 ? " step" : " steps") : "";
      rows.push(["Run", el("span", { id: "op-run" }, el("code", {}, op.runId), (op.step ? " step " + op.step : "") + desc)]);
    }
    if (op.compensates) rows.push(["Compensates", el("span", { id: "op-compensates" }, link(op.compensates))]);
    if ((op.compensatedBy || []).length) {
      const list = el("span", { id: "op-compensated-by" });
      op.compensatedBy.forEach((id, i) => list.append(i ? ", " : "", link(id)));
      rows.push(["Compensated by", list]);
    }
    if (!rows.length) rows.push(["–", "no run or compensation"]);
    return rows;
  }

  // Any operation by its id: one resolved before, or not listed.
  $("find").addEventListener("submit", (ev) => {
    ev.preventDefault();
    openOperation($("find-id").value.trim());
  });

  $("back").addEventListener("click", () => {
    asked.operation++;
    show("queue");
    loadQueue();
  });

  // The actions: a finding, confirmed, sent with the page's fencing token.
  function finding() {
    const f = document.querySelector('input[name="finding"]:checked');
    return f ? f.value : "";
  }
  function syncFindingFields() {
    $("act-applied").hidden = finding() !== "FINDING_APPLIED";
    $("act-abandon").hidden = finding() !== "FINDING_ABANDON";
  }
  for (const r of document.querySelectorAll('input[name="finding"]')) r.addEventListener("change", syncFindingFields);

  // exactNumber reports whether v, parsed from source (the number as typed,
  // where the browser gives it), is the number typed: not an integer beyond
  // 2^53 that JSON.parse rounded (9007199254740993 to ...992), nor beyond a
  // number's range (1e400, sent as null). Without the source, every integer
  // from 2^53 on is refused.
  function exactNumber(v, source) {
    if (!Number.isFinite(v)) return false;
    if (!Number.isInteger(v) || Math.abs(v) < 2 ** 53) return true;
    if (source === undefined) return false;
    return !/^-?[0-9]+$/.test(source) || String(v) === source;
  }

  // request builds the Reconcile body, or returns an error sentence.
  function request() {
    const f = finding();
    if (!f) return { error: "Choose what the destination says." };
    const body = { operationId: shown.operationId, finding: f, fencingToken: shown.fencingToken || "0", note: $("act-note").value.trim() };
    if (f === "FINDING_APPLIED") {
      body.result = { resourceId: $("act-resource").value.trim() };
      const data = $("act-data").value.trim();
      if (data) {
        let inexact = null;
        try {
          body.result.data = JSON.parse(data, (k, v, ctx) => {
            if (inexact === null && typeof v === "number" && !exactNumber(v, ctx && ctx.source)) inexact = k;
            return v;
          });
        } catch (e) {
          return { error: "The result data is not JSON: " + e.message };
        }
        if (typeof body.result.data !== "object" || body.result.data === null || Array.isArray(body.result.data)) {
          return { error: "The result data must be a JSON object." };
        }
        if (inexact !== null) {
          return { error: "The result data's number at \"" + inexact + "\" would be recorded as another number " +
            "(an integer beyond 2^53, or beyond a number's range). Write it as a string." };
        }
      }
    }
    if (f === "FINDING_ABANDON" && ($("act-fcode").value.trim() || $("act-fmsg").value.trim())) {
      body.failure = { code: $("act-fcode").value.trim(), message: $("act-fmsg").value.trim() };
    }
    if (f === "FINDING_ESCALATE" && !body.note) return { error: "Say why in the note: the next person reads it." };
    const long = tooLong(body);
    return long ? { error: long } : { body };
  }

  // tooLong names the first text of body past the ledger's limit, which
  // counts UTF-8 bytes (ledger/validate.go): a Persian or Vietnamese note
  // has fewer characters than bytes. "" when none is.
  function tooLong(body) {
    const texts = [["The note", body.note, 256], ["The resource id", body.result && body.result.resourceId, 256],
      ["The failure code", body.failure && body.failure.code, 128], ["The failure message", body.failure && body.failure.message, 1024]];
    for (const [what, text, max] of texts) {
      const n = new TextEncoder().encode(text || "").length;
      if (n > max) return what + " is " + n + " bytes in UTF-8; the ledger keeps at most " + max + ". Shorten it.";
    }
    return "";
  }

  const findingText = {
    FINDING_APPLIED: "the effect exists: the operation becomes SUCCEEDED with this result",
    FINDING_NOT_APPLIED: "the effect does not exist: the operation returns to PENDING and may run again",
    FINDING_ABANDON: "the effect does not exist: the operation becomes FAILED_FINAL and never runs again",
    FINDING_ESCALATE: "nobody can tell yet: the operation stays UNKNOWN, flagged for review",
  };

  $("act-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const req = request();
    if (req.error) {
      answer(false, req.error);
      return;
    }
    $("confirm-text").textContent = "Operation " + shown.operationId + ", attempt " + (shown.attempt || 0) +
      " (fencing token " + req.body.fencingToken + "): " + findingText[req.body.finding] + ".";
    $("confirm").returnValue = "";
    $("confirm").showModal();
    $("confirm").onclose = () => {
      if ($("confirm").returnValue === "send") send(req.body);
    };
  });

  // send sends a decision and shows its answer, unless the operator has
  // left the page by then.
  async function send(body) {
    const v = asked.operation;
    const r = await api("POST", "/v1/operations:reconcile", body);
    if (v !== asked.operation) return;
    if (!r.ok) {
      if (v === asked.operation) answer(false, explain(r.body) + (await afterRefusal(errorInfo(r.body).reason, v)));
      return;
    }
    const op = r.body.operation;
    if (!(await renderOperation(op, v))) return;
    answer(true, "Recorded. The operation is " + short(op.state) + (op.needsReview ? ", flagged for review" : "") + ".");
  }

  // afterRefusal reads the operation again when the page may be out of
  // date: a refusal that says so, or a failure without the ledger's answer
  // (the decision may have been recorded). It returns the sentence that
  // tells the operator what to do next.
  async function afterRefusal(reason, v) {
    if (reason && reason !== "STALE_FENCING_TOKEN" && reason !== "ALREADY_RESOLVED") return "";
    const r = await api("GET", "/v1/operations:lookup?" + new URLSearchParams({ operation_id: shown.operationId }).toString());
    const shownNow = r.ok && (await renderOperation(r.body.operation, v));
    if (reason) return shownNow ? " The page now shows the operation as it is: decide again." : " Open the operation again before deciding.";
    return " Whether the decision was recorded is not known." + (shownNow
      ? " The page now shows the operation as it is: if its timeline lacks the decision, send it again."
      : " Sending it again is safe: the ledger answers a repeat of the same decision as recorded.");
  }

  function answer(ok, text) {
    const a = $("answer");
    a.className = ok ? "done" : "refused";
    a.textContent = text;
    a.hidden = false;
  }
})();
