"""Exercises for teaching with the notebooks: checks that compare a student's answer with the library, and the
student version of the notebooks (solutions removed).

A check runs the student's function and the library's on several seeded cases and, on a mismatch, raises
`CheckFailed` with a message that says what differs (which term, which node, which shape, by how much). The
practice seeds are the default; `GRADING_SEEDS` are other seeds, for grading (run the same check with
`seeds=GRADING_SEEDS`).
"""

from cglib.course.feedback import GRADING_SEEDS, PRACTICE_SEEDS, CheckFailed

__all__ = ["GRADING_SEEDS", "PRACTICE_SEEDS", "CheckFailed"]
