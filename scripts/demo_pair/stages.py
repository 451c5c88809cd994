"""What the demo drafters' make scripts share: the stage runner (cached state, wall and CPU seconds per stage), the
self-distillation data recipe and the acceptance measured by the ggtools runtime on the demo's held-out prompts."""

import argparse
import json
import os
import time

import numpy as np
import torch

from scripts.demo_pair.common import SEED, corpus_files, read_text, seed_everything

STAT_KEYS = ("tau_zlab", "mean_accepted_length_incl_bonus", "acceptance_rate", "drafted_tokens", "accepted_tokens",
             "steps", "per_position_accept_rate")


def log(msg):
    print(msg, flush=True)


def stage_main(doc: str, namespace: dict, stages: list, work, smoke, threads: int = 1,
               start: str | None = None, stop: str | None = None) -> dict:
    """A make script's command line: --from / --to pick the stages (default start .. stop, else all), --smoke
    calls smoke() (tiny step counts: the pipeline checked, not the models); torch on `threads` threads."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="start", choices=stages, default=start or stages[0])
    ap.add_argument("--to", dest="stop", choices=stages, default=stop or stages[-1])
    ap.add_argument("--smoke", action="store_true", help="tiny step counts: check the pipeline, not the models")
    args = ap.parse_args()
    if args.smoke:
        smoke()
    torch.set_num_threads(threads)
    return run_stages(namespace, stages, args.start, args.stop, work, log)


def run_stages(namespace: dict, stages: list, start: str, stop: str, work, log) -> dict:
    """namespace[f"stage_{name}"](state) for the stages start .. stop, each from seed SEED; the state (and each
    stage's seconds) is kept in work/state.json, so that a later --from reuses what earlier stages recorded."""
    work.mkdir(parents=True, exist_ok=True)
    state_path = work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() and start != stages[0] else {}
    for name in stages[stages.index(start):stages.index(stop) + 1]:
        t0, c0 = time.time(), time.process_time()
        seed_everything(SEED)
        namespace[f"stage_{name}"](state)
        state.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
        state.setdefault("cpu_seconds", {})[name] = round(time.process_time() - c0, 1)
        log(f"== {name}: {state['seconds'][name]} s")
        state_path.write_text(json.dumps(state, indent=1))
    return state


def training_stream(eos: int, tokenizer=None) -> np.ndarray:
    """The training files' token ids, each file followed by EOS (the demo tokenizer unless one is given)."""
    if tokenizer is None:
        from tokenizers import Tokenizer
        from scripts.demo_pair.common import OUT_DIR
        tokenizer = Tokenizer.from_file(str(OUT_DIR / "tokenizer.json"))
    train, _ = corpus_files()
    stream = []
    for p in train:
        stream += tokenizer.encode(read_text(p)).ids + [eos]
    return np.array(stream, dtype=np.int32)


def self_distillation_data(target, data: dict, eos: int, seed: int, log) -> torch.Tensor:
    """data["n_generated"] training-text prompts continued greedily by the target, then data["n_text"] plain
    training windows (drafter.py's recipe), as one [N, L] tensor."""
    from scripts.demo_pair.drafter import greedy_continuations
    from scripts.demo_pair.target import random_windows
    tokens = training_stream(eos)
    gen = torch.Generator().manual_seed(seed)
    prompts = random_windows(tokens, data["n_generated"], data["prompt_len"], gen)
    generated = greedy_continuations(target, prompts, data["new_tokens"])
    text = random_windows(tokens, data["n_text"], data["seq_len"], gen)
    seqs = torch.cat([generated, text])
    log(f"data: {len(seqs)} sequences x {seqs.shape[1]} tokens")
    return seqs


def accept_row(target_gguf, draft: str, settings: dict, name: str, log) -> dict:
    """The ggtools runtime (numba, one thread) decodes the demo's held-out prompts (jobs/demo.py) with the drafter
    `draft` (a GGUF, or "mtp": the target's own block) at its default --n-max; every output must equal target-only
    greedy decoding. -> the acceptance statistics."""
    from ggtools.jobs.accept import Candidate, measure
    from ggtools.jobs.demo import held_out_prompts
    from ggtools.runtime import DraftSettings, TargetModel, Tokenizer
    model = TargetModel(str(target_gguf), threads=1)
    try:
        tokenizer = Tokenizer.from_gguf(model.weights.meta)
        chosen = held_out_prompts(tokenizer, settings["prompts"], settings["prompt_tokens"])
        m = measure(model, [Candidate(name, draft, None)], [ids for _, ids in chosen], settings["new_tokens"],
                    settings=DraftSettings(), stop_ids=tokenizer.eog)
        run = m.runs[0]
        if not run.outputs_match_target:
            raise RuntimeError(f"{name}: speculative output differs from target-only greedy decoding")
        s = run.stats
        log(f"{name}: tau {s['tau_zlab']:.3f}, mean len {s['mean_accepted_length_incl_bonus']:.3f}, acceptance "
            f"{s['acceptance_rate']:.3f} ({s['accepted_tokens']}/{s['drafted_tokens']}), per position "
            f"{[round(x, 3) for x in s['per_position_accept_rate']]}")
        return {"prompts": [n for n, _ in chosen], "new_tokens": settings["new_tokens"],
                "n_max": run.settings["n_max"], "kind": run.drafter_kind} | {k: s[k] for k in STAT_KEYS}
    finally:
        model.close()
