"""A few of the k-size GGUF files and their references, small enough to commit, so that every test
run (CI too) holds the k-quant kernels to transformers and llama.cpp end to end; the whole
matrix stays in the caches the generators' `--k-quants` write (too large to commit).

Copies, from ~/.cache/ex_burn/{llm,spm,gemma}-kquants (written by gen_llm_refs.py,
gen_spm_refs.py and gen_gemma_refs.py with `--k-quants`, then gen_llama_cpp_refs.py), the files
in SUBSET into test/data/llm/kquants/, and writes their reference.json: per model, `files`,
`generate_<label>` and `llama_cpp_first_step_logits` for those files only, in the caches' form.

Usage: python3 test/data/gen_kquant_subset.py
"""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refs_common import write_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "llm", "kquants")
CACHE = os.path.expanduser("~/.cache/ex_burn")
# (cache, model, labels): Q4_K_M files hold Q4_K and Q6_K blocks, Q5_K_M ones Q5_K and Q6_K;
# Qwen2 has biases, Phi-3 fused projections, Gemma 2 soft caps and a sliding window
SUBSET = [
    ("llm-kquants", "qwen2", ["Q4_K_M", "Q5_K_M"]),
    ("spm-kquants", "phi3", ["Q4_K_M"]),
    ("gemma-kquants", "gemma2", ["Q4_K_M"]),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    out = {"versions": {}}
    for cache, model, labels in SUBSET:
        with open(os.path.join(CACHE, cache, "reference.json")) as f:
            ref = json.load(f)
        out["versions"][cache] = ref["versions"]
        entry = ref[model]
        files = {label: entry["files"][label] for label in labels}
        for name in files.values():
            shutil.copyfile(os.path.join(CACHE, cache, name), os.path.join(OUT, name))
        out[model] = {"files": files, **{f"generate_{label}": entry[f"generate_{label}"] for label in labels},
                      "llama_cpp_first_step_logits": {label: entry["llama_cpp_first_step_logits"][label] for label in labels}}
    write_reference(os.path.join(OUT, "reference.json"), out)
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {OUT}: {len(os.listdir(OUT))} files, {total} bytes")


if __name__ == "__main__":
    main()
