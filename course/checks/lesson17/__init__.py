"""Lesson 17: supervised fine-tuning, the loss mask belongs to the sample - the descriptor.

The checks live beside it (``checks`` assistant_labels, ``weights`` load_pretrained_weights, ``updates``
update_normalization_units and sft_epoch, ``test_writing`` the student's test, ``extensions`` the optional §5.6),
the mistake catalogue in ``mistakes``. A core check names the objective below that it grades; the checks without
one are the hardening tier (lesson 17 §5.5: argument rules and conventions, graded by ``check 17 --all`` only).
"""
from __future__ import annotations

from ..framework import Exercise, Lesson, checks_in
from . import checks, equivalent_mutants, extensions, hints, mistakes, test_writing, updates, weights

LESSON = Lesson(
    lesson_id="17",
    slug="sft_loss_mask",
    title="Supervised fine-tuning: the loss mask belongs to the sample",
    module="sft",
    exercises=[
        Exercise("assistant_labels", "17 §5.1", points=2, hidden_points=1),
        Exercise("load_pretrained_weights", "17 §5.2", points=2),
        Exercise("update_normalization_units", "17 §5.3", points=1),
        Exercise("sft_epoch", "17 §5.3", points=2, hidden_points=1),
        Exercise("test_assistant_labels_match_upstream", "17 §5.4", points=2),
        # The extension (§5.6): fixes upstream's merged-newline quirk. Graded by ``check 17 --all``, never in the
        # exit code or the points.
        Exercise("encode_sft_prompt", "17 §5.6", optional=True),
    ],
    # What the lesson teaches (§4.2 lists them): every core check grades one; argument rules and conventions are
    # the hardening tier (checks without an objective, graded by ``check 17 --all``).
    objectives={
        "assistant_mask": "a conversation's labels are the ids of its assistant spans (from the id after each "
                          "assistant marker through its end marker; a span cut by the truncation to the end), -100 "
                          "elsewhere: upstream's labels, token for token; its arguments left as they were",
        "pretrained_weights": "a pretraining weights file (fp32, or upstream's fp16) loads into the model in place, "
                              "exactly, at the model's dtype, each entry by its name; a file with a key missing, "
                              "unexpected or of another shape is refused naming the key, before the model changes",
        "normalization_units": "each micro-batch's normalization units are the shifted assistant targets of its "
                               "whole update: its window of K micro-batches, the epoch's short tail its own",
        "sft_updates": "each update's gradient equals one backward of the token mean over all its assistant tokens, "
                       "with one optimizer step per update (the tail too), stepped at the given lr and clipped at the "
                       "given clip_grad_norm; an update without an assistant token is not trained; the caller's "
                       "micro-batches left as they were",
        "test_writing": "your test proves a mask equals upstream's, on conversations that expose each wrong mask",
    },
    checks=checks_in(checks, weights, updates, test_writing, extensions),
    mistakes=mistakes.MISTAKES,
    equivalents=mistakes.EQUIVALENTS,
    equivalent_mutants=equivalent_mutants.EQUIVALENT_MUTANTS,
    hints=hints.HINTS,
    labs=("lesson17_predictions.py", "lesson17_mask_vs_mean_of_means.py"),
    notebook_mistake="end_matched_by_its_first_id",
)
