"""The torch backend: the runtime's models on torch (CPU or CUDA), weights kept as GGUF blocks on the device."""
