// blockviz page: the kernel's part in an exported page (blockviz/webpage/page.py).
// The notebook's ES module (the bv-esm element, blockviz/jupyter/static/*.js as widgets.py joins
// them) draws every view; this controller gives each view an object with anywidget's model methods
// (get, set, save_changes, send, on, off) and answers the messages the views send as the Visualizer
// does (blockviz/jupyter/buttons.py, visualizer.py, model/player.py), from the frames computed in
// Python (blockviz/webpage/frames.py) and unpacked here with DecompressionStream. Nothing is fetched.

const root = document.getElementById("bv-page");

async function unpack(id) {
  const text = document.getElementById(id).textContent.trim();
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

// anywidget's model, as a view sees it: traits, change events, messages to the kernel.
class PageModel {
  constructor(traits, controller) {
    this.traits = { ...traits };
    this.handlers = {};
    this.dirty = new Set();
    this.controller = controller;
  }
  get(key) { return this.traits[key]; }
  set(key, value) {
    if (this.traits[key] === value) return;
    this.traits[key] = value;
    this.dirty.add(key);
    this.emit(`change:${key}`);
  }
  save_changes() {
    const keys = [...this.dirty];
    this.dirty.clear();
    this.controller.saved(this, keys);
  }
  send(message) { this.controller.handle(message); }
  on(name, fn) { (this.handlers[name] = this.handlers[name] || []).push(fn); }
  off(name, fn) { this.handlers[name] = (this.handlers[name] || []).filter((f) => f !== fn); }
  emit(name) { for (const fn of [...(this.handlers[name] || [])]) fn(); }
  update(traits) {  // the kernel's side of a sync: no save_changes back
    for (const [key, value] of Object.entries(traits)) this.set(key, value);
    this.dirty.clear();
  }
}

// The views' parts of a frame (widgets.py's `parts`).
const PARTS = {
  pool: ["block_size", "pools", "touched", "selected", "free_queue", "notes", "kv_cache_groups", "card"],
  inspector: ["inspector"], tables: ["tables", "block_size", "card"], hashes: ["hashes", "hash_summary"],
  log: ["log"], explain: ["explain"], ledger: ["ledger"], memory: ["memory"], breaks: ["breaks"],
  controls: ["cursor", "card"], radix: ["radix"],
};
const SECTION_TITLES = { explain: "Prefix lookup (why it hit or missed)", ledger: "Preemption ledger",
  memory: "Memory: blocks vs tokens", radix: "Radix tree (SGLang RadixCache)" };

function bisectRight(list, x) {
  let lo = 0, hi = list.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (list[mid] <= x) lo = mid + 1; else hi = mid; }
  return lo;
}

class Controller {
  constructor(data, esm) {
    const meta = (this.meta = data.meta);
    this.values = null;  // all of them once unpacked (main); until then `first`, position 0's
    this.first = data.first;
    this.keyIndex = Object.fromEntries(data.keys.map((k, i) => [k, i]));
    // every position's value index per key, built from the deltas (-1: the key is absent)
    this.index = [];
    let row = new Int32Array(data.keys.length).fill(-1);
    for (const delta of data.deltas) {
      row = row.slice();
      for (let i = 0; i < delta.length; i += 2) row[delta[i]] = delta[i + 1];
      this.index.push(row);
    }
    this.eventTypes = meta.log.map((r) => r[1]);
    this.position = 0;
    this.playing = false;
    this.toBreak = false;
    this.budget = 0;
    this.speedIndex = meta.speed_index;
    this.selected = null;
    this.picked = null;
    this.filter = "all events";
    this.breakOn = (this.part(0, "breaks") || { on: [] }).on.slice();
    this.playStopsAtBreaks = false;
    this.breakMessage = "";
    this.zoom = meta.zoom || 1;
    this.poolRanges = {};  // device -> the first block of the zoomed-out cell drawn block by block (Visualizer.pool_ranges)
    this.projector = !!meta.projector;
    this.views = {};
    this.layout(esm);
    this.show();
  }

  part(position, key) {
    const k = this.keyIndex[key];
    if (k === undefined) return undefined;
    const v = this.index[position][k];
    return v < 0 ? undefined : this.values ? this.values[v] : this.first[v];
  }

  palette() { return this.projector ? this.meta.projector_palette : this.meta.palette; }

