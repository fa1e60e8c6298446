"""Dump the schedules torch.distributed.pipelining builds, for the side-by-side test.

For every schedule class of the installed torch, over ranks p = 2..4, stages per
rank v = 1..3 (single-stage classes: 1) and microbatches m in {p, 2p, 2pv, 3p+1},
this builds the schedule object on fake stages (no process group, no model: the
classes only read the stages' rank, group size and stage count while they build
their action lists) and writes PyTorch's own CSV of each case into OUT_DIR:

  <Name>_p<p>_v<v>_m<m>.compute.csv  the compute-only order with its idle steps;
  <Name>_p<p>_v<v>_m<m>.order.csv    single-stage classes only: `pipeline_order`
                                     as PyTorch exposes it (see below);
  <Name>_p<p>_v<v>_m<m>.comms.csv    the lowered order with communication.

plus OUT_DIR/index.json (every case with its files, every configuration PyTorch
rejects with the error it raises, every class that is not compared and why) and
OUT_DIR/stamp.txt. tests/schedules/pytorch_orders_test.cpp reads them.

Which PyTorch objects the files hold:
  * multi-stage classes: `pipeline_order` (compute) and `pipeline_order_with_comms`
    (comms), written by the schedule's own `_dump_csv`;
  * single-stage classes (GPipe, 1F1B) build no runtime IR. Their
    `pipeline_order` already went through `_add_reduce_grad`, which drops the
    idle steps and appends REDUCE_GRAD; compute is the list handed to it (idle
    steps included), order is `pipeline_order`, and comms is `_add_send_recv`
    applied to `pipeline_order` with stage s on rank s.
A lowering PyTorch itself fails on is recorded under the case's "errors".

Run: PYTHON dump_pytorch_orders.py --out OUT_DIR [--force]
The stamp holds the torch version and this script's hash; when both match, the
run only touches the stamp and exits without importing torch. Output is
deterministic: the same torch writes the same bytes.
"""
import argparse
import csv
import hashlib
import importlib.metadata
import json
import os
import sys

STAMP = "stamp.txt"
INDEX = "index.json"

RANKS = (2, 3, 4)
STAGES_PER_RANK = (1, 2, 3)

# PyTorch class -> the Pipeforge generator name (schedules/generate.h) that
# builds the same schedule. A concrete class missing here and from
# NOT_COMPARED is listed as "unmapped" in the index, which fails the test.
GENERATOR_FOR_CLASS = {
    "ScheduleGPipe": "GPipe",
    "Schedule1F1B": "1F1B",
    "ScheduleInterleaved1F1B": "Interleaved1F1B",
    "ScheduleLoopedBFS": "LoopedBFS",
    "ScheduleInterleavedZeroBubble": "InterleavedZeroBubble",
    "ScheduleZBVZeroBubble": "ZBVZeroBubble",
    "ScheduleDualPipeV": "DualPipeV",
}

# Classes in the module that build no schedule of their own.
NOT_COMPARED = {
    "_PipelineSchedule": "abstract base class",
    "PipelineScheduleSingle": "base class of the single-stage schedules; builds no order",
    "PipelineScheduleMulti": "base class of the multi-stage schedules; its order comes from _load_csv",
    "_PipelineScheduleRuntime": "runtime for a loaded CSV; builds no order of its own",
    "_ScheduleForwardOnly": "forward-only (inference) runtime; builds no order",
}


def script_hash():
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def installed_torch_version():
    """The torch version without importing torch (which takes seconds)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def stamp_text(torch_version, dist_version):
    return (
        f"torch {torch_version}\n"
        f"torch-dist {dist_version}\n"
        f"script {script_hash()}\n"
        f"python {sys.executable}\n"
    )


def stamp_matches(out_dir):
    """True when OUT_DIR already holds this script's dump for the installed torch."""
    path = os.path.join(out_dir, STAMP)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(out_dir, INDEX)):
        return False
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fields = dict(line.split(" ", 1) for line in lines if " " in line)
    dist_version = installed_torch_version()
    return (
        dist_version is not None
        and fields.get("torch-dist") == dist_version
        and fields.get("script") == script_hash()
        and fields.get("python") == sys.executable
    )


class FakeStage:
    """What the schedule constructors read from a pipeline stage, and nothing else.

    `submod` is None, so the torch.compile check passes; the constructors set
    `stage_index_to_group_rank` on every stage.
    """

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.submod = None
        self.stage_index_to_group_rank = {}


def microbatch_counts(p, v):
    counts = []
    for m in (p, 2 * p, 2 * p * v, 3 * p + 1):
        if m not in counts:
            counts.append(m)
    return counts


def rank0_stage_indices(p, v, v_shaped):
    # Rank 0's stages: 0, p, 2p, ... in a loop, 0 and 2p-1 in a V.
    # (The constructors derive every rank's stages from the rank; only their
    # number and the first one's num_stages/group fields matter.)
    if v_shaped and v == 2:
        return [0, 2 * p - 1]
    return [local * p for local in range(v)]


def error_text(exc):
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def write_rows(path, rows):
    # Exactly what PyTorch's _dump_csv does: csv.writer, one row per rank.
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for row in rows:
            writer.writerow(row)


