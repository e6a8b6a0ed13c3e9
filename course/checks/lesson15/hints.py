"""Lesson 15's hint ladder (``python -m course hint 15 EXERCISE``; the notebook names the command): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "SkipBatchSampler": (
        "A resumed epoch must see the same batches as the uninterrupted one, minus those already trained. "
        "Cut the epoch into batches first, in order, then drop the first skip_batches of them; the last, short "
        "batch belongs to the epoch too.",
        "course/minimind/trainer_utils.py::SkipBatchSampler is the oracle: read its __iter__ and __len__. Lesson "
        "15 answers §3 (step 1) walks it; compare list(yours) with list(upstream) for a few (N, batch_size, skip).",
        "Keep a reference to indices, not a copy, and iterate it again in every __iter__ (set_epoch "
        "reshuffles a DistributedSampler); start a NEW list for every batch (a batch already yielded never "
        "changes); keep the last, short batch. len = ceil(N / batch_size) - skip_batches. (Optional, the "
        "hardening tier of §5.5: refuse bad arguments, in the order indices, batch_size, skip_batches.)",
        "In __iter__: skipped = skip_batches * batch_size; for position, index in enumerate(self.indices): skip "
        "positions below skipped, append the rest to batch, yield it and rebind batch = [] when it is full; after "
        "the loop yield a non-empty batch. __len__: (len(self.indices) + bs - 1) // bs - skip_batches.",
    ),
    "save_checkpoint": (
        "A checkpoint is everything the next micro-step reads (lesson 15 §0's list), and writing it must never "
        "destroy the previous one: the old file stays whole until the new one is complete and on disk.",
        "The save half of course/minimind/trainer_utils.py::lm_checkpoint: the dict it builds (model, optimizer, "
        "epoch, step, world_size, extras by state_dict()) and its tmp-file + os.replace. Lesson 15 §1.7 says why "
        "each part of an atomic write matters, §1.5 why pending gradients cannot be saved; §8 lists upstream's "
        "shortcuts to avoid (fp16, no checks).",
        "Refuse (raise) when any parameter's grad holds a non-zero value: a frozen parameter's None and the "
        "zeros of zero_grad(set_to_none=False) are not pending. Unwrap .module (DDP) and ._orig_mod "
        "(torch.compile) in a loop. Only rank 0 writes. A temporary file in path's OWN directory; torch.save "
        "into it, flush, os.fsync its descriptor; then os.replace it onto path; on a failure delete the "
        "temporary file and re-raise. (Optional, §5.5: counters ints >= 0, extras kept as given, the parent "
        "directory created, BaseException caught.)",
        "path = Path(path); model = unwrap(model); checks; if dist.is_initialized() and dist.get_rank() != 0: "
        "return; checkpoint = {model: {k: v.detach().cpu()}, optimizer: optimizer.state_dict(), scaler: "
        "scaler.state_dict() or None, epoch, step, world_size: dist.get_world_size() or 1, model_config: "
        "dataclasses.asdict(model.config), **extras (v.state_dict() if it has one)}; fd, tmp = "
        "tempfile.mkstemp(dir=path.parent); try: with os.fdopen(fd, 'wb') as f: torch.save(checkpoint, f); "
        "f.flush(); os.fsync(f.fileno()); os.replace(tmp, path) except BaseException: unlink tmp; raise.",
    ),
    "load_checkpoint": (
        "Loading is all or nothing: first prove that the file fits the objects you were given, and only then "
        "change them. Everything you need for the proof is already in memory: model.state_dict(), model.config, "
        "optimizer.param_groups, scaler.is_enabled().",
        "The load half of course/minimind/trainer_utils.py::lm_checkpoint (torch.load, the world-size rescale) and "
        "the load_state_dict calls in course/minimind/train_pretrain.py's main. Lesson 15 §5.3 asks what must "
        "be refused; §1.6 the rescale; §1.7 why weights_only=True.",
        "torch.load(path, map_location='cpu', weights_only=True). Before any load_state_dict, refuse (raise) a "
        "file without the resume keys (a weights file), a model_config unlike dataclasses.asdict(model.config), "
        "model tensors of other keys, shapes or dtypes (fp16), an optimizer state of other param groups, "
        "parameters or hyper-parameter keys, an empty scaler state for an enabled scaler. Then load_state_dict "
        "what was given, and step = step * saved_world_size // world_size if they differ (world_size None: the "
        "process group's size, 1 without one). (Optional, §5.5: ValueErrors naming the path and the key.)",
        "ckp = torch.load(Path(path), map_location='cpu', weights_only=True); validate as listed, raising "
        "ValueError(f'{path}: ...'); current = world_size if world_size is not None else "
        "(dist.get_world_size() if dist.is_initialized() else 1); model.load_state_dict(ckp['model']); "
        "optimizer / scaler likewise when given; if ckp['world_size'] != current: ckp['step'] = ckp['step'] * "
        "ckp['world_size'] // current; return ckp.",
    ),
    "resume_position": (
        "The checkpoint's step counts micro-batches of its epoch that are DONE. The loop's start_step means the "
        "same thing, so they are usually equal. One case is special: an epoch that is entirely done.",
        "course/minimind/train_pretrain.py's main: start_epoch = ckp['epoch'], start_step = ckp['step'], then "
        "SkipBatchSampler(..., start_step). Ask what upstream does when step equals the epoch's length (it runs "
        "an empty epoch).",
        "step == iters continues at (epoch + 1, 0); any other step at (epoch, step): no + 1 anywhere. "
        "(Optional, §5.5: check iters, then the step, each ValueError naming it; read the dict, never change "
        "it.)",
        "epoch, step = checkpoint['epoch'], checkpoint['step']; return (epoch + 1, 0) if step == iters else "
        "(epoch, step).",
    ),
}
