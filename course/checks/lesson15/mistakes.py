"""Lesson 15's mistake catalogue: each wrong variant of a reference function FAILS the check named; each
equivalent PASSES every check (tests/test_mistakes.py proves both). A mistake that breaks an objective is caught
by a core check and states the ``rule`` its hint names (tests/test_hint_rules.py); one that breaks only a
convention is caught by a hardening check."""
from __future__ import annotations

from ..catalogue import equivalent, mistake
from .checks import (skip_batch_sampler_follows_a_reshuffled_sampler, skip_batch_sampler_matches_upstream,
                     skip_batch_sampler_rejects_bad_arguments, skip_batch_sampler_yields_lists)
from .loading import (load_checkpoint_names_the_path_and_the_problem, load_checkpoint_never_runs_code_from_the_file,
                      load_checkpoint_rejects_a_missing_key, load_checkpoint_rejects_every_foreign_entry,
                      load_checkpoint_rejects_foreign_checkpoints, load_checkpoint_rejects_unreadable_files,
                      load_checkpoint_restores_everything, load_checkpoint_restores_the_whole_grad_scaler)
from .loading_topology import (load_checkpoint_reads_a_file_from_another_device, load_checkpoint_rejects_bad_counters,
                               load_checkpoint_rescales_step_for_world_size)
from .resume import (exact_resume_fp32, exact_resume_with_grad_scaler, resume_position_cases,
                     resume_position_rejects_bad_arguments)
from .saving import (save_checkpoint_cleans_up_after_a_failure,
                     save_checkpoint_creates_the_directory_and_uses_os_replace, save_checkpoint_is_atomic,
                     save_checkpoint_stores_every_extra, save_checkpoint_writes_full_state,
                     save_checkpoint_writes_next_to_the_target)
from .saving_boundary import (save_checkpoint_leaves_its_inputs_unchanged,
                              save_checkpoint_refuses_every_pending_gradient_with_a_value_error,
                              save_checkpoint_refuses_pending_gradients, save_checkpoint_rejects_bad_counters,
                              save_checkpoint_unwraps_ddp_and_compile, save_checkpoint_writes_on_rank_0_only)
PENDING = "    if any(p.grad is not None and bool(p.grad.ne(0).any()) for p in model.parameters()):\n"
MKSTEMP = 'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)'
LOAD_SCALER = '        scaler.load_state_dict(checkpoint["scaler"])\n'

