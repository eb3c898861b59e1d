"""The terminal lines of the run accounts (`cglib.accounts.stage_summaries`): what `cglib run` prints at its end
and `cglib status` prints at any time, one block per stage (kept, skipped and failed by reason, then the stage's
own account: the LLM's requests and spend, an unfinished attempt, the preparation, training per run and seed, the
search's trials).
"""

from __future__ import annotations


def _llm_lines(s: dict) -> list[str]:
    """The LLM stage's account, its stop, its rebuilt cache and the files another attempt left."""
    pad = " " * 15
    lines = _unfinished_lines(s)
    a = s.get("llm")
    if a is None:
        return lines or [pad + "LLM: no account (summary.json written by an older cglib; run the stage again)"]
    failed = ", ".join(f"{k}: {v}" for k, v in a["failed_by_reason"].items())
    retries = ", ".join(f"{k}: {v}" for k, v in a["requests"]["retries_by_reason"].items())
    cost = a["cost_usd"]
    line = (f"{pad}LLM: {a['items']} items = {a['cached']} cached + {a['cached_failures']} cached failures + "
            f"{a['answered']} answered + {a['failed']} failed" + (f" ({failed})" if failed else "")
            + f" + {a['never_asked']} never asked + {a['not_needed']} not needed after a failed level"
            + ("" if a["adds_up"] else " (DOES NOT ADD UP)")
            + f"; {a['requests']['http']} requests ({a['requests']['retries']} retries"
            + (f": {retries}" if retries else "") + f"); ${cost['spent']:.4f} spent"
            + (f" (estimated ${cost['estimated']:.4f})" if cost["estimated"] is not None else ""))
    lines.append(line)
    if a["status"] != "complete":
        cached = a["cached"] + a["cached_failures"]
        asked = cached + a["answered"] + a["failed"]
        lines.append(f"{pad}stopped ({a['stopped_by']}): {asked} of {a['items']} asked ({cached} from the cache), "
                     f"{a['never_asked']} never asked, ${cost['spent']:.4f} spent"
                     + (f"; resume with: {s['resume']}" if s.get("resume") else ""))
        if s.get("stop_error"):
            lines.append(f"{pad}why: {s['stop_error']}")
    if s.get("cache_rebuilt"):
        from cglib.llm.cache import rebuilt_message  # lazy: only a run whose cache was rebuilt needs it

        lines.append(f"{pad}cache rebuilt: {rebuilt_message(s['cache_rebuilt'])}")
    for name, w in (s.get("other_files") or {}).items():
        chains = f", {w['chains']} chains" if w.get("chains") is not None else ""
        lines.append(f"{pad}{name} on disk is from another attempt (started {w['started']}, {w['status']}{chains}); "
                     "not part of this attempt's account")
    return lines


def _unfinished_lines(s: dict) -> list[str]:
    """An attempt of the stage killed (or still running) after its last account: what it recorded as it went,
    and the answers in the cache now (a resume takes them from there)."""
    u = s.get("unfinished_attempt")
    if not u:
        return []
    pad = " " * 15
    p = u["progress"]
    got = (f"{p.get('answered', 0)} answered + {p.get('failed', 0)} failed + {p.get('cached', 0)} from the cache, "
           f"{p.get('requests', 0)} requests, ${p.get('spent_usd', 0):.4f} spent")
    cached = "" if u["cached_answers"] is None else f"; {u['cached_answers']} answers cached now"
    if u["status"] == "running":
        return [f"{pad}attempt started {u['started']} still running: so far {got}{cached}"]
    return [f"{pad}attempt started {u['started']} interrupted (its process is gone): before it stopped {got}{cached}"
            + (f"; resume with: {s['resume']}" if s.get("resume") else "")]


