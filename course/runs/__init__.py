"""Tiny, deterministic runs and scenarios shared by the grader, labs, experiments, notebooks and tests.

* ``loop``    - ``LoopScenario``, ``training_objects``, epoch batches, ``run_oracle`` / ``run_impl`` (lesson 14)
* ``resume``  - train to a stop point, save, resume with an implementation and finish (lesson 15)
* ``session`` - masked micro-batches, the one-backward oracle, ``run_update`` (lesson 16)
* ``sft``     - conversations labelled as upstream labels them, the built-in chat corpus, its micro-batches and the
  one-backward oracle of an SFT update (lesson 17; imported as ``course.runs.sft``)
* ``distributed`` - ``process_group`` (join a torch.distributed group, free DDP objects before leaving) and
  ``free_port`` (the stage assembly under torchrun, lesson 16's DDP demonstration)
* ``accumulation`` - correct accumulations that the test-writing exercises test (lessons 14 and 16)
* ``update_plan`` - ``UpdatePlan``: which micro-step closes which update, the eval, save and stop points
  (the stage assembly, lessons 14-15)
* ``step_costs`` - what a training step costs, measured on the real model: FlopCounterMode's FLOPs, the bytes
  autograd saves for backward, the training state's nbytes (lesson 18; imported as ``course.runs.step_costs``)
* ``fake_device`` - ``FakeDevice``: a fake clock and asynchronous device, what a GPU does to a timer (lesson 18)
* ``peak_flops`` - ``PEAK_FLOPS``: known accelerators' dense bf16 peaks with their datasheet sources (lesson 18)
* ``rope_check`` - recent upstream's per-forward RoPE check reproduced, for lesson 18's "fix upstream" extension

Nothing here grades: comparisons and verdicts belong to ``course.checks``.
"""
from .accumulation import accumulate_gradients, accumulate_token_weighted, in_float64
from .loop import (LoopScenario, RunResult, TrainingObjects, compute_oracle, epoch_batches, full_epoch_batches,
                   inject_overflow, run_impl, run_oracle, run_oracle_epoch, run_result, tiny_batches, tiny_model,
                   training_objects)
from .resume import resume_and_finish, sample_dataset, save_objects, train_until
from .session import (LABEL_CUTS, SESSION_SCENARIO, capture_grads, global_batch_gradients, grads_of,
                      masked_micro_batches, new_session, params_of, run_update, session_model)

__all__ = ["accumulate_gradients", "accumulate_token_weighted", "in_float64", "LoopScenario", "RunResult",
           "TrainingObjects", "compute_oracle", "epoch_batches", "full_epoch_batches",
           "inject_overflow", "run_impl", "run_oracle", "run_oracle_epoch", "run_result", "tiny_batches", "tiny_model",
           "training_objects", "resume_and_finish", "sample_dataset", "save_objects", "train_until", "LABEL_CUTS",
           "SESSION_SCENARIO", "capture_grads", "global_batch_gradients", "grads_of", "masked_micro_batches",
           "new_session", "params_of", "run_update", "session_model"]
