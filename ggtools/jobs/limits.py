"""Bounds on what a decoding job may be asked for, checked before anything is decoded, each refusal naming its
limit: threads against the CPU count, a prompt plus its new tokens against the target's context length (a long
text is refused before it is tokenized), the draft KV and a draft tree's verify against the memory available.
"""

import os

from ggtools.byte_sizes import human_bytes
from ggtools.jobs.errors import UsageError
from ggtools.runtime.drafter.draft_kv import STORE_BYTES
from ggtools.runtime.kernels import workers

MAX_THREADS_PER_CPU = 4         # beyond this, more threads only wait on each other; far beyond, none start
MIN_BYTES_PER_TOKEN_BOUND = 4   # an unknown character (up to 4 UTF-8 bytes) may become one token


def check_threads(threads: int | None) -> None:
    if threads is None:
        return
    cpus = os.cpu_count() or 1
    limit = MAX_THREADS_PER_CPU * cpus
    if threads > limit:
        raise UsageError("--threads", f"{threads} is more than {limit} ({MAX_THREADS_PER_CPU} per CPU core; this "
                                      f"machine has {cpus})")
    if threads > workers.MAX_THREADS:
        raise UsageError("--threads", f"{threads} is more than {workers.MAX_THREADS} (the runtime's most)")


def check_new_tokens(n: int, context: int, target) -> None:
    """-n alone must leave room for a prompt of one token."""
    if n >= context:
        raise UsageError("-n", f"{n} new tokens do not fit the context length {context} of {target} (at most "
                               f"{context - 1}, leaving room for a one-token prompt)")


def longest_token_bytes(tokenizer) -> int:
    """An upper bound on the bytes of text one token stands for."""
    return max([MIN_BYTES_PER_TOKEN_BOUND] + [len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.tokens])


def too_long_to_fit(text: str, max_tokens: int, per_token: int) -> int | None:
    """The fewest tokens text can take (its UTF-8 bytes / the longest token's), when that is above max_tokens:
    such a text is refused without tokenizing it."""
    fewest = -(-len(text.encode("utf-8", "surrogatepass")) // per_token)
    return fewest if fewest > max_tokens else None


def available_memory(device: str = "cpu") -> tuple[int, str]:
    """(bytes that can still be allocated, where): the GPU's free memory for a CUDA device; else the kernel's
    MemAvailable (physical memory where there is no /proc)."""
    if device.startswith("cuda"):
        try:
            import torch
            return int(torch.cuda.mem_get_info(torch.device(device))[0]), f"free on {device}"
        except (ImportError, RuntimeError, ValueError, AssertionError):
            pass        # no torch or no such GPU: loading the model says so; the host's memory bounds it here
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "of memory available"
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "of physical memory"


def draft_kv_bytes(hp, ring_cap: int | None, kv_type: str, longest: int) -> int:
    """What the draft KV (runtime/drafter/draft_kv.py) allocates: a ring of align32(cap + block + 1) rows, or a
    full KV of align256(longest sequence + block) rows, each row K and V of every layer."""
    row = 2 * hp.n_layer * hp.n_head_kv * hp.head_dim * STORE_BYTES[kv_type]
    rows = _align(ring_cap + hp.block_size + 1, 32) if ring_cap is not None else _align(longest + hp.block_size, 256)
    return rows * row


def check_draft_kv(drafter, ring_cap: int | None, kv_type: str, longest: int, device: str = "cpu") -> None:
    """Refuse a draft KV larger than the memory available (a huge --ring-cap, or a drafter file's block size).
    drafter: anything with .hp (n_layer, n_head_kv, head_dim, block_size) and .path."""
    need = draft_kv_bytes(drafter.hp, ring_cap, kv_type, longest)
    free, where = available_memory(device)
    if need > free:
        kind = f"a ring of --ring-cap {ring_cap} slots" if ring_cap is not None else \
            f"--full-kv for {longest} positions"
        raise UsageError(drafter.path, f"the draft KV ({kind} + the drafter's block size {drafter.hp.block_size}) "
                                       f"would take {human_bytes(need)}, more than the {human_bytes(free)} {where}")


def tree_verify_bytes(n_vocab: int, nodes: int, longest: int) -> int:
    """What verifying a draft tree of `nodes` nodes allocates at least, on the host: rows = nodes + the root, the
    tree's visibility (rows^2 bools, ddtree.DraftTree), the batch's attention mask (rows x (cache + rows) bools,
    tree_batch.TreeBatch.visible; the cache at most the longest sequence) and every row's logits (float32)."""
    rows = nodes + 1
    return rows * rows + rows * (longest + rows) + rows * n_vocab * 4


def check_tree_verify(target, budget: int | None, longest: int) -> None:
    """Refuse a --tree-budget whose verify would not fit the memory available (its masks grow with the square of
    the nodes). target: anything with .n_vocab and .path."""
    if budget is None:
        return
    need = tree_verify_bytes(target.n_vocab, budget, longest)
    free, where = available_memory()
    if need > free:
        raise UsageError(f"--tree-budget {budget}", f"verifying a draft tree of {budget} nodes in {target.path} takes "
                                          f"at least {human_bytes(need)} (its visibility masks, (nodes + 1)^2 bytes "
                                          f"each, and every node's logits), more than the {human_bytes(free)} {where}")


def _align(n: int, to: int) -> int:
    return -(-n // to) * to
