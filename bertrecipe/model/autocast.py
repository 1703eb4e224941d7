"""The dtype a model's GEMMs (and so its attention biases) run in: autocast's where it is on, else the input's."""
from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(x: Tensor) -> torch.dtype:
    """autocast's dtype on x's device where autocast is on, else x's dtype."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