def summary_lines(stages: dict[str, dict]) -> list[str]:
    """Terminal lines per stage: kept, skipped by reason, failed by reason; for the LLM stage its account; a
    stage whose files come from an earlier run says so."""
    def reasons(counts: dict[str, int]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in counts.items()) if counts else ""

    lines = []
    for stage, s in stages.items():
        skipped, failed = sum(s["skipped"].values()), sum(s["failed"].values())
        line = f"  {stage:12s} kept {s['kept']} {s['unit']}; skipped {skipped}"
        line += f" ({reasons(s['skipped'])})" if skipped else ""
        line += f"; failed {failed}" + (f" ({reasons(s['failed'])})" if failed else "")
        earlier = s.get("earlier_run")
        if earlier:
            line += (f" [from an earlier run: written {earlier['written']}, before {earlier['before']} ran again "
                     f"at {earlier['before_ran']}]")
        lines.append(line)
        if stage in ("abstraction", "generalize"):
            lines += _llm_lines(s)
        elif stage == "prepare":
            lines += _prepare_lines(s["account"])
        elif stage == "training":
            lines += _training_lines(s)
        elif stage.startswith("search "):
            from cglib.search.study import account_line  # lazy: optuna, only for a run that searched

            lines.append(" " * 15 + account_line(s["trials"]))
    return lines


def _prepare_lines(a: dict) -> list[str]:
    """What the preparation built now and found built, its groups, RE items and base corpus, and its seconds."""
    pad = " " * 15
    lines = [f"{pad}built now: {'; '.join(a.get('built') or []) or 'nothing'}",
             f"{pad}found built: {'; '.join(a.get('reused') or []) or 'nothing'}"]
    groups = a.get("groups") or {}
    if groups:
        lines.append(pad + "groups: " + "; ".join(f"{g} {v['l1_groups']} l1 groups over {v['images']} images"
                                                  for g, v in groups.items()))
    if a.get("re_items"):
        lines.append(pad + "RE items: " + "; ".join(f"{name} {v['items']} ({v['data']})"
                                                    for name, v in a["re_items"].items()))
    base = a.get("base") or {}
    if base.get("needed_for_seeds") and "images" in base:
        lines.append(f"{pad}base corpus: {base['corpus']}, {base['images']} images, for training seeds "
                     f"{base['needed_for_seeds']}")
    lines.append(f"{pad}{a.get('wall_s')} s wall, {a.get('cpu_s')} s CPU")
    return lines


def _training_lines(s: dict) -> list[str]:
    """Per run and training seed, steps and epochs kept from a checkpoint plus trained now (and repeated after a
    kill); per image size, the image cache's account; the runs still waiting on a checkpoint."""
    pad = " " * 15
    lines = []
    for label, a in s["runs"].items():
        if not a:
            lines.append(f"{pad}{label}: no account (summary.json written by an older cglib; train it again)")
            continue
        steps, epochs = a["steps"], a["epochs"]
        if a.get("reused_from"):
            lines.append(f"{pad}{label}: reused, 0 steps trained now (its {steps['total']} steps and "
                         f"{epochs['total']} epochs were trained by an earlier attempt, finished {a['reused_from']})")
            continue
        lines.append(f"{pad}{label}: {steps['total']} steps = {steps['kept']} kept from a checkpoint + "
                     f"{steps['trained_now']} trained now ({steps['repeated']} of them repeated after an "
                     f"interruption); {epochs['total']} epochs = {epochs['kept']} kept + {epochs['trained_now']} "
                     "trained now" + ("" if a["adds_up"] else " (DOES NOT ADD UP)"))
    for size, c in s["image_cache"].items():
        reasons = ", ".join(f"{k}: {v}" for k, v in c["skipped_by_reason"].items())
        lines.append(f"{pad}image cache {size}: {c['images']} images = {c['from_earlier_build']} from an earlier "
                     f"build + {c['built_now']} built now + {c['skipped']} skipped" + (f" ({reasons})" if reasons
                                                                                       else "")
                     + ("" if c["adds_up"] else " (DOES NOT ADD UP)"))
    for label in s.get("interrupted", []):
        lines.append(f"{pad}{label}: interrupted, its checkpoint waits"
                     + (f"; resume with: {s['resume']}" if s.get("resume") else ""))
    for label, why in (s.get("failed_runs") or {}).items():
        lines.append(f"{pad}{label}: FAILED, no model: {why}")
    if s.get("untrained"):
        lines.append(f"{pad}not trained (training stopped before them): {', '.join(s['untrained'])}")
    if s.get("not_in_params"):
        lines.append(f"{pad}also in this folder, not in these params: {len(s['not_in_params'])} "
                     f"({', '.join(s['not_in_params'])}); not counted above")
    return lines
