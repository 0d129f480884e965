#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as a Hugging Face directory, for the safetensors LLM loader's test on a
real model (its 49152-token byte-level vocabulary, chat template and 30 layers).

No model hub is needed: transformers reads the GGUF file `mix ex_burn.models.fetch` installs
(dequantising it to f32, as test/data/gen_pretrained_refs.py did to write
test/data/pretrained/smollm2_reference.json) and saves model and tokenizer with
save_pretrained, in f32, so the directory holds the weights that reference was computed on.
The directory (540 MB) is not committed; the Rust test skips, saying so, where it is absent.

  pip install torch transformers gguf
  python3 test/data/gen_smollm2_hf_dir.py [OUT [DTYPE]]   # default ~/.cache/ex_burn/smollm2-135m-instruct-hf, f32

DTYPE bf16 or f16 saves those weights instead (bench/pretrained.exs's `hf` section reads a bf16
one); the test reads the f32 directory.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

MODELS = os.environ.get("EXBURN_MODELS_DIR", os.path.expanduser("~/models"))
GGUF_DIR = os.path.join(MODELS, "llm", "smollm2-135m-instruct")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/ex_burn/smollm2-135m-instruct-hf")
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF, torch_dtype=torch.float32).eval()
    # a model loaded from GGUF refuses save_pretrained: the same weights in a plain one
    config = loaded.config
    config.quantization_config = None
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[sys.argv[2] if len(sys.argv) > 2 else "f32"]
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"wrote {out}: {sorted(os.listdir(out))}")


if __name__ == "__main__":
    main()
