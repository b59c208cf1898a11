"""A guided card and every block it names on one screen in the notebook (issue 45, items 1-4), in
JupyterLab and chromium at a projector's 1280x720 and at 1920x1080, plain and in projector mode,
with the controls scrolled to the top of the notebook as a speaker leaves them: for every card of
each story in STORIES, the card's text and the cell of every block it names (found from the pool
canvas's data-cols / data-cell-* layout and the grid's box) lie inside the part of the page in
view (the window cut by every clipping ancestor), on a canvas that painted the whole pool; the
block tables are scrolled to the card's sequence; the free queue has no stray "null"; the null
block's slots in the hybrid tables are readable (WCAG contrast from the computed styles).

One notebook holds a Visualizer per story; the test steps through the cards with the "next idea ▸"
button (the widget's own message), never re-opening the page. A story added to STORIES (a CPU-tier
story) is checked the same way. Fixtures: tests/jupyter_fixtures.py, tests/story_fixtures.py."""

from __future__ import annotations

import pytest

from jupyter_fixtures import UI_LIMIT_MS, kernel_json, open_notebook, run_all_cells
from story_fixtures import story_trace_path  # noqa: F401 (fixture)

# (name, the trace Visualizer.from_trace opens: a shipped trace's name, or "story" for the default
# story recorded by the story_trace_path fixture)
STORIES = [("v0", "story"), ("v1", "v1-story"), ("hybrid", "hybrid"), ("cpu-tier", "cpu-tier"), ("sglang", "sglang-story")]
SIZES = [(1280, 720), (1920, 1080)]
LOOKS = ["plain", "projector"]
MIN_CONTRAST = 4.5  # WCAG AA for text

FRAMES = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"

# What the page shows of Visualizer `k`'s card once its controls are scrolled to the top: whether
# the card's text and each named block's cell are in view, whether the tables box shows the card's
# sequence, and the free queue's words.
ON_SCREEN_JS = """([k, blocks, seqs]) => {
    const controls = document.querySelectorAll('.bv-view-controls')[k];
    const box = controls.closest('.blockviz');
    controls.scrollIntoView({ block: 'start' });
    let view = { top: 0, left: 0, bottom: window.innerHeight, right: window.innerWidth };
    for (let n = box.parentElement; n && n !== document.body; n = n.parentElement) {
        if (/(auto|scroll|hidden)/.test(getComputedStyle(n).overflowY)) {
            const r = n.getBoundingClientRect();
            view = { top: Math.max(view.top, r.top), left: Math.max(view.left, r.left),
                     bottom: Math.min(view.bottom, r.bottom), right: Math.min(view.right, r.right) };
        }
    }
    const within = (r, v) => r.bottom > r.top && r.top >= v.top - 0.5 && r.left >= v.left - 0.5 &&
        r.bottom <= v.bottom + 0.5 && r.right <= v.right + 0.5;
    const card = controls.querySelector('.bv-card');
    const missing = [];
    for (const [device, number] of blocks) {
        const canvas = box.querySelector(`.bv-view-pool canvas.bv-pool-canvas[data-device='${device}']`);
        if (!canvas || canvas.offsetParent === null || !canvas.dataset.cols) { missing.push(`${device} ${number} (no canvas drawn)`); continue; }
        const d = canvas.dataset, grid = canvas.closest('.bv-grid'), g = grid.getBoundingClientRect();
        const [w, h, gap, pad] = [d.cellWidth, d.cellHeight, d.gap, d.pad].map(Number);
        const i = number - Number(d.start || 0), col = i % Number(d.cols), row = Math.floor(i / Number(d.cols));
        const top = g.top + pad + row * (h + gap) - grid.scrollTop, left = g.left + pad + col * (w + gap);
        const cell = { top, left, bottom: top + h, right: left + w };
        if (!within(cell, view) || !within(cell, g) || (d.states || '').length !== Number(d.n))
            missing.push(`${device} ${number} at y ${Math.round(top)}-${Math.round(top + h)} of ${Math.round(view.top)}-${Math.round(view.bottom)}`);
    }
    let tables = null;
    if (seqs.length) {
        const body = box.querySelector('.bv-tables'), row = body.querySelector(`.bv-table-row[data-seq='${seqs[0]}']`);
        const b = body.getBoundingClientRect(), r = row ? row.getBoundingClientRect() : null;
        tables = !!r && r.top >= b.top - 1 && r.top < b.bottom - 8;
    }
    const tree = box.querySelector('.bv-view-radix .bv-radix');  // a radix-tree run: the card's request's row above it
    const radixRow = tree && seqs.length ? !!tree.querySelector(`.bv-radix-request[data-seq='${seqs[0]}']`) : null;
    const queue = box.querySelector('.bv-free-queue');
    const label = [...card.querySelectorAll('.bv-dim')].map((line) => line.textContent).find((t) => t.startsWith('in ')) || '';
    return { card: within(card.getBoundingClientRect(), view) && !card.hidden, missing, tables, label, radixRow,
             fit: Number(box.dataset.fit), queue: queue && !queue.hidden ? queue.textContent : null,
             queueFits: queue && !queue.hidden ? queue.dataset.blocks.split(',').length === Number(queue.dataset.numFree) : false,
             touched: Object.fromEntries([...box.querySelectorAll('.bv-view-pool canvas.bv-pool-canvas')].map((c) =>
                 [c.dataset.device, (c.dataset.touched || '').split(',').filter((s) => s).map(Number)])) };
}"""

