// Reef's dashboard: a release, its training summary and its diff. Registers with app.js
// through window.Reef; values from the server are written with textContent, never parsed as HTML.
"use strict";

(() => {
  const Reef = window.Reef;
  const { h, api, enc, short, pill, card, fmtNum, fmtTime, ago, verdictText, metricsList, madeBy } = Reef;

  // -- a release and its diff ------------------------------------------------------------

  async function releaseView(where) {
    const name = where.scenario;
    const [chain, diff, fates] = await Promise.all([api(`reef/scenarios/${enc(name)}/releases`),
      api(`reef/scenarios/${enc(name)}/releases/${enc(where.id)}/diff`), api(`reef/scenarios/${enc(name)}/candidates`)]);
    const r = chain.releases.find((x) => x.release_id === where.id);
    if (!r) throw new Error(`no release ${where.id} in ${name}`);
    const perTask = r.verdict && r.verdict.metrics && r.verdict.metrics.per_task;
    // the candidate it published, or whose content it serves again (a rollback, a promotion)
    const made = fates.candidates.find((c) => c.release_id === r.release_id)
      || fates.candidates.find((c) => c.content_id && c.content_id === r.content_id);
    const weights = diff.changed.some((path) => !path.startsWith("harness/"));
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
      made && (made.steps.length || made.training) ? [h("h2", { text: `Training (batch ${short(made.batch_id)})` }), Reef.trainingSummary(made)] : null,
      weights
        ? h("details", { testid: "adapter-files" }, h("summary", { text: `Files changed against its parent (${diff.changed.length}: the adapter's weights and configuration)` }),
          renderDiff(diff.diff, diff.changed))
        : [h("h2", { text: `Changed against its parent (${diff.changed.length} file${diff.changed.length === 1 ? "" : "s"})` }),
          renderDiff(diff.diff, diff.changed)]);
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

  Reef.views.release = releaseView;
  Reef.renderDiff = renderDiff;
})();
