// blockviz radix tree view (kv_manager "sglang"): SGLang's RadixCache as blockviz.model.radix_view's
// record draws it (frame.radix): the sizes, one row per node indented by depth (data-node / data-parent
// / data-tokens / data-lock / data-slots / data-evictable, what a browser test reads back), the nodes
// not drawn counted, the last split, the last eviction and why, each running request's match; the card's
// requests' rows (their pages and match) first. Not a
// module of its own: widgets.py appends it to blockviz.js (its helper h; RENDERERS picks it by `_kind`).
// ------------------------------------------------------------------ radix tree

function radixRanges(numbers) {  // radix_view.number_ranges: [2, 3, 4, 7] -> "2-4,7"
  const runs = [];
  for (const n of numbers) {
    if (runs.length && n === runs[runs.length - 1][1] + 1) runs[runs.length - 1][1] = n;
    else runs.push([n, n]);
  }
  return runs.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(",") || "—";
}

function radixNodeRow(n) {
  const lock = n.lock_ref ? `lock ${n.lock_ref}` + (n.holders.length ? ` (${n.holders.join(", ")})` : "")
    : n.evictable ? "evictable" : "unlocked";
  const state = n.lock_ref ? " bv-radix-locked" : n.evictable ? " bv-radix-evictable" : "";
  return h("div", { class: "bv-radix-node" + state + (n.about ? " bv-radix-about" : ""),
    "data-node": n.id, "data-parent": n.parent === null ? "" : n.parent, "data-tokens": n.num_tokens,
    "data-lock": n.lock_ref, "data-slots": n.slots.join(","), "data-evictable": String(n.evictable),
    style: { paddingLeft: `${1.5 * n.depth + 0.5}em` } },
    h("b", { text: `#${n.id}` }), ` ${n.num_tokens}t `,
    h("span", { class: "bv-radix-lock", text: lock }),
    n.last_access === null ? "" : h("span", { class: "bv-dim", text: ` @${n.last_access}` }),
    h("span", { class: "bv-dim", text: ` blocks ${radixRanges(n.blocks)} ` }),
    h("span", { class: "bv-tokens" }, n.tokens.map((t) => h("span", { class: "bv-slot", text: t })),
      n.num_tokens > n.tokens.length ? "…" : ""));
}

function renderRadix(model, el) {
  const head = h("div", { class: "bv-dim" });
  const body = h("div", { class: "bv-radix" });
  el.append(h("div", { class: "bv-title", text: "Radix tree (SGLang RadixCache)" }), head, body);
  return (frame) => {
    const r = frame.radix;
    if (!r) return;
    Object.assign(body.dataset, { nodes: r.num_nodes, more: r.num_more, evictable: r.evictable_size,
      protected: r.protected_size });
    head.textContent = `evictable ${r.evictable_size} · protected ${r.protected_size} tokens · ${r.num_nodes} nodes · ` +
      `${r.num_tokens} tokens · page_size ${r.page_size} · @ last access step`;
    // the rows of the requests the card is about (their pages: their ReqToTokenPool rows), above the tree
    const rows = [...(r.requests || []).map((m) => h("div", { class: "bv-radix-request", "data-seq": m.seq,
      "data-pages": m.pages.join(","), text: `▶ ${m.name} · ${m.status || "gone"} · pages ${radixRanges(m.pages)} · ` +
        `matched ${m.num_tokens} tokens` + (m.num_tokens ? `: slots ${radixRanges(m.slots)} in ` +
        m.nodes.map((id) => `#${id}`).join(", ") : "") })),
      h("div", { class: "bv-dim", text: r.nodes.length ? "root" : "root (empty: a prompt enters the tree after its prefill)" }),
      ...r.nodes.map(radixNodeRow)];
    if (r.num_more) rows.push(h("div", { class: "bv-dim", text: `… ${r.num_more} more nodes` }));
    const s = r.last_split, e = r.last_evicted;
    if (s) rows.push(h("div", { class: "bv-radix-split", "data-node": s.node, "data-new-node": s.new_node, "data-at": s.at,
      text: `split (step ${s.step}): #${s.new_node} took ${s.at} tokens ${s.head.join("")} | #${s.node} kept ${s.tail.join("")}` }));
    // the evict call that took it: how many tokens it was asked for and freed (a RadixEvict event)
    if (e) rows.push(h("div", { class: "bv-radix-evicted", "data-node": e.node, "data-slots": e.slots.join(","),
      "data-asked": e.asked ?? "", "data-freed": e.freed ?? "",
      text: `evicted (step ${e.step}): #${e.node}` + (e.asked != null ? ` (evict asked ${e.asked}, freed ${e.freed})` : "") +
        `, ${e.num_tokens} tokens, slots ${radixRanges(e.slots)} ` +
        `(blocks ${radixRanges(e.blocks)}): ${e.why}` }));
    for (const m of r.matches) rows.push(h("div", { class: "bv-radix-match", "data-seq": m.seq, "data-tokens": m.num_tokens,
      text: `${m.name} matched ${m.num_tokens} tokens` + (m.num_tokens ? `: slots ${radixRanges(m.slots)} in ` +
        m.nodes.map((id) => `#${id}`).join(", ") : "") }));
    body.replaceChildren(...rows);
    const about = body.querySelector(".bv-radix-about");  // the node the cursor is about, scrolled into the view
    if (about) body.scrollTop = Math.max(0, about.offsetTop - body.offsetTop - about.offsetHeight);
  };
}
