"""kimi-k3's FFNs on torch: the situ dense FFN (leading layers, shared experts) and the latent routed experts with
sigmoid routing (numba's ffn/latent_moe.py gives llama.cpp's order):

    situ(g, u) = beta tanh(g / beta) sigmoid(g) * linear_beta tanh(u / linear_beta)   (u as is if linear_beta <= 0)
    probs      = sigmoid(router h);  experts = top-k of probs + exp_probs_b;  weights = probs there
                 (/ max(sum, 2^-14) when normalized) (* scale)
    out        = routed_up(rmsnorm(sum_j weights_j down_j(situ(gate_j(z), up_j(z))))) + shared(h),  z = routed_down(h)

In float32 every step is numba's: situ op by op with glibc's tanhf (libm_tanhf.py) and sigmoid, the experts by a
stable descending sort of the selection scores (ties to the lower id), the weights' sum in float64, the slots
added in rank order; so the bits are numba's. In bf16 / f16 torch's own functions.
"""

import torch

from ggtools.runtime.model.kimi_k3_pieces import LatentMoETensors, SituFFNTensors
from ggtools.runtime.torch_backend import ggml_math as gm, tensor_math
from ggtools.runtime.torch_backend.ffn import WEIGHTS_SUM_MIN, DenseFFN, RoutedExperts
from ggtools.runtime.torch_backend.libm_tanhf import tanhf
from ggtools.runtime.torch_backend.vectors import device_vector, optional_device_vector


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float) -> torch.Tensor:
    if gate.dtype == torch.float32:
        beta, linear_beta = gm.f32(beta), gm.f32(linear_beta)
        inv_beta = gm.div(torch.ones(()), beta).item()
        if linear_beta > 0:     # tanhf per element: one call over both
            inv_linear = gm.div(torch.ones(()), linear_beta).item()
            tanh_gate, tanh_up = tanhf(torch.stack([gate * inv_beta, up * inv_linear])).unbind(0)
            up = tanh_up * linear_beta
        else:
            tanh_gate = tanhf(gate * inv_beta)
        act = (tanh_gate * beta) * gm.sigmoid(gate)
        return act * up
    g, u = gate.float(), up.float()
    act = beta * torch.tanh(g / beta) * torch.sigmoid(g)
    if linear_beta > 0:
        u = linear_beta * torch.tanh(u / linear_beta)
    return (act * u).to(gate.dtype)


class SituFFN(SituFFNTensors, DenseFFN):
    def __call__(self, h, stepwise: bool = False) -> torch.Tensor:
        gate, up = self.gate_up(h, stepwise)
        return self.down(situ(gate, up, self.beta, self.linear_beta), stepwise)


class LatentMoE(LatentMoETensors, RoutedExperts):
    def __post_init__(self):
        super().__post_init__()
        device = self.router.blocks.device
        self.probs_bias = device_vector(self.probs_bias, device)
        self.routed_norm = optional_device_vector(self.routed_norm, device)

    def route(self, h: torch.Tensor, stepwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, n_embd) -> experts (T, k) in descending order of selection, weights (T, k) float32."""
        logits = self.router(h, stepwise).float()
        exact = h.dtype == torch.float32
        probs = gm.sigmoid(logits) if exact else torch.sigmoid(logits)
        _, experts = torch.sort(probs + self.probs_bias, dim=-1, descending=True, stable=True)
        experts = experts[:, :self.n_expert_used]
        weights = probs.gather(-1, experts)
        if self.weights_norm:
            total = weights.double().sum(-1, keepdim=True).float().clamp(min=WEIGHTS_SUM_MIN)
            weights = gm.div(weights, total) if exact else weights / total
        if self.weights_scale not in (0.0, 1.0):
            weights = weights * gm.f32(self.weights_scale)
        return experts, weights

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        act = situ(self.gate.product(x, e), self.up.product(x, e), self.beta, self.linear_beta)
        return self.down.product(act, e).float()

    def __call__(self, h, stepwise: bool = False) -> torch.Tensor:
        routed_in = h if self.routed_down is None else self.routed_down(h, stepwise)
        experts, weights = self.route(h, stepwise)
        out = self.combined_slots(routed_in, experts, weights)
        if self.routed_norm is not None:
            out = tensor_math.rms_norm(out, self.routed_norm, self.eps)
        out = out.to(h.dtype)
        if self.routed_up is not None:
            out = self.routed_up(out, stepwise)
        return out if self.shared is None else out + self.shared(h, stepwise)
