"""One rank of the PyTorch side: torch.distributed.pipelining end to end.

Usage: torch_rank.py JOB.json RANK   (the driver starts one process per rank)

What it does, all of it inside "time to first step": import torch, join the
Gloo group on 127.0.0.1, build the eager model and load the weights of the
model file Pipeforge splits, split it with `pipeline()` at the same FQNs
(SplitPoint.BEGINNING, or END where a cut read back from a Pipeforge cost
split needs it) or, for a model whose `pipeline()` stages fail (the
transformers Llama), by hand as torchtitan does (manual_split.py), wrap
this rank's stage modules in PipelineStage (GPipe,
1F1B: stage r; the loop schedules Interleaved1F1B and InterleavedZeroBubble:
stages r and r+P; the V schedules ZBVZeroBubble and DualPipeV: stages r and
2P-1-r, as Pipeforge places them), then train. A tensor-parallel job
(tensor_parallel t) splits each manual stage's layers over t ranks with
DTensor's parallelize_module on a (pp, tp) DeviceMesh, as torchtitan does.

One timed step = what `pipeforge train` times as one step (train/trainer.cpp,
runStep): take the batch, run the schedule (forward, backward, PyTorch's
gradient scaling), one AdamW update per local stage (job "adamw": loop =
foreach=False, foreach = foreach=True, fused = fused=True), zero the gradients.
Writes JOB.rank<R>.json: per-step wall times and monotonic end stamps, CPU
seconds of this process at each step end, the step-1 loss (on the rank with
the last stage), ru_maxrss and, on a GPU, torch.cuda.max_memory_allocated.

Job "device" cuda puts every rank on GPU 0 (NCCL); job "precision" bf16 runs
each stage's forward and the loss under torch.autocast(bfloat16), parameters
and optimizer in fp32, as Pipeforge's `training.precision: bf16`.
"""
import json
import os
import resource
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage, SplitPoint, pipeline, schedules  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manual_split  # noqa: E402
import models  # noqa: E402


def local_stages(rank: int, ranks: int, per_rank: int, placement: str) -> list:
    """The stages rank `rank` holds: one stage per rank, stage r; otherwise
    the loop layout (r, r+P, r+2P, ...: Interleaved1F1B, InterleavedZeroBubble)
    or the V (r and 2P-1-r: ZBVZeroBubble, DualPipeV)."""
    if per_rank == 1:
        return [rank]
    if placement == "loop":
        return [rank + k * ranks for k in range(per_rank)]
    if placement == "v" and per_rank == 2:
        return [rank, 2 * ranks - 1 - rank]
    raise SystemExit(f"no placement '{placement}' with {per_rank} stages per rank (loop, or v with 2)")


