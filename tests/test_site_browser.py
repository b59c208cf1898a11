"""`blockviz site DIR`: the index and every page it writes (every shipped trace, every lesson) open in
chromium from file URLs with every other request refused, with no console error; a lesson's answer
opens on a click; printed on A4 (chromium's print to PDF), a lesson page shows its text and each
exercise with a blank box, a story page each card's text beside its frozen picture, no control,
and no figure taller than a page or cut across two. Bad input is one line, exit 2, no folder left."""

from __future__ import annotations

import re

import pytest

from blockviz.cli import main
from blockviz.model.trace import shipped_traces
from blockviz.webpage.lesson import lesson_notebooks, page_name
from site_fixtures import SITE_GROUP, offline_page, site  # noqa: F401 (fixtures)

MM = 96 / 25.4  # CSS pixels per millimetre
# the printable box of an A4 page, as page.css and lesson.css set its margins (width, height in mm)
PRINT_BOX = {"trace": (210 - 24, 297 - 24), "lesson": (210 - 24, 297 - 28)}
VISIBLE_CONTROLS = """() => [...document.querySelectorAll('button, input, select, textarea, summary, canvas')]
    .filter((e) => e.getClientRects().length > 0).map((e) => e.outerHTML.slice(0, 60))"""
PRINTED = """(selector) => [...document.querySelectorAll(selector)].filter((e) => e.getClientRects().length > 0)
    .map((e) => { const r = e.getBoundingClientRect(), s = getComputedStyle(e);
                  return { height: r.height, breakInside: s.breakInside }; })"""


def wait_for_trace_page(page) -> None:
    page.wait_for_function("() => document.getElementById('bv-page').dataset.print === 'true'", timeout=60_000)


def pdf_pages(data: bytes) -> int:
    """The number of pages of a PDF chromium wrote (its /Type /Page objects)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data))


@SITE_GROUP
def test_every_page_of_the_site_opens_offline_with_no_console_error(site, offline_page):
    page = offline_page
    traces, lessons = shipped_traces(), lesson_notebooks()
    expected = (["index.html"] + [f"{n}.html" for n in traces] + [f"{n}.svg" for n in traces]
                + [page_name(n) for n in lessons])
    assert sorted(p.name for p in site.iterdir()) == sorted(expected)
    page.goto((site / "index.html").as_uri())
    trace_links = page.eval_on_selector_all(".bv-site-trace h2 a", "(links) => links.map((a) => a.href)")
    lesson_links = page.eval_on_selector_all(".bv-site-lessons a", "(links) => links.map((a) => a.href)")
    assert sorted(trace_links) == sorted((site / f"{n}.html").as_uri() for n in traces)
    assert lesson_links == [(site / page_name(n)).as_uri() for n in lessons]
    assert all(page.eval_on_selector_all(".bv-site-trace img", "(imgs) => imgs.map((i) => i.naturalWidth > 0)"))
    for link in trace_links:
        page.goto(link)
        wait_for_trace_page(page)
        assert page.evaluate("window.blockvizPage.meta.length") > 0, link
        assert page.evaluate("document.querySelectorAll('.bv-print-card img').length") >= 1, link
    for link in lesson_links:
        page.goto(link)
        assert page.evaluate("[...document.images].every((i) => i.complete && i.naturalWidth > 0)"), link
        local = page.eval_on_selector_all("a[href]", "(links) => links.map((a) => a.href).filter((h) => h.startsWith('file:'))")
        assert all(h.split("#")[0] in trace_links + lesson_links + [(site / "index.html").as_uri()] for h in local), link
    assert page.refused == [] and page.errors == []


@SITE_GROUP
def test_a_lessons_answer_opens_on_a_click(site, offline_page):
    page = offline_page
    page.goto((site / page_name("04")).as_uri())
    answer = page.locator(".bv-exercise[data-exercise='04.ref_count'] details.bv-answer pre")
    assert not answer.is_visible()
    page.click(".bv-exercise[data-exercise='04.ref_count'] details.bv-answer summary")
    assert answer.is_visible() and answer.inner_text().startswith("my_ref_count = ")
    assert page.refused == [] and page.errors == []


@SITE_GROUP
@pytest.mark.parametrize(("name", "kind", "figures"), [
    ("v1-story.html", "trace", ".bv-print-card"),
    (page_name("06"), "lesson", "figure.bv-moment, .bv-exercise"),
    (page_name("11"), "lesson", "figure.bv-moment, .bv-exercise"),
])
def test_a_page_prints_as_an_a4_handout_with_no_control_and_no_cut_figure(site, offline_page, name, kind, figures):
    page = offline_page
    width, height = (side * MM for side in PRINT_BOX[kind])
    page.set_viewport_size({"width": round(width), "height": round(height)})
    page.goto((site / name).as_uri())
    if kind == "trace":
        wait_for_trace_page(page)
    page.emulate_media(media="print")
    assert page.evaluate(VISIBLE_CONTROLS) == []
    printed = page.evaluate(PRINTED, figures)
    assert printed, figures
    # each figure is kept whole (break-inside: avoid) and fits one page, so no page break cuts it
    assert all(f["breakInside"] == "avoid" and f["height"] <= height for f in printed), printed
    if kind == "trace":
        cards = page.evaluate("window.blockvizPage.meta.stops.length")
        assert len(printed) == cards and cards > 1
        texts = page.eval_on_selector_all(".bv-print-card figcaption h2", "(hs) => hs.map((h) => h.textContent)")
        assert all(texts)
    else:
        assert page.evaluate("document.querySelectorAll('.bv-answer-box').length") == page.evaluate(
            "document.querySelectorAll('.bv-exercise').length") > 0
        assert page.evaluate("[...document.querySelectorAll('.bv-answer-box')].every((b) => b.getBoundingClientRect().height > 60)")
        assert page.locator("text=Goal.").first.is_visible()
    total = page.evaluate("document.documentElement.scrollHeight")
    pdf = page.pdf(format="A4", print_background=True)
    pages = pdf_pages(pdf)
    # at least the pages the content fills; at most a page per figure more than that (a figure that
    # does not fit what is left of a page moves to the next one whole)
    assert total / height <= pages + 0.5 and pages <= total / height + len(printed) + 1, (pages, total / height)
    assert page.refused == [] and page.errors == []


@pytest.mark.parametrize(("args", "expected"), [
    (["{tmp}/old"], "already exists"),
    (["{tmp}/none/site"], "does not exist"),
    (["{tmp}/site", "--traces", "no-such-trace"], "no shipped trace 'no-such-trace'"),
    (["{tmp}/site", "--lessons", "99"], "no lesson '99'"),
])
def test_site_bad_input_is_one_line_exit_2(tmp_path, capsys, args, expected):
    (tmp_path / "old").mkdir()
    assert main(["site", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
