"""The pieces a target layer is made of, as the GGUF describes them: for each piece, the tensors it reads
(names, shapes, the optional ones) and how it loads them from a WeightFile.

A backend subclasses each piece with its ops (`__call__`): the numba classes under mixers/ and ffn/, the torch
ones under torch_backend/. The architecture table (archs.py) says which pieces an architecture's layers use; a
`pieces` namespace (one per backend) names the classes to load them as.
"""

from dataclasses import dataclass, field

import numpy as np

from ggtools.runtime.errors import ModelError

NO_NORM = np.zeros(0, np.float32)
NO_SINKS = np.zeros(0, np.float32)
NO_BIAS = np.zeros((0, 0), np.float32)

SOFTMAX, SOFTMAX_WEIGHT = 0, 1           # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, _SOFTMAX_WEIGHT
SIGMOID = 2                              # _SIGMOID (kimi-k3: kimi_k3_pieces.LatentMoETensors)
SWIGLU, SWIGLU_OAI, SITU = "swiglu", "swiglu_oai", "situ"


class Piece:
    """What every piece's description shares: the hook where a backend's subclass prepares its ops (matrix
    groups, copies on the device) once the tensors are loaded, and the piece run between a layer's RMS norm and
    its residual add."""

    def __post_init__(self):
        pass

    def with_residual(self, ops, x, norm, eps, *args):
        """x + self(rms_norm(x) * norm, *args) with the backend's ops (numba's one-token paths run it as one call)."""
        return self(ops.rms_norm(x, norm, eps), *args) + x


@dataclass(frozen=True)
class Routing:
    """How an architecture routes (the arguments llama.cpp's graph passes build_moe_ffn)."""
    gating: int = SOFTMAX
    normalize: bool = False
    activation: str = SWIGLU


@dataclass
class AttentionTensors(Piece):
    """Q, K, V projections (optional biases, qwen3's per-head q/k RMS norms), the output projection (optional
    bias), gpt-oss's sinks, the layer's sliding window (0: full causal attention). With output_gate (qwen35) the
    Q projection gives each head's query followed by a gate."""
    wq: object
    wk: object
    wv: object
    wo: object
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    # qwen3: per-head RMS norms of q and k before RoPE (empty: none)
    q_norm: np.ndarray = field(default_factory=lambda: NO_NORM)
    k_norm: np.ndarray = field(default_factory=lambda: NO_NORM)
    bo: np.ndarray | None = None
    sinks: np.ndarray = field(default_factory=lambda: NO_SINKS)
    window: int = 0      # sliding window (0: full causal attention)
    output_gate: bool = False

    @classmethod
    def load(cls, w, hp, i: int, output_gate: bool = False):
        """Layer i's attention tensors (blk.i.attn_*) from a WeightFile."""
        p = f"blk.{i}."
        q_dim, kv_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        q_norm = w.optional_vector(p + "attn_q_norm.weight", hp.head_dim)
        k_norm = w.optional_vector(p + "attn_k_norm.weight", hp.head_dim)
        if (q_norm is None) != (k_norm is None):
            raise ModelError(f"{w.meta.path}: layer {i} has only one of attn_q_norm / attn_k_norm")
        sinks = w.optional_vector(p + "attn_sinks.weight", hp.n_head)
        return cls(
            wq=w.matrix(p + "attn_q.weight", hp.n_embd, q_dim * (2 if output_gate else 1)),
            wk=w.matrix(p + "attn_k.weight", hp.n_embd, kv_dim),
            wv=w.matrix(p + "attn_v.weight", hp.n_embd, kv_dim),
            wo=w.matrix(p + "attn_output.weight", q_dim, hp.n_embd),
            bq=w.optional_vector(p + "attn_q.bias", q_dim),
            bk=w.optional_vector(p + "attn_k.bias", kv_dim),
            bv=w.optional_vector(p + "attn_v.bias", kv_dim),
            q_norm=NO_NORM if q_norm is None else q_norm,
            k_norm=NO_NORM if k_norm is None else k_norm,
            bo=w.optional_vector(p + "attn_output.bias", hp.n_embd),
            sinks=NO_SINKS if sinks is None else sinks,
            window=hp.n_swa if hp.swa_layers[i] else 0,
            output_gate=output_gate,
        )


@dataclass
class DenseFFNTensors(Piece):
    """The SwiGLU FFN: down(silu(gate(h)) * up(h))."""
    gate: object
    up: object
    down: object

    @classmethod
    def load(cls, w, hp, i: int, suffix: str = "", n_ff: int | None = None):
        """Layer i's blk.i.ffn_{gate,up,down}<suffix> (suffix "_shexp": qwen35moe's shared expert)."""
        p, n_ff = f"blk.{i}.", n_ff or hp.n_ff
        return cls(gate=w.matrix(p + f"ffn_gate{suffix}.weight", hp.n_embd, n_ff),
                   up=w.matrix(p + f"ffn_up{suffix}.weight", hp.n_embd, n_ff),
                   down=w.matrix(p + f"ffn_down{suffix}.weight", n_ff, hp.n_embd))


