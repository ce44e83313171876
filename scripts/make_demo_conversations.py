"""Write the demo's conversation dataset: a small ShareGPT JSON file, made from a seeded
generator (no download), so `phaselens demo` has a conversational model whose later turns
carry their history (the prefix-cache story).

Shape: 40 conversations, each opening with one of 4 shared system prompts (~100 words), then
2-6 user turns (15-60 words) each answered by the assistant (30-120 words). The text is
English-like filler: what matters to a server or the simulator is its length and which
prefixes are shared, not its meaning.

    python scripts/make_demo_conversations.py            # rewrites src/phaselens/data/...
    python scripts/make_demo_conversations.py --out F.json

Same code, same bytes: tests/workload/test_demo_conversations.py checks the committed file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "src" / "phaselens" / "data" / "demo-conversations.json"
SEED = 18
CONVERSATIONS = 40
SYSTEMS = 4
_WORDS = """
account order refund invoice delivery parcel password login screen setting device update
battery charger cable warranty repair store branch schedule meeting calendar report budget
team project deadline review draft summary email message folder file upload download backup
server network printer router signal speed plan price discount coupon payment card bank
address phone number customer support agent ticket issue problem error reason answer step
first next then again today tomorrow week month please thanks quickly carefully simply only
check confirm change reset open close send receive keep move find show explain help want need
"""
WORDS = _WORDS.split()
TOPICS = ("billing", "shipping", "accounts", "devices")


def _sentence(rng: np.random.Generator, n: int) -> str:
    words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=n).tolist()]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def _text(rng: np.random.Generator, lo: int, hi: int) -> str:
    """lo..hi words as sentences of 6-14 words."""
    left = int(rng.integers(lo, hi + 1))
    out = []
    while left > 0:
        n = min(left, int(rng.integers(6, 15)))
        out.append(_sentence(rng, max(n, 2)))
        left -= n
    return " ".join(out)


def conversations(seed: int = SEED) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    systems = [
        f"You are the {TOPICS[k]} assistant of ACME. " + _text(rng, 90, 110) for k in range(SYSTEMS)
    ]
    out: list[dict[str, object]] = []
    for c in range(CONVERSATIONS):
        turns: list[dict[str, str]] = [{"from": "system", "value": systems[c % SYSTEMS]}]
        for _ in range(int(rng.integers(2, 7))):
            turns.append({"from": "human", "value": _text(rng, 15, 60)})
            turns.append({"from": "gpt", "value": _text(rng, 30, 120)})
        out.append({"id": f"demo-{c:03d}", "conversations": turns})
    return out


def render(seed: int = SEED) -> str:
    """The file's text: a JSON array, one conversation a line."""
    rows = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in conversations(seed)]
    return "[\n" + ",\n".join(rows) + "\n]\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.write_text(render(), encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes, {CONVERSATIONS} conversations)")


if __name__ == "__main__":
    main()