CORE_MISTAKES = [
    # SkipBatchSampler
    mistake("does_not_skip_trained_batches", "the sampler ignores skip_batches: a resumed epoch retrains them",
        "SkipBatchSampler.__iter__", "            if position < skipped_samples:\n                continue\n", "",
        skip_batch_sampler_matches_upstream, rule="drop the first skip_batches batches"),
    mistake("drops_final_partial_batch", "the sampler drops the epoch's last, partial batch",
        "SkipBatchSampler.__iter__", "        if batch:\n            yield batch\n", "",
        skip_batch_sampler_matches_upstream, rule="the last, short batch is kept"),
    mistake("reuses_one_batch_list", "yields one list and clears it for the next batch: list(sampler) holds "
        "empty batches", "SkipBatchSampler.__iter__", "                batch = []\n", "                batch.clear()\n",
        skip_batch_sampler_matches_upstream, rule="a new list for every batch"),
    mistake("default_skips_a_batch", "skip_batches defaults to 1: a fresh epoch loses its first batch",
        "SkipBatchSampler.__init__", "skip_batches: int = 0", "skip_batches: int = 1",
        skip_batch_sampler_matches_upstream, rule="skip_batches defaults to 0"),
    mistake("copies_indices_once", "list(indices) in __init__: a DistributedSampler's set_epoch reshuffle is "
        "never seen", "SkipBatchSampler.__init__", "        self.indices = indices\n",
        "        self.indices = list(indices)\n", skip_batch_sampler_follows_a_reshuffled_sampler,
        rule="read indices afresh on every pass"),
    # save_checkpoint
    mistake("saves_fp16_weights", "stores the model in fp16 like upstream's resume file: resume is inexact",
        "save_checkpoint", '"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}',
        '"model": {k: v.detach().half().cpu() for k, v in model.state_dict().items()}',
        save_checkpoint_writes_full_state, rule="fp32 stays fp32"),
    mistake("save_needs_a_scaler", "scaler.state_dict() whether or not a scaler was given: the contract's example, "
        "a save with scaler=None, raises", "save_checkpoint",
        '"scaler": scaler.state_dict() if scaler is not None else None,', '"scaler": scaler.state_dict(),',
        save_checkpoint_writes_full_state, rule="scaler may be None"),
    mistake("non_atomic_write", "torch.save straight onto the path: a crash mid-save destroys the last checkpoint",
        "save_checkpoint", MKSTEMP, "fd, tmp_name = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), str(path)",
        save_checkpoint_is_atomic, rule="write to a temporary file"),
    mistake("temp_file_in_system_tmp", "the temporary file goes to the system temp dir: os.replace is no longer a "
        "rename within one directory (and fails across file systems)",
        "save_checkpoint", MKSTEMP, 'fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp")',
        save_checkpoint_writes_next_to_the_target, rule="in the target's own directory"),
    mistake("no_fsync", "os.replace of a file whose bytes may still sit in the page cache: a power cut can "
        "leave an empty checkpoint", "save_checkpoint", "            os.fsync(handle.fileno())\n", "",
        save_checkpoint_writes_next_to_the_target, rule="fsync the temporary file itself"),
    mistake("fsyncs_the_directory_not_the_file", "fsyncs the target directory instead of the temporary file: its "
        "bytes may still sit in the page cache", "save_checkpoint", "            os.fsync(handle.fileno())\n",
        "            os.fsync(os.open(path.parent, os.O_RDONLY))\n", save_checkpoint_writes_next_to_the_target,
        rule="fsync the temporary file itself"),
    mistake("save_needs_a_path_object", "path.parent of a str path: save_checkpoint('out/resume.pth') raises",
        "save_checkpoint", "    path = Path(path)\n    model = _unwrapped(model)\n", "    model = _unwrapped(model)\n",
        save_checkpoint_writes_next_to_the_target, rule="path may be a str"),
    mistake("other_ranks_skip_the_pending_check", "ranks other than 0 return before looking at the gradients: "
        "rank 0 refuses, the others go on alone", "save_checkpoint", PENDING,
        "    if dist.is_initialized() and dist.get_rank() != 0:\n        return\n" + PENDING,
        save_checkpoint_refuses_pending_gradients, rule="every rank refuses a pending gradient"),
    mistake("saves_mid_accumulation", "saves while gradients are pending: the file silently lacks them",
        "save_checkpoint", PENDING, "    if False:\n", save_checkpoint_refuses_pending_gradients,
        rule="accumulated since the last update are pending"),
    mistake("zero_grads_count_as_pending",
        "refuses any gradient tensor, also the zeros of zero_grad(set_to_none=False)",
        "save_checkpoint", PENDING, "    if any(p.grad is not None for p in model.parameters()):\n",
        save_checkpoint_refuses_pending_gradients, rule="a zero gradient is not a pending one"),
    mistake("pending_only_if_every_parameter", "refuses only when ALL parameters hold non-zero gradients: a frozen "
        "embedding (grad None) hides the pending ones", "save_checkpoint", PENDING,
        PENDING.replace("if any(", "if all("), save_checkpoint_refuses_pending_gradients,
        rule="whatever the others hold"),
    mistake("pending_checks_first_parameter_only", "looks at the first parameter's gradient only",
        "save_checkpoint", PENDING, PENDING.replace("model.parameters()", "list(model.parameters())[:1]"),
        save_checkpoint_refuses_pending_gradients, rule="look at every parameter"),
    mistake("keeps_wrapper_prefixes", "saves the wrapper's state_dict: keys 'module.' / '_orig_mod.' fit no "
        "plain model", "save_checkpoint", "    model = _unwrapped(model)\n", "",
        save_checkpoint_unwraps_ddp_and_compile, rule="unwrap .module (DistributedDataParallel)"),
    mistake("unwraps_ddp_only", "strips DDP's 'module.' but keeps torch.compile's '_orig_mod.'",
        "_unwrapped", 'while isinstance(model, DistributedDataParallel) or hasattr(model, "_orig_mod"):',
        "while isinstance(model, DistributedDataParallel):", save_checkpoint_unwraps_ddp_and_compile,
        rule="unwrap ._orig_mod (torch.compile) too"),
    mistake("every_rank_writes", "every rank writes the same file at once",
        "save_checkpoint", "    if dist.is_initialized() and dist.get_rank() != 0:\n", "    if False:\n",
        save_checkpoint_writes_on_rank_0_only, rule="only rank 0"),
    # load_checkpoint
    mistake("load_needs_a_path_object", "path.is_file() of a str path: load_checkpoint('out/resume.pth') raises",
        "load_checkpoint", "    path = Path(path)\n", "", load_checkpoint_restores_everything,
        rule="path may be a str"),
    mistake("load_needs_a_scaler", "loads the saved scaler state whether or not a scaler was given: a model-only "
        "load raises", "load_checkpoint", '    if scaler is not None and checkpoint["scaler"]:\n',
        '    if checkpoint["scaler"]:\n', load_checkpoint_restores_everything,
        rule="optimizer and scaler may be None"),
    mistake("scaler_restored_by_hand", "restores the scale and growth tracker only: the scaler keeps its own "
        "growth_factor, backoff_factor and growth_interval", "load_checkpoint", LOAD_SCALER,
        '        scaler.load_state_dict(dict(scaler.state_dict(), scale=checkpoint["scaler"]["scale"], '
        '_growth_tracker=checkpoint["scaler"]["_growth_tracker"]))\n', load_checkpoint_restores_the_whole_grad_scaler,
        rule="scaler.load_state_dict(saved state)"),
    mistake("weights_only_false", "torch.load(weights_only=False): a checkpoint can run arbitrary code",
        "load_checkpoint", 'torch.load(path, map_location="cpu", weights_only=True)',
        'torch.load(path, map_location="cpu", weights_only=False)', load_checkpoint_never_runs_code_from_the_file,
        rule="weights_only=True"),
    mistake("loads_model_before_validating", "loads the weights, then finds that the file is foreign",
        "load_checkpoint", "    _validate_checkpoint(path, checkpoint, model, optimizer, scaler)\n",
        '    model.load_state_dict(checkpoint["model"])\n'
        "    _validate_checkpoint(path, checkpoint, model, optimizer, scaler)\n",
        load_checkpoint_rejects_foreign_checkpoints, rule="before the first load_state_dict"),
    mistake("config_compared_by_shapes_only", "accepts another model config when the shapes fit (rope_theta)",
        "_validate_model_state", "    if saved_config is not None and config is not None and saved_config != config:\n",
        "    if False:\n", load_checkpoint_rejects_foreign_checkpoints, rule="not only the shapes"),
    mistake("optimizer_group_count_unchecked", "compares the number of parameters, not of param groups: torch "
        "raises inside optimizer.load_state_dict, after the model changed", "_validate_optimizer_state",
        'if len(state["param_groups"]) != len(optimizer.param_groups) or len(saved_ids) != len(params):',
        "if len(saved_ids) != len(params):", load_checkpoint_rejects_foreign_checkpoints,
        rule="number of param groups"),
    mistake("loads_a_disabled_scaler_state", "accepts a disabled scaler's empty state for an enabled scaler",
        "_validate_checkpoint", '    if scaler is not None and scaler.is_enabled() and not checkpoint["scaler"]:\n',
        "    if False:\n", load_checkpoint_rejects_foreign_checkpoints, rule="non-empty saved scaler state"),
    mistake("refuses_fp16_weights_only", "takes only float16 weights for an export: a bf16 export, as lossy, "
        "loads into the fp32 model", "_validate_model_state", "        if got.dtype != want.dtype:\n",
        "        if got.dtype == torch.float16:\n", load_checkpoint_rejects_foreign_checkpoints,
        rule="not with float16 alone"),
    mistake("scaler_state_none_accepted", "refuses the empty scaler state {} only: a scaler entry None (saved with "
        "scaler=None) loads into an enabled GradScaler, whose scale restarts at 65536", "_validate_checkpoint",
        'scaler.is_enabled() and not checkpoint["scaler"]:', 'scaler.is_enabled() and checkpoint["scaler"] == {}:',
        load_checkpoint_rejects_foreign_checkpoints, rule="None (saved with scaler=None)"),
    mistake("no_world_size_rescale", "keeps the saved step after a world-size change (upstream rescales it)",
        "load_checkpoint", '    if checkpoint["world_size"] != current:\n', "    if False:\n",
        load_checkpoint_rescales_step_for_world_size, rule="rescale the step"),
    mistake("rounds_the_rescaled_step", "round(step * saved / current) instead of upstream's floor",
        "load_checkpoint", 'checkpoint["step"] * checkpoint["world_size"] // current',
        'round(checkpoint["step"] * checkpoint["world_size"] / current)', load_checkpoint_rescales_step_for_world_size,
        rule="the floor"),
    mistake("world_size_ignores_process_group", "world_size=None means 1 even under torch.distributed",
        "_world_size", "        return dist.get_world_size() if dist.is_initialized() else 1\n",
        "        return 1\n", load_checkpoint_rescales_step_for_world_size, rule="current process group's size"),
    # resume_position and the exact resume
    mistake("resumes_one_step_late", "start_step = step + 1: the micro-batch after the checkpoint is skipped",
        "resume_position", "return (epoch + 1, 0) if step == iters else (epoch, step)",
        "return (epoch + 1, 0) if step == iters else (epoch, step + 1)", resume_position_cases,
        rule="no + 1 anywhere"),
    mistake("next_epoch_one_step_early", "treats step == iters - 1 as the end of the epoch: its last micro-batch "
        "is never trained", "resume_position", "(epoch + 1, 0) if step == iters", "(epoch + 1, 0) if step >= iters - 1",
        resume_position_cases, rule="only step == iters"),
    mistake("drops_optimizer_state", "restores the weights only: AdamW restarts with empty moments",
        "load_checkpoint", '        optimizer.load_state_dict(checkpoint["optimizer"])\n', "        pass\n",
        exact_resume_fp32, rule="the whole AdamW state"),
    mistake("forgets_the_scaler", "never restores the GradScaler: the scale restarts at 65536",
        "load_checkpoint", LOAD_SCALER, "        pass\n", exact_resume_with_grad_scaler,
        rule="restore the GradScaler's whole state"),
    mistake("restarts_the_growth_tracker", "restores the scale but not the growth tracker: the scale grows at "
        "other steps than in the uninterrupted run", "load_checkpoint", LOAD_SCALER,
        '        scaler.load_state_dict(dict(checkpoint["scaler"], _growth_tracker=0))\n',
        exact_resume_with_grad_scaler, rule="its growth tracker"),
]

