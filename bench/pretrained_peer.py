"""The Python peer of bench/pretrained.exs: sentence-transformers for embeddings,
transformers (GGUF dequantised to f32, as test/data/gen_pretrained_refs.py loads it) and, when
llama-cpp-python is importable, llama.cpp on the same GGUF for generation. Two threads
(EXBURN_BENCH_THREADS overrides). Run by the .exs in the same invocation, after its own cases,
never beside them:

    python3 bench/pretrained_peer.py embed              # batch-32 throughput, batch-1 latency
    python3 bench/pretrained_peer.py llm                # transformers, 64 greedy new tokens
    python3 bench/pretrained_peer.py llamacpp           # llama.cpp, same
    python3 bench/pretrained_peer.py rss embed|llm|llamacpp   # peak RSS of one load (fresh process)

One line per result, tab-separated: `R<TAB>case<TAB>key=value...` (times in ms), or
`SKIP<TAB>case<TAB>reason`. Same timing rule as the .exs: warm-up calls, then the median (and
p90) of EXBURN_BENCH_EMBED_RUNS batch-32 calls, EXBURN_BENCH_LATENCY_RUNS batch-1 calls (cycling
through the 32 sentences) and EXBURN_BENCH_LLM_RUNS generations.
"""
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.expanduser(os.environ.get("EXBURN_MODELS_DIR", "~/models"))
MINILM = os.path.join(MODELS, "embeddings", "all-minilm-l6-v2")
# the shipped Q4_1, or the quantisation EXBURN_BENCH_GGUF names (made into ~/.cache/ex_burn/bench/,
# as bench/pretrained.exs says)
QUANT = os.environ.get("EXBURN_BENCH_GGUF", "Q4_1")
SMOL_DIR = (os.path.join(MODELS, "llm", "smollm2-135m-instruct") if QUANT == "Q4_1"
            else os.path.expanduser("~/.cache/ex_burn/bench"))
SMOL_FILE = f"SmolLM2-135M-Instruct.{QUANT}.gguf"
THREADS = int(os.environ.get("EXBURN_BENCH_THREADS", "2"))
EMBED_RUNS = int(os.environ.get("EXBURN_BENCH_EMBED_RUNS", "20"))
LATENCY_RUNS = int(os.environ.get("EXBURN_BENCH_LATENCY_RUNS", "64"))
LLM_RUNS = int(os.environ.get("EXBURN_BENCH_LLM_RUNS", "3"))
NEW_TOKENS = int(os.environ.get("EXBURN_BENCH_NEW_TOKENS", "64"))
DEVICE = os.environ.get("EXBURN_BENCH_TORCH_DEVICE", "cpu")


def sentences():
    with open(os.path.join(HERE, "data", "pretrained_sentences.txt"), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def prompt():
    with open(os.path.join(HERE, "data", "pretrained_prompt.txt"), encoding="utf-8") as f:
        return f.read()


def pct(xs, q):
    xs = sorted(xs)
    n = len(xs)
    if q == 50:
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return xs[min(n - 1, int(round(q / 100 * (n - 1))))]


def emit(case, **kv):
    fields = "\t".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in kv.items())
    print(f"R\t{case}\t{fields}", flush=True)


