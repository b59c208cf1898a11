"""The glossary covers the words the cards use: every card of every shipped trace (and the opening
card) is read, the KV-cache words in its text are found, and each must be a glossary term the card
links (`?` defines it)."""

from __future__ import annotations

import re

import pytest

from blockviz.model.glossary import DEFINITIONS
from blockviz.model.guide import Guide, opening_card
from blockviz.model.trace import load_trace

TRACES = ("prefill", "fork-cow", "prefix-hit", "swap", "recompute", "eviction", "v1-story", "hybrid")

# The KV-cache words a learner meets on a card, as they are spelled in running text, and the glossary
# term that defines each.
WORDS = {
    r"tokens?": "token", r"K/V": "K/V", r"slots?": "slot", r"blocks?": "block", r"pools?": "pool",
    r"block tables?": "block table", r"ref counts?": "ref count", r"hash(es)?": "hash", r"fork(ed|s)?": "forking",
    r"copy-on-write": "copy-on-write", r"prefix[- ]cache": "prefix cache", r"evict(ion|ed|s)?": "eviction",
    r"swap(ped)?[ _-]?(out|in)": "swap_out / swap_in", r"recompute": "recompute", r"chunk(ed)?": "chunked prefill",
    r"requests?": "request", r"prefill(ed)?": "prefill", r"preempt(ed|ion)?": "preemption",
    r"free queue": "free queue", r"null block": "null block", r"groups?": "group",
    r"sliding[- ]window|window": "sliding window",
}


def every_card():
    yield "opening", opening_card()
    for name in TRACES:
        trace = load_trace(name)
        guide = Guide(trace.header.get("kv_manager", "v0"), header=trace.header)
        guide.scan(trace.events)
        guide.settle()
        for card in guide.cards:
            yield name, card


@pytest.mark.parametrize("word, term", sorted(WORDS.items()))
def test_each_card_word_is_a_glossary_term(word, term):
    assert term in DEFINITIONS


def test_every_card_links_the_glossary_terms_of_its_words():
    found = set()
    for name, card in every_card():
        text = f"{card.what} {card.why}"
        for word, term in WORDS.items():
            if re.search(rf"(?<![\w-])({word})(?![\w-])", text, re.IGNORECASE):
                found.add(term)
                assert term in card.terms, (name, card.title, term)
    # the words the hybrid and v1 cards brought, met at least once
    assert {"free queue", "null block", "group", "sliding window", "request", "preemption"} <= found