HARDENING_MISTAKES = [
    # SkipBatchSampler: its argument rules, lists
    mistake("accepts_a_negative_batch_size", "refuses batch_size 0 only: -2 fails later, in the skip's bounds",
        "_validate_sampler_arguments", "if not _is_int(batch_size) or batch_size < 1:", "if batch_size == 0:",
        skip_batch_sampler_rejects_bad_arguments),
    mistake("unsized_indices_unnamed", "lets len() of a generator fail: a TypeError that does not name indices",
        "_validate_sampler_arguments", "    if not isinstance(indices, Sized):\n", "    if False:\n",
        skip_batch_sampler_rejects_bad_arguments),
    mistake("skip_bound_rounds_up_a_full_epoch", "(N + bs) // bs batches: skip_batches=4 passes for 9 samples in "
        "batches of 3", "_validate_sampler_arguments", "total = (len(indices) + batch_size - 1) // batch_size",
        "total = (len(indices) + batch_size) // batch_size", skip_batch_sampler_rejects_bad_arguments),
    mistake("accepts_a_bool_batch_size", "isinstance(batch_size, int) lets batch_size=True through as 1",
        "_validate_sampler_arguments", "if not _is_int(batch_size) or batch_size < 1:",
        "if not isinstance(batch_size, int) or batch_size < 1:", skip_batch_sampler_rejects_bad_arguments),
    mistake("batch_size_checked_before_indices", "checks batch_size before indices: a generator with batch_size 0 "
        "is blamed on batch_size", "_validate_sampler_arguments", "    if not isinstance(indices, Sized):\n",
        '    if not _is_int(batch_size) or batch_size < 1:\n'
        '        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")\n'
        "    if not isinstance(indices, Sized):\n", skip_batch_sampler_rejects_bad_arguments),
    mistake("yields_tuples", "yields the last batch as a tuple: the contract's batches are lists",
        "SkipBatchSampler.__iter__", "        if batch:\n            yield batch\n",
        "        if batch:\n            yield tuple(batch)\n", skip_batch_sampler_yields_lists),
    # save_checkpoint: extras, cleanup, directory, os.replace, counters, inputs, odd pending gradients
    mistake("stores_extra_objects_raw", "stores an extra object itself, not its state_dict: weights_only cannot "
        "load it back", "save_checkpoint", 'v.state_dict() if hasattr(v, "state_dict") else v', "v",
        save_checkpoint_stores_every_extra),
    mistake("drops_none_extras", "skips an extra whose value is None (upstream's rule): best_val_loss=None is lost",
        "save_checkpoint", "for k, v in extra.items()})", "for k, v in extra.items() if v is not None})",
        save_checkpoint_stores_every_extra),
    mistake("cleanup_skips_keyboard_interrupt", "except Exception: a Ctrl-C during torch.save leaves the temporary "
        "file behind", "save_checkpoint", "    except BaseException:\n", "    except Exception:\n",
        save_checkpoint_cleans_up_after_a_failure),
    mistake("cleanup_skips_system_exit", "except (Exception, KeyboardInterrupt): a SystemExit during torch.save "
        "leaves the temporary file behind", "save_checkpoint", "    except BaseException:\n",
        "    except (Exception, KeyboardInterrupt):\n", save_checkpoint_cleans_up_after_a_failure),
    mistake("no_parent_directory", "writes into out_dir without creating it: FileNotFoundError on a first run",
        "save_checkpoint", "    path.parent.mkdir(parents=True, exist_ok=True)\n", "",
        save_checkpoint_creates_the_directory_and_uses_os_replace),
    mistake("makedirs_of_an_empty_dirname", "os.makedirs(os.path.dirname(path)): a bare file name's dirname is '', "
        "which os.makedirs refuses, so save_checkpoint('resume.pth') raises", "save_checkpoint",
        "    path.parent.mkdir(parents=True, exist_ok=True)\n", "    os.makedirs(os.path.dirname(path), exist_ok=True)\n",
        save_checkpoint_creates_the_directory_and_uses_os_replace, rule="a bare file name"),
    mistake("removes_the_previous_before_the_rename", "deletes the previous checkpoint, then renames the new one "
        "onto the path: if that rename fails (another file system, permissions), no checkpoint is left",
        "save_checkpoint", "        os.replace(tmp_name, path)\n",
        "        path.unlink(missing_ok=True)\n        os.replace(tmp_name, path)\n", save_checkpoint_is_atomic,
        rule="never remove the previous checkpoint first"),
    mistake("renames_with_os_rename", "os.rename instead of os.replace: on Windows every save after the first "
        "raises FileExistsError", "save_checkpoint", "        os.replace(tmp_name, path)\n",
        "        os.rename(tmp_name, path)\n", save_checkpoint_creates_the_directory_and_uses_os_replace),
    mistake("other_ranks_skip_validation", "ranks other than 0 return before validating: a bad step passes silently "
        "there", "save_checkpoint", "    path = Path(path)\n",
        "    path = Path(path)\n    if dist.is_initialized() and dist.get_rank() != 0:\n        return\n",
        save_checkpoint_rejects_bad_counters),
    mistake("extra_overwrites_checkpoint_keys", "an extra named world_size or model_config silently replaces the "
        "saved one", "_validate_save_arguments", "    if overlap:\n", "    if False:\n",
        save_checkpoint_rejects_bad_counters),
    mistake("accepts_float_counters", "epoch=1.0 is saved as a float (resume_position and range() then break)",
        "_validate_save_arguments", "if not _is_int(epoch) or epoch < 0:", "if epoch < 0:",
        save_checkpoint_rejects_bad_counters),
    mistake("refuses_step_zero", "step <= 0 refused: the checkpoint at the start of a run cannot be written",
        "_validate_save_arguments", "if not _is_int(step) or step < 0:", "if not _is_int(step) or step <= 0:",
        save_checkpoint_rejects_bad_counters),
    mistake("accepts_a_bool_step", "isinstance(step, int) lets step=True through as 1", "_validate_save_arguments",
        "if not _is_int(step) or step < 0:", "if not isinstance(step, int) or step < 0:",
        save_checkpoint_rejects_bad_counters),
    mistake("save_leaves_eval_mode", "calls model.eval() before reading the state and never restores train mode: "
        "the run goes on without dropout and MoE aux loss", "save_checkpoint", "    model = _unwrapped(model)\n",
        "    model = _unwrapped(model)\n    model.eval()\n", save_checkpoint_leaves_its_inputs_unchanged),
    mistake("save_clears_gradients", "zero_grad(set_to_none=True) while saving: the caller's zero gradient tensors "
        "become None", "save_checkpoint", "    model = _unwrapped(model)\n",
        "    model = _unwrapped(model)\n    model.zero_grad(set_to_none=True)\n",
        save_checkpoint_leaves_its_inputs_unchanged),
    mistake("pending_means_nonzero_sum", "grad.sum() != 0: a gradient whose entries cancel (+1, -1) is taken for "
        "none", "save_checkpoint", PENDING, PENDING.replace("p.grad.ne(0).any()", "p.grad.sum() != 0"),
        save_checkpoint_refuses_pending_gradients, rule="also when its entries cancel"),
    mistake("nan_gradient_not_pending", "grad.abs().sum() > 0: a NaN gradient compares False and passes",
        "save_checkpoint", PENDING, PENDING.replace("p.grad.ne(0).any()", "p.grad.abs().sum() > 0"),
        save_checkpoint_refuses_every_pending_gradient_with_a_value_error),
    # load_checkpoint: the refusals' wording, the longer catalogue, unreadable files, keys, counters, devices
    mistake("refusal_names_no_path", "refuses foreign files with a message that does not say which file",
        "_bad", 'return ValueError(f"checkpoint {str(path)!r}: {what}")', "return ValueError(what)",
        load_checkpoint_names_the_path_and_the_problem),
    mistake("ignores_extra_model_keys", "refuses missing model keys only: an unexpected saved key passes "
        "validation, then load_state_dict raises a RuntimeError without the path", "_validate_model_state",
        "    if missing or unexpected:\n", "    if missing:\n", load_checkpoint_rejects_every_foreign_entry),
    mistake("model_entries_not_checked_as_tensors", "checks the shape of tensor entries only: a list in the model "
        "entry fails later without the path", "_validate_model_state",
        "if not torch.is_tensor(got) or got.shape != want.shape:", "if torch.is_tensor(got) and got.shape != "
        "want.shape:", load_checkpoint_rejects_every_foreign_entry),
    mistake("config_compared_over_model_fields", "compares the model's config fields only: a saved config with an "
        "extra field passes", "_validate_model_state",
        "if saved_config is not None and config is not None and saved_config != config:",
        "if saved_config is not None and config is not None and any(saved_config.get(k) != v for k, v in "
        "config.items()):", load_checkpoint_rejects_every_foreign_entry),
    mistake("accepts_an_empty_optimizer_entry", "no check that the optimizer entry is a state_dict: {} fails "
        "with a KeyError", "_validate_optimizer_state",
        '    if not isinstance(state, dict) or not {"state", "param_groups"} <= set(state):\n', "    if False:\n",
        load_checkpoint_rejects_every_foreign_entry),
    mistake("optimizer_groups_compared_pairwise", "compares the parameter count per zipped group and in total, not "
        "the number of groups: an extra empty group passes, torch raises after the model changed",
        "_validate_optimizer_state",
        'if len(state["param_groups"]) != len(optimizer.param_groups) or len(saved_ids) != len(params):',
        'if len(saved_ids) != len(params) or any(len(s["params"]) != len(g["params"]) for s, g in zip('
        'state["param_groups"], optimizer.param_groups)):', load_checkpoint_rejects_every_foreign_entry),
    mistake("optimizer_state_shapes_unchecked", "accepts AdamW moments shaped unlike their parameters (another "
        "parameter order)", "_validate_optimizer_state",
        "if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:", "if False:",
        load_checkpoint_rejects_every_foreign_entry),
    mistake("optimizer_shapes_checked_for_matrices_only", "compares state shapes of 2-D parameters only: swapped "
        "norm moments pass", "_validate_optimizer_state", "value.dim() > 0", "value.dim() > 1",
        load_checkpoint_rejects_every_foreign_entry),
    mistake("optimizer_state_compared_by_numel", "compares a moment's numel, not its shape: a transposed exp_avg "
        "loads and the next step crashes", "_validate_optimizer_state", "value.shape != param.shape",
        "value.numel() != param.numel()", load_checkpoint_rejects_every_foreign_entry),
    mistake("unknown_optimizer_ids_accepted", "ignores optimizer state under a parameter id no group holds",
        "_validate_optimizer_state", "    if unknown:\n", "    if False:\n",
        load_checkpoint_rejects_every_foreign_entry),
    mistake("unreadable_file_narrow_except", "catches only RuntimeError and UnpicklingError from torch.load: an "
        "empty file's EOFError escapes without the path", "load_checkpoint", "    except Exception as exc:\n",
        "    except (RuntimeError, torch.serialization.pickle.UnpicklingError) as exc:\n",
        load_checkpoint_rejects_unreadable_files),
    mistake("directory_reported_missing", "path.is_file(): a directory at the path is reported as a missing file",
        "load_checkpoint", "    if not path.exists():\n", "    if not path.is_file():\n",
        load_checkpoint_rejects_unreadable_files),
    mistake("accepts_a_file_without_a_dict", "skips the dict check: a file holding a tensor fails with a "
        "RuntimeError that names no path", "_validate_checkpoint", "    if not isinstance(checkpoint, dict):\n",
        "    if False:\n", load_checkpoint_rejects_unreadable_files),
    mistake("accepts_a_model_entry_of_none", "skips the model-entry check: model=None fails with a TypeError",
        "_validate_checkpoint", '    if not isinstance(checkpoint["model"], dict):\n', "    if False:\n",
        load_checkpoint_rejects_unreadable_files),
    mistake("checks_only_the_model_key", "requires the model key only: a file without optimizer, scaler or a counter "
        "fails later with a KeyError naming no path", "_validate_checkpoint",
        "missing = [k for k in REQUIRED_KEYS if k not in checkpoint]",
        'missing = [k for k in ("model",) if k not in checkpoint]', load_checkpoint_rejects_a_missing_key),
    mistake("accepts_world_size_zero", "checks that world_size >= 0 like the counters: 0 divides by zero later",
        "_validate_checkpoint", 'checkpoint[key] < (1 if key == "world_size" else 0)', "checkpoint[key] < 0",
        load_checkpoint_rejects_bad_counters),
    mistake("world_size_validated_after_loading", "checks the world_size argument after load_state_dict: a refused "
        "call has already overwritten the model", "load_checkpoint",
        '    current = _world_size(world_size)  # the last refusal: it too comes before anything is loaded\n'
        '    model.load_state_dict(checkpoint["model"])\n',
        '    model.load_state_dict(checkpoint["model"])\n    current = _world_size(world_size)\n',
        load_checkpoint_rejects_bad_counters),
    mistake("accepts_a_bool_world_size", "isinstance(world_size, int) lets world_size=True through as 1",
        "_world_size", "if not _is_int(world_size) or world_size < 1:",
        "if not isinstance(world_size, int) or world_size < 1:", load_checkpoint_rejects_bad_counters),
    mistake("no_map_location", "torch.load without map_location: a file saved on a GPU / mps device does not load "
        "on a machine without one", "load_checkpoint", 'torch.load(path, map_location="cpu", weights_only=True)',
        "torch.load(path, weights_only=True)", load_checkpoint_reads_a_file_from_another_device),
    # resume_position: its argument rules, the caller's dict
    mistake("resume_position_edits_the_checkpoint", "moves an epoch-end checkpoint to the next epoch in the "
        "caller's dict", "resume_position", "    return (epoch + 1, 0) if step == iters else (epoch, step)\n",
        '    if step == iters:\n        checkpoint["epoch"], checkpoint["step"] = epoch + 1, 0\n'
        '    return checkpoint["epoch"], checkpoint["step"]\n', resume_position_rejects_bad_arguments),
    mistake("step_checked_before_iters", "checks the step against iters before iters itself: iters=0 is blamed "
        "on the step", "resume_position", "    if not _is_int(iters) or iters < 1:\n",
        '    if not 0 <= checkpoint["step"] <= iters:\n'
        '        raise ValueError(f"checkpoint step must be in [0, iters={iters}], got {checkpoint[\'step\']}")\n'
        "    if not _is_int(iters) or iters < 1:\n", resume_position_rejects_bad_arguments),
]

