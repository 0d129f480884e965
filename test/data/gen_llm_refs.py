#!/usr/bin/env python3
"""Tiny Qwen2 and Qwen3 GGUF models and transformers references for ExBurn's LLM engines.

Writes, next to this script, under llm/:

  tiny-qwen2.F32.gguf, .F16.gguf, .Q8_0.gguf   Qwen2 (Q/K/V biases, untied output projection)
  tiny-qwen3.F32.gguf, .F16.gguf, .Q8_0.gguf   Qwen3 (per-head Q/K RMSNorm, head_dim 32 with
                                               hidden 64 and 4 heads, tied output projection)
  reference.json                                per architecture: tokenizer cases, the chat
                                               template's rendering, first-step logits and
                                               16 greedy tokens per prompt from transformers
                                               (on the model's weights, and on the Q8_0 file's
                                               weights as transformers' GGUF loader dequantises
                                               them), and llama.cpp's first-step logits per
                                               file (refs_common.LlamaCpp)

No model hub is needed: the byte-level BPE tokenizer (Qwen2's pre-tokenizer regex, ChatML
control tokens) is trained with the `tokenizers` library on the texts below; weights are random
(seeded), drawn wider than transformers' initialisation so that logits spread over several
units and greedy picks are rarely near ties, and rounded to f16 so that the F32 and F16 files
hold the same weights as the transformers model. The files are converted by llama.cpp's
convert_hf_to_gguf.py (its tokenizer-hash check does not know this tokenizer, so the script
tells it the pre-tokenizer is "qwen2", and that there is no SentencePiece model to try first) and quantised by llama-quantize. Run (CPU only):

  pip install torch numpy transformers tokenizers
  LLAMA_CPP=/path/to/llama.cpp python3 test/data/gen_llm_refs.py

LLAMA_CPP (default /work/peers/llama.cpp) must hold convert_hf_to_gguf.py, gguf-py/, a CMake
build (build/bin/llama-quantize, libllama.so) and its headers, against which `cc` builds
llama_cpp_logits.c.

With `--k-quants [DIR]` (default ~/.cache/ex_burn/llm-kquants) it writes the same two models with
hidden size 256 (rows of 256, as the k-quants' blocks need; Qwen3's heads 128 wide) as F32, F16,
Q4_K_M, Q5_K_M, Q6_K, Q3_K_M and Q2_K files, and their reference.json, to DIR instead: files too
large to commit, which the Rust tests use where they exist.
"""

import math
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from refs_common import LlamaCpp, base_versions, llama_cpp_version, sig, write_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "llm")
LLAMA_CPP = os.environ.get("LLAMA_CPP", "/work/peers/llama.cpp")
QUANTIZE = os.path.join(LLAMA_CPP, "build", "bin", "llama-quantize")

# The reference margin below which another greedy pick is acceptable (greedy_check::NEAR_TIE).
NEAR_TIE = 0.3
NEW_TOKENS = 16

# llama.cpp's pre-tokenizer for tokenizer.ggml.pre = "qwen2" (llama-vocab.cpp).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a small model.<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog, and the dog does not care.",
    "Once upon a time there was a small robot who rebuilt seventeen wooden bridges.",
    "The committee measured an unusual signal at 1234 Hz in 2024.",
    "Le garçon a mangé une crème brûlée à Noël.",
    "我爱自然语言处理。",
    "Wait... what?!? (No way!!!) -- [brackets] 100% sure, I'll say it's fine.",
    "def add(a, b):\n    return a + b\n",
    "You are a small model. Answer the question briefly.",
    "Hello! How are you today? I am fine, thank you.",
] * 3

TOKENIZE_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world 12345, it's 2024!",
    "  leading spaces and\ttabs\nnew lines\n\n",
    "crème brûlée 😀 我爱",
    "<|im_start|>user\nhi<|im_end|>",
]

TEXT_PROMPTS = ["The quick brown fox", "Once upon a time there was", "def add(a, b):"]
CHAT = [{"role": "user", "content": "Hello! How are you today?"}]
ID_PROMPTS = [[5, 17, 42, 99, 3, 250], [300]]

