"""Small corpora shared by the retriever tests, and where the real HotpotQA sample lives.

``HOTPOTQA_MINI`` is ``../shared/data/hotpotqa_mini`` beside the checkout; tests that read it
skip when it is absent. ``CITIES`` is four one-line passages whose BM25 and dense rankings are
easy to predict by hand.
"""

from __future__ import annotations

from pathlib import Path

from searchr1.data.types import Passage

HOTPOTQA_MINI = Path(__file__).resolve().parents[3] / "shared" / "data" / "hotpotqa_mini"

CITIES = [
    Passage("p1", '"Paris"\nParis is the capital and largest city of France.'),
    Passage("p2", '"Berlin"\nBerlin is the capital of Germany, on the river Spree.'),
    Passage("p3", '"Danube"\nThe Danube flows through Vienna and Budapest.'),
    Passage("p4", '"Lyon"\nLyon is a city in France known for its cuisine.'),
]