MISTAKES = CORE_MISTAKES + HARDENING_MISTAKES


EQUIVALENTS = [
    equivalent("loads_any_scaler_state", "calls scaler.load_state_dict even for an empty saved state: a disabled "
        "GradScaler ignores it, and an enabled one was refused an empty state before", "load_checkpoint",
        '    if scaler is not None and checkpoint["scaler"]:\n', "    if scaler is not None:\n"),
    equivalent("ceil_by_negation", "-(-N // bs) instead of (N + bs - 1) // bs in __len__",
        "SkipBatchSampler.__len__", "(len(self.indices) + self.batch_size - 1) // self.batch_size - self.skip_batches",
        "-(-len(self.indices) // self.batch_size) - self.skip_batches"),
    equivalent("fixed_tmp_name", "upstream's fixed path + '.tmp' instead of a mkstemp name",
        "save_checkpoint", MKSTEMP,
        'tmp_name = f"{path}.tmp"\n    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)'),
    equivalent("requires_model_config", "refuses a file without model_config (upstream's) for that, before its "
        "other problems: any one correct reason is enough", "_validate_checkpoint",
        "missing = [k for k in REQUIRED_KEYS if k not in checkpoint]",
        'missing = [k for k in (*REQUIRED_KEYS, "model_config") if k not in checkpoint]'),
]
