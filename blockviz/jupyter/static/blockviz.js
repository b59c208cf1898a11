// blockviz widgets: draw the frame the kernel sends (blockviz/model/view.py), nothing more.
// One module for every view, picked by the model's `_kind` (widgets.py appends insights.js and
// pool_canvas.js to this file: still one plain ES module, no imports, no build).
// What a pool view drew is in data attributes (pool_canvas.js: data-states / data-refs on each
// canvas; cellGrid: data-block / data-state / data-ref per cell) so a browser test can compare the
// page with the kernel.

const STATE_NAMES = { u: "used", c: "cached", f: "free", n: "null" };  // n: vLLM v1's null block
const SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹";

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "style") Object.assign(node.style, value);
    else if (key.startsWith("data-")) node.setAttribute(key, String(value));
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function seqColour(palette, seqId) {
  const colours = (palette && palette.seq) || ["#61afef"];
  return colours[colourIndex(palette, seqId)];
}

function colourIndex(palette, seqId) {
  const count = ((palette && palette.seq) || [0]).length;
  return ((seqId % count) + count) % count;
}

// A cell's fill bar in sixteenths of its width (exact for block sizes that divide 16).
const FILL_STEPS = 16;

// One rule per sequence colour (background: the first owner; inset shadow: the second) and per
// fill step, added once per page.
function ownerRules(palette) {
  const colours = (palette && palette.seq) || ["#61afef"];
  const rules = colours.map((c, k) =>
    `.bv-cell.bv-o-${k}{background-color:${c}}.bv-cell.bv-p-${k}{box-shadow:inset -1.3em 0 0 0 ${c}}`);
  for (let f = 0; f <= FILL_STEPS; f++) rules.push(`.bv-cell.bv-f-${f}{background-size:${(100 * f) / FILL_STEPS}% 4px}`);
  return rules.join("\n");
}

// The block-state colours (the palette's "blocks": palette.BLOCK_COLOURS) as CSS variables on a
// view's element: blockviz.css's cell, swatch and free-queue rules read them (--bv-cached,
// --bv-text-free, --bv-bar-used, ...), as pool_canvas.js paints with the same table.
function setBlockColours(el, palette) {
  for (const [key, value] of Object.entries((palette && palette.blocks) || {})) {
    if (typeof value === "string") el.style.setProperty(`--bv-${key}`, value);
    else for (const [state, colour] of Object.entries(value)) el.style.setProperty(`--bv-${key}-${state}`, colour);
  }
}

function superscript(n) {
  return String(n).split("").map((d) => SUPERSCRIPT[Number(d)]).join("");
}

// A KV-cache group's badge (a hybrid run's): its number on its colour (palette.GROUP_COLOURS).
function groupColour(palette, group) {
  const colours = (palette && palette.groups) || [];
  return colours.length ? colours[group % colours.length] : "transparent";
}

function groupBadge(palette, group) {
  return h("span", { class: "bv-group-badge", "data-group": group, text: String(group),
    style: { background: groupColour(palette, group) } });
}

// a sequence's chip in its colour, worded by the view model's name ("request 3 (seq 4)") where it sends one
function seqChip(palette, seqId, name) {
  return h("span", { class: "bv-chip", style: { background: seqColour(palette, seqId) }, text: name || `seq ${seqId}` });
}

// ------------------------------------------------------------------ pools

// What a block's tooltip says, for either way of drawing a pool.
function blockTitle(device, i, data, blockSize, number = i) {
  const owners = [data.owner[i], data.owner2[i]].filter((s) => s >= 0);
  return `${device} block ${number} · ${STATE_NAMES[data.state[i]] || "free"} · ref ${data.ref[i]} · ` +
    `${data.fill[i]}/${blockSize} slots` + (owners.length ? ` · seq ${owners.join(",")}` : "");
}

