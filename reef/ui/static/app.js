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
      return { view: "scenario", scenario, tab: ["chain", "curve", "records"].includes(parts[2]) ? parts[2] : "chain" };
    }
    return { view: "scenarios" };
  }

  function start() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("live").hidden = false;
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
      if (document.hidden || $("confirm").open) schedulePoll();
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
    const [sc, status] = await Promise.all([api(`reef/scenarios/${enc(name)}`), api("reef/status")]);
    const l = learnerOf(status, name);
    const tabs = h("nav", { class: "tabs" }, ["chain", "curve", "records"].map((tab) =>
      h("a", { href: `#/s/${enc(name)}/${tab}`, class: tab === where.tab ? "active" : "", testid: `tab-${tab}`,
        text: { chain: "Release chain", curve: "Learning curve", records: "Records" }[tab] })));
    const body = await { chain: chainTab, curve: curveTab, records: recordsTab }[where.tab](name, sc);
    const learner = l.learner;
    return h("div", {},
      h("h1", {}, name, " ", pill(sc.recipe, "recipe")),
      h("div", { class: "cards" },
        card("Serving", short(sc.serving.release_id), `step ${sc.head.step} · ${sc.head.operation}`),
        card("Learner", l.state, learner ? `${learner.published} published · ${learner.rejected} rejected · ${learner.candidates} candidates` : (l.reason || "")),
        card("Last verdict", learner && learner.last_verdict ? learner.last_verdict.decision : (sc.head.verdict ? sc.head.verdict.decision : "—"),
          verdictText((learner && learner.last_verdict) || sc.head.verdict, false)),
        learner && learner.canary ? canaryCard(learner.canary) : null,
        card("Records", sc.records, `${sc.reports} reports`),
        card("Commit log", `step ${sc.step}`, `learner cursor ${sc.learner.high_water}${sc.learner.open_batches.length ? ` · ${sc.learner.open_batches.length} open batch(es)` : ""}`)),
      tabs, body);
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

  // -- the learning curve (inline SVG) ---------------------------------------------------

  async function curveTab(name) {
    const curve = await api(`reef/scenarios/${enc(name)}/curve`);
    const points = curve.releases;
    return h("section", {},
      h("p", { class: "muted", text: "Gate score of each published release (blue dots, dashed while it serves) and the mean reported score of the traffic it served (orange bars over the time it served)." }),
      curveSvg(points),
      h("table", { class: "grid", testid: "curve-table" },
        h("thead", {}, h("tr", {}, ["Step", "Release", "Operation", "Kind", "Published", "Gate score", "Live mean", "Reports", "Records"].map((t) => h("th", { text: t })))),
        h("tbody", {}, points.slice().reverse().map((p) => h("tr", {},
          h("td", { class: "num", text: p.step }),
          h("td", {}, h("a", { class: "mono", href: `#/s/${enc(name)}/release/${enc(p.release_id)}`, text: short(p.release_id) })),
          h("td", {}, pill(p.operation)), h("td", { text: p.kind || "—" }),
          h("td", { text: fmtTime(p.recorded_at) }),
          h("td", { class: "num", text: fmtScore(p.gate_score) }), h("td", { class: "num", text: fmtScore(p.live_mean) }),
          h("td", { class: "num", text: p.reports }), h("td", { class: "num", text: p.records }))))));
  }

  function curveSvg(points) {
    const W = 860, H = 320, L = 52, R = 16, T = 40, B = 40;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "curve", role: "img", "aria-label": "learning curve", "data-testid": "curve" });
    if (!points.length) return svg;
    const now = Date.now() / 1000;
    const t0 = points[0].recorded_at;
    const t1 = Math.max(now, ...points.map((p) => p.recorded_at)) || t0 + 1;
    const values = points.flatMap((p) => [p.gate_score, p.live_mean]).filter((v) => v !== null && v !== undefined);
    let lo = Math.min(0, ...values), hi = Math.max(1, ...values);
    if (hi - lo < 1e-9) hi = lo + 1;
    const x = (t) => L + ((t - t0) / Math.max(t1 - t0, 1e-6)) * (W - L - R);
    const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
    for (let i = 0; i <= 4; i++) { // grid and y labels
      const v = lo + ((hi - lo) * i) / 4;
      svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "gridline" }),
        s("text", { x: L - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, v.toFixed(2)));
    }
    svg.append(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axisline" }));
    for (const t of [t0, (t0 + t1) / 2, t1]) {
      svg.append(s("text", { x: x(t), y: H - B + 16, class: "axis", "text-anchor": t === t0 ? "start" : t === t1 ? "end" : "middle" },
        fmtTime(t).slice(11)));
    }
    for (const p of points) { // releases: a tick each
      svg.append(s("line", { x1: x(p.recorded_at), x2: x(p.recorded_at), y1: T, y2: H - B, class: "tick" }),
        s("text", { x: x(p.recorded_at) + 3, y: H - B + 30, class: "axis small" }, `#${p.step}`));
    }
    for (const p of points) { // live mean: a bar over the time the release served
      if (p.live_mean === null || p.live_mean === undefined) continue;
      const end = p.served_until || t1;
      svg.append(s("line", { x1: x(p.recorded_at), x2: Math.max(x(end), x(p.recorded_at) + 3), y1: y(p.live_mean), y2: y(p.live_mean), class: "live-bar" },
        s("title", {}, `step ${p.step}: live mean ${fmtScore(p.live_mean)} over ${p.reports} reports`)));
    }
    const gated = points.filter((p) => p.gate_score !== null && p.gate_score !== undefined);
    for (const p of gated) { // the gate's score holds while the release serves
      svg.append(s("line", { x1: x(p.recorded_at), x2: x(p.served_until || t1), y1: y(p.gate_score), y2: y(p.gate_score), class: "gate-line" }));
    }
    for (const p of gated) {
      svg.append(s("circle", { cx: x(p.recorded_at), cy: y(p.gate_score), r: 5, class: "gate-dot" },
        s("title", {}, `step ${p.step} (${p.operation}): gate score ${fmtScore(p.gate_score)}`)));
    }
    svg.append(s("g", { transform: `translate(${W - R - 250}, 8)` },
      s("rect", { x: 0, y: 0, width: 250, height: 22, class: "legend-bg" }),
      s("circle", { cx: 12, cy: 11, r: 5, class: "gate-dot" }), s("text", { x: 22, y: 15, class: "axis" }, "gate score"),
      s("line", { x1: 112, x2: 132, y1: 11, y2: 11, class: "live-bar" }), s("text", { x: 138, y: 15, class: "axis" }, "live mean score")));
    return svg;
  }

  // -- records ---------------------------------------------------------------------------

  async function recordsTab(name) {
    const data = await api(`reef/scenarios/${enc(name)}/records?limit=50`);
    if (!data.records.length) return h("p", { class: "muted", text: "No records yet." });
    return h("table", { class: "grid", testid: "records" },
      h("thead", {}, h("tr", {}, ["Receipt", "When", "Release", "Session", "Prompt → answer", "Score", "Feedback", "Latency", "Verified"]
        .map((t) => h("th", { text: t })))),
      h("tbody", {}, data.records.map((r) => h("tr", { testid: "record-row", "data-record": r.id },
        h("td", {}, h("a", { class: "mono", href: `#/s/${enc(name)}/record/${enc(r.id)}`, text: short(r.id) }),
          r.status !== "complete" ? pill(r.status, "warn") : null),
        h("td", { class: "small", text: ago(r.created_at) }),
        h("td", {}, h("code", { text: releaseLabel(r.release_id) })),
        h("td", { class: "small", text: r.session || "—" }),
        h("td", { class: "small clip" }, h("span", { text: r.prompt }), h("span", { class: "muted", text: " → " }), h("span", { text: r.error || r.answer })),
        h("td", { class: "num", text: fmtScore(r.score) }),
        h("td", { class: "small clip", text: feedbackText(r.feedback) }),
        h("td", { class: "num", text: r.latency_s === null ? "—" : `${(r.latency_s * 1000).toFixed(0)} ms` }),
        h("td", {}, r.verified ? pill("verified", "ok") : pill("unverified", "muted"))))));
  }

  const feedbackText = (f) => (f === null || f === undefined ? "" : typeof f === "string" ? f : JSON.stringify(f));

  async function recordView(where) {
    const data = await api(`reef/records/${enc(where.id)}`);
    const r = data.record;
    const req = r.request || {};
    const resp = r.response || {};
    const messages = (req.messages || []).map((m) => h("div", { class: `msg ${m.role}` },
      h("div", { class: "role", text: m.role + (m.name ? ` (${m.name})` : "") }),
      h("pre", { text: typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 2) }),
      m.tool_calls && m.tool_calls.length ? h("pre", { class: "small", text: JSON.stringify(m.tool_calls, null, 2) }) : null));
    const latency = r.timings && r.timings.duration_s;
    return h("div", { testid: "record" },
      h("h1", {}, "Record ", h("code", { text: r.id })),
      h("div", { class: "cards" },
        card("Status", r.status, r.error || ""),
        card("Release", releaseLabel(r.release && r.release.release_id), r.release ? `load ${r.release.runtime_load_id || "—"}` : ""),
        card("Session", r.session || "—", Object.entries(r.tags || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
        card("Latency", latency === undefined ? "—" : `${(latency * 1000).toFixed(1)} ms`, req.dialect ? `${req.dialect} dialect · model ${req.model}` : ""),
        card("Tokens", data.verified ? "verified" : "unverified", r.token_ids
          ? `${r.token_ids.length} tokens in ${r.spans.length} span(s)` : "the runtime gave no token ids")),
      h("h2", { text: "Request" }),
      req.tools && req.tools.length ? h("p", { class: "small muted", text: `tools: ${req.tools.map((t) => t.name).join(", ")}` }) : null,
      h("div", { class: "conversation", testid: "conversation" }, messages),
      h("h2", { text: "Response" }),
      h("div", { class: "msg assistant" },
        h("div", { class: "role", text: `assistant · finish ${resp.finish_reason || "—"}` }),
        h("pre", { testid: "response-text", text: resp.text || "" }),
        resp.tool_calls && resp.tool_calls.length ? h("pre", { class: "small", text: JSON.stringify(resp.tool_calls, null, 2) }) : null,
        resp.usage ? h("div", { class: "small muted", text: `usage: ${JSON.stringify(resp.usage)}` }) : null),
      r.harness ? [h("h2", { text: "Harness added (inject mode)" }), h("pre", { class: "small", text: JSON.stringify(r.harness, null, 2) })] : null,
      h("h2", { text: `Reports (${data.reports.length})` }),
      data.reports.length
        ? h("table", { class: "grid", testid: "reports" },
          h("thead", {}, h("tr", {}, ["Report", "When", "Score", "Feedback", "Metadata"].map((t) => h("th", { text: t })))),
          h("tbody", {}, data.reports.map((p) => h("tr", {},
            h("td", { class: "mono", text: short(p.id) }), h("td", { class: "small", text: fmtTime(p.created_at) }),
            h("td", { class: "num", text: fmtScore(p.score) }), h("td", { text: feedbackText(p.feedback) }),
            h("td", { class: "small mono", text: Object.keys(p.metadata || {}).length ? JSON.stringify(p.metadata) : "" })))))
        : h("p", { class: "muted", text: "No report names this record yet." }),
      h("details", {}, h("summary", { text: "The whole record as JSON" }), h("pre", { class: "small", text: JSON.stringify(data, null, 2) })));
  }

  // -- a release and its diff ------------------------------------------------------------

  async function releaseView(where) {
    const name = where.scenario;
    const [chain, diff] = await Promise.all([api(`reef/scenarios/${enc(name)}/releases`),
      api(`reef/scenarios/${enc(name)}/releases/${enc(where.id)}/diff`)]);
    const r = chain.releases.find((x) => x.release_id === where.id);
    if (!r) throw new Error(`no release ${where.id} in ${name}`);
    const perTask = r.verdict && r.verdict.metrics && r.verdict.metrics.per_task;
    return h("div", { testid: "release-view" },
      h("h1", {}, `Step ${r.step} `, pill(r.operation), " ", h("code", { text: r.release_id })),
      h("p", { text: madeBy(r) }),
      h("div", { class: "cards" },
        card("Parent", short(r.parent_release_id), r.parent_release_id ? "the diff is against it" : "diffed against nothing"),
        card("Content", short((r.content_id || "").replace("sha256:", "")), r.content_id),
        card("Verdict", r.verdict ? r.verdict.decision : "—", verdictText(r.verdict)),
        card("Published", fmtTime(r.recorded_at), r.pending ? "pending review" : ago(r.recorded_at))),
      metricsList(r.verdict && r.verdict.metrics),
      perTask && perTask.length ? h("details", {}, h("summary", { text: `Gate tasks (${perTask.length})` }),
        h("table", { class: "grid" }, h("thead", {}, h("tr", {}, ["Task", "Current", "Candidate", "Current answer", "Candidate answer"].map((t) => h("th", { text: t })))),
          h("tbody", {}, perTask.map((t) => h("tr", {}, h("td", { class: "small", text: taskLabel(t) }),
            h("td", { class: "num", text: fmtNum(t.current) }), h("td", { class: "num", text: fmtNum(t.candidate) }),
            h("td", { class: "small", text: t.current_answer || "" }), h("td", { class: "small", text: t.candidate_answer || "" })))))) : null,
      h("h2", { text: `Changed against its parent (${diff.changed.length} file${diff.changed.length === 1 ? "" : "s"})` }),
      renderDiff(diff.diff, diff.changed));
  }

  // A gate task: the harness gate names it by an excerpt, the weights gate by its place in the
  // tasks file (from 0, blank lines skipped).
  function taskLabel(t) {
    if (t.task) return t.task;
    return t.index === undefined || t.index === null ? "" : `#${t.index}`;
  }

  // A unified diff, file by file: text files line by line, LFS files (adapter weights) as a
  // summary of the pointer change (size and hash), never as bytes.
  function renderDiff(text, changed) {
    if (!text.trim()) return h("p", { class: "muted", testid: "diff", text: changed && changed.length ? "Only binary changes." : "No content change." });
    const files = [];
    let cur = null;
    for (const line of text.split("\n")) {
      const m = line.match(/^diff --git a\/(.*) b\/(.*)$/);
      if (m) { cur = { path: m[2], lines: [] }; files.push(cur); continue; }
      if (cur) cur.lines.push(line);
    }
    return h("div", { testid: "diff" }, files.map((f) => {
      const lfs = f.lines.some((l) => /^[ +-]version https:\/\/git-lfs/.test(l));
      const head = h("div", { class: "file-head mono", text: f.path });
      if (lfs) {
        const get = (sign, key) => { const l = f.lines.find((x) => x.startsWith(`${sign}${key} `)); return l ? l.slice(key.length + 2) : null; };
        const size = (v) => (v === null ? "nothing" : `${(Number(v) / 1024).toFixed(1)} KiB`);
        const oid = (v) => (v === null ? "" : ` (${v.replace("sha256:", "").slice(0, 12)})`);
        return h("div", { class: "file" }, head, h("p", { class: "summary" }, "adapter weights (LFS): ",
          `${size(get("-", "size"))}${oid(get("-", "oid"))} → ${size(get("+", "size"))}${oid(get("+", "oid"))}`));
      }
      const body = f.lines.filter((l) => !/^(index |--- |\+\+\+ |new file mode|deleted file mode)/.test(l));
      return h("div", { class: "file" }, head, h("pre", { class: "diff" }, body.map((l) =>
        h("span", { class: l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : l.startsWith("@@") ? "hunk" : "", text: `${l}\n` }))));
    }));
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
          diff.same_content ? null : renderDiff(diff.diff, diff.changed)));
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

  const VIEWS = { scenarios: scenariosView, scenario: scenarioView, record: recordView, release: releaseView };

  // -- start -----------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", signIn);
    $("logout").addEventListener("click", () => signOut(""));
    $("confirm-cancel").addEventListener("click", () => { $("confirm").close(); refresh(); });
    $("confirm").addEventListener("close", () => refresh());
    window.addEventListener("hashchange", () => { if (sessionStorage.getItem(TOKEN_KEY) !== null) refresh(); });
    if (sessionStorage.getItem(TOKEN_KEY) !== null) start();
    else showLogin("");
  });
})();