  layout(esm) {
    const meta = this.meta;
    const make = (kind, extra = {}) => {
      const model = new PageModel({ _kind: kind, frame: {}, zoom: this.zoom, projector: this.projector, ...extra }, this);
      const el = document.createElement("div");
      el.className = "bv-page-view";
      esm.render({ model, el });
      this.views[kind] = { model, el, shown: "" };
      return el;
    };
    const palette = { palette: this.palette() };
    const row = (...children) => { const r = document.createElement("div"); r.className = "bv-page-row"; r.append(...children); return r; };
    const sections = ["explain", "ledger", "memory", ...(meta.radix ? ["radix"] : [])].map((kind) => {
      const details = document.createElement("details");
      details.className = "bv-page-section";
      details.dataset.section = kind;
      details.open = kind === "radix";  // a radix-tree run's tree, open as in the notebook
      const summary = document.createElement("summary");
      summary.textContent = SECTION_TITLES[kind];
      details.append(summary, make(kind));
      return details;
    });
    root.replaceChildren(
      make("controls", { speeds: meta.speed_labels, zooms: meta.zooms }),
      make("breaks", { kinds: meta.break_kinds, break_on: this.breakOn }),
      row(make("pool", { ...palette, renderer: "canvas" }), make("inspector", palette)),
      row(make("tables", palette), make("hashes")),
      make("log", { filters: Object.keys(meta.filters), filter: this.filter }),
      ...sections,
    );
  }

  // ------------------------------------------------------------------ frames

  frame() {
    const p = this.position, meta = this.meta;
    const frame = {};
    for (const key of Object.keys(this.keyIndex)) {
      if (key.includes(" ")) continue;
      const value = this.part(p, key);
      if (value !== undefined) frame[key] = value;
    }
    frame.cursor = { ...frame.cursor, playing: this.playing, speed_index: this.speedIndex,
      speed: meta.speed_labels[this.speedIndex] };
    if (this.playing) {  // Player.card: no card while playback moves
      frame.card = null;
      frame.touched = this.part(p, "touched playing") || {};
    }
    for (const [where, start] of Object.entries(this.poolRanges)) {  // view.snapshot's ranges
      const range = this.part(p, `zoom ${where}:${start}`), whole = frame.pools && frame.pools[where];
      if (!range || !whole) continue;
      const counts = Object.fromEntries(["n", "used", "cached", "free", "empty_line"].map((k) => [k, whole[k]]));
      frame.pools = { ...frame.pools, [where]: { ...range, ...counts } };
    }
    const [device, number] = this.selected || [];
    const inspector = this.selected ? this.part(p, `inspector ${device}:${number}`) : undefined;
    frame.selected = inspector ? this.selected : null;
    frame.inspector = inspector || null;
    let explain;
    if (this.picked !== null) explain = this.part(p, `explain r:${this.picked}`);
    else if (inspector && inspector.owners.length) explain = this.part(p, `explain s:${inspector.owners[0]}`);
    frame.explain = explain || this.part(p, "explain");
    frame.log = { filter: this.filter, rows: this.logRows() };
    frame.breaks = { on: [...this.breakOn].sort(), message: this.breakMessage };
    return frame;
  }

  // view.event_log: the last max_log_rows events up to the cursor the filter keeps, oldest first
  logRows() {
    const kinds = this.meta.filters[this.filter], keep = kinds ? new Set(kinds) : null;
    const rows = [];
    const stop = Math.max(0, this.position - this.meta.max_log_scan);
    for (let i = this.position - 1; i >= stop && rows.length < this.meta.max_log_rows; i--) {
      if (!keep || keep.has(this.eventTypes[i])) rows.push(this.meta.log[i]);
    }
    return rows.reverse();
  }

  show() {
    const frame = this.frame();
    // the controls last: once they show a position, every view has its frame (Visualizer.views)
    for (const kind of ["pool", "inspector", "tables", "hashes", "log", "explain", "ledger", "memory", "radix", "breaks",
                        "controls"]) {
      const view = this.views[kind];
      if (!view) continue;  // radix: only a radix-tree run's page has it
      const part = {};
      for (const key of PARTS[kind]) if (key in frame) part[key] = frame[key];
      const text = JSON.stringify(part);
      if (text === view.shown) continue;
      view.shown = text;
      view.model.update({ frame: part });
    }
    root.dataset.position = String(this.position);
    root.dataset.playing = String(this.playing);
    if (root.dataset.ready !== "true") {
      root.dataset.ready = "true";
      // from the start of navigation to the first frame painted (benchmarks/html_page.py reads it)
      requestAnimationFrame(() => { root.dataset.firstFrameMs = performance.now().toFixed(1); });
    }
  }

  // ------------------------------------------------------------------ the views' messages (buttons.py)