# Each null-block slot's lines in Visualizer `k`'s tables: [text colour, background colour] as computed.
NULL_SLOT_COLOURS_JS = """(k) => {
    const box = document.querySelectorAll('.bv-view-controls')[k].closest('.blockviz');
    return [...box.querySelectorAll('.bv-view-tables .bv-null-slot')].flatMap((slot) =>
        [...slot.querySelectorAll('.bv-lhead, .bv-dim')].map((line) =>
            [getComputedStyle(line).color, getComputedStyle(slot).backgroundColor]));
}"""


def rgba(css: str) -> tuple[float, float, float, float]:
    """A computed colour ("rgb(1, 2, 3)" or "rgba(1, 2, 3, 0.5)") as (r, g, b, alpha)."""
    parts = [float(p) for p in css[css.index("(") + 1:css.index(")")].split(",")]
    return (*parts[:3], parts[3] if len(parts) == 4 else 1.0)


def contrast(text: str, background: str) -> float:
    """WCAG 2's contrast ratio of `text` over an opaque `background` (the text's alpha blended in)."""
    fg, bg = rgba(text), rgba(background)
    assert bg[3] == 1.0, background
    blended = [fg[3] * f + (1 - fg[3]) * b for f, b in zip(fg[:3], bg[:3])]

    def luminance(rgb) -> float:
        linear = [(c / 255) / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(blended), luminance(bg[:3])), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_contrast_is_wcags():
    assert contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21)
    assert contrast("rgba(0, 0, 0, 0.54)", "rgb(30, 26, 18)") < 1.5  # the unreadable null slot of issue 45


@pytest.fixture(scope="module")
def story_page(chromium_session, jupyter_server, story_trace_path):
    """One notebook with a Visualizer per story (`vizs[name]`) and the v0 story live (`live`), open
    in a page, every widget drawn."""
    traces = {name: str(story_trace_path) if trace == "story" else trace for name, trace in STORIES}
    cells = ["from blockviz.jupyter import Visualizer\nvizs = {}"]
    cells += [f"vizs[{name!r}] = Visualizer.from_trace({trace!r})\nvizs[{name!r}]" for name, trace in traces.items()]
    cells.append("live = Visualizer.live(scenario='story')\nlive")  # the v0 story played live, after them
    path = jupyter_server.add_notebook("cards-on-screen.ipynb", cells)
    with chromium_session.in_use() as browser:  # the session's chromium, for the whole module
        context = browser.new_context(viewport={"width": 1280, "height": 720})
        page = context.new_page()
        try:
            open_notebook(page, jupyter_server, path)
            run_all_cells(page)
            page.wait_for_function(f"() => document.querySelectorAll('.bv-view-controls[data-position]').length === {len(STORIES) + 1}",
                                   timeout=UI_LIMIT_MS)
            yield page
        finally:
            context.close()


def go_to(page, k: int, action: str, position: int) -> None:
    """Click Visualizer `k`'s Controls button `action` and wait until its cursor is at `position`
    and the card there is fitted to the screen (display.js fitToCard)."""
    page.locator(".bv-view-controls").nth(k).locator(f"button[data-action='{action}']").click()
    page.wait_for_function("""([k, p]) => {
        const controls = document.querySelectorAll('.bv-view-controls')[k];
        return controls.dataset.position === String(p) && controls.closest('.blockviz').dataset.fitFor === String(p);
    }""", arg=[k, position], timeout=UI_LIMIT_MS)
    page.evaluate(FRAMES)


