#!/usr/bin/env python3
"""Tiny encoder models and sentence-transformers references for ExBurn's encoder families.

Writes, next to this script, under encoders/:

  tiny-bert-lasttoken-dense/  BERT (WordPiece, [CLS]/[SEP]); last-token pooling, Dense (tanh), Normalize
  tiny-bert-max-weightedmean/ the same transformer; max + weighted-mean pooling in the legacy
                              `pooling_mode_*` config keys, no Normalize
  tiny-xlm-roberta-cls/       XLM-RoBERTa (Unigram, <s>/</s>), as bge-m3: CLS pooling, Normalize
  tiny-mpnet-mean/            MPNet (WordPiece, <s>/</s>), as all-mpnet-base-v2: mean pooling, Normalize
  tiny-nomic-bert-mean/       NomicBERT (the BERT WordPiece), as nomic-embed-text: rotary positions,
                              SwiGLU, mean pooling, Normalize
  tiny-bert-reranker/         BertForSequenceClassification cross-encoder (num_labels 1, as
                              ms-marco-MiniLM), sigmoid scores
  tiny-xlm-roberta-reranker/  XLMRobertaForSequenceClassification cross-encoder (as bge-reranker)
  reference.json              per model: token ids and embeddings (SentenceTransformer.encode)
                              or scores (CrossEncoder.predict, with and without its activation)

No model hub is needed: tokenizers are trained with the `tokenizers` library on the texts below,
weights are random (seeded) but drawn wider than transformers' initialisation so that every part
of the forward pass moves the vectors (the script checks that a wrong position rule or a missing
relative attention bias would change them). Run (CPU only):

  pip install torch numpy transformers tokenizers sentence-transformers
  python3 test/data/gen_encoder_refs.py
"""

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from refs_common import base_versions, sig  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "encoders")
MAX_SEQ = 24

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog.",
    "Le garçon a mangé une crème brûlée à Noël.",
    "Die Größe der Straße ist übermäßig.",
    "我爱自然语言处理。",
    "Wait... what?!? (No way!!!) -- [brackets] 100%",
    "x",
    "The river carefully studied the forgotten maps before sunset, and the small robot slowly "
    "rebuilt seventeen wooden bridges while the committee measured an unusual signal.",
]

QUERY = "where does the quick fox sleep"
DOCUMENTS = [
    "The quick brown fox sleeps under the old bridge.",
    "A committee measured an unusual signal.",
    "Der Fuchs schläft im Wald.",
    "fox",
    "The small robot slowly rebuilt seventeen wooden bridges while the river carefully studied "
    "the forgotten maps and the lazy dog slept before sunset.",
]

CORPUS = TEXTS + DOCUMENTS + [QUERY] * 2


def versions():
    import sentence_transformers

    return {**base_versions(), "sentence_transformers": sentence_transformers.__version__}


# ---------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------


def wordpiece(specials, cls, sep, roberta_style):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    unk = specials[1] if roberta_style else "[UNK]"
    unk = "<unk>" if roberta_style else unk
    tok = Tokenizer(models.WordPiece(unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=160, special_tokens=specials))
    sep_id, cls_id = tok.token_to_id(sep), tok.token_to_id(cls)
    if roberta_style:
        # MPNet's fast tokenizer: <s> A </s> and <s> A </s></s> B </s>
        tok.post_processor = processors.RobertaProcessing((sep, sep_id), (cls, cls_id), add_prefix_space=False)
    else:
        tok.post_processor = processors.BertProcessing((sep, sep_id), (cls, cls_id))
    tok.decoder = decoders.WordPiece()
    return tok


def unigram():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tok.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token="<unk>", max_piece_length=8)
    )
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
    tok.decoder = decoders.Metaspace()
    return tok


def save_tokenizer(tok, path, specials):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=MAX_SEQ, **specials)
    fast.save_pretrained(path)


# BERT's tokenizers return segment ids, which a cross-encoder's second text needs (type 1).
BERT_SPECIALS = dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                     model_input_names=["input_ids", "token_type_ids", "attention_mask"])
ROBERTA_SPECIALS = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", cls_token="<s>",
                        sep_token="</s>", mask_token="<mask>")


def bert_tokenizer():
    return wordpiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", False), BERT_SPECIALS


