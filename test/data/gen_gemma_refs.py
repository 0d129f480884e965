#!/usr/bin/env python3
"""Tiny Gemma, Gemma 2 and Gemma 3 models, as GGUF files and Hugging Face directories, with
transformers' references, for ExBurn's LLM engines.

Writes, next to this script, under llm/gemma/:

  tiny-gemma2/, tiny-gemma3/,         Hugging Face directories (f16 safetensors, the
  tiny-gemma/
                                      SentencePiece tokenizer of gen_spm_refs.py as
                                      tokenizer.json)
  tiny-gemma2.F32.gguf, .Q8_0.gguf    the same models converted by llama.cpp's
  tiny-gemma3.F32.gguf, .Q8_0.gguf    convert_hf_to_gguf.py and quantised by llama-quantize
  tiny-gemma.F32.gguf, .Q8_0.gguf
  tiny-gemma3-mm/                     the Gemma 3 model's text weights inside a multimodal
                                      Gemma3ForConditionalGeneration (a tiny random SigLIP tower),
                                      saved as transformers saves it (`language_model.model.*`)
  reference.json                      per model: prompts (token ids, one longer than the
                                      sliding window, and texts as the directory's tokenizer
                                      gives them), 16 greedy tokens each with their
                                      margins, and the first step's logits, from transformers
                                      on the model's weights and on each Q8_0 file's weights
                                      as transformers' GGUF loader dequantises them

With `--k-quants [DIR]` (default ~/.cache/ex_burn/gemma-kquants) it writes the same models with
rows of 256 as F32, F16, Q8_0, Q4_K_M, Q5_K_M and Q6_K files and their references instead: files
too large to commit, which the Rust tests use where they exist.

Gemma 2 (2 layers): logit soft-capping of attention scores (at 5, where real models cap at 50)
and of the output (at 15; 30 in real models), norms
after attention and after the MLP, embeddings scaled by sqrt(hidden), GELU (tanh) gating, and
a sliding window of 8 positions on every other layer. Gemma 3 (6 layers): per-head Q/K norms,
no soft-capping, five sliding layers (rope base 10 000) then a global one (rope base 1e6).
`query_pre_attn_scalar` is the head size, as llama.cpp assumes below 27B. Gemma (the first, 2
layers): Gemma 2's layer without its soft-capping, its windows and its norms after attention and
after the MLP. Weights are random
(seeded), drawn wide so that greedy picks are rarely near ties, and rounded to f16. Run (CPU only):

  pip install torch numpy transformers tokenizers sentencepiece protobuf gguf
  LLAMA_CPP=/path/to/llama.cpp python3 test/data/gen_gemma_refs.py
"""

import copy
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import gen_spm_refs as spm  # noqa: E402
from gen_llm_refs import record  # noqa: E402
from refs_common import base_versions, k_quant_files, write_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "llm", "gemma")
LLAMA_CPP = os.environ.get("LLAMA_CPP", "/work/peers/llama.cpp")
QUANTIZE = os.path.join(LLAMA_CPP, "build", "bin", "llama-quantize")

WINDOW = 8
PROMPTS = [[5, 17, 42, 99, 3, 250, 77, 300, 12, 8, 60, 61], [300], [1, 20, 30, 40]]
# the directories' tokenizer.json adds BOS, as transformers does
TEXT_PROMPTS = ["The quick brown fox", "Once upon a time"]
TOKENIZE_TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world 12345, it's 2024!", "crème brûlée 😀 我爱"]


def build(arch, vocab, seed, hidden=64):
    from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GemmaConfig, GemmaForCausalLM

    head = hidden // 4
    if arch == "gemma":
        model = GemmaForCausalLM(GemmaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=head,
                                             hidden_activation="gelu_pytorch_tanh", max_position_embeddings=128, rms_norm_eps=1e-6,
                                             bos_token_id=1, eos_token_id=2, pad_token_id=0))
        return randomise(model, seed, hidden)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=head, query_pre_attn_scalar=head, max_position_embeddings=128,
                  rms_norm_eps=1e-6, sliding_window=WINDOW, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  torch_dtype="float32")
    if arch == "gemma2":
        # caps low enough to bend these small models' scores and logits
        model = Gemma2ForCausalLM(Gemma2Config(num_hidden_layers=2, attn_logit_softcapping=5.0, final_logit_softcapping=15.0, **common))
    else:
        model = Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=6, **common))
    return randomise(model, seed, hidden)


def randomise(model, seed, hidden):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Gemma's norms scale by 1 + w
                v = 0.2 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                # scaled by sqrt(64) = 8 on the way in; the output projection shares it
                v = 0.6 * torch.randn(p.shape, generator=g)
            else:
                # products over wider rows grow with their square root: the same gain at every size
                v = 0.15 * (64 / hidden) ** 0.5 * torch.randn(p.shape, generator=g)
            p.copy_(v.half().float())
    model.eval()
    return model


def from_gguf(model, path):
    """`model` with the weights of the GGUF file at `path`, dequantised: by transformers' GGUF
    loader, or for Gemma (the first), which it does not read, by the gguf package here."""
    from transformers import AutoModelForCausalLM

    if model.config.model_type != "gemma":
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                    config=model.config, torch_dtype=torch.float32).eval()
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    parts = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    out = copy.deepcopy(model)
    state = out.state_dict()
    for t in GGUFReader(path).tensors:
        if t.name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            hf = "model.norm.weight"
        else:
            _, layer, part, _ = t.name.split(".")
            hf = f"model.layers.{layer}.{parts[part]}.weight"
        values = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(state[hf].shape)
        # the converter stores Gemma's norms as 1 + w
        if hf.endswith("norm.weight"):
            values = values - 1.0
        state[hf] = torch.from_numpy(values)
    out.load_state_dict(state)
    return out.eval()


