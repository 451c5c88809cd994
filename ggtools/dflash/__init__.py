"""DFlash drafters (v1, DFlash2, DSpark): Hugging Face checkpoints in, GGUF profiles out, and the rules each
runtime's loader applies.

- safetensors.py  one safetensors file, read lazily by row ranges
- checkpoint.py   a HF drafter directory: config, parts, canonical tensor names, converter order
- dspark.py       a DSpark checkpoint: its two config layouts, the Markov / confidence heads, d2t as target ids
- config.py       DraftConfig: hyperparameters, mask id, block size, target layer ids (resolution rules)
- layout.py       the tensors a v1 / DFlash2 drafter holds and their shapes
- tensors.py      TensorJob (one output tensor) and its chunked encoding
- metadata.py     KVList (ordered KVs) and the general.* keys llama.cpp's converter derives
- target.py       what a drafter needs to know about its target GGUF
- profiles.py     the profile facts: arch names, key and tensor names, id convention, encodings, tap archs
- llamacpp.py     the converter of profile `llama.cpp` (arch dflash)
- lucebox.py      the converter of profile `lucebox` (arch qwen35-dflash-draft)
- draftfile.py    DraftFile: a drafter GGUF read through its profile
- findings.py     Finding / Effect: what doctor reports, per runtime
- loaders.py      llama.cpp's and lucebox's drafter loader rules, quoting what each prints
- dspark_rules.py what llama.cpp's and lucebox's loaders and graphs do with a DSpark drafter's heads and d2t
- file_rules.py   the model-file rules (container, hyperparameters) as findings, per runtime
- pair_rules.py   the drafter + target rules, per runtime
- source_check.py a drafter GGUF against its Hugging Face checkpoint (values and tensors)
- rewrite.py      the KV edits and tensor actions that repair a drafter or move it to another layout
- errors.py       DFlashError: CheckpointError, RewriteRefused
"""
