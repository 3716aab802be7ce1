"""The live native NIC across processes, as the driver runs it: one process per rank, the
peers found through torch.distributed's store, each NativeNic adopting its rank's
UdpTransport socket, the exponents agreed over gloo. Lossless, the results equal
simulate_allreduce's bit for bit."""

from __future__ import annotations

import json
import os

import numpy as np

from optireduce.host.model.virtual_cluster import simulate_allreduce
from optireduce.params import NicParams
from tests.live_workers import spawn_world, store_url

PARAMS = {"p": 4096, "b": 16384, "c": 262144, "t_b_us": 5_000_000, "t_c_min_us": 5_000_000}


def inputs(world: int, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * (1 + r)).astype(np.float32) for r in range(world)]


def native_worker(rank: int, world: int, tmp: str, n: int, seed: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    from optireduce.host.driver import torch_exponent_agreement
    from optireduce.host.native.nic import NativeNic
    from optireduce.host.transport import UdpTransport, addresses_from_store

    dist.init_process_group("gloo", init_method=store_url(tmp), rank=rank, world_size=world)
    store = dist.distributed_c10d._get_default_store()
    transport = UdpTransport(rank)
    transport.connect(addresses_from_store(store, rank, world, transport.address))
    nic = NativeNic(NicParams(**PARAMS), rank, world, transport, torch_exponent_agreement())
    x = inputs(world, n, seed)[rank]
    out, stats = nic.allreduce(x)
    np.save(f"{tmp}/out{rank}.npy", out)
    with open(f"{tmp}/stats{rank}.json", "w") as f:
        json.dump({"ops": [s.to_dict() for s in stats], "counters": nic.counters()}, f)
    dist.barrier()  # nobody leaves while a peer may still need its gather packets
    nic.close()
    transport.close()
    dist.destroy_process_group()


def test_four_processes_equal_the_virtual_cluster_bit_for_bit(tmp_path):
    world, n, seed = 4, 3 * 262144 + 1000, 11  # 4 ops: the window of 2 slides twice
    spawn_world(native_worker, (world, str(tmp_path), n, seed), world, timeout_s=180)
    want, _ = simulate_allreduce(
        inputs(world, n, seed), params=NicParams(**PARAMS), calibrate=False
    )
    for r in range(world):
        np.testing.assert_array_equal(np.load(tmp_path / f"out{r}.npy"), want[r])
        st = json.loads((tmp_path / f"stats{r}.json").read_text())
        assert [op["op_id"] for op in st["ops"]] == [0, 1, 2, 3]
        assert all(op["phase1_reason"] == op["phase2_reason"] == "complete" for op in st["ops"])
        c = st["counters"]
        assert c["not_member"] == c["wrong_sender"] == 0
        assert c["rx_datagrams"] == c["rx_scatter"] + c["rx_gather"] > 0
