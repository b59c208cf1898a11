// blockviz insight views: the prefix-lookup explainer, the preemption ledger, memory truth with its
// sparkline (inline SVG), and the breakpoints bar. Not a module of its own: widgets.py appends it to
// blockviz.js into one ES module, so it uses that file's helpers (h) and RENDERERS picks these by `_kind`.
// ------------------------------------------------------------------ insights: explainer, ledger, memory

function pct(x) { return `${Math.round(100 * x)}%`; }

function renderExplain(model, el) {
  const picker = h("select", { class: "bv-pick", title: "the request to explain" });
  picker.addEventListener("change", () => model.send({ event: "pick", request: picker.value }));
  const head = h("div", { class: "bv-dim" });
  const body = h("div", { class: "bv-explain" });
  el.append(h("div", { class: "bv-title" }, "Prefix lookup of request ", picker), head, body);
  return (frame) => {
    const x = frame.explain;
    if (!x) return;
    picker.replaceChildren(...x.requests.map((id) => h("option", { value: id, text: id })));
    if (x.request === null) {
      body.removeAttribute("data-request");
      head.textContent = "";
      body.replaceChildren(h("div", { class: "bv-dim", text: "no request allocated yet" }));
      return;
    }
    picker.value = x.request;
    body.dataset.request = x.request;
    body.dataset.hitBlocks = String(x.hit_blocks);
    body.dataset.hitTokens = String(x.hit_tokens);
    head.textContent = `${x.name || "seq " + x.seq} · ${x.num_prompt_tokens} ` +
      `${x.recomputed ? "tokens again after a recompute preemption" : "prompt tokens"} in ${x.blocks.length} blocks of ` +
      `${x.block_size}, looked up when it was allocated` + (x.caching ? "" : " (prefix caching is off)");
    const rows = x.blocks.map((b) => {
      let what = b.verdict === "hit" ? `hit: gpu block ${b.block}` : b.verdict;
      if (b.freed_by) what += ` · window slide: event ${b.freed_by.number ?? "?"}: ${b.freed_by.text}`;
      if (b.evicted_by) what += `${b.freed_by ? " · evicted" : ""} by event ${b.evicted_by.number ?? "?"}: ${b.evicted_by.text}`;
      if (b.detail) what += ` · ${b.detail}`;  // a window tail's miss: which group lost which block
      const first = x.first_miss && x.first_miss.index === b.index;
      return h("tr", { class: "bv-verdict" + (b.verdict === "hit" ? " bv-hit-row" : first ? " bv-miss-row" : " bv-dim"),
        "data-index": b.index, "data-hash": b.hash, "data-verdict": b.verdict,
        "data-block": b.block === null ? "" : b.block,
        "data-evicted-by": b.evicted_by ? b.evicted_by.number : "",
        "data-freed-by": b.freed_by ? b.freed_by.number : "" },
        h("td", { text: `L${b.index}` }), h("td", { class: "bv-hash-id", text: b.hash ? `#${b.hash}` : "no hash" }),
        h("td", {}, h("span", { class: "bv-tokens" }, b.tokens.map((t) => h("span", { class: "bv-slot", text: t })))),
        h("td", { class: "bv-verdict-text", text: what }));
    });
    const miss = x.first_miss ? `; first miss at L${x.first_miss.index}: ${x.first_miss.verdict}` : "";
    body.replaceChildren(h("table", { class: "bv-table" }, h("tbody", {}, rows)),
      h("div", { class: "bv-explain-summary", text: `prefix hit: ${x.hit_blocks} blocks, ${x.hit_tokens} tokens${miss}` }));
  };
}

const LEDGER_COLUMNS = ["event", "step", "victim", "mode", "GPU blocks", "tokens lost", "resumed after"];

