"""Mutants of the lesson-15 reference that no check of their tier can fail, each with why (``python -m course
mutants 15`` lists the rest: each of those is a gap that a new check closes). A core mutant whose only effect is
a convention of the hardening tier (lesson 15 §5.5) says so: "only a convention differs"."""

CONVENTION = "only a convention differs: "

EQUIVALENT_MUTANTS: dict[str, str] = {
    # core: the same behaviour
    "SkipBatchSampler.__init__#1: statements swapped with the next one":
        "checking the arguments before or after storing indices is the same: the rules read the arguments",
    "SkipBatchSampler.__init__#2: statements swapped with the next one":
        "two independent attribute assignments (indices, batch_size) in either order",
    "SkipBatchSampler.__init__#3: statements swapped with the next one":
        "two independent attribute assignments (batch_size, skip_batches) in either order",
    "SkipBatchSampler.__iter__#1: statements swapped with the next one":
        "skipped_samples and the empty batch list are independent initialisations",
    "save_checkpoint#1: statements swapped with the next one":
        "path = Path(path) and unwrapping the model are independent",
    "save_checkpoint#2: statements swapped with the next one":
        "unwrapping the model and checking epoch, step and the extras' names are independent",
    "save_checkpoint#3: constant True -> False":
        "the except branch runs only while the temporary file exists (mkstemp made it; only os.replace, the "
        "try's last call, removes it)",
    "save_checkpoint#4: statements swapped with the next one":
        "adding the extras to the dict and creating the parent directory are independent",
    "save_checkpoint#6: statements swapped with the next one":
        "torch.save flushes the file object it writes to before returning: flush before or after it is the same",
    "save_checkpoint#6: statement removed (Expr)":
        "torch.save flushes the file object it writes to before returning (the fsync check sees every byte "
        "without handle.flush()); the explicit flush states the order for any other writer",
    "save_checkpoint#7: statements swapped with the next one":
        "torch.save already flushed the file object, so flushing after os.fsync changes nothing on disk",
    "load_checkpoint#1: statements swapped with the next one":
        "the file's validation and the world_size argument's are independent refusals, both before anything is "
        "loaded",
    # core: only a convention of the hardening tier differs
    "_is_int#1: boolean and -> or":
        CONVENTION + "_is_int serves the argument rules alone, which then take a bool for an int",
    "SkipBatchSampler.__init__#1: statement removed (Expr)":
        CONVENTION + "the sampler's argument rules are not called",
    "save_checkpoint#1: statement removed (Expr)":
        CONVENTION + "the save's argument rules (counters, extras' names) are not called",
    "save_checkpoint#1: call: first two arguments swapped":
        CONVENTION + "a bad epoch and a bad step (the same rule) swap names in the refusal",
    "save_checkpoint#1: except BaseException -> ValueError":
        CONVENTION + "a failure other than a ValueError leaves the temporary file beside the intact previous "
        "checkpoint",
    "save_checkpoint#8: statement removed (Expr)":
        CONVENTION + "a failed save leaves its temporary file beside the intact previous checkpoint",
    "save_checkpoint#1: constant True -> False":
        CONVENTION + "mkdir(parents=False) fails only for a new nested directory",
    "save_checkpoint#3: statement removed (Expr)":
        CONVENTION + "the parent directory is not created (the stage assembly creates out_dir itself)",
    "save_checkpoint#5: statements swapped with the next one":
        CONVENTION + "the temporary file is made before the parent directory, which only a first save into a "
        "new directory shows",
    "_bad#1: statement removed (Return)":
        CONVENTION + "raise None is a TypeError: still a refusal before anything changes, of another type",
    "load_checkpoint#1: except Exception -> ValueError":
        CONVENTION + "torch.load's own error escapes instead of a ValueError naming the path, still before "
        "anything changes",
    "load_checkpoint#2: statement removed (Raise)":
        CONVENTION + "an unreadable file ends in an UnboundLocalError instead of a ValueError naming the path, "
        "still before anything changes",
    "load_checkpoint#2: statements swapped with the next one":
        CONVENTION + "a bad world_size argument (an argument rule) is refused after the model was loaded",
    # hardening
    "_validate_sampler_arguments#1: arithmetic // -> /":
        "total is only compared with the int skip_batches, and skip <= x holds exactly when skip <= floor(x)",
    "_validate_optimizer_state#1: call: first two arguments swapped":
        "the zipped groups are compared by set(saved_group) != set(group), which is symmetric",
    "_validate_optimizer_state#1: statements swapped with the next one":
        "the parameter list and the saved ids are computed independently",
    "_validate_model_state#1: call: first two arguments swapped":
        "saved_config.get(ABSENT, k) lists every field as differing: the message still names the one that "
        "differs, and a message naming more fields (both configs whole) is right by design",
    "_validate_model_state#2: call: first two arguments swapped":
        "config.get(ABSENT, k) lists every field as differing: the message still names the one that differs, "
        "and a message naming more fields (both configs whole) is right by design",
}
