"""llama.cpp's own answers on the GGUF test models, added to their reference.json files: for every
model entry (one with `files`) and each of its files, the logits llama.cpp gives after each
reference case's prompt (`llama_cpp_first_step_logits[label]`, one list per case, in the order of
`generate_<label>` or `generate`), and, where the entry has `tokenize` cases, the ids llama.cpp's
tokenizer gives their texts from the F32 file's metadata (`llama_cpp_tokenize`).

Usage:
  LLAMA_CPP=/path/to/llama.cpp python3 test/data/gen_llama_cpp_refs.py [REFERENCE.json ...]

Without arguments it refreshes the committed Gemma references and, where they exist, the
k-quant caches (`~/.cache/ex_burn/{llm,spm,gemma}-kquants`, written by the generators'
`--k-quants`). LLAMA_CPP (default /work/peers/llama.cpp) must hold a CMake build of llama.cpp
(build/bin/libllama.so) and its headers; `cc` builds llama_cpp_logits.c against them.
"""

import json
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refs_common import LlamaCpp, llama_cpp_version, write_reference  # noqa: E402

LLAMA_CPP = os.environ.get("LLAMA_CPP", "/work/peers/llama.cpp")
HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.expanduser("~/.cache/ex_burn")
DEFAULT = [os.path.join(HERE, "llm", "gemma", "reference.json")] + [
    os.path.join(CACHE, d, "reference.json") for d in ("llm-kquants", "spm-kquants", "gemma-kquants")
]


def loadable(path, scratch):
    """`path`, or where llama.cpp would refuse it, a copy it loads with the same tensors:
    llama.cpp gives tokens of a model named like Phi-3 Phi-3's attributes, looking
    `<|endoftext|>` up by text, which the tiny vocabularies lack, so the copy's `general.name`
    (same length) no longer says phi3."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    key = data.find(b"general.name")
    if key < 0:
        return path
    # key, then its value's type (u32, 8: string) and length (u64), then the name
    at = key + len("general.name")
    length = struct.unpack_from("<Q", data, at + 4)[0]
    start = at + 12
    name = bytes(data[start:start + length])
    if b"phi3" not in name.lower() and b"phi-3" not in name.lower():
        return path
    data[start:start + length] = name.lower().replace(b"phi", b"pxi")
    copy = os.path.join(scratch, os.path.basename(path))
    with open(copy, "wb") as f:
        f.write(data)
    return copy


def add(reference_path):
    with open(reference_path) as f:
        reference = json.load(f)
    base = os.path.dirname(reference_path)
    for arch, entry in reference.items():
        if not isinstance(entry, dict) or "files" not in entry:
            continue
        logits = {}
        for label, name in entry["files"].items():
            cases = entry.get(f"generate_{label}", entry.get("generate"))
            if cases is None:
                continue
            with tempfile.TemporaryDirectory() as scratch:
                cpp = LlamaCpp(LLAMA_CPP, loadable(os.path.join(base, name), scratch))
                try:
                    logits[label] = [cpp.logits(c["prompt_ids"]) for c in cases]
                    if label == "F32" and "tokenize" in entry:
                        entry["llama_cpp_tokenize"] = [cpp.tokenize(c["text"], False, True) for c in entry["tokenize"]]
                finally:
                    cpp.close()
            worst = max(max(abs(a - b) for a, b in zip(got, c["first_step_logits"])) for got, c in zip(logits[label], cases)
                        if "first_step_logits" in c) if all("first_step_logits" in c for c in cases) else float("nan")
            print(f"{arch} {label}: llama.cpp's first-step logits within {worst:.2e} of transformers'")
        entry["llama_cpp_first_step_logits"] = logits
        if "llama_cpp_tokenize" in entry:
            agree = sum(a == c["ids"] for a, c in zip(entry["llama_cpp_tokenize"], entry["tokenize"]))
            print(f"{arch}: llama.cpp's tokenizer agrees with transformers' on {agree}/{len(entry['tokenize'])} texts")
    reference.setdefault("versions", {})["llama_cpp"] = llama_cpp_version(LLAMA_CPP)
    write_reference(reference_path, reference)


def main():
    paths = sys.argv[1:] or [p for p in DEFAULT if os.path.exists(p)]
    for p in paths:
        print(p)
        add(p)


if __name__ == "__main__":
    main()
