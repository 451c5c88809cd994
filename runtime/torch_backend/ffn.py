"""The FFNs on torch: dense SwiGLU, routed experts (qwen3moe, gpt-oss; the routed part of qwen35moe) and
qwen35moe's routed experts plus a gated shared expert.

Routing follows llama.cpp's build_moe_ffn: SOFTMAX takes the k most probable experts with their probabilities,
SOFTMAX_WEIGHT the k largest logits with a softmax over those; weights are optionally normalized (sum clamped
at 2^-14) and scaled. Each expert a token routes to runs once on all the rows routed to it; experts no row
routes to are never read. In float32 the routing softmax, the expert choice (ties to the lower id), the weights'
normalization and the weighted sum of the k slots (in descending order, one rounding per operation) are the
numba runtime's (target/ffn/moe.py), so they give its bits.
"""

import torch

from ggtools.runtime.model.pieces import (SOFTMAX, SWIGLU_OAI, DenseFFNTensors, RoutedExpertsTensors,
                                           SharedExpertTensors)
from ggtools.runtime.torch_backend import ggml_math as gm, tensor_math
from ggtools.runtime.torch_backend.matrix import DeviceGroup
from ggtools.runtime.torch_backend.vectors import device_vector, optional_device_vector

WEIGHTS_SUM_MIN = 6.103515625e-5   # the smallest normal f16, as build_moe_ffn clamps the weights' sum


class DenseFFN(DenseFFNTensors):
    def __post_init__(self):
        self.gate_up = DeviceGroup(self.gate, self.up)

    def __call__(self, h, stepwise: bool = False) -> torch.Tensor:
        gate, up = self.gate_up(h, stepwise)
        return self.down(tensor_math.swiglu(gate, up), stepwise)


class RoutedExperts(RoutedExpertsTensors):
    def __post_init__(self):
        device = self.router.blocks.device
        self.router_bias = optional_device_vector(self.router_bias, device)
        self.gate_bias, self.up_bias, self.down_bias = (device_vector(b, device) for b in (
            self.gate_bias, self.up_bias, self.down_bias))

    def route(self, h: torch.Tensor, stepwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, n_embd) -> experts (T, k) in descending order, weights (T, k) float32."""
        logits = self.router(h, stepwise).float()
        if self.router_bias is not None:
            logits = logits + self.router_bias
        if h.dtype == torch.float32:
            return self._ggml_route(logits)
        if self.routing.gating == SOFTMAX:
            weights, experts = torch.softmax(logits, -1).topk(self.n_expert_used, -1)
        else:
            top, experts = logits.topk(self.n_expert_used, -1)
            weights = torch.softmax(top, -1)
        if self.routing.normalize:
            weights = weights / weights.sum(-1, keepdim=True).clamp(min=WEIGHTS_SUM_MIN)
        if self.weights_scale not in (0.0, 1.0):
            weights = weights * self.weights_scale
        return experts, weights

    def _ggml_route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """numba's route_rows: ggml's softmax, the k best by a stable descending sort (ties to the lower id),
        the weights' sum in float64 rounded to float32."""
        k = self.n_expert_used
        ranked = gm.soft_max(logits) if self.routing.gating == SOFTMAX else logits
        picked, experts = torch.sort(ranked, dim=-1, descending=True, stable=True)
        picked, experts = picked[:, :k], experts[:, :k]
        weights = picked if self.routing.gating == SOFTMAX else gm.soft_max(picked)
        if self.routing.normalize:
            total = weights.double().sum(-1, keepdim=True).float().clamp(min=WEIGHTS_SUM_MIN)
            weights = gm.div(weights, total)
        if self.weights_scale not in (0.0, 1.0):
            weights = weights * gm.f32(self.weights_scale)
        return experts, weights

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate.product(x, e), self.up.product(x, e)
        if self.gate_bias.numel():
            gate, up = gate + self.gate_bias[e].to(gate.dtype), up + self.up_bias[e].to(up.dtype)
        activation = tensor_math.swiglu_oai if self.routing.activation == SWIGLU_OAI else tensor_math.swiglu
        act = activation(gate, up)
        out = self.down.product(act, e).float()
        return out + self.down_bias[e] if self.down_bias.numel() else out

    def combined_slots(self, x, experts, weights) -> torch.Tensor:
        """Each slot's expert output on x, then numba's combine_rows: slot 0 times its weight, plus each next one
        (float32, llama.cpp's order)."""
        slots_out = torch.empty((x.shape[0], self.n_expert_used, self.down.n_rows), dtype=torch.float32,
                                device=x.device)
        for e in torch.unique(experts).tolist():
            tokens, slots = (experts == e).nonzero(as_tuple=True)
            slots_out[tokens, slots] = self._expert(e, x[tokens])
        out = slots_out[:, 0] * weights[:, 0, None]
        for j in range(1, self.n_expert_used):
            out = out + slots_out[:, j] * weights[:, j, None]
        return out

    def __call__(self, h, stepwise: bool = False) -> torch.Tensor:
        experts, weights = self.route(h, stepwise)
        if h.dtype == torch.float32:
            return self.combined_slots(h, experts, weights)
        out = torch.zeros((h.shape[0], self.down.n_rows), dtype=torch.float32, device=h.device)
        for e in torch.unique(experts).tolist():
            tokens, slots = (experts == e).nonzero(as_tuple=True)
            out.index_add_(0, tokens, self._expert(e, h[tokens]) * weights[tokens, slots, None])
        return out.to(h.dtype)


class SharedExpertMoE(SharedExpertTensors):
    def __call__(self, h, stepwise: bool = False) -> torch.Tensor:
        sigmoid = gm.sigmoid if h.dtype == torch.float32 else torch.sigmoid
        gate = sigmoid(self.shared_gate(h, stepwise))
        return self.routed(h, stepwise) + self.shared(h, stepwise) * gate
