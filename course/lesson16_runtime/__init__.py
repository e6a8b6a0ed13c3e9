"""Lesson 16's runtime: everything around the ``TrainingSession`` exercise (no exercises here).

* ``types``       - the API types of the single-step protocol; the student's ``impl/train_session.py``
                    and the reference import them from here.
* ``text``        - text micro-batches that carry their valid-token count, and the step functions
                    (token-weighted, and lesson 14's naive mean for comparison).
* ``driver``      - the run driver: data order, global batches, ``normalization_units``, update
                    counters, lr schedule, loss readback. It runs any implementation (``impl``).
* ``train_state`` - save / resume a training state as a lesson-15 checkpoint (legacy states migrated).
* ``train_text``  - the runnable trainer: ``python -m course.lesson16_runtime.train_text --batch-size 8 --accum-steps 4``
                    (``--batch-size`` is the GLOBAL batch of one update).
* ``ddp``         - the same session under DistributedDataParallel (gloo on CPU).
"""
