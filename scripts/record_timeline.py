"""Record the timeline of one decode step on every SM for each rung of the ladder and both bundled models on this
GPU, for visitors without one (explorer.measure.timeline; the kernels' stamps, kernels.stamps):

    python scripts/record_timeline.py [--out assets/recorded/timeline_<gpu>.json] [--context 1000]

Each step is a decode step in bfloat16 at `context` tokens of cache, batch 1, replayed from a CUDA graph (as
the app runs it on a GPU) and launched eagerly from the host, the rung's kernels each writing their programs'
start, end and SM (and at the megakernel rung every task its start, its inputs ready and its end); beside it the
step's time with and without the stamps (CUDA events, median of 20) and the checks a timeline must pass (every
program of every grid stamped, the span inside the step, every task inside its program). The file holds every
program's interval and every task's.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

RUNGS = ("none", "epilogue", "decode", "overlap", "persistent", "megakernel")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the JSON file (default: assets/recorded/timeline_<gpu>.json)")
    parser.add_argument("--context", type=int, default=1000)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        from kernels.timing import require_cuda

        require_cuda("record_timeline")
    from explorer.app import recordings, timelines
    from explorer.app.lessons import recorded
    from explorer.measure import timeline
    from explorer.measure.timeline import idle_share
    from explorer.model.weights import BUNDLED_LLAMA, DEFAULT_MODEL, load_model

    steps = []
    for name in (DEFAULT_MODEL, BUNDLED_LLAMA):
        model, _ = load_model(name, device="cuda", dtype=torch.bfloat16)
        for rung, graph in ((r, g) for r in RUNGS for g in (True, False)):
            got = timeline.record(model.with_fusion(rung), context=args.context, graph=graph)
            frame, how = got["frame"], "graph" if graph else "eager"
            print(
                f"{name} {rung} {how}: {frame.launch.nunique()} launches, {len(frame)} programs, idle "
                f"{idle_share(frame, got['sms']):.0%}, step {got['step_ms']:.3f} ms, stamped {got['stamped_ms']:.3f} ms"
                + (f", problems: {got['problems']}" if got["problems"] else ""),
                flush=True,
            )
            steps.append(
                dict(
                    model=name,
                    fusion=rung,
                    graph=graph,
                    context=args.context,
                    dtype="bfloat16",
                    sms=got["sms"],
                    step_ms=got["step_ms"],
                    stamped_ms=got["stamped_ms"],
                    problems=got["problems"],
                    programs=frame.to_dict(orient="list"),
                    **({"tasks": got["tasks"].to_dict(orient="list")} if len(got["tasks"]) else {}),
                )
            )
    meta = recordings.stamp("python scripts/record_timeline.py")
    out = Path(args.out) if args.out else recordings.FOLDER / f"timeline_{recorded.slug(meta['gpu'])}.json"
    timelines.save(out, meta, steps)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)", flush=True)


if __name__ == "__main__":
    main()
