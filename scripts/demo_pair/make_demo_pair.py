#!/usr/bin/env python
"""Make the embedded demo pair: tokenizer → target (qwen3) → target.gguf → DFlash v1 drafter → τ on held-out
prompts. Torch on the CPU (one thread), fixed seeds; about 15-20 minutes on a 2-core machine.

    python -m scripts.demo_pair.make_demo_pair                  # everything, writes ggtools/data/demo/
    python -m scripts.demo_pair.make_demo_pair --from drafter   # reuse the cached tokenizer + target

(from the repository root).

Intermediate results are cached in $DEMO_PAIR_WORK (default /tmp/ggtools-demo-pair).
"""

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from scripts.demo_pair import common
from scripts.demo_pair.common import (BLOCK_SIZE, DRAFT_INTERMEDIATE, DRAFT_LAYERS, EOS_TOKEN, MASK_TOKEN, OUT_DIR,
                                      SEED, TARGET, TARGET_LAYER_IDS, WORK_DIR, corpus_files, read_text,
                                      seed_everything)

# one thread: bit-reproducible matmuls, and far less CPU per step than two threads on a busy machine
THREADS = 1

STAGES = ["tokenizer", "target", "export", "drafter", "eval", "write"]

TARGET_TRAIN = dict(steps=1400, batch=8, seq_len=256, lr=4e-3)
# drafter data: target-generated greedy continuations of training-text prompts, plus plain training windows
DRAFT_DATA = dict(n_generated=768, prompt_len=128, new_tokens=128, n_text=256, seq_len=256)
DRAFT_TRAIN = dict(steps=1000, batch=8, anchors_per_seq=24, lr=3e-3, gamma=4.0)
DRAFT_INIT = "norms"          # drafter output norm starts as the target's final norm (see drafter.init_from_target)

# evaluation: prompts from the held-out modules only
EVAL = dict(windows_per_file=2, prompt_len=128, new_tokens=128, train_prompts=8)
LLAMA_CHECK = dict(prompts=4, new_tokens=64)


def log(msg):
    print(msg, flush=True)


def _apply_overrides():
    """Experiments only: DEMO_PAIR_OVERRIDES='{"DRAFT_LAYERS": 2, "DRAFT_TRAIN": {"steps": 600}}' replaces
    module settings (dicts are updated). The committed pair is made without it."""
    raw = os.environ.get("DEMO_PAIR_OVERRIDES")
    if not raw:
        return {}
    over = json.loads(raw)
    for k, v in over.items():
        if isinstance(globals().get(k), dict):
            globals()[k].update(v)
        else:
            globals()[k] = v
    log(f"overrides: {over}")
    return over


def stage_tokenizer(state):
    from scripts.demo_pair.tokenizer import train_tokenizer
    train, held = corpus_files()
    tok = train_tokenizer(train)
    eos = tok.token_to_id(EOS_TOKEN)
    stream = []
    for p in train:
        stream += tok.encode(read_text(p)).ids + [eos]
    held_ids = {p.name: tok.encode(read_text(p)).ids for p in held}
    tok.save(str(WORK_DIR / "tokenizer.json"))
    np.save(WORK_DIR / "train_tokens.npy", np.array(stream, dtype=np.int32))
    (WORK_DIR / "held_out.json").write_text(json.dumps(held_ids))
    log(f"tokenizer: {tok.get_vocab_size()} tokens; train stream {len(stream)} tokens from {len(train)} files; "
        f"held out {sum(map(len, held_ids.values()))} tokens from {len(held)} files")


def stage_target(state):
    from scripts.demo_pair.target import eval_loss, round_to_storage, train_target
    tokens = np.load(WORK_DIR / "train_tokens.npy")
    model = train_target(tokens, seed=SEED, log=log, **TARGET_TRAIN)
    round_to_storage(model)
    torch.save(model.state_dict(), WORK_DIR / "target.pt")
    held = json.loads((WORK_DIR / "held_out.json").read_text())
    held_stream = np.array([t for ids in held.values() for t in ids], dtype=np.int64)
    state["target_heldout_loss"] = eval_loss(model, held_stream, 256)
    state["target_train_loss"] = eval_loss(model, tokens[:200_000].astype(np.int64), 256)
    log(f"target: train loss {state['target_train_loss']:.3f}, held-out loss {state['target_heldout_loss']:.3f}")