function renderLedger(model, el) {
  const totals = h("div", { class: "bv-ledger-totals" });
  const body = h("div", { class: "bv-ledger" });
  el.append(h("div", { class: "bv-title", text: "Preemption ledger" }), totals, body);
  return (frame) => {
    const l = frame.ledger;
    if (!l) return;
    totals.textContent = l.totals;
    totals.dataset.count = String(l.count);
    if (!l.rows.length) { body.replaceChildren(); return; }
    const rows = l.rows.map((r) => h("tr", { class: `bv-ledger-row bv-mode-${r.mode}`, "data-seq-no": r.seq_no,
      "data-request": r.request, "data-mode": r.mode, "data-swapped": r.blocks_swapped, "data-freed": r.blocks_freed,
      "data-lost": r.tokens_lost, "data-resumed": r.steps_until_resumed === null ? "" : r.steps_until_resumed },
      h("td", { text: String(r.seq_no + 1) }), h("td", { text: String(r.step) }),
      h("td", { text: r.name }), h("td", { text: r.mode, title: r.reason }),
      // a swap copies its blocks out and then frees them: one count, said once
      h("td", { text: r.mode === "swap" ? `${r.blocks_swapped} to CPU` : `${r.blocks_freed} freed` }),
      h("td", { text: String(r.tokens_lost) }),
      h("td", { text: r.state })));
    body.replaceChildren(h("table", { class: "bv-table" },
      h("thead", {}, h("tr", {}, LEDGER_COLUMNS.map((c) => h("th", { text: c })))), h("tbody", {}, rows)));
  };
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

// Block utilization (blue) and token utilization (orange) at each step end, 0 at the bottom, 1 at the top.
const SPARK_W = 320, SPARK_H = 56, SPARK_PAD = 3;

function sparkline(series) {
  const chart = svg("svg", { class: "bv-spark", width: SPARK_W, height: SPARK_H, viewBox: `0 0 ${SPARK_W} ${SPARK_H}`,
    "data-points": series.length });
  chart.append(svg("rect", { x: 0, y: 0, width: SPARK_W, height: SPARK_H, class: "bv-spark-frame" }));
  const x = (i) => SPARK_PAD + (series.length > 1 ? (i * (SPARK_W - 2 * SPARK_PAD)) / (series.length - 1) : 0);
  const y = (v) => SPARK_H - SPARK_PAD - v * (SPARK_H - 2 * SPARK_PAD);
  for (const [column, name] of [[2, "block"], [3, "token"]]) {
    const points = series.map((p, i) => `${x(i).toFixed(1)},${y(p[column]).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points, class: `bv-spark-line bv-spark-${name}` }));
    series.forEach((p, i) => chart.append(svg("circle", { cx: x(i).toFixed(1), cy: y(p[column]).toFixed(1), r: 1.4,
      class: `bv-spark-point bv-spark-${name}`, "data-series": name, "data-step": p[0], "data-value": p[column] })));
  }
  return chart;
}

function renderMemory(model, el) {
  const lines = h("div", { class: "bv-memory-lines" });
  const chart = h("div", { class: "bv-spark-box" });
  const body = h("div", { class: "bv-memory" });
  el.append(h("div", { class: "bv-title", text: "Memory: blocks vs tokens" }), lines, chart, body);
  return (frame) => {
    const m = frame.memory;
    if (!m) return;
    const gpu = m.pools.gpu;
    lines.replaceChildren(
      h("div", { text: `internal fragmentation: ${m.internal_fragmentation} empty slots in last blocks · ` +
        `paged waste ${pct(m.paged_waste)} of the slots in used GPU blocks` }),
      h("div", { class: "bv-reservation", "data-reserved": m.reserved_slots, "data-held": m.held_tokens,
        text: `a contiguous prompt + max_tokens reservation would hold ${m.reserved_slots} slots for these ` +
          `${m.held_tokens} tokens: ${pct(m.reservation_waste)} wasted` }));
    chart.replaceChildren(sparkline(m.series), h("div", { class: "bv-dim" },
      h("span", { class: "bv-key-block", text: "━ block utilization " }),
      h("span", { class: "bv-key-token", text: "━ token utilization" }), ` · ${m.series.length} step ends`));
    const poolRows = Object.entries(m.pools).map(([device, p]) => h("tr", { class: "bv-mem-pool", "data-device": device,
      "data-block-util": p.block_utilization, "data-token-util": p.token_utilization },
      h("td", { text: `${device.toUpperCase()} pool` }), h("td", { text: `${p.used_blocks}/${p.num_blocks} (${pct(p.block_utilization)})` }),
      h("td", { text: `${p.slots_used}/${p.slots_allocated} (${pct(p.token_utilization)})` }), h("td", { text: "" })));
    const seqRows = m.seqs.map((s) => h("tr", { class: "bv-mem-seq", "data-seq": s.seq, "data-empty": s.empty_in_last_block },
      h("td", { text: s.name || `seq ${s.seq}` }), h("td", { text: `${s.num_blocks} blocks` }),
      h("td", { text: `${s.num_tokens}/${s.num_blocks * m.block_size} slots` }),
      h("td", { text: `${s.empty_in_last_block} empty in last · reserve ${s.reserved_slots}` })));
    const palette = model.get("palette") || {};
    const groupRows = (m.groups || []).map((g) => h("tr", { class: "bv-mem-group", "data-group": g.group,
      "data-used": g.used_blocks, "data-null-slots": g.null_slots },
      h("td", {}, groupBadge(palette, g.group), ` ${g.label}`), h("td", { text: `${g.used_blocks} blocks` }),
      h("td", { text: g.null_slots ? `${g.null_slots} null slot${g.null_slots > 1 ? "s" : ""}` : "" }), h("td", { text: "" })));
    body.replaceChildren(h("table", { class: "bv-table" }, h("thead", {}, h("tr", {},
      ["", "blocks in use", "slots holding tokens", "fragmentation"].map((c) => h("th", { text: c })))),
      h("tbody", {}, poolRows, seqRows, groupRows)));
    if (m.num_seqs > m.seqs.length) body.append(h("div", { class: "bv-dim", text: `… ${m.num_seqs - m.seqs.length} more sequences` }));
  };
}

// ------------------------------------------------------------------ breakpoints

function renderBreaks(model, el) {
  const boxes = h("span", { class: "bv-break-kinds" });
  const message = h("span", { class: "bv-break-message bv-dim" });
  const button = (direction, label, help) => h("button", { class: "bv-button", "data-direction": direction, title: help,
    text: label, onclick: () => model.send({ event: "break", direction }) });
  el.append(h("div", { class: "bv-buttons" }, h("span", { class: "bv-dim", text: "break on" }), boxes,
    button("previous", "◂ previous", "back to the previous event of a ticked kind"),
    button("next", "next ▸", "on to the next event of a ticked kind (a live engine steps until it comes)"), message));
  let shown = "";
  const sync = () => {
    const kinds = model.get("kinds") || [], on = new Set(model.get("break_on") || []);
    const key = kinds.join() + "|" + [...on].sort().join();
    if (key === shown) return;
    shown = key;
    boxes.replaceChildren(...kinds.map((kind) => {
      const box = h("input", { type: "checkbox", "data-kind": kind, checked: on.has(kind) });
      box.addEventListener("change", () => {
        const now = new Set(model.get("break_on") || []);
        if (box.checked) now.add(kind); else now.delete(kind);
        model.set("break_on", kinds.filter((k) => now.has(k)));
        model.save_changes();
      });
      return h("label", { class: "bv-break-kind" }, box, kind);
    }));
  };
  model.on("change:break_on", sync);
  model.on("change:kinds", sync);
  return (frame) => {
    sync();
    const b = frame.breaks;
    if (!b) return;
    message.textContent = b.message;
    el.dataset.breakOn = b.on.join(",");
  };
}