  handle(message) {
    if (!this.values) { this.ready.then(() => this.handle(message)); return; }  // still unpacking
    const meta = this.meta, length = meta.length;
    switch (message.event) {
      case "action": {
        const action = message.action;
        if (action === "pause" || (action === "play" && this.playing)) this.pause();
        else if (action === "play") this.play();
        else if (action === "step_event") this.moveTo(Math.min(this.position + 1, length));
        else if (action === "step") {
          const i = bisectRight(meta.step_ends, this.position);
          this.moveTo(i < meta.step_ends.length ? meta.step_ends[i] : length);
        } else if (action === "back") this.moveTo(Math.max(0, this.position - 1));
        else if (action === "back_step") this.seek(this.previousStepEnd());
        else if (action === "start") this.seek(0);
        else if (action === "end") this.seek(length);
        else if (action === "next_card") this.nextCard();
        break;
      }
      case "seek": this.seek(Number(message.position) || 0); break;
      case "speed":
        this.speedIndex = Math.max(0, Math.min(Number(message.index) || 0, meta.speeds.length - 1));
        this.show();
        break;
      case "zoom": this.setLook(Number(message.zoom) || 1, this.projector); break;
      case "projector": {
        const on = !!message.on;
        this.setLook(on ? Math.max(this.zoom, meta.projector_zoom) : this.zoom, on);
        break;
      }
      case "select":
        if (!meta.inspected) break;  // a zoomed-out pool: a cell stands for many blocks
        this.selected = [String(message.device), Number(message.number)];
        this.picked = null;
        this.show();
        break;
      case "pick": this.picked = String(message.request); this.show(); break;
      case "break": this.goToBreak(message.direction); break;
      case "zoom_pool": {  // Visualizer.zoom_pool: a zoomed-out cell's blocks, or (no start) the whole pool
        const device = String(message.device), start = message.start;
        if (start === undefined || start === null) delete this.poolRanges[device];
        else if (`zoom ${device}:${Number(start)}` in this.keyIndex) this.poolRanges[device] = Number(start);
        this.show();
        break;
      }
      default: break;
    }
  }

  saved(model, keys) {
    if (!this.values) { this.ready.then(() => this.saved(model, keys)); return; }
    if (keys.includes("filter")) { this.filter = model.get("filter"); this.show(); }
    if (keys.includes("break_on")) {  // Player.break_on's setter: playing stops at them from now on
      this.breakOn = (model.get("break_on") || []).slice();
      this.playStopsAtBreaks = true;
      this.show();
    }
  }

  setLook(zoom, projector) {
    this.zoom = zoom;
    this.projector = projector;
    for (const { model } of Object.values(this.views)) {
      model.update({ zoom, projector, ...("palette" in model.traits ? { palette: this.palette() } : {}) });
    }
  }

  // ------------------------------------------------------------------ the cursor (Timeline, Player)

  moveTo(position) { this.stopPlaying(); this.position = position; this.show(); }
  seek(position) { this.moveTo(this.meta.landing[Math.max(0, Math.min(Math.trunc(position), this.meta.length))]); }

