#!/usr/bin/env python3
"""A MoE target larger than this machine's memory, run from disk: greedy decoding and a short speculative run,
with resident memory, tok/s and the bytes read from storage per token against the routed experts' size.

The target is a synthetic qwen3moe (ggtools.samples.write_runnable_moe: MXFP4 routed experts, a Q8_0 or Q4_K trunk,
the demo target's tokenizer), K3-like in its routing (384 experts, 8 per token) at a width that keeps a token's
arithmetic small: hidden 2048, experts 768 wide (2.5 MB each as MXFP4). The layer count makes the file 1.25x the
machine's memory (MemTotal), or the largest the disk allows while keeping --keep-free-gb free (said so). It is
written into a temporary directory (--dir) that is removed at the end, also on ^C / SIGTERM / SIGHUP, and dropped
from the page cache before the run, so the first tokens read their experts from disk.

Measured per token (decode) or per step (speculative): seconds, bytes this process read from storage
(/proc/self/io read_bytes: page faults and the kernel's read-ahead for it included), major faults, RSS split into
anonymous memory (activations, KV cache, norms) and file pages (the mapped weights still resident; the page cache
can drop them, so they are no memory the process holds on to). "Routed" is the bytes of the experts the router picked
(layers x k x gate/up/down of one expert); on a cold cache, bytes read / routed is the read amplification.

The speculative run drafts with a random DFlash drafter made for this target (z-lab's class, converted by ggtools;
left out when torch or dflash is missing): its drafts are almost never accepted, so each step verifies 8 tokens and
commits about one; the worst case for the experts a step touches. Its output must equal greedy decoding's.

--paging on|off|auto (or a list: on,off, one run each from a cold page cache) sets GGTOOLS_EXPERT_PAGING
(runtime/weights.py: MADV_RANDOM on the expert stacks and MADV_WILLNEED on each routed expert; auto turns it on for
expert stacks over half the available memory).

  python -m scripts.bench.larger_than_ram [--size-gb N] [--dir DIR] [--tokens 16] [--spec-tokens 16]
                                          [--threads 2] [--paging auto] [--trunk q8_0|q4_k] [--json]
                                          [--markdown [PAGE]]
"""

import argparse
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools.samples import runnable_moe_layer_bytes, runnable_moe_specs, nbytes, write_runnable_moe
from scripts.bench import page
from scripts.bench.native_llama import simd_flags

GEOMETRY = dict(hidden=2048, heads=16, kv_heads=4, head_dim=128, ffn=768, experts=384)
USED = 8
GB = 1e9
PROMPT = "def heap_push(heap, item):\n    heap.append(item)\n"     # short: a prompt's tokens route to many experts


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out


def process_memory() -> dict:
    """RSS, its peak, and its anonymous and file-backed parts, in bytes (one reading of /proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def major_faults() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[9])


def plan_size(directory, size_gb, keep_free_gb) -> tuple:
    """(bytes wanted, note): 1.25x MemTotal, or size_gb, capped by the disk."""
    mem = meminfo()
    wanted = size_gb * GB if size_gb else 1.25 * mem["MemTotal"]
    room = shutil.disk_usage(directory).free - keep_free_gb * GB
    if room < wanted:
        if room < 2 * GB:
            raise SystemExit(f"error: {directory}: {room / GB:.1f} GB of disk to spare (keeping {keep_free_gb} GB "
                             f"free); need at least 2")
        return room, (f"the disk allows {room / GB:.1f} GB (keeping {keep_free_gb} GB free), less than the "
                      f"{wanted / GB:.1f} GB wanted: the file is smaller than planned")
    return wanted, ""


def geometry_for(size, trunk) -> dict:
    per_layer = runnable_moe_layer_bytes(**GEOMETRY, trunk=trunk)
    return dict(GEOMETRY, layers=max(4, int(size // per_layer)), used=USED, trunk=trunk)


def expert_bytes(geometry) -> int:
    """Bytes of one expert: its gate, up and down rows (MXFP4)."""
    h, f = geometry["hidden"], geometry["ffn"]
    return nbytes((h, f), T.MXFP4) * 2 + nbytes((f, h), T.MXFP4)


def target_bytes(geometry) -> int:
    """Bytes of the target's tensor data (the file is this and its header)."""
    return sum(nbytes(ne, t) for _, ne, t in runnable_moe_specs(
        geometry["layers"], *(geometry[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "experts")),
        2048, geometry["trunk"]))


