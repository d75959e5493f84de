"""Mailbox latency and throughput on every local store, measured in one run.

Run: ``.venv/bin/python -m bench.bench_mailbox [--samples 300] [--large-mib 64] [--repeat 3]
[--stores memory,file,seaweedfs,moto,azurite]``

It starts the same loopback servers the tests use (SeaweedFS, moto, Azurite;
see ``tests/mailbox/mailbox_servers.py``) and stops them at the end. Per store:

* small-request latency, p50 and p99 in milliseconds, of one mailbox operation
  at a time on a 1 KiB object: ``put`` (overwrite), ``put_once`` (a new key
  each time), ``get``, ``probe`` (HEAD), ``probe`` of an absent key, and
  ``list`` of a 16-key folder. The operations are interleaved round-robin, so
  a noisy neighbour hurts them all alike; the first rounds are warm-up.
* ``raw head``: the same HEAD through obstore's async API directly, for
  comparison with ``probe`` (the mailbox's worker-thread hop, see
  ``gm_shell.mailbox``); its last call is long over when the process exits,
  so the async API's exit race (``gm_shell.oneshot``) cannot strike.
* throughput of a 64 MiB payload written create-once in one request and read
  back whole, in MiB/s (best and median of ``--repeat``).

Loopback servers on a 2-core machine measure the client and the server's
own overhead, not a network: compare stores with each other within one run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import obstore
from tests.mailbox import mailbox_servers  # run from the repository root, as `python -m`

from gm_shell.accounting import PRICES_S3, Stats, cost_usd
from gm_shell.mailbox import Mailbox
from gm_shell.oneshot import run_oneshot
from gm_shell.stores import MailboxOptions

LOCAL = ("memory", "file")
Op = Callable[[int], Awaitable[object]]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def interleaved(ops: dict[str, Op], samples: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each op, calling every op once per round."""
    times: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(warmup + samples):
        for name, op in ops.items():
            start = time.perf_counter()
            await op(i)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


async def latency(mailbox: Mailbox, samples: int) -> dict[str, list[float]]:
    small = random.Random(1).randbytes(1024)
    await mailbox.put("lat/head.json", small)
    for k in range(16):
        await mailbox.put_once(f"lat/list/{k:04d}.json", small)
    ops: dict[str, Op] = {
        "raw head": lambda _: obstore.head_async(mailbox.handle.store, "lat/head.json"),
        "probe": lambda _: mailbox.probe("lat/head.json"),
        "probe absent": lambda _: mailbox.probe("lat/absent.json"),
        "get": lambda _: mailbox.get("lat/head.json"),
        "put": lambda _: mailbox.put("lat/head.json", small),
        "put_once": lambda i: mailbox.put_once(f"lat/once/{i:06d}.json", small),
        "list": lambda _: mailbox.list("lat/list/"),
    }
    return await interleaved(ops, samples, warmup=20)


async def throughput(mailbox: Mailbox, mib: int, repeat: int) -> tuple[list[float], list[float]]:
    """MiB/s of each create-once put and each whole get of a ``mib`` MiB payload."""
    data = random.Random(2).randbytes(mib * 1024 * 1024)
    puts, gets = [], []
    for r in range(repeat):
        start = time.perf_counter()
        await mailbox.put_once(f"big/{r}.st", data)
        puts.append(mib / (time.perf_counter() - start))
        start = time.perf_counter()
        got = await mailbox.get(f"big/{r}.st")
        gets.append(mib / (time.perf_counter() - start))
        assert got is not None
        assert len(got.data) == len(data)
    return puts, gets


@attrs.frozen
class Result:
    latency: dict[str, list[float]]
    puts: list[float]
    gets: list[float]
    stats: Stats


async def measure(url: str, options: MailboxOptions, args: argparse.Namespace) -> Result:
    async with Mailbox.open(url, options=options) as mailbox:
        lat = await latency(mailbox, args.samples)
        puts, gets = await throughput(mailbox, args.large_mib, args.repeat)
        await mailbox.delete_prefix("")
        return Result(latency=lat, puts=puts, gets=gets, stats=mailbox.stats)


def report(results: dict[str, Result], args: argparse.Namespace) -> None:
    ops = list(next(iter(results.values())).latency)
    print(f"\nsmall requests (1 KiB), {args.samples} samples each: p50 / p99 in ms")
    print(f"  {'store':<10}" + "".join(f"{op:>16}" for op in ops))
    for store, result in results.items():
        cells = [
            f"{percentile(result.latency[op], 0.5) * 1e3:.2f} / "
            f"{percentile(result.latency[op], 0.99) * 1e3:.2f}"
            for op in ops
        ]
        print(f"  {store:<10}" + "".join(f"{c:>16}" for c in cells))
    print(f"\n{args.large_mib} MiB payload, {args.repeat} runs: MiB/s best (median)")
    print(f"  {'store':<10}{'put_once':>18}{'get':>18}")
    for store, result in results.items():
        cells = [f"{max(x):.0f} ({statistics.median(x):.0f})" for x in (result.puts, result.gets)]
        print(f"  {store:<10}" + "".join(f"{c:>18}" for c in cells))
    total = sum((r.stats for r in results.values()), Stats())
    print(
        f"\nrequests counted: {total.total_requests} ({total.list_requests} LIST, "
        f"{total.get_requests} GET, {total.put_requests} PUT, {total.delete_requests} DELETE), "
        f"{total.retries} retries; at S3 prices ${cost_usd(total, PRICES_S3):.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--large-mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stores", default=",".join(LOCAL + tuple(mailbox_servers.LAUNCHERS)))
    args = parser.parse_args()
    stores = args.stores.split(",")
    python = sys.version.split()[0]
    print(f"mailbox bench: {os.cpu_count()} cpus, obstore {obstore.__version__}, python {python}")
    with tempfile.TemporaryDirectory(prefix="gm-bench-") as tmp:
        servers_wanted = [s for s in stores if s in mailbox_servers.LAUNCHERS]
        with mailbox_servers.running(servers_wanted, Path(tmp)) as servers:
            results: dict[str, Result] = {}
            for store in stores:
                if store == "memory":
                    url, options = "memory://bench/run", MailboxOptions()
                elif store == "file":
                    url, options = f"file://{tmp}/file-bucket", MailboxOptions()
                else:
                    url, options = f"{servers[store].url}/bench", servers[store].options
                results[store] = run_oneshot(measure(url, options, args))
                print(f"  measured {store}", flush=True)
    report(results, args)


if __name__ == "__main__":
    main()
