"""The ``atlas`` verb: ``python -m model_core atlas --model ... --corpus FILE|demo|hf:DATASET --out DIR
[--engine ray]`` scans a corpus into a head atlas folder (a rerun continues an interrupted one), and
``atlas --show DIR --head L.H [--json]`` prints one head's card; with ``--json`` stdout holds exactly one JSON object
{"layer", "head", "summary", "top_contexts", "top_contexts_no_sink", "deciles", "profile", "qk", "copying_score",
"promoted_tokens", "roles", "composition"}."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.atlas.picks import PICKS
from model_core.cli.options import MODEL_CHOICES, add_encoder_shape_options, print_error
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag


def add_atlas_parser(sub: Any) -> None:
    """Add the ``atlas`` verb to the command line's subparsers."""
    p = sub.add_parser("atlas", help="a head atlas: what every head does across a corpus, each head on one card",
                       description="Scan a corpus into an atlas folder (top contexts, profile, QK split, what each "
                                   "head writes, roles, composition, a one-line summary per head), or --show one "
                                   "head's card. An interrupted atlas keeps its finished shards; the same command "
                                   "continues it.")
    p.add_argument("--show", metavar="DIR", default=None, help="print a head's card from this atlas folder")
    p.add_argument("--head", metavar="L.H", default=None, help="--show: the head, layer.head (e.g. 3.1)")
    p.add_argument("--json", action="store_true", help="--show: print the card as one JSON object")
    p.add_argument("--model", default=None,
                   help=f"{', '.join(MODEL_CHOICES)}, or a model id (then pretrained), e.g. "
                        "bundled:SmolLM2-135M-Instruct")
    p.add_argument("--model-id", default=None, help="with --model pretrained: hub id, folder or bundled id")
    p.add_argument("--weights", choices=["random", "pretrained"], default="random", help="custom encoder only")
    p.add_argument("--seed", type=int, default=0, help="custom encoder only")
    p.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    add_encoder_shape_options(p)
    p.add_argument("--corpus", default=None,
                   help="a .txt (one text per line), .csv, .tsv or .jsonl file; 'demo'; or hf:DATASET_ID")
    p.add_argument("--column", default=None, help="text column of a table (default: text, or the first column)")
    p.add_argument("--pair-column", default=None, help="optional column with sentence B")
    p.add_argument("--split", default="train", help="hf: corpora only: the split")
    p.add_argument("--limit", type=int, default=None, help="run at most N texts")
    p.add_argument("--out", default=None, help="the atlas folder (new, or an interrupted atlas of the same run)")
    p.add_argument("--max-tokens", type=int, default=4096, help="longest text in tokens (longer: --long); from 513 "
                   "tokens a text is scanned alone through the compact pass, and its contexts are not QK-split")
    p.add_argument("--long", choices=["truncate", "skip"], default="truncate")
    p.add_argument("--batch-size", type=int, default=32, help="texts per batch")
    p.add_argument("--shard-size", type=int, default=128, help="texts per shard: the unit of resume and of a Ray task")
    p.add_argument("--qk-contexts", type=int, default=3,
                   help="top contexts per head for the QK split and the direct logit effect (0: neither)")
    p.add_argument("--qk-pick", choices=PICKS, default="auto",
                   help="which: the head's first contexts; or its first and others of its top K chosen so that few "
                        "texts serve every head (2.6x fewer passes over 1,000 texts); auto (default): first unless "
                        "those name more than 200 texts. Each card lists the ranks it split")
    p.add_argument("--circuit", default=None, metavar="FILE",
                   help="a `circuit --json` output of the same model: each head's node score")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--ray-address", default=None, help="a Ray cluster's address (default: start a local Ray)")
    p.add_argument("--device", default=None, help="auto, cpu, cuda or mps (local engine)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch's CPU threads (default: torch's; 1 is faster on a machine other processes share: the "
                        "atlas runs many small operations whose threads otherwise wait for each other)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_run_memory_flag(p)


def _head(text: str | None) -> tuple[int, int]:
    try:
        layer, head = (int(x) for x in (text or "").split("."))
    except ValueError:
        raise ValueError(f"--head takes layer.head, e.g. --head 3.1, not {text!r}.") from None
    return layer, head


def _show(args: argparse.Namespace) -> int:
    from model_core.atlas.store import open_atlas  # numpy and json only: no model is loaded to show a card

    try:
        layer, head = _head(args.head)
        card = open_atlas(args.show).show(layer, head)
    except ValueError as exc:  # AtlasRunError is a ValueError
        return print_error(exc)
    if args.json:
        print(json.dumps(card, ensure_ascii=False))
        return 0
    print(f"L{layer}H{head}: {card['summary']}")
    print("profile: " + ", ".join(f"{k} {v:.3f}" for k, v in card["profile"].items() if v is not None))
    for c in card["top_contexts_no_sink"][:5]:
        text = "".join(f"[{t}]" if p in (c["query"], c["key"]) else t for p, t in c["snippet"])
        print(f"  {c['weight']:.3f}  text {c['text_id']}  q{c['query']}→k{c['key']}  {text!r}")
    if card["qk"]:
        for side in ("query_side", "key_side"):
            print(f"{side.replace('_', ' ')}: " + ", ".join(f"{n} {s:.0%}" if s is not None else n
                                                           for n, s in card["qk"][side]))
    if card["copying_score"] is None:
        print("writes: this model has no unembedding (an encoder): no copying score, no promoted tokens")
    else:
        print(f"copying score {card['copying_score']:.3f}; promotes "
              + ", ".join(repr(t) for t, _ in (card["promoted_tokens"] or [])[:5]))
    return 0


def _model(args: argparse.Namespace):
    from model_core.corpus import CorpusModel  # the model's stack loads when the verb runs, not for --help

    kind = args.model
    if kind in MODEL_CHOICES:
        if kind != "custom" and (args.causal or args.weights != "random"):
            raise ValueError("--causal and --weights apply to --model custom only.")
        return CorpusModel.from_options(kind, args.model_id, weights=args.weights, seed=args.seed, causal=args.causal,
                                        num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                        hidden_size=args.hidden)
    return CorpusModel.from_options("pretrained", kind)


def _corpus(args: argparse.Namespace):
    from model_core.corpus.sources import (  # csv and friends: kept off --help
        demo_corpus,
        read_hub_dataset,
        read_path,
    )

    if args.corpus == "demo":
        return demo_corpus(limit=args.limit)
    if args.corpus.startswith("hf:"):
        return read_hub_dataset(args.corpus[3:], split=args.split, column=args.column, pair_column=args.pair_column,
                                limit=args.limit)
    return read_path(args.corpus, column=args.column, pair_column=args.pair_column, limit=args.limit)


def atlas_main(args: argparse.Namespace) -> int:
    """The ``atlas`` verb: show a card, or run (and continue) an atlas with a progress bar."""
    if args.show is not None:
        return _show(args)
    missing = [name for name in ("model", "corpus", "out") if getattr(args, name) is None]
    if missing:
        print("error: an atlas run needs " + ", ".join(f"--{m}" for m in missing) + " (or --show DIR --head L.H to "
              "read one)", file=sys.stderr)
        return 2
    if args.limit is not None and args.limit < 1:
        print("error: --limit must be at least 1", file=sys.stderr)
        return 2
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.atlas.run import AtlasOptions, run_atlas
    from model_core.models.memory import fixed_mmap_threshold

    fixed_mmap_threshold()
    apply_run_memory_flag(args)
    if args.threads is not None:
        import torch  # loaded by the run anyway; the thread count is set before the model loads

        torch.set_num_threads(max(1, args.threads))
    bar = None
    try:
        corpus = _corpus(args)
        for note in corpus.notes:
            print(f"note: {note}", file=sys.stderr)
        options = AtlasOptions(batch_size=args.batch_size, chunk_size=args.shard_size, max_tokens=args.max_tokens,
                               long=args.long, qk_contexts=args.qk_contexts,
                               qk_pick=args.qk_pick)
        model = _model(args)
        if not args.quiet:
            from tqdm import tqdm  # 20-40 ms to import: only a run that shows its bar pays it

            bar = tqdm(total=len(corpus), unit="text", desc="scan", dynamic_ncols=True)

        shown = {"stage": "scan", "total": len(corpus)}

        def progress(p) -> None:
            if bar is not None:
                if (shown["stage"], shown["total"]) != (p.stage, p.total):  # tqdm's own desc gains a ": "
                    shown.update(stage=p.stage, total=p.total)
                    bar.set_description(p.stage)
                    bar.reset(total=p.total or None)
                if bar.n != p.done:
                    bar.n = p.done
                    bar.refresh()

        run = run_atlas(corpus, model, args.out, options=options, engine=args.engine, device=args.device,
                        ray_address=args.ray_address, circuit=args.circuit, progress=progress)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print(f"\ninterrupted: the finished shards are kept in {args.out}; run the same command to continue.",
              file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # CorpusInputError, AtlasRunError, ModelLoadError are ValueErrors
        if bar is not None:
            bar.close()
        return print_error(exc)
    if bar is not None:
        bar.close()
    n_layers, n_heads = run.shape
    timings = run.manifest["timings"]
    print(f"wrote {run.path}: {run.manifest['corpus']['n_texts']} texts, {n_layers} layers x {n_heads} heads, "
          f"scan {timings.get('scan_s', 0):.1f} s, cards {timings.get('cards_s', 0):.1f} s")
    return 0