def _ids():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(WORK_DIR / "tokenizer.json"))
    return tok, tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN)


def _load_target():
    from scripts.demo_pair.gguf_io import load_target_from_gguf
    return load_target_from_gguf(OUT_DIR / "target.gguf")


def stage_export(state):
    """target.gguf (qwen3 layout) + tokenizer.json; reload it into torch; llama.cpp must agree."""
    from scripts.demo_pair.gguf_io import load_target_from_gguf, write_target_gguf
    from scripts.demo_pair.target import target_config
    from scripts.demo_pair.tokenizer import vocab_and_merges
    from transformers import Qwen3ForCausalLM
    tok, eos, mask = _ids()
    model = Qwen3ForCausalLM(target_config())
    model.load_state_dict(torch.load(WORK_DIR / "target.pt"))
    model.tie_weights()
    model.eval()
    tokens, merges = vocab_and_merges(tok)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_target_gguf(model, tokens, merges, {"eos": eos, "mask": mask}, OUT_DIR / "target.gguf",
                      name="ggtools demo target (qwen3, Python stdlib)")
    shutil.copy(WORK_DIR / "tokenizer.json", OUT_DIR / "tokenizer.json")
    back = load_target_from_gguf(OUT_DIR / "target.gguf")
    x = torch.from_numpy(np.load(WORK_DIR / "train_tokens.npy")[:256].astype(np.int64))[None]
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, back(input_ids=x).logits), "GGUF round trip changed logits"
    log("target.gguf: written and read back, logits identical")
    from scripts.demo_pair.speculative import greedy
    name, prompt = _held_prompts(1, 64)[0]
    state["golden"] = {"prompt_from": name, "prompt_ids": prompt,
                       "greedy_ids": greedy(back, prompt, LLAMA_CHECK["new_tokens"])}
    state["llama_cpp"] = llama_cpp_check(back, tok)


def _held_prompts(n_per_file, prompt_len):
    held = json.loads((WORK_DIR / "held_out.json").read_text())
    prompts = []
    for name in sorted(held):
        ids = held[name]
        for k in range(n_per_file):
            start = (len(ids) - prompt_len) * (k + 1) // (n_per_file + 1)
            prompts.append((f"{name}@{start}", ids[start:start + prompt_len]))
    return prompts


def llama_cpp_check(model, tok):
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        log("llama-cpp-python not installed: llama.cpp check skipped")
        return {"checked": False}
    from scripts.demo_pair.llama_check import llama_greedy, llama_tokenize, load
    from scripts.demo_pair.speculative import greedy
    llm = load(OUT_DIR / "target.gguf")
    # tokenizer: llama.cpp's gpt2/qwen2 BPE on the GGUF vocabulary == HF tokenizers
    train, held = corpus_files()
    tok_files = held + train[:10]
    for p in tok_files:
        text = read_text(p)
        assert llama_tokenize(llm, text) == tok.encode(text).ids, f"tokenizer mismatch on {p.name}"
    log(f"llama.cpp tokenizer == HF tokenizer on {len(tok_files)} files")
    n = LLAMA_CHECK["new_tokens"]
    prompts = _held_prompts(1, 64)[:LLAMA_CHECK["prompts"]]
    for name, ids in prompts:
        ours, theirs = greedy(model, ids, n), llama_greedy(llm, ids, n)
        assert ours == theirs, f"llama.cpp greedy differs from torch on {name}: {ours} vs {theirs}"
    log(f"llama.cpp greedy == torch greedy on {len(prompts)} prompts x {n} tokens")
    return {"checked": True, "tokenizer_files": len(tok_files), "greedy_prompts": len(prompts), "greedy_tokens": n,
            "llama_cpp_python": __import__("llama_cpp").__version__}


