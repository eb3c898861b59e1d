"""`cglib` command line: validate params, run the notebook series, regenerate figures, write a run's HTML report
or book, search hyper-parameters, download or write data.

Exit codes: 0 success, 1 a step failed (`report`: a notebook page could not be written; `book`: Sphinx missing;
`evaluate-model`: the model could not be loaded; `search`: no trial completed), 2 bad input (params, arguments, a
model spec, not a run directory, a run without executed notebooks for `report` or `book`, a folder holding a
user's files that a command would replace),
3 `run --strict`: the run finished but some item was skipped or failed (see the run summary),
4 `status`: the run was interrupted (status "running" but its runner process is gone on this host),
5 `status`: the run is still running.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cglib.cli_models import evaluate_model_command, search_command
from cglib.cli_outputs import (
    ablate_command,
    book_command,
    compare_protocols_command,
    figures_command,
    report_command,
)
from cglib.config import ParamsError, load_params, schema_table
from cglib.config.protocol import protocol_lines
from cglib.data.download import NAMED_DOWNLOADS, DownloadError, download_named, mirror_urls


def _validate(args: argparse.Namespace) -> int:
    params = load_params(args.params, check_paths=not args.no_check_paths)
    print(f"OK: {args.params} (profile {params.run.profile}, run '{params.run.name}')")
    print("\n".join(protocol_lines(params)))
    return 0


def _run(args: argparse.Namespace) -> int:
    from cglib.pipeline import (  # lazy: numpy; keeps cglib --help light
        NotebookFailed,
        default_notebook_dir,
        discover_notebooks,
        run_series,
        select_notebooks,
    )
    from cglib.run import RETRAIN_CHANGED_ENV  # lazy: numpy; keeps cglib --help light

    params = load_params(args.params, check_paths=not args.no_check_paths)
    notebooks_dir = Path(args.notebooks) if args.notebooks else default_notebook_dir()
    try:
        available = discover_notebooks(notebooks_dir)
        notebooks = select_notebooks(available, only=args.only.split(",") if args.only else None, start=args.start)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.out) if args.out else params.run_dir()
    if args.retrain_changed:  # the kernels inherit it: training reads it where it decides to reuse
        os.environ[RETRAIN_CHANGED_ENV] = "1"
    print(f"Run '{params.run.name}' -> {run_dir} ({len(notebooks)} notebooks)")
    try:
        results = run_series(params, Path(args.params), run_dir, notebooks, kernel=args.kernel, available=available)
    except NotebookFailed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        _print_summary(run_dir, file=sys.stderr)
        return 1
    total, cpu = sum(r.duration_s for r in results), sum(r.cpu_s or 0 for r in results)
    print(f"Finished {len(results)} notebooks in {total:.0f} s ({cpu:.0f} s CPU); manifest {run_dir / 'run.json'}")
    for r in results:
        print(f"  {r.name:28s} {r.duration_s:7.1f} s  {r.cpu_s or 0:7.1f} s CPU")
    lost = _print_summary(run_dir)
    if args.strict and lost:
        print(f"STRICT: {lost} items were skipped or failed (listed above); exit 3", file=sys.stderr)
        return 3
    return 0


def _print_summary(run_dir: Path, file=None) -> int:
    """Print the per-stage summary stored in run.json; returns the number of skipped or failed items."""
    from cglib.accounts import run_status, summary_lines  # lazy: numpy; keeps cglib --help light

    file = file or sys.stdout
    manifest = run_status(run_dir)
    stages = manifest.get("summary") or {}
    if stages:
        print("Summary (kept / skipped / failed per stage):", file=file)
        for line in summary_lines(stages):
            print(line, file=file)
    return int(manifest.get("skipped_or_failed") or 0)


STATUS_EXIT = {"ok": 0, "failed": 1, "interrupted": 4, "running": 5}


def _status(args: argparse.Namespace) -> int:
    from cglib.accounts import run_status, stage_summaries, summary_lines  # lazy: keeps cglib --help light
    from cglib.pipeline import resume_command  # lazy: numpy; keeps cglib --help light

    run_dir = Path(args.run_dir)
    try:
        manifest = run_status(run_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    status = manifest.get("status", "unknown")
    runner = manifest.get("runner") or {}
    where = f" (runner PID {runner['pid']} on {runner['host']})" if runner.get("pid") else ""
    print(f"{run_dir}: {status}{where}; started {manifest.get('started')}")
    for nb in manifest.get("notebooks", []):
        cpu = f" {nb['cpu_s']:8.1f} s CPU" if nb.get("cpu_s") is not None else ""  # absent before it was recorded
        print(f"  {nb['name']:28s} {nb['status']:8s} {nb['duration_s']:8.1f} s{cpu}" +
              (f"  {nb['error']}" if nb.get("error") else ""))
        for line in nb.get("raised") or []:  # cells allowed to raise (a student's exercise not yet done)
            print(f"      raised: {line}")
    # read the stages now, not run.json's summary: a search or a `python -m cglib.train` after the run is shown too
    scope = manifest.get("scope") or {}
    resume = resume_command(manifest.get("params_file", "PARAMS"), run_dir, **scope)
    for line in summary_lines(stage_summaries(run_dir, resume=resume)):
        print(line)
    if status == "interrupted":
        finished = {nb["name"][:2] for nb in manifest.get("notebooks", []) if nb.get("status") == "ok"}
        left = [n for n in scope.get("asked") or [] if n not in finished]
        if left:
            print(f"the runner is gone in notebook {left[0]}: resume with `{resume(left[0])}`")
        else:
            print(f"the runner is gone: resume with `cglib run {manifest.get('params_file', 'PARAMS')} --out "
                  f"{run_dir}` (add --from NN to skip finished notebooks)")
    return STATUS_EXIT.get(status, 1)


def _export_magic(args: argparse.Namespace) -> int:
    from cglib.magic.hf_export import card_head, export_magic  # lazy: faiss, pandas; keeps cglib --help light

    run_dir = Path(args.run_dir)
    if not (run_dir / "params.yaml").is_file():
        print(f"error: {run_dir} is not a run directory (no params.yaml); pass outputs/<run>", file=sys.stderr)
        return 2
    try:
        card = export_magic(run_dir, Path(args.dest))
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"MAGIC exported to {card.parent} (load it with datasets.load_dataset({str(card.parent)!r}))")
    print(card_head(card, lines=6))
    return 0


def _download(args: argparse.Namespace) -> int:
    urls = {}
    for pair in args.url or []:
        source, sep, url = pair.partition("=")
        if not sep or not source or not url:
            print(f"error: --url {pair}: write SOURCE=URL (a source of {args.name}: "
                  f"{', '.join(NAMED_DOWNLOADS[args.name].sources())})", file=sys.stderr)
            return 2
        urls[source] = url
    try:
        mirror_urls(args.name, urls)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        paths = download_named(args.name, Path(args.dest), urls=urls)
    except (DownloadError, ValueError) as exc:  # a bad or failed download, said in one line (the file is deleted)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def _synthetic_coco(args: argparse.Namespace) -> int:
    from cglib.data.coco_export import write_synthetic_coco  # lazy: numpy, PIL; keeps cglib --help light

    try:
        out = write_synthetic_coco(Path(args.dest), images_per_concept=args.images_per_concept, seed=args.seed,
                                   image_size=args.image_size, image_format=args.format,
                                   hierarcaps_per_concept=args.hierarcaps_per_concept)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out.n_images} images, {out.n_captions} captions under {args.dest}; point a profile at them with:")
    print("data:")
    for key, value in out.data_params().items():
        if value is not None:
            print(f"  {key}: {value}")
    return 0


def _params_table(args: argparse.Namespace) -> int:
    print("| key | type | default | meaning |\n|---|---|---|---|")
    for row in schema_table():
        cells = [f"`{row['key']}`", row["type"], f"`{row['default']}`", row["meaning"]]
        print("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return 0


def _student_version(args: argparse.Namespace) -> int:
    from cglib.course.student import (  # lazy: cglib.course loads torch
        SolutionMarkerError,
        write_student_version,
    )
    from cglib.pipeline import default_notebook_dir  # lazy: numpy; keeps cglib --help light

    notebooks = Path(args.notebooks) if args.notebooks else default_notebook_dir()
    try:
        done = write_student_version(notebooks, args.out, args.params, args.run_dir, force=args.force,
                                     update=args.update)
    except (SolutionMarkerError, FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Student version in {args.out}: {len(done.written)} notebooks written; solutions replaced by stubs in "
          f"{', '.join(p.name for p in done.with_exercises) or 'no notebook written now'}")
    if done.left:
        print(f"  left as they were: {', '.join(p.name for p in done.left)}")
    for backup in done.backups:
        print(f"  replaced, the earlier copy kept as {backup}")
    # a cell left as shipped gives way to the environment (cglib.run.notebook_run_paths): say so where it matters
    if args.params is None:
        print("  params_path left as shipped: the notebooks open $CGLIB_PARAMS when set, else the repository's "
              "params/demo.yaml")
    if args.run_dir is None:
        print("  run_dir left as shipped: the notebooks open $CGLIB_RUN_DIR when set, else the params' "
              "outputs/<run.name>")
    print(f"Open them in JupyterLab, or run them headless: cglib run {args.params or 'PARAMS'} --notebooks "
          f"{args.out}" + (f" --out {args.run_dir}" if args.run_dir else ""))
    return 0


def _link_run(args: argparse.Namespace) -> int:
    from cglib.run import link_run  # lazy: numpy; keeps cglib --help light

    try:
        record = link_run(args.shared_run, args.dest)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.dest}: a run folder over {record['shared']} ({record['linked_now']} files linked now, "
          f"{record['own_files_kept']} of its own kept). Open its notebooks with run_dir = {str(args.dest)!r}; "
          "what they write stays in it.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cglib", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a params file; exit 0 if valid, 2 with one line per problem")
    p.add_argument("params")
    p.add_argument("--no-check-paths", action="store_true", help="do not require input paths to exist yet")
    p.set_defaults(func=_validate)

    p = sub.add_parser("run", help="run the numbered notebooks headless with papermill")
    p.add_argument("params")
    p.add_argument("--only", help="comma-separated notebook numbers, e.g. 03,05")
    p.add_argument("--from", dest="start", help="start at this notebook number, e.g. 03")
    p.add_argument("--out", help="run directory (default: <run.output_dir>/<run.name>)")
    p.add_argument("--kernel", default="cglib", help="Jupyter kernel name (registered for this Python if missing)")
    p.add_argument("--notebooks", help="notebook folder (default: the repository's notebooks/, the solution "
                   "version); a student's folder from `cglib student-version` runs their own notebooks")
    p.add_argument("--no-check-paths", action="store_true")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when any item was skipped or failed in any stage (see the summary printed at the end)")
    p.add_argument("--retrain-changed", action="store_true",
                   help="train again the runs (and bases) that other library code trained; by default they are "
                   "reused, and each is named on the terminal with the commit that trained it")
    p.set_defaults(func=_run)

    p = sub.add_parser("status", help="a run's status (ok, failed, running, or interrupted when its runner is "
                       "gone), notebooks and per-stage summary; exit 0 ok, 1 failed, 2 not a run, 4 interrupted, "
                       "5 running")
    p.add_argument("run_dir")
    p.set_defaults(func=_status)

    p = sub.add_parser("figures", help="rebuild every figure of a finished run without retraining")
    p.add_argument("run_dir")
    p.add_argument("--formats", help="comma-separated, e.g. png,pdf (default: viz.formats of the run)")
    p.add_argument("--from-data", action="store_true",
                   help="redraw each figure from its saved data alone (figures/<stem>.csv, .npz, .figure.json): no "
                   "model, result or params file is read; RUN_DIR may also be a folder holding only those files")
    p.set_defaults(func=figures_command)

    p = sub.add_parser("compare-protocols", help="what the training corrections change: Table 3 of two finished "
                       "runs of one params file, trained corrected and as published (run.protocol), cell by cell "
                       "with paired CIs; where `cglib ablate` ran on the twins, also which key moves which cell "
                       "(key_effects.csv/.md/.png); exit 0 written, 2 the folders are not such twins")
    p.add_argument("corrected_run", help="the run folder trained with run.protocol: corrected")
    p.add_argument("published_run", help="the run folder trained with run.protocol: as_published")
    p.add_argument("--out", help="folder for training_changes.csv/.md and key_effects.* (default: "
                   "CORRECTED_RUN/evaluation)")
    p.set_defaults(func=compare_protocols_command)

    p = sub.add_parser("ablate", help="one protocol key at a time: train named rows of a finished run again with "
                       "only one key flipped to the other protocol's value (rows the flip leaves unchanged are "
                       "reused), score each against the run's own row per Table 3 column (paired CIs, Holm over "
                       "every cell); writes RUN/ablation/ablation.csv/.md and RUN/figures/ablation.png/.pdf; exit 0 "
                       "written, 2 a bad row or key, or a run not trained and evaluated with these params")
    p.add_argument("params", help="the params file of the finished run")
    p.add_argument("--rows", required=True, help="comma-separated train.runs names, e.g. clip,centroid_pretrain")
    p.add_argument("--keys", help="comma-separated protocol keys (default: every key whose flip changes a named "
                   "row, except those the params file sets itself); `cglib params` and the guide's page 'Paper "
                   "fidelity' list them")
    p.add_argument("--run-dir", help="the run folder (default: <run.output_dir>/<run.name>)")
    p.add_argument("--dry-run", action="store_true", help="print which keys flip and how many row trainings they "
                   "need, from the params alone, and stop (no run needed)")
    p.add_argument("--retrain-changed", action="store_true",
                   help="train again the flipped rows that other library code trained (as `cglib run`)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=ablate_command)

    p = sub.add_parser("report", help="a run's executed notebooks as a static HTML report (index with Table 3, "
                       "Table 1 and Fig. 4, one page per notebook, figures embedded); exit 0 ok (missing pieces "
                       "are listed on the index), 1 a page could not be written, 2 not a run directory, no executed "
                       "notebook, or an --out folder holding files an earlier report did not write")
    p.add_argument("run_dir")
    p.add_argument("--out", help="report folder (default: RUN_DIR/report); open its index.html")
    p.set_defaults(func=report_command)

    p = sub.add_parser("book", help="a run as a book: its executed notebooks, the guide and a glossary as a static "
                       "site with navigation and search, built offline; exit 0 built, 1 Sphinx or MyST-NB missing "
                       "(install the book extra) or the guide's pages not found, 2 not a run directory, no executed "
                       "notebook, or an --out folder holding files an earlier book did not write")
    p.add_argument("run_dir")
    p.add_argument("--out", help="book folder (default: RUN_DIR/book); open its index.html")
    p.set_defaults(func=book_command)

    p = sub.add_parser("evaluate-model", help="score one more model (e.g. OpenAI's CLIP) on a finished run's MAGIC "
                       "items next to its zero-shot model, without training; writes RUN/evaluation/models/NAME/ "
                       "and prints its Table 3 row; exit 0 ok, 1 the model could not be loaded, 2 bad params or "
                       "spec, or not a run folder")
    p.add_argument("params")
    p.add_argument("--model", required=True, help="a YAML mapping of model-section keys, e.g. '{name: ViT-B-32, "
                   "pretrained: openai}', or a checkpoint path (the run's architecture)")
    p.add_argument("--name", help="row name (default: from the spec, e.g. ViT-B-32-openai)")
    p.add_argument("--run-dir", help="the run folder (default: <run.output_dir>/<run.name>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=evaluate_model_command)

    p = sub.add_parser("search", help="Bayesian hyper-parameter search (Optuna TPE, median pruning) over the paper's "
                       "Table 2 ranges (search section of the params) for one train.runs entry, maximizing forced-"
                       "choice accuracy on a validation slice of MAGIC train (the test split is never read); resumes "
                       "a study in search.storage; writes RUN/search/STUDY/best_params.yaml; exit 0 ok, 1 no trial "
                       "completed, 2 bad params, no MAGIC yet or a storage that cannot open (its driver, its server)")
    p.add_argument("params")
    p.add_argument("--trials", type=int, help="finished trials the study should hold (default: search.trials); a "
                   "rerun tops it up")
    p.add_argument("--run-dir", help="the run folder with MAGIC built (default: <run.output_dir>/<run.name>)")
    p.add_argument("--no-check-paths", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=search_command)

    p = sub.add_parser("export-magic", help="write a run's MAGIC in the Hugging Face datasets layout (Parquet "
                       "splits, a nodes table, a dataset card) for datasets.load_dataset or the Hub; exit 0 ok, 2 not "
                       "a run folder or a bad magic.json")
    p.add_argument("run_dir", help="a run folder with magic/magic.json (notebook 03 has run)")
    p.add_argument("dest", help="the export folder (new or an earlier export)")
    p.set_defaults(func=_export_magic)

    p = sub.add_parser("download", help="download public data (needs the internet or a mirror), each file verified "
                       "(size, checksum, archive members) before it is moved into place; exit 0 ok, 1 a failed or "
                       "bad download (deleted, said in one line), 2 a bad --url: "
                       + "; ".join(f"{k}: {v.description}" for k, v in NAMED_DOWNLOADS.items()))
    p.add_argument("name", choices=sorted(NAMED_DOWNLOADS))
    p.add_argument("--dest", required=True)
    p.add_argument("--url", action="append", metavar="SOURCE=URL", help="fetch a source from a mirror or an offline "
                   "copy (a URL, a path or file://), verified as the original; also the environment variable "
                   "CGLIB_URL_<SOURCE> (upper case, - as _). Sources: " + ", ".join(
                       dict.fromkeys(s for entry in NAMED_DOWNLOADS.values() for s in entry.sources())))
    p.set_defaults(func=_download)

    p = sub.add_parser("synthetic-coco", help="write the synthetic world as COCO-format files (captions JSON + "
                       "images) and a HierarCaps-format CSV of unseen scenes, for COCO-path runs without COCO")
    p.add_argument("--dest", required=True, help="output folder (annotations/, images/, hierarcaps/)")
    p.add_argument("--images-per-concept", type=int, default=6, help="images per l1 concept (52 concepts)")
    p.add_argument("--seed", type=int, default=0, help="world seed (the HierarCaps scenes use seed + 1)")
    p.add_argument("--image-size", type=int, default=64, help="rendered image side in pixels")
    p.add_argument("--format", choices=("png", "jpg"), default="png", help="image file format (png is lossless)")
    p.add_argument("--hierarcaps-per-concept", type=int, default=2, help="HierarCaps-format images per concept "
                   "(0: none)")
    p.set_defaults(func=_synthetic_coco)

    p = sub.add_parser("student-version", help="the notebooks with every exercise's solution replaced by a stub "
                       "(code raises NotImplementedError, answers read YOUR ANSWER HERE), for students; `cglib run "
                       "PARAMS --notebooks OUT` runs them headless (an exercise not yet done raises, the run goes on); "
                       "never replaces a student's edited notebook without --force (exit 2 naming them)")
    p.add_argument("--out", default="outputs/student", help="folder for the student notebooks (default: "
                   "outputs/student)")
    p.add_argument("--notebooks", help="notebook folder (default: the repository's notebooks/)")
    p.add_argument("--params", help="the params file the notebooks' parameters cells name, written relative to "
                   "--out (default: the cells as shipped, which read $CGLIB_PARAMS when set, else the repository's "
                   "params/demo.yaml)")
    p.add_argument("--run-dir", help="the run folder the notebooks' parameters cells name, e.g. a folder made by "
                   "`cglib link-run` over the class's run (default: $CGLIB_RUN_DIR when set, else the params' "
                   "outputs/<run.name>)")
    p.add_argument("--update", action="store_true", help="write only the notebooks absent from --out (by "
                   "default a folder holding any that differ from the student version is refused: they may hold a "
                   "student's work)")
    p.add_argument("--force", action="store_true", help="replace the notebooks in --out, keeping each old "
                   "one as NAME.ipynb.bak")
    p.set_defaults(func=_student_version)

    p = sub.add_parser("link-run", help="a run folder of your own over a finished (e.g. a class's read-only) run: "
                       "its files linked, what your notebooks write kept in your folder")
    p.add_argument("shared_run", help="the finished run folder to read (never changed)")
    p.add_argument("dest", help="your run folder (made, or updated with what the shared run has gained)")
    p.set_defaults(func=_link_run)

    p = sub.add_parser("params", help="print every params key with its type, default and meaning (markdown)")
    p.set_defaults(func=_params_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ParamsError as exc:
        target = getattr(args, "params", "")
        print(f"error: invalid params {target}:\n  " + str(exc).replace("\n", "\n  "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
