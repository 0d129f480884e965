"""What the reference generators (gen_*_refs.py) share: how floats are rounded for JSON, the
versions every reference records, and the k-quant files of a converted model with their
references."""

import math
import os
import platform
import subprocess


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


def write_reference(path, reference):
    """`reference` as compact JSON (non-ASCII kept) with a final newline, as every generator stores it."""
    import json

    with open(path, "w") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


# The files a k-size model is written as, beside its F32 conversion (`k_quant_files`).
K_FILES = ("F16", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")


def k_quant_files(f32, quantize, config, prompts, record, tag):
    """`f32` (a converted GGUF) quantised by llama-quantize (`quantize`) into each of K_FILES beside
    it, and for it and each of them, transformers' greedy references (`record`) for the token-id
    `prompts` on the file's own weights, as its GGUF loader dequantises them (with the model's
    `config`). Returns the reference entry: `files` and `generate_<label>`."""
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = os.path.dirname(f32)
    stem = os.path.basename(f32)[: -len(".F32.gguf")]
    entry = {"files": {"F32": os.path.basename(f32)}}
    for label in K_FILES:
        path = os.path.join(out_dir, f"{stem}.{label}.gguf")
        subprocess.run([quantize, f32, path, label], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        entry["files"][label] = os.path.basename(path)
    for label in ("F32",) + K_FILES:
        model = AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=entry["files"][label], config=config,
                                                     torch_dtype=torch.float32).eval()
        cases = [{"kind": "ids", "prompt_ids": p} for p in prompts]
        record(f"{tag} {label}", model, cases, 2)
        entry[f"generate_{label}"] = cases
    return entry
