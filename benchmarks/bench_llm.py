"""Abstraction engine speed: live requests per second, warm-cache reruns, offline captions per second.

Runs the local fake OpenAI-compatible server (tests/fake_openai_server.py) in its own process on 127.0.0.1
and prints, each beside a baseline measured in the same run:
  1. requests/s of the engine at concurrency 64 against 100 ms of server latency (target >= 200/s; the
     ceiling is 64 / 0.1 s = 640/s), vs the openai client's typed `chat.completions.create` over httpx, the
     straightforward way to call it;
  2. a rerun of 10,000 items from a warm cache (target: all hits, zero requests, under 5 s), vs the first run;
  3. the offline backend's captions/s on CPU, vs bare MiniLM encoding of the same captions.

    HF_HUB_OFFLINE=1 python benchmarks/bench_llm.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm import run_abstraction
from cglib.llm.base import ConceptTask
from cglib.llm.openai_backend import chat_payload

REPO = Path(__file__).resolve().parent.parent


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_openai_server.py"), "--latency", str(latency),
                             "--seconds", "900"], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def dataset(n: int, tag: str) -> CaptionDataset:
    ids = [f"{tag}{i:06d}" for i in range(n)]
    caps = {i: [f"a dog {i} on a sofa in a living room", f"a brown dog {i} sleeping next to a cat"] for i in ids}
    return CaptionDataset(source="bench", image_ids=ids, captions=caps, pixels=np.zeros((n, 1, 1, 3), np.uint8))


def params(url: str, l_max: int, concurrency: int, transport: str = "auto") -> Params:
    return Params.model_validate({"llm": {"backend": "openai", "base_url": url, "concurrency": concurrency,
                                          "http_transport": transport}, "magic": {"l_max": l_max}})


def engine_rate(url: str, images: int, l_max: int, concurrency: int, work: Path, transport: str = "auto") -> float:
    """Requests per second of run_abstraction (fresh cache)."""
    shutil.rmtree(work, ignore_errors=True)
    start = time.perf_counter()
    result = run_abstraction(dataset(images, "r"), params(url, l_max, concurrency, transport), work, progress=False)
    wall = time.perf_counter() - start
    assert result.summary["requests"] == images * l_max and not result.failures
    return images * l_max / wall


def typed_client_rate(url: str, n: int, concurrency: int) -> float:
    """Baseline: the typed chat.completions.create over the default httpx transport, semaphore-bounded."""
    from openai import AsyncOpenAI

    p = params(url, 2, concurrency)
    bodies = [chat_payload(p, ConceptTask(str(i), 1, (f"a dog {i} on a sofa",), ())) for i in range(n)]

    async def go() -> float:
        client = AsyncOpenAI(api_key="bench", base_url=url, max_retries=0)
        sem = asyncio.Semaphore(concurrency)

        async def one(body: dict) -> None:
            async with sem:
                await client.chat.completions.create(**body)

        start = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - start
        await client.close()
        return n / wall

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (about a minute)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_llm_"))
    n_live = 500 if args.quick else 1500
    n_cache = 2_500  # x 4 levels = 10,000 items

    proc, url = start_server(latency=0.1)
    try:
        rate = engine_rate(url, n_live, 2, 64, work / "live")
        rate_httpx = engine_rate(url, n_live // 2, 2, 64, work / "live_httpx", transport="httpx")
        base = typed_client_rate(url, n_live // 2, 64)
        print("1. live requests, 100 ms latency, concurrency 64 (ceiling 640/s; target >= 200/s)")
        print(f"   engine (aiohttp transport, generic post): {rate:7.1f} req/s")
        print(f"   engine (httpx transport):                 {rate_httpx:7.1f} req/s")
        print(f"   baseline typed create() over httpx:       {base:7.1f} req/s   -> engine is {rate / base:.1f}x")
    finally:
        proc.kill()

    proc, url = start_server(latency=0.0)
    try:
        ds = dataset(n_cache, "c")
        p = params(url, 4, 64)
        start = time.perf_counter()
        first = run_abstraction(ds, p, work / "cache", progress=False)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        again = run_abstraction(ds, p, work / "cache", progress=False)
        warm = time.perf_counter() - start
        hits = again.summary["cache"]["hits"]
        print(f"2. warm-cache rerun of {again.summary['items']:,} items (target: all hits, 0 requests, < 5 s)")
        print(f"   first run (0 ms latency): {cold:6.2f} s  ({first.summary['requests']:,} requests, "
              f"{first.summary['requests'] / cold:.0f} req/s)")
        print(f"   rerun:                    {warm:6.2f} s  ({hits:,} hits, {again.summary['requests']} requests)"
              f"   -> {cold / warm:.0f}x faster")
    finally:
        proc.kill()

    from cglib.data.synthetic import make_world
    from cglib.embed import embed_texts

    world = make_world(images_per_concept=4 if args.quick else 10, seed=0)
    captions = [c for i in world.dataset.image_ids for c in world.dataset.captions[i]]
    embed_texts(captions[:8])  # load the model outside the timings
    start = time.perf_counter()
    embed_texts(captions)
    bare = time.perf_counter() - start
    offline = Params()
    start = time.perf_counter()
    result = run_abstraction(world.dataset, offline, work / "offline", progress=False)
    wall = time.perf_counter() - start
    print(f"3. offline backend on {len(world.dataset):,} synthetic images, {len(captions):,} captions (CPU)")
    print(f"   bare MiniLM encoding: {len(captions) / bare:7.1f} captions/s")
    print(f"   offline backend:      {len(captions) / wall:7.1f} captions/s  ({len(result.chains)} chains, "
          f"{wall / bare:.2f}x the bare encoding time)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