ARCHS = {
    # untied output projection, Q/K/V biases, Qwen2's rope theta
    "qwen2": dict(tie_word_embeddings=False, rope_theta=1000000.0),
    # tied output, head_dim 32 (not hidden / heads = 16), per-head Q/K norms
    "qwen3": dict(tie_word_embeddings=True, rope_theta=500000.0, head_dim=32),
}


# "tiny": the committed files. "k": rows of 256, as the k-quants' blocks need, for files too large
# to commit (`--k-quants DIR`).
SIZES = {
    "tiny": dict(hidden=64, ffn=128, qwen3_head_dim=32, quants=("Q8_0",)),
    "k": dict(hidden=256, ffn=256, qwen3_head_dim=128, quants=("Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K")),
}


def versions():
    return dict(base_versions(), llama_cpp=llama_cpp_version(LLAMA_CPP))


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=128)


def build_model(arch, vocab, eos, seed, size):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    extra = dict(ARCHS[arch])
    if "head_dim" in extra:
        extra["head_dim"] = SIZES[size]["qwen3_head_dim"]
    common = dict(vocab_size=vocab, hidden_size=SIZES[size]["hidden"], intermediate_size=SIZES[size]["ffn"],
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=eos, torch_dtype="float32", **extra)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(attention_bias=False, **common))
    g = torch.Generator().manual_seed(seed)
    # products over wider rows grow with their square root: the same gain at every size
    width = math.sqrt(64 / SIZES[size]["hidden"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.5 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name or "lm_head" in name:
                v = 0.6 * width * torch.randn(p.shape, generator=g)
            else:
                v = 0.15 * width * torch.randn(p.shape, generator=g)
            # f16-representable, so the F16 file holds exactly these weights
            p.copy_(v.half().float())
    model.eval()
    return model


def greedy(model, prompt, eos):
    """Greedy decoding of NEW_TOKENS tokens (stopping at eos), with each step's top-1 minus
    top-2 margin, and the first step's full logits."""
    ids = list(prompt)
    out, margins, first = [], [], None
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            if first is None:
                first = logits.numpy().copy()
            top = torch.topk(logits, 2)
            tok = int(top.indices[0])
            margins.append(float(top.values[0] - top.values[1]))
            out.append(tok)
            ids.append(tok)
            if tok == eos:
                break
    return out, margins, first


def record(tag, model, prompts, eos):
    """Adds each prompt's greedy tokens, margins and first-step logits under `model`."""
    near, steps = 0, 0
    for case in prompts:
        gen, margins, first = greedy(model, case["prompt_ids"], eos)
        top = np.argsort(-first)[:10]
        case.update({
            "generated_ids": gen,
            "step_margins": [sig(m, 6) for m in margins],
            "stopped_at_eos": gen[-1] == eos,
            "first_step_logits": [sig(v) for v in first],
            "first_step_top10": [[int(i), sig(first[i])] for i in top],
        })
        near += sum(m < NEAR_TIE for m in margins)
        steps += len(margins)
    spread = max(float(np.ptp(c["first_step_logits"])) for c in prompts)
    print(f"{tag}: {steps} greedy steps, {near} at margins below {NEAR_TIE}; first-step logit range up to {spread:.2f}")


def convert(model_dir, out, outtype):
    code = (
        "import sys\n"
        f"sys.path.insert(0, {LLAMA_CPP!r})\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {model_dir!r}, '--outfile', {out!r}, '--outtype', {outtype!r}]\n"
        "import convert_hf_to_gguf as c\n"
        "from conversion import base\n"
        "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
        "def no_sentencepiece(self, *args, **kwargs):\n"
        "    raise FileNotFoundError('byte-level BPE only')\n"
        "base.TextModel._set_vocab_sentencepiece = no_sentencepiece\n"
        "c.main()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=LLAMA_CPP, stdout=subprocess.DEVNULL)


def llama_cpp_logits(path, prompts):
    cpp = LlamaCpp(LLAMA_CPP, path)
    try:
        return [cpp.logits(p) for p in prompts]
    finally:
        cpp.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--k-quants":
        out = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/ex_burn/llm-kquants")
        write(out, "k")
    else:
        write(OUT_DIR, "tiny")


def write(out_dir, size):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    tok = build_tokenizer()
    vocab = len(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    reference = {"versions": versions(), "near_tie": NEAR_TIE}
    from transformers import AutoModelForCausalLM

    for seed, arch in enumerate(ARCHS, start=1):
        model = build_model(arch, vocab, eos, seed, size)
        scratch = tempfile.mkdtemp()
        # the converter names the model after its directory
        work = os.path.join(scratch, f"tiny-{arch}")
        name = f"tiny-{arch}" if size == "tiny" else f"tiny-{arch}-{size}"
        try:
            model.save_pretrained(work, safe_serialization=True)
            tok.save_pretrained(work)
            files = {}
            for outtype, label in (("f32", "F32"), ("f16", "F16")):
                path = os.path.join(out_dir, f"{name}.{label}.gguf")
                convert(work, path, outtype)
                files[label] = path
            for label in SIZES[size]["quants"]:
                path = os.path.join(out_dir, f"{name}.{label}.gguf")
                subprocess.run([QUANTIZE, files["F32"], path, label], check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                files[label] = path
        finally:
            shutil.rmtree(scratch)

        tokenize = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in TOKENIZE_TEXTS]
        for case in tokenize:
            assert tok.decode(case["ids"]) == case["text"], case
        chat_text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        prompts = [{"kind": "raw", "prompt": t, "prompt_ids": tok(t)["input_ids"]} for t in TEXT_PROMPTS]
        prompts.append({"kind": "chat", "messages": CHAT, "prompt": chat_text,
                        "prompt_ids": tok(chat_text, add_special_tokens=False)["input_ids"]})
        prompts += [{"kind": "ids", "prompt_ids": p} for p in ID_PROMPTS]
        record(arch, model, prompts, eos)
        # the model's own config: the GGUF loader's reading of the metadata drops Qwen3's head_dim
        check = AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=os.path.basename(files["F32"]),
                                                     config=model.config, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            same = float((check(torch.tensor([ID_PROMPTS[0]])).logits - model(torch.tensor([ID_PROMPTS[0]])).logits)
                         .abs().max())
        assert same < 1e-4, f"transformers' GGUF loader reads the F32 file as another model ({same})"
        entry = {
            "files": {label: os.path.basename(p) for label, p in files.items()},
            "config": {k: v for k, v in ARCHS[arch].items()},
            "eos_token_id": eos,
            "chat_template": CHAT_TEMPLATE,
            "tokenize": tokenize,
            # F32 and F16 files hold the model's own weights
            "generate": prompts,
        }
        # A quantised file's own weights, dequantised by transformers' GGUF loader: the reference
        # a quantised engine is held to, as test/data/gen_pretrained_refs.py does for SmolLM2.
        for label in SIZES[size]["quants"]:
            qmodel = AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=os.path.basename(files[label]),
                                                          config=model.config, torch_dtype=torch.float32).eval()
            cases = [{k: v for k, v in c.items() if k in ("kind", "prompt", "messages", "prompt_ids")} for c in prompts]
            record(f"{arch} {label}", qmodel, cases, eos)
            entry[f"generate_{label}"] = cases
        llama = {}
        for label, path in files.items():
            got = llama_cpp_logits(path, [c["prompt_ids"] for c in prompts])
            llama[label] = got
            refs = entry.get(f"generate_{label}", prompts)
            worst = max(float(np.max(np.abs(np.array(g) - np.array(c["first_step_logits"])))) for g, c in zip(got, refs))
            print(f"  llama.cpp {label}: first-step logits within {worst:.5f} of transformers' on its weights")
            print(f"  {os.path.basename(path)}: {os.path.getsize(path)} bytes")
        entry["llama_cpp_first_step_logits"] = llama
        reference[arch] = entry
    write_reference(os.path.join(out_dir, "reference.json"), reference)


if __name__ == "__main__":
    main()