def sync():
    if DEVICE.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def reset_peak():
    """Resets VmHWM to the current RSS (Linux >= 4.0), so VmHWM afterwards is the load's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def torch_setup():
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    return torch


def load_st():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(MINILM, device=DEVICE)


def load_transformers():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE)
    model = AutoModelForCausalLM.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE, torch_dtype=torch.float32)
    model.eval()
    return tok, model.to(DEVICE)


def load_llamacpp():
    from llama_cpp import Llama

    return Llama(model_path=os.path.join(SMOL_DIR, SMOL_FILE), n_threads=THREADS, n_threads_batch=THREADS,
                 n_ctx=512, n_batch=512, seed=0, verbose=False)


def bench_embed():
    torch = torch_setup()
    texts = sentences()
    model = load_st()
    enc = lambda xs: model.encode(xs, batch_size=32, convert_to_numpy=True)  # noqa: E731
    with torch.inference_mode():
        for _ in range(3):
            enc(texts)
        times = []
        for _ in range(EMBED_RUNS):
            t0 = time.perf_counter()
            enc(texts)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        med = pct(times, 50)
        emit("embed_batch32", median_ms=med, p90_ms=pct(times, 90), per_s=32 / med * 1e3, runs=len(times))
        for s in texts[:4]:
            enc([s])
        times = []
        for i in range(LATENCY_RUNS):
            s = texts[i % len(texts)]
            t0 = time.perf_counter()
            enc([s])
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        emit("embed_batch1", median_ms=pct(times, 50), p90_ms=pct(times, 90), runs=len(times))
        # Tokens per sentence (special tokens included), to show the batch is of typical length.
        lens = [len(ids) for ids in model.tokenizer(texts)["input_ids"]]
        emit("embed_tokens", min=min(lens), mean=sum(lens) / len(lens), max=max(lens))


def bench_llm():
    run_llm("llm_transformers", *load_transformers())


def bench_hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = os.path.expanduser(os.environ["EXBURN_BENCH_HF_DIR"])
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype="auto").eval()
    run_llm("hf_transformers", AutoTokenizer.from_pretrained(hf_dir), model.to(DEVICE))


def run_llm(case, tok, model):
    torch = torch_setup()
    ids = torch.tensor([tok(prompt()).input_ids], dtype=torch.long, device=DEVICE)
    mask = torch.ones_like(ids)

    def gen(n):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=tok.eos_token_id)
        sync()
        return out[0, ids.shape[1]:].tolist()

    with torch.inference_mode():
        gen(NEW_TOKENS)
        first, total = [], []
        for _ in range(LLM_RUNS):
            t0 = time.perf_counter()
            gen(1)
            first.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            new = gen(NEW_TOKENS)
            total.append((time.perf_counter() - t0) * 1e3)
    report_llm(case, ids.shape[1], new, pct(first, 50), pct(total, 50), len(total))


def report_llm(case, prompt_len, new, first_ms, total_ms, runs):
    n = len(new)
    emit(case, prompt_tokens=prompt_len, new_tokens=n, total_ms=total_ms, first_ms=first_ms,
         tok_s=n / total_ms * 1e3, decode_tok_s=(n - 1) / max(total_ms - first_ms, 1e-9) * 1e3, runs=runs,
         ids=",".join(map(str, new)))


def bench_llamacpp():
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # not installed, or its shared library does not load
        print(f"SKIP\tllm_llamacpp\tllama_cpp not importable: {type(e).__name__}: {e}".replace("\n", " "))
        return
    llm = load_llamacpp()
    ids = llm.tokenize(prompt().encode("utf-8"), add_bos=True, special=False)

    def gen(n):
        out, t_first = [], None
        # llama-cpp-python keeps the last call's KV cache and skips the prompt it still holds
        # (generate's prefix match), which left llama.cpp's prefill out of its times; the other
        # engines start every call from an empty cache, so this one does too
        llm.reset()
        t0 = time.perf_counter()
        for t in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if t_first is None:
                t_first = time.perf_counter() - t0
            out.append(t)
            if len(out) == n:
                break
        return out, t_first * 1e3, (time.perf_counter() - t0) * 1e3

    gen(NEW_TOKENS)
    firsts, totals = [], []
    for _ in range(LLM_RUNS):
        new, first_ms, total_ms = gen(NEW_TOKENS)
        firsts.append(first_ms)
        totals.append(total_ms)
    report_llm("llm_llamacpp", len(ids), new, pct(firsts, 50), pct(totals, 50), len(totals))
    import llama_cpp as lc

    emit("llamacpp_info", version=lc.__version__, system=lc.llama_print_system_info().decode().replace("\t", " ").replace(" | ", "|").strip().replace(" ", "_"))


def rss(what):
    """Peak RSS of one load in this fresh process, over the RSS after the imports."""
    if what in ("embed", "llm"):
        torch_setup()
        import sentence_transformers  # noqa: F401
        import transformers  # noqa: F401
        if what == "llm":
            import gguf  # noqa: F401
        loader, path = (load_st, os.path.join(MINILM, "model.safetensors")) if what == "embed" else \
            (load_transformers, os.path.join(SMOL_DIR, SMOL_FILE))
    else:
        try:
            import llama_cpp  # noqa: F401
        except Exception as e:
            print(f"SKIP\trss_llamacpp\tllama_cpp not importable: {type(e).__name__}: {e}".replace("\n", " "))
            return
        loader, path = load_llamacpp, os.path.join(SMOL_DIR, SMOL_FILE)
    base = status_kib("VmRSS")
    if not reset_peak():
        base = status_kib("VmHWM")
    t0 = time.perf_counter()
    kept = loader()  # noqa: F841 (kept alive until the peak is read)
    load_ms = (time.perf_counter() - t0) * 1e3
    emit(f"rss_{what}", base_kib=base, peak_kib=status_kib("VmHWM"), after_kib=status_kib("VmRSS"),
         file_bytes=os.path.getsize(path), load_ms=load_ms)


def main(argv):
    if not argv:
        argv = ["embed", "llm", "llamacpp"]
    if argv[0] == "rss":
        rss(argv[1])
        return
    try:
        import torch  # noqa: F401
    except Exception as e:
        print(f"SKIP\tall\ttorch not importable: {type(e).__name__}: {e}".replace("\n", " "))
        return
    for a in argv:
        {"embed": bench_embed, "llm": bench_llm, "llamacpp": bench_llamacpp, "hf": bench_hf}[a]()


if __name__ == "__main__":
    main(sys.argv[1:])
