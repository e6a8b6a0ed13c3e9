"""Command-line trainers and what only they need (the top layer, beside the CLI).

* ``pretrain``            - the stage assembly's pieces (impl/train_pretrain_impl.py): data split, throughput,
                            validation loss, samples, loss curves, update logs.
* ``ddp``                 - the stage assembly under torchrun: sync only on closing micro-steps, sums over ranks,
                            the ranks-agree guard.
* ``sft``                 - the SFT stage's pieces (impl/train_full_sft_impl.py, lesson 17): samples labelled by an
                            ``assistant_labels``, micro-batches, answers, the held-out exact-answer score, a model
                            read from a weights file.
* ``chat``                - ``python -m course chat``: talk to a weights file through upstream's chat template.
* ``session_text``        - lesson 16's text trainer on the single-step protocol:
                            ``python -m course.trainers.session_text --impl reference``
* ``session_train_state`` - save / resume its training state as a lesson-15 checkpoint (legacy states migrated).
* ``session_ddp``         - lesson 16's session under DistributedDataParallel (gloo on CPU).
"""
