"""Small float32 tensors on the device (norm weights, biases, sinks) from the description's numpy vectors."""

import numpy as np
import torch


def device_vector(x: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(device)


def optional_device_vector(x: np.ndarray | None, device) -> torch.Tensor | None:
    return None if x is None else device_vector(x, device)
