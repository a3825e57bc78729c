// Reef's dashboard: the learning curve tab (inline SVG). Registers with app.js through
// window.Reef; values from the server are written with textContent, never parsed as HTML.
"use strict";

(() => {
  const Reef = window.Reef;
  const { h, s, api, enc, short, pill, fmtScore, fmtTime } = Reef;

  // Published releases (their gate score, the live mean of what they served) and, marked apart,
  // the canaries: a candidate under test that served a share of the traffic before its verdict.
  async function curveTab(name, sc, where, fates) {
    const curve = await api(`reef/scenarios/${enc(name)}/curve`);
    const points = curve.releases;
    const canaries = fates.candidates.filter((c) => c.canary).reverse(); // oldest first
    return h("section", {},
      h("p", { class: "muted", text: "Gate score of each published release (blue dots, dashed while it serves), the mean reported score of the traffic it served (orange bars over the time it served), and each canary's (purple: a candidate under test, from its batch to its verdict)." }),
      curveSvg(points, canaries),
      h("table", { class: "grid", testid: "curve-table" },
        h("thead", {}, h("tr", {}, ["Step", "Release", "Operation", "Kind", "Published", "Gate score", "Live mean", "Reports", "Records"].map((t) => h("th", { text: t })))),
        h("tbody", {}, points.slice().reverse().map((p) => h("tr", {},
          h("td", { class: "num", text: p.step }),
          h("td", {}, h("a", { class: "mono", href: `#/s/${enc(name)}/release/${enc(p.release_id)}`, text: short(p.release_id) })),
          h("td", {}, pill(p.operation)), h("td", { text: p.kind || "—" }),
          h("td", { text: fmtTime(p.recorded_at) }),
          h("td", { class: "num", text: fmtScore(p.gate_score) }), h("td", { class: "num", text: fmtScore(p.live_mean) }),
          h("td", { class: "num", text: p.reports }), h("td", { class: "num", text: p.records }))))),
      canaries.length ? [h("h2", { text: `Canaries (${canaries.length})` }),
        h("table", { class: "grid", testid: "canary-table" },
          h("thead", {}, h("tr", {}, ["Batch", "Fate", "Served from", "Live mean", "Reports", "Records"].map((t) => h("th", { text: t })))),
          h("tbody", {}, canaries.slice().reverse().map((c) => h("tr", {},
            h("td", { class: "mono", text: `canary ${short(c.batch_id)}` }),
            h("td", {}, pill(c.fate, fateClass(c.fate)), c.withdrawn ? pill("withdrawn", "rejection") : null),
            h("td", { text: fmtTime(c.begun_at) }),
            h("td", { class: "num", text: fmtScore(c.canary.live_mean) }),
            h("td", { class: "num", text: c.canary.reports }), h("td", { class: "num", text: c.canary.records })))))] : null);
  }

  const fateClass = (fate) => ({ published: "training", rejected: "rejection", abandoned: "warn", open: "state" }[fate] || "pending");

  function curveSvg(points, canaries) {
    const W = 860, H = 320, L = 52, R = 16, T = 40, B = 40;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "curve", role: "img", "aria-label": "learning curve", "data-testid": "curve" });
    if (!points.length) return svg;
    const now = Date.now() / 1000;
    const t0 = points[0].recorded_at;
    const t1 = Math.max(now, ...points.map((p) => p.recorded_at)) || t0 + 1;
    const values = [...points.flatMap((p) => [p.gate_score, p.live_mean]), ...canaries.map((c) => c.canary.live_mean)]
      .filter((v) => v !== null && v !== undefined);
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
    for (const c of canaries) { // a canary: its live mean from its batch to its verdict, marked at its start
      if (c.canary.live_mean === null || c.canary.live_mean === undefined) continue;
      const from = x(Math.max(c.begun_at, t0)), to = Math.max(x(c.decided_at || t1), from + 3), at = y(c.canary.live_mean);
      svg.append(s("g", { class: `canary${c.withdrawn ? " withdrawn" : ""}`, "data-testid": "canary-mark" },
        s("line", { x1: from, x2: to, y1: at, y2: at, class: "canary-bar" }),
        s("path", { d: `M${from} ${at - 6} L${from + 5} ${at} L${from} ${at + 6} L${from - 5} ${at} Z`, class: "canary-dot" }),
        s("title", {}, `canary ${short(c.batch_id)} (${c.fate}${c.withdrawn ? ", withdrawn" : ""}): live mean ${fmtScore(c.canary.live_mean)} over ${c.canary.reports} reports`)));
    }
    const gated = points.filter((p) => p.gate_score !== null && p.gate_score !== undefined);
    for (const p of gated) { // the gate's score holds while the release serves
      svg.append(s("line", { x1: x(p.recorded_at), x2: x(p.served_until || t1), y1: y(p.gate_score), y2: y(p.gate_score), class: "gate-line" }));
    }
    for (const p of gated) {
      svg.append(s("circle", { cx: x(p.recorded_at), cy: y(p.gate_score), r: 5, class: "gate-dot" },
        s("title", {}, `step ${p.step} (${p.operation}): gate score ${fmtScore(p.gate_score)}`)));
    }
    svg.append(s("g", { transform: `translate(${W - R - 380}, 8)` },
      s("rect", { x: 0, y: 0, width: 380, height: 22, class: "legend-bg" }),
      s("circle", { cx: 12, cy: 11, r: 5, class: "gate-dot" }), s("text", { x: 22, y: 15, class: "axis" }, "gate score"),
      s("line", { x1: 102, x2: 122, y1: 11, y2: 11, class: "live-bar" }), s("text", { x: 128, y: 15, class: "axis" }, "live mean score"),
      s("path", { d: "M236 5 L241 11 L236 17 L231 11 Z", class: "canary-dot" }), s("text", { x: 248, y: 15, class: "axis" }, "canary's live mean")));
    return svg;
  }

  Reef.tabs.curve = curveTab;
})();
