"""The DFlash drafter (v1 and DFlash2, llama.cpp and lucebox profiles): hyperparameters, the block's
forward, its attention, the draft KV (full or ring) and the draft chain."""

from ggtools.runtime.drafter.model import Drafter

__all__ = ["Drafter"]
