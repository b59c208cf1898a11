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
    title.textContent = `${c.title} · moment at event ${c.position}/${c.length} · step ${c.steps_done}/${c.num_steps}`;
    current.textContent = c.current || "start: no event applied yet";
    el.dataset.position = String(c.position);
    el.dataset.length = String(c.length);
  };
}
RENDERERS.moment = renderMoment;
