// Reef's dashboard: the candidates tab (every candidate with its fate, the gate's numbers and
// the batch it came from) and the training curves of the learner's steps (inline SVG).
// Registers with app.js through window.Reef; values from the server are written with
// textContent, never parsed as HTML.
"use strict";

(() => {
  const Reef = window.Reef;
  const { h, s, enc, short, pill, fmtNum, fmtScore, fmtTime, ago, verdictText } = Reef;

  const FATE_CLASS = { published: "training", "pending review": "pending", rejected: "rejection", abandoned: "warn", open: "state" };
  const SERIES = [ // [step key, title]
    ["loss", "loss"], ["kl", "KL to the base"], ["clipped_fraction", "clipped fraction"], ["advantage", "mean advantage"],
  ];

  function candidatesTab(name, sc, where, fates) {
    const rows = fates.candidates;
    const c = fates.counts;
    const steps = rows.slice().reverse().flatMap((row) => row.steps.map((step) => ({ ...step, row })));
    return h("section", {},
      h("p", { class: "muted", testid: "candidate-counts" },
        `${c.batches} candidates from the commit log: `,
        pill(`${c.published} published`, "training"), pill(`${c.pending_review} pending review`, "pending"),
        pill(`${c.rejected} rejected`, "rejection"), pill(`${c.abandoned} abandoned`, "warn"),
        pill(`${c.withdrawn} canaries withdrawn`, "rejection"), c.open ? pill(`${c.open} open`, "state") : null),
      steps.length ? [h("h2", { text: `Training curves (${steps.length} steps)` }), trainingCurves(steps)]
        : h("p", { class: "muted small", text: "No training steps logged: a harness recipe proposes edits instead of training." }),
      rows.length ? candidatesTable(name, rows) : h("p", { class: "muted", text: "No candidate yet: the learner makes one from a batch of reported records." }));
  }

  function candidatesTable(name, rows) {
    return h("table", { class: "grid", testid: "candidates" },
      h("thead", {}, h("tr", {}, ["Batch", "Fate", "Logged", "From", "Records", "Reward", "Steps", "Loss", "KL", "Clipped", "Tokens", "Gate", "Outcome"]
        .map((t) => h("th", { text: t })))),
      h("tbody", {}, rows.map((row) => {
        const last = row.steps.length ? row.steps[row.steps.length - 1] : row.training || {};
        const tokens = row.steps.reduce((a, st) => a + (st.tokens || 0), 0);
        return h("tr", { testid: "candidate-row", "data-batch": row.batch_id, "data-fate": row.fate },
          h("td", { class: "mono", text: short(row.batch_id) }),
          h("td", {}, pill(row.fate, FATE_CLASS[row.fate]), row.withdrawn ? pill("withdrawn", "rejection") : null,
            row.canary ? pill("canary", "kind") : null),
          h("td", { class: "small", title: fmtTime(row.begun_at), text: ago(row.begun_at) }),
          h("td", {}, h("code", { text: short(row.from_release_id) })),
          h("td", { class: "num", text: row.records }),
          h("td", { class: "num", text: fmtScore(row.reward_mean) }),
          h("td", { class: "num", text: row.steps.length || "—" }),
          h("td", { class: "num", text: fmtNum(last.loss, 4) }), h("td", { class: "num", text: fmtNum(last.kl, 4) }),
          h("td", { class: "num", text: fmtNum(last.clipped_fraction) }), h("td", { class: "num", text: tokens || "—" }),
          h("td", { class: "small", testid: "gate", text: row.verdict ? gateText(row.verdict) : "—" }),
          h("td", { class: "small" }, outcome(name, row)));
      })));
  }

  // the gate's numbers: scores, wins/losses/ties, the p-value, how many tasks
  function gateText(verdict) {
    const m = verdict.metrics || {};
    const parts = [verdictText(verdict)];
    if (m.p_value !== undefined && m.p_value !== null) parts.push(`p ${fmtNum(m.p_value)}`);
    if (m.tasks) parts.push(`${m.tasks} tasks`);
    if (m.gate) parts.push(m.gate);
    return parts.join(" · ");
  }

  function outcome(name, row) {
    if (row.release_id) return h("a", { class: "mono", href: `#/s/${enc(name)}/release/${enc(row.release_id)}`, text: `release ${short(row.release_id)}` });
    if (row.reason) return h("span", { class: "muted", title: row.reason, text: row.reason.length > 80 ? `${row.reason.slice(0, 79)}…` : row.reason });
    return row.step ? `step ${row.step}` : "training or at the gate";
  }

  // One small chart per metric, the steps of every candidate in order (oldest first), each dot
  // coloured by its candidate's fate; a faint rule where a new candidate begins.
  function trainingCurves(steps) {
    return h("div", { class: "train-charts", testid: "training-curves" },
      SERIES.map(([key, title]) => seriesSvg(steps, key, title)),
      h("div", { class: "legend small muted" }, Object.entries(FATE_CLASS).map(([fate, cls]) => h("span", {},
        h("span", { class: `swatch ${cls}` }), fate))));
  }

  function seriesSvg(steps, key, title) {
    const W = 420, H = 170, L = 48, R = 10, T = 22, B = 22;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "train", role: "img", "aria-label": title, "data-testid": `train-${key}` });
    const points = steps.map((st, i) => ({ i, v: st[key], row: st.row })).filter((p) => typeof p.v === "number");
    svg.append(s("text", { x: L, y: 14, class: "axis title" }, title));
    if (!points.length) return svg;
    let lo = Math.min(...points.map((p) => p.v)), hi = Math.max(...points.map((p) => p.v));
    if (key === "clipped_fraction") { lo = 0; hi = Math.max(hi, 0.05); }
    if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
    const x = (i) => L + (steps.length > 1 ? i / (steps.length - 1) : 0.5) * (W - L - R);
    const y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
    for (const v of [lo, (lo + hi) / 2, hi]) {
      svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "gridline" }),
        s("text", { x: L - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" }, fmtNum(v, Math.abs(v) < 0.01 && v !== 0 ? 4 : 2)));
    }
    steps.forEach((st, i) => { if (i && st.row !== steps[i - 1].row) svg.append(s("line", { x1: x(i - 0.5), x2: x(i - 0.5), y1: T, y2: H - B, class: "tick" })); });
    svg.append(s("polyline", { points: points.map((p) => `${x(p.i)},${y(p.v)}`).join(" "), class: "train-line" }));
    for (const p of points) {
      svg.append(s("circle", { cx: x(p.i), cy: y(p.v), r: 3.5, class: `train-dot ${FATE_CLASS[p.row.fate] || ""}` },
        s("title", {}, `${title} ${fmtNum(p.v, 4)} · candidate ${short(p.row.batch_id)} (${p.row.fate})`)));
    }
    svg.append(s("text", { x: W - R, y: H - 6, class: "axis", "text-anchor": "end" }, `${steps.length} steps`));
    return svg;
  }

  // A weights release's training, in place of the adapter's files: what the release view shows.
  function trainingSummary(row) {
    const last = row.steps.length ? row.steps[row.steps.length - 1] : row.training || {};
    const tokens = row.steps.reduce((a, st) => a + (st.tokens || 0), 0) || last.tokens;
    return h("div", { testid: "training-summary" },
      h("dl", { class: "metrics" },
        [["batch", short(row.batch_id)], ["records in batch", row.records], ["mean reward", fmtScore(row.reward_mean)],
          ["steps", row.steps.length || (row.training ? 1 : 0)], ["loss", fmtNum(last.loss, 4)], ["KL", fmtNum(last.kl, 4)],
          ["clipped", fmtNum(last.clipped_fraction)], ["mean advantage", fmtNum(last.advantage, 4)], ["tokens", tokens ?? "—"],
          ["gate", row.verdict ? gateText(row.verdict) : "—"]]
          .map(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])),
      row.steps.length > 1 ? trainingCurves(row.steps.map((st) => ({ ...st, row }))) : null);
  }

  Reef.tabs.candidates = candidatesTab;
  Object.assign(Reef, { trainingSummary, gateText });
})();
