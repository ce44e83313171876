"""Prompt synthesis: exact lengths with a tokenizer, shared prefixes byte for byte, determinism."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaselens.driver.prompts import VOCAB, PromptMaker
from phaselens.errors import InputError
from phaselens.types import PlannedRequest


def req(i: int, n: int, group: int = -1, prefix: int = 0) -> PlannedRequest:
    return PlannedRequest(
        id=i,
        model="m",
        stage=0,
        t_ns=0,
        input_tokens=n,
        output_tokens=1,
        prefix_group=group,
        prefix_tokens=prefix,
    )


def test_word_count_equals_planned_tokens_without_tokenizer() -> None:
    pm = PromptMaker(seed=7)
    for n in (1, 2, 17, 500, 70_000):
        text = pm.prompt(req(3, n))
        words = text.split(" ")
        assert len(words) == n and words[0] == "3"
        assert set(words[1:]) <= set(VOCAB)


def test_deterministic_in_seed_and_id_not_in_order() -> None:
    a, b = PromptMaker(seed=1), PromptMaker(seed=1)
    first = [a.prompt(req(i, 40)) for i in range(5)]
    second = [b.prompt(req(i, 40)) for i in reversed(range(5))][::-1]
    assert first == second
    assert PromptMaker(seed=2).prompt(req(0, 40)) != first[0]
    assert len(set(first)) == 5


def test_prefix_groups_share_exactly_their_prefix() -> None:
    pm = PromptMaker(seed=4)
    x = pm.prompt(req(10, 50, group=2, prefix=30)).split(" ")
    y = pm.prompt(req(11, 60, group=2, prefix=30)).split(" ")
    z = pm.prompt(req(12, 50, group=3, prefix=30)).split(" ")
    assert x[:30] == y[:30] and x[30] == "10" and y[30] == "11"
    assert len(x) == 50 and len(y) == 60
    assert x[:30] != z[:30]
    # a prefix longer than the prompt is cut to the prompt
    assert pm.prompt(req(13, 20, group=2, prefix=30)).split(" ") == x[:20]


def _tokenizer(tmp: Path) -> Path:
    """A small word-level-ish BPE trained here on the project's own words (no download)."""
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"])
    text = [" ".join(VOCAB[i : i + 9]) for i in range(0, len(VOCAB), 3)] + ["0 1 2 3 4 5 6 7 8 9"]
    tok.train_from_iterator(text, trainer)
    path = tmp / "tokenizer.json"
    tok.save(str(path))
    return path


def test_exact_token_counts_with_a_tokenizer(tmp_path: Path) -> None:
    path = _tokenizer(tmp_path)
    pm = PromptMaker(seed=3, tokenizer_path=str(path))
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer.from_file(str(path))
    for i, n in enumerate((1, 5, 64, 300)):
        text = pm.prompt(req(1000 + i, n))
        assert len(tok.encode(text, add_special_tokens=False).ids) == n, (n, text[:80])
    shared = pm.prompt(req(7, 80, group=1, prefix=40))
    ids = tok.encode(shared, add_special_tokens=False).ids
    assert len(ids) == 80
    head = pm.prefix(1, 40).lstrip(" ")
    assert shared.startswith(head) and len(tok.encode(head).ids) == 40


def test_bad_tokenizer_path_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"expected a tokenizer\.json"):
        PromptMaker(seed=0, tokenizer_path=str(tmp_path / "nope"))
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not a tokenizers JSON file"):
        PromptMaker(seed=0, tokenizer_path=str(bad))
