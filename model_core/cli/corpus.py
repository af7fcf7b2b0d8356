"""The ``corpus`` verb: stream many texts through a model into a run folder of corpus head statistics."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from model_core.cli.options import (
    MODEL_CHOICES,
    add_encoder_shape_options,
    custom_options_misused,
)
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag
from model_core.corpus.sample import DEFAULT_CAP


def add_corpus_parser(sub: Any) -> None:
    """Add the ``corpus`` verb to the command line's subparsers."""
    cor = sub.add_parser("corpus", help="run many texts through a model and keep corpus head statistics",
                         description="Stream texts through a model in padded, length-sorted batches and write a run "
                                     "folder: manifest.json, head_stats.npz, texts.parquet/. Ctrl-C leaves a valid "
                                     "partial run; --resume continues it.")
    cor.add_argument("--input", required=True,
                     help="a .txt (one text per line), .csv, .tsv or .jsonl file; 'demo' for the demo corpus; "
                          "or hf:DATASET_ID (a datasets id or local dataset folder)")
    cor.add_argument("--model", choices=MODEL_CHOICES, required=True,
                     help="pretrained (any supported family), custom (the chapter-3 encoder), or bert (= pretrained)")
    cor.add_argument("--model-id", default=None, help="hub id, folder, or the bundled model (default)")
    cor.add_argument("--weights", choices=["random", "pretrained"], default="random",
                     help="custom encoder only: random (seeded) or BERT's weights from --model-id")
    cor.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    cor.add_argument("--seed", type=int, default=0, help="custom encoder only")
    add_encoder_shape_options(cor)
    cor.add_argument("--column", default=None, help="text column of a table (default: text, or the first column)")
    cor.add_argument("--pair-column", default=None, help="optional column with sentence B")
    cor.add_argument("--split", default="train", help="hf: inputs only: the split")
    cor.add_argument("--limit", type=int, default=None, help="run at most N texts")
    cor.add_argument("--batch-size", type=int, default=64, help="texts per batch (long texts make smaller batches)")
    cor.add_argument("--shard-size", type=int, default=512, help="texts per shard: the unit of a Ray task and of resume")
    cor.add_argument("--max-tokens", type=int, default=512, help="longest text in tokens")
    cor.add_argument("--long", choices=["truncate", "skip"], default="truncate",
                     help="texts over --max-tokens: keep the first tokens (counted) or leave them out (counted)")
    cor.add_argument("--engine", choices=["local", "ray"], default="local")
    cor.add_argument("--ray-address", default=None, help="a Ray cluster's address (default: start a local Ray)")
    cor.add_argument("--device", default=None, help="auto, cpu, cuda or mps (local engine)")
    add_run_memory_flag(cor)
    cor.add_argument("--resume", action="store_true", help="continue the interrupted run in --out")
    cor.add_argument("--qk", action="store_true",
                     help="keep the queries and keys of a token sample (the query-key space page)")
    cor.add_argument("--index", action="store_true",
                     help="keep the sample's hidden states and build a nearest-context index per layer")
    cor.add_argument("--sample-cap", type=int, default=DEFAULT_CAP,
                     help="tokens in the sample for --qk/--index")
    cor.add_argument("--quiet", action="store_true", help="no progress bar")
    cor.add_argument("--out", required=True, help="the run folder (new, or an interrupted run with --resume)")


def _read_corpus(args: argparse.Namespace):
    from model_core.corpus.sources import (  # csv and friends: ~25 ms off --help
        read_hub_dataset,
        read_path,
    )

    if args.input.startswith("hf:"):
        return read_hub_dataset(args.input[3:], split=args.split, column=args.column, pair_column=args.pair_column,
                                limit=args.limit)
    return read_path(args.input, column=args.column, pair_column=args.pair_column, limit=args.limit)


def corpus_main(args: argparse.Namespace) -> int:
    """The ``corpus`` verb: read, run with a progress bar, print where the run is."""
    apply_run_memory_flag(args)
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.corpus import CorpusModel, RunOptions, run_corpus
    from model_core.models.memory import fixed_mmap_threshold

    fixed_mmap_threshold()  # a long run's peak memory stays that of its largest batch
    if custom_options_misused(args):
        return 2
    if args.limit is not None and args.limit < 1:
        print("error: --limit must be at least 1", file=sys.stderr)
        return 2
    bar = None
    try:
        corpus = _read_corpus(args)
        for note in corpus.notes:
            print(f"note: {note}", file=sys.stderr)
        model = CorpusModel.from_options(args.model, args.model_id, weights=args.weights, seed=args.seed,
                                         causal=args.causal, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                         hidden_size=args.hidden)
        sampling = args.qk or args.index
        options = RunOptions(batch_size=args.batch_size, chunk_size=args.shard_size, max_tokens=args.max_tokens,
                             long=args.long, sample_cap=args.sample_cap if sampling else 0, keep_qk=args.qk,
                             index=args.index)
        if not args.quiet:
            from tqdm import (
                tqdm,  # 20-40 ms to import: only a run that shows its bar pays it, not --help
            )

            bar = tqdm(total=len(corpus), unit="text", desc="corpus", dynamic_ncols=True)

        def progress(p) -> None:
            if bar is not None:
                bar.n = p.done
                bar.refresh()

        run = run_corpus(corpus, model, args.out, options=options, engine=args.engine, ray_address=args.ray_address,
                         resume=args.resume, device=args.device, progress=progress)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print(f"\ninterrupted: the finished shards are kept in {args.out}; run the same command with --resume "
              "to continue.", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # CorpusInputError, CorpusRunError, ModelLoadError are ValueErrors
        if bar is not None:
            bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if bar is not None:
        bar.close()
    counts, timings = run.manifest["counts"], run.manifest["timings"]
    print(f"wrote {run.path}: {counts['done']} texts ({counts['truncated']} truncated, {counts['skipped']} skipped), "
          f"{run.shape[0]} layers x {run.shape[1]} heads, {timings['seconds']:.1f} s"
          + (f", {timings['texts_per_s']:.1f} texts/s" if timings.get("texts_per_s") else ""))
    return 0