def write_multimodal(text_model, name, tok):
    """`text_model` (a Gemma3ForCausalLM) as the language model of a Gemma3ForConditionalGeneration
    with a tiny random vision tower, saved in f16 under OUT_DIR/`name` as the hub's multimodal
    Gemma 3 checkpoints are; returns `name`."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    torch.manual_seed(41)
    mm = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text_model.config.to_dict(), vision_config=vision.to_dict(),
                                                     mm_tokens_per_image=4))
    missing, _ = mm.model.language_model.load_state_dict(text_model.model.state_dict(), strict=False)
    assert not missing, missing
    out = os.path.join(OUT_DIR, name)
    shutil.rmtree(out, ignore_errors=True)
    mm.half().save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    for extra in ("tokenizer.model", "special_tokens_map.json"):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    return name


def convert(hf, out):
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    subprocess.run([sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), hf, "--outfile", out, "--outtype", "f32"],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--k-quants":
        write_k(sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/ex_burn/gemma-kquants"))
    else:
        write_tiny()


def write_k(out_dir):
    """The same three models with hidden size 256 (rows of 256, as the k-quants' blocks need) as
    F32, F16, Q8_0, Q4_K_M, Q5_K_M and Q6_K files, each with transformers' references on the
    file's own weights (its GGUF loader dequantises them; the F16 file rounds Gemma's 1 + w norms),
    written to `out_dir`: too large to commit, used by the Rust tests where they exist."""
    os.makedirs(out_dir, exist_ok=True)
    reference = {"versions": base_versions(), "window": WINDOW}
    with tempfile.TemporaryDirectory() as scratch:
        tok, spm_model = spm.tokenizer(scratch)
        for seed, arch in enumerate(["gemma2", "gemma3", "gemma"], start=31):
            model = build(arch, len(tok), seed, hidden=256)
            work = os.path.join(scratch, f"tiny-{arch}-k")
            model.save_pretrained(work, safe_serialization=True)
            tok.save_pretrained(work)
            shutil.copy(spm_model, os.path.join(work, "tokenizer.model"))
            f32 = os.path.join(out_dir, f"tiny-{arch}-k.F32.gguf")
            convert(work, f32)
            reference[arch] = k_quant_files(f32, QUANTIZE, model.config, PROMPTS, record, arch, load=lambda p, m=model: from_gguf(m, p))
    write_reference(os.path.join(out_dir, "reference.json"), reference)


def write_tiny():
    from transformers import AutoModelForCausalLM

    os.makedirs(OUT_DIR, exist_ok=True)
    reference = {"versions": base_versions(), "window": WINDOW}
    with tempfile.TemporaryDirectory() as scratch:
        tok, spm_model = spm.tokenizer(scratch)
        for seed, arch in enumerate(["gemma2", "gemma3", "gemma"], start=21):
            model = build(arch, len(tok), seed)
            name = f"tiny-{arch}"
            hf = os.path.join(OUT_DIR, name)
            shutil.rmtree(hf, ignore_errors=True)
            # a copy: half() would round the live model's rotary buffers too
            copy.deepcopy(model).half().save_pretrained(hf, safe_serialization=True)
            tok.save_pretrained(hf)
            for extra in ("tokenizer.model", "special_tokens_map.json"):
                if os.path.exists(os.path.join(hf, extra)):
                    os.remove(os.path.join(hf, extra))
            # converted from f32 weights (it adds 1 to the norms in the stored type), with the
            # SentencePiece model, which it reads for the pieces' scores
            work = os.path.join(scratch, name)
            model.save_pretrained(work, safe_serialization=True)
            tok.save_pretrained(work)
            shutil.copy(spm_model, os.path.join(work, "tokenizer.model"))
            files = {"F32": os.path.join(OUT_DIR, f"{name}.F32.gguf"), "Q8_0": os.path.join(OUT_DIR, f"{name}.Q8_0.gguf")}
            convert(work, files["F32"])
            subprocess.run([QUANTIZE, files["F32"], files["Q8_0"], "Q8_0"], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            texts = [{"kind": "raw", "prompt": t, "prompt_ids": tok(t)["input_ids"]} for t in TEXT_PROMPTS]
            cases = [{"kind": "ids", "prompt_ids": p} for p in PROMPTS] + texts
            record(arch, model, cases, 2)
            entry = {"files": {k: os.path.basename(v) for k, v in files.items()}, "dir": name, "generate": cases,
                     "tokenize": [{"text": t, "ids": tok.encode(t, add_special_tokens=False)} for t in TOKENIZE_TEXTS]}
            # the Q8_0 file's own weights, dequantised by transformers' GGUF loader
            qmodel = from_gguf(model, files["Q8_0"])
            qcases = [{"kind": "ids", "prompt_ids": p} for p in PROMPTS]
            record(f"{arch} Q8_0", qmodel, qcases, 2)
            entry["generate_Q8_0"] = qcases
            # the F32 file read back by transformers is the model itself
            fmodel = from_gguf(model, files["F32"])
            with torch.no_grad():
                same = float((fmodel(torch.tensor([PROMPTS[0]])).logits - model(torch.tensor([PROMPTS[0]])).logits).abs().max())
            assert same < 1e-4, f"{arch}: the F32 file reads back as another model ({same})"
            if arch == "gemma3":
                entry["multimodal_dir"] = write_multimodal(model, f"{name}-mm", tok)
            reference[arch] = entry
            sizes = {os.path.basename(p): os.path.getsize(p) for p in files.values()}
            print(f"{arch}: {sizes}")
    write_reference(os.path.join(OUT_DIR, "reference.json"), reference)


if __name__ == "__main__":
    main()
