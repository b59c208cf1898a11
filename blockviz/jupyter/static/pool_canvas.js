// ------------------------------------------------------------------ pools on a canvas
// (widgets.py appends this file to blockviz.js: it uses h, STATE_NAMES, seqColour, superscript,
// FILL_STEPS and blockTitle from there.)
//
// A pool drawn on one <canvas> with the look of blockviz.css's .bv-cell rules: per block its number,
// the ref count (or "c" when cached), the fill bar, the first owner's colour as background and the
// second owner's as a strip on the right, a dashed border when free, and the touched / selected
// outlines. The canvas covers only the visible part of the scrolling grid (a sizer gives the grid
// its full height), so a frame paints the rows in view whatever the pool's size.
//
// What it drew is on the canvas as data attributes, written from the same frame data as the
// picture: data-n, data-states (one character a block: u used, c cached, f free, n vLLM v1's null
// block), data-refs (comma-separated), data-touched, data-selected, data-head (v1: the free queue's
// head, whose number is drawn orange), data-groups (a run with several KV-cache groups: per block
// its group, -1 for none, drawn as a badge of the group's colour), and the layout (data-cols, data-cell-width,
// data-cell-height, data-gap, data-pad, in CSS pixels) to find a block's cell. A canvas of a
// range of a big pool (view.pool_record's start and stop) draws blocks start to stop: cell i is
// block data-start + i, numbered as in the pool.
//
// zoomGrid draws a pool too big for a cell per block zoomed out (blockviz/model/pool_zoom.py):
// a square per data-per-cell blocks, its bar the share of them in use, its ground the state most
// of the rest are in; a click zooms into the cell's blocks.

const CELL_EM = { width: 2.9, height: 2.2, strip: 1.3 };  // as .bv-grid's columns and rows, .bv-p-* shadow
const GRID_GAP = 3, GRID_PAD = 2, CELL_RADIUS = 3, BAR_HEIGHT = 4;
const OUTLINE_WIDTH = { touched: 2, selected: 3 };  // the colours: the palette's "blocks" (palette.BLOCK_COLOURS)

// Size a canvas to width x height CSS pixels at the device's pixel ratio (returned).
function sizeCanvas(canvas, width, height) {
  const dpr = window.devicePixelRatio || 1;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  return dpr;
}