def write_target(path, geometry) -> float:
    total = target_bytes(geometry)
    done, t0, shown = [0], time.perf_counter(), [0.0]

    def progress(n):
        done[0] += n
        if time.perf_counter() - shown[0] > 5:
            shown[0] = time.perf_counter()
            print(f"  writing {done[0] / GB:.1f} / {total / GB:.1f} GB", file=sys.stderr, flush=True)

    write_runnable_moe(path, **{k: v for k, v in geometry.items()}, progress=progress)
    return time.perf_counter() - t0


def drop_from_page_cache(path):
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


class Meter:
    """Deltas of time, bytes read and major faults between marks, and the memory at each mark."""

    def __init__(self):
        self.mark()

    def mark(self) -> dict:
        now = (time.perf_counter(), io_read_bytes(), major_faults())
        delta = {}
        if hasattr(self, "_last"):
            delta = {"seconds": now[0] - self._last[0], "read_bytes": now[1] - self._last[1],
                     "major_faults": now[2] - self._last[2]}
        self._last = now
        delta.update(process_memory())
        return delta


def greedy_run(model, ids, n) -> tuple:
    meter = Meter()
    logits, _ = model.forward(ids, logits="last")
    prompt = meter.mark()
    tokens, steps = [int(np.argmax(logits[-1]))], []
    while len(tokens) < n:
        logits, _ = model.forward([tokens[-1]], logits="all")
        steps.append(meter.mark())
        tokens.append(int(np.argmax(logits[-1])))
    return tokens, prompt, steps