// A pool as one DOM element per cell (PoolView.renderer "cells"), restyled through shared class
// rules; each cell carries data-block / data-state / data-ref.
function cellGrid(model, device, n) {
  const grid = h("div", { class: "bv-grid", "data-device": device });
  const cells = [];
  for (let i = 0; i < n; i++) {
    cells.push(h("div", { class: "bv-cell bv-s-f", "data-device": device, "data-block": i, "data-state": "free",
      "data-ref": 0, text: String(i) }));
  }
  grid.append(...cells);
  let last = null, blockSizeShown = 1, marked = [];
  grid.addEventListener("mouseover", (event) => {  // a tooltip made on demand, not on every frame
    const cell = event.target.closest(".bv-cell");
    if (cell && last) cell.title = blockTitle(device, Number(cell.dataset.block), last, blockSizeShown);
  });
  grid.addEventListener("click", (event) => {
    const cell = event.target.closest(".bv-cell");
    if (cell) model.send({ event: "select", device, number: Number(cell.dataset.block) });
  });
  let headCell = null;
  function draw(data, palette, blockSize, touched, selected, head = -1) {
    blockSizeShown = blockSize;
    if (headCell) headCell.classList.remove("bv-head");
    headCell = cells[head] || null;
    for (let i = 0; i < n; i++) {
      const code = data.state[i], ref = data.ref[i], fill = data.fill[i];
      const owner = data.owner[i], owner2 = data.owner2[i];
      if (last && last.state[i] === code && last.ref[i] === ref && last.fill[i] === fill &&
          last.owner[i] === owner && last.owner2[i] === owner2) continue;
      const cell = cells[i];
      const name = STATE_NAMES[code] || "free";
      if (!last || last.state[i] !== code) cell.dataset.state = name;
      if (!last || last.ref[i] !== ref) cell.dataset.ref = String(ref);
      // Classes only, shared rules (no inline style): a frame that changes thousands of cells
      // restyles them from a few rules instead of parsing a style attribute per cell.
      let cls = `bv-cell bv-s-${code} bv-f-${Math.round((FILL_STEPS * fill) / blockSize)}`;
      if (name === "used" && owner >= 0) {
        cls += ` bv-o-${colourIndex(palette, owner)}`;
        if (owner2 >= 0) cls += ` bv-p-${colourIndex(palette, owner2)}`;
      }
      cell.className = cls;
      const sup = ref > 1 ? superscript(ref) : (name === "cached" ? "c" : (name === "null" ? "∅" : ""));
      if (sup) cell.dataset.sup = sup;  // no attribute, no ::after box (most cells have none)
      else if (cell.dataset.sup !== undefined) delete cell.dataset.sup;
    }
    last = data;
    for (const cell of marked) cell.classList.remove("bv-touched", "bv-selected");
    marked = touched.filter((i) => cells[i]).map((i) => cells[i]);
    for (const cell of marked) cell.classList.add("bv-touched");
    if (cells[selected]) { cells[selected].classList.add("bv-selected"); marked.push(cells[selected]); }
    if (headCell) headCell.classList.add("bv-head");
    grid.dataset.head = head >= 0 ? String(head) : "";
  }
  return { element: grid, n, draw, dispose() {} };
}

