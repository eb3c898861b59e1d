"""`cglib` commands that turn a finished run into outputs: figures (rebuilt, or redrawn from their saved data), the
protocol comparison, the one-key-at-a-time ablation, the static HTML report and the book. Their heavy imports stay
inside the handlers, so `cglib --help` and `cglib validate` stay light."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _figures_from_data(run_dir: Path, formats: str | None) -> int:
    from cglib.viz.figures import replot_figures  # lazy: matplotlib

    figures = run_dir / "figures" if (run_dir / "figures").is_dir() else run_dir
    try:
        report = replot_figures(figures, formats=formats.split(",") if formats else ("png", "pdf"))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(report.written)} figure files written under {figures}")
    return 1 if report.failed else 0


def figures_command(args: argparse.Namespace) -> int:
    from cglib.viz.figures import FigureFailures, regenerate_figures  # lazy: torch; keeps cglib --help light

    run_dir = Path(args.run_dir)
    if args.from_data:
        return _figures_from_data(run_dir, args.formats)
    if not (run_dir / "params.yaml").is_file():
        print(f"error: {run_dir} is not a run directory (no params.yaml); pass outputs/<run>", file=sys.stderr)
        return 2
    try:
        written = regenerate_figures(run_dir, formats=args.formats.split(",") if args.formats else None)
    except FigureFailures as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"{len(written)} figure files written under {run_dir / 'figures'}")
    return 0


def compare_protocols_command(args: argparse.Namespace) -> int:
    import matplotlib.pyplot as plt  # lazy: keeps cglib --help light

    from cglib.evaluate.key_effects import (  # lazy: pandas
        KEY_EFFECTS_STEM,
        twin_key_effects,
        write_key_effects,
    )
    from cglib.evaluate.training_changes import write_training_changes  # lazy: pandas
    from cglib.viz.key_effects import plot_key_effects  # lazy: matplotlib
    from cglib.viz.style import apply_style, save_figure  # lazy: matplotlib

    try:
        changes, paths = write_training_changes(args.corrected_run, args.published_run, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(paths["md"].read_text(encoding="utf-8"))
    print(f"{len(changes)} cells, {int(changes['significant'].sum())} significant after Holm; written to "
          f"{paths['csv']} and {paths['md']}")
    effects = twin_key_effects(args.corrected_run, args.published_run, changes)
    if effects.empty:
        print("no one-key ablation in either run (`cglib ablate PARAMS --rows ...` on each twin adds the table of "
              "which key moves which cell)")
        return 0
    written = write_key_effects(effects, paths["md"].parent, Path(args.corrected_run).name,
                                Path(args.published_run).name)
    apply_style()
    figure = plot_key_effects(effects, "Which key moves which cell")
    written_figures = save_figure(figure, paths["md"].parent, KEY_EFFECTS_STEM, ("png", "pdf"))
    plt.close(figure)
    print(written["md"].read_text(encoding="utf-8"))
    print("written to " + ", ".join(str(p) for p in [*written.values(), *written_figures]))
    return 0


def ablate_command(args: argparse.Namespace) -> int:
    from cglib.ablate import ablate, plan_ablation  # lazy: torch; keeps cglib --help light
    from cglib.run import RETRAIN_CHANGED_ENV  # lazy: numpy; keeps cglib --help light

    rows = [r for r in args.rows.split(",") if r]
    keys = [k for k in args.keys.split(",") if k] if args.keys else None
    try:
        if args.dry_run:
            print("\n".join(plan_ablation(args.params, rows, keys, check_paths=False).lines()))
            return 0
        if args.retrain_changed:  # training reads it where it decides to reuse
            os.environ[RETRAIN_CHANGED_ENV] = "1"
        result = ablate(args.params, rows, keys, args.run_dir, progress=not args.quiet)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.paths["md"].read_text(encoding="utf-8"))
    tested = int(result.cells["p_value"].notna().sum())
    print(f"{result.plan.trainings} row trainings ({result.trained_now} by this call), {result.plan.reused} reused; "
          f"{tested} tested cells, {int(result.cells['significant'].sum())} significant after Holm; written to "
          + ", ".join(str(p) for p in result.paths.values()))
    return 0


def report_command(args: argparse.Namespace) -> int:
    from cglib.executed_notebooks import NotARunDirectory  # lazy: nbformat; keeps cglib --help light
    from cglib.report import build_report  # lazy: torch (through cglib.evaluate); keeps cglib --help light

    try:
        report = build_report(Path(args.run_dir), Path(args.out) if args.out else None, need_notebooks=True)
    except (NotARunDirectory, FileExistsError) as exc:  # FileExistsError: --out holds files of someone else
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {report.index} ({len(report.pages)} notebook pages)")
    for name, why in report.missing.items():
        print(f"  not included: {name}: {why}")
    for name, why in report.failed.items():
        print(f"FAILED page {name}: {why}", file=sys.stderr)
    return 1 if report.failed else 0


def book_command(args: argparse.Namespace) -> int:
    from cglib.book import BookDependencyMissing, build_book  # lazy: Sphinx is slow to import
    from cglib.executed_notebooks import NotARunDirectory  # lazy: nbformat; keeps cglib --help light

    try:
        book = build_book(Path(args.run_dir), Path(args.out) if args.out else None, need_notebooks=True)
    except (NotARunDirectory, FileExistsError) as exc:  # FileExistsError: --out holds files of someone else
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BookDependencyMissing, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"book: {book.index} ({len(book.notebooks)} notebook pages, {book.seconds:.0f} s)")
    for line in book.warnings:
        print(f"  {line}")
    return 0
