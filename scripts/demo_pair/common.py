"""Shared settings and the corpus for the embedded demo pair (target + DFlash drafter).

Text: the top-level ``Lib/*.py`` sources of the running interpreter (every Python install has them).
A fixed list of modules is held out: the evaluation prompts come only from those files.
"""

import os
import random
import sysconfig
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "ggtools" / "data" / "demo"
WORK_DIR = Path(os.environ.get("DEMO_PAIR_WORK", "/tmp/ggtools-demo-pair"))

SEED = 1234

# ---- tokenizer ----------------------------------------------------------------------------------
VOCAB_SIZE = 2048                 # incl. the two special tokens at the end
EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = [EOS_TOKEN, MASK_TOKEN]
# Qwen2's pre-tokenizer regex (HF tokenizer.json of Qwen2/Qwen3; llama.cpp pre-tokenizer "qwen2").
QWEN2_PRE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# ---- target (Qwen3ForCausalLM) -----------------------------------------------------------------
TARGET = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attention_bias=False,
)

# ---- drafter (DFlash v1) -----------------------------------------------------------------------
BLOCK_SIZE = 8
TARGET_LAYER_IDS = [1, 2]
DRAFT_LAYERS = 2
DRAFT_INTERMEDIATE = 384

# Held-out modules (present in CPython 3.9 .. 3.13): evaluation prompts come only from these.
HELD_OUT = [
    "bisect.py", "colorsys.py", "csv.py", "filecmp.py", "fileinput.py", "fnmatch.py", "getopt.py", "glob.py",
    "graphlib.py", "heapq.py", "netrc.py", "pprint.py", "queue.py", "reprlib.py", "sched.py", "shlex.py",
    "tabnanny.py", "textwrap.py",
]
EXCLUDED_PREFIXES = ("_sysconfigdata",)
EXCLUDED = {"this.py"}            # rot13 text


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files():
    """(train files, held-out files), sorted by name."""
    files = sorted(p for p in stdlib_dir().glob("*.py")
                   if p.name not in EXCLUDED and not p.name.startswith(EXCLUDED_PREFIXES))
    train = [p for p in files if p.name not in HELD_OUT]
    held = [p for p in files if p.name in HELD_OUT]
    return train, held


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def seed_everything(seed: int = SEED):
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