// The GPU and CPU pools under the legend; each pool drawn by canvasGrid (pool_canvas.js, the
// default) or cellGrid, as PoolView.renderer says.
function renderPool(model, el) {
  const legend = h("div", { class: "bv-legend" });
  const body = h("div", { class: "bv-pools" });
  el.append(legend, body);
  const pools = {}; // device -> { section, header, grid, renderer, zoom }
  const expanded = {}; // device -> a collapsed pool opened by a click
  let legendPalette = null;

  let legendV1 = false;
  let legendGroups = "";
  function drawLegend(palette, v1, groups = []) {
    const groupsKey = groups.map((g) => g.label).join("\n");
    if (palette === legendPalette && v1 === legendV1 && groupsKey === legendGroups) return;
    legendPalette = palette;
    legendV1 = v1;
    legendGroups = groupsKey;
    legend.replaceChildren(
      h("span", { class: "bv-key" }, h("span", { class: "bv-swatch bv-free-swatch" }), "free"),
      h("span", { class: "bv-key" }, h("span", { class: "bv-swatch", style: { background: seqColour(palette, 0) } }),
        h("span", { class: "bv-swatch", style: { background: seqColour(palette, 1) } }), "used (owner colour)"),
      h("span", { class: "bv-key" }, h("span", { class: "bv-swatch", style: {
        background: `linear-gradient(135deg, ${seqColour(palette, 0)} 50%, ${seqColour(palette, 1)} 50%)` } }),
        "shared (ref count²)"),
      h("span", { class: "bv-key" }, h("span", { class: "bv-swatch bv-cached-swatch" }), "free but cached"),
      h("span", { class: "bv-key" }, h("span", { class: "bv-swatch bv-touched-swatch" }), "last touched"),
      h("span", { class: "bv-key" }, h("span", { class: "bv-swatch bv-selected-swatch" }), "selected"),
      ...(v1 ? [h("span", { class: "bv-key" }, h("span", { class: "bv-swatch bv-null-swatch" }), "null block (v1)"),
        h("span", { class: "bv-key" }, h("span", { class: "bv-swatch bv-head-swatch" }), "next to go (free queue head)")]
        : []),
      ...groups.map((g) => h("span", { class: "bv-key bv-group-key", "data-group": g.group },
        groupBadge(palette, g.group), ` ${g.label}`)),
    );
  }

  // A pool's grid: a cell per block (canvasGrid, or cellGrid as PoolView.renderer says; a range
  // of a big pool always on a canvas), or zoomed out (zoomGrid) when the frame's pool record has
  // per_cell > 1 (view.pool_record).
  function ensurePool(device, data) {
    const n = data.n, start = data.start || 0, stop = data.stop === undefined ? n : data.stop;
    const perCell = data.per_cell || 1;
    const renderer = perCell > 1 ? "zoom" : (model.get("renderer") === "cells" && !start && stop === n ? "cells" : "canvas");
    const key = `${renderer} ${n} ${start} ${stop} ${perCell}`;
    const zoom = model.get("zoom");
    let pool = pools[device];
    if (pool && pool.key === key && pool.zoom === zoom) return pool;
    if (pool) pool.grid.dispose();
    const header = h("div", { class: "bv-pool-title" });
    const grid = renderer === "zoom" ? zoomGrid(model, device, n, start, stop, perCell)
      : renderer === "cells" ? cellGrid(model, device, n) : canvasGrid(model, device, stop - start, start);
    const note = h("div", { class: "bv-pool-note", hidden: true });
    const zoomBar = h("div", { class: "bv-zoom-bar", hidden: perCell === 1 && !start && stop === n });
    if (!zoomBar.hidden) {
      const whole = !start && stop === n;
      zoomBar.append(h("span", { class: "bv-dim", text: (perCell > 1 ? `1 cell = ${perCell.toLocaleString("en")} blocks · ` +
        "bar: share of its blocks in use · ground: slate most of the rest cached, empty free · click a cell to zoom in"
        : `blocks ${start}-${stop - 1}, 1 cell = 1 block`) }));
      if (!whole) {
        const out = h("button", { class: "bv-button bv-zoom-out", text: "whole pool" });
        out.addEventListener("click", () => model.send({ event: "zoom_pool", device }));
        zoomBar.append(" ", out);
      }
    }
    const section = h("div", { class: "bv-pool", "data-device": device }, header, zoomBar, grid.element, note);
    header.addEventListener("click", () => {
      if (!lastFrame || !((lastFrame.pools || {})[device] || {}).empty_line) return;
      expanded[device] = !expanded[device];
      draw(lastFrame);
    });
    if (pool) pool.section.replaceWith(section);
    else body.append(section);
    return (pools[device] = { section, header, grid, renderer, zoom, note, key });
  }

  // vLLM v1: the free queue's first blocks, head first (view.free_queue), under the GPU pool.
  const queueRow = h("div", { class: "bv-free-queue", hidden: true });
  function drawQueue(queue, section) {
    queueRow.hidden = !queue;
    if (!queue) return;
    if (queueRow.parentNode !== section) section.append(queueRow);
    const chips = queue.blocks.map(([number, cached], i) => h("span", {
      class: "bv-queue-block" + (cached ? " bv-queue-cached" : "") + (i === 0 ? " bv-queue-head" : ""),
      "data-block": number, title: (i === 0 ? "next to go" : `${i + 1} in the queue`) +
        (cached ? ": cached, taking it evicts its hash" : ": free, no hash"), text: `${number}${cached ? "c" : ""}` }));
    const more = queue.num_free - queue.blocks.length;
    queueRow.replaceChildren(h("span", { class: "bv-free-queue-title", text: "free queue ▸ " }),  // (replaceChildren writes a null as "null")
      ...(chips.length ? chips : [h("span", { class: "bv-dim", text: "empty: every block is in use" })]),
      ...(more > 0 ? [h("span", { class: "bv-dim", text: ` … +${more}` })] : []));
    queueRow.dataset.blocks = queue.blocks.map(([number]) => number).join(",");
    queueRow.dataset.cached = queue.blocks.map(([, cached]) => (cached ? 1 : 0)).join(",");
    queueRow.dataset.numFree = String(queue.num_free);
  }

  const rules = h("style");
  el.append(rules);
  let lastFrame = null;
  let colouredWith = null;
  let cardShown = null;
  const draw = (frame) => {
    lastFrame = frame;
    const palette = model.get("palette");
    if (palette !== colouredWith) setBlockColours(el, (colouredWith = palette));
    drawLegend(palette, !!frame.free_queue, frame.kv_cache_groups || []);
    const css = ownerRules(palette);
    if (rules.textContent !== css) rules.textContent = css;
    for (const device of ["gpu", "cpu"]) {
      const data = frame.pools && frame.pools[device];
      if (!data) continue;
      const pool = ensurePool(device, data);
      // an empty pool says why when the run has a note for it (vLLM v1's CPU pool), else hides
      const notes = data.n === 0 ? Object.values(frame.notes || {}) : [];
      pool.section.hidden = data.n === 0 && !notes.length;
      pool.note.hidden = !notes.length;
      pool.note.replaceChildren(...notes.map((text) => h("div", { class: "bv-note", text })));
      // free counts the cached blocks too, as the TUI's status bar and the SVG say it
      pool.header.textContent = `${device.toUpperCase()} pool · ${data.n} blocks · ${data.used} used · ` +
        `${data.cached + data.free} free` + (data.cached ? ` (${data.cached} cached)` : "") +
        (data.per_cell > 1 ? ` · 1 cell = ${data.per_cell} blocks` : "");
      const named = frame.card ? frame.card.blocks.some(([d]) => d === device) : false;
      drawCollapsed(pool, data, !!expanded[device] || named);
      const selected = frame.selected && frame.selected[0] === device ? frame.selected[1] : -1;
      const queue = device === "gpu" ? frame.free_queue : null;
      const head = queue && queue.blocks.length ? queue.blocks[0][0] : -1;
      pool.grid.draw(data, palette, frame.block_size || 1, (frame.touched || {})[device] || [], selected, head);
      if (device === "gpu") drawQueue(queue, pool.section);
    }
    const card = frame.card ? String(frame.card.position) : "";
    if (card !== cardShown) { cardShown = card; scheduleFit(el); }  // the pools a card opened: fit again
  };
  draw.dispose = () => { for (const pool of Object.values(pools)) pool.grid.dispose(); };
  return draw;
}

