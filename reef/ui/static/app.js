// Reef's dashboard: plain JavaScript, no build step, nothing fetched from elsewhere.
//
// The token lives in sessionStorage (this tab's session) and goes out only in the
// `Authorization: Bearer` header of calls to the /reef/* routes; never in a URL.
// Every value from the server is written with textContent, never parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "reef-token";
  const POLL_MS = 2000;
  const API = new URL("../", location.href); // the server root, whatever prefix a proxy adds
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  let renderSeq = 0; // drops a slow render once a newer one started
  let pollTimer = null;
  let polling = false;
  let refreshing = null; // the refresh under way: never two at once, so a slow server never gets a pile of polls
  let refreshAgain = false; // asked for while one was under way: runs once it ends
  let lastGood = null;
  const TABS = { chain: "Release chain", candidates: "Candidates", curve: "Learning curve", records: "Records" };

  // -- tiny DOM helpers ------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    append(el, children);
    return el;
  }

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    append(el, children);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = String(v);
      else if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "testid") el.dataset.testid = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  const short = (id) => (id ? String(id).slice(0, 10) : "—");
  // a record served by the canary names `canary-<batch id>`, a candidate under test, not a release of the chain
  const releaseLabel = (id) => (id && String(id).startsWith("canary-") ? `canary ${short(String(id).slice(7))}` : short(id));
  const fmtNum = (x, digits = 3) =>
    x === null || x === undefined ? "—" : typeof x !== "number" || Number.isInteger(x) ? String(x) : x.toFixed(digits);
  const fmtScore = (x) => (x === null || x === undefined ? "—" : Number(x).toFixed(3));
  const SCORE_KEYS = new Set(["current_score", "candidate_score", "gain", "p_value", "candidate_success"]);
  function fmtTime(t) {
    if (!t) return "—";
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function ago(t) {
    if (!t) return "";
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 60) return `${Math.round(s)} s ago`;
    if (s < 3600) return `${Math.round(s / 60)} min ago`;
    if (s < 86400) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }
  const pill = (text, kind) => h("span", { class: `pill ${kind || text}`, text });
  const enc = encodeURIComponent;

  // -- the API ---------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, options = {}) {
    const token = sessionStorage.getItem(TOKEN_KEY) || "";
    const headers = { accept: "application/json", ...(options.headers || {}) };
    if (token) headers.authorization = `Bearer ${token}`;
    let body;
    if (options.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.json);
    }
    const response = await fetch(new URL(path, API), {
      method: options.method || "GET", headers, body, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer",
    });
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!response.ok) {
      const message = (data && data.error && (data.error.message || data.error)) || text || response.statusText;
      if (response.status === 401 && !options.login) signOut("The server refused the token (401). Sign in again.");
      throw new ApiError(response.status, String(message));
    }
    return data;
  }

  // -- sign in and out -------------------------------------------------------------------

  function showLogin(message) {
    stopPolling();
    $("main").hidden = true;
    $("live").hidden = true;
    $("crumbs").replaceChildren();
    $("login").hidden = false;
    const error = $("login-error");
    error.hidden = !message;
    error.textContent = message || "";
    $("token").focus();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(message);
  }

  async function signIn(event) {
    event.preventDefault();
    const input = $("token");
    const token = input.value;
    const button = $("login-form").querySelector("button");
    button.disabled = true;
    try {
      const response = await fetch(new URL("reef/status", API), {
        headers: token ? { authorization: `Bearer ${token}` } : {}, cache: "no-store", credentials: "omit",
      });
      if (response.status === 401) {
        showLogin("Refused: the server does not accept that token.");
        input.select();
        return;
      }
      if (!response.ok) {
        showLogin(`The server answered ${response.status}; try again.`);
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, token);
      input.value = "";
      $("login").hidden = true;
      start();
    } catch (err) {
      showLogin(`Cannot reach the server: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  }

  // -- routing and polling ---------------------------------------------------------------

  // A part of the link that is not a valid %-escape (`%E0%A4%A`) stays as written: the server
  // then says what is wrong with it, and the page goes on (decodeURIComponent would throw).
  function decodePart(part) {
    try { return decodeURIComponent(part); } catch { return part; }
  }

  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodePart);
    if (parts[0] === "s" && parts[1]) {
      const scenario = parts[1];
      if (parts[2] === "record" && parts[3]) return { view: "record", scenario, id: parts[3] };
      if (parts[2] === "release" && parts[3]) return { view: "release", scenario, id: parts[3] };
      if (parts[2] === "session" && parts[3]) return { view: "session", scenario, id: parts[3], query: parts.slice(4) };
      return { view: "scenario", scenario, tab: parts[2] in TABS ? parts[2] : "chain", query: parts.slice(3) };
    }
    return { view: "scenarios" };
  }

  function start() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("live").hidden = false;
    $("logout").hidden = sessionStorage.getItem(TOKEN_KEY) === ""; // a server without tokens: nothing to sign out of
    polling = true;
    refresh();
  }

  function stopPolling() {
    polling = false;
    clearTimeout(pollTimer);
    pollTimer = null;
  }

  // The next poll is set POLL_MS after the last refresh ended, never on a fixed beat: a server
  // slower than POLL_MS gets one request at a time from this page, not a growing pile.
  function schedulePoll() {
    clearTimeout(pollTimer);
    pollTimer = !polling ? null : setTimeout(() => {
      // not while a confirmation is open, the tab is hidden, or a filter is being typed
      if (document.hidden || $("confirm").open || (document.activeElement && document.activeElement.closest("form.filters"))) schedulePoll();
      else refresh();
    }, POLL_MS);
  }

  function refresh() {
    if (refreshing) {
      refreshAgain = true;
      return refreshing;
    }
    clearTimeout(pollTimer);
    refreshing = render().finally(() => {
      refreshing = null;
      if (refreshAgain) {
        refreshAgain = false;
        refresh();
      } else {
        schedulePoll();
      }
    });
    return refreshing;
  }

  async function render() {
    const seq = ++renderSeq;
    try {
      const where = route();
      const view = await VIEWS[where.view](where);
      if (seq !== renderSeq) return; // a newer render started meanwhile
      const main = $("main");
      const scroll = window.scrollY;
      main.replaceChildren(view);
      window.scrollTo(0, scroll);
      crumbs(where);
      lastGood = Date.now();
      $("live-dot").className = "dot ok";
      $("live-text").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (seq !== renderSeq || (err instanceof ApiError && err.status === 401)) return;
      $("live-dot").className = "dot bad";
      $("live-text").textContent = `refresh failed: ${err.message}`;
      if (!lastGood || err instanceof ApiError) $("main").replaceChildren(h("p", { class: "error", text: err.message }));
    }
  }

  function crumbs(where) {
    const items = [h("a", { href: "#/", text: "Scenarios" })];
    if (where.scenario) {
      items.push(h("a", { href: `#/s/${enc(where.scenario)}`, text: where.scenario }));
      if (where.view === "record") items.push(h("span", { text: `record ${short(where.id)}` }));
      if (where.view === "release") items.push(h("span", { text: `release ${short(where.id)}` }));
      if (where.view === "session") items.push(h("span", { text: `session ${where.id}` }));
    }
    $("crumbs").replaceChildren(...items.flatMap((el, i) => (i ? [h("span", { class: "sep", text: "›" }), el] : [el])));
  }

  // -- scenarios -------------------------------------------------------------------------

  function learnerOf(status, name) {
    const learner = (status.learning.learners || []).find((l) => l.scenario === name);
    if (learner) return { state: learner.state, learner };
    const idle = (status.learning.idle || []).find((l) => l.scenario === name);
    if (idle) return { state: "idle", reason: idle.reason };
    return { state: "none", reason: "its recipe does not learn" };
  }

  // a verdict as the chain keeps it ({decision, metrics}) or as a learner's status flattens it
  function verdictText(verdict, withDecision = true) {
    if (!verdict) return "—";
    const m = verdict.metrics || verdict;
    const parts = withDecision ? [verdict.decision] : [];
    if (m.candidate_score !== undefined) parts.push(`${fmtScore(m.current_score)} → ${fmtScore(m.candidate_score)}`);
    if (m.wins !== undefined) parts.push(`W${m.wins}/L${m.losses}/T${m.ties ?? 0}`);
    return parts.join(" · ");
  }

  async function scenariosView() {
    const [list, status] = await Promise.all([api("reef/scenarios"), api("reef/status")]);
    const rows = list.scenarios.map((sc) => {
      const l = learnerOf(status, sc.name);
      const verdict = (l.learner && l.learner.last_verdict) || sc.head.verdict;
      return h("tr", { testid: `scenario-${sc.name}` },
        h("td", {}, h("a", { href: `#/s/${enc(sc.name)}`, class: "strong", text: sc.name })),
        h("td", {}, pill(sc.recipe, "recipe")),
        h("td", {}, h("code", { text: short(sc.serving.release_id) }), ` step ${sc.head.step} · `, pill(sc.head.operation)),
        h("td", { title: l.reason || "" }, pill(l.state, "state"), l.reason ? h("div", { class: "muted small", text: l.reason }) : null),
        h("td", {}, verdictText(verdict)),
        h("td", { class: "num", testid: "records", text: sc.records }),
        h("td", { class: "num", testid: "reports", text: sc.reports }));
    });
    return h("div", {},
      h("div", { class: "cards" },
        card("Runtime", status.serving.runtime, status.serving.models.join(", ")),
        card("In flight", status.serving.in_flight, "requests being answered"),
        card("Records", status.storage.records, `${status.provenance.unverified_records} unverified since start`),
        card("Reports", status.storage.reports, "scores received"),
        card("Scenarios", status.storage.scenarios, `Reef ${status.version}`)),
      h("h1", { text: "Scenarios" }),
      list.scenarios.length
        ? h("table", { class: "grid", testid: "scenarios" },
          h("thead", {}, h("tr", {}, ["Scenario", "Recipe", "Serving release", "Learner", "Last verdict", "Records", "Reports"]
            .map((t) => h("th", { text: t })))),
          h("tbody", {}, rows))
        : h("p", { class: "muted", text: "No scenario yet: the first request names one (x-reef-scenario, default `default`)." }));
  }

  function card(title, value, note) {
    return h("div", { class: "card" }, h("div", { class: "muted small", text: title }),
      h("div", { class: "big", text: value }), h("div", { class: "muted small", text: note || "" }));
  }

  // -- one scenario ----------------------------------------------------------------------

  async function scenarioView(where) {
    const name = where.scenario;
    const [sc, status, fates] = await Promise.all([api(`reef/scenarios/${enc(name)}`), api("reef/status"),
      api(`reef/scenarios/${enc(name)}/candidates`)]);
    const l = learnerOf(status, name);
    const tabs = h("nav", { class: "tabs" }, Object.entries(TABS).map(([tab, label]) =>
      h("a", { href: `#/s/${enc(name)}/${tab}`, class: tab === where.tab ? "active" : "", testid: `tab-${tab}`, text: label })));
    const body = await (where.tab === "chain" ? chainTab(name, sc) : Reef.tabs[where.tab](name, sc, where, fates));
    const learner = l.learner;
    return h("div", {},
      h("h1", {}, name, " ", pill(sc.recipe, "recipe")),
      scenarioMode(status, sc),
      h("div", { class: "cards" },
        card("Serving", short(sc.serving.release_id), `step ${sc.head.step} · ${sc.head.operation}`),
        learnerCard(l, fates.counts),
        card("Last verdict", learner && learner.last_verdict ? learner.last_verdict.decision : (sc.head.verdict ? sc.head.verdict.decision : "—"),
          verdictText((learner && learner.last_verdict) || sc.head.verdict, false)),
        learner && learner.canary ? canaryCard(learner.canary) : null,
        card("Records", sc.records, `${sc.reports} reports`),
        card("Commit log", `step ${sc.step}`, `learner cursor ${sc.learner.high_water}${sc.learner.open_batches.length ? ` · ${sc.learner.open_batches.length} open batch(es)` : ""}`)),
      tabs, body);
  }

  // The counts come from the commit log, so they survive a restart; the state from the learner.
  function learnerCard(l, c) {
    const parts = [`${c.published} published`, `${c.rejected} rejected`, `${c.abandoned} abandoned`, `${c.withdrawn} withdrawn`];
    if (c.pending_review) parts.splice(1, 0, `${c.pending_review} pending review`);
    const el = card("Learner", l.state, `${parts.join(" · ")}${l.learner ? "" : ` · ${l.reason || ""}`}`);
    el.setAttribute("data-testid", "learner-card");
    return el;
  }

  // How this scenario learns, where the server says it (the scenario's `training_mode` and
  // `instructions`; `/reef/status`'s `recipes` and learners); nothing where it says nothing.
  function scenarioMode(status, sc) {
    const entries = [sc, ...[status.recipes, status.learning && status.learning.learners, status.learning && status.learning.idle,
      status.scenarios].filter(Array.isArray).flat().filter((e) => e && e.scenario === sc.name)];
    const given = (v) => v !== undefined && v !== null && v !== "" && !(Array.isArray(v) && !v.length);
    const find = (key) => entries.map((e) => e[key]).find(given);
    const mode = find("training_mode"), instructions = find("instructions"), why = find("why");
    if (!mode && !instructions && !why) return null;
    const said = (i) => (typeof i === "string" ? i : [i.instruction || i.text || i.instruction_id, i.state || i.status]
      .filter(Boolean).join(" · "));
    return h("div", { class: "mode small", testid: "scenario-mode" },
      mode ? [h("span", { class: "muted", text: "training mode" }), pill(String(mode), "state")] : null,
      instructions ? [h("span", { class: "muted", text: "instructions" }),
        h("span", { testid: "instructions", text: [instructions].flat().map(said).join("; ") })] : null,
      why ? h("span", { class: "muted", text: `recipe ${sc.recipe}: ${why}` }) : null);
  }

  function canaryCard(c) {
    const mean = (x) => (x === null || x === undefined ? "—" : Number(x).toFixed(2));
    const value = c.running ? `${Math.round(c.fraction * 100)}% · ${releaseLabel(c.release_id)}` : `${Math.round(c.fraction * 100)}% · idle`;
    const el = card("Canary", value,
      `live mean ${mean(c.mean)} (${c.scores}) vs serving ${mean(c.serving_mean)} (${c.serving_scores}) · ${c.withdrawn} withdrawn`);
    el.setAttribute("data-testid", "canary");
    return el;
  }

  function madeBy(r) {
    switch (r.operation) {
      case "creation": return r.parent_release_id ? `created from release ${short(r.parent_release_id)}` : "the scenario's first release";
      case "training": {
        const p = r.metrics && r.metrics.proposal;
        const what = p && p.mutations ? ` (${p.mutations.map((m) => `${m.op} ${m.kind || ""} ${m.name || ""}`.trim()).join(", ")})` : "";
        return `the learner's candidate, selected by the gate${what}`;
      }
      case "rollback": return `a rollback to release ${short(r.rollback_target_release_id)}`;
      case "promote": return "promoted by an operator after review";
      case "rejection": return "a candidate the gate refused";
      default: return r.operation;
    }
  }

  function metricsList(m) {
    if (!m) return null;
    const keys = ["gate", "current_score", "candidate_score", "gain", "p_value", "wins", "losses", "ties", "n", "candidate_success"];
    const shown = keys.filter((k) => m[k] !== undefined && m[k] !== null);
    if (!shown.length) return null;
    return h("dl", { class: "metrics" }, shown.map((k) => [h("dt", { text: k }), h("dd", { text: SCORE_KEYS.has(k) ? fmtScore(m[k]) : fmtNum(m[k]) })]));
  }

  async function chainTab(name, sc) {
    const [chain, decisions, curve] = await Promise.all([
      api(`reef/scenarios/${enc(name)}/releases`), api(`reef/scenarios/${enc(name)}/decisions`),
      api(`reef/scenarios/${enc(name)}/curve`)]);
    const kinds = Object.fromEntries(curve.releases.map((p) => [p.release_id, p.kind]));
    const promoted = new Set(chain.releases.filter((r) => r.operation === "promote").map((r) => r.content_id));
    const items = chain.releases.map((r) => ({ ...r, isRelease: true }));
    for (const d of decisions.decisions) {
      if (d.operation === "rejection" && !(d.verdict && d.verdict.decision === "review")) {
        items.push({ step: d.step, operation: "rejection", verdict: d.verdict, metrics: d.metrics, recorded_at: d.recorded_at,
          release_id: d.release_id, content_id: d.content_id });
      }
    }
    items.sort((a, b) => b.step - a.step);
    const head = chain.head;
    const serving = sc.serving.release_id;
    const lis = items.map((r) => {
      const isHead = r.isRelease && r.release_id === head;
      const canRollback = r.isRelease && !r.pending && !isHead;
      const canPromote = r.isRelease && r.pending && !promoted.has(r.content_id);
      return h("li", { class: `node ${r.operation}${r.pending ? " pending" : ""}`, testid: r.isRelease ? "release" : "rejection",
        "data-step": r.step, "data-release": r.isRelease ? r.release_id : "" },
        h("div", { class: "marker", text: r.step }),
        h("div", { class: "body" },
          h("div", { class: "row" },
            pill(r.operation),
            r.isRelease ? pill(kinds[r.release_id] || "?", "kind") : null,
            r.isRelease ? h("a", { href: `#/s/${enc(name)}/release/${enc(r.release_id)}`, class: "mono", text: short(r.release_id) })
              : h("span", { class: "mono muted", text: `candidate ${short(r.content_id && r.content_id.replace("sha256:", ""))}` }),
            isHead ? pill("head", "head") : null,
            r.isRelease && r.release_id === serving ? pill("serving", "serving") : null,
            r.pending ? pill(promoted.has(r.content_id) ? "promoted" : "pending review", "pending") : null,
            h("span", { class: "muted small", text: `${fmtTime(r.recorded_at)} (${ago(r.recorded_at)})` })),
          h("div", { class: "small", text: madeBy(r) }),
          r.verdict ? h("div", { class: "small" }, "verdict: ", h("strong", { text: r.verdict.decision })) : null,
          metricsList(r.verdict && r.verdict.metrics),
          h("div", { class: "actions" },
            r.isRelease ? h("a", { class: "button secondary", href: `#/s/${enc(name)}/release/${enc(r.release_id)}`, text: "Diff" }) : null,
            canRollback ? h("button", { type: "button", class: "secondary", testid: "rollback", text: "Roll back to this",
              onclick: () => confirmChange("rollback", name, r, head) }) : null,
            canPromote ? h("button", { type: "button", testid: "promote", text: "Promote",
              onclick: () => confirmChange("promote", name, r, head) }) : null)));
    });
    return h("section", {},
      h("p", { class: "muted", text: `${chain.releases.length} releases, newest first; refused candidates in grey. The head is the release the chain serves.` }),
      h("ol", { class: "timeline", testid: "chain" }, lis));
  }

  // -- rollback and promote, with a preview and a confirmation ----------------------------

  function confirmChange(action, name, target, expectedHead) {
    const dialog = $("confirm");
    const ok = $("confirm-ok");
    const conflict = $("confirm-conflict");
    const error = $("confirm-error");
    conflict.hidden = true;
    error.hidden = true;
    ok.hidden = false;
    ok.disabled = true;
    ok.textContent = action === "rollback" ? "Roll back" : "Promote";
    $("confirm-cancel").textContent = "Cancel";
    $("confirm-title").textContent = action === "rollback"
      ? `Roll back ${name} to step ${target.step}?` : `Promote step ${target.step} of ${name}?`;
    const body = $("confirm-body");
    body.replaceChildren(
      h("p", { testid: "confirm-summary", text: action === "rollback"
        ? `A new release will republish the content of release ${short(target.release_id)} (step ${target.step}) on top of the head ${short(expectedHead)}, and Reef will serve it. Nothing is deleted: the chain grows by one.`
        : `Release ${short(target.release_id)} (step ${target.step}) was selected by the gate and held for review. Promoting publishes it on top of the head ${short(expectedHead)} and Reef serves it.` }),
      h("p", { class: "muted", text: "Loading what changes…" }));
    dialog.showModal();
    api(`reef/scenarios/${enc(name)}/compare?base=${enc(expectedHead)}&target=${enc(target.release_id)}`)
      .then((diff) => {
        body.lastChild.replaceWith(h("div", { testid: "preview" },
          h("h3", { text: diff.same_content ? "The served content stays the same (same content id)." : `What changes for requests (${diff.changed.length} file${diff.changed.length === 1 ? "" : "s"}):` }),
          diff.same_content ? null : Reef.renderDiff(diff.diff, diff.changed)));
        ok.disabled = false;
      })
      .catch((err) => { body.lastChild.replaceWith(h("p", { class: "error", text: `No preview: ${err.message}` })); ok.disabled = false; });

    ok.onclick = async () => {
      ok.disabled = true;
      try {
        const result = await api(`reef/scenarios/${enc(name)}/${action}`, { method: "POST",
          json: { release_id: target.release_id, expected_head: expectedHead } });
        dialog.close();
        toast(`${action === "rollback" ? "Rolled back" : "Promoted"}: release ${short(result.release.release_id)} (step ${result.release.step}) now serves ${name}.`);
        refresh();
      } catch (err) {
        if (err instanceof ApiError && err.status === 409) {
          conflict.hidden = false;
          conflict.replaceChildren(
            h("strong", { text: `Conflict: someone moved the head of ${name} since this preview.` }),
            h("span", { text: ` Nothing was changed: the head is no longer ${short(expectedHead)}. Close this, look at the chain again, and retry if you still want to.` }),
            h("span", { class: "detail", text: `Server (409): ${err.message}` }));
          ok.hidden = true;
          $("confirm-cancel").textContent = "Close";
        } else if (!(err instanceof ApiError && err.status === 401)) {
          error.hidden = false;
          error.textContent = `Failed (${err.status || "network"}): ${err.message}`;
          ok.disabled = false;
        }
      }
    };
  }

  function toast(text) {
    const el = $("toast");
    el.textContent = text;
    el.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { el.hidden = true; }, 6000);
  }

  const VIEWS = { scenarios: scenariosView, scenario: scenarioView };
  const Reef = (window.Reef = { views: VIEWS, tabs: {} }); // the other files add their tabs and views
  Object.assign(Reef, { h, s, api, ApiError, enc, short, pill, card, fmtNum, fmtScore, fmtTime, ago, releaseLabel,
    verdictText, metricsList, madeBy, refresh });

  // -- start -----------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", signIn);
    $("logout").addEventListener("click", () => signOut(""));
    $("confirm-cancel").addEventListener("click", () => { $("confirm").close(); refresh(); });
    $("confirm").addEventListener("close", () => refresh());
    window.addEventListener("hashchange", () => { if (sessionStorage.getItem(TOKEN_KEY) !== null) refresh(); });
    if (sessionStorage.getItem(TOKEN_KEY) !== null) start();
    else openWithoutToken();
  });

  // A server without tokens answers without one: no sign-in then (it serves the page only to a
  // loopback or its own host, http.md). Any other answer shows the sign-in.
  async function openWithoutToken() {
    try {
      const response = await fetch(new URL("reef/status", API), { cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" });
      if (response.ok) {
        sessionStorage.setItem(TOKEN_KEY, "");
        start();
        return;
      }
      showLogin(response.status === 401 ? "" : `The server answered ${response.status}; sign in to retry.`);
    } catch (err) {
      showLogin(`Cannot reach the server: ${err.message}`);
    }
  }
})();
