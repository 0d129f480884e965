"""What the reference generators (gen_*_refs.py) share: how floats are rounded for JSON and the
versions every reference records."""

import math
import platform


def sig(x, digits=8):
    """Round a float to `digits` significant digits (JSON-friendly); 0, infinities and NaN stay."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def base_versions():
    """Python's version and those of torch, transformers and tokenizers, which every generator uses."""
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
