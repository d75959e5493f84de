"""One rank of a two-process gloo group on CPU: what ``adapt`` says of sharded models.

Run by ``test_models.test_models_sharded_over_ranks_are_refused_by_name`` as
``python sharded_rank.py RANK WORLD FOLDER``; prints one JSON object: for FSDP
(``FULL_SHARD``, ``use_orig_params=True``) and FSDP2's ``fully_shard``, the shapes
this rank holds and adapt's error (or the schema it would have used).
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

from gm_shell.models import ModelError, adapt


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def outcome(wrapped: torch.nn.Module) -> dict[str, object]:
    held = {n: list(p.shape) for n, p in wrapped.named_parameters()}
    local = {
        n: list(p.to_local().shape if hasattr(p, "to_local") else p.shape)
        for n, p in wrapped.named_parameters()
    }
    try:
        return {"held": held, "local": local, "schema": [t.name for t in adapt(wrapped).schema()]}
    except ModelError as e:
        return {"held": held, "local": local, "error": str(e)}


def main() -> None:
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=world)
    try:
        fsdp = FullyShardedDataParallel(
            model(), use_orig_params=True, device_id=torch.device("cpu")
        )
        sharded = model()
        fully_shard(sharded)
        plain = {n: list(p.shape) for n, p in model().named_parameters()}
        print(json.dumps({"plain": plain, "fsdp": outcome(fsdp), "fully_shard": outcome(sharded)}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