def mpnet_tokenizer():
    return wordpiece(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>", "</s>", True), ROBERTA_SPECIALS


def xlmr_tokenizer():
    specials = dict(ROBERTA_SPECIALS)
    del specials["mask_token"]
    return unigram(), specials


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def widen(model, seed):
    """Redraws every parameter wider than transformers' initialisation (std 0.02 makes a random
    model's vectors nearly identical, which would let a wrong forward pass agree)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.lower().endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("relative_attention_bias.weight"):
                p.copy_(1.0 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))
    model.eval()
    return model


def config(arch, vocab, **extra):
    from transformers import BertConfig, MPNetConfig, NomicBertConfig, XLMRobertaConfig

    if arch == "bert":
        return BertConfig(vocab_size=vocab, max_position_embeddings=64, **SMALL, **extra)
    if arch == "xlm-roberta":
        # pad_token_id 1 and two extra positions, as XLM-R checkpoints have.
        return XLMRobertaConfig(vocab_size=vocab, max_position_embeddings=MAX_SEQ + 2 + 8, pad_token_id=1,
                                bos_token_id=0, eos_token_id=2, type_vocab_size=1, **SMALL, **extra)
    if arch == "mpnet":
        return MPNetConfig(vocab_size=vocab, max_position_embeddings=MAX_SEQ + 2 + 8, pad_token_id=1,
                           relative_attention_num_buckets=32, **SMALL, **extra)
    if arch == "nomic_bert":
        # rotary positions (base 1000), SwiGLU, no biases but the layer norms', post-norm layers
        return NomicBertConfig(vocab_size=vocab, max_position_embeddings=64, **SMALL, **extra)
    raise ValueError(arch)


def clean(path):
    for f in ("README.md",):
        p = os.path.join(path, f)
        if os.path.exists(p):
            os.remove(p)


def token_ids(model, texts):
    features = (getattr(model, "preprocess", None) or model.tokenize)(texts)
    ids, mask = features["input_ids"], features["attention_mask"]
    return [ids[i][mask[i].bool()].tolist() for i in range(len(texts))]


def fresh_dirs(name, seed):
    """Empty `<name>.raw` (the transformers save) and `<name>` (the output) directories, and the
    torch seed the model's random weights are drawn with."""
    raw = os.path.join(OUT_DIR, name + ".raw")
    out = os.path.join(OUT_DIR, name)
    shutil.rmtree(raw, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(seed)
    return raw, out


def embedding_model(name, arch, tokenizer, pooling, dense=None, normalize=True, legacy_pooling=None, seed=0):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    from transformers import AutoModel

    tok, specials = tokenizer
    raw, out = fresh_dirs(name, seed)
    model = widen(AutoModel.from_config(config(arch, tok.get_vocab_size())), seed)
    model.save_pretrained(raw)
    save_tokenizer(tok, raw, specials)

    word = Transformer(raw, max_seq_length=MAX_SEQ)
    modules = [word, Pooling(word.get_embedding_dimension(), pooling_mode=pooling)]
    if dense:
        torch.manual_seed(seed + 1)
        d = Dense(in_features=modules[-1].get_sentence_embedding_dimension(), out_features=dense,
                  activation_function=torch.nn.Tanh())
        with torch.no_grad():
            d.linear.weight.mul_(3.0)
        modules.append(d)
    if normalize:
        modules.append(Normalize())
    st = SentenceTransformer(modules=modules, device="cpu")
    st.save(out)
    shutil.rmtree(raw)
    clean(out)
    if legacy_pooling is not None:
        # The keys sentence-transformers < 6 writes (and most published models carry).
        path = os.path.join(out, "1_Pooling", "config.json")
        cfg = json.load(open(path))
        legacy = {"word_embedding_dimension": cfg["embedding_dimension"]}
        legacy.update({k: (k in legacy_pooling) for k in [
            "pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"]})
        json.dump(legacy, open(path, "w"), indent=2)

    st = SentenceTransformer(out, device="cpu")
    assert st.max_seq_length == MAX_SEQ, st.max_seq_length
    ids = token_ids(st, TEXTS)
    with torch.no_grad():
        emb = st.encode(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS)).astype(np.float64)
        single = np.stack([st.encode([t], convert_to_numpy=True)[0] for t in TEXTS])
    assert np.abs(emb - single).max() < 1e-5
    assert len(ids[-1]) == MAX_SEQ, len(ids[-1])  # the long text is truncated
    cos = (emb / np.linalg.norm(emb, axis=1, keepdims=True)) @ (emb / np.linalg.norm(emb, axis=1, keepdims=True)).T
    off = cos[~np.eye(len(TEXTS), dtype=bool)]
    print(f"  {name}: dim {emb.shape[1]}, cosine between texts in [{off.min():.3f}, {off.max():.3f}]")
    assert off.max() < 0.99, off.max()
    sensitivity(st, arch)
    return {
        "path": name,
        "arch": arch,
        "max_seq_length": MAX_SEQ,
        "dim": int(emb.shape[1]),
        "normalize": bool(normalize),
        "pooling": [pooling] if isinstance(pooling, str) else list(pooling),
        "cases": [{"text": t, "token_ids": i, "embedding": [sig(x) for x in emb[k]]}
                  for k, (t, i) in enumerate(zip(TEXTS, ids))],
    }


def sensitivity(st, arch):
    """A wrong position rule (BERT's 0..n instead of padding_idx + 1 on) or a missing relative
    attention bias must change the vectors well past the tests' tolerance."""
    hf = st[0].model
    features = st.preprocess(TEXTS[:3])
    with torch.no_grad():
        good = hf(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).last_hidden_state
        if arch in ("xlm-roberta", "mpnet"):
            n = features["input_ids"].shape[1]
            wrong = torch.arange(n).unsqueeze(0).expand_as(features["input_ids"])
            bad = hf(input_ids=features["input_ids"], attention_mask=features["attention_mask"],
                     position_ids=wrong).last_hidden_state
            drift = torch.nn.functional.cosine_similarity(good[:, 0], bad[:, 0], dim=-1).min()
            assert drift < 0.999, drift
        if arch == "mpnet":
            saved = hf.encoder.relative_attention_bias.weight.clone()
            hf.encoder.relative_attention_bias.weight.zero_()
            bad = hf(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).last_hidden_state
            hf.encoder.relative_attention_bias.weight.copy_(saved)
            drift = torch.nn.functional.cosine_similarity(good[:, 0], bad[:, 0], dim=-1).min()
            assert drift < 0.999, drift


def reranker(name, arch, tokenizer, seed):
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification

    tok, specials = tokenizer
    raw, out = fresh_dirs(name, seed)
    model = widen(AutoModelForSequenceClassification.from_config(config(arch, tok.get_vocab_size(), num_labels=1)), seed)
    with torch.no_grad():
        # a head wide enough that the documents' scores spread over the sigmoid
        for pname, p in model.named_parameters():
            if pname.startswith("classifier") and pname.endswith("bias"):
                p.zero_()
    model.save_pretrained(raw)
    save_tokenizer(tok, raw, specials)
    CrossEncoder(raw, device="cpu").save(out)
    shutil.rmtree(raw)
    clean(out)

    ce = CrossEncoder(out, device="cpu")
    assert ce.max_seq_length == MAX_SEQ, ce.max_seq_length
    assert isinstance(ce.activation_fn, torch.nn.Sigmoid), ce.activation_fn
    pairs = [(QUERY, d) for d in DOCUMENTS]
    features = ce.preprocess(pairs)
    ids, mask = features["input_ids"], features["attention_mask"]
    pair_ids = [ids[i][mask[i].bool()].tolist() for i in range(len(pairs))]
    types = features.get("token_type_ids")
    pair_types = [types[i][mask[i].bool()].tolist() for i in range(len(pairs))] if types is not None else None
    with torch.no_grad():
        scores = ce.predict(pairs, convert_to_numpy=True, batch_size=len(pairs))
        logits = ce.predict(pairs, convert_to_numpy=True, batch_size=len(pairs), activation_fn=torch.nn.Identity())
    ranked = ce.rank(QUERY, DOCUMENTS)
    assert [r["corpus_id"] for r in ranked] == list(np.argsort(-scores)), ranked
    assert len(pair_ids[-1]) == MAX_SEQ
    print(f"  {name}: scores {np.round(scores, 4).tolist()}")
    assert float(np.max(logits) - np.min(logits)) > 0.1, logits
    return {
        "path": name,
        "arch": arch,
        "max_seq_length": MAX_SEQ,
        "activation": "sigmoid",
        "query": QUERY,
        "documents": DOCUMENTS,
        "token_ids": pair_ids,
        "token_type_ids": pair_types,
        "scores": [sig(s) for s in scores],
        "logits": [sig(s) for s in logits],
    }


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    bert, mpnet, xlmr = bert_tokenizer(), mpnet_tokenizer(), xlmr_tokenizer()
    refs = {
        "tiny-bert-lasttoken-dense": embedding_model("tiny-bert-lasttoken-dense", "bert", bert, "lasttoken", dense=16, seed=1),
        "tiny-bert-max-weightedmean": embedding_model("tiny-bert-max-weightedmean", "bert", bert, ("max", "weightedmean"),
                                                      normalize=False, legacy_pooling=("pooling_mode_max_tokens",
                                                                                        "pooling_mode_weightedmean_tokens"),
                                                      seed=1),
        "tiny-xlm-roberta-cls": embedding_model("tiny-xlm-roberta-cls", "xlm-roberta", xlmr, "cls", seed=2),
        "tiny-mpnet-mean": embedding_model("tiny-mpnet-mean", "mpnet", mpnet, "mean", seed=3),
        # nomic-embed-text's layout, in transformers' own NomicBertModel
        "tiny-nomic-bert-mean": embedding_model("tiny-nomic-bert-mean", "nomic_bert", bert, "mean", seed=6),
    }
    rerankers = {
        "tiny-bert-reranker": reranker("tiny-bert-reranker", "bert", bert, seed=4),
        "tiny-xlm-roberta-reranker": reranker("tiny-xlm-roberta-reranker", "xlm-roberta", xlmr, seed=5),
    }
    path = os.path.join(OUT_DIR, "reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({
            "notes": "tiny random models (gen_encoder_refs.py); token_ids are sentence-transformers' preprocess() "
                     "input_ids with padding removed; embeddings from SentenceTransformer.encode of all texts in "
                     "one batch; scores from CrossEncoder.predict (its default activation, sigmoid for one "
                     "label), logits the same with activation_fn=Identity; 8 significant digits.",
            "versions": versions(),
            "embeddings": refs,
            "rerankers": rerankers,
        }, f, ensure_ascii=False, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT_DIR) for f in fs)
    print(f"wrote {OUT_DIR} ({total} bytes)")


if __name__ == "__main__":
    main()