function canvasGrid(model, device, n, start = 0) {
  const canvas = h("canvas", { class: "bv-pool-canvas", "data-device": device, "data-n": n, "data-start": start,
    role: "img", "aria-label": `${device} pool, ${n} blocks` });
  const cellEm = Math.max(CELL_EM.width, 0.6 * String(start + n - 1).length + 0.5);  // six-digit numbers fit
  const sizer = h("div", { class: "bv-canvas-sizer" }, canvas);
  const grid = h("div", { class: "bv-grid bv-canvas-grid", "data-device": device }, sizer);
  const ctx = canvas.getContext("2d");
  let shown = null;     // the frame to paint: { data, palette, blockSize, touched: Set, selected }
  let painted = null;   // the last paint: { shown, layout, top }
  let layout = null;    // measured on demand, dropped on a resize
  let hovered = -1;

  function measure() {
    const style = getComputedStyle(grid);
    const em = parseFloat(style.fontSize) || 12;
    const width = grid.clientWidth;
    const cw = Math.round(cellEm * em), ch = Math.round(CELL_EM.height * em);  // whole pixels: crisp edges
    const cols = Math.max(1, Math.floor((width - 2 * GRID_PAD + GRID_GAP) / (cw + GRID_GAP)));
    const rows = Math.ceil(n / cols);
    const contentHeight = 2 * GRID_PAD + rows * (ch + GRID_GAP) - GRID_GAP;
    sizer.style.height = `${contentHeight}px`;
    const height = Math.min(contentHeight, grid.clientHeight || contentHeight);
    const dpr = sizeCanvas(canvas, width, height);
    Object.assign(canvas.dataset, { cols, cellWidth: cw, cellHeight: ch, gap: GRID_GAP, pad: GRID_PAD });
    return { cols, cw, ch, em, width, height, dpr, font: `bold ${em}px ${style.fontFamily}` };
  }

  function cellPath(x, y, w, hgt, inset) {
    ctx.beginPath();
    ctx.roundRect(x + inset, y + inset, w - 2 * inset, hgt - 2 * inset, Math.max(0, CELL_RADIUS - inset));
  }

  function drawCell(i, x, y) {
    const { data, palette, blockSize, touched, selected, head } = shown;
    const { cw, ch, em } = layout;
    const code = data.state[i] in STATE_NAMES ? data.state[i] : "f";
    const look = palette.blocks, name = STATE_NAMES[code];
    const ref = data.ref[i], owner = data.owner[i], owner2 = data.owner2[i];
    ctx.save();
    cellPath(x, y, cw, ch, 0);
    ctx.clip();
    const background = code === "c" ? look.cached : code === "n" ? look.null
      : (code === "u" && owner >= 0 ? seqColour(palette, owner) : null);
    if (background) { ctx.fillStyle = background; ctx.fillRect(x, y, cw, ch); }
    const steps = Math.round((FILL_STEPS * data.fill[i]) / blockSize);
    if (steps > 0) {  // the fill bar along the bottom, inside the border
      ctx.fillStyle = look.bar[name];
      ctx.fillRect(x + 1, y + ch - 1 - BAR_HEIGHT, ((cw - 2) * steps) / FILL_STEPS, BAR_HEIGHT);
    }
    if (code === "u" && owner >= 0 && owner2 >= 0) {  // the second owner: a strip on the right
      ctx.fillStyle = seqColour(palette, owner2);
      ctx.fillRect(x + cw - 1 - CELL_EM.strip * em, y + 1, CELL_EM.strip * em, ch - 2);
    }
    const group = data.group ? data.group[i] : -1;
    if (group >= 0) {  // its KV-cache group's badge, bottom right, above the fill bar (as svg.py's)
      const side = Math.round(em);
      const bx = x + cw - 2 - side, by = y + ch - 2 - BAR_HEIGHT - side;
      ctx.fillStyle = groupColour(palette, group);
      ctx.fillRect(bx, by, side, side);
      ctx.fillStyle = "#000000";
      ctx.textAlign = "center";
      ctx.fillText(String(group), bx + side / 2, by + 1);
    }
    ctx.restore();
    cellPath(x, y, cw, ch, 0.5);
    ctx.setLineDash(code === "f" ? [3, 3] : []);
    ctx.strokeStyle = look.border;
    ctx.lineWidth = 1;
    ctx.stroke();
    ctx.setLineDash([]);
    const number = start + i;
    ctx.fillStyle = number === head ? look.head : look.text[name];
    ctx.textAlign = "left";
    ctx.fillText(String(number), x + 4, y + 3);
    ctx.fillStyle = look.text[name];
    const sup = ref > 1 ? superscript(ref) : (code === "c" ? "c" : code === "n" ? "∅" : "");
    if (sup) { ctx.textAlign = "right"; ctx.fillText(sup, x + cw - 4, y + 2); }
    const mark = number === selected ? "selected" : (touched.has(number) ? "touched" : null);
    if (mark) {  // an outline inside the cell, as outline-offset: -width
      cellPath(x, y, cw, ch, OUTLINE_WIDTH[mark] / 2);
      ctx.strokeStyle = look[mark];
      ctx.lineWidth = OUTLINE_WIDTH[mark];
      ctx.stroke();
    }
  }

  // Whether cell i looks the same in two frames (`shown` objects).
  function sameCell(a, b, i) {
    const x = a.data, y = b.data, number = start + i;
    return x.state[i] === y.state[i] && x.ref[i] === y.ref[i] && x.fill[i] === y.fill[i] &&
      x.owner[i] === y.owner[i] && x.owner2[i] === y.owner2[i] &&
      (x.group ? x.group[i] : -1) === (y.group ? y.group[i] : -1) &&
      (a.selected === number) === (b.selected === number) && a.touched.has(number) === b.touched.has(number) &&
      (a.head === number) === (b.head === number);
  }

  // Paint the rows in view from `shown`: every cell in view after a scroll, a resize or a new
  // palette, else only the cells that look different from the last paint. Then write what was
  // painted from onto the canvas.
  function paint() {
    if (!shown || !grid.isConnected || grid.clientWidth === 0) return;
    if (!layout || layout.dpr !== (window.devicePixelRatio || 1)) layout = measure();
    const { cols, cw, ch, dpr, height, font } = layout;
    const top = grid.scrollTop;
    const pitchX = cw + GRID_GAP, pitchY = ch + GRID_GAP;
    const last = painted && painted.layout === layout && painted.top === top &&
      painted.shown.palette === shown.palette && painted.shown.blockSize === shown.blockSize ? painted.shown : null;
    ctx.setTransform(dpr, 0, 0, dpr, 0, -top * dpr);  // content coordinates: the canvas sits at scrollTop
    if (!last) ctx.clearRect(0, top, layout.width, height);
    ctx.font = font;
    ctx.textBaseline = "top";
    const firstRow = Math.max(0, Math.floor((top - GRID_PAD) / pitchY));
    const lastRow = Math.floor((top + height - GRID_PAD) / pitchY);
    for (let row = firstRow; row <= lastRow; row++) {
      for (let col = 0; col < cols; col++) {
        const i = row * cols + col;
        if (i >= n) break;
        if (last && sameCell(last, shown, i)) continue;
        const x = GRID_PAD + col * pitchX, y = GRID_PAD + row * pitchY;
        if (last) ctx.clearRect(x, y, cw, ch);
        drawCell(i, x, y);
      }
    }
    if (!painted || painted.shown !== shown) {
      const { data, touched, selected } = shown;
      const before = canvas.bvWritten;  // the record data-states / data-refs were last written from
      if (!before || before.state !== data.state) canvas.dataset.states = data.state;
      if (!before || data.ref.some((ref, i) => ref !== before.ref[i])) canvas.dataset.refs = data.ref.join(",");
      canvas.bvWritten = data;
      canvas.dataset.touched = [...touched].join(",");
      canvas.dataset.selected = selected >= 0 ? String(selected) : "";
      canvas.dataset.head = shown.head >= 0 ? String(shown.head) : "";
      if (data.group) canvas.dataset.groups = data.group.join(",");
    }
    painted = { shown, layout, top };
  }

  // The block under a pointer event, or -1 (a gap, the padding, past the last block).
  function blockAt(event) {
    if (!layout) return -1;
    const box = canvas.getBoundingClientRect();
    const x = event.clientX - box.left - GRID_PAD, y = event.clientY - box.top + grid.scrollTop - GRID_PAD;
    const pitchX = layout.cw + GRID_GAP, pitchY = layout.ch + GRID_GAP;
    const col = Math.floor(x / pitchX), row = Math.floor(y / pitchY);
    if (x < 0 || y < 0 || col >= layout.cols || x - col * pitchX > layout.cw || y - row * pitchY > layout.ch) return -1;
    const i = row * layout.cols + col;
    return i < n ? i : -1;
  }

  grid.addEventListener("scroll", paint, { passive: true });
  const resized = new ResizeObserver(() => { layout = null; paint(); });
  resized.observe(grid);
  grid.bvRelayout = () => { layout = null; paint(); };  // now: a new font size (display.js fitToCard)
  canvas.addEventListener("mousemove", (event) => {  // the tooltip: made when the block under it changes
    const i = blockAt(event);
    if (i === hovered) return;
    hovered = i;
    canvas.title = i >= 0 && shown ? blockTitle(device, i, shown.data, shown.blockSize, start + i) : "";
    canvas.style.cursor = i >= 0 ? "pointer" : "default";
  });
  canvas.addEventListener("mouseleave", () => { hovered = -1; });
  canvas.addEventListener("click", (event) => {
    const i = blockAt(event);
    if (i >= 0) model.send({ event: "select", device, number: start + i });
  });

  function draw(data, palette, blockSize, touched, selected, head = -1) {
    shown = { data, palette, blockSize, touched: new Set(touched), selected, head };
    if (hovered >= 0) canvas.title = blockTitle(device, hovered, data, blockSize, start + hovered);
    paint();
  }
  return { element: grid, n, draw, dispose: () => resized.disconnect() };
}