def stage_drafter(state):
    from dflash import DFlashDraftModel
    from scripts.demo_pair.drafter import drafter_config, greedy_continuations, init_from_target, save_drafter, target_features, train_drafter
    from scripts.demo_pair.target import random_windows
    _, eos, mask = _ids()
    target = _load_target()
    for p in target.parameters():
        p.requires_grad_(False)
    cache = WORK_DIR / "drafter_data.pt"
    key = json.dumps(DRAFT_DATA, sort_keys=True) + str((OUT_DIR / "target.gguf").stat().st_mtime_ns)
    if cache.exists() and torch.load(cache)["key"] == key:
        data = torch.load(cache)
        seqs, feats, preds = data["seqs"], data["feats"], data["preds"]
        log(f"drafter data: {len(seqs)} sequences x {seqs.shape[1]} (cached)")
    else:
        tokens = np.load(WORK_DIR / "train_tokens.npy")
        gen = torch.Generator().manual_seed(SEED + 1)
        d = DRAFT_DATA
        t0 = time.time()
        prompts = random_windows(tokens, d["n_generated"], d["prompt_len"], gen)
        generated = greedy_continuations(target, prompts, d["new_tokens"])
        text = random_windows(tokens, d["n_text"], d["seq_len"], gen)
        seqs = torch.cat([generated, text])
        feats, preds = target_features(target, seqs, TARGET_LAYER_IDS)
        torch.save({"key": key, "seqs": seqs, "feats": feats, "preds": preds}, cache)
        log(f"drafter data: {len(seqs)} sequences x {seqs.shape[1]} ({time.time() - t0:.0f}s)")
    cfg = drafter_config(target.config, block_size=BLOCK_SIZE, target_layer_ids=TARGET_LAYER_IDS,
                         mask_token_id=mask, eos_token_id=eos, layers=DRAFT_LAYERS, intermediate=DRAFT_INTERMEDIATE)
    torch.manual_seed(SEED + 2)
    drafter = DFlashDraftModel(cfg)
    init_from_target(drafter, target, mode=DRAFT_INIT)
    train_drafter(drafter, target, seqs, feats, preds, seed=SEED + 3, log=log, **DRAFT_TRAIN)
    out = OUT_DIR / "drafter"
    if out.exists():
        shutil.rmtree(out)
    save_drafter(drafter, out)


def _load_drafter():
    from dflash import DFlashDraftModel
    d = DFlashDraftModel.from_pretrained(OUT_DIR / "drafter", dtype=torch.bfloat16)
    return d.float().eval()          # bf16 weights as stored, f32 arithmetic


def stage_eval(state):
    import dflash.model as zlab
    from scripts.demo_pair.speculative import greedy, speculative, summarize
    _, eos, _ = _ids()
    target, drafter = _load_target(), _load_drafter()
    n_new = EVAL["new_tokens"]
    held = _held_prompts(EVAL["windows_per_file"], EVAL["prompt_len"])
    tokens = np.load(WORK_DIR / "train_tokens.npy")
    g = torch.Generator().manual_seed(SEED + 4)
    train_prompts = [(f"train@{int(s)}", tokens[int(s):int(s) + EVAL["prompt_len"]].tolist())
                     for s in torch.randint(0, len(tokens) - 1000, (EVAL["train_prompts"],), generator=g)]
    report = {}
    for label, prompts in (("held_out", held), ("train", train_prompts)):
        results, t_spec, t_greedy = [], 0.0, 0.0
        for name, ids in prompts:
            t = time.time()
            ref = greedy(target, ids, n_new, eos)
            t_greedy += time.time() - t
            t = time.time()
            r = speculative(drafter, target, ids, n_new, eos)
            t_spec += time.time() - t
            assert r.tokens == ref, f"speculative output differs from greedy on {name}"
            results.append(r)
        s = summarize(results, drafter.block_size)
        s["torch_speedup_vs_target_only"] = round(t_greedy / t_spec, 2)
        report[label] = s
        log(f"{label}: {len(prompts)} prompts, tau {s['tau_zlab']:.2f}, mean acc len "
            f"{s['mean_accepted_length_incl_bonus']:.2f}, acceptance {s['acceptance_rate']:.3f}, "
            f"per-position {s['per_position_accept_rate']}")
    # z-lab's own dflash_generate on a few held-out prompts: same tokens, same accepted lengths
    zlab._cuda_time = time.perf_counter
    for name, ids in held[:4]:
        z = zlab.dflash_generate(drafter, target, torch.tensor([ids]), n_new, [eos], return_stats=True)
        r = speculative(drafter, target, ids, n_new, eos)
        assert z.output_ids[0, len(ids):].tolist() == r.tokens, name
        assert z.acceptance_lengths == r.produced, name
    log("z-lab dflash_generate agrees with our loop (tokens and accepted lengths)")
    report["prompts"] = {"held_out": [n for n, _ in held], "train": [n for n, _ in train_prompts],
                         "prompt_tokens": EVAL["prompt_len"], "new_tokens": n_new}
    state["eval"] = report


