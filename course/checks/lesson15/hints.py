"""Lesson 15's hint ladder (``python -m course hint 15 EXERCISE``; collapsed in the notebook): per exercise the
idea, where to look in the oracle, the rule, a near-solution - each a step closer to the answer."""

HINTS: dict[str, tuple[str, ...]] = {
    "SkipBatchSampler": (
        "A resumed epoch must see the same batches as the uninterrupted one, minus those already trained. "
        "Cut the epoch into batches first, in order, then drop the first skip_batches of them; the last, short "
        "batch belongs to the epoch too.",
        "course/minimind/trainer_utils.py::SkipBatchSampler is the oracle: read its __iter__ and __len__. Lesson "
        "15 §3 step 1 walks it; compare list(yours) with list(upstream) for a few (N, batch_size, skip).",
        "Arguments in the order indices (sized, else TypeError naming indices), batch_size (int >= 1), "
        "skip_batches (int in [0, ceil(N / batch_size)]), else ValueError naming it; a bool is not an int "
        "here. Keep a reference to indices, not a copy, and iterate it again in every __iter__ (set_epoch "
        "reshuffles a DistributedSampler); start a NEW list (not a tuple) for every batch. len = "
        "ceil(N / batch_size) - skip_batches.",
        "In __iter__: skipped = skip_batches * batch_size; for position, index in enumerate(self.indices): skip "
        "positions below skipped, append the rest to batch, yield it and rebind batch = [] when it is full; after "
        "the loop yield a non-empty batch. __len__: (len(self.indices) + bs - 1) // bs - skip_batches.",
    ),
    "save_checkpoint": (
        "A checkpoint is everything the next micro-step reads (lesson 15 §0's list), and writing it must never "
        "destroy the previous one: the old file stays whole until the new one is complete and on disk.",
        "The save half of course/minimind/trainer_utils.py::lm_checkpoint: the dict it builds (model, optimizer, "
        "epoch, step, world_size, extras by state_dict()) and its tmp-file + os.replace. Lesson 15 §1.7 says why "
        "each part of an atomic write matters; §8 lists upstream's shortcuts to avoid (fp16, no checks).",
        "Validate first, on every rank: epoch/step ints >= 0 (not bools), no extra named like a checkpoint key, "
        "no grad with a non-zero entry on any parameter (message says accumulation); change nothing you are "
        "given. Unwrap .module (DDP) and ._orig_mod (torch.compile) in a loop. Then only rank 0 writes: mkdir "
        "the parent; a temporary file in path's OWN directory; torch.save into it, flush, os.fsync its "
        "descriptor; os.replace (not os.rename) onto path; on BaseException delete the temporary file and "
        "re-raise.",
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
        "the load_state_dict calls in course/minimind/train_pretrain.py's main. Lesson 15 §5.3's table lists "
        "every refusal; §1.6 the rescale; §1.7 why weights_only=True.",
        "torch.load(path, map_location='cpu', weights_only=True), ANY exception it raises turned into a ValueError "
        "naming the path (nothing at the path: FileNotFoundError). Then: a dict, the six keys, counters ints, not "
        "bools (world_size >= 1), model a dict, the whole model_config equal (every field, both ways), the same "
        "model keys holding tensors of the same shapes AND dtypes, the optimizer state fitting (groups, "
        "parameters, no unknown ids, hyper-parameter keys, state shapes of dim > 0), a non-empty scaler state "
        "for an enabled scaler, the world_size argument. Only then load_state_dict (scaler only when given and "
        "its state is non-empty), and step = step * saved_world_size // world_size if they differ.",
        "path = Path(path); if not path.exists(): raise FileNotFoundError(str(path)); try: ckp = "
        "torch.load(...) except Exception as e: raise ValueError(f'{path}: ...'); validate as listed, each "
        "ValueError naming the path and the key; current = world_size argument checked (None -> "
        "dist.get_world_size() if dist.is_initialized() else 1); model.load_state_dict(ckp['model']); optimizer / "
        "scaler likewise; rescale ckp['step']; return ckp.",
    ),
    "resume_position": (
        "The checkpoint's step counts micro-batches of its epoch that are DONE. The loop's start_step means the "
        "same thing, so they are usually equal. One case is special: an epoch that is entirely done.",
        "course/minimind/train_pretrain.py's main: start_epoch = ckp['epoch'], start_step = ckp['step'], then "
        "SkipBatchSampler(..., start_step). Ask what upstream does when step equals the epoch's length (it runs "
        "an empty epoch).",
        "Check iters (an int >= 1) first, then the checkpoint's step (within [0, iters]), each ValueError naming "
        "it. step == iters continues at (epoch + 1, 0); any other step at (epoch, step): no + 1 anywhere.",
        "if not isinstance(iters, int) or iters < 1: raise ValueError('iters ...'); epoch, step = "
        "checkpoint['epoch'], checkpoint['step']; if not 0 <= step <= iters: raise ValueError('step ...'); return "
        "(epoch + 1, 0) if step == iters else (epoch, step).",
    ),
}
