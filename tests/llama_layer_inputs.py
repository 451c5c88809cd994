"""Run as a child process: ask libllama for a layer's input (llama_set_embeddings_layer_inp, what DFlash / DSpark
drafting in llama.cpp asks for), decode the given tokens, print the input rows as JSON. For an arch whose graph
never sets t_layer_inp the decode aborts on GGML_ASSERT, so it must not run in the test process.

    python tests/llama_layer_inputs.py MODEL.gguf LAYER TOKEN,TOKEN,...
"""

import ctypes
import json
import sys


def main(path: str, layer: int, tokens: list[int]) -> None:
    import llama_cpp
    from llama_cpp import llama_cpp as low

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 64
    params.n_threads = params.n_threads_batch = 1
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, params)
    # declared in src/llama-ext.h without extern "C": the C++ names
    enable = getattr(low._lib, "_Z30llama_set_embeddings_layer_inpP13llama_contextjb")
    enable.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool]
    rows = getattr(low._lib, "_Z30llama_get_embeddings_layer_inpP13llama_contextj")
    rows.argtypes, rows.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)
    enable(ctx, layer, True)
    batch = (llama_cpp.llama_token * len(tokens))(*tokens)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(batch, len(tokens))) != 0:
        sys.exit("llama_decode failed")
    n_embd = llama_cpp.llama_model_n_embd(model)
    data = rows(ctx, layer)
    print(json.dumps([[data[t * n_embd + i] for i in range(n_embd)] for t in range(len(tokens))]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")])
