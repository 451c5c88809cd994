"""DFlash drafters: Hugging Face checkpoints in, GGUF profiles out, and the rules each runtime's loader applies.

- safetensors.py  one safetensors file, read lazily by row ranges
- checkpoint.py   a HF drafter directory: config, parts, canonical tensor names, converter order
- config.py       DraftConfig: hyperparameters, mask id, block size, target layer ids (resolution rules)
- layout.py       the tensors a v1 / DFlash2 drafter holds and their shapes
- tensors.py      TensorJob (one output tensor) and its chunked encoding
- metadata.py     KVList (ordered KVs) and the general.* keys llama.cpp's converter derives
- target.py       what a drafter needs to know about its target GGUF
- llamacpp.py     profile `llama.cpp` (arch dflash)
- lucebox.py      profile `lucebox` (arch qwen35-dflash-draft)
- loaders.py      llama.cpp's and lucebox's drafter loader rules and messages (pair-check)
"""
