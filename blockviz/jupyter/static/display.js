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
  // times the Visualizer's fit (fitToCard: --bv-fit on its box, 1 when no card is up)
  el.style.fontSize = `calc(${BASE_FONT_PX * zoom}px * var(--bv-fit, 1))`;
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
    canvas.bvWritten = data;  // what the canvas's next paint compares with (pool_canvas.js)
  }
}

// ------------------------------------------------------------------ a card and its blocks on one screen

// While a guided card is up, the Visualizer's box (.blockviz) is drawn so that the card and every
// block it names are inside the part of the notebook in view when the controls are scrolled to
// its top, as a speaker stands before a projector: the box takes the class bv-card-up (blockviz.css
// folds the break-on bar and the legend and puts the title on one line), a collapsed pool the card
// names is open (renderPool), a pool grid scrolled away from the named blocks is scrolled to them,
// and when that is still too tall every view's font (and with it every cell) is scaled by the
// factor --bv-fit, the largest that fits, down to MIN_FIT. The box carries data-fit (the factor),
// data-fit-for (the card's position, "" for none) and data-fits (a count of fits), so a browser
// test can tell a fit happened.
const MIN_FIT = 0.4;
const FIT_MARGIN_PX = 6;

// Fit the Visualizer box `el` is in once, at the next animation frame (after the frames now
// arriving are drawn; a view not yet on the page is waited for).
function scheduleFit(el, tries = 20) {
  if (el.bvFitPending) return;
  el.bvFitPending = true;
  requestAnimationFrame(() => {
    el.bvFitPending = false;
    if (!el.isConnected) { if (tries > 0) scheduleFit(el, tries - 1); return; }
    const box = el.closest(".blockviz");
    if (!box || box.classList.contains("blockviz-moment")) return;
    fitToCard(box);
    if (!box.bvFitWatch) {  // a resized window or notebook panel: fit again
      box.bvFitWatch = new ResizeObserver(() => scheduleFit(box));
      box.bvFitWatch.observe(scroller(box) || document.documentElement);
    }
  });
}

// The nearest ancestor of `box` that scrolls what it holds (the notebook's panel), or null (the page scrolls).
function scroller(box) {
  for (let node = box.parentElement; node && node !== document.body; node = node.parentElement) {
    if (/(auto|scroll)/.test(getComputedStyle(node).overflowY) && node.scrollHeight > node.clientHeight + 1) return node;
  }
  return null;
}

// The height of the notebook in view: its scrolling panel's box within the window.
function heightInView(box) {
  const panel = scroller(box);
  if (!panel) return window.innerHeight;
  const r = panel.getBoundingClientRect();
  return Math.min(r.top + panel.clientHeight, window.innerHeight) - Math.max(r.top, 0);
}

// The pool canvas, its grid and the cell box of each block a card names ([device, number] pairs),
// as {device, number, grid, top, bottom} in window coordinates; a block on no canvas is left out.
function namedCells(box, blocks) {
  const out = [];
  for (const [device, number] of blocks) {
    const canvas = box.querySelector(`.bv-view-pool canvas.bv-pool-canvas[data-device='${device}']`);
    if (!canvas || !canvas.dataset.cols) continue;
    const grid = canvas.closest(".bv-grid"), d = canvas.dataset;
    const i = number - Number(d.start || 0);
    if (i < 0 || i >= Number(d.n)) continue;
    const pitch = Number(d.cellHeight) + Number(d.gap);
    const y = Number(d.pad) + Math.floor(i / Number(d.cols)) * pitch;  // in the grid's content
    const top = grid.getBoundingClientRect().top + y - grid.scrollTop;
    out.push({ device, number, grid, y, top, bottom: top + Number(d.cellHeight) });
  }
  return out;
}

function setFit(box, fit) {
  box.style.setProperty("--bv-fit", String(fit));
  for (const grid of box.querySelectorAll(".bv-canvas-grid")) if (grid.bvRelayout) grid.bvRelayout();
}

// Scroll each pool grid whose named blocks are out of its view so that the first of them is at its top.
function revealNamed(box, blocks) {
  for (const cell of namedCells(box, blocks)) {
    const g = cell.grid.getBoundingClientRect();
    if (cell.top < g.top || cell.bottom > g.bottom) {
      cell.grid.scrollTop = cell.y - Number(cell.grid.querySelector("canvas").dataset.pad);
      if (cell.grid.bvRelayout) cell.grid.bvRelayout();
    }
  }
}

// How far below the top of the controls the card's text and its named blocks reach, in pixels.
function cardReach(controls, card, blocks, box) {
  const top = controls.getBoundingClientRect().top;
  const bottoms = [card.getBoundingClientRect().bottom, ...namedCells(box, blocks).map((c) => c.bottom)];
  return Math.max(...bottoms) - top;
}

function fitToCard(box) {
  const controls = box.querySelector(".bv-view-controls");
  const card = controls && controls.querySelector(".bv-card");
  const up = !!(card && !card.hidden);
  box.classList.toggle("bv-card-up", up);
  const blocks = up && card.dataset.blocks ? card.dataset.blocks.split(",").map((b) => {
    const [device, number] = b.split(":");
    return [device, Number(number)];
  }) : [];
  let fit = 1;
  setFit(box, fit);
  if (up) {
    const room = heightInView(box) - FIT_MARGIN_PX;
    const fits = (f) => {
      setFit(box, f);
      revealNamed(box, blocks);
      return cardReach(controls, card, blocks, box) <= room;
    };
    if (!fits(1)) {  // shrink in proportion until it fits, then bisect up to the largest that fits
      let high = 1, low = MIN_FIT;
      for (let f = 1, tries = 0; tries < 6 && f > MIN_FIT; tries++) {
        f = Math.max(MIN_FIT, f * Math.min(0.97, room / cardReach(controls, card, blocks, box)));
        if (fits(f)) { low = f; break; }
        high = f;
      }
      while (high - low > 0.02) {
        const middle = (high + low) / 2;
        if (fits(middle)) low = middle; else high = middle;
      }
      fit = Math.floor(100 * low) / 100;
      fits(fit);
    }
  }
  for (const body of box.querySelectorAll(".bv-tables")) scrollTablesToCard(body);  // its rows moved with the fit
  box.dataset.fit = String(fit);
  box.dataset.fitFor = up ? card.dataset.position : "";
  box.dataset.fits = String(Number(box.dataset.fits || 0) + 1);
}