const ZOOM_CELL_EM = 1.2, ZOOM_GAP = 2;  // a zoomed-out cell's side, as svg.py's ZOOM_CELL_EM / ZOOM_GAP

// A pool drawn zoomed out: one small square per `perCell` blocks from `start` to `stop`, each
// painted from the frame's per-cell records (data.cells: bars, grounds, the counts), the cell
// holding the selected or a touched block outlined. All cells are painted each frame (a few
// hundred rectangles); what was painted is on the canvas: data-states (the state most of each
// cell's blocks are in), data-used / data-cached / data-free / data-null (comma-separated, per
// cell), data-bars, data-touched / data-selected (cells), the range (data-start, data-stop,
// data-per-cell, data-cells) and the layout (data-cols, data-cell-width, data-gap, data-pad).
function zoomGrid(model, device, n, start, stop, perCell) {
  const numCells = Math.ceil((stop - start) / perCell);
  const canvas = h("canvas", { class: "bv-zoom-canvas", "data-device": device, "data-n": n, "data-start": start,
    "data-stop": stop, "data-per-cell": perCell, "data-cells": numCells, role: "img",
    "aria-label": `${device} pool, ${n} blocks, 1 cell = ${perCell} blocks` });
  const grid = h("div", { class: "bv-grid bv-canvas-grid bv-zoom-grid", "data-device": device }, canvas);
  const ctx = canvas.getContext("2d");
  let shown = null, layout = null;

  function measure() {
    const em = parseFloat(getComputedStyle(grid).fontSize) || 12;
    const width = grid.clientWidth, side = Math.round(ZOOM_CELL_EM * em);
    const cols = Math.max(1, Math.floor((width - 2 * GRID_PAD + ZOOM_GAP) / (side + ZOOM_GAP)));
    const height = 2 * GRID_PAD + Math.ceil(numCells / cols) * (side + ZOOM_GAP) - ZOOM_GAP;
    const dpr = sizeCanvas(canvas, width, height);
    Object.assign(canvas.dataset, { cols, cellWidth: side, cellHeight: side, gap: ZOOM_GAP, pad: GRID_PAD });
    return { cols, side, width, height, dpr };
  }

  const cellOf = (number) => (number >= start && number < stop ? Math.floor((number - start) / perCell) : -1);

  function paint() {
    if (!shown || !grid.isConnected || grid.clientWidth === 0) return;
    if (!layout || layout.dpr !== (window.devicePixelRatio || 1)) layout = measure();
    const { cols, side, dpr } = layout;
    const { data, palette, touched, selected } = shown;
    const look = palette.blocks, cells = data.cells;
    const grounds = { c: look.cached, n: look.null, f: null };
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, layout.width, layout.height);
    const marks = new Map();
    for (const number of touched) if (cellOf(number) >= 0) marks.set(cellOf(number), "touched");
    if (cellOf(selected) >= 0) marks.set(cellOf(selected), "selected");
    for (let i = 0; i < numCells; i++) {
      const x = GRID_PAD + (i % cols) * (side + ZOOM_GAP), y = GRID_PAD + Math.floor(i / cols) * (side + ZOOM_GAP);
      const ground = grounds[cells.grounds[i]];
      if (ground) { ctx.fillStyle = ground; ctx.fillRect(x, y, side, side); }
      const eighths = Number(cells.bars[i]);
      if (eighths > 0) {
        const height = ((side - 2) * eighths) / 8;
        ctx.fillStyle = look.used;
        ctx.fillRect(x + 1, y + side - 1 - height, side - 2, height);
      }
      ctx.strokeStyle = look.border;
      ctx.lineWidth = 1;
      ctx.strokeRect(x + 0.5, y + 0.5, side - 1, side - 1);
      const mark = marks.get(i);
      if (mark) {
        const width = OUTLINE_WIDTH[mark];
        ctx.strokeStyle = look[mark];
        ctx.lineWidth = width;
        ctx.strokeRect(x + width / 2, y + width / 2, side - width, side - width);
      }
    }
    Object.assign(canvas.dataset, { states: data.state, used: cells.used.join(","), cached: cells.cached.join(","),
      free: cells.free.join(","), null: cells.null.join(","), bars: cells.bars,
      touched: [...marks].filter(([, mark]) => mark === "touched").map(([i]) => i).join(","),
      selected: cellOf(selected) >= 0 ? String(cellOf(selected)) : "" });
  }

  function cellAt(event) {
    if (!layout) return -1;
    const box = canvas.getBoundingClientRect();
    const x = event.clientX - box.left - GRID_PAD, y = event.clientY - box.top - GRID_PAD;
    const pitch = layout.side + ZOOM_GAP, col = Math.floor(x / pitch), row = Math.floor(y / pitch);
    if (x < 0 || y < 0 || col >= layout.cols) return -1;
    const i = row * layout.cols + col;
    return i < numCells ? i : -1;
  }
  const blocksOf = (i) => [start + i * perCell, Math.min(start + (i + 1) * perCell, stop)];

  const resized = new ResizeObserver(() => { layout = null; paint(); });
  resized.observe(grid);
  canvas.addEventListener("mousemove", (event) => {
    const i = cellAt(event);
    if (i < 0 || !shown) { canvas.title = ""; return; }
    const [first, end] = blocksOf(i), cells = shown.data.cells;
    canvas.title = `${device} blocks ${first}-${end - 1} · ${cells.used[i]} used · ${cells.cached[i]} cached · ` +
      `${cells.free[i]} free · click to zoom in`;
    canvas.style.cursor = "zoom-in";
  });
  canvas.addEventListener("click", (event) => {
    const i = cellAt(event);
    if (i < 0) return;
    const [first, end] = blocksOf(i);
    model.send({ event: "zoom_pool", device, start: first, stop: end });
  });

  function draw(data, palette, blockSize, touched, selected) {
    shown = { data, palette, touched, selected };
    paint();
  }
  return { element: grid, n, draw, dispose: () => resized.disconnect() };
}