def make_drafter(work: Path, target: str, geometry) -> str | None:
    """A random DFlash v1 drafter for the target (z-lab's class, ggtools' converter), or None without torch/dflash."""
    try:
        import torch
        import dflash
        from transformers import Qwen3Config
    except ImportError as e:
        print(f"left out the speculative run: {e}", file=sys.stderr)
        return None
    from ggtools.jobs.convert import convert_dflash
    from scripts.fixtures.tiny_models import _reinit
    layers = geometry["layers"]
    config = Qwen3Config(hidden_size=geometry["hidden"], num_hidden_layers=1, num_attention_heads=geometry["heads"],
                         num_key_value_heads=geometry["kv_heads"], head_dim=geometry["head_dim"],
                         intermediate_size=2048, vocab_size=2048, max_position_embeddings=2048, rms_norm_eps=1e-6,
                         num_target_layers=layers, tie_word_embeddings=False,
                         dflash_config=dict(block_size=8, mask_token_id=2047,
                                            target_layer_ids=sorted({1, layers // 2, layers - 2})))
    torch.manual_seed(0)
    model = dflash.DFlashDraftModel(config)
    _reinit(model, 0)
    work.mkdir(exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(work / "drafter-hf")
    out = work / "drafter.gguf"
    convert_dflash(work / "drafter-hf", out, target=target, outtype="f16")
    return str(out)


def speculative_run(model, drafter, ids, n):
    from ggtools.runtime import Drafter
    from ggtools.runtime.speculative import speculative_generate
    d = Drafter(drafter, model)
    kv = d.new_kv(64)
    meter = Meter()
    out = speculative_generate(model, d, kv, ids, n)
    total = meter.mark()
    d.close()
    return out, total


def summarize(steps) -> dict:
    seconds = sum(s["seconds"] for s in steps)
    return {"steps": len(steps), "seconds": seconds, "tok_s": len(steps) / seconds,
            "read_bytes": sum(s["read_bytes"] for s in steps), "major_faults": sum(s["major_faults"] for s in steps),
            "max_rss": max(s["VmRSS"] for s in steps), "max_rss_anon": max(s["RssAnon"] for s in steps),
            "max_rss_file": max(s["RssFile"] for s in steps)}


def compile_kernels(work: Path, geometry, drafter: bool, threads) -> None:
    """Run a small model of the same types (and a drafter for it) once: numba compiles (or loads from its cache)
    the kernels before anything is timed."""
    from ggtools.runtime import TargetModel, Tokenizer
    small = dict(geometry, layers=4, experts=16)
    path = write_runnable_moe(work / "compile.gguf", **small)
    model = TargetModel(path, threads=threads)
    ids = Tokenizer.from_gguf(model.weights.meta).encode(PROMPT)
    greedy_run(model, ids, 3)
    if drafter:
        speculative_run(model, make_drafter(work / "compile", path, small), ids, 3)
    model.close()


def run(args, work: Path) -> dict:
    size, note = plan_size(work, args.size_gb, args.keep_free_gb)
    trunk = {"q8_0": T.Q8_0, "q4_k": T.Q4_K}[args.trunk]
    geometry = geometry_for(size, trunk)
    path = work / "synthetic-moe.gguf"
    mem = meminfo()
    print(f"writing a {target_bytes(geometry) / GB:.1f} GB target ({geometry['layers']} layers x "
          f"{geometry['experts']} experts) "
          f"into {work}; MemTotal {mem['MemTotal'] / GB:.1f} GB, MemAvailable {mem['MemAvailable'] / GB:.1f} GB"
          + (f"; {note}" if note else ""), file=sys.stderr)
    if args.keep and path.exists():
        write_seconds = 0.0     # --keep: the file of an earlier run (same size and geometry)
    else:
        write_seconds = write_target(path, geometry)
    file_bytes = path.stat().st_size
    if file_bytes <= mem["MemAvailable"]:
        note = "; ".join(filter(None, [note, f"the {file_bytes / GB:.1f} GB file fits in the available memory "
                                             f"({mem['MemAvailable'] / GB:.1f} GB): this run is not larger than RAM"]))
    drafter = make_drafter(work, str(path), geometry) if args.spec_tokens else None
    compile_kernels(work, geometry, drafter is not None, args.threads)
    drop_from_page_cache(path)
    if drafter:
        drop_from_page_cache(drafter)

    res = {"cpu_flags": simd_flags(), "file_bytes": file_bytes, "write_seconds": write_seconds, "note": note,
           "mem_total": mem["MemTotal"], "mem_available": mem["MemAvailable"],
           "geometry": geometry | {"trunk": args.trunk}, "routed_bytes_per_token": geometry["layers"] * USED *
           expert_bytes(geometry), "experts_bytes": geometry["layers"] * geometry["experts"] * expert_bytes(geometry),
           "runs": []}
    greedy_tokens = None
    for mode in args.paging.split(","):
        print(f"expert paging {mode}: load, {args.tokens} greedy tokens"
              + (f", {args.spec_tokens} speculative" if drafter else "") + " from a cold page cache", file=sys.stderr)
        drop_from_page_cache(path)
        one = run_ours(path, drafter, mode, args)
        gc.collect()        # the model's arrays and with them its mapping: the file's pages can be dropped again
        tokens = one.pop("tokens")
        greedy_tokens = greedy_tokens or tokens
        one["same_greedy_tokens_as_first"] = tokens == greedy_tokens
        res["runs"].append(one)
    if args.llama and 2 * file_bytes < 0.8 * meminfo()["MemAvailable"]:
        drop_from_page_cache(path)
        res["llama"] = run_llama(path, args, greedy_tokens)
    elif args.llama:
        res["llama_note"] = (f"llama.cpp not run: its default loading repacks MXFP4 experts into anonymous memory "
                             f"(CPU_REPACK), which needs about the file's size again ({file_bytes / GB:.1f} GB) beside "
                             f"the mapped file: the out-of-memory killer's work on a file larger than RAM")
    return res


def reset_peak_rss() -> None:
    """Start VmHWM afresh (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run_ours(path, drafter, mode, args) -> dict:
    """Load the target with expert paging `mode`, decode greedily, then speculatively."""
    os.environ["GGTOOLS_EXPERT_PAGING"] = mode
    from ggtools.runtime import TargetModel, Tokenizer
    reset_peak_rss()
    meter = Meter()
    model = TargetModel(str(path), threads=args.threads)
    load = meter.mark()
    ids = Tokenizer.from_gguf(model.weights.meta).encode(PROMPT)
    run = {"paging": mode, "experts_paged": model.weights.paged_experts, "threads": model.threads, "load": load,
           "prompt_tokens": len(ids)}
    tokens, prompt, steps = greedy_run(model, ids, args.tokens)
    run.update(tokens=tokens, prompt=prompt, greedy=summarize(steps), greedy_steps=steps)
    if drafter:
        out, total = speculative_run(model, drafter, ids, args.spec_tokens)
        run["speculative"] = {"tokens": len(out.tokens), "seconds": total["seconds"],
                              "read_bytes": total["read_bytes"], "major_faults": total["major_faults"],
                              "max_rss": total["VmHWM"], "rss_anon": total["RssAnon"], "rss_file": total["RssFile"],
                              "steps": len(out.steps), "same_as_greedy": out.tokens == tokens[:len(out.tokens)]}
    run["peak_rss"] = process_memory()["VmHWM"]
    model.close()
    return run


def child_figures(pid) -> dict:
    figures = {}
    with open(f"/proc/{pid}/io") as f:
        figures["read_bytes"] = next(int(l.split()[1]) for l in f if l.startswith("read_bytes:"))
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                figures[key] = int(value.split()[0]) * 1024
    return figures


def run_llama(path, args, greedy_tokens) -> dict:
    """The test oracle's llama.cpp on the same file (default model loading: mmap with its prefetch)."""
    from scripts.bench.llama_process import LlamaProcess
    from ggtools.runtime import Tokenizer, TargetModel
    t = time.perf_counter()
    llama = LlamaProcess(path, args.threads or 2, n_ctx=256)
    load = {"seconds": time.perf_counter() - t} | child_figures(llama.proc.pid)
    model = TargetModel(str(path), threads=1)
    ids = Tokenizer.from_gguf(model.weights.meta).encode(PROMPT)
    model.close()
    before = child_figures(llama.proc.pid)
    rate, tokens = llama.decode(ids, args.tokens)
    after = child_figures(llama.proc.pid)
    llama.close()
    return {"load": load, "decode_tok_s": rate, "read_bytes_decode": after["read_bytes"] - before["read_bytes"],
            "peak_rss": after["VmHWM"], "rss_file": after["RssFile"], "rss_anon": after["RssAnon"],
            "same_greedy_tokens": tokens == greedy_tokens}


def report(res):
    geo = res["geometry"]
    print(f"CPU flags: {res['cpu_flags']}")
    print(f"target: {res['file_bytes'] / GB:.1f} GB synthetic qwen3moe, {geo['layers']} layers, {geo['experts']} "
          f"MXFP4 experts ({USED} routed), {geo['trunk']} trunk, written in {res['write_seconds']:.0f} s; MemTotal "
          f"{res['mem_total'] / GB:.1f} GB, MemAvailable {res['mem_available'] / GB:.1f} GB"
          + (f"\nnote: {res['note']}" if res["note"] else ""))
    routed = res["routed_bytes_per_token"]
    for run in res["runs"]:
        g = run["greedy"]
        print(f"\nexpert paging {run['paging']} (paged: {run['experts_paged']}), threads {run['threads']}")
        print(f"  load: {run['load']['seconds']:.2f} s, RSS {run['load']['VmRSS'] / GB:.2f} GB")
        p = run["prompt"]
        print(f"  prompt ({run['prompt_tokens']} tokens): {p['seconds']:.1f} s, read {p['read_bytes'] / GB:.2f} GB")
        per_token = g["read_bytes"] / g["steps"]
        print(f"  greedy: {g['steps']} tokens, {g['tok_s']:.2f} tok/s, read {per_token / 1e6:.0f} MB per token "
              f"against {routed / 1e6:.0f} MB routed ({per_token / routed:.2f}x), "
              f"{g['major_faults'] / g['steps']:.0f} major faults per token; same tokens as the first run: "
              f"{run['same_greedy_tokens_as_first']}")
        print(f"          RSS at most {g['max_rss'] / GB:.2f} GB: anonymous {g['max_rss_anon'] / GB:.2f} GB, "
              f"file pages {g['max_rss_file'] / GB:.2f} GB (of a {res['file_bytes'] / GB:.1f} GB file)")
        s = run.get("speculative")
        if s:
            print(f"  speculative: {s['tokens']} tokens in {s['steps']} steps, {s['tokens'] / s['seconds']:.2f} tok/s, "
                  f"read {s['read_bytes'] / s['tokens'] / 1e6:.0f} MB per token; RSS at most {s['max_rss'] / GB:.2f} "
                  f"GB (anonymous {s['rss_anon'] / GB:.2f} GB); output = greedy: {s['same_as_greedy']}")
        print(f"  peak RSS {run['peak_rss'] / GB:.2f} GB")
    if res.get("llama_note"):
        print("\n" + res["llama_note"])
    lm = res.get("llama")
    if lm:
        print(f"\nllama.cpp (test oracle build, mmap with its default prefetch): load {lm['load']['seconds']:.1f} s "
              f"(read {lm['load']['read_bytes'] / GB:.1f} GB, RSS {lm['load']['VmRSS'] / GB:.2f} GB), decode "
              f"{lm['decode_tok_s']:.2f} tok/s, read {lm['read_bytes_decode'] / max(1, args_tokens(res)) / 1e6:.0f} MB "
              f"per token, peak RSS {lm['peak_rss'] / GB:.2f} GB; same greedy tokens: {lm['same_greedy_tokens']}")


def markdown(res) -> str:
    """The section of docs/benchmarks.md: one row per paging mode."""
    geo, routed = res["geometry"], res["routed_bytes_per_token"]
    rows = []
    for run in res["runs"]:
        g, p, s = run["greedy"], run["prompt"], run.get("speculative")
        per_token = g["read_bytes"] / g["steps"]
        rows.append([f"{run['paging']} (paged: {run['experts_paged']})", run["threads"],
                     f"{p['read_bytes'] / GB:.2f} GB in {p['seconds']:.1f} s", f"{g['tok_s']:.2f}",
                     f"{per_token / 1e6:.0f} MB ({per_token / routed:.2f}x)",
                     f"{g['major_faults'] / g['steps']:.0f}",
                     f"{g['max_rss'] / GB:.2f} GB ({g['max_rss_anon'] / GB:.2f} GB anonymous)",
                     f"{s['tokens'] / s['seconds']:.2f} tok/s, {s['read_bytes'] / s['tokens'] / 1e6:.0f} MB per token, "
                     f"= greedy: {'yes' if s['same_as_greedy'] else '**no**'}" if s else "-"])
    text = (f"A {res['file_bytes'] / GB:.1f} GB synthetic qwen3moe ({geo['layers']} layers, {geo['experts']} MXFP4 "
            f"experts of width {geo['ffn']}, {USED} routed, {geo['trunk']} trunk) on a machine with MemTotal "
            f"{res['mem_total'] / GB:.1f} GB (MemAvailable {res['mem_available'] / GB:.1f} GB), each mode from a cold "
            f"page cache; a token's routed experts are {routed / 1e6:.0f} MB"
            + (f"; note: {res['note']}" if res["note"] else "") + ":\n\n" + page.table(
                ["expert paging", "threads", f"prompt ({res['runs'][0]['prompt_tokens']} tokens) read",
                 "greedy tok/s", "read per token (/ routed)", "major faults per token",
                 "RSS at most (process memory)", "speculative"], rows))
    if res.get("llama_note"):
        text += "\n\n" + res["llama_note"] + "."
    return text


def args_tokens(res) -> int:
    return res["runs"][0]["greedy"]["steps"] if res["runs"] else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, help="file size (default: 1.25x MemTotal, within the disk)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary directory goes")
    ap.add_argument("--keep-free-gb", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens")
    ap.add_argument("--spec-tokens", type=int, default=16, help="speculative tokens (0: no speculative run)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--paging", default="auto", help="expert paging modes to run, in turn: auto, on, off (e.g. on,off)")
    ap.add_argument("--llama", action="store_true", help="also decode with llama.cpp (the oracle build) on the file")
    ap.add_argument("--trunk", default="q8_0", choices=["q8_0", "q4_k"])
    ap.add_argument("--keep", metavar="DIR", help="write into DIR and keep the files (a later run with the same size "
                    "reuses them; for experiments: nothing removes them)")
    ap.add_argument("--json", action="store_true")
    page.add_option(ap)
    args = ap.parse_args()

    def stop(signum, frame):
        raise SystemExit(f"stopped by signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        res = run(args, Path(args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="ggtools-bigmoe-", dir=args.dir) as work:
            res = run(args, Path(work))
    if args.json:
        print(json.dumps(res, indent=1, default=str))
        return
    if args.markdown:
        page.emit(args, "larger_than_ram", markdown(res))
    if not page.prints_markdown(args):
        report(res)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