  previousStepEnd() {
    const ends = this.meta.step_ends;
    let lo = 0, hi = ends.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (ends[mid] < this.position) lo = mid + 1; else hi = mid; }
    return lo > 0 ? ends[lo - 1] : 0;
  }

  // Guide.next_stop: the first card stop in (start, stop]
  nextStop(start, stop) {
    const stops = this.meta.stops, i = bisectRight(stops, start);
    return i < stops.length && stops[i] <= stop ? stops[i] : null;
  }

  // Guide.spanning: the card whose idea is under way at `position`, as its stop
  spanningStop(position) {
    const stops = this.meta.stops, i = bisectRight(stops, position);
    return i < stops.length && this.meta.spans[i][0] < position ? stops[i] : null;
  }

  // Timeline.next_of: the position just after the first event of `kinds` among events[start:stop]
  nextOf(kinds, start, stop) {
    for (let i = start; i < Math.min(stop, this.meta.length); i++) if (kinds.has(this.eventTypes[i])) return i + 1;
    return null;
  }

  // Timeline.previous_of
  previousOf(kinds, before = null) {
    for (let i = before === null ? this.position - 2 : before - 1; i >= 0; i--) if (kinds.has(this.eventTypes[i])) return i + 1;
    return null;
  }

  nextCard() {
    const stop = this.nextStop(this.position, this.meta.length);
    this.moveTo(stop === null ? this.meta.length : stop);
    return stop === null ? null : this.part(stop, "card");
  }

  // InsightPanel.go_to_break with Visualizer.run_until / back_to
  goToBreak(direction) {
    const kinds = new Set(this.breakOn), meta = this.meta;
    if (!kinds.size && meta.guided && direction === "next") {
      const card = this.nextCard();
      this.breakMessage = card ? `${card.title} (event ${this.position})` : "no further card: at the end";
    } else if (!kinds.size) {
      this.breakMessage = "tick an event kind first";
    } else {
      let found = null;
      if (direction === "previous") {
        let target = this.previousOf(kinds);
        while (target !== null && meta.landing[target] >= this.position) {
          const start = meta.op_start[target];
          target = start >= 0 ? this.previousOf(kinds, start) : null;
        }
        if (target !== null) { found = target; this.moveTo(meta.landing[target]); }
      } else {
        found = this.nextOf(kinds, this.position, meta.length);
        this.moveTo(found !== null ? meta.landing[found] : meta.length);
      }
      const names = [...kinds].sort().join(", ");
      this.breakMessage = found === null ? (direction === "previous" ? `no earlier ${names}` : `no later ${names}: at the end`)
        : `stopped at event ${this.position}: ${this.eventTypes[found - 1]}`;
    }
    this.show();
  }

  // ------------------------------------------------------------------ playback (Player.tick)

  play() {
    this.stopPlaying();
    this.playing = true;
    this.toBreak = false;
    this.budget = 0;
    if (this.position >= this.meta.length) this.position = 0;  // replay again from the start
    let last = performance.now();
    this.timer = setInterval(() => {
      const now = performance.now();
      this.tick((now - last) / 1000);
      last = now;
      if (!this.playing) this.stopPlaying();
      this.show();
    }, 50);
    this.show();
  }

  pause() { this.stopPlaying(); this.show(); }

  stopPlaying() {
    this.playing = false;
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  tick(dt) {
    const meta = this.meta, length = meta.length, speed = meta.speeds[this.speedIndex];
    const guided = meta.guided;
    let target;
    if (speed === null) target = length;
    else {
      const near = guided && this.nextStop(this.position, this.position + meta.guide_slow_events) !== null;
      this.budget += (near ? Math.min(speed, meta.guide_slow_speed) : speed) * dt;
      const count = Math.floor(this.budget);
      this.budget -= count;
      target = Math.min(this.position + count, length);
    }
    if (target > this.position) {  // an operation is drawn whole, its extra events paid by the next frames
      const landed = meta.landing[target];
      this.budget -= landed - target;
      target = landed;
    }
    const stops = [];
    if (this.breakOn.length && (this.toBreak || this.playStopsAtBreaks)) {
      let stop = this.nextOf(new Set(this.breakOn), this.position, target);
      if (stop !== null) stop = meta.landing[stop];
      const cardStop = guided && stop !== null ? this.spanningStop(stop) : null;
      stops.push(cardStop === null ? stop : cardStop <= target ? cardStop : null);
    }
    if (guided) stops.push(this.nextStop(this.position, target));
    const found = stops.filter((s) => s !== null);
    const stop = found.length ? Math.min(...found) : null;
    if (target !== this.position) this.position = stop !== null ? stop : target;
    if (stop !== null || this.position >= length) this.playing = false;
  }
}

// The printed handout (page.css's print rules show only it): each card's text beside its frozen
// picture, drawn in Python (page.py's moments), in a section the screen never shows.
async function buildPrint() {
  const { title, moments } = await unpack("bv-print");
  const section = document.createElement("section");
  section.className = "bv-print";
  const heading = document.createElement("h1");
  heading.textContent = title;
  section.append(heading);
  const loaded = [];
  for (const moment of moments) {
    const figure = document.createElement("figure");
    figure.className = "bv-print-card";
    figure.dataset.position = String(moment.position);
    const caption = document.createElement("figcaption");
    const name = document.createElement("h2");
    name.textContent = moment.title;
    caption.append(name);
    for (const line of moment.lines) { const p = document.createElement("p"); p.textContent = line; caption.append(p); }
    const img = document.createElement("img");
    img.alt = `event ${moment.position}`;
    loaded.push(new Promise((resolve) => { img.onload = img.onerror = resolve; }));
    img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(moment.svg)}`;
    figure.append(caption, img);
    section.append(figure);
  }
  document.body.append(section);
  await Promise.all(loaded);
  root.dataset.print = "true";
}

async function main() {
  const esmText = document.getElementById("bv-esm").textContent;
  const url = URL.createObjectURL(new Blob([esmText], { type: "text/javascript" }));
  const [esm, data] = await Promise.all([import(url).then((m) => m.default), unpack("bv-data")]);
  URL.revokeObjectURL(url);
  // the first frame from the small part; every other value once the browser has unpacked them
  const controller = (window.blockvizPage = new Controller(data, esm));
  const painted = new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve)));
  controller.ready = painted.then(() => unpack("bv-values")).then((values) => { controller.values = values; });
  await controller.ready;
  root.dataset.values = "true";
  await buildPrint();
}

main().catch((error) => {
  root.dataset.error = String(error);
  root.textContent = `This page could not start: ${error}`;
});
