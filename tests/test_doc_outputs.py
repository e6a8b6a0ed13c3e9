"""course/doc_outputs.py: how a shown output is compared with a real one (words and integers exactly, labelled
numbers within their tolerance, samples and timings skipped, abridged or complete)."""
from __future__ import annotations

import pytest

from course.doc_outputs import TOLERANCES, mismatches

OUTPUT = """LLM params: 0.311 M, 2850 samples + 150 for validation
update 0: val_loss 6.5795
update 0 sample: 'One day Tom went to the the the'
update 357: val_loss 1.0039
   clip -> unscale: norm recorded 74965.6, norm the step uses 1.526e-05
   max |param - interrupted run| = 3.836e-04 (the fp32 checkpoint: 0.000e+00)
3,100 tokens/s in train_one_epoch
"""


@pytest.mark.parametrize("shown,complete,expected", [
    (OUTPUT, True, None),
    ("update 0: val_loss 6.5795\nupdate 357: val_loss 1.0039\n", False, None),                  # abridged
    ("update 357: val_loss 1.0339\n", False, None),                                             # 0.03 < 0.05
    ("update 357: val_loss 1.1039\n", False, "val_loss"),                                       # 0.1 > 0.05
    ("update 358: val_loss 1.0039\n", False, "lacks"),                                          # integers exact
    ("update 0 sample: 'something else'\n9,999 tokens/s in train_one_epoch\n", False, None),    # skipped
    ("   clip -> unscale: norm recorded 74965.65, norm the step uses 1.526e-05\n", False, None),
    ("   clip -> unscale: norm recorded 74965.8, norm the step uses 1.526e-05\n", False, "norm recorded"),
    ("   max |param - interrupted run| = 3.8365e-04 (the fp32 checkpoint: 0.000e+00)\n", False, None),
    ("   max |param - interrupted run| = 3.836e-04 (the fp32 checkpoint: 1.000e-09)\n", False, "lacks"),
    ("LLM params: 0.312 M, 2850 samples + 150 for validation\n", False, "lacks"),  # unlabelled decimals exact
    ("update 357: val_loss 1.0039\nupdate 0: val_loss 6.5795\n", False, "lacks"),               # order
    ("update 0: val_loss 6.5795\n", True, "not shown"),                                         # complete
])
def test_shown_lines_are_matched_in_order_within_their_tolerances(shown, complete, expected):
    problems = mismatches(shown.splitlines(), OUTPUT, complete=complete)
    if expected is None:
        assert not problems, f"ACTUAL problems {problems}, EXPECTED none"
    else:
        assert problems and expected in problems[0], f"ACTUAL {problems}, EXPECTED a problem naming {expected!r}"


def test_every_tolerance_is_a_finite_fraction_of_what_it_guards_or_a_timing():
    """A tolerance of 1 or more on a loss would let any run through; only timings are not compared."""
    too_loose = {label: t for label, t in TOLERANCES.items() if t >= 0.5 and label != "left_in_epoch:"}
    assert not too_loose, f"ACTUAL tolerances {too_loose}, EXPECTED each below 0.5 (or a timing's inf)"