// ------------------------------------------------------------------ block tables

// Scroll a tables box (.bv-tables) to the row of the sequence in its data-scrolled-to, if any.
function scrollTablesToCard(body) {
  const row = body.dataset.scrolledTo ? body.querySelector(`.bv-table-row[data-seq='${body.dataset.scrolledTo}']`) : null;
  if (row) body.scrollTop += row.getBoundingClientRect().top - body.getBoundingClientRect().top;
}

function renderTables(model, el) {
  const body = h("div", { class: "bv-tables" });
  el.append(h("div", { class: "bv-title", text: "Block tables (logical → physical)" }), body);
  let colouredWith = null;
  // A new card scrolls the box to the table of the sequence it is about (its first), as the TUI
  // does; the same card again leaves the box where the reader scrolled it.
  let scrolledFor = null;
  function scrollToCard(card) {
    const key = card ? `${card.position} ${card.idea}` : null;
    if (key === scrolledFor) return;
    scrolledFor = key;
    body.dataset.scrolledTo = card && (card.seqs || []).length ? String(card.seqs[0]) : "";
    scrollTablesToCard(body);
  }
  return (frame) => {
    const palette = model.get("palette");
    if (palette !== colouredWith) setBlockColours(el, (colouredWith = palette));  // a null slot's colours
    const blockSize = frame.block_size || 1;
    const lblocks = (blocks, skipped) => blocks.map(([device, number, ref, texts], index) => {
        if (skipped.includes(index)) {  // a slot a sliding window let go: the null block
          return h("div", { class: "bv-lblock bv-null-slot", "data-device": device, "data-block": number,
            "data-ref": ref, "data-logical": index, "data-null": "true" },
            h("div", { class: "bv-lhead", text: `L${index} → ∅ null block` }),
            h("div", { class: "bv-dim", text: "the window slid past" }));
        }
        const slots = [];
        for (let s = 0; s < blockSize; s++) {
          slots.push(h("span", { class: s < texts.length ? "bv-slot" : "bv-slot bv-empty",
            text: s < texts.length ? texts[s] : "·" }));
        }
        return h("div", { class: `bv-lblock bv-${device}`, "data-device": device, "data-block": number,
          "data-ref": ref, "data-logical": index },
          h("div", { class: "bv-lhead", text: `L${index} → ${device} ${number}${ref > 1 ? " ×" + ref : ""}` }),
          h("div", { class: "bv-slots" }, slots));
      });
    const rows = (frame.tables || []).map((row) => {
      const tables = [[0, row.label || "", row.blocks, row.skipped || []],
        ...(row.groups || []).map((g) => [g.group, g.label, g.blocks, g.skipped])];
      const groupTables = tables.map(([group, label, blocks, skipped]) => {
        const drawn = h("div", { class: "bv-lblocks" },
          blocks.length ? lblocks(blocks, skipped) : h("span", { class: "bv-dim", text: "no blocks" }));
        return label ? h("div", { class: "bv-group-table", "data-group": group },
          h("div", { class: "bv-group-label" }, groupBadge(palette, group), ` ${label}`), drawn) : drawn;
      });
      return h("div", { class: "bv-table-row", "data-seq": row.seq },
        h("div", { class: "bv-table-label" }, seqChip(palette, row.seq, row.name),
          h("span", { class: "bv-dim", text: ` · ${row.status}` +
            (row.finish ? ` (${row.finish})` : "") })),
        row.progress ? h("div", { class: "bv-progress" + (row.progress.prefilling ? " bv-prefilling" : ""),
          "data-computed": row.progress.computed, "data-num-tokens": row.progress.num_tokens,
          "data-scheduled": row.progress.scheduled, text: row.progress.text }) : null,
        ...groupTables);
    });
    body.replaceChildren(...(rows.length ? rows : [h("div", { class: "bv-dim", text: "no sequences yet" })]));
    scrollToCard(frame.card);
  };

}

