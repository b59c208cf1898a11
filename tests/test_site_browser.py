"""`blockviz site DIR`: the index and every page it links open in chromium from file URLs with every
other request refused, with no console error; bad input is one line, exit 2, no folder left."""

from __future__ import annotations

import pytest

from blockviz.cli import main

SITE_TRACES = ("prefix-hit", "fork-cow")  # two small ones: every trace's page is exported the same way


def test_the_site_opens_offline_page_by_page(tmp_path, chromium_browser):
    site = tmp_path / "site"
    assert main(["site", str(site), "--traces", *SITE_TRACES]) == 0
    assert sorted(p.name for p in site.iterdir()) == sorted(
        [f"{n}.html" for n in SITE_TRACES] + [f"{n}.svg" for n in SITE_TRACES] + ["index.html"])
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000})
    refused, errors = [], []

    def route(request_route):
        if request_route.request.url.startswith("file://"):
            request_route.continue_()
        else:
            refused.append(request_route.request.url)
            request_route.abort()

    context.route("**", route)
    try:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((site / "index.html").as_uri())
        links = page.eval_on_selector_all(".bv-site-trace h2 a", "(links) => links.map((a) => a.href)")
        assert links == [(site / f"{n}.html").as_uri() for n in SITE_TRACES]
        assert page.eval_on_selector_all(".bv-site-trace img", "(imgs) => imgs.map((i) => i.naturalWidth > 0)") == [True] * 2
        for link in links:
            page.goto(link)
            page.wait_for_function("() => document.getElementById('bv-page').dataset.ready === 'true'", timeout=30_000)
            assert page.evaluate("window.blockvizPage.meta.length") > 0
    finally:
        context.close()
    assert refused == [] and errors == []


@pytest.mark.parametrize(("args", "expected"), [
    (["{tmp}/old"], "already exists"),
    (["{tmp}/none/site"], "does not exist"),
    (["{tmp}/site", "--traces", "no-such-trace"], "no shipped trace 'no-such-trace'"),
])
def test_site_bad_input_is_one_line_exit_2(tmp_path, capsys, args, expected):
    (tmp_path / "old").mkdir()
    assert main(["site", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
