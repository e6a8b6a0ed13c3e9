"""Lesson 15's mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both)."""
from __future__ import annotations

from ..catalogue import equivalent, mistake
from .checks import skip_batch_sampler_matches_upstream
from .loading import (load_checkpoint_rejects_a_disabled_scaler_state,
                      load_checkpoint_rejects_another_config_with_the_same_shapes,
                      load_checkpoint_rejects_foreign_checkpoints, load_checkpoint_rejects_unreadable_files,
                      load_checkpoint_rescales_step_for_world_size)
from .resume import exact_resume_fp32, exact_resume_with_grad_scaler, resume_position_cases
from .saving import (save_checkpoint_is_atomic, save_checkpoint_refuses_pending_gradients,
                     save_checkpoint_unwraps_ddp_and_compile, save_checkpoint_writes_full_state,
                     save_checkpoint_writes_next_to_the_target, save_checkpoint_writes_on_rank_0_only)

MISTAKES = [
    mistake("drops_optimizer_state", "restores the weights only: AdamW restarts with empty moments",
        "load_checkpoint",
        '        optimizer.load_state_dict(checkpoint["optimizer"])\n', "        pass\n", exact_resume_fp32),
    mistake("saves_fp16_weights", "stores the model in fp16 like upstream's resume file: resume is inexact",
        "save_checkpoint", '"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}',
        '"model": {k: v.detach().half().cpu() for k, v in model.state_dict().items()}',
        save_checkpoint_writes_full_state),
    mistake("does_not_skip_trained_batches", "the sampler ignores skip_batches: a resumed epoch retrains them",
        "SkipBatchSampler.__iter__", "            if position < skipped_samples:\n                continue\n", "",
        skip_batch_sampler_matches_upstream),
    mistake("drops_final_partial_batch", "the sampler drops the epoch's last, partial batch",
        "SkipBatchSampler.__iter__",
        "        if batch:\n            yield batch\n", "", skip_batch_sampler_matches_upstream),
    mistake("non_atomic_write", "torch.save straight onto the path: a crash mid-save destroys the last checkpoint",
        "save_checkpoint", 'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
        "fd, tmp_name = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), str(path)",
        save_checkpoint_is_atomic),
    mistake("forgets_the_scaler", "never restores the GradScaler: the scale restarts at 65536",
        "load_checkpoint",
        "        scaler.load_state_dict(scaler_state)\n", "        pass\n", exact_resume_with_grad_scaler),
    mistake("saves_mid_accumulation", "saves while gradients are pending: the file silently lacks them",
        "save_checkpoint", "    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):\n",
        "    if False:\n", save_checkpoint_refuses_pending_gradients),
    mistake("weights_only_false", "torch.load(weights_only=False): a checkpoint can run arbitrary code",
        "load_checkpoint", 'torch.load(path, map_location="cpu", weights_only=True)',
        'torch.load(path, map_location="cpu", weights_only=False)', load_checkpoint_rejects_unreadable_files),
    mistake("loads_model_before_validating", "loads the weights, then finds the optimizer state is foreign",
        "load_checkpoint",
        '    if optimizer is not None:\n        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)\n'
        '    scaler_state = checkpoint["scaler"]\n',
        '    model.load_state_dict(checkpoint["model"])\n    if optimizer is not None:\n'
        '        _validate_optimizer_state(path, checkpoint["optimizer"], optimizer)\n'
        '    scaler_state = checkpoint["scaler"]\n',
        load_checkpoint_rejects_foreign_checkpoints),
    mistake("no_world_size_rescale", "keeps the saved step after a world-size change (upstream rescales it)",
        "load_checkpoint", '    if checkpoint["world_size"] != current:\n', "    if False:\n",
        load_checkpoint_rescales_step_for_world_size),
    mistake("resumes_one_step_late", "start_step = step + 1: the micro-batch after the checkpoint is skipped",
        "resume_position", "return (epoch + 1, 0) if step == iters else (epoch, step)",
        "return (epoch + 1, 0) if step == iters else (epoch, step + 1)", resume_position_cases),
    mistake("zero_grads_count_as_pending",
        "refuses any gradient tensor, also the zeros of zero_grad(set_to_none=False)",
        "save_checkpoint", "    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):\n",
        "    if any(p.grad is not None for p in model.parameters()):\n", save_checkpoint_refuses_pending_gradients),
    mistake("temp_file_in_system_tmp", "the temporary file goes to the system temp dir: os.replace is no longer a "
        "rename within one directory (and fails across file systems)",
        "save_checkpoint", 'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
        'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp")',
        save_checkpoint_writes_next_to_the_target),
    mistake("no_fsync", "os.replace of a file whose bytes may still sit in the page cache: a power cut can "
        "leave an empty checkpoint", "save_checkpoint", "            os.fsync(handle.fileno())\n", "",
        save_checkpoint_writes_next_to_the_target),
    mistake("no_parent_directory", "writes into out_dir without creating it: FileNotFoundError on a first run",
        "save_checkpoint",
        "    path.parent.mkdir(parents=True, exist_ok=True)\n", "", save_checkpoint_writes_next_to_the_target),
    mistake("keeps_wrapper_prefixes", "saves the wrapper's state_dict: keys 'module.' / '_orig_mod.' fit no "
        "plain model", "save_checkpoint",
        "    model = _unwrapped(model)\n", "", save_checkpoint_unwraps_ddp_and_compile),
    mistake("unwraps_ddp_only", "strips DDP's 'module.' but keeps torch.compile's '_orig_mod.'",
        "_unwrapped", 'while isinstance(model, DistributedDataParallel) or hasattr(model, "_orig_mod"):',
        "while isinstance(model, DistributedDataParallel):", save_checkpoint_unwraps_ddp_and_compile),
    mistake("every_rank_writes", "every rank writes the same file at once",
        "save_checkpoint", "    if dist.is_initialized() and dist.get_rank() != 0:\n", "    if False:\n",
        save_checkpoint_writes_on_rank_0_only),
    mistake("config_compared_by_shapes_only", "accepts another model config when the shapes fit (rope_theta)",
        "_validate_model_state", "    if saved_config is not None and config is not None and saved_config != config:\n",
        "    if False:\n", load_checkpoint_rejects_another_config_with_the_same_shapes),
    mistake("loads_a_disabled_scaler_state", "accepts a disabled scaler's empty state for an enabled scaler",
        "load_checkpoint",
        "    if scaler is not None and scaler.is_enabled() and not scaler_state:\n", "    if False:\n",
        load_checkpoint_rejects_a_disabled_scaler_state),
]

EQUIVALENTS = [
    equivalent("ceil_by_negation", "-(-N // bs) instead of (N + bs - 1) // bs in __len__",
        "SkipBatchSampler.__len__", "(len(self.indices) + self.batch_size - 1) // self.batch_size - self.skip_batches",
        "-(-len(self.indices) // self.batch_size) - self.skip_batches"),
    equivalent("fixed_tmp_name", "upstream's fixed path + '.tmp' instead of a mkstemp name",
        "save_checkpoint", 'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)',
        'tmp_name = f"{path}.tmp"\n    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)'),
]
