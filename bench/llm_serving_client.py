"""The client of bench/llm_serving.exs: N concurrent streaming chat completions against one
OpenAI-compatible server, through the official `openai` package (AsyncOpenAI), and one JSON
object on stdout with what each request saw. Works against any such server on its own:

    python3 bench/llm_serving_client.py --base-url http://127.0.0.1:8080/v1 \\
        --model smollm2-135m-instruct --n 8 [--max-tokens 64] [--rounds 1] [--ignore-eos]

Each request: `chat.completions.create(stream=True, max_tokens=M, temperature=0,
stream_options={"include_usage": True})`, a different prompt per request (PROMPTS below, of
different lengths, each asking for a long answer), made unique per round and request so no
server answers from a cache of an earlier identical prompt. `--ignore-eos` adds `ignore_eos`
(extra_body, as llama.cpp's server and ExBurn.Server take it), which makes every answer exactly
M tokens; a server without it may
end earlier at end-of-sequence, so the completion tokens counted are the server's own (the
usage chunk), else the content chunks.

Measured per request, from just before `create` (the request is sent) on this client's
monotonic clock: `ttft` (the first chunk with non-empty content), `latency` (the stream's
end), `completion_tokens`, `prompt_tokens`, `chunks` (content chunks) and `finish_reason`.
Per round, `wall`: from the first request sent to the last stream's end; the N requests are
started together. A warm-up request (not measured) goes first unless `--no-warmup`.

Output: {"openai": version, "n", "max_tokens", "rounds", "rounds_wall": [s], "requests":
[{...}], "errors": [text], "loadavg": [before, after]}. Progress goes to stderr.
"""

import argparse
import asyncio
import json
import sys
import time

import openai
from openai import AsyncOpenAI

# Each asks for a long answer, so a server that cannot ignore end-of-sequence still writes
# max_tokens tokens nearly always; the lengths run from one line to a few paragraphs.
TOPICS = [
    "the history of lighthouses",
    "how bread is made",
    "the water cycle",
    "the life of honey bees",
    "how a steam engine works",
    "the rules of chess",
    "why the sky is blue",
    "the first voyage around the world",
    "how volcanoes form",
    "the invention of the printing press",
    "how plants make food from sunlight",
    "the migration of birds",
    "how a city's water supply works",
    "the history of the bicycle",
    "how computers store numbers",
    "the tides of the ocean",
]

CONTEXT = (
    "Some background you may use: people have studied this subject for centuries, and many "
    "books describe it from different points of view. Scientists, historians and ordinary "
    "people each notice different things about it. Some details are well known, while others "
    "are only understood by specialists. A good explanation starts from the basics, gives "
    "examples, explains the causes and the effects, and ends with what is still unknown. "
)


def prompt(i, tag, paragraphs):
    topic = TOPICS[i % len(TOPICS)]
    # paragraphs of background, cycled over the requests: prompts of different lengths
    background = CONTEXT * paragraphs[i % len(paragraphs)]
    return (
        f"[{tag}] {background}Write a long, detailed essay about {topic}. "
        "Use at least six paragraphs and do not stop early."
    )


async def one(client, args, i, tag, t_round):
    extra = {"ignore_eos": True} if args.ignore_eos else None
    t0 = time.monotonic()
    ttft = None
    chunks = 0
    usage = None
    finish = None
    stream = await client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": prompt(i, tag, args.background)}],
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                chunks += 1
                if ttft is None:
                    ttft = time.monotonic() - t0
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    t1 = time.monotonic()
    return {
        "index": i,
        "start": t0 - t_round,
        "ttft": ttft,
        "latency": t1 - t0,
        "end": t1 - t_round,
        "chunks": chunks,
        "completion_tokens": usage.completion_tokens if usage else None,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "finish_reason": finish,
    }


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def main(args):
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, timeout=args.timeout, max_retries=0)
    out = {
        "openai": openai.__version__,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "rounds_wall": [],
        "requests": [],
        "errors": [],
        "loadavg": [loadavg()],
    }
    if not args.no_warmup:
        try:
            await one(client, args, 0, "warm-up", time.monotonic())
        except Exception as e:  # noqa: BLE001 - reported, the measured rounds say the rest
            out["errors"].append(f"warm-up: {type(e).__name__}: {e}")
    for r in range(args.rounds):
        t_round = time.monotonic()
        tasks = [one(client, args, i, f"{args.tag}{r}.{i}", t_round) for i in range(args.n)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.monotonic() - t_round
        out["rounds_wall"].append(wall)
        for res in results:
            if isinstance(res, Exception):
                out["errors"].append(f"{type(res).__name__}: {res}")
            else:
                res["round"] = r
                out["requests"].append(res)
        ok = [x for x in results if not isinstance(x, Exception)]
        toks = sum((x["completion_tokens"] or x["chunks"]) for x in ok)
        print(
            f"  {args.tag or args.base_url} n={args.n} round {r}: {len(ok)}/{args.n} ok, "
            f"{toks} tokens in {wall:.2f} s (load {loadavg()})",
            file=sys.stderr,
        )
    out["loadavg"].append(loadavg())
    await client.close()
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="the server's OpenAI base URL, ending in /v1")
    p.add_argument("--model", required=True)
    p.add_argument("--n", type=int, required=True, help="concurrent requests per round")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (llama.cpp's server, ExBurn.Server)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--tag", default="", help="a word in every prompt and progress line")
    p.add_argument(
        "--background",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 1, 2, 4],
        help="paragraphs of background per prompt, cycled over the requests (0: about 60 tokens "
        "with the chat template; each paragraph adds about 75)",
    )
    p.add_argument("--api-key", default="none")
    p.add_argument("--timeout", type=float, default=900.0)
    asyncio.run(main(p.parse_args()))
