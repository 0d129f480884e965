#!/usr/bin/env python3
"""Tiny GGUFs with a SentencePiece tokenizer (Llama, Phi-3), and llama.cpp's and transformers' references.

GGUF files of Llama 2, Mistral, TinyLlama, Phi-3 and Gemma carry SentencePiece vocabularies
(`tokenizer.ggml.model = "llama"`: pieces with scores, `▁` for spaces, `<0xNN>` byte pieces).
This writes, next to this script, under llm/:

  tiny-llama-spm.F32.gguf   a Llama model (hidden 64, 2 layers) whose tokenizer is a
                            SentencePiece BPE model trained here with byte fallback
  tiny-phi3.F32.gguf        a Phi-3 model (fused Q/K/V and gate/up projections, rotation of
                            head halves) of the same size, with the same tokenizer
  tiny-phi3.Q8_0.gguf       the same, quantised by llama-quantize
  reference_spm.json        llama.cpp's token ids (refs_common.LlamaCpp, the file's own tokenizer)
                            for texts with spaces, digits, accents, emoji, CJK, control tokens
                            and bytes outside the vocabulary; transformers' ids for the same texts;
                            and, per model, transformers' greedy tokens for two prompts

No model hub is needed. Run (CPU only):

  pip install torch numpy transformers sentencepiece protobuf
  LLAMA_CPP=/path/to/llama.cpp python3 test/data/gen_spm_refs.py

LLAMA_CPP (default /work/peers/llama.cpp) must hold convert_hf_to_gguf.py, gguf-py/, a CMake
build (build/bin/llama-quantize, libllama.so) and its headers, against which `cc` builds
llama_cpp_logits.c.

With `--k-quants [DIR]` (default ~/.cache/ex_burn/spm-kquants) it writes the two models with rows
of 256 as F32, F16, Q8_0, Q4_K_M, Q5_K_M and Q6_K files and transformers' references on each
file's weights instead (test/data/gen_llama_cpp_refs.py adds llama.cpp's): files too large to commit, which the Rust
tests use where they exist.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from gen_llm_refs import CORPUS as QWEN_CORPUS  # noqa: E402
from refs_common import LlamaCpp, base_versions, k_quant_files, llama_cpp_version, sig, write_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "llm")
LLAMA_CPP = os.environ.get("LLAMA_CPP", "/work/peers/llama.cpp")
NEW_TOKENS = 12

# the Qwen references' training texts (English, French, Chinese, code, punctuation)
CORPUS = QWEN_CORPUS * 7

TOKENIZE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world 12345, it's 2024!",
    "  two leading spaces, and  double  spaces",
    "crème brûlée 😀 我爱",
    "<s>user\nhi</s>",
    "tabs\tand\nnew lines\n\n",
]
PROMPTS = ["The quick brown fox", "Once upon a time"]


def train_spm(dir):
    import sentencepiece as spm

    corpus = os.path.join(dir, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("\n".join(CORPUS))
    prefix = os.path.join(dir, "spm")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=400, byte_fallback=True,
        character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", minloglevel=2)
    return prefix + ".model"


def tokenizer(dir):
    from transformers import LlamaTokenizer

    # transformers builds its (fast) Llama tokenizer from the SentencePiece model file
    spm_dir = os.path.join(dir, "spm_tok")
    os.makedirs(spm_dir)
    shutil.copy(train_spm(dir), os.path.join(spm_dir, "tokenizer.model"))
    tok = LlamaTokenizer.from_pretrained(spm_dir, legacy=False, add_bos_token=True)
    assert len(tok) == 400, len(tok)
    return tok, os.path.join(spm_dir, "tokenizer.model")


def build(dir, arch, tok, spm_model, hidden=64):
    from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32")
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Phi3ForCausalLM(Phi3Config(pad_token_id=0, sliding_window=None, **common))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # products over wider rows grow with their square root: the same gain at every size
            scale = (0.6 if ("embed" in name or "lm_head" in name) else 0.15) * (64 / hidden) ** 0.5
            v = 1.0 + 0.2 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight") else scale * torch.randn(p.shape, generator=g)
            p.copy_(v.half().float())
    model.eval()
    hf = os.path.join(dir, "hf-" + arch)
    model.save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)
    # the SentencePiece model itself, which the converter reads for the pieces' scores (without
    # it, it takes tokenizer.json and scores every piece -1000, as no real file is)
    shutil.copy(spm_model, os.path.join(hf, "tokenizer.model"))
    return model, hf


def convert(hf, out):
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    subprocess.run([sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), hf, "--outfile", out, "--outtype", "f32"],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def greedy(model, ids):
    """NEW_TOKENS greedy steps (eos not treated specially): each step's token and its lead over
    the second, and the first step's top 10 `[id, logit]`."""
    ids, out, first = list(ids), [], None
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            if first is None:
                top10 = torch.topk(logits, 10)
                first = [[int(i), sig(v)] for i, v in zip(top10.indices, top10.values)]
            top = torch.topk(logits, 2)
            out.append((int(top.indices[0]), float(top.values[0] - top.values[1])))
            ids.append(out[-1][0])
    return out, first


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--k-quants":
        write_k(sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/ex_burn/spm-kquants"))
    else:
        write_tiny()


K_PROMPTS = [[1, 320, 315, 342, 292, 327, 323], [1, 284, 294, 339], [1, 331, 263, 347, 334, 305, 332, 333, 341, 277]]


def write_k(out_dir):
    """The Llama and Phi-3 models with rows of 256 (as the k-quants' blocks need) as F32, F16,
    Q8_0, Q4_K_M, Q5_K_M and Q6_K files, each with transformers' references on the file's own
    weights (its GGUF loader dequantises them; prompts are token ids), written to `out_dir`: too
    large to commit, used by the Rust tests where they exist."""
    from gen_llm_refs import record

    os.makedirs(out_dir, exist_ok=True)
    reference = {"versions": base_versions()}
    with tempfile.TemporaryDirectory() as dir:
        tok, spm_model = tokenizer(dir)
        for arch in ("llama", "phi3"):
            model, hf = build(dir, arch, tok, spm_model, hidden=256)
            f32 = os.path.join(out_dir, f"tiny-{arch}-spm-k.F32.gguf")
            convert(hf, f32)
            quantize = os.path.join(LLAMA_CPP, "build", "bin", "llama-quantize")
            reference[arch] = k_quant_files(f32, quantize, model.config, K_PROMPTS, record, arch)
    write_reference(os.path.join(out_dir, "reference.json"), reference)


def write_tiny():
    os.makedirs(OUT_DIR, exist_ok=True)
    paths = {arch: os.path.join(OUT_DIR, name) for arch, name in [("llama", "tiny-llama-spm.F32.gguf"), ("phi3", "tiny-phi3.F32.gguf")]}
    models = {}
    with tempfile.TemporaryDirectory() as dir:
        tok, spm_model = tokenizer(dir)
        for arch, path in paths.items():
            model, hf = build(dir, arch, tok, spm_model)
            convert(hf, os.path.join(dir, arch + ".gguf"))
            shutil.copy(os.path.join(dir, arch + ".gguf"), path)
            models[arch] = model
        q8 = os.path.join(OUT_DIR, "tiny-phi3.Q8_0.gguf")
        subprocess.run([os.path.join(LLAMA_CPP, "build", "bin", "llama-quantize"), paths["phi3"], q8, "Q8_0"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = paths["llama"]
    lcpp = LlamaCpp(LLAMA_CPP, path)
    cases = []
    for text in TOKENIZE_TEXTS:
        ids = lcpp.tokenize(text, add_bos=False, special=True)
        cases.append({"text": text, "ids": ids, "transformers_ids": tok.encode(text, add_special_tokens=False),
                      "pieces": [lcpp.piece(i) for i in ids]})
    per_model = {}
    for arch, model in models.items():
        gens = []
        for p in PROMPTS:
            ids = lcpp.tokenize(p, add_bos=True, special=True)
            steps, first = greedy(model, ids)
            gens.append({"prompt": p, "prompt_ids": ids, "generated_ids": [t for t, _ in steps],
                         "step_margins": [sig(m, 4) for _, m in steps], "stopped_at_eos": False,
                         "first_step_top10": first})
        file = paths[arch]
        per_model[arch] = {"file": os.path.basename(file), "sha256": hashlib.sha256(open(file, "rb").read()).hexdigest(), "generate": gens}
    # the quantised file against the f32 model's references (weights rounded to 8 bits)
    per_model["phi3"]["quantised"] = {"file": "tiny-phi3.Q8_0.gguf",
                                      "sha256": hashlib.sha256(open(q8, "rb").read()).hexdigest()}
    lcpp.close()
    ref = {"versions": dict(base_versions(), llama_cpp=llama_cpp_version(LLAMA_CPP), sentencepiece=__import__("sentencepiece").__version__),
           "file": os.path.basename(path), "vocab_size": len(tok), "bos_token_id": 1, "eos_token_id": 2,
           "tokenize": cases, "models": per_model}
    with open(os.path.join(OUT_DIR, "reference_spm.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
    agree = sum(c["ids"] == c["transformers_ids"] for c in cases)
    sizes = ", ".join(f"{os.path.basename(p)} ({os.path.getsize(p)} bytes)" for p in paths.values())
    print(f"wrote {sizes}; llama.cpp and transformers agree on {agree}/{len(cases)} texts")


if __name__ == "__main__":
    main()