def stage_write(state):
    """demo_pair.json beside the artifacts: settings, timings, sizes, measured τ."""
    import tokenizers
    import transformers
    sizes = {str(p.relative_to(OUT_DIR)): p.stat().st_size for p in sorted(OUT_DIR.rglob("*")) if p.is_file()
             and p.name != "demo_pair.json"}
    _, eos, mask = _ids()
    meta = {
        "made_by": "scripts/demo_pair/make_demo_pair.py",
        "python": platform.python_version(),
        "torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "seed": SEED,
        "corpus": {"source": "top-level Lib/*.py of the running interpreter", "held_out": common.HELD_OUT,
                   "excluded": sorted(common.EXCLUDED) + [p + "*" for p in common.EXCLUDED_PREFIXES]},
        "tokenizer": {"type": "byte-level BPE (gpt2 alphabet), pre-tokenizer qwen2", "vocab_size": common.VOCAB_SIZE,
                      "eos_token_id": eos, "mask_token_id": mask},
        "target": dict(TARGET, train=TARGET_TRAIN, heldout_loss=state.get("target_heldout_loss"),
                       train_loss=state.get("target_train_loss")),
        "drafter": {"block_size": BLOCK_SIZE, "target_layer_ids": TARGET_LAYER_IDS, "layers": DRAFT_LAYERS,
                    "intermediate_size": DRAFT_INTERMEDIATE, "mask_token_id": mask, "data": DRAFT_DATA,
                    "train": DRAFT_TRAIN},
        "llama_cpp_check": state.get("llama_cpp"),
        "golden_greedy": state.get("golden"),
        "eval": state.get("eval"),
        "seconds": state.get("seconds"),
        "cpu_seconds_by_stage": state.get("cpu_seconds"),
        "cpu_seconds": sum(state.get("cpu_seconds", {}).values()),
        "sizes_bytes": sizes,
        "total_bytes": sum(sizes.values()),
    }
    (OUT_DIR / "demo_pair.json").write_text(json.dumps(meta, indent=1) + "\n")
    (OUT_DIR / "README.md").write_text(readme(meta))
    log(f"demo_pair.json written; artifacts {meta['total_bytes'] / 1e6:.2f} MB")


