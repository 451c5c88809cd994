"""The engine: moves bytes, knows nothing of DFlash. One streaming rewrite serves quantize, requant-trunk,
patch, doctor --fix, convert gguf-layout and convert mtp; each is a different Plan over it.

- rewrite.py   one shard: KVs (with the plan's edits), tensors copied or converted in row chunks, atomic, verified
- runner.py    a whole Plan: shard jobs in parallel processes (-j), disk preflight, progress, interrupts, resume
- manifest.py  the resume manifest, the source identity and the output description (ShardResult) it records
- errors.py    EngineError and its kinds
"""

from ggtools.engine.errors import (DiskSpaceError, EngineError, Interrupted, ManifestError, NonFiniteError,
                                   RewriteError, ShardFailed)
from ggtools.engine.manifest import ShardResult
from ggtools.engine.rewrite import planned_header, rewrite_shard
from ggtools.engine.runner import RunReport, preflight_disk, run_plan

__all__ = ["DiskSpaceError", "EngineError", "Interrupted", "ManifestError", "NonFiniteError", "RewriteError",
           "RunReport", "ShardFailed", "ShardResult", "planned_header", "preflight_disk", "rewrite_shard", "run_plan"]
