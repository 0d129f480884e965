"""Reference implementations for `mix ex_burn.bench --compare python`.

Reads a JSON request on stdin: {"suites": [...], "iterations": n, "threads": t, "texts": [...],
"prompt": str, "tokens": n, "embed_dir": path|null, "gguf": path|null, "ops": [...]}; prints one
JSON object: {"cases": [...], "notes": [...]}. Each case has the same suite/case names as ExBurn's
and its samples in ms. A missing package or model is a note, never a failure.
"""
import json
import sys
import time


def timed(fun, iterations):
    fun()
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fun()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return samples


def case(suite, name, impl, samples, items, unit):
    return {"suite": suite, "case": name, "engine": "python", "device": "cpu", "implementation": impl,
            "samples_ms": samples, "items": items, "unit": unit}


def main():
    req = json.load(sys.stdin)
    cases, notes = [], []
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"cases": [], "notes": ["torch is not importable: %s" % e]}))
        return
    torch.set_num_threads(req["threads"])
    it = req["iterations"]
    suites = req["suites"]

    if "embed" in suites:
        if not req.get("embed_dir"):
            notes.append("embed: the model is not installed")
        else:
            try:
                from sentence_transformers import SentenceTransformer
                m = SentenceTransformer(req["embed_dir"], device="cpu")
                texts = req["texts"]
                cases.append(case("embed", "batch 32", "sentence-transformers", timed(lambda: m.encode(texts, batch_size=32), it), 32, "embeddings/s"))
                cases.append(case("embed", "batch 1", "sentence-transformers", timed(lambda: m.encode(texts[:1]), it), 1, "embeddings/s"))
            except Exception as e:  # noqa: BLE001
                notes.append("embed: sentence-transformers failed: %s" % e)

    if "llm" in suites:
        if not req.get("gguf"):
            notes.append("llm: the model is not installed")
        else:
            try:
                import os
                from transformers import AutoModelForCausalLM, AutoTokenizer
                d, f = os.path.dirname(req["gguf"]), os.path.basename(req["gguf"])
                tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
                model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
                ids = tok(req["prompt"], return_tensors="pt").input_ids
                n = req["tokens"]

                def gen():
                    with torch.no_grad():
                        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)

                cases.append(case("llm", "%d tokens" % n, "transformers", timed(gen, max(it // 3, 2)), n, "tokens/s"))
            except Exception as e:  # noqa: BLE001
                notes.append("llm: transformers failed: %s" % e)

    if "ops" in suites:
        def data(*shape):
            n = 1
            for s in shape:
                n *= s
            return torch.sin(torch.arange(n, dtype=torch.float32).reshape(shape) * 1e-6)

        ops = {
            "add 1M f32": (lambda x=data(1_000_000), y=data(1_000_000): x + y, 1_000_000),
            "exp 1M f32": (lambda x=data(1_000_000): torch.exp(x), 1_000_000),
            "sum 1M f32": (lambda x=data(1_000_000): torch.sum(x), 1_000_000),
            "softmax 256x1024 f32": (lambda x=data(256, 1024): torch.softmax(x, dim=1), 256 * 1024),
            "dot 512x512 f32": (lambda a=data(512, 512), b=data(512, 512): a @ b, 512 * 512 * 512 * 2),
        }
        for name in req["ops"]:
            fun, items = ops[name]
            cases.append(case("ops", name, "PyTorch %s" % torch.__version__, timed(fun, it), items, "elements/s"))

    print(json.dumps({"cases": cases, "notes": notes}))


if __name__ == "__main__":
    main()