// ------------------------------------------------------------------ hash chains

function renderHashes(model, el) {
  const summary = h("div", { class: "bv-dim" });
  const body = h("div", { class: "bv-hashes" });
  el.append(h("div", { class: "bv-title", text: "Hash chains (prefix cache)" }), summary, body);
  return (frame) => {
    const s = frame.hash_summary || { in_map: 0, hits: 0, looked_up: 0 };
    summary.textContent = `${s.in_map} in hash map · hits ${s.hits}/${s.looked_up} prompt blocks`;
    const rows = (frame.hashes || []).map((row) => h("div", {
      class: "bv-hash" + (row.hits ? " bv-hit" : "") + (row.state === "cached" ? " bv-cached-row" : "")
        + (row.hit_now ? " bv-hit-now" : ""),
      "data-block": row.block, style: { paddingLeft: `${Math.min(row.depth, 12) * 0.8}em` } },
      row.branch ? h("span", { class: "bv-dim", text: row.branch + " " }) : null,
      h("span", { class: "bv-hash-id", text: `#${row.hash}` }),
      h("span", { class: "bv-dim", text: row.parent ? ` ← #${row.parent}` : " ← root" }),
      h("span", { text: ` gpu ${row.block}${row.ref ? " ×" + row.ref : ""}` +
        (row.state === "cached" ? " cached-free" : "") + (row.registered ? "" : " dup") }),
      row.hits ? h("span", { class: "bv-hit-badge", text: ` HIT×${row.hits}` }) : null,
      h("span", { class: "bv-tokens" }, row.tokens.map((t) => h("span", { class: "bv-slot", text: t })))));
    body.replaceChildren(...(rows.length ? rows
      : [h("div", { class: "bv-dim", text: "no hashed blocks: full blocks get a chained hash with prefix caching" })]));
  };
}

