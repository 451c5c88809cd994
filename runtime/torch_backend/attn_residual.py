"""kimi-k3's cross-layer residual attention on torch: the softmax over the scores sum(rmsnorm(x) * w) of the banked
layer inputs and the current stream, then the probability-weighted sum of the raw values; the layer loop is
kimi_k3_pieces.ResidualBank's. In float32 numba's operations (target/attn_residual.py): ggml's rms_norm, the
scores' float64 sums, ggml's softmax, the bank's fma chain in bank order, plus cur times its probability."""

import torch

from ggtools.runtime.model.kimi_k3_pieces import AttnResidualTensors
from ggtools.runtime.torch_backend import ggml_math as gm, tensor_math
from ggtools.runtime.torch_backend.vectors import device_vector


class AttnResidual(AttnResidualTensors):
    def mix(self, bank: list, cur: torch.Tensor, score) -> torch.Tensor:
        """The mix of the banked inputs (oldest first) and cur; cur itself when the bank is empty."""
        if not bank:
            return cur
        if not isinstance(score, torch.Tensor):     # the score vectors go to the stream's device on first use
            self._to_device(cur.device)
            score = device_vector(score, cur.device)
        stack = torch.stack(bank + [cur]).float()                                   # (n_ckpt + 1, T, n)
        if cur.dtype != torch.float32:
            probs = torch.softmax(tensor_math.rms_norm(stack, score, self.eps).sum(-1), 0)
            return (stack * probs[..., None]).sum(0).to(cur.dtype)
        scores = gm.rms_norm(stack, score, self.eps).double().sum(-1).float()       # (n_ckpt + 1, T)
        probs = gm.soft_max(scores.T).T
        acc = torch.zeros_like(cur)
        for c in range(len(bank)):
            acc = gm.fma(stack[c], probs[c, :, None], acc)
        return acc + cur * probs[-1, :, None]

    def _to_device(self, device) -> None:
        self.attn_scores = [device_vector(s, device) for s in self.attn_scores]
        self.ffn_scores = [device_vector(s, device) for s in self.ffn_scores]
        self.output_score = device_vector(self.output_score, device)
