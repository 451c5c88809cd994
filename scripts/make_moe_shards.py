#!/usr/bin/env python3
"""Write a synthetic Kimi-like MoE shard set: MXFP4 routed experts, a Q8_0 trunk (attention, shared experts,
token_embd, output), F32 norms and routers, and 128-wide Q8_0 tensors (attn_k_b) that Q4_K cannot take.

  python -m scripts.make_moe_shards OUT_DIR/prefix --layers 4 --shards 3          # small test set
  python -m scripts.make_moe_shards /tmp/moe/kimi --layers 18 --experts 128        # ~2 GB benchmark set
"""

import argparse
import os

from ggtools.samples import write_moe_set


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", help="output path prefix; shards are PREFIX-0000i-of-0000n.gguf")
    for name, default in [("layers", 4), ("hidden", 512), ("ffn", 256), ("experts", 8), ("vocab", 2048),
                          ("shards", 3), ("seed", 0)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)
    paths = write_moe_set(args.prefix, layers=args.layers, hidden=args.hidden, ffn=args.ffn, experts=args.experts,
                      vocab=args.vocab, shards=args.shards, seed=args.seed, force=args.force)
    total = sum(os.path.getsize(p) for p in paths)
    print(f"wrote {len(paths)} shard(s), {total / 1e6:.1f} MB: {paths[0]}")


if __name__ == "__main__":
    main()