// ------------------------------------------------------------------ event log

function renderLog(model, el) {
  const select = h("select", { class: "bv-filter" });
  const list = h("div", { class: "bv-log" });
  select.addEventListener("change", () => { model.set("filter", select.value); model.save_changes(); });
  el.append(h("div", { class: "bv-title" }, "Event log ", select), list);
  let filtersShown = "";
  return (frame) => {
    const filters = model.get("filters") || [];
    if (filters.join("\n") !== filtersShown) {
      select.replaceChildren(...filters.map((name) => h("option", { value: name, text: name })));
      filtersShown = filters.join("\n");
    }
    select.value = model.get("filter");
    const rows = (frame.log && frame.log.rows) || [];
    list.replaceChildren(...rows.map(([number, kind, text], i) => h("div", {
      class: `bv-event bv-kind-${kind}` + (i === rows.length - 1 ? " bv-current" : ""), "data-type": kind,
      "data-number": number }, h("span", { class: "bv-dim", text: `${number} ` }), text)));
    list.scrollTop = list.scrollHeight;
  };
}

// ------------------------------------------------------------------ inspector

function renderInspector(model, el) {
  const body = h("div", { class: "bv-inspector" });
  el.append(h("div", { class: "bv-title", text: "Block inspector" }), body);
  return (frame) => {
    const palette = model.get("palette");
    const b = frame.inspector;
    if (!b) {
      body.removeAttribute("data-device");
      body.removeAttribute("data-block");
      body.replaceChildren(h("div", { class: "bv-dim", text: "click a block in a pool to inspect it" }));
      return;
    }
    for (const [key, value] of [["device", b.device], ["block", b.number], ["state", b.state], ["ref", b.ref],
      ["group", b.kv_cache_group_id ?? ""]]) {
      body.setAttribute(`data-${key}`, String(value));
    }
    const row = (label, ...value) => h("tr", {}, h("td", { class: "bv-dim", text: label }), h("td", {}, ...value));
    const rows = [
      row("block", `${b.device} ${b.number}`),
      row("state", b.state),
      ...(b.group ? [row("KV group", groupBadge(palette, b.kv_cache_group_id), ` ${b.group}`)] : []),
      ...(b.note ? [row("what", b.note)] : []),
      ...(b.queue ? [row("free queue", b.queue)] : []),
      row("ref count", String(b.ref)),
      row("owners", b.owners.length ? b.owners.map((s, i) => seqChip(palette, s, (b.owner_names || [])[i])) : "none"),
      row("fill", `${b.fill}/${b.block_size} slots`),
    ];
    if (b.hash) {
      rows.push(row("hash", `#${b.hash}` + (b.registered ? "" : " (duplicate, not in map)")));
      rows.push(row("parent", b.parent ? `#${b.parent}` : "none (first block)"));
      rows.push(row("hits", String(b.hits)));
    }
    if (b.tokens.length) rows.push(row("tokens", ...b.tokens.map((t) => h("span", { class: "bv-slot", text: t }))));
    rows.push(row("K/V digest", b.digest ? b.digest + (b.digest_current ? "" : " (taken before the last slots)")
      : "none yet"));
    if (b.same_kv.length) rows.push(row("same K/V in", b.same_kv.join(", ")));
    if (b.bytes) rows.push(row("bytes", b.bytes));
    body.replaceChildren(h("table", {}, h("tbody", {}, rows)));
  };
}

