// Reef's dashboard: the records tab (filters, pages), one conversation and one record.
// Registers with app.js through window.Reef; values from the server are written with
// textContent, never parsed as HTML.
"use strict";

(() => {
  const Reef = window.Reef;
  const { h, api, enc, short, pill, card, fmtScore, fmtTime, ago, releaseLabel } = Reef;

  const FILTERS = [ // [query parameter, label, input type, placeholder]
    ["session", "Session", "text", "id"], ["client", "Client", "text", "user agent contains"],
    ["release_id", "Release", "text", "release id"], ["status", "Status", "select", ""],
    ["min_score", "Score ≥", "number", ""], ["max_score", "Score ≤", "number", ""], ["scored", "Reported", "select", ""],
  ];
  const CHOICES = { status: ["", "complete", "incomplete", "in_progress"], scored: ["", "true", "false"] };

  // The filters and the page live in the link (`#/s/<name>/records/<query>`): a filtered view can be shared and reloaded.
  function recordsQuery(where) {
    return new URLSearchParams(where.query && where.query.length ? where.query.join("/") : "");
  }

  function recordsLink(name, params) {
    const kept = new URLSearchParams([...params].filter(([, v]) => v !== ""));
    const qs = kept.toString();
    return `#/s/${enc(name)}/records${qs ? `/${enc(qs)}` : ""}`;
  }

  async function recordsTab(name, sc, where) {
    const params = recordsQuery(where);
    const ask = new URLSearchParams(params);
    ask.set("limit", "50");
    const data = await api(`reef/scenarios/${enc(name)}/records?${ask}`);
    const filtered = [...params.keys()].some((k) => k !== "before_seq");
    const older = new URLSearchParams(params);
    if (data.next_before_seq !== null) older.set("before_seq", String(data.next_before_seq));
    const newest = new URLSearchParams(params);
    newest.delete("before_seq");
    return h("section", {},
      filterForm(name, params),
      h("div", { class: "pager" },
        h("span", { class: "muted small", testid: "records-summary", text: `${data.records.length} record${data.records.length === 1 ? "" : "s"}${params.has("before_seq") ? ` older than #${params.get("before_seq")}` : ", newest first"}${filtered ? " (filtered)" : ""}` }),
        params.has("before_seq") ? h("a", { class: "button secondary", href: recordsLink(name, newest), testid: "records-newest", text: "Newest" }) : null,
        data.next_before_seq !== null ? h("a", { class: "button secondary", href: recordsLink(name, older), testid: "records-older", text: "Older →" }) : null),
      data.records.length ? recordsTable(name, data.records) : h("p", { class: "muted", text: filtered ? "No record matches." : "No records yet." }));
  }

  function filterForm(name, params) {
    const inputs = FILTERS.map(([key, label, type, placeholder]) => {
      const input = type === "select"
        ? h("select", { name: key, testid: `filter-${key}` }, CHOICES[key].map((v) => h("option", { value: v, text: v || "any", selected: params.get(key) === v })))
        : h("input", { name: key, type, step: "any", placeholder, value: params.get(key) || "", testid: `filter-${key}`, size: type === "number" ? 5 : 14 });
      return h("label", {}, h("span", { class: "muted small", text: label }), input);
    });
    const form = h("form", { class: "filters", testid: "record-filters", autocomplete: "off" }, inputs,
      h("button", { type: "submit", testid: "filter-apply", text: "Filter" }),
      h("a", { class: "button secondary", href: recordsLink(name, new URLSearchParams()), text: "Clear" }));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const next = new URLSearchParams();
      for (const [key] of FILTERS) next.set(key, form.elements[key].value.trim());
      document.activeElement.blur();
      location.hash = recordsLink(name, next);
    });
    return form;
  }

  // "claude-cli/2.1.0 (external, cli)" -> "claude-cli/2.1.0": the product, the rest in the tooltip
  const clientName = (ua) => (ua ? ua.split(" ")[0] : "—");

  function recordsTable(name, records) {
    return h("table", { class: "grid", testid: "records" },
      h("thead", {}, h("tr", {}, ["Receipt", "When", "Release", "Session", "Client", "Prompt → answer", "Score", "Feedback", "Latency", "Verified"]
        .map((t) => h("th", { text: t })))),
      h("tbody", {}, records.map((r) => recordRow(name, r))));
  }

  function recordRow(name, r) {
    return h("tr", { testid: "record-row", "data-record": r.id },
      h("td", {}, h("a", { class: "mono", href: `#/s/${enc(name)}/record/${enc(r.id)}`, text: short(r.id) }),
        r.status !== "complete" ? pill(r.status, "warn") : null),
      h("td", { class: "small", text: ago(r.created_at) }),
      h("td", {}, h("code", { text: releaseLabel(r.release_id) })),
      h("td", { class: "small" }, r.session ? h("a", { href: `#/s/${enc(name)}/session/${enc(r.session)}`, testid: "session-link", text: r.session }) : "—"),
      h("td", { class: "small", testid: "client", title: r.client || "", text: clientName(r.client) }),
      h("td", { class: "small clip" }, h("span", { text: r.prompt }), h("span", { class: "muted", text: " → " }), h("span", { text: r.error || r.answer })),
      h("td", { class: "num", text: fmtScore(r.score) }),
      h("td", { class: "small clip", text: feedbackText(r.feedback) }),
      h("td", { class: "num", text: r.latency_s === null ? "—" : `${(r.latency_s * 1000).toFixed(0)} ms` }),
      h("td", {}, r.verified ? pill("verified", "ok") : pill("unverified", "muted")));
  }

  // -- one conversation ------------------------------------------------------------------

  async function sessionView(where) {
    const data = await api(`reef/scenarios/${enc(where.scenario)}/sessions/${enc(where.id)}`);
    const turns = data.turns;
    const scored = turns.filter((t) => t.score !== null);
    return h("div", { testid: "session" },
      h("h1", {}, "Session ", h("code", { text: where.id })),
      h("div", { class: "cards" },
        card("Turns", turns.length, turns.length ? `${fmtTime(turns[0].created_at)} → ${fmtTime(turns[turns.length - 1].created_at)}` : ""),
        card("Scored", scored.length, scored.length ? `mean ${fmtScore(scored.reduce((a, t) => a + t.score, 0) / scored.length)}` : "no report yet"),
        card("Client", clientName(turns.length ? turns[0].client : null), turns.length ? turns[0].client || "" : "")),
      h("ol", { class: "turns", testid: "turns" }, turns.map((t, i) => h("li", { testid: "turn", "data-record": t.id },
        h("div", { class: "row small muted" }, `turn ${i + 1} · `, h("a", { class: "mono", href: `#/s/${enc(where.scenario)}/record/${enc(t.id)}`, text: short(t.id) }),
          ` · ${fmtTime(t.created_at)} · ${t.messages} message${t.messages === 1 ? "" : "s"} sent · release `, h("code", { text: releaseLabel(t.release_id) }),
          t.score !== null ? [" · score ", h("strong", { text: fmtScore(t.score) })] : null),
        h("div", { class: "msg user" }, h("div", { class: "role", text: "user" }), h("pre", { text: t.prompt })),
        h("div", { class: "msg assistant" }, h("div", { class: "role", text: "assistant" }), h("pre", { text: t.error || t.answer }))))));
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
        card("Client", clientName(r.client), r.client || "the client sent no User-Agent"),
        card("Latency", latency === undefined ? "—" : `${(latency * 1000).toFixed(1)} ms`, req.dialect ? `${req.dialect} dialect · model ${req.model}` : ""),
        card("Tokens", data.verified ? "verified" : "unverified", r.token_ids
          ? `${r.token_ids.length} tokens in ${r.spans.length} span(s)` : "the runtime gave no token ids")),
      r.session ? h("p", {}, h("a", { href: `#/s/${enc(r.scenario)}/session/${enc(r.session)}`, text: `All turns of session ${r.session} →` })) : null,
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

  Object.assign(Reef.tabs, { records: recordsTab });
  Object.assign(Reef.views, { record: recordView, session: sessionView });
})();
