"""nbgrader course directory of minimind-course: run every nbgrader command from notebooks/.

source/  generated from lessons/*.py by `python -m course release` (not committed: holds solutions)
release/ generated student notebooks (committed; a test checks they are up to date)
submitted/, autograded/, feedback/, gradebook.db: the instructor's grading state (not committed)
"""
c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.course_id = "minimind-course"
# Figures the experiments save next to a notebook are outputs, not part of an assignment.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "figures"]
# Per-cell limit. The slowest cell (train_one_epoch against the oracle: 12 tiny runs) takes ~2 s alone
# and ~15 s on a busy 2-core machine; 300 s leaves room for slow student code without letting a
# hanging cell stall a whole grading run for long.
c.Execute.timeout = 300