def build_single(S, cls, p, m):
    """(compute rows, order rows) of a single-stage class; raises what PyTorch raises."""
    captured = []
    original = S._add_reduce_grad

    def capture(actions, n_microbatches):
        captured.append(list(actions))
        return original(actions, n_microbatches)

    S._add_reduce_grad = capture
    try:
        schedule = cls(FakeStage(0, p, p, 0), m)
    finally:
        S._add_reduce_grad = original
    order = schedule.pipeline_order
    if order is None:
        raise RuntimeError(f"{cls.__name__} builds no pipeline_order")
    ranks = sorted(order)
    # _get_pipeline_order hands each rank's list to _add_reduce_grad in rank order.
    compute = captured if len(captured) == len(ranks) else [order[r] for r in ranks]
    return compute, [order[r] for r in ranks]


def dump_case(S, cls, single, v_shaped, p, v, m, out_dir, base):
    files, errors = {}, {}
    if single:
        compute, order = build_single(S, cls, p, m)
        write_rows(os.path.join(out_dir, base + ".compute.csv"), compute)
        files["compute"] = base + ".compute.csv"
        write_rows(os.path.join(out_dir, base + ".order.csv"), order)
        files["order"] = base + ".order.csv"
        try:
            comms = S._add_send_recv(
                {rank: list(actions) for rank, actions in enumerate(order)},
                stage_to_rank=lambda s: s,
                num_stages=p,
            )
            write_rows(os.path.join(out_dir, base + ".comms.csv"), [comms[r] for r in sorted(comms)])
            files["comms"] = base + ".comms.csv"
        except Exception as exc:  # PyTorch cannot lower its own order
            errors["comms"] = error_text(exc)
        return files, errors

    stages = [
        FakeStage(index, p * v, p, 0) for index in rank0_stage_indices(p, v, v_shaped)
    ]
    schedule = cls(stages, m)
    schedule._dump_csv(os.path.join(out_dir, base + ".compute.csv"), format="compute_only")
    files["compute"] = base + ".compute.csv"
    schedule._dump_csv(os.path.join(out_dir, base + ".comms.csv"), format="compute_comms")
    files["comms"] = base + ".comms.csv"
    return files, errors


def schedule_classes(S):
    """Every schedule class in torch's schedules module, sorted by name."""
    found = []
    for name in sorted(dir(S)):
        obj = getattr(S, name)
        if isinstance(obj, type) and issubclass(obj, S._PipelineSchedule):
            found.append((name, obj))
    return found


def dump(out_dir):
    import logging
    import warnings

    warnings.filterwarnings("ignore")  # e.g. "Failed to initialize NumPy"
    import torch
    from torch.distributed.pipelining import schedules as S

    logging.getLogger(S.__name__).setLevel(logging.ERROR)

    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if name.endswith(".csv") or name in (INDEX, STAMP):
            os.remove(os.path.join(out_dir, name))

    index = {
        "torch_version": torch.__version__,
        "matrix": {
            "ranks": list(RANKS),
            "stages_per_rank": list(STAGES_PER_RANK),
            "microbatches": "p, 2p, 2*p*v, 3p+1 (deduplicated)",
        },
        "classes": [],
        "not_compared": [],
        "cases": [],
        "rejected": [],
    }
    for class_name, cls in schedule_classes(S):
        if class_name in NOT_COMPARED:
            index["not_compared"].append({"torch_class": class_name, "reason": NOT_COMPARED[class_name]})
            continue
        schedule = GENERATOR_FOR_CLASS.get(class_name)
        if schedule is None:
            index["classes"].append({"torch_class": class_name, "schedule": None, "kind": "unmapped"})
            continue
        single = issubclass(cls, S.PipelineScheduleSingle)
        v_shaped = class_name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
        index["classes"].append(
            {"torch_class": class_name, "schedule": schedule, "kind": "single" if single else "multi"}
        )
        for p in RANKS:
            for v in (1,) if single else STAGES_PER_RANK:
                for m in microbatch_counts(p, v):
                    case = {
                        "torch_class": class_name,
                        "schedule": schedule,
                        "ranks": p,
                        "stages_per_rank": v,
                        "microbatches": m,
                    }
                    base = f"{schedule}_p{p}_v{v}_m{m}"
                    try:
                        files, errors = dump_case(S, cls, single, v_shaped, p, v, m, out_dir, base)
                    except Exception as exc:
                        for suffix in (".compute.csv", ".order.csv", ".comms.csv"):
                            path = os.path.join(out_dir, base + suffix)
                            if os.path.exists(path):
                                os.remove(path)
                        index["rejected"].append({**case, "error": error_text(exc)})
                        continue
                    case["files"] = files
                    if errors:
                        case["errors"] = errors
                    index["cases"].append(case)

    with open(os.path.join(out_dir, INDEX), "w", encoding="utf-8", newline="\n") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    # The stamp goes last: an interrupted run leaves no stamp that matches.
    with open(os.path.join(out_dir, STAMP), "w", encoding="utf-8", newline="\n") as f:
        f.write(stamp_text(torch.__version__, installed_torch_version()))
    return index


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--force", action="store_true", help="regenerate even if the stamp matches")
    args = parser.parse_args()

    if not args.force and stamp_matches(args.out):
        os.utime(os.path.join(args.out, STAMP))  # newer than its inputs, for the build tool
        return 0
    index = dump(args.out)
    print(
        f"dump_pytorch_orders: torch {index['torch_version']}: {len(index['cases'])} cases, "
        f"{len(index['rejected'])} rejected by PyTorch, in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
