"""Which code a search study's trials ran: recorded when the study starts, checked when a worker resumes it."""

from __future__ import annotations

from typing import Any

import optuna

from cglib.code_identity import library_digest
from cglib.config import Params
from cglib.run import git_commit, other_code
from cglib.train.inputs import code_digests, run_entry


def study_code(params: Params) -> dict[str, Any]:
    """The code a study's trials train and score with: the digests of the tuned run's own objective and callbacks
    (cglib.train.inputs.code_digests; None where unreadable) and the library's (with its commit)."""
    entry = run_entry(params, params.search_run())
    return {"outside": {key: d.digest for key, d in code_digests(params, entry).items()},
            "cglib_source": library_digest(), "git_commit": git_commit()}


def check_study_code(study: optuna.Study, params: Params) -> None:
    """Record the code of a new study's trials; on a study that holds trials, refuse to add trials of another
    version of the tuned objective or callbacks (or of code whose source cannot be read): their scores would be
    ranked with those of other code. Trials of other library code are kept and named on the terminal."""
    current, recorded = study_code(params), study.user_attrs.get("code")
    trials = len(study.get_trials(deepcopy=False))
    outside = (recorded or {}).get("outside", {})  # a study of an older cglib recorded none: library code only
    if trials and (outside != current["outside"] or None in current["outside"].values()):
        why = ("was run with code whose source cannot be read" if None in current["outside"].values() else
               "trained another version of the tuned run's objective or callbacks")
        raise ValueError(f"study {study.study_name!r} holds {trials} trials and {why}; its scores are not this "
                         f"code's. Start a new study (set search.study_name) or delete the old one's storage")
    if not trials:
        study.set_user_attr("code", current)
        return
    other = other_code(recorded)
    if other is not None:
        print(f"study {study.study_name!r}: its {trials} trials so far were run by {other}, whose library code "
              "differs from this one's; their scores are kept (set search.study_name for a new study)")
