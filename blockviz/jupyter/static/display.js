// blockviz widgets: moments (blockviz/jupyter/moment.py), appended to blockviz.js by widgets.py.

// A moment's line: the cursor a frozen picture was taken at, and what its last event did. Its
// element carries data-position / data-length, so a browser test can find the moment's cursor.
function renderMoment(model, el) {
  const title = h("div", { class: "bv-controls-title" });
  const current = h("div", { class: "bv-current-event" });
  el.append(title, current);
  return (frame) => {
    const c = frame.cursor;
    if (!c) return;
    title.textContent = `${c.title} · moment at event ${c.position}/${c.length} · ${c.step} (of ${c.num_steps})`;
    current.textContent = c.current || "start: no event applied yet";
    el.dataset.position = String(c.position);
    el.dataset.length = String(c.length);
  };
}
RENDERERS.moment = renderMoment;

// ------------------------------------------------------------------ size and projector

const BASE_FONT_PX = 12;  // .bv-root's font size: every cell, slot and line is sized in em of it

// A view's size (the model's `zoom`) and projector look (`projector`: high contrast, bold), on
// its root element; data-zoom / data-projector say which, for a browser test.
function applyLook(model, el) {
  const zoom = Number(model.get("zoom")) || 1;
  const projector = !!model.get("projector");
  el.style.fontSize = zoom === 1 ? "" : `${BASE_FONT_PX * zoom}px`;
  el.classList.toggle("bv-projector", projector);
  el.dataset.zoom = String(zoom);
  el.dataset.projector = String(projector);
}

// The controls' size menu and projector box: they send {event: "zoom", zoom} and
// {event: "projector", on}; the kernel sets every view's look.
function lookControls(model) {
  const size = h("select", { class: "bv-zoom", title: "size of every view (a projector: 200% or more)" });
  size.append(...(model.get("zooms") || [1]).map((z) => h("option", { value: z, text: `${Math.round(100 * z)}%` })));
  size.addEventListener("change", () => model.send({ event: "zoom", zoom: Number(size.value) }));
  const box = h("input", { type: "checkbox", class: "bv-projector-box" });
  box.addEventListener("change", () => model.send({ event: "projector", on: box.checked }));
  const sync = () => {
    const zoom = Number(model.get("zoom")) || 1;
    if (![...size.options].some((o) => Number(o.value) === zoom)) size.append(h("option", { value: zoom, text: `${Math.round(100 * zoom)}%` }));
    size.value = String(zoom);
    box.checked = !!model.get("projector");
  };
  model.on("change:zoom", sync);
  model.on("change:projector", sync);
  sync();
  return h("span", { class: "bv-look" }, h("label", { text: "size " }, size),
    h("label", { class: "bv-projector-label", title: "big cells, high contrast: for a classroom projector" }, box, "projector"));
}

// ------------------------------------------------------------------ collapsed pools

// A pool with nothing in it, whose record has an `empty_line` (blockviz/model/view.py
// empty_pool_line: "CPU pool: 2048 blocks, never used"), collapses to that line; a click on the
// line opens the grid (and closes it again). The collapsed grid is still drawn (hidden) and carries
// what it stands for: its canvas's data-states / data-refs are the record's (every block free).
function drawCollapsed(pool, data, expanded) {
  const collapsed = !!data.empty_line && !expanded;
  pool.section.classList.toggle("bv-collapsed", collapsed);
  pool.section.classList.toggle("bv-collapsible", !!data.empty_line);
  pool.section.dataset.collapsed = String(collapsed);
  pool.grid.element.hidden = collapsed;
  if (data.empty_line) {
    pool.header.textContent = `${data.empty_line} ${expanded ? "▾" : "▸"}`;
    pool.header.title = expanded ? "click to collapse" : "click to show its blocks";
  } else {
    pool.header.title = "";
  }
  const canvas = pool.grid.element.querySelector("canvas.bv-pool-canvas");
  if (collapsed && canvas) {
    canvas.dataset.states = data.state;
    canvas.dataset.refs = data.ref.join(",");
  }
}