def readme(meta) -> str:
    t, d, ev = meta["target"], meta["drafter"], meta["eval"]
    h, tr = ev["held_out"], ev["train"]
    sec = meta["seconds"]
    total = sum(sec.values())
    return f"""# ggtools demo pair

Made by `{meta["made_by"]}` (Python {meta["python"]}, torch {meta["torch"]}, transformers {meta["transformers"]},
seed {meta["seed"]}, one torch thread); see docs/demo_pair.md. Settings, timings and the full statistics are in
`demo_pair.json`.

| file | what |
|---|---|
| `target.gguf` | qwen3 target, {t["num_hidden_layers"]} layers, hidden {t["hidden_size"]}, FFN {t["intermediate_size"]}, \
heads {t["num_attention_heads"]}/{t["num_key_value_heads"]} × {t["head_dim"]}, tied embeddings; F16 matrices, F32 norms; \
gpt2 BPE vocabulary ({meta["tokenizer"]["vocab_size"]} tokens, pre-tokenizer qwen2) |
| `drafter/` | DFlash v1 drafter (z-lab `DFlashDraftModel`, bf16 safetensors): {d["layers"]} layer{"s" if d["layers"] != 1 else ""}, block size \
{d["block_size"]}, target_layer_ids {d["target_layer_ids"]}, mask_token_id {d["mask_token_id"]} |
| `tokenizer.json` | the same BPE for Hugging Face `tokenizers` (cross-checks) |
| `eagle3/`, `eagle3.json` | EAGLE3 drafter of `target.gguf` (`LlamaForCausalLMEagle3`, bf16 safetensors): one layer, draft vocabulary 512 (d2t), taps [1, 2, 3]; made by `scripts/demo_pair/make_eagle3_drafter.py` |
| `qwen35-mtp/`, `qwen35-mtp.gguf`, `qwen35-mtp.json` | a Qwen3.5 target (hidden 64, a Gated DeltaNet and a gated attention layer) with a trained MTP block (`--draft mtp`): bf16 HF checkpoint (its tokenizer: `tokenizer.json`) and llama.cpp's conversion of it; made by `scripts/demo_pair/make_qwen35_mtp.py` |

Prompts are raw Python source, token ids with no BOS and no template; EOS / stop token
`<|endoftext|>` = {meta["tokenizer"]["eos_token_id"]}, mask `<|mask|>` = {meta["tokenizer"]["mask_token_id"]}.

Training text: top-level `Lib/*.py` of the interpreter, minus {len(meta["corpus"]["held_out"])} held-out modules.
Target loss (nats/token): train {t["train_loss"]:.3f}, held-out {t["heldout_loss"]:.3f}.

Speculative decoding at T = 0 in torch (z-lab loop; bf16 drafter weights, f32 arithmetic),
{ev["prompts"]["prompt_tokens"]}-token prompts, {ev["prompts"]["new_tokens"]} new tokens each:

| prompts | n | τ (z-lab) | mean accepted length incl. bonus | acceptance (accepted/drafted) |
|---|---|---|---|---|
| held-out modules | {h["sequences"]} | {h["tau_zlab"]:.2f} | {h["mean_accepted_length_incl_bonus"]:.2f} | {h["acceptance_rate"]:.3f} |
| training text | {tr["sequences"]} | {tr["tau_zlab"]:.2f} | {tr["mean_accepted_length_incl_bonus"]:.2f} | {tr["acceptance_rate"]:.3f} |

Per-position acceptance (held-out): {h["per_position_accept_rate"]}.

Time: {total:.0f} s wall in all ({", ".join(f"{k} {v:.0f} s" for k, v in sec.items())}); \
{meta["cpu_seconds"]:.0f} s of CPU. Size: {meta["total_bytes"] / 1e6:.2f} MB.
"""


def main():
    global OUT_DIR, WORK_DIR
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="start", choices=STAGES, default="tokenizer")
    ap.add_argument("--to", dest="stop", choices=STAGES, default="write")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="artifact folder (default ggtools/data/demo)")
    ap.add_argument("--work", type=Path, default=WORK_DIR, help="cache folder (default $DEMO_PAIR_WORK)")
    ap.add_argument("--smoke", action="store_true", help="tiny step counts: check the pipeline, not the pair")
    args = ap.parse_args()
    overrides = _apply_overrides()
    OUT_DIR, WORK_DIR = args.out, args.work
    if args.smoke:
        TARGET_TRAIN.update(steps=4)
        DRAFT_DATA.update(n_generated=8, n_text=8)
        DRAFT_TRAIN.update(steps=4)
        EVAL.update(windows_per_file=1, new_tokens=24, train_prompts=2)
    torch.set_num_threads(THREADS)
    seed_everything(SEED)
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    state_path = WORK_DIR / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() and args.start != "tokenizer" else {}
    state.setdefault("seconds", {})
    if overrides:
        state["overrides"] = overrides
    run = STAGES[STAGES.index(args.start):STAGES.index(args.stop) + 1]
    for name in run:
        t0, c0 = time.time(), time.process_time()
        seed_everything(SEED)
        globals()[f"stage_{name}"](state)
        state["seconds"][name] = round(time.time() - t0, 1)
        state.setdefault("cpu_seconds", {})[name] = round(time.process_time() - c0, 1)
        log(f"== {name}: {state['seconds'][name]} s")
        state_path.write_text(json.dumps(state, indent=1))


if __name__ == "__main__":
    main()