# AdamW implementation (the driver's --adamw) -> torch.optim.AdamW keyword.
ADAMW_IMPL = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def tensor_parallel(modules: list, ranks: int, tp: int) -> tuple:
    """torchtitan's way for a pp x tp run: a 2-D DeviceMesh (tp innermost,
    as Pipeforge lays ranks out) and parallelize_module over its tp
    dimension with the Llama plan: q, k, v, gate and up colwise, o and down
    rowwise, the embedding rowwise (split by vocabulary), lm_head colwise with
    its logits gathered (pipelining's loss takes whole tensors). Returns
    (this rank's pipeline rank, the pipeline group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (ranks // tp, tp), mesh_dim_names=("pp", "tp"))
    for module in modules:
        plan = {}
        for i in module.model.layers:
            for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
                plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
            for name in ("self_attn.o_proj", "mlp.down_proj"):
                plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
        if module.first:
            plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
        if module.last:
            plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
        parallelize_module(module, mesh["tp"], plan)
    return mesh.get_local_rank("pp"), mesh["pp"].get_group()


def param_groups(module) -> list:
    """The parameters, DTensors (tensor parallel's split ones) in a group of
    their own: foreach and fused AdamW refuse a list mixing them with plain
    tensors (the norms, which every rank of the group holds whole)."""
    from torch.distributed.tensor import DTensor
    params = list(module.parameters())
    split = [p for p in params if isinstance(p, DTensor)]
    whole = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": g} for g in (split, whole) if g]


class Autocast(torch.nn.Module):
    """A stage's forward under torch.autocast (job "precision": bf16), as
    Pipeforge's `training.precision: bf16` runs each stage forward and the
    loss; the backward runs outside it, as autocast's documentation asks."""

    def __init__(self, inner: torch.nn.Module, device_type: str) -> None:
        super().__init__()
        self.inner, self.device_type = inner, device_type

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.inner(*args, **kwargs)


def main() -> None:
    job_path, rank = sys.argv[1], int(sys.argv[2])
    with open(job_path) as f:
        job = json.load(f)
    torch.set_num_threads(job["threads"])
    ranks, per_rank, m = job["ranks"], job["stages_per_rank"], job["microbatches"]
    tp = job.get("tensor_parallel", 1)
    num_stages = ranks // tp * per_rank
    # job "device": "cpu" (Gloo), or "cuda": every rank on GPU 0 over NCCL (two ranks of one host on
    # one GPU need a NCCL_HOSTID each, which torch_side.py sets, as scripts/gpu_check.sh does for Pipeforge).
    cuda = job.get("device", "cpu") == "cuda"
    device = torch.device("cuda:0") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank,
                            world_size=ranks)
    bf16 = job.get("precision", "fp32") == "bf16"

    spec = models.MODELS[job["model"]]
    data = torch.load(job["data"])
    inputs, targets = data["inputs"].to(device), data["targets"].to(device)
    model = models.load_eager(spec, job["model_file"]).to(device)
    example = inputs[: job["batch"] // m]
    pp_rank, pp_group = rank // tp, None
    mine = local_stages(pp_rank, ranks // tp, per_rank, job.get("placement", "v"))
    if spec.torch_split == "manual":
        modules = manual_split.llama_stages(model, job["cuts"], mine)
        pipe = None
        if tp > 1:
            pp_rank, pp_group = tensor_parallel(modules, ranks, tp)
    elif tp > 1:
        raise SystemExit(f"{job['model']}: the tensor-parallel side needs a manual split (the Llama)")
    else:
        points = {fqn: getattr(SplitPoint, where) for fqn, where in models.split_points(job["cuts"])}
        pipe = pipeline(model, (example,), split_spec=points)
        if pipe.num_stages != num_stages:
            raise SystemExit(f"pipeline() made {pipe.num_stages} stages from cuts {job['cuts']}, expected {num_stages}")
        # Note [Stages from pipeline()]: pipe.build_stage(s) returns a _PipelineStage,
        # whose legacy P2P warm-up in torch 2.13 (schedules.py, _warmup_p2p) posts a
        # Gloo send/recv between the two stages a V schedule puts on one rank, which
        # fails ("Pair is not connected"). PipelineStage over the same stage module
        # (the class the interop tests use) warms up by its vote protocol instead.
        modules = [pipe.get_stage_module(s) for s in mine]
    if bf16:
        modules = [Autocast(module, device.type) for module in modules]
    stages = [PipelineStage(module, s, num_stages, device, group=pp_group)
              for module, s in zip(modules, mine)]
    del pipe, model  # what other ranks' stages hold can go
    cls = getattr(schedules, "Schedule" + job["schedule"])

    def loss_fn(output, target):
        if not bf16:
            return models.loss_fn(output, target)
        with torch.autocast(device.type, dtype=torch.bfloat16):  # as Pipeforge: cross_entropy runs in fp32 there
            return models.loss_fn(output, target)
    schedule = cls(stages[0] if per_rank == 1 else stages, m, loss_fn=loss_fn)
    opt = job["optimizer"]
    impl = ADAMW_IMPL[job.get("adamw", "loop")]
    optimizers = [torch.optim.AdamW(param_groups(st.submod), lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"],
                                    weight_decay=opt["weight_decay"], **impl) for st in stages]
    has_first, has_last = 0 in mine, num_stages - 1 in mine

    step_s, end_t, end_cpu, first_loss = [], [], [], None
    for step, rows in enumerate(job["rows"]):
        t0 = time.monotonic()
        idx = torch.tensor(rows, device=device)
        x, y = inputs.index_select(0, idx), targets.index_select(0, idx)
        losses = []
        schedule.step(*((x,) if has_first else ()), **({"target": y, "losses": losses} if has_last else {}))
        for o in optimizers:
            o.step()
            o.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)  # the step's kernels done, as Pipeforge's step time waits for them
        t1 = time.monotonic()
        step_s.append(t1 - t0)
        end_t.append(t1)
        end_cpu.append(time.process_time())
        if step == 0 and losses:
            first_loss = sum(l.item() for l in losses) / len(losses)
    dist.barrier()
    out = {"rank": rank, "step_s": step_s, "end_t": end_t, "end_cpu": end_cpu, "first_loss": first_loss,
           "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
           "gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None}
    with open(f"{job_path}.rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
