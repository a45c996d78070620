"""Entry point: `python -m trainer {run,slices,predict,preflight,make-tiny-model,fetch-model}`.

The process ends with `os._exit` once its output is flushed: everything the trainer writes is
fsynced when written, and skipping the interpreter's teardown (module garbage collection with
torch loaded, about a second on a busy machine) shortens every slice.
"""

from __future__ import annotations

import os

# Before anything imports transformers or huggingface_hub: the trainer never downloads.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer", description="tuneharness trainer agent")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train one slice of the job in --job-dir")
    r.add_argument("--job-dir", required=True, type=Path)
    r.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="wall-clock cap of this slice; exit 3 after checkpointing when reached",
    )
    r.add_argument(
        "--slice-steps",
        type=int,
        default=None,
        help="step cap of this slice (same exit as --max-seconds); for tests and operators",
    )
    sl = sub.add_parser("slices", help="run the job to the end as capped slices, each a forked transaction")
    sl.add_argument("--job-dir", required=True, type=Path)
    sl.add_argument(
        "--slice-seconds", type=float, default=None, help="wall-clock cap of each slice (as run --max-seconds)"
    )
    sl.add_argument("--slice-steps", type=int, default=None, help="step cap of each slice (as run --slice-steps)")
    sl.add_argument("--max-slices", type=int, default=None, help="stop after this many slices with exit 3 (resumable)")
    pr = sub.add_parser("predict", help="predict with base model + trained adapter")
    pr.add_argument("--job-dir", type=Path, help="a finished job directory (uses DIR/adapter)")
    pr.add_argument("--base-model", type=Path, help="base model directory (default: the one the adapter records)")
    pr.add_argument("--adapter", type=Path, help="adapter directory (default: DIR/adapter)")
    pr.add_argument("--input", type=Path, help="JSONL rows with 'id' and 'text' or 'prompt'")
    pr.add_argument("--output", type=Path, help="JSONL predictions, one per input row")
    pr.add_argument(
        "--serve",
        action="store_true",
        help="load once, then answer JSON lines on stdin with JSON lines on stdout until EOF",
    )
    pr.add_argument("--max-new-tokens", type=int, default=32)
    pr.add_argument("--batch-size", type=int, default=32)
    pf = sub.add_parser("preflight", help="prove the GPU computes; print one JSON line")
    pf.add_argument("--size", type=int, default=4096, help="matmul side length")
    pf.add_argument("--max-seconds", type=float, default=10.0, help="time budget of the timing loop")
    bs = sub.add_parser("bootstrap", help="install what this host lacks of the trainer's stack; print one JSON line")
    from trainer.bootstrap import add_arguments

    add_arguments(bs)
    mt = sub.add_parser("make-tiny-model", help="write a tiny random causal LM and tokenizer to DIR")
    mt.add_argument("dir", type=Path)
    fm = sub.add_parser("fetch-model", help="download a public model from a Hugging Face Hub, resumable, verified")
    fm.add_argument("--endpoint", required=True, help="the hub's base URL, e.g. https://huggingface.co")
    fm.add_argument("--repo", required=True, help="the model's id, ORG/NAME")
    fm.add_argument("--revision", required=True, help="the pinned 40-hex commit")
    fm.add_argument("--dest", required=True, type=Path, help="the directory the model's files go to")
    fm.add_argument("--progress", type=Path, default=None, help="write bytes done/total here while fetching")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        from trainer.run import run_job

        return run_job(args.job_dir, max_seconds=args.max_seconds, slice_steps=args.slice_steps)
    if args.command == "slices":
        if args.slice_seconds is None and args.slice_steps is None:
            parser.error("slices needs --slice-seconds S or --slice-steps N")
        from trainer.slices import run_slices

        return run_slices(
            args.job_dir, slice_seconds=args.slice_seconds, slice_steps=args.slice_steps, max_slices=args.max_slices
        )
    if args.command == "predict":
        if args.serve:
            if args.input is not None or args.output is not None:
                parser.error("predict --serve reads stdin and writes stdout; drop --input/--output")
            from trainer.predict import main_serve

            return main_serve(
                job_dir=args.job_dir,
                base_model=args.base_model,
                adapter=args.adapter,
                max_new_tokens=args.max_new_tokens,
            )
        if args.input is None or args.output is None:
            parser.error("predict needs --input and --output (or --serve)")
        from trainer.predict import main_predict

        return main_predict(
            job_dir=args.job_dir,
            base_model=args.base_model,
            adapter=args.adapter,
            input_path=args.input,
            output_path=args.output,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
        )
    if args.command == "preflight":
        from trainer.preflight import main_preflight

        return main_preflight(size=args.size, max_seconds=args.max_seconds)
    if args.command == "fetch-model":
        from trainer.fetch import main_fetch

        return main_fetch(args.endpoint, args.repo, args.revision, args.dest, progress_file=args.progress)
    if args.command == "bootstrap":
        from trainer.bootstrap import main_bootstrap

        return main_bootstrap(
            lock=args.lock, cache=args.cache, find_links=args.find_links, timeout_s=args.timeout_s, check=args.check
        )
    from trainer.tiny import write_tiny_causal_lm

    print(write_tiny_causal_lm(args.dir))
    return 0


def _exit_now(code: int) -> None:
    """End the process without the interpreter's teardown, after flushing what it printed."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
