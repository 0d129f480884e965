#!/usr/bin/env python3
"""Hugging Face directories (config.json, safetensors, tokenizer.json) of the tiny LLMs, for
ExBurn's safetensors LLM loader.

Writes, next to this script, under llm/hf/:

  tiny-qwen2/        the model of llm/tiny-qwen2.*.gguf, as f16 safetensors
  tiny-qwen3/        the model of llm/tiny-qwen3.*.gguf, as f32 safetensors (tied output)
  tiny-llama-spm/    the model of llm/tiny-llama-spm.F32.gguf, as f16, with its
                     SentencePiece tokenizer as tokenizer.json
  tiny-phi3/         the model of llm/tiny-phi3.F32.gguf, likewise
  tiny-llama3/       a Llama model with Llama 3 rope scaling (original context 32, so the
                     scaled, smoothed and unscaled frequencies all occur), the Qwen models'
                     byte-level tokenizer, bf16 weights in two shards with an index
  reference.json     tiny-llama3's references from transformers (first-step logits and 16
                     greedy tokens per prompt), and transformers' SentencePiece ids for the
                     texts of llm/reference_spm.json

The first four are rebuilt from the seeds of gen_llm_refs.py and gen_spm_refs.py, and checked to
give the logits those scripts recorded, so the existing references hold for them. Run (CPU only):

  pip install torch numpy transformers tokenizers sentencepiece protobuf
  python3 test/data/gen_hf_llm_dirs.py
"""

import json
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gen_llm_refs as qwen  # noqa: E402
import gen_spm_refs as spm  # noqa: E402
from refs_common import base_versions, write_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LLM_DIR = os.path.join(HERE, "llm")
OUT_DIR = os.path.join(LLM_DIR, "hf")

LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=32, rope_theta=500000.0)


def save(model, tok, name, dtype, **kwargs):
    path = os.path.join(OUT_DIR, name)
    shutil.rmtree(path, ignore_errors=True)
    model.to(dtype).save_pretrained(path, safe_serialization=True, **kwargs)
    model.float()
    tok.save_pretrained(path)
    for extra in ("tokenizer.model", "special_tokens_map.json"):
        if os.path.exists(os.path.join(path, extra)):
            os.remove(os.path.join(path, extra))
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {sorted(os.listdir(path))}, {size} bytes")
    return path


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float().numpy()


def check_same(name, model, cases, key):
    """The rebuilt model gives the recorded first-step logits (`key`: the full logits, or the
    top 10 `[id, logit]`)."""
    worst = 0.0
    for c in cases:
        got = logits(model, c["prompt_ids"])
        if key == "first_step_logits":
            want = np.array(c[key])
            worst = max(worst, float(np.max(np.abs(got - want))))
        else:
            worst = max(worst, max(abs(float(got[i]) - v) for i, v in c[key]))
    assert worst < 1e-4, f"{name}: rebuilt model differs from the recorded references by {worst}"
    print(f"{name}: rebuilt weights give the recorded logits (within {worst:.2e})")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    reference = {"versions": base_versions()}

    # Qwen2 and Qwen3, as gen_llm_refs.py builds them
    torch.manual_seed(0)
    tok = qwen.build_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    with open(os.path.join(LLM_DIR, "reference.json")) as f:
        recorded = json.load(f)
    for seed, arch in enumerate(qwen.ARCHS, start=1):
        model = qwen.build_model(arch, len(tok), eos, seed, "tiny")
        check_same(arch, model, recorded[arch]["generate"], "first_step_logits")
        save(model, tok, f"tiny-{arch}", torch.float16 if arch == "qwen2" else torch.float32)

    # Llama 3 rope scaling, bf16 in two shards
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=eos, tie_word_embeddings=False,
                         rope_parameters=LLAMA3_ROPE, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name or "lm_head" in name:
                v = 0.6 * torch.randn(p.shape, generator=g)
            else:
                v = 0.15 * torch.randn(p.shape, generator=g)
            # bf16-representable, so the bf16 files hold exactly these weights
            p.copy_(v.bfloat16().float())
    model.eval()
    assert model.model.rotary_emb.rope_type == "llama3"
    prompts = [{"kind": "raw", "prompt": t, "prompt_ids": tok(t)["input_ids"]} for t in qwen.TEXT_PROMPTS]
    # positions past the original context, where the scaled frequencies dominate
    prompts.append({"kind": "ids", "prompt_ids": [(7 * i + 3) % len(tok) for i in range(60)]})
    qwen.record("llama3", model, prompts, eos)
    save(model, tok, "tiny-llama3", torch.bfloat16, max_shard_size="200KB")
    reference["tiny-llama3"] = {"eos_token_id": eos, "rope": LLAMA3_ROPE, "generate": prompts}

    # Llama and Phi-3 with the SentencePiece tokenizer, as gen_spm_refs.py builds them
    with open(os.path.join(LLM_DIR, "reference_spm.json")) as f:
        recorded = json.load(f)
    with tempfile.TemporaryDirectory() as dir:
        # transformers' Llama tokenizer runs on `tokenizers` (what tokenizer.json holds)
        tok, spm_model = spm.tokenizer(dir)
        cases = [{"text": c["text"], "ids": tok.encode(c["text"], add_special_tokens=False)} for c in recorded["tokenize"]]
        same = sum(c["ids"] == r["transformers_ids"] for c, r in zip(cases, recorded["tokenize"]))
        assert same == len(cases), f"the tokenizer gives other ids than recorded for {len(cases) - same} texts"
        reference["spm_tokenize"] = cases
        for arch in ("llama", "phi3"):
            model, _ = spm.build(dir, arch, tok, spm_model)
            check_same(arch, model, recorded["models"][arch]["generate"], "first_step_top10")
            save(model, tok, "tiny-llama-spm" if arch == "llama" else "tiny-phi3", torch.float16)

    write_reference(os.path.join(OUT_DIR, "reference.json"), reference)


if __name__ == "__main__":
    main()
