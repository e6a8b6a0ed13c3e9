"""Lesson 16's reference pieces around the ``TrainingSession`` exercise (not exercises).

* ``text``       - text micro-batches that carry their valid-token count, and the task step
                   functions (token-weighted, and lesson 14's naive mean for comparison).
* ``driver``     - the run driver: data order, global batches, ``normalization_units``, update
                   counters, lr schedule, loss readback, checkpoints (save/load/resume, legacy too).
* ``train_text`` - the runnable trainer: ``python -m course.session.train_text --batch-size 8 --accum-steps 4``
                   (``--batch-size`` is the GLOBAL batch of one update).
* ``ddp``        - the same session under DistributedDataParallel (gloo on CPU).

The driver takes the implementation module (``impl``) it runs, so the checks can drive a student's
``TrainingSession`` with the same code; it defaults to ``course/reference/core/train_session.py``.
"""