@pytest.mark.parametrize("look", LOOKS)
@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("story", [name for name, _ in STORIES])
def test_every_card_and_all_its_blocks_are_on_one_screen(story, size, look, story_page):
    page = story_page
    k = [name for name, _ in STORIES].index(story)
    page.set_viewport_size({"width": size[0], "height": size[1]})
    kernel_json(page, f"vizs[{story!r}].set_projector({look == 'projector'}) or "
                      f"vizs[{story!r}].set_zoom({2.0 if look == 'projector' else 1.0})")
    cards = kernel_json(page, f"[[c.position, c.title, [list(b) for b in c.blocks], list(c.seqs), c.upstream, c.function] "
                              f"for c in vizs[{story!r}].player.scan_guide().cards]")
    assert len(cards) >= 5 and cards[0][0] == 0
    kernel_json(page, f"vizs[{story!r}].seek(1) and None")  # off card 1, so that |◀ moves
    results, shown, queue_fits = [], 0, False
    for number, (position, title, blocks, seqs, upstream, function) in enumerate(cards):
        go_to(page, k, "start" if number == 0 else "next_card", position)
        drawn = page.evaluate(ON_SCREEN_JS, [k, blocks, seqs])
        problems = ([] if drawn["card"] else ["the card's text is out of view"]) + drawn["missing"]
        if drawn["radixRow"] is False or (story == "sglang" and seqs and drawn["radixRow"] is None):
            problems.append(f"the radix tree has no row for seq {seqs[0]}")
        if drawn["label"] != f"in {upstream}: {function}":  # whose function: SGLang's in an sglang story
            problems.append(f"the card's function reads {drawn['label']!r}")
        if drawn["tables"] is False:
            problems.append(f"the tables are not scrolled to seq {seqs[0]}")
        if drawn["queue"] is not None and "null" in drawn["queue"]:  # issue 45 item 4: a stray "null"
            problems.append(f"the free queue reads {drawn['queue']!r}")
        queue_fits |= drawn["queueFits"]
        for device, block in blocks:  # the pools outline what the card names (the CPU pool too)
            if block not in drawn["touched"].get(device, []):
                problems.append(f"{device} {block} not outlined")
        shown += not problems
        results.append((number + 1, title, drawn["fit"], problems))
    print(f"\n{story} {size[0]}x{size[1]} {look}: {shown} of {len(cards)} cards with all their blocks on screen; "
          f"fit {', '.join(str(fit) for _, _, fit, _ in results)}")
    assert shown == len(cards), [r for r in results if r[3]]
    if story == "sglang":
        assert {upstream for *_, upstream, _ in cards[1:]} == {"SGLang"}
    if story == "v1":  # a card whose free queue fits without "… +N": where the stray "null" was
        assert queue_fits
    if story == "v0":  # the swap-in card names blocks of a CPU pool that is empty again: it is opened
        assert any(device == "cpu" for _, _, blocks, *_ in cards for device, _ in blocks)
    if story == "hybrid":
        colours = page.evaluate(NULL_SLOT_COLOURS_JS, k)  # the last card's tables hold freed window slots
        assert colours, "no null-block slot in the tables"
        worst = min(contrast(text, background) for text, background in colours)
        assert worst >= MIN_CONTRAST, (worst, colours)



def test_the_live_story_opens_the_cpu_pool_its_swap_in_card_names_and_outlines_them(story_page):
    """Issue 45 item 3: played live, the swap-in card's CPU blocks (a CPU pool empty again, so
    collapsed to one line) are drawn and outlined on the CPU canvas, as in the replay."""
    page = story_page
    k = len(STORIES)  # the live Visualizer's controls come after the stories'
    page.set_viewport_size({"width": 1280, "height": 720})
    card = None
    for _ in range(10):
        before = page.locator(".bv-view-controls").nth(k).get_attribute("data-position")
        page.locator(".bv-view-controls").nth(k).locator("button[data-action='next_card']").click()
        page.wait_for_function("""([k, before]) => {
            const controls = document.querySelectorAll('.bv-view-controls')[k];
            return controls.dataset.position !== before && controls.closest('.blockviz').dataset.fitFor === controls.dataset.position;
        }""", arg=[k, before], timeout=UI_LIMIT_MS)
        card = kernel_json(page, "(lambda c: c and [c.ideas, [list(b) for b in c.blocks], list(c.seqs)])(live.viewer.card)")
        if card and "swap-in" in card[0]:
            break
    assert card and "swap-in" in card[0], card
    page.evaluate(FRAMES)
    named_cpu = [number for device, number in card[1] if device == "cpu"]
    assert named_cpu
    drawn = page.evaluate(ON_SCREEN_JS, [k, card[1], card[2]])
    assert drawn["card"] and not drawn["missing"], drawn
    assert set(named_cpu) <= set(drawn["touched"]["cpu"]), drawn["touched"]