// ------------------------------------------------------------------ controls

const BUTTONS = [
  ["start", "|◀", "to the start"],
  ["back_step", "◀ step", "back one engine step"],
  ["back", "◀ event", "back one event"],
  ["play", "▶ play", "play / pause"],
  ["step_event", "event ▶", "one event"],
  ["step", "step ▶", "one engine step (to the next step_finished)"],
  ["end", "▶|", "to the newest event"],
  ["next_card", "next idea ▸", "to the guide's next card: the next idea met for the first time"],
];

function renderControls(model, el) {
  const title = h("div", { class: "bv-controls-title" });
  const buttons = {};
  const bar = h("div", { class: "bv-buttons" });
  for (const [action, label, help] of BUTTONS) {
    buttons[action] = h("button", { class: "bv-button", "data-action": action, title: help, text: label,
      onclick: () => model.send({ event: "action", action }) });
    bar.append(buttons[action]);
  }
  const speed = h("select", { class: "bv-speed", title: "playback speed" });
  speed.addEventListener("change", () => model.send({ event: "speed", index: Number(speed.value) }));
  const slider = h("input", { type: "range", class: "bv-slider", min: 0, max: 0, value: 0, step: 1 });
  let dragging = false;
  slider.addEventListener("input", () => { dragging = true; });
  slider.addEventListener("change", () => {
    dragging = false;
    model.send({ event: "seek", position: Number(slider.value) });
  });
  const where = h("span", { class: "bv-where" });
  const current = h("div", { class: "bv-current-event" });
  const error = h("div", { class: "bv-error", hidden: true });
  const dropped = h("div", { class: "bv-dropped", hidden: true });
  // a guided stop's card (blockviz/model/guide.py): the first time an idea happened, at its cursor
  const card = h("div", { class: "bv-card", hidden: true });
  bar.append(speed, slider, where, lookControls(model));
  el.append(title, bar, current, error, dropped, card);
  let speedsShown = "", fittedFor = null;
  return (frame) => {
    const c = frame.cursor;
    if (!c) return;
    const speeds = model.get("speeds") || [];
    if (speeds.join() !== speedsShown) {
      speed.replaceChildren(...speeds.map((label, i) => h("option", { value: i, text: label })));
      speedsShown = speeds.join();
    }
    speed.value = String(c.speed_index);
    title.textContent = c.title + (c.live ? " · live" : "");
    title.title = title.textContent;  // all of it, when a card puts it on one line
    buttons.play.textContent = c.playing ? "❚❚ pause" : "▶ play";
    buttons.play.dataset.playing = String(c.playing);
    buttons.next_card.hidden = !c.guided;
    slider.max = String(c.length);
    if (!dragging) slider.value = String(c.position);
    where.textContent = `event ${c.position}/${c.length} · ${c.step} (of ${c.num_steps})` +
      (c.finished ? " · finished" : "");
    el.dataset.position = String(c.position);
    el.dataset.length = String(c.length);
    el.dataset.playing = String(c.playing);
    // a single event stepped into an engine operation says so (blockviz/model/operation.py)
    current.textContent = (c.current || "start: no event applied yet") + (c.inside ? ` · ${c.inside}` : "");
    current.dataset.type = c.current_type;
    current.dataset.inside = c.inside ? "true" : "false";
    error.textContent = c.error;
    error.hidden = !c.error;
    dropped.textContent = c.dropped || "";
    dropped.hidden = !c.dropped;
    const k = frame.card;
    card.hidden = !k;
    card.dataset.idea = k ? k.idea : "";
    card.dataset.position = k ? String(k.position) : "";
    card.dataset.blocks = k ? k.blocks.map((b) => b.join(":")).join(",") : "";
    if (k) {
      card.replaceChildren(h("div", { class: "bv-card-title", text: k.counter ? `${k.counter}: ${k.title}` : k.title }),
        h("div", { text: k.what }), h("div", { class: "bv-card-why", text: `why: ${k.why}` }),
        h("div", { class: "bv-dim", text: `in ${k.upstream || "vLLM"}: ${k.function}` }),
        // the words it uses, each defined on hover (blockviz/model/glossary.py, the TUI's ? help)
        h("div", { class: "bv-card-terms" }, (k.terms || []).length ? "words: " : "",
          ...(k.terms || []).map(([term, meaning]) => h("abbr", { class: "bv-term", title: meaning, text: term + " " }))));
    }
    const fitFor = k ? String(k.position) : "";
    if (fitFor !== fittedFor) { fittedFor = fitFor; scheduleFit(el); }  // display.js: the card and its blocks in view
  };
}