@dataclass
class RoutedExpertsTensors(Piece):
    """The routed-expert FFN of one layer: router (+ bias), expert stacks gate/up/down (+ biases, (n_expert, n)
    each; empty: none), and how the layer routes."""
    router: object
    gate: object
    up: object
    down: object
    n_expert_used: int
    routing: Routing = Routing()
    router_bias: np.ndarray | None = None
    gate_bias: np.ndarray = field(default_factory=lambda: NO_BIAS)
    up_bias: np.ndarray = field(default_factory=lambda: NO_BIAS)
    down_bias: np.ndarray = field(default_factory=lambda: NO_BIAS)
    weights_scale: float = 0.0

    @property
    def n_expert(self) -> int:
        return self.gate.n_expert

    @classmethod
    def load(cls, w, hp, i: int, routing: Routing = Routing()):
        """Layer i's blk.i.ffn_gate_inp and ffn_{gate,up,down}_exps (and their biases, where present)."""
        if not 0 < hp.n_expert_used <= hp.n_expert:
            raise ModelError(f"{w.meta.path}: {hp.n_expert_used} experts used of {hp.n_expert}; need 0 < used <= count")
        p, n_embd, n_ff, n_expert = f"blk.{i}.", hp.n_embd, hp.n_ff_exp, hp.n_expert

        def bias(name, n):
            b = w.optional_vector(p + name, n * n_expert)
            return NO_BIAS if b is None else b.reshape(n_expert, n)

        return cls(router=w.matrix(p + "ffn_gate_inp.weight", n_embd, n_expert),
                   gate=w.matrix(p + "ffn_gate_exps.weight", n_embd, n_ff, n_expert),
                   up=w.matrix(p + "ffn_up_exps.weight", n_embd, n_ff, n_expert),
                   down=w.matrix(p + "ffn_down_exps.weight", n_ff, n_embd, n_expert),
                   n_expert_used=hp.n_expert_used, routing=routing,
                   router_bias=w.optional_vector(p + "ffn_gate_inp.bias", n_expert),
                   gate_bias=bias("ffn_gate_exps.bias", n_ff), up_bias=bias("ffn_up_exps.bias", n_ff),
                   down_bias=bias("ffn_down_exps.bias", n_embd), weights_scale=hp.expert_weights_scale)


@dataclass
class SharedExpertTensors(Piece):
    """qwen35moe's FFN: the routed experts plus a shared expert (a dense SwiGLU FFN) whose output is scaled per
    token by sigmoid(shared_gate . h)."""
    routed: object
    shared: object
    shared_gate: object

    @classmethod
    def load(cls, w, hp, i: int, pieces, routing: Routing = Routing()):
        """Layer i's routed experts and blk.i.ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp (one row), as the
        backend's `pieces`."""
        return cls(pieces.RoutedExperts.load(w, hp, i, routing=routing),
                   pieces.DenseFFN.load(w, hp, i, suffix="_shexp", n_ff=hp.n_ff_shexp),
                   w.matrix(f"blk.{i}.ffn_gate_inp_shexp.weight", hp.n_embd, 1))


@dataclass
class DeltaNetTensors(Piece):
    """A Gated DeltaNet (linear attention) mixer's tensors, as llama.cpp's converter writes them for qwen35."""
    wqkv: object            # n_embd -> conv channels (q, k, v)
    wgate: object           # n_embd -> value_dim (z)
    wbeta: object           # n_embd -> n_v_heads
    walpha: object          # n_embd -> n_v_heads
    conv: np.ndarray        # (kernel, channels) float32: the conv taps, tap-major
    dt_bias: np.ndarray     # (n_v_heads,)
    a: np.ndarray           # (n_v_heads,) = -exp(A_log)
    norm: np.ndarray        # (head_dim,)
    wout: object            # value_dim -> n_embd
    n_k_heads: int
    head_dim: int
    eps: float

    @property
    def n_v_heads(self) -> int:
        return len(self.a)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @classmethod
    def load(cls, w, hp, i: int):
        """Layer i's Gated DeltaNet tensors (blk.i.attn_qkv / attn_gate / ssm_*) from a WeightFile."""
        p, shape = f"blk.{i}.", hp.delta_net
        value_dim = shape.n_v_heads * shape.head_dim
        channels = 2 * shape.n_k_heads * shape.head_dim + value_dim
        return cls(
            wqkv=w.matrix(p + "attn_qkv.weight", hp.n_embd, channels),
            wgate=w.matrix(p + "attn_gate.weight", hp.n_embd, value_dim),
            wbeta=w.matrix(p + "ssm_beta.weight", hp.n_embd, shape.n_v_heads),
            walpha=w.matrix(p + "ssm_alpha.weight", hp.n_embd, shape.n_v_heads),
            conv=np.ascontiguousarray(
                w.vector(p + "ssm_conv1d.weight", channels * shape.conv_kernel).reshape(channels, -1).T),
            dt_bias=w.vector(p + "ssm_dt.bias", shape.n_v_heads),
            a=w.vector(p + "ssm_a", shape.n_v_heads),
            norm=w.vector(p + "ssm_norm.weight", shape.head_dim),
            wout=w.matrix(p + "ssm_out.weight", value_dim, hp.n_embd),
            n_k_heads=shape.n_k_heads, head_dim=shape.head_dim, eps=hp.rms_eps)