const RENDERERS = {
  pool: renderPool, tables: renderTables, hashes: renderHashes, log: renderLog, inspector: renderInspector,
  controls: renderControls, explain: renderExplain, ledger: renderLedger, memory: renderMemory,
  breaks: renderBreaks, radix: renderRadix,
};

function render({ model, el }) {
  const kind = model.get("_kind");
  el.classList.add("bv-root", `bv-view-${kind}`);
  applyLook(model, el);
  const draw = (RENDERERS[kind] || (() => () => {}))(model, el);
  // The pool view times its draw with the layout it causes (data-render-ms), and until the frame
  // after it is painted (data-paint-ms); data-renders counts draws. benchmarks/widgets.py reads them.
  const timed = kind === "pool";
  let renders = 0;
  const update = () => {
    const start = timed ? performance.now() : 0;
    draw(model.get("frame") || {});
    if (!timed) return;
    void el.offsetHeight;
    el.dataset.renderMs = (performance.now() - start).toFixed(2);
    requestAnimationFrame(() => setTimeout(() => {
      el.dataset.paintMs = (performance.now() - start).toFixed(2);
      el.dataset.renders = String(++renders);
    }));
  };
  model.on("change:frame", update);
  if (timed) model.on("change:renderer", update);
  const relook = () => { applyLook(model, el); update(); scheduleFit(el); };
  model.on("change:zoom", relook);
  model.on("change:projector", relook);
  update();
  return () => {
    model.off("change:frame", update);
    model.off("change:zoom", relook);
    model.off("change:projector", relook);
    if (timed) model.off("change:renderer", update);
    if (draw.dispose) draw.dispose();
  };
}

export default { render };
